/* A trivial accelerator: proves the C build works (tests/core/test_native.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *probe_add(PyObject *self, PyObject *args) {
    long long a, b;
    if (!PyArg_ParseTuple(args, "LL", &a, &b)) return NULL;
    return PyLong_FromLongLong(a + b);
}
static PyMethodDef methods[] = {{"add", probe_add, METH_VARARGS, "a + b"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit__probe(void) { return PyModule_Create(&mod); }

/* deltatap.collector._settle: rows handed over as settled (collector/settle.py, _settle_rows, stays the reference;
 * tests/collector/test_rows_settle.py compares both and checks what is untracked).
 *
 * settle_rows(rows, fields) -> None: for each row, each attribute named in the tuple ``fields`` (one a row lacks is
 * skipped, as getattr(row, name, None) does; anything else getattr raises is raised) is settled: untracked from the
 * garbage collector where it can be in no reference cycle, as the collector's own first pass would conclude:
 *   - an object that is no GC object (int, str, float, None, bool) or is untracked already: settled;
 *   - a tuple (or a subclass such as a NamedTuple with no instance dict nor slots of its own) whose items are all
 *     settled: untracked (CPython untracks only exact tuples itself, never NamedTuples);
 *   - an exact dict whose keys and values are all settled: untracked (a dict tracks itself again when given a
 *     container, as every new dict does);
 *   - anything else, or nesting deeper than SETTLE_DEPTH: left as it is.
 * Nothing observable changes: no value, no identity, no order. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SETTLE_DEPTH 4

static int
plain_tuple(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    return PyTuple_Check(o) && t->tp_basicsize == PyTuple_Type.tp_basicsize && t->tp_itemsize == PyTuple_Type.tp_itemsize
           && t->tp_dictoffset == 0;
}

static int
settled(PyObject *o, int depth)
{
    /* 1: o is (now) untracked or no GC object, 0: it stays tracked */
    if (!PyObject_IS_GC(o) || !PyObject_GC_IsTracked(o))
        return 1;
    if (depth <= 0)
        return 0;
    if (plain_tuple(o)) {
        Py_ssize_t n = PyTuple_GET_SIZE(o);
        for (Py_ssize_t i = 0; i < n; i++)
            if (!settled(PyTuple_GET_ITEM(o, i), depth - 1))
                return 0;
    } else if (PyDict_CheckExact(o)) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int ok = 1;
        while (PyDict_Next(o, &pos, &k, &v))  /* borrowed; untracking runs no Python code and changes no dict */
            if (!settled(k, depth - 1) || !settled(v, depth - 1))
                ok = 0;  /* (the rest is still settled) */
        if (!ok)
            return 0;
    } else {
        return 0;
    }
    PyObject_GC_UnTrack(o);
    return 1;
}

static PyObject *
settle_rows(PyObject *self, PyObject *args)
{
    PyObject *rows, *fields;
    if (!PyArg_ParseTuple(args, "OO!:settle_rows", &rows, &PyTuple_Type, &fields))
        return NULL;
    PyObject *it = PyObject_GetIter(rows);
    if (it == NULL)
        return NULL;
    PyObject *row;
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    while ((row = PyIter_Next(it)) != NULL) {
        for (Py_ssize_t i = 0; i < nf; i++) {
            PyObject *v = PyObject_GetAttr(row, PyTuple_GET_ITEM(fields, i));
            if (v == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
                    Py_DECREF(row);
                    Py_DECREF(it);
                    return NULL;
                }
                PyErr_Clear();
                continue;
            }
            settled(v, SETTLE_DEPTH);
            Py_DECREF(v);
        }
        Py_DECREF(row);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"settle_rows", settle_rows, METH_VARARGS, "Untrack from the garbage collector what in rows can be in no cycle (see collector/settle.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_settle", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__settle(void)
{
    return PyModule_Create(&module);
}

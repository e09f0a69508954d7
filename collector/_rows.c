/* deltatap.collector._rows: a row plan's points and deltas in one call (collector/decompose.py, _plan_values,
 * stays the reference and the definition; tests/collector/test_rows_native.py compares both).
 *
 * plan_values(vals, uncs, points, deltas, point_type, delta_type) -> (points dict, deltas dict), or None when an
 * argument is not what the plan makes (then the caller runs the reference, which raises what Python raises):
 *   vals, uncs: lists; points: list of (point, observation index, span index, observer, source);
 *   deltas: list of (name, end index, start index, end span, start span, one observer);
 *   point_type, delta_type: tuple subclasses (PointObs, DeltaValue), filled as tuple.__new__ does.
 * Every index is bounds-checked (a negative or too large one -> None); arithmetic goes through PyNumber_*,
 * so its results and errors are Python's. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int
get_index(PyObject *o, Py_ssize_t n, Py_ssize_t *out)
{
    /* 1: ok, 0: not an exact int in [0, n) (fall back), -1: error */
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow || v < 0 || v >= (long long)n)
        return 0;
    *out = (Py_ssize_t)v;
    return 1;
}

static PyObject *
new_tuple(PyTypeObject *type, Py_ssize_t n)
{
    return type->tp_alloc(type, n);
}

static PyObject *
plan_values(PyObject *self, PyObject *args)
{
    PyObject *vals, *uncs, *points, *deltas, *ptype, *dtype;
    if (!PyArg_ParseTuple(args, "OOOOOO:plan_values", &vals, &uncs, &points, &deltas, &ptype, &dtype))
        return NULL;
    if (!PyList_CheckExact(vals) || !PyList_CheckExact(uncs) || !PyList_CheckExact(points) || !PyList_CheckExact(deltas)
        || !PyType_Check(ptype) || !PyType_Check(dtype)
        || !PyType_IsSubtype((PyTypeObject *)ptype, &PyTuple_Type) || !PyType_IsSubtype((PyTypeObject *)dtype, &PyTuple_Type))
        Py_RETURN_NONE;
    PyTypeObject *pt = (PyTypeObject *)ptype, *dt = (PyTypeObject *)dtype;
    PyObject *pout = PyDict_New();
    if (pout == NULL)
        return NULL;
    PyObject *dout = NULL, *item = NULL;
    Py_ssize_t np = PyList_GET_SIZE(points);
    for (Py_ssize_t k = 0; k < np; k++) {
        PyObject *t = PyList_GET_ITEM(points, k);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 5)
            goto fallback;
        Py_ssize_t i, si;
        int r = get_index(PyTuple_GET_ITEM(t, 1), PyList_GET_SIZE(vals), &i);
        if (r < 0) goto error;
        if (r == 0) goto fallback;
        r = get_index(PyTuple_GET_ITEM(t, 2), PyList_GET_SIZE(uncs), &si);
        if (r < 0) goto error;
        if (r == 0) goto fallback;
        item = new_tuple(pt, 4);
        if (item == NULL) goto error;
        PyObject *v = PyList_GET_ITEM(vals, i), *u = PyList_GET_ITEM(uncs, si);
        PyObject *ob = PyTuple_GET_ITEM(t, 3), *src = PyTuple_GET_ITEM(t, 4);
        Py_INCREF(v); Py_INCREF(u); Py_INCREF(ob); Py_INCREF(src);
        PyTuple_SET_ITEM(item, 0, v);
        PyTuple_SET_ITEM(item, 1, u);
        PyTuple_SET_ITEM(item, 2, ob);
        PyTuple_SET_ITEM(item, 3, src);
        if (PyDict_SetItem(pout, PyTuple_GET_ITEM(t, 0), item) < 0) goto error;
        Py_CLEAR(item);
    }
    dout = PyDict_New();
    if (dout == NULL) goto error;
    Py_ssize_t nd = PyList_GET_SIZE(deltas);
    for (Py_ssize_t k = 0; k < nd; k++) {
        PyObject *t = PyList_GET_ITEM(deltas, k);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 6)
            goto fallback;
        Py_ssize_t e, s, es, ss;
        int r;
        if ((r = get_index(PyTuple_GET_ITEM(t, 1), PyList_GET_SIZE(vals), &e)) <= 0) goto bad;
        if ((r = get_index(PyTuple_GET_ITEM(t, 2), PyList_GET_SIZE(vals), &s)) <= 0) goto bad;
        PyObject *same = PyTuple_GET_ITEM(t, 5);
        if (!PyBool_Check(same)) goto fallback;
        PyObject *ns = PyNumber_Subtract(PyList_GET_ITEM(vals, e), PyList_GET_ITEM(vals, s));
        if (ns == NULL) goto error;
        PyObject *err;
        if (same == Py_True) {
            err = PyLong_FromLong(0);
        } else {
            if ((r = get_index(PyTuple_GET_ITEM(t, 3), PyList_GET_SIZE(uncs), &es)) <= 0
                || (r = get_index(PyTuple_GET_ITEM(t, 4), PyList_GET_SIZE(uncs), &ss)) <= 0) {
                Py_DECREF(ns);
                goto bad;
            }
            err = PyNumber_Add(PyList_GET_ITEM(uncs, es), PyList_GET_ITEM(uncs, ss));
        }
        if (err == NULL) { Py_DECREF(ns); goto error; }
        item = new_tuple(dt, 3);
        if (item == NULL) { Py_DECREF(ns); Py_DECREF(err); goto error; }
        Py_INCREF(same);
        PyTuple_SET_ITEM(item, 0, ns);
        PyTuple_SET_ITEM(item, 1, err);
        PyTuple_SET_ITEM(item, 2, same);
        if (PyDict_SetItem(dout, PyTuple_GET_ITEM(t, 0), item) < 0) goto error;
        Py_CLEAR(item);
        continue;
    bad:
        if (r < 0) goto error;
        goto fallback;
    }
    PyObject *res = PyTuple_Pack(2, pout, dout);
    Py_DECREF(pout);
    Py_DECREF(dout);
    return res;
fallback:
    Py_XDECREF(item);
    Py_DECREF(pout);
    Py_XDECREF(dout);
    Py_RETURN_NONE;
error:
    Py_XDECREF(item);
    Py_DECREF(pout);
    Py_XDECREF(dout);
    return NULL;
}

static PyMethodDef methods[] = {
    {"plan_values", plan_values, METH_VARARGS, "A row plan's points and deltas dicts (see collector/decompose.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModule_Create(&module);
}

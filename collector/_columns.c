/* deltatap.collector._columns: the rows of a batch into DeltaColumns' blocks in one call (collector/rows.py,
 * DeltaColumns.add, stays the reference and the definition; tests/collector/test_columns_native.py compares both).
 *
 * add_rows(blocks, rows, start) -> the index of the first row not taken (len(rows) when every one was).
 *   blocks: DeltaColumns._blocks, a list of (keys tuple, ns list, err list), the last one the block being filled;
 *   rows: a list; from rows[start] on, each row's ``deltas`` is read and added as DeltaColumns.add does: a new block
 *   when its keys (in order) differ from the last block's, then every value's [0] to ns and [1] to err.
 * A row is not taken (the caller adds it the Python way, which raises what Python raises) when its ``deltas`` is
 * not an exact dict, a key (its own or the last block's) is not an exact str, or a value is not a tuple (or a
 * subclass that indexes as one, such as DeltaValue) of at least two items. What reading ``row.deltas`` raises
 * is raised, as the Python way does. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static int
same_keys(PyObject *d, PyObject *keys)
{
    /* 1: d's keys are keys' (in order), 0: not, -1: a key of either is not an exact str (not taken: comparing
     * anything else may run Python code) */
    Py_ssize_t pos = 0, i = 0, n = PyTuple_GET_SIZE(keys);
    PyObject *k, *v;
    for (Py_ssize_t j = 0; j < n; j++)
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(keys, j)))
            return -1;
    int same = PyDict_GET_SIZE(d) == n;
    while (PyDict_Next(d, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k))
            return -1;
        if (same) {
            PyObject *o = PyTuple_GET_ITEM(keys, i);
            if (k != o && PyUnicode_Compare(k, o) != 0)  /* (two exact strs: no error) */
                same = 0;
        }
        i++;
    }
    return same;
}

static int
takes_values(PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v))
        if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) < 2 || Py_TYPE(v)->tp_as_mapping == NULL
            || Py_TYPE(v)->tp_as_mapping->mp_subscript != PyTuple_Type.tp_as_mapping->mp_subscript)
            return 0;  /* (v[0] would not be what tuple's indexing gives) */
    return 1;
}

static PyObject *
add_rows(PyObject *self, PyObject *args)
{
    PyObject *blocks, *rows;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!O!n:add_rows", &PyList_Type, &blocks, &PyList_Type, &rows, &start))
        return NULL;
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("deltas")) == NULL)
        return NULL;
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        Py_INCREF(row);  /* (getattr may run Python code that changes the list) */
        PyObject *d = PyObject_GetAttr(row, name);
        Py_DECREF(row);
        if (d == NULL)
            return NULL;  /* what row.deltas raises, after the rows before it were added, as the Python way does */
        if (!PyDict_CheckExact(d) || !takes_values(d)) {
            Py_DECREF(d);
            break;
        }
        PyObject *block = NULL, *keys = NULL;
        Py_ssize_t nb = PyList_GET_SIZE(blocks);
        if (nb > 0) {
            block = PyList_GET_ITEM(blocks, nb - 1);
            if (!PyTuple_CheckExact(block) || PyTuple_GET_SIZE(block) != 3 || !PyTuple_CheckExact(PyTuple_GET_ITEM(block, 0))
                || !PyList_CheckExact(PyTuple_GET_ITEM(block, 1)) || !PyList_CheckExact(PyTuple_GET_ITEM(block, 2))) {
                Py_DECREF(d);
                break;
            }
            keys = PyTuple_GET_ITEM(block, 0);
        }
        int same = keys == NULL ? 0 : same_keys(d, keys);
        if (keys == NULL) {  /* (the keys are checked all the same) */
            Py_ssize_t pos = 0;
            PyObject *k, *v;
            while (PyDict_Next(d, &pos, &k, &v))
                if (!PyUnicode_CheckExact(k))
                    same = -1;
        }
        if (same < 0) {
            Py_DECREF(d);
            break;
        }
        if (same) {
            Py_INCREF(block);  /* borrowed from blocks, which appending may change */
        } else {
            PyObject *nk = PySequence_Tuple(d);
            PyObject *ns = PyList_New(0), *err = PyList_New(0);
            block = (nk && ns && err) ? PyTuple_Pack(3, nk, ns, err) : NULL;
            Py_XDECREF(nk);
            Py_XDECREF(ns);
            Py_XDECREF(err);
            if (block == NULL || PyList_Append(blocks, block) < 0) {
                Py_XDECREF(block);
                Py_DECREF(d);
                return NULL;
            }
        }
        PyObject *ns = PyTuple_GET_ITEM(block, 1), *err = PyTuple_GET_ITEM(block, 2);
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(d, &pos, &k, &v))
            if (PyList_Append(ns, PyTuple_GET_ITEM(v, 0)) < 0) {
                Py_DECREF(block);
                Py_DECREF(d);
                return NULL;
            }
        pos = 0;
        while (PyDict_Next(d, &pos, &k, &v))
            if (PyList_Append(err, PyTuple_GET_ITEM(v, 1)) < 0) {
                Py_DECREF(block);
                Py_DECREF(d);
                return NULL;
            }
        Py_DECREF(block);
        Py_DECREF(d);
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef methods[] = {
    {"add_rows", add_rows, METH_VARARGS, "Rows' deltas into DeltaColumns' blocks (see collector/rows.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__columns(void)
{
    return PyModule_Create(&module);
}

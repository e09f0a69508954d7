/* The C accelerator of deltatap.core.sse.SseParser: the same event-stream parser, one C call per read.

The Python class in sse.py is the definition; this type does exactly what it does (the differential test
tests/kernel/test_sse_native.py compares them on generated streams split at random points). State is kept
as bytes (the partial line, the event's joined data lines) and decoded (UTF-8, errors replaced) only when an
event is dispatched: decoding is local to ASCII bytes (a line end, a colon, a space always decode to
themselves and end any broken sequence), so decoding the joined bytes equals joining the decoded lines.
Every read is bounds-checked against the buffer's length; buffers grow on the heap (never a fixed stack
buffer); every CPython call is checked and references are released on every path.

deltatap/core/_content.c builds this parser again, as deltatap.core._content, with the stream observer's one call
per read (SseParser.observe): it defines SSE_OBSERVER (what a dispatched event does while observe() runs) and the
names below before it includes this file. */
#ifndef SSE_MODULE
#define SSE_MODULE "_sse"
#define SSE_INIT PyInit__sse
#define SSE_MODULE_METHODS
#define SSE_PARSER_METHODS
#define SSE_MODULE_INIT(m) 0
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

static PyObject *EventType = NULL; /* deltatap.core.sse.SseEvent, given by setup() */
static PyObject *EmptyStr = NULL;
static PyObject *S_data, *S_event, *S_id, *S_retry;

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (extra < 0 || b->len > PY_SSIZE_T_MAX - extra - 1) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = b->len + extra;
    if (need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *np = PyMem_Realloc(b->p, (size_t)cap);
    if (np == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static int buf_append(Buf *b, const char *s, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    return 0;
}

typedef struct {
    PyObject_HEAD
    Buf line;        /* bytes of a partial line carried over to the next read */
    Buf data;        /* the current event's data lines, joined with "\n" */
    int has_data;
    int skip_lf;     /* the previous read ended in "\r": a leading "\n" belongs to it */
    int started;     /* the BOM question is settled */
    PyObject *event; /* str or NULL ("") */
    PyObject *id;    /* str or NULL (None); kept across events */
    PyObject *retry; /* int or NULL (None) */
    Py_ssize_t comments;
    Py_ssize_t events;
    char truncated;
    void *ctx;       /* _content.c: the observer an observe() call feeds (NULL otherwise) */
} Parser;

static void parser_reset(Parser *self) {
    self->data.len = 0;
    self->has_data = 0;
    Py_CLEAR(self->event);
    Py_CLEAR(self->retry);
}

static PyObject *decode(const char *s, Py_ssize_t n) { return PyUnicode_DecodeUTF8(s, n, "replace"); }

/* the SseEvent of the event the parser holds */
static PyObject *make_event(Parser *self) {
    PyObject *data = decode(self->data.p ? self->data.p : "", self->data.len);
    if (data == NULL) return NULL;
    PyTypeObject *tp = (PyTypeObject *)EventType;
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *ev = tp->tp_new(tp, empty, NULL);
    Py_DECREF(empty);
    if (ev == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    int rc = PyObject_SetAttr(ev, S_data, data);
    Py_DECREF(data);
    if (rc == 0) rc = PyObject_SetAttr(ev, S_event, self->event ? self->event : EmptyStr);
    if (rc == 0) rc = PyObject_SetAttr(ev, S_id, self->id ? self->id : Py_None);
    if (rc == 0) rc = PyObject_SetAttr(ev, S_retry, self->retry ? self->retry : Py_None);
    if (rc < 0) {
        Py_DECREF(ev);
        return NULL;
    }
    return ev;
}

static int dispatch(Parser *self, PyObject *out) {
    self->events++;
#ifdef SSE_OBSERVER
    if (self->ctx != NULL) return SSE_OBSERVER(self);
#endif
    PyObject *ev = make_event(self);
    if (ev == NULL) return -1;
    int rc = PyList_Append(out, ev);
    Py_DECREF(ev);
    return rc;
}

static int add_data(Parser *self, const char *v, Py_ssize_t n) {
    if (self->has_data && buf_append(&self->data, "\n", 1) < 0) return -1;
    if (buf_append(&self->data, v, n) < 0) return -1;
    self->has_data = 1;
    return 0;
}

/* one complete line (without its line end): the Python SseParser._line */
static int parse_line(Parser *self, const char *s, Py_ssize_t n, PyObject *out) {
    if (n == 0) {
        if (self->has_data && dispatch(self, out) < 0) return -1;
        parser_reset(self);
        return 0;
    }
    if (n >= 6 && memcmp(s, "data: ", 6) == 0) return add_data(self, s + 6, n - 6);
    if (s[0] == ':') {
        self->comments++;
        return 0;
    }
    const char *colon = memchr(s, ':', (size_t)n);
    Py_ssize_t name_len = colon ? (Py_ssize_t)(colon - s) : n;
    const char *v = colon ? colon + 1 : s + n;
    Py_ssize_t vn = colon ? n - name_len - 1 : 0;
    if (colon && vn > 0 && v[0] == ' ') {
        v++;
        vn--;
    }
    if (name_len == 4 && memcmp(s, "data", 4) == 0) return add_data(self, v, vn);
    if (name_len == 5 && memcmp(s, "event", 5) == 0) {
        PyObject *e = decode(v, vn);
        if (e == NULL) return -1;
        Py_XSETREF(self->event, e);
        return 0;
    }
    if (name_len == 2 && memcmp(s, "id", 2) == 0) {
        if (vn > 0 && memchr(v, 0, (size_t)vn) != NULL) return 0;
        PyObject *i = decode(v, vn);
        if (i == NULL) return -1;
        Py_XSETREF(self->id, i);
        return 0;
    }
    if (name_len == 5 && memcmp(s, "retry", 5) == 0) {
        /* ASCII digits only, at most 18 of them (the reference's rule) */
        if (vn == 0 || vn > 18) return 0;
        long long x = 0;
        for (Py_ssize_t k = 0; k < vn; k++) {
            unsigned char c = (unsigned char)v[k];
            if (c < '0' || c > '9') return 0;
            x = x * 10 + (c - '0');
        }
        PyObject *r = PyLong_FromLongLong(x);
        if (r == NULL) return -1;
        Py_XSETREF(self->retry, r);
        return 0;
    }
    return 0;
}

static const char BOM[3] = {'\xef', '\xbb', '\xbf'};

/* the lines of p[0:n]; what follows the last line end stays in self->line (p may point into it) */
static int split_lines(Parser *self, const char *p, Py_ssize_t n, int in_line, PyObject *out) {
    Py_ssize_t pos = 0;
    while (pos < n) {
        Py_ssize_t i = pos;
        while (i < n && p[i] != '\n' && p[i] != '\r') i++;
        if (i >= n) break;
        Py_ssize_t next = i + 1;
        if (p[i] == '\r') {
            if (next < n && p[next] == '\n')
                next++;
            else if (next == n)
                self->skip_lf = 1; /* a lone "\r" at the end: maybe half of "\r\n" */
        }
        if (parse_line(self, p + pos, i - pos, out) < 0) return -1;
        pos = next;
    }
    /* keep the partial line */
    Py_ssize_t rest = n - pos;
    if (in_line) {
        if (rest > 0) memmove(self->line.p, p + pos, (size_t)rest);
        self->line.len = rest;
        return 0;
    }
    self->line.len = 0;
    return buf_append(&self->line, p + pos, rest);
}

static PyObject *parser_feed(Parser *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (view.len == 0) {
        PyBuffer_Release(&view);
        return out;
    }
    const char *p;
    Py_ssize_t n;
    int in_line = 0;
    if (self->line.len == 0 && self->started) {
        p = (const char *)view.buf;
        n = view.len;
    } else {
        if (buf_append(&self->line, (const char *)view.buf, view.len) < 0) goto fail;
        p = self->line.p;
        n = self->line.len;
        in_line = 1;
    }
    if (!self->started) {
        if (n < 3 && memcmp(BOM, p, (size_t)n) == 0) {
            PyBuffer_Release(&view);
            return out;
        }
        if (n >= 3 && memcmp(BOM, p, 3) == 0) {
            p += 3;
            n -= 3;
        }
        self->started = 1;
    }
    if (self->skip_lf && n > 0 && p[0] == '\n') {
        p++;
        n--;
    }
    self->skip_lf = 0;
    if (split_lines(self, p, n, in_line, out) < 0) goto fail;
    PyBuffer_Release(&view);
    return out;
fail:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

static PyObject *parser_finish(Parser *self, PyObject *Py_UNUSED(ignored)) {
    self->truncated = self->line.len > 0;
    self->line.len = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    if (parse_line(self, "", 0, out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *parser_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "SseParser() takes no arguments");
        return NULL;
    }
    if (EventType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "deltatap.core._sse.setup() was not called");
        return NULL;
    }
    Parser *self = (Parser *)type->tp_alloc(type, 0);
    return (PyObject *)self; /* tp_alloc zero-fills: empty buffers, counters 0, objects NULL */
}

static int parser_traverse(Parser *self, visitproc visit, void *arg) {
    Py_VISIT(self->event);
    Py_VISIT(self->id);
    Py_VISIT(self->retry);
    return 0;
}

static int parser_clear(Parser *self) {
    Py_CLEAR(self->event);
    Py_CLEAR(self->id);
    Py_CLEAR(self->retry);
    return 0;
}

static void parser_dealloc(Parser *self) {
    PyObject_GC_UnTrack(self);
    parser_clear(self);
    PyMem_Free(self->line.p);
    PyMem_Free(self->data.p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef parser_methods[] = {
    {"feed", (PyCFunction)parser_feed, METH_O, "feed(data) -> list[SseEvent]: the events this read completed"},
    {"finish", (PyCFunction)parser_finish, METH_NOARGS, "finish() -> list[SseEvent]: end of stream"},
    SSE_PARSER_METHODS
    {NULL, NULL, 0, NULL},
};

static PyMemberDef parser_members[] = {
    {"comments", T_PYSSIZET, offsetof(Parser, comments), 0, "comment lines seen"},
    {"events", T_PYSSIZET, offsetof(Parser, events), 0, "events dispatched"},
    {"truncated", T_BOOL, offsetof(Parser, truncated), 0, "finish() found a partial line"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ParserType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deltatap.core." SSE_MODULE ".SseParser",
    .tp_basicsize = sizeof(Parser),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "deltatap.core.sse.SseParser in C (the Python class is the definition)",
    .tp_new = parser_new,
    .tp_dealloc = (destructor)parser_dealloc,
    .tp_traverse = (traverseproc)parser_traverse,
    .tp_clear = (inquiry)parser_clear,
    .tp_methods = parser_methods,
    .tp_members = parser_members,
};

static PyObject *sse_setup(PyObject *mod, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "setup(SseEvent): a class");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(EventType, cls);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", sse_setup, METH_O, "setup(SseEvent): the class of the events the parser returns"},
    SSE_MODULE_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, SSE_MODULE, "C accelerator of deltatap.core.sse", -1, module_methods};

PyMODINIT_FUNC SSE_INIT(void) {
    if (PyType_Ready(&ParserType) < 0) return NULL;
    EmptyStr = PyUnicode_FromString("");
    S_data = PyUnicode_InternFromString("data");
    S_event = PyUnicode_InternFromString("event");
    S_id = PyUnicode_InternFromString("id");
    S_retry = PyUnicode_InternFromString("retry");
    if (!EmptyStr || !S_data || !S_event || !S_id || !S_retry) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ParserType);
    if (PyModule_AddObject(m, "SseParser", (PyObject *)&ParserType) < 0) {
        Py_DECREF(&ParserType);
        Py_DECREF(m);
        return NULL;
    }
    if (SSE_MODULE_INIT(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

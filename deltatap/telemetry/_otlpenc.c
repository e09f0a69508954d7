/* Accelerator of deltatap.telemetry.otlp_encode._span_fields: the ScopeSpans.spans fields of a list of spans.
 *
 * The Python in otlp_encode.py is the definition; this writes the same bytes for a SpanRecord (a tuple subclass,
 * fields by position, see deltatap/telemetry/spans.py) whose fields have the plain types the tap and the load
 * generator put there: exact str, int, float, bool, None, dict, tuple/list. Anything else is handed to the Python:
 *   - an item that is not a SpanRecord, or a record with a field of another type or out of range (ids, times,
 *     kind, status code), goes whole to span_fallback(item) -> bytes (which also raises what the Python raises);
 *   - one attribute whose key or value is not one of the types above (mappings, bytes, subclasses, lists or
 *     tuples of anything but those scalars, ints beyond int64, strings that are not valid UTF-8) goes to attr_fallback(tag, key, value) -> bytes (the
 *     Python's field, or b"" when the Python leaves it out and logs it);
 *   - an attribute set that is not an exact dict goes to attrs_fallback(tag, attributes) -> bytes.
 * configure(record_type, span_fallback, attr_fallback, attrs_fallback) names them once (otlp_encode does at import).
 *
 * Memory: every write goes through buf_reserve (a growing PyMem buffer, sizes checked against overflow; a field
 * written in place reserves its whole length first); nothing of a size from the input lives on the stack; borrowed
 * references are held (INCREF) across every call back into Python, which may run arbitrary code.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} Buf;

static PyObject *record_type = NULL;    /* SpanRecord */
static PyObject *span_fallback = NULL;  /* item -> bytes */
static PyObject *attr_fallback = NULL;  /* (tag bytes, key, value) -> bytes */
static PyObject *attrs_fallback = NULL; /* (tag bytes, attributes) -> bytes */
static PyObject *tag_span_attr = NULL;  /* b"\x4a" */
static PyObject *tag_event_attr = NULL; /* b"\x1a" */

#define FALLBACK 1 /* return code: hand the whole span to span_fallback */

/* the slow path of buf_reserve: grow the buffer (sizes checked against overflow) */
static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (extra < 0 || b->len > PY_SSIZE_T_MAX - extra) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = b->len + extra;
    if (need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 512;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    unsigned char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* room for ``extra`` more bytes (inline: the usual call finds it there; 0 <= len <= cap always holds) */
static inline int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (extra >= 0 && extra <= b->cap - b->len) return 0;
    return buf_grow(b, extra);
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, unsigned char c) {
    if (buf_reserve(b, 1) < 0) return -1;
    b->p[b->len++] = c;
    return 0;
}

static inline int varint_len(uint64_t v) {
    int n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

/* a varint at q, which has room for 10 bytes; the end */
static inline unsigned char *raw_varint(unsigned char *q, uint64_t v) {
    while (v > 0x7F) {
        *q++ = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *q++ = (unsigned char)v;
    return q;
}

static inline int buf_varint(Buf *b, uint64_t v) {
    if (buf_reserve(b, 10) < 0) return -1;
    b->len = raw_varint(b->p + b->len, v) - b->p;
    return 0;
}

static inline int buf_fixed64(Buf *b, uint64_t v) {
    if (buf_reserve(b, 8) < 0) return -1;
    unsigned char *q = b->p + b->len;
    for (int i = 0; i < 8; i++) q[i] = (unsigned char)(v >> (8 * i));
    b->len += 8;
    return 0;
}

/* tag, length, bytes (one reservation) */
static inline int buf_field(Buf *b, unsigned char tag, const void *src, Py_ssize_t n) {
    if (n < 0 || n > PY_SSIZE_T_MAX - 11 || buf_reserve(b, 11 + n) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    unsigned char *q = b->p + b->len;
    *q++ = tag;
    q = raw_varint(q, (uint64_t)n);
    if (n > 0) memcpy(q, src, (size_t)n);
    b->len = (q - b->p) + n;
    return 0;
}

/* append a bytes object returned by a fallback (steals the reference) */
static int buf_put_result(Buf *b, PyObject *res) {
    if (res == NULL) return -1;
    if (!PyBytes_Check(res)) {
        PyErr_Format(PyExc_TypeError, "_otlpenc: a fallback returned %.100s, not bytes", Py_TYPE(res)->tp_name);
        Py_DECREF(res);
        return -1;
    }
    int rc = buf_put(b, PyBytes_AS_STRING(res), PyBytes_GET_SIZE(res));
    Py_DECREF(res);
    return rc;
}

/* an exact int in [0, 2**64) -> *out (1: it is not; no error set) */
static int as_u64(PyObject *v, uint64_t *out) {
    if (!PyLong_CheckExact(v)) return FALLBACK;
    int overflow = 0;
    long long sx = PyLong_AsLongLongAndOverflow(v, &overflow); /* (the usual: within int64, no byte-array detour) */
    if (!overflow) {
        if (sx < 0) { /* negative (or an error): not a u64 */
            PyErr_Clear();
            return FALLBACK;
        }
        *out = (uint64_t)sx;
        return 0;
    }
    if (overflow < 0) return FALLBACK;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return FALLBACK;
    }
    *out = (uint64_t)x;
    return 0;
}

/* ---- attributes ------------------------------------------------------------------------------------------------ */

static int attr_via_python(Buf *b, PyObject *tag, PyObject *k, PyObject *v) {
    Py_INCREF(k);
    Py_INCREF(v);
    PyObject *res = PyObject_CallFunctionObjArgs(attr_fallback, tag, k, v, NULL);
    Py_DECREF(k);
    Py_DECREF(v);
    return buf_put_result(b, res);
}

/* AnyValue of a scalar the C writes (exact str, bool, int within int64, float, None): its fixed part in head[0..*hlen)
   (at most 11 bytes) then *tlen bytes at *tail (a string's UTF-8). 0, FALLBACK (unsupported; no error set), -1 error. */
static int scalar_av(PyObject *v, unsigned char *head, Py_ssize_t *hlen, const char **tail, Py_ssize_t *tlen) {
    uint64_t n;
    Py_ssize_t h = 0;
    *tail = NULL;
    *tlen = 0;
    if (v == Py_None) {
        *hlen = 0;
        return 0;
    }
    if (v == Py_True || v == Py_False) {
        head[0] = 0x10;
        head[1] = v == Py_True;
        *hlen = 2;
        return 0;
    }
    if (PyUnicode_CheckExact(v)) {
        *tail = PyUnicode_AsUTF8AndSize(v, tlen);
        if (*tail == NULL) {
            PyErr_Clear();
            *tlen = 0;
            return FALLBACK;
        }
        head[h++] = 0x0a;
        n = (uint64_t)*tlen;
    } else if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return FALLBACK;
        }
        head[h++] = 0x18;
        n = (uint64_t)x;
    } else if (PyFloat_CheckExact(v)) {
        head[0] = 0x21;
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(v), (char *)head + 1, 1) < 0) return -1;
        *hlen = 9;
        return 0;
    } else {
        return FALLBACK;
    }
    while (n > 0x7F) {
        head[h++] = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    head[h++] = (unsigned char)n;
    *hlen = h;
    return 0;
}

/* one KeyValue field; -1 error */
static int put_attribute(Buf *b, unsigned char tag, PyObject *tagobj, PyObject *k, PyObject *v) {
    if (!PyUnicode_CheckExact(k)) return attr_via_python(b, tagobj, k, v);
    Py_ssize_t klen;
    const char *key = PyUnicode_AsUTF8AndSize(k, &klen);
    if (key == NULL) {
        PyErr_Clear();
        return attr_via_python(b, tagobj, k, v);
    }
    unsigned char head[16];
    Py_ssize_t hlen = 0, tlen = 0, avlen;
    const char *tail = NULL;
    int array = PyList_CheckExact(v) || PyTuple_CheckExact(v);
    if (array) {
        /* ArrayValue of scalars: AnyValue.array_value (5) { ArrayValue.values (1): AnyValue }* ; two passes, the
           first checks every item and sums the lengths (no Python code runs in between: the items cannot change) */
        Py_ssize_t body = 0;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); i++) {
            int rc = scalar_av(PySequence_Fast_GET_ITEM(v, i), head, &hlen, &tail, &tlen);
            if (rc < 0) return -1;
            if (rc == FALLBACK) return attr_via_python(b, tagobj, k, v);
            Py_ssize_t el = hlen + tlen;
            body += 1 + varint_len((uint64_t)el) + el;
        }
        avlen = 1 + varint_len((uint64_t)body) + body;
        Py_ssize_t kvlen = 1 + varint_len((uint64_t)klen) + klen + 1 + varint_len((uint64_t)avlen) + avlen;
        if (buf_byte(b, tag) < 0 || buf_varint(b, (uint64_t)kvlen) < 0) return -1;
        if (buf_field(b, 0x0a, key, klen) < 0) return -1;
        if (buf_byte(b, 0x12) < 0 || buf_varint(b, (uint64_t)avlen) < 0) return -1;
        if (buf_byte(b, 0x2a) < 0 || buf_varint(b, (uint64_t)body) < 0) return -1;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); i++) {
            if (scalar_av(PySequence_Fast_GET_ITEM(v, i), head, &hlen, &tail, &tlen) != 0) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_otlpenc: an attribute changed while it was encoded");
                return -1;
            }
            if (buf_byte(b, 0x0a) < 0 || buf_varint(b, (uint64_t)(hlen + tlen)) < 0) return -1;
            if (buf_put(b, head, hlen) < 0 || buf_put(b, tail, tlen) < 0) return -1;
        }
        return 0;
    }
    int rc = scalar_av(v, head, &hlen, &tail, &tlen);
    if (rc < 0) return -1;
    if (rc == FALLBACK) return attr_via_python(b, tagobj, k, v);
    avlen = hlen + tlen;
    Py_ssize_t kvlen = 1 + varint_len((uint64_t)klen) + klen + 1 + varint_len((uint64_t)avlen) + avlen;
    /* one reservation for the field (tag, length, KeyValue), then written in place */
    if (buf_reserve(b, 11 + kvlen) < 0) return -1;
    unsigned char *q = b->p + b->len;
    *q++ = tag;
    q = raw_varint(q, (uint64_t)kvlen);
    *q++ = 0x0a;
    q = raw_varint(q, (uint64_t)klen);
    if (klen > 0) memcpy(q, key, (size_t)klen);
    q += klen;
    *q++ = 0x12;
    q = raw_varint(q, (uint64_t)avlen);
    if (hlen > 0) memcpy(q, head, (size_t)hlen);
    q += hlen;
    if (tlen > 0) memcpy(q, tail, (size_t)tlen);
    q += tlen;
    b->len = q - b->p;
    return 0;
}

/* every attribute of ``attrs`` (truthy: checked by the caller) as ``tag`` fields */
static int put_attributes(Buf *b, unsigned char tag, PyObject *tagobj, PyObject *attrs) {
    if (!PyDict_CheckExact(attrs)) {
        Py_INCREF(attrs);
        PyObject *res = PyObject_CallFunctionObjArgs(attrs_fallback, tagobj, attrs, NULL);
        Py_DECREF(attrs);
        return buf_put_result(b, res);
    }
    Py_INCREF(attrs);
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int rc = 0;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        Py_INCREF(k);
        Py_INCREF(v);
        rc = put_attribute(b, tag, tagobj, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) break;
    }
    Py_DECREF(attrs);
    return rc;
}

/* ---- a span -------------------------------------------------------------------------------------------------- */

static PyObject *sixty_four = NULL; /* 64, for the trace id's high half */

/* Span body of record ``r`` into ``s`` (scratch ``ev`` for events with attributes): 0, -1 error, FALLBACK.
   Every field is checked before anything is written, so a FALLBACK leaves nothing to undo but s->len. */
static int encode_record(PyObject *r, Buf *s, Buf *ev) {
    if (PyTuple_GET_SIZE(r) != 15) return FALLBACK;
    PyObject *name = PyTuple_GET_ITEM(r, 1), *kind = PyTuple_GET_ITEM(r, 2), *trace_id = PyTuple_GET_ITEM(r, 3);
    PyObject *span_id = PyTuple_GET_ITEM(r, 4), *ts = PyTuple_GET_ITEM(r, 5), *parent = PyTuple_GET_ITEM(r, 6);
    PyObject *remote = PyTuple_GET_ITEM(r, 7), *attrs = PyTuple_GET_ITEM(r, 9), *events = PyTuple_GET_ITEM(r, 10);
    PyObject *start = PyTuple_GET_ITEM(r, 11), *end = PyTuple_GET_ITEM(r, 12), *code = PyTuple_GET_ITEM(r, 13);
    PyObject *desc = PyTuple_GET_ITEM(r, 14);
    uint64_t hi, lo, sid, pid = 0, t0, t1, kv, cv;

    if (!PyLong_CheckExact(trace_id)) return FALLBACK;
    PyObject *high = PyNumber_Rshift(trace_id, sixty_four);
    if (high == NULL) return -1;
    int bad = as_u64(high, &hi);
    Py_DECREF(high);
    if (bad) return FALLBACK; /* negative, or 2**128 and more */
    lo = (uint64_t)PyLong_AsUnsignedLongLongMask(trace_id);
    if (lo == (uint64_t)-1 && PyErr_Occurred()) return -1;
    if (as_u64(span_id, &sid)) return FALLBACK;
    if (!PyUnicode_CheckExact(ts)) return FALLBACK;
    if (parent != Py_None && as_u64(parent, &pid)) return FALLBACK;
    if (parent != Py_None && remote != Py_True && remote != Py_False) return FALLBACK;
    if (!PyUnicode_CheckExact(name)) return FALLBACK;
    if (as_u64(kind, &kv) || kv < 1 || kv > 5) return FALLBACK;
    if (as_u64(start, &t0) || as_u64(end, &t1)) return FALLBACK;
    if (attrs != Py_None && !PyDict_CheckExact(attrs)) return FALLBACK;
    if (!PyTuple_CheckExact(events) && !PyList_CheckExact(events)) return FALLBACK;
    if (as_u64(code, &cv) || cv > 2) return FALLBACK;
    if (desc != Py_None && !PyUnicode_CheckExact(desc)) return FALLBACK;
    /* events: checked here too (a list could change while attributes call back into Python: re-read below) */
    Py_ssize_t nev = PySequence_Fast_GET_SIZE(events);
    for (Py_ssize_t i = 0; i < nev; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(events, i);
        uint64_t t;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3) return FALLBACK;
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(e, 0)) || as_u64(PyTuple_GET_ITEM(e, 1), &t)) return FALLBACK;
        PyObject *ea = PyTuple_GET_ITEM(e, 2);
        if (ea != Py_None && !PyDict_CheckExact(ea)) return FALLBACK;
    }
    Py_ssize_t n_ts, n_name, n_desc = 0;
    const char *c_ts = PyUnicode_AsUTF8AndSize(ts, &n_ts);
    const char *c_name = c_ts ? PyUnicode_AsUTF8AndSize(name, &n_name) : NULL;
    const char *c_desc = NULL;
    if (c_name != NULL && desc != Py_None) c_desc = PyUnicode_AsUTF8AndSize(desc, &n_desc);
    if (c_ts == NULL || c_name == NULL || (desc != Py_None && c_desc == NULL)) {
        PyErr_Clear(); /* not valid UTF-8 (a lone surrogate): the Python raises what it raises */
        return FALLBACK;
    }
    for (Py_ssize_t i = 0; i < nev; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(events, i);
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(e, 0), &n) == NULL) {
            PyErr_Clear();
            return FALLBACK;
        }
    }

    /* trace_id, span_id (big-endian bytes) */
    unsigned char idb[16];
    for (int i = 0; i < 8; i++) {
        idb[i] = (unsigned char)(hi >> (56 - 8 * i));
        idb[8 + i] = (unsigned char)(lo >> (56 - 8 * i));
    }
    if (buf_field(s, 0x0a, idb, 16) < 0) return -1;
    for (int i = 0; i < 8; i++) idb[i] = (unsigned char)(sid >> (56 - 8 * i));
    if (buf_field(s, 0x12, idb, 8) < 0) return -1;
    if (n_ts > 0 && buf_field(s, 0x1a, c_ts, n_ts) < 0) return -1;
    if (parent != Py_None) {
        for (int i = 0; i < 8; i++) idb[i] = (unsigned char)(pid >> (56 - 8 * i));
        if (buf_field(s, 0x22, idb, 8) < 0) return -1;
    }
    if (n_name > 0 && buf_field(s, 0x2a, c_name, n_name) < 0) return -1;
    if (buf_byte(s, 0x30) < 0 || buf_varint(s, kv) < 0) return -1;
    if (t0 && (buf_byte(s, 0x39) < 0 || buf_fixed64(s, t0) < 0)) return -1;
    if (t1 && (buf_byte(s, 0x41) < 0 || buf_fixed64(s, t1) < 0)) return -1;
    if (attrs != Py_None && PyDict_GET_SIZE(attrs) > 0 && put_attributes(s, 0x4a, tag_span_attr, attrs) < 0) return -1;
    /* events: re-read (an attribute fallback may have run Python); anything changed is an error, not a crash */
    Py_INCREF(events);
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(events); i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(events, i);
        uint64_t t;
        Py_ssize_t n;
        const char *c;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3 || as_u64(PyTuple_GET_ITEM(e, 1), &t) ||
            (c = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(e, 0), &n)) == NULL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_RuntimeError, "_otlpenc: a span's events changed while it was encoded");
            rc = -1;
            break;
        }
        Py_INCREF(e);
        PyObject *ea = PyTuple_GET_ITEM(e, 2);
        ev->len = 0;
        if (t && (buf_byte(ev, 0x09) < 0 || buf_fixed64(ev, t) < 0)) rc = -1;
        if (rc == 0 && n > 0 && buf_field(ev, 0x12, c, n) < 0) rc = -1;
        if (rc == 0 && ea != Py_None) {
            if (!PyDict_CheckExact(ea)) {
                PyErr_SetString(PyExc_RuntimeError, "_otlpenc: a span's events changed while it was encoded");
                rc = -1;
            } else if (PyDict_GET_SIZE(ea) > 0 && put_attributes(ev, 0x1a, tag_event_attr, ea) < 0) {
                rc = -1;
            }
        }
        if (rc == 0) rc = buf_field(s, 0x5a, ev->p, ev->len);
        Py_DECREF(e);
    }
    Py_DECREF(events);
    if (rc < 0) return -1;
    /* status (always present), flags */
    Py_ssize_t stlen = (n_desc > 0 ? 1 + varint_len((uint64_t)n_desc) + n_desc : 0) + (cv ? 2 : 0);
    if (buf_byte(s, 0x7a) < 0 || buf_varint(s, (uint64_t)stlen) < 0) return -1;
    if (n_desc > 0) {
        /* the description's UTF-8 again: an attribute fallback may have run Python, but a str is immutable */
        c_desc = PyUnicode_AsUTF8AndSize(desc, &n_desc);
        if (c_desc == NULL || buf_field(s, 0x12, c_desc, n_desc) < 0) return -1;
    }
    if (cv && (buf_byte(s, 0x18) < 0 || buf_byte(s, (unsigned char)cv) < 0)) return -1;
    unsigned char flags[6] = {0x85, 0x01, 0x00, (parent != Py_None && remote == Py_True) ? 0x03 : 0x01, 0x00, 0x00};
    return buf_put(s, flags, 6);
}

static PyObject *span_fields(PyObject *self, PyObject *spans) {
    if (record_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlpenc: configure() was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(spans, "span_fields: expected a sequence of spans");
    if (seq == NULL) return NULL;
    Buf out = {0}, s = {0}, ev = {0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(item);
        int rc = FALLBACK;
        s.len = 0;
        if ((PyObject *)Py_TYPE(item) == record_type) rc = encode_record(item, &s, &ev);
        if (rc == 0) {
            rc = buf_field(&out, 0x12, s.p, s.len);
        } else if (rc == FALLBACK) {
            rc = buf_put_result(&out, PyObject_CallOneArg(span_fallback, item));
        }
        Py_DECREF(item);
        if (rc < 0) goto done;
    }
    result = PyBytes_FromStringAndSize((const char *)out.p, out.len);
done:
    PyMem_Free(out.p);
    PyMem_Free(s.p);
    PyMem_Free(ev.p);
    Py_DECREF(seq);
    return result;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *rt, *sf, *af, *asf;
    if (!PyArg_ParseTuple(args, "OOOO:configure", &rt, &sf, &af, &asf)) return NULL;
    if (!PyType_Check(rt) || !PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: record_type must be a tuple subclass");
        return NULL;
    }
    if (!PyCallable_Check(sf) || !PyCallable_Check(af) || !PyCallable_Check(asf)) {
        PyErr_SetString(PyExc_TypeError, "configure: the fallbacks must be callable");
        return NULL;
    }
    Py_INCREF(rt);
    Py_INCREF(sf);
    Py_INCREF(af);
    Py_INCREF(asf);
    Py_XSETREF(record_type, rt);
    Py_XSETREF(span_fallback, sf);
    Py_XSETREF(attr_fallback, af);
    Py_XSETREF(attrs_fallback, asf);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(record_type, span_fallback, attr_fallback, attrs_fallback): the SpanRecord type and the Python "
     "functions for what the C does not write itself"},
    {"span_fields", span_fields, METH_O,
     "span_fields(spans) -> bytes: the ScopeSpans.spans fields of spans, joined (otlp_encode._span_fields)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_otlpenc", "OTLP span encoding (deltatap.telemetry.otlp_encode)",
                                 -1, methods};

PyMODINIT_FUNC PyInit__otlpenc(void) {
    if (sixty_four == NULL && (sixty_four = PyLong_FromLong(64)) == NULL) return NULL;
    if (tag_span_attr == NULL && (tag_span_attr = PyBytes_FromStringAndSize("\x4a", 1)) == NULL) return NULL;
    if (tag_event_attr == NULL && (tag_event_attr = PyBytes_FromStringAndSize("\x1a", 1)) == NULL) return NULL;
    return PyModule_Create(&mod);
}

/* The collector's OTLP hot path in C: ExportTraceServiceRequest bytes -> the compact spans that
 * deltatap.collector.compact._decode_slim (the reference, and the definition) produces.
 *
 * This walks the protobuf wire format itself (varints, length-delimited fields, fixed64/fixed32, unknown
 * fields skipped) with the slim view's semantics (collector/compact.py: a span's KeyValues merged into one
 * list of keys and one of raw AnyValues, its events into times and names; singular fields: the last one
 * wins). The plans stay in Python: per span it builds a signature (key plan, resource, name, kind, status,
 * rooted, value shapes, per-span value codes, event names) as bytes and looks the span plan up in a dict the
 * Python module owns; a miss calls back into compact.py, which builds the plan exactly as the reference does.
 *
 * Anything this decoder is not sure of returns None, and the caller runs the Python reference on the same
 * bytes: every malformed input (truncated, overlong varints, wrong wire types on known fields, groups, bad
 * UTF-8, misaligned KeyValues, short ids) and every OtlpDecodeError raised by a callback. So errors (their
 * class and message) always come from the reference; this file never reports one itself.
 *
 * Memory safety: every read is bounds-checked against the end of its enclosing message; per-span lists live
 * in heap vectors that grow as needed (no fixed-size buffers fed by input lengths); every CPython call's
 * result is checked and every reference released on every path (the `fail`/`fallback` labels).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ---- configuration handed over by compact.py (configure()) ---------------------------------------- */
static PyObject *g_span_cls, *g_kplans, *g_res, *g_plans, *g_values;
static PyObject *g_key_plan_fn, *g_resource_fn, *g_span_plan_fn, *g_value_fn;
static PyObject *g_shape_int, *g_shape_double, *g_shape_bool, *g_other;
static PyObject *g_code_none, *g_code_q, *g_code_d, *g_code_b;
static PyObject *g_err;
static Py_ssize_t g_max_values, g_max_kplans, g_max_plans;
static int g_ready = 0;

/* ---- a span made without running CompactSpan.__init__ in Python ---------------------------------------
 * configure() finds the class's seven slots and checks, by calling the class once, that __init__ does exactly
 * what span_new does (the four arguments into the first four slots, None into the other three, nothing else:
 * no __dict__, no other slot); if anything differs, every span is made by calling the class. */
#define N_SLOTS 7
static const char *SLOT_NAMES[N_SLOTS] = {"trace_id", "layout", "packed", "others", "_attrs", "_events", "_times"};
static Py_ssize_t g_slot_off[N_SLOTS];
static int g_direct = 0;

static PyObject *span_new(PyObject *const *args) {
    if (!g_direct) return PyObject_Vectorcall(g_span_cls, args, 4, NULL);
    PyTypeObject *tp = (PyTypeObject *)g_span_cls;
    PyObject *o = tp->tp_alloc(tp, 0);  /* zeroed, and tracked by the garbage collector as the class call would */
    if (!o) return NULL;
    for (int k = 0; k < N_SLOTS; k++)
        *(PyObject **)((char *)o + g_slot_off[k]) = Py_NewRef(k < 4 ? args[k] : Py_None);
    return o;
}

static PyObject *slot_of(PyObject *o, int k) { return *(PyObject **)((char *)o + g_slot_off[k]); }

/* 1: span_new may fill the slots itself, 0: it calls the class, -1: error */
static int check_direct(PyObject *cls) {
    if (!PyType_Check(cls)) return 0;
    PyTypeObject *tp = (PyTypeObject *)cls;
    if (tp->tp_new != PyBaseObject_Type.tp_new || tp->tp_dictoffset != 0 || tp->tp_weaklistoffset != 0
        || tp->tp_alloc != PyType_GenericAlloc || tp->tp_base != &PyBaseObject_Type
        || tp->tp_basicsize != PyBaseObject_Type.tp_basicsize + N_SLOTS * (Py_ssize_t)sizeof(PyObject *))
        return 0;
    for (int k = 0; k < N_SLOTS; k++) {
        PyObject *d = PyObject_GetAttrString(cls, SLOT_NAMES[k]);
        if (!d) { PyErr_Clear(); return 0; }
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok) g_slot_off[k] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) return 0;
    }
    /* what the class call makes of four distinct objects */
    PyObject *a[4] = {PyUnicode_FromString("t"), PyTuple_New(0), PyBytes_FromStringAndSize("p", 1), PyTuple_New(0)};
    int rc = 0;
    if (a[0] && a[1] && a[2] && a[3]) {
        PyObject *o = PyObject_Vectorcall(cls, a, 4, NULL);
        if (!o) { PyErr_Clear(); }
        else {
            rc = Py_IS_TYPE(o, tp);
            for (int k = 0; k < N_SLOTS && rc; k++) rc = slot_of(o, k) == (k < 4 ? a[k] : Py_None);
            Py_DECREF(o);
        }
    }
    for (int k = 0; k < 4; k++) Py_XDECREF(a[k]);
    if (PyErr_Occurred()) return -1;
    return rc;
}

/* ---- growable vectors ------------------------------------------------------------------------------ */
typedef struct { const uint8_t *p; Py_ssize_t n; } slice_t;
typedef struct { slice_t *a; Py_ssize_t n, cap; } svec;
typedef struct { uint64_t *a; Py_ssize_t n, cap; } uvec;
typedef struct { char *a; Py_ssize_t n, cap; } cbuf;

static int svec_grow(svec *v) {
    Py_ssize_t cap = v->cap ? v->cap * 2 : 32;
    slice_t *a = PyMem_Realloc(v->a, (size_t)cap * sizeof(slice_t));
    if (!a) { PyErr_NoMemory(); return -1; }
    v->a = a; v->cap = cap;
    return 0;
}
static inline int svec_push(svec *v, const uint8_t *p, Py_ssize_t n) {
    if (v->n == v->cap && svec_grow(v) < 0) return -1;
    v->a[v->n].p = p; v->a[v->n].n = n; v->n++;
    return 0;
}
static int uvec_push(uvec *v, uint64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? v->cap * 2 : 16;
        uint64_t *a = PyMem_Realloc(v->a, (size_t)cap * sizeof(uint64_t));
        if (!a) { PyErr_NoMemory(); return -1; }
        v->a = a; v->cap = cap;
    }
    v->a[v->n++] = x;
    return 0;
}
static int cbuf_reserve(cbuf *b, Py_ssize_t extra) {
    if (extra < 0 || b->n > PY_SSIZE_T_MAX / 2 - extra) { PyErr_NoMemory(); return -1; }
    if (b->n + extra > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + extra) cap *= 2;
        char *a = PyMem_Realloc(b->a, (size_t)cap);
        if (!a) { PyErr_NoMemory(); return -1; }
        b->a = a; b->cap = cap;
    }
    return 0;
}
/* (the fast paths inline: a span's signatures are a few hundred small appends) */
static inline int cbuf_put(cbuf *b, const void *p, Py_ssize_t n) {
    if ((n < 0 || n > b->cap - b->n) && cbuf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->a + b->n, p, (size_t)n);
    b->n += n;
    return 0;
}
static inline int cbuf_u64(cbuf *b, uint64_t x) { return cbuf_put(b, &x, 8); }
static inline int cbuf_lp(cbuf *b, const void *p, Py_ssize_t n) {  /* length-prefixed */
    uint64_t ln = (uint64_t)n;
    if (cbuf_put(b, &ln, 8) < 0) return -1;
    return cbuf_put(b, p, n);
}

/* ---- wire format ----------------------------------------------------------------------------------- */
/* 0: ok; 1: not sure (the reference decides). max_bytes: longest encoding accepted (10 for values, 5 for tags
 * and lengths; a longer, non-canonical encoding goes to the reference). A 10-byte varint's last byte must be
 * 0 or 1 (its value fits 64 bits). */
static int rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out, int max_bytes) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end) return 1;
        uint8_t c = *p++;
        if (i == 9 && c > 1) return 1;
        v |= (uint64_t)(c & 0x7F) << (7 * i);
        if (c < 0x80) { *pp = p; *out = v; return 0; }
    }
    return 1;
}
static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

typedef struct { uint32_t field; int wt; uint64_t v; const uint8_t *d; Py_ssize_t len; } fld_t;

/* the next field of a message ending at `end`: 0 ok (its value in f), 1 not sure */
static int next_field(const uint8_t **pp, const uint8_t *end, fld_t *f) {
    uint64_t tag;
    if (rd_varint(pp, end, &tag, 5) || tag > 0xFFFFFFFFu) return 1;
    f->field = (uint32_t)(tag >> 3);
    f->wt = (int)(tag & 7);
    if (f->field == 0) return 1;
    switch (f->wt) {
    case 0:
        return rd_varint(pp, end, &f->v, 10);
    case 1:
        if (end - *pp < 8) return 1;
        f->v = le64(*pp); *pp += 8; return 0;
    case 2: {
        uint64_t ln;
        if (rd_varint(pp, end, &ln, 5)) return 1;
        if (ln > (uint64_t)(end - *pp)) return 1;
        f->d = *pp; f->len = (Py_ssize_t)ln; *pp += ln; return 0;
    }
    case 5:
        if (end - *pp < 4) return 1;
        *pp += 4; return 0;
    default:  /* groups (3, 4) and the invalid 6, 7 */
        return 1;
    }
}

/* KeyValues merged (the slim view's Attrs): keys (field 1) and raw values (field 2) appended */
static int rd_attrs(const uint8_t *p, const uint8_t *end, svec *keys, svec *vals) {
    fld_t f;
    while (p < end) {
        if (next_field(&p, end, &f)) return 1;
        if (f.field == 1 || f.field == 2) {
            if (f.wt != 2) return 1;
            if (svec_push(f.field == 1 ? keys : vals, f.d, f.len) < 0) return -1;
        }
    }
    return 0;
}

static int is_ascii(const uint8_t *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (p[i] & 0x80) return 0;
    return 1;
}
/* 1: valid UTF-8 (as upb and Python's strict decoder both define it), 0: not, -1: error */
static int valid_utf8(const uint8_t *p, Py_ssize_t n) {
    if (is_ascii(p, n)) return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s) { Py_DECREF(s); return 1; }
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) { PyErr_Clear(); return 0; }
    return -1;
}

/* ---- values ------------------------------------------------------------------------------------------ */
/* one object per distinct string (compact._shared): steals s, returns a new reference */
static PyObject *shared(PyObject *s) {
    PyObject *got = PyDict_GetItemWithError(g_values, s);
    if (got) { Py_INCREF(got); Py_DECREF(s); return got; }
    if (PyErr_Occurred()) { Py_DECREF(s); return NULL; }
    if (PyDict_GET_SIZE(g_values) >= g_max_values) PyDict_Clear(g_values);
    if (PyDict_SetItem(g_values, s, s) < 0) { Py_DECREF(s); return NULL; }
    return s;
}

typedef struct {
    char code;         /* 'q', 'd', '?', 's' (a string: code ""), 'o' (code "", not a string) */
    PyObject *value;   /* owned; for 'q', 'd', '?' and 's' made on first need (val_obj): a number that is only
                          packed, or a string that only shapes the layout, never becomes an object */
    PyObject *shape;   /* borrowed marker, or NULL for a string (the value is its shape) */
    const uint8_t *sp; Py_ssize_t sn;  /* a string's UTF-8 bytes (for the signature; checked valid) */
    PyObject *sown;    /* owns the bytes behind sp when they came from the reference */
    int64_t q; double dv; int bv;  /* the number itself ('q', 'd', '?') */
} val_t;

static void val_clear(val_t *v) { Py_CLEAR(v->value); Py_CLEAR(v->sown); }

/* the value's object (borrowed from *v, which owns it), made now if it was not yet: what compact._value gives */
static PyObject *val_obj(val_t *v) {
    if (v->value) return v->value;
    switch (v->code) {
    case 'q': v->value = PyLong_FromLongLong((long long)v->q); break;
    case 'd': v->value = PyFloat_FromDouble(v->dv); break;
    case '?': v->value = PyBool_FromLong(v->bv); break;
    case 's': {
        PyObject *s = PyUnicode_DecodeUTF8((const char *)v->sp, v->sn, "strict");  /* (valid: checked in dec_value) */
        v->value = s ? shared(s) : NULL;
        break;
    }
    default: PyErr_SetString(PyExc_SystemError, "value without an object"); break;
    }
    return v->value;
}

/* An AnyValue's (code, value, shape) as compact._value gives it: the common encodings here (their object made
 * by val_obj when needed), the rest through the reference (compact._value). 0 ok, -1 error (exception set). */
static int dec_value(const uint8_t *r, Py_ssize_t n, val_t *out) {
    out->value = NULL; out->sown = NULL; out->shape = NULL; out->sp = NULL; out->sn = 0;
    if (n == 9 && r[0] == 0x21) {
        union { uint64_t u; double d; } x;
        x.u = le64(r + 1);
        out->code = 'd'; out->shape = g_shape_double; out->dv = x.d;
        return 0;
    }
    if (n >= 2 && (r[0] == 0x18 || r[0] == 0x10 || r[0] == 0x0A)) {
        const uint8_t *p = r + 1, *end = r + n;
        uint64_t v;
        if (r[0] == 0x18) {
            if (!rd_varint(&p, end, &v, 10) && p == end) {
                out->code = 'q'; out->shape = g_shape_int; out->q = (int64_t)v;
                return 0;
            }
        } else if (r[0] == 0x10) {
            if (!rd_varint(&p, end, &v, 10) && p == end) {
                out->code = '?'; out->shape = g_shape_bool; out->bv = v != 0;
                return 0;
            }
        } else if (!rd_varint(&p, end, &v, 5) && v == (uint64_t)(end - p)) {
            int ok = valid_utf8(p, end - p);
            if (ok < 0) return -1;
            if (ok) {
                out->code = 's'; out->sp = p; out->sn = end - p;
                return 0;
            }
            /* not UTF-8: the reference decides (it raises OtlpDecodeError) */
        }
    }
    /* anything else: the reference */
    PyObject *raw = PyBytes_FromStringAndSize((const char *)r, n);
    if (!raw) return -1;
    PyObject *t = PyObject_CallOneArg(g_value_fn, raw);
    Py_DECREF(raw);
    if (!t) return -1;
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) { Py_DECREF(t); PyErr_SetString(PyExc_TypeError, "_value must return a 3-tuple"); return -1; }
    PyObject *code = PyTuple_GET_ITEM(t, 0), *val = PyTuple_GET_ITEM(t, 1), *shape = PyTuple_GET_ITEM(t, 2);
    Py_INCREF(val);
    out->value = val;
    if (shape == g_shape_int) { out->code = 'q'; out->shape = shape; }
    else if (shape == g_shape_double) { out->code = 'd'; out->shape = shape; }
    else if (shape == g_shape_bool) { out->code = '?'; out->shape = shape; }
    else if (shape == g_other) { out->code = 'o'; out->shape = shape; }
    else if (PyUnicode_Check(shape)) {
        Py_ssize_t sn;
        const char *sp = PyUnicode_AsUTF8AndSize(shape, &sn);
        if (!sp) { Py_DECREF(t); return -1; }
        out->code = 's'; out->sp = (const uint8_t *)sp; out->sn = sn;
        Py_INCREF(shape); out->sown = shape;
    } else { Py_DECREF(t); PyErr_SetString(PyExc_TypeError, "_value returned an unknown shape"); return -1; }
    (void)code;
    Py_DECREF(t);
    return 0;
}

static PyObject *code_obj(char c) {
    switch (c) {
    case 'q': return g_code_q;
    case 'd': return g_code_d;
    case '?': return g_code_b;
    default: return g_code_none;
    }
}

/* ---- a few recent signatures and what they found, compared byte-wise before a dict lookup ------------ */
#define MEMO 8
typedef struct { char *sig; Py_ssize_t n; PyObject *entry; } memo_t;
static memo_t g_kmemo[MEMO], g_pmemo[MEMO];
static int g_knext, g_pnext;

static PyObject *memo_find(memo_t *m, const char *sig, Py_ssize_t n) {
    for (int i = 0; i < MEMO; i++)
        if (m[i].entry && m[i].n == n && memcmp(m[i].sig, sig, (size_t)n) == 0) return m[i].entry;  /* borrowed */
    return NULL;
}
static void memo_put(memo_t *m, int *next, const char *sig, Py_ssize_t n, PyObject *entry) {
    char *copy = PyMem_Malloc((size_t)(n ? n : 1));
    if (!copy) return;  /* (a memo is optional: the dict has it) */
    if (n) memcpy(copy, sig, (size_t)n);
    memo_t *e = &m[*next];
    *next = (*next + 1) % MEMO;
    PyMem_Free(e->sig);
    Py_XSETREF(e->entry, Py_NewRef(entry));
    e->sig = copy; e->n = n;
}
static void memo_clear(memo_t *m) {
    for (int i = 0; i < MEMO; i++) { PyMem_Free(m[i].sig); m[i].sig = NULL; m[i].n = 0; Py_CLEAR(m[i].entry); }
}

/* ---- bounded caches ------------------------------------------------------------------------------ */
static int cache_put(PyObject *d, PyObject *k, PyObject *v, Py_ssize_t max) {
    if (PyDict_GET_SIZE(d) >= max) PyDict_Clear(d);
    return PyDict_SetItem(d, k, v);
}

static PyObject *tuple_of_slices(const slice_t *a, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    if (!t) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)a[i].p, a[i].n);
        if (!b) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, b);
    }
    return t;
}

/* ---- the decoder ------------------------------------------------------------------------------------ */
typedef struct {
    svec keys, vals, enames, rkeys, rvals, scopes;
    uvec etimes;
    cbuf sig, ksig;
    val_t *v; Py_ssize_t vcap;
    PyObject *out, *tids;
    uint8_t last_tid[16]; PyObject *last_hex;
} dec_t;

static void dec_free(dec_t *d) {
    PyMem_Free(d->keys.a); PyMem_Free(d->vals.a); PyMem_Free(d->enames.a); PyMem_Free(d->rkeys.a);
    PyMem_Free(d->rvals.a); PyMem_Free(d->scopes.a); PyMem_Free(d->etimes.a); PyMem_Free(d->sig.a);
    PyMem_Free(d->ksig.a); PyMem_Free(d->v);
    Py_XDECREF(d->out); Py_XDECREF(d->tids); Py_XDECREF(d->last_hex);
}

static PyObject *hex_of(dec_t *d, const uint8_t *tid) {
    if (d->last_hex && memcmp(d->last_tid, tid, 16) == 0) { Py_INCREF(d->last_hex); return d->last_hex; }
    static const char hx[] = "0123456789abcdef";
    PyObject *s = PyUnicode_New(32, 127);
    if (!s) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(s);
    for (int i = 0; i < 16; i++) { w[2 * i] = (Py_UCS1)hx[tid[i] >> 4]; w[2 * i + 1] = (Py_UCS1)hx[tid[i] & 15]; }
    PyObject *got = PyDict_SetDefault(d->tids, s, s);  /* one object per trace id in a request */
    Py_DECREF(s);
    if (!got) return NULL;
    Py_INCREF(got);
    Py_XSETREF(d->last_hex, got);
    memcpy(d->last_tid, tid, 16);
    Py_INCREF(got);
    return got;
}

/* the key plan of a span's raw keys: (kp, serial, norm_idx, per_idx), borrowed from g_kplans' entry kept alive
 * by *hold (a new reference) */
static PyObject *key_plan(dec_t *d, const svec *keys, PyObject **hold) {
    d->ksig.n = 0;
    for (Py_ssize_t i = 0; i < keys->n; i++)
        if (cbuf_lp(&d->ksig, keys->a[i].p, keys->a[i].n) < 0) return NULL;
    PyObject *e = memo_find(g_kmemo, d->ksig.a ? d->ksig.a : "", d->ksig.n);
    if (e) { Py_INCREF(e); *hold = e; goto check; }
    PyObject *k = PyBytes_FromStringAndSize(d->ksig.a ? d->ksig.a : "", d->ksig.n);
    if (!k) return NULL;
    e = PyDict_GetItemWithError(g_kplans, k);
    if (e) { Py_INCREF(e); Py_DECREF(k); *hold = e; memo_put(g_kmemo, &g_knext, d->ksig.a ? d->ksig.a : "", d->ksig.n, e); goto check; }
    if (PyErr_Occurred()) { Py_DECREF(k); return NULL; }
    PyObject *raw = tuple_of_slices(keys->a, keys->n);
    if (!raw) { Py_DECREF(k); return NULL; }
    e = PyObject_CallOneArg(g_key_plan_fn, raw);
    Py_DECREF(raw);
    if (!e) { Py_DECREF(k); return NULL; }
    if (cache_put(g_kplans, k, e, g_max_kplans) < 0) { Py_DECREF(k); Py_DECREF(e); return NULL; }
    Py_DECREF(k);
    *hold = e;
    memo_put(g_kmemo, &g_knext, d->ksig.a ? d->ksig.a : "", d->ksig.n, e);
check:
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(e, 2)) || !PyTuple_Check(PyTuple_GET_ITEM(e, 3))) {
        Py_CLEAR(*hold);
        PyErr_SetString(PyExc_TypeError, "bad key plan");
        return NULL;
    }
    return e;
}

/* the values of the indices idx (a tuple of ints into vals) decoded into d->v[at...] */
static int decode_values(dec_t *d, PyObject *idx, const svec *vals, Py_ssize_t at) {
    Py_ssize_t n = PyTuple_GET_SIZE(idx);
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(idx, j));
        if (i == -1 && PyErr_Occurred()) return -1;
        if (i < 0 || i >= vals->n) { PyErr_SetString(PyExc_IndexError, "key plan index out of range"); return -1; }
        val_t *v = &d->v[at + j];
        if (dec_value(vals->a[i].p, vals->a[i].n, v) < 0) return -1;  /* (the caller clears every entry) */
    }
    return 0;
}

typedef struct { PyObject *serial, *items, *service; } res_t;

/* 0 ok, 1 not sure, -1 error */
static int do_span(dec_t *d, const uint8_t *p, const uint8_t *end, PyObject *res_entry) {
    fld_t f;
    slice_t tid = {NULL, 0}, sid = {NULL, 0}, parent = {NULL, 0}, name = {NULL, 0};
    int32_t kind = 0, status = 0;
    uint64_t start = 0, stop = 0;
    int names_seen = 0;
    d->keys.n = d->vals.n = d->enames.n = d->etimes.n = 0;
    while (p < end) {
        if (next_field(&p, end, &f)) return 1;
        switch (f.field) {
        case 1: case 2: case 4: case 5: case 9: case 11: case 15:
            if (f.wt != 2) return 1;
            break;
        case 6: if (f.wt != 0) return 1; break;
        case 7: case 8: if (f.wt != 1) return 1; break;
        default: continue;  /* unknown: skipped */
        }
        switch (f.field) {
        case 1: tid.p = f.d; tid.n = f.len; break;
        case 2: sid.p = f.d; sid.n = f.len; break;
        case 4: parent.p = f.d; parent.n = f.len; break;
        case 5: {
            int ok = valid_utf8(f.d, f.len);
            if (ok < 0) return -1;
            if (!ok) return 1;
            name.p = f.d; name.n = f.len; names_seen++;
            break;
        }
        case 6: kind = (int32_t)(uint32_t)f.v; break;
        case 7: start = f.v; break;
        case 8: stop = f.v; break;
        case 9: { int r = rd_attrs(f.d, f.d + f.len, &d->keys, &d->vals); if (r) return r; break; }
        case 11: {
            const uint8_t *q = f.d, *qe = f.d + f.len;
            fld_t g;
            while (q < qe) {
                if (next_field(&q, qe, &g)) return 1;
                if (g.field == 1) { if (g.wt != 1) return 1; if (uvec_push(&d->etimes, g.v) < 0) return -1; }
                else if (g.field == 2) { if (g.wt != 2) return 1; if (svec_push(&d->enames, g.d, g.len) < 0) return -1; }
            }
            break;
        }
        case 15: {
            const uint8_t *q = f.d, *qe = f.d + f.len;
            fld_t g;
            while (q < qe) {
                if (next_field(&q, qe, &g)) return 1;
                if (g.field == 3) { if (g.wt != 0) return 1; status = (int32_t)(uint32_t)g.v; }
            }
            break;
        }
        }
    }
    (void)names_seen;
    if (tid.n != 16 || sid.n != 8) return 1;                 /* the reference names the span */
    if (d->keys.n != d->vals.n || d->etimes.n != d->enames.n) return 1;  /* misaligned: the long way */

    PyObject *hold = NULL;
    PyObject *kpe = key_plan(d, &d->keys, &hold);
    if (!kpe) return -1;
    PyObject *norm_idx = PyTuple_GET_ITEM(kpe, 2), *per_idx = PyTuple_GET_ITEM(kpe, 3);
    Py_ssize_t nn = PyTuple_GET_SIZE(norm_idx), np_ = PyTuple_GET_SIZE(per_idx), nv = nn + np_;
    int rc = -1;
    PyObject *sigb = NULL, *plan = NULL, *packed = NULL, *others = NULL, *hx = NULL, *span = NULL;
    if (nv > d->vcap) {
        val_t *a = PyMem_Realloc(d->v, (size_t)nv * sizeof(val_t));
        if (!a) { PyErr_NoMemory(); Py_DECREF(hold); return -1; }
        d->v = a; d->vcap = nv;
    }
    for (Py_ssize_t i = 0; i < nv; i++) { d->v[i].value = NULL; d->v[i].sown = NULL; }
    if (decode_values(d, norm_idx, &d->vals, 0) < 0) goto done;
    if (decode_values(d, per_idx, &d->vals, nn) < 0) goto done;

    /* the span plan's signature: everything compact._decode_slim's plan key holds */
    cbuf *s = &d->sig;
    s->n = 0;
    if (cbuf_u64(s, (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(kpe, 1))) < 0) goto done;
    if (cbuf_u64(s, (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(res_entry, 0))) < 0) goto done;
    if (PyErr_Occurred()) goto done;
    {
        int32_t ks[2] = {kind, status};
        char rooted = parent.n == 0;
        if (cbuf_put(s, ks, sizeof ks) < 0 || cbuf_put(s, &rooted, 1) < 0) goto done;
    }
    if (cbuf_lp(s, name.p, name.n) < 0) goto done;
    for (Py_ssize_t i = 0; i < nn; i++) {
        val_t *v = &d->v[i];
        if (cbuf_put(s, &v->code, 1) < 0) goto done;
        if (v->code == 's' && cbuf_lp(s, v->sp, v->sn) < 0) goto done;
    }
    for (Py_ssize_t i = nn; i < nv; i++) {
        char c = d->v[i].code;
        if (c == 'o') c = 's';  /* per-span codes: "" for both */
        if (cbuf_put(s, &c, 1) < 0) goto done;
    }
    if (cbuf_u64(s, (uint64_t)d->enames.n) < 0) goto done;
    for (Py_ssize_t i = 0; i < d->enames.n; i++)
        if (cbuf_lp(s, d->enames.a[i].p, d->enames.a[i].n) < 0) goto done;
    plan = memo_find(g_pmemo, s->a, s->n);
    if (plan) Py_INCREF(plan);
    else if (!(sigb = PyBytes_FromStringAndSize(s->a, s->n))) goto done;
    else if ((plan = PyDict_GetItemWithError(g_plans, sigb))) {
        Py_INCREF(plan);
        memo_put(g_pmemo, &g_pnext, s->a, s->n, plan);
    } else {
        if (PyErr_Occurred()) goto done;
        PyObject *dec = PyList_New(nv), *nm = NULL, *rn = NULL;
        if (!dec) goto done;
        for (Py_ssize_t i = 0; i < nv; i++) {
            val_t *v = &d->v[i];
            PyObject *vo = val_obj(v);
            if (!vo) { Py_DECREF(dec); goto done; }
            PyObject *shape = v->code == 's' ? (v->sown ? v->sown : vo) : v->shape;
            PyObject *t = PyTuple_Pack(3, code_obj(v->code), vo, shape);
            if (!t) { Py_DECREF(dec); goto done; }
            PyList_SET_ITEM(dec, i, t);
        }
        nm = PyUnicode_DecodeUTF8((const char *)name.p, name.n, "strict");
        rn = nm ? tuple_of_slices(d->enames.a, d->enames.n) : NULL;
        if (rn)
            plan = PyObject_CallFunction(g_span_plan_fn, "OOOOiiOOO", PyTuple_GET_ITEM(kpe, 0), PyTuple_GET_ITEM(res_entry, 1),
                                         PyTuple_GET_ITEM(res_entry, 2), nm, (int)kind, (int)status, parent.n == 0 ? Py_True : Py_False, dec, rn);
        Py_DECREF(dec); Py_XDECREF(nm); Py_XDECREF(rn);
        if (!plan) goto done;
        if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 6 || !PyTuple_Check(PyTuple_GET_ITEM(plan, 1)) || !PyTuple_Check(PyTuple_GET_ITEM(plan, 2))
            || !PyTuple_Check(PyTuple_GET_ITEM(plan, 3)) || !PyTuple_Check(PyTuple_GET_ITEM(plan, 4)) || !PyBytes_Check(PyTuple_GET_ITEM(plan, 5))) {
            PyErr_SetString(PyExc_TypeError, "bad span plan");
            goto done;
        }
        if (cache_put(g_plans, sigb, plan, g_max_plans) < 0) goto done;
        memo_put(g_pmemo, &g_pnext, s->a, s->n, plan);
    }
    {
        PyObject *layout = PyTuple_GET_ITEM(plan, 0), *pidx = PyTuple_GET_ITEM(plan, 1), *oidx = PyTuple_GET_ITEM(plan, 2);
        PyObject *rpk = PyTuple_GET_ITEM(plan, 3), *rot = PyTuple_GET_ITEM(plan, 4), *codes = PyTuple_GET_ITEM(plan, 5);
        Py_ssize_t npk = PyTuple_GET_SIZE(pidx), nrp = PyTuple_GET_SIZE(rpk), no = PyTuple_GET_SIZE(oidx), nro = PyTuple_GET_SIZE(rot);
        const char *cs = PyBytes_AS_STRING(codes);
        if (PyBytes_GET_SIZE(codes) != npk + nrp) { PyErr_SetString(PyExc_TypeError, "bad span plan codes"); goto done; }
        Py_ssize_t size = 16 + 8 * (2 + d->etimes.n);
        for (Py_ssize_t i = 0; i < npk + nrp; i++) size += cs[i] == '?' ? 1 : 8;
        packed = PyBytes_FromStringAndSize(NULL, size);
        if (!packed) goto done;
        uint8_t *w = (uint8_t *)PyBytes_AS_STRING(packed);
        memcpy(w, sid.p, 8);
        memset(w + 8, 0, 8);
        memcpy(w + 8, parent.p ? parent.p : (const uint8_t *)"", parent.n < 8 ? (size_t)parent.n : 8);
        w += 16;
        memcpy(w, &start, 8); memcpy(w + 8, &stop, 8); w += 16;  /* (little-endian hosts: checked at import) */
        for (Py_ssize_t i = 0; i < d->etimes.n; i++) { memcpy(w, &d->etimes.a[i], 8); w += 8; }
        for (Py_ssize_t j = 0; j < npk + nrp; j++) {
            PyObject *val;
            if (j < npk) {
                Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pidx, j));
                if (i == -1 && PyErr_Occurred()) goto done;
                if (i < 0 || i >= nv) { PyErr_SetString(PyExc_IndexError, "plan index out of range"); goto done; }
                val_t *v = &d->v[i];
                if (!v->value && v->code == cs[j]) {  /* a number decoded here, packed as what it is: no object */
                    if (cs[j] == 'q') { memcpy(w, &v->q, 8); w += 8; continue; }
                    if (cs[j] == 'd') { memcpy(w, &v->dv, 8); w += 8; continue; }
                    if (cs[j] == '?') { *w++ = (uint8_t)v->bv; continue; }
                }
                val = val_obj(v);
                if (!val) goto done;
            } else val = PyTuple_GET_ITEM(rpk, j - npk);
            if (cs[j] == 'q') {
                long long x = PyLong_AsLongLong(val);
                if (x == -1 && PyErr_Occurred()) { if (PyErr_ExceptionMatches(PyExc_OverflowError)) { PyErr_Clear(); rc = 1; } goto done; }
                memcpy(w, &x, 8); w += 8;
            } else if (cs[j] == 'd') {
                double x = PyFloat_AsDouble(val);
                if (x == -1.0 && PyErr_Occurred()) goto done;
                memcpy(w, &x, 8); w += 8;
            } else if (cs[j] == '?') {
                int t = PyObject_IsTrue(val);
                if (t < 0) goto done;
                *w++ = (uint8_t)t;
            } else { PyErr_SetString(PyExc_TypeError, "bad struct code"); goto done; }
        }
        others = PyTuple_New(no + nro);
        if (!others) goto done;
        for (Py_ssize_t j = 0; j < no; j++) {
            Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(oidx, j));
            if (i == -1 && PyErr_Occurred()) goto done;
            if (i < 0 || i >= nv) { PyErr_SetString(PyExc_IndexError, "plan index out of range"); goto done; }
            PyObject *vo = val_obj(&d->v[i]);
            if (!vo) goto done;
            Py_INCREF(vo);
            PyTuple_SET_ITEM(others, j, vo);
        }
        for (Py_ssize_t j = 0; j < nro; j++) {
            PyObject *x = PyTuple_GET_ITEM(rot, j);
            Py_INCREF(x);
            PyTuple_SET_ITEM(others, no + j, x);
        }
        hx = hex_of(d, tid.p);
        if (!hx) goto done;
        PyObject *args[4] = {hx, layout, packed, others};
        span = span_new(args);
        if (!span) goto done;
        if (PyList_Append(d->out, span) < 0) goto done;
        rc = 0;
    }
done:
    for (Py_ssize_t i = 0; i < nv; i++) val_clear(&d->v[i]);
    Py_XDECREF(hold); Py_XDECREF(sigb); Py_XDECREF(plan); Py_XDECREF(packed); Py_XDECREF(others); Py_XDECREF(hx); Py_XDECREF(span);
    return rc;
}

static int do_resource_spans(dec_t *d, const uint8_t *p, const uint8_t *end) {
    fld_t f;
    d->rkeys.n = d->rvals.n = d->scopes.n = 0;
    while (p < end) {
        if (next_field(&p, end, &f)) return 1;
        if (f.field == 1) {  /* Resource: its attributes (field 1), merged over every occurrence */
            if (f.wt != 2) return 1;
            const uint8_t *q = f.d, *qe = f.d + f.len;
            fld_t g;
            while (q < qe) {
                if (next_field(&q, qe, &g)) return 1;
                if (g.field == 1) {
                    if (g.wt != 2) return 1;
                    int r = rd_attrs(g.d, g.d + g.len, &d->rkeys, &d->rvals);
                    if (r) return r;
                }
            }
        } else if (f.field == 2) {
            if (f.wt != 2) return 1;
            if (svec_push(&d->scopes, f.d, f.len) < 0) return -1;
        }
    }
    if (d->rkeys.n != d->rvals.n) return 1;
    /* the resource: (serial, items, service), cached by its raw keys and values */
    d->ksig.n = 0;
    for (Py_ssize_t i = 0; i < d->rkeys.n; i++)
        if (cbuf_lp(&d->ksig, d->rkeys.a[i].p, d->rkeys.a[i].n) < 0 || cbuf_lp(&d->ksig, d->rvals.a[i].p, d->rvals.a[i].n) < 0) return -1;
    PyObject *k = PyBytes_FromStringAndSize(d->ksig.a ? d->ksig.a : "", d->ksig.n);
    if (!k) return -1;
    PyObject *e = PyDict_GetItemWithError(g_res, k);
    if (e) Py_INCREF(e);
    else {
        if (PyErr_Occurred()) { Py_DECREF(k); return -1; }
        PyObject *rk = tuple_of_slices(d->rkeys.a, d->rkeys.n);
        PyObject *rv = rk ? tuple_of_slices(d->rvals.a, d->rvals.n) : NULL;
        if (rv) e = PyObject_CallFunctionObjArgs(g_resource_fn, rk, rv, NULL);
        Py_XDECREF(rk); Py_XDECREF(rv);
        if (!e) { Py_DECREF(k); return -1; }
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 3) { PyErr_SetString(PyExc_TypeError, "bad resource"); Py_DECREF(k); Py_DECREF(e); return -1; }
        if (cache_put(g_res, k, e, g_max_kplans) < 0) { Py_DECREF(k); Py_DECREF(e); return -1; }
    }
    Py_DECREF(k);
    /* the scope spans' list is reused by nested calls: copy it out first */
    Py_ssize_t ns = d->scopes.n;
    slice_t *sc = PyMem_Malloc((size_t)(ns ? ns : 1) * sizeof(slice_t));
    if (!sc) { Py_DECREF(e); PyErr_NoMemory(); return -1; }
    if (ns) memcpy(sc, d->scopes.a, (size_t)ns * sizeof(slice_t));
    int rc = 0;
    for (Py_ssize_t si = 0; si < ns && rc == 0; si++) {
        const uint8_t *q = sc[si].p, *qe = sc[si].p + sc[si].n;
        fld_t g;
        while (q < qe && rc == 0) {
            if (next_field(&q, qe, &g)) { rc = 1; break; }
            if (g.field == 2) {
                if (g.wt != 2) { rc = 1; break; }
                rc = do_span(d, g.d, g.d + g.len, e);
            }
        }
    }
    PyMem_Free(sc);
    Py_DECREF(e);
    return rc;
}

static PyObject *otlp_decode(PyObject *self, PyObject *arg) {
    if (!g_ready) { PyErr_SetString(PyExc_RuntimeError, "_otlpdec.configure() was not called"); return NULL; }
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) {  /* not bytes-like: the reference says what it is */
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_BufferError)) return NULL;
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    dec_t d;
    memset(&d, 0, sizeof d);
    int rc = -1;
    d.out = PyList_New(0);
    d.tids = PyDict_New();
    if (d.out && d.tids) {
        const uint8_t *p = buf.buf, *end = p + buf.len;
        fld_t f;
        rc = 0;
        while (p < end && rc == 0) {
            if (next_field(&p, end, &f)) { rc = 1; break; }
            if (f.field == 1) {
                if (f.wt != 2) { rc = 1; break; }
                rc = do_resource_spans(&d, f.d, f.d + f.len);
            }
        }
    }
    PyBuffer_Release(&buf);
    if (rc < 0 && PyErr_ExceptionMatches(g_err)) { PyErr_Clear(); rc = 1; }  /* a callback refused it: the reference says why */
    PyObject *res = NULL;
    if (rc == 0) { res = d.out; d.out = NULL; }
    else if (rc == 1) { res = Py_None; Py_INCREF(res); }
    dec_free(&d);
    return res;
}

static PyObject *otlp_configure(PyObject *self, PyObject *args) {
    PyObject *o[17], *err;
    Py_ssize_t mv, mk, mp;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!OOOOOOOOUUUUOnnn:configure", &o[0], &PyDict_Type, &o[1], &PyDict_Type, &o[2], &PyDict_Type, &o[3],
                          &PyDict_Type, &o[4], &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13], &o[14], &o[15], &o[16],
                          &err, &mv, &mk, &mp))
        return NULL;
    PyObject **slots[17] = {&g_span_cls, &g_kplans, &g_res, &g_plans, &g_values, &g_key_plan_fn, &g_resource_fn, &g_span_plan_fn, &g_value_fn,
                            &g_shape_int, &g_shape_double, &g_shape_bool, &g_other, &g_code_none, &g_code_q, &g_code_d, &g_code_b};
    for (int i = 0; i < 17; i++) { Py_INCREF(o[i]); Py_XSETREF(*slots[i], o[i]); }
    Py_INCREF(err);
    Py_XSETREF(g_err, err);
    g_max_values = mv > 0 ? mv : 1; g_max_kplans = mk > 0 ? mk : 1; g_max_plans = mp > 0 ? mp : 1;
    g_direct = 0;
    int direct = check_direct(g_span_cls);
    if (direct < 0) return NULL;
    g_direct = direct;
    g_ready = 1;
    Py_RETURN_NONE;
}

static PyObject *otlp_direct(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(g_direct);
}

static PyObject *otlp_reset(PyObject *self, PyObject *unused) {
    memo_clear(g_kmemo);
    memo_clear(g_pmemo);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"direct", otlp_direct, METH_NOARGS, "direct() -> whether spans are made without calling CompactSpan (configure() checked it may)"},
    {"reset", otlp_reset, METH_NOARGS, "reset(): forget the recent signatures (compact clears its caches: the span kinds changed)"},
    {"decode", otlp_decode, METH_O, "decode(data) -> list of CompactSpan, or None: the reference decides"},
    {"configure", otlp_configure, METH_VARARGS, "configure(...): the caches, callbacks and markers of collector.compact"},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_otlpdec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlpdec(void) {
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {  /* the packed numbers are written in host order: little-endian only */
        PyErr_SetString(PyExc_ImportError, "_otlpdec needs a little-endian host");
        return NULL;
    }
    return PyModule_Create(&mod);
}

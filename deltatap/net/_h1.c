/* The C accelerator of deltatap.net.h1: head parsing, a request head's framing and rewrite, and body framing,
   one C call per head or read.

h1.py is the definition; these functions do exactly what its Python does (tests/kernel/test_h1_native.py
compares them on generated messages split at random points, malformed chunk sizes, oversize lines):

* parse_head(raw, request) -> (method, target, version, status, reason, headers, index) or ValueError(reason):
  h1.parse_head without building the Head (index: what Head.values builds, lower-cased name -> values);
* head_end(buf, start) -> int: h1._head_end;
* feed_head(data, pos, buf, request, max_head): Reader._feed_head in one call (leading empty lines, the head's end,
  the size limit, parse_head, the Head with keep_alive filled in, its slots written directly) and, for a request, Reader._begin's
  framing (Content-Length / chunked / none, the protocol-switch hold) with its errors (test_h1_head_native.py);
  for the usual final response, given the request's method, its framing likewise (Content-Length / chunked / to
  the close / none; tests/kernel/test_h1_response_tapcpu.py);
* header_values(headers, lname, all) -> Head.values(lname) / Head.get(lname) read from the headers list, as the name
  index (Head.index) would answer: a head feed_head makes has no index until one is asked for (tests/proxy/
  test_head_s21_request.py compares them);
* rewrite_head(raw, host_header, target_prefix, additions) -> bytes: proxy/headers.py's rewrite_request_head's bytes;
* body(data, pos, state, remaining, buf, out) -> (pos, state, remaining, buf, how, arg): Reader.feed's body
  states (Content-Length, chunk size / data / CRLF, trailers) stepped over the read until the message ends
  (how 1: the caller ends it at pos), the framing is wrong (how 2: the caller fails at arg[0] with arg[1]) or
  the read is used up or the state is not a body state (how 0). BODY events are appended to ``out``.

Every read is checked against the buffer's length; no fixed-size buffer is fed by input lengths; every
CPython call is checked and references are released on every path. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#include <structmember.h>

/* the states of h1.py (its range(10)) */
enum { S_HEAD, S_LENGTH, S_CHUNK_SIZE, S_CHUNK_DATA, S_CHUNK_CRLF, S_TRAILER, S_CLOSE, S_OPAQUE, S_HELD, S_ERROR };
#define BODY 2
#define MAX_CHUNK_LINE (64 * 1024)

static unsigned char TCHAR[256];
static signed char HEXV[256];

static void init_tables(void) {
    const char *t = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for (; *t; t++) TCHAR[(unsigned char)*t] = 1;
    for (int i = 0; i < 256; i++) HEXV[i] = -1;
    for (int i = 0; i < 10; i++) HEXV['0' + i] = (signed char)i;
    for (int i = 0; i < 6; i++) {
        HEXV['a' + i] = (signed char)(10 + i);
        HEXV['A' + i] = (signed char)(10 + i);
    }
}

static PyObject *value_error(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

/* ---- parse_head ------------------------------------------------------------------------ */

typedef struct {
    const char *p;
    Py_ssize_t n;
} Span;

static int all_tchar(const char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!TCHAR[(unsigned char)p[i]]) return 0;
    return 1;
}

static int version_ok(const char *p, Py_ssize_t n) {
    return n == 8 && memcmp(p, "HTTP/1.", 7) == 0 && p[7] >= '0' && p[7] <= '9';
}

static int is_ows(char c) { return c == ' ' || c == '\t'; }

static Span strip_ows(const char *p, Py_ssize_t n) {
    while (n > 0 && is_ows(p[0])) {
        p++;
        n--;
    }
    while (n > 0 && is_ows(p[n - 1])) n--;
    Span s = {p, n};
    return s;
}

static PyObject *bytes_of(const char *p, Py_ssize_t n) { return PyBytes_FromStringAndSize(n ? p : "", n); }

/* headers[-1] = (name, (value + b" " + line.strip()).strip()) */
static int fold(PyObject *headers, const char *line, Py_ssize_t n) {
    Py_ssize_t last = PyList_GET_SIZE(headers) - 1;
    PyObject *pair = PyList_GET_ITEM(headers, last);
    PyObject *name = PyTuple_GET_ITEM(pair, 0);
    PyObject *value = PyTuple_GET_ITEM(pair, 1);
    Span x = strip_ows(line, n);
    Py_ssize_t vn = PyBytes_GET_SIZE(value);
    if (vn > PY_SSIZE_T_MAX - x.n - 1) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *joined = PyBytes_FromStringAndSize(NULL, vn + 1 + x.n);
    if (joined == NULL) return -1;
    char *j = PyBytes_AS_STRING(joined);
    memcpy(j, PyBytes_AS_STRING(value), (size_t)vn);
    j[vn] = ' ';
    if (x.n) memcpy(j + vn + 1, x.p, (size_t)x.n);
    Span s = strip_ows(j, vn + 1 + x.n);
    PyObject *nv = bytes_of(s.p, s.n);
    Py_DECREF(joined);
    if (nv == NULL) return -1;
    PyObject *np = PyTuple_Pack(2, name, nv);
    Py_DECREF(nv);
    if (np == NULL) return -1;
    return PyList_SetItem(headers, last, np); /* steals np, releases the old pair */
}

/* what parse_head makes of a head (new references; all NULL until made) */
typedef struct {
    PyObject *method, *target, *version, *reason, *headers;
    int status;
} Parsed;

static void parsed_clear(Parsed *p) {
    Py_CLEAR(p->method);
    Py_CLEAR(p->target);
    Py_CLEAR(p->version);
    Py_CLEAR(p->reason);
    Py_CLEAR(p->headers);
}

/* h1._py_parse_head on raw[0:len]: 0 with *out filled, 1 with *err (the ValueError's reason), -1 with an exception
   set; on 1 and -1 nothing is left in *out */
static int parse_core(const char *raw, Py_ssize_t len, int request, Parsed *out, const char **err) {
    memset(out, 0, sizeof(*out));
    /* lines = raw.split(b"\n"); drop a last b"", then a last b"" or b"\r": the lines left are raw[0:end]
       split on "\n" (at least one) unless nlines_zero */
    Py_ssize_t end = len;
    int nlines_zero = 0;
    if (len == 0)
        nlines_zero = 1;
    else if (raw[len - 1] == '\n')
        end = len - 1;
    if (!nlines_zero) {
        Py_ssize_t k = end; /* the last line is raw[k:end] */
        while (k > 0 && raw[k - 1] != '\n') k--;
        Py_ssize_t last_len = end - k;
        if (last_len == 0 || (last_len == 1 && raw[k] == '\r')) {
            if (k == 0) nlines_zero = 1; /* that was the only line */
            else end = k - 1;            /* drop it with the "\n" before it */
        }
    }
    if (nlines_zero) {
        *err = "empty head";
        return 1;
    }
    Py_ssize_t pos = 0;
    int first = 1;
    out->headers = PyList_New(0);
    if (out->headers == NULL) goto exc;
    for (;;) {
        const char *nl = end > pos ? memchr(raw + pos, '\n', (size_t)(end - pos)) : NULL;
        Py_ssize_t stop = nl ? (Py_ssize_t)(nl - raw) : end;
        const char *line = raw + pos;
        Py_ssize_t n = stop - pos;
        if (n > 0 && line[n - 1] == '\r') n--;
        if (first) {
            first = 0;
            if (request) {
                const char *sp1 = n > 0 ? memchr(line, ' ', (size_t)n) : NULL;
                const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line + n - sp1 - 1)) : NULL;
                const char *sp3 = sp2 ? memchr(sp2 + 1, ' ', (size_t)(line + n - sp2 - 1)) : NULL;
                if (sp1 == NULL || sp2 == NULL || sp3 != NULL) {
                    *err = "request line is not METHOD SP TARGET SP VERSION";
                    goto verr;
                }
                Py_ssize_t mn = sp1 - line, tn = sp2 - sp1 - 1, vn = line + n - sp2 - 1;
                if (mn == 0 || !all_tchar(line, mn)) {
                    *err = "invalid method";
                    goto verr;
                }
                int bad = tn == 0;
                for (Py_ssize_t i = 0; i < tn && !bad; i++) {
                    unsigned char c = (unsigned char)sp1[1 + i];
                    if (c <= 0x20 || c == 0x7f) bad = 1;
                }
                if (bad) {
                    *err = "invalid request target";
                    goto verr;
                }
                if (!version_ok(sp2 + 1, vn)) {
                    *err = "invalid HTTP version";
                    goto verr;
                }
                out->method = bytes_of(line, mn);
                out->target = bytes_of(sp1 + 1, tn);
                out->version = bytes_of(sp2 + 1, vn);
                out->reason = bytes_of("", 0);
                if (!out->method || !out->target || !out->version || !out->reason) goto exc;
            } else {
                const char *sp1 = n > 0 ? memchr(line, ' ', (size_t)n) : NULL;
                const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line + n - sp1 - 1)) : NULL;
                Py_ssize_t v0 = sp1 ? sp1 - line : n;
                Py_ssize_t cn = sp1 ? (sp2 ? sp2 - sp1 - 1 : line + n - sp1 - 1) : 0;
                const char *code = sp1 ? sp1 + 1 : NULL;
                int ok = sp1 != NULL && version_ok(line, v0) && cn == 3;
                for (int i = 0; ok && i < 3; i++)
                    if (code[i] < '0' || code[i] > '9') ok = 0;
                if (!ok) {
                    *err = "invalid status line";
                    goto verr;
                }
                out->status = (code[0] - '0') * 100 + (code[1] - '0') * 10 + (code[2] - '0');
                if (out->status < 100) {
                    *err = "invalid status code";
                    goto verr;
                }
                out->version = bytes_of(line, v0);
                out->reason = sp2 ? bytes_of(sp2 + 1, line + n - sp2 - 1) : bytes_of("", 0);
                out->method = bytes_of("", 0);
                out->target = bytes_of("", 0);
                if (!out->method || !out->target || !out->version || !out->reason) goto exc;
            }
        } else if (n > 0 && is_ows(line[0])) { /* obs-fold */
            if (PyList_GET_SIZE(out->headers) == 0) {
                *err = "continuation line before any header";
                goto verr;
            }
            if (fold(out->headers, line, n) < 0) goto exc;
        } else {
            const char *colon = n > 0 ? memchr(line, ':', (size_t)n) : NULL;
            if (colon == NULL || colon == line) {
                *err = "header line without a name and colon";
                goto verr;
            }
            Py_ssize_t nn = colon - line;
            if (!all_tchar(line, nn)) {
                *err = "invalid header name";
                goto verr;
            }
            Span v = strip_ows(colon + 1, line + n - colon - 1);
            if (v.n > 0 && (memchr(v.p, '\r', (size_t)v.n) || memchr(v.p, 0, (size_t)v.n))) {
                *err = "invalid byte in a header value";
                goto verr;
            }
            PyObject *name = bytes_of(line, nn);
            if (name == NULL) goto exc;
            PyObject *value = bytes_of(v.p, v.n);
            if (value == NULL) {
                Py_DECREF(name);
                goto exc;
            }
            PyObject *pair = PyTuple_New(2);
            if (pair == NULL) {
                Py_DECREF(name);
                Py_DECREF(value);
                goto exc;
            }
            PyTuple_SET_ITEM(pair, 0, name);
            PyTuple_SET_ITEM(pair, 1, value);
            int rc = PyList_Append(out->headers, pair);
            Py_DECREF(pair);
            if (rc < 0) goto exc;
        }
        if (nl == NULL) break;
        pos = stop + 1;
    }
    return 0;
verr:
    parsed_clear(out);
    return 1;
exc:
    parsed_clear(out);
    return -1;
}

/* the Head's name index (Head.values): lower-cased name -> its values, in order (a new dict, or NULL) */
static PyObject *build_index(PyObject *headers) {
    PyObject *index = PyDict_New();
    if (index == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        Py_ssize_t nn = PyBytes_GET_SIZE(name);
        PyObject *lname = PyBytes_FromStringAndSize(NULL, nn);
        if (lname == NULL) {
            Py_DECREF(index);
            return NULL;
        }
        const char *src = PyBytes_AS_STRING(name);
        char *dst = PyBytes_AS_STRING(lname);
        for (Py_ssize_t k = 0; k < nn; k++) dst[k] = (src[k] >= 'A' && src[k] <= 'Z') ? (char)(src[k] + 32) : src[k];
        PyObject *values = PyDict_GetItemWithError(index, lname); /* borrowed */
        int rc;
        if (values == NULL) {
            if (PyErr_Occurred())
                rc = -1;
            else {
                values = PyList_New(0);
                rc = values == NULL ? -1 : PyDict_SetItem(index, lname, values);
                Py_XDECREF(values); /* the dict holds it */
            }
        } else
            rc = 0;
        Py_DECREF(lname);
        if (rc == 0) rc = PyList_Append(values, PyTuple_GET_ITEM(pair, 1));
        if (rc < 0) {
            Py_DECREF(index);
            return NULL;
        }
    }
    return index;
}

static PyObject *h1_parse_head(PyObject *mod, PyObject *args) {
    Py_buffer view;
    int request;
    if (!PyArg_ParseTuple(args, "y*p", &view, &request)) return NULL;
    Parsed p;
    const char *err = NULL;
    int rc = parse_core((const char *)view.buf, view.len, request, &p, &err);
    PyBuffer_Release(&view);
    if (rc == 1) return value_error(err);
    if (rc < 0) return NULL;
    PyObject *result = NULL, *index = build_index(p.headers);
    if (index != NULL)
        result = Py_BuildValue("(OOOiOON)", p.method, p.target, p.version, p.status, p.reason, p.headers, index);
    parsed_clear(&p);
    return result;
}

/* ---- what Head.tokens / Head.keep_alive / Reader._begin read of the headers ------------------ */

/* bytes.strip() without arguments: ASCII whitespace (Py_ISSPACE) */
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c'; }

static Span strip_space(const char *p, Py_ssize_t n) {
    while (n > 0 && is_space(p[0])) {
        p++;
        n--;
    }
    while (n > 0 && is_space(p[n - 1])) n--;
    Span s = {p, n};
    return s;
}

/* p[0:n] equals lower (lower-case ASCII of length ln: a literal, or a header name looked up), ignoring ASCII case */
static int ieq(const char *p, Py_ssize_t n, const char *lower, Py_ssize_t ln) {
    if (n != ln) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = p[i];
        if (c >= 'A' && c <= 'Z') c = (char)(c + 32);
        if (c != lower[i]) return 0;
    }
    return 1;
}

#define IEQ(p, n, lit) ieq((p), (n), lit, (Py_ssize_t)(sizeof(lit) - 1))

/* what a head says about its framing and connection, read as h1.py reads it (Head.tokens, _content_length) */
typedef struct {
    int te_any;               /* Head.tokens(b"transfer-encoding") is not empty */
    int te_chunked_last;      /* ... and its last element is b"chunked" */
    int cl_count;             /* Content-Length headers */
    int cl_conflict;          /* the set of their comma-separated, stripped parts has more than one element */
    Span cl_text;             /* the one element otherwise */
    int upgrade;              /* an Upgrade header is there */
    int conn_close, conn_keep_alive, conn_upgrade; /* Head.tokens(b"connection") holds close / keep-alive / upgrade */
} Facts;

static void read_facts(PyObject *headers, Facts *f) {
    memset(f, 0, sizeof(*f));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        const char *np = PyBytes_AS_STRING(name), *vp = PyBytes_AS_STRING(value);
        Py_ssize_t nn = PyBytes_GET_SIZE(name), vn = PyBytes_GET_SIZE(value);
        int kind;
        if (IEQ(np, nn, "transfer-encoding")) kind = 1;
        else if (IEQ(np, nn, "content-length")) kind = 2;
        else if (IEQ(np, nn, "connection")) kind = 3;
        else if (IEQ(np, nn, "upgrade")) {
            f->upgrade = 1;
            continue;
        } else
            continue;
        if (kind == 2) f->cl_count++;
        /* v.split(b","): every part, the empty ones included */
        Py_ssize_t a = 0;
        for (;;) {
            const char *comma = a < vn ? memchr(vp + a, ',', (size_t)(vn - a)) : NULL;
            Py_ssize_t b = comma ? (Py_ssize_t)(comma - vp) : vn;
            Span t = strip_space(vp + a, b - a);
            if (kind == 2) {
                if (f->cl_count == 1 && a == 0)
                    f->cl_text = t; /* the first part of the first Content-Length */
                else if (!(t.n == f->cl_text.n && (t.n == 0 || memcmp(t.p, f->cl_text.p, (size_t)t.n) == 0)))
                    f->cl_conflict = 1;
            } else if (t.n) { /* a token (tokens() keeps the non-empty ones) */
                if (kind == 1) {
                    f->te_any = 1;
                    f->te_chunked_last = IEQ(t.p, t.n, "chunked");
                } else {
                    if (IEQ(t.p, t.n, "close")) f->conn_close = 1;
                    if (IEQ(t.p, t.n, "keep-alive")) f->conn_keep_alive = 1;
                    if (IEQ(t.p, t.n, "upgrade")) f->conn_upgrade = 1;
                }
            }
            if (comma == NULL) break;
            a = b + 1;
        }
    }
}

/* Head.keep_alive */
static int keep_alive(const Facts *f, PyObject *version) {
    if (f->conn_close) return 0;
    return !(PyBytes_GET_SIZE(version) == 8 && memcmp(PyBytes_AS_STRING(version), "HTTP/1.0", 8) == 0) || f->conn_keep_alive;
}

static int length_framing(const Facts *f, long long *length, const char **err);

/* Reader._begin's framing of a request: 0 no body, 1 Content-Length (*length), 2 chunked; -1 with *err */
static int request_framing(const Facts *f, long long *length, const char **err) {
    *length = 0;
    if (f->te_any) {
        if (!f->te_chunked_last) {
            *err = "request Transfer-Encoding does not end in chunked";
            return -1;
        }
        if (f->cl_count) {
            *err = "request has both Transfer-Encoding and Content-Length";
            return -1;
        }
        return 2;
    }
    if (!f->cl_count) return 0;
    return length_framing(f, length, err);
}

/* _content_length of a head with Content-Length: 1 with *length, 0 (a zero length), -1 with *err */
static int length_framing(const Facts *f, long long *length, const char **err) {
    *length = 0;
    if (f->cl_conflict) {
        *err = "conflicting Content-Length values";
        return -1;
    }
    Span t = f->cl_text;
    if (t.n == 0 || t.n > 18) {
        *err = "invalid Content-Length";
        return -1;
    }
    long long v = 0;
    for (Py_ssize_t i = 0; i < t.n; i++) {
        if (t.p[i] < '0' || t.p[i] > '9') {
            *err = "invalid Content-Length";
            return -1;
        }
        v = v * 10 + (t.p[i] - '0');
    }
    *length = v;
    return v ? 1 : 0;
}

/* Reader._begin's framing of a final response to ``method`` (a request's method, as the reader expects it), for the
   usual response only: 0 no body (the message ends with its head), 1 Content-Length (*length), 2 chunked, 3 read
   until the connection closes; -1 with *err (the head cannot be framed); 4 not decided here (an interim or 101
   response, a response to HEAD or CONNECT, a 204 or 304: _begin decides) */
static int response_framing(const Facts *f, long status, PyObject *method, long long *length, const char **err) {
    *length = 0;
    if (status < 200 || status == 204 || status == 304) return 4;
    Py_ssize_t mn = PyBytes_GET_SIZE(method);
    const char *mp = PyBytes_AS_STRING(method);
    if ((mn == 4 && memcmp(mp, "HEAD", 4) == 0) || (mn == 7 && memcmp(mp, "CONNECT", 7) == 0)) return 4;
    if (f->te_any) return f->te_chunked_last ? 2 : 3;
    if (!f->cl_count) return 3;
    return length_framing(f, length, err);
}

/* ---- feed_head: Reader._feed_head up to the framing, one call per head --------------------- */

static PyObject *HeadType = NULL; /* h1.Head (set_head) */
static PyObject *EmptyTuple = NULL;
static PyObject *S_raw, *S_method, *S_target, *S_version, *S_status, *S_reason, *S_headers, *S_index, *S_keep_alive;

/* where make_head stores each of a Head's slots: the offsets of the class's member descriptors (set_head checks that
   every one is an object slot of Head's own layout), in the order of SLOT_NAMES */
enum { F_RAW, F_METHOD, F_TARGET, F_VERSION, F_STATUS, F_REASON, F_HEADERS, F_INDEX, F_KEEP_ALIVE, F_COUNT };
static Py_ssize_t SlotOffset[F_COUNT];

static PyObject *h1_set_head(PyObject *mod, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "set_head(Head): a class");
        return NULL;
    }
    PyObject *names[F_COUNT] = {S_raw, S_method, S_target, S_version, S_status, S_reason, S_headers, S_index, S_keep_alive};
    Py_ssize_t offsets[F_COUNT];
    PyTypeObject *tp = (PyTypeObject *)cls;
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *descr = _PyType_Lookup(tp, names[i]); /* borrowed */
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) || ((PyDescrObject *)descr)->d_type != tp) {
            PyErr_Format(PyExc_TypeError, "set_head(Head): %R is not a slot of the class", names[i]);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
            m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize) {
            PyErr_Format(PyExc_TypeError, "set_head(Head): %R is not a writable object slot", names[i]);
            return NULL;
        }
        offsets[i] = m->offset;
    }
    memcpy(SlotOffset, offsets, sizeof(offsets));
    Py_INCREF(cls);
    Py_XSETREF(HeadType, cls);
    Py_RETURN_NONE;
}

/* store v (a new reference, stolen) in h's slot f (empty: h is fresh from tp_new) */
static void put_slot(PyObject *h, int f, PyObject *v) {
    PyObject **slot = (PyObject **)((char *)h + SlotOffset[f]);
    Py_XSETREF(*slot, v);
}

/* a Head as h1.Head(raw, ...) makes it, with keep_alive filled in and no name index yet (Head.values looks names up in
   the headers list: _h1.header_values; Head.index() builds the index if asked) (a new reference, or NULL) */
static PyObject *make_head(PyObject *raw, Parsed *p, int ka) {
    PyTypeObject *tp = (PyTypeObject *)HeadType;
    PyObject *h = tp->tp_new(tp, EmptyTuple, NULL);
    if (h == NULL) return NULL;
    PyObject *status = PyLong_FromLong(p->status);
    if (status == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    put_slot(h, F_STATUS, status);
    Py_INCREF(raw);
    put_slot(h, F_RAW, raw);
    Py_INCREF(p->method);
    put_slot(h, F_METHOD, p->method);
    Py_INCREF(p->target);
    put_slot(h, F_TARGET, p->target);
    Py_INCREF(p->version);
    put_slot(h, F_VERSION, p->version);
    Py_INCREF(p->reason);
    put_slot(h, F_REASON, p->reason);
    Py_INCREF(p->headers);
    put_slot(h, F_HEADERS, p->headers);
    Py_INCREF(Py_None);
    put_slot(h, F_INDEX, Py_None);
    PyObject *k = ka ? Py_True : Py_False;
    Py_INCREF(k);
    put_slot(h, F_KEEP_ALIVE, k);
    return h;
}

/* header_values(headers, lname, all) -> Head.values(lname) (all true) or Head.get(lname) (all false) read from the
   headers list itself, as the index Head.index() builds would answer: every value whose name, ASCII-lower-cased
   (bytes.lower()), equals lname, in order; NotImplemented where headers is not a list of (bytes, bytes) pairs or
   lname not bytes (the caller then builds the index) */
static PyObject *h1_header_values(PyObject *mod, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3) {
        PyErr_SetString(PyExc_TypeError, "header_values(headers, lname, all)");
        return NULL;
    }
    PyObject *headers = argv[0], *lname = argv[1];
    int all = PyObject_IsTrue(argv[2]);
    if (all < 0) return NULL;
    if (!PyList_CheckExact(headers) || !PyBytes_Check(lname)) Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t count = PyList_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < count; i++) { /* every entry checked before any is read */
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)))
            Py_RETURN_NOTIMPLEMENTED;
    }
    const char *lp = PyBytes_AS_STRING(lname);
    Py_ssize_t ln = PyBytes_GET_SIZE(lname);
    PyObject *out = NULL;
    if (all) {
        out = PyList_New(0);
        if (out == NULL) return NULL;
    }
    /* (the list cannot change below: nothing here calls back into Python) */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        if (!ieq(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), lp, ln)) continue;
        PyObject *value = PyTuple_GET_ITEM(pair, 1);
        if (!all) {
            Py_INCREF(value);
            return value;
        }
        if (PyList_Append(out, value) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (all) return out;
    Py_RETURN_NONE;
}

static Py_ssize_t head_end_at(const char *b, Py_ssize_t n, Py_ssize_t start);

/* feed_head(data, pos, buf, request, max_head) -> what Reader._feed_head does with data[pos:] (buf: the unfinished
   head so far):
   (0, new_pos, new_buf, pending_from)  the head is unfinished: keep new_buf, pending_from as given;
   (3, new_pos)                         only empty lines before a request line: nothing kept;
   (2, start, reason)                   the reader fails at start with reason;
   (1, new_pos, event_start, head, fail_start, framing, length, hold)
                                        a head ended at new_pos (the HEAD event's start: event_start). A request's
                                        framing is decided as Reader._begin decides it (0 no body, 1 Content-Length
                                        of length, 2 chunked; hold: it asks to switch protocols). A response's,
                                        given the request's ``method`` (the optional sixth argument), likewise for
                                        the usual final response (0, 1, 2 as for a request, 3 read to the close;
                                        a head it cannot frame fails as (2, fail_start, reason)); for any other
                                        response, or without ``method``, it is left to _begin (framing -1; its
                                        ValueError fails at fail_start). */
static PyObject *h1_feed_head(PyObject *mod, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 5 && argc != 6) {
        PyErr_SetString(PyExc_TypeError, "feed_head(data, pos, buf, request, max_head[, method])");
        return NULL;
    }
    if (!PyBytes_Check(argv[2])) {
        PyErr_SetString(PyExc_TypeError, "feed_head(): buf must be bytes");
        return NULL;
    }
    PyObject *method = argc == 6 && argv[5] != Py_None ? argv[5] : NULL;
    if (method != NULL && !PyBytes_Check(method)) {
        PyErr_SetString(PyExc_TypeError, "feed_head(): method must be bytes or None");
        return NULL;
    }
    if (HeadType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "feed_head(): set_head(Head) was not called");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(argv[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    int request = PyObject_IsTrue(argv[3]);
    if (request < 0) return NULL;
    Py_ssize_t max_head = PyLong_AsSsize_t(argv[4]);
    if (max_head == -1 && PyErr_Occurred()) return NULL;
    PyObject *buf = argv[2];
    Py_ssize_t bn = PyBytes_GET_SIZE(buf);
    Py_buffer view;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *d = (const char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *result = NULL, *joined = NULL, *raw = NULL, *head = NULL;
    Parsed p;
    memset(&p, 0, sizeof(p));
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "feed_head(): pos outside data");
        goto out;
    }
    Py_ssize_t start = pos;
    if (bn == 0) {
        /* leading empty lines before a request line are ignored (RFC 9112 section 2.2) */
        while (request && pos < n && (d[pos] == '\n' || d[pos] == '\r')) pos++;
        start = pos;
        if (pos == n) {
            result = Py_BuildValue("(in)", 3, pos);
            goto out;
        }
    }
    Py_ssize_t fail_at = bn ? 0 : start;
    const char *jp;
    Py_ssize_t jl;
    if (bn) {
        if (bn > PY_SSIZE_T_MAX - (n - pos)) {
            PyErr_NoMemory();
            goto out;
        }
        joined = PyBytes_FromStringAndSize(NULL, bn + (n - pos));
        if (joined == NULL) goto out;
        memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(buf), (size_t)bn);
        if (n > pos) memcpy(PyBytes_AS_STRING(joined) + bn, d + pos, (size_t)(n - pos));
        jp = PyBytes_AS_STRING(joined);
        jl = PyBytes_GET_SIZE(joined);
    } else {
        jp = d + pos;
        jl = n - pos;
    }
    Py_ssize_t end = head_end_at(jp, jl, bn > 3 ? bn - 3 : 0);
    if (end < 0) {
        if (jl > max_head) {
            result = Py_BuildValue("(ins)", 2, bn ? (Py_ssize_t)0 : pos, "the head is larger than the reader's limit");
            goto out;
        }
        if (request) { /* h1._py_request_start: bytes that cannot begin a request fail now, not at an empty line */
            const char *bad = NULL;
            if (!TCHAR[(unsigned char)jp[0]]) {
                bad = "request line does not begin with a method";
            } else {
                const char *nl = memchr(jp, '\n', (size_t)jl);
                if (nl != NULL) {
                    int rc = parse_core(jp, (Py_ssize_t)(nl - jp) + 1, 1, &p, &bad);
                    parsed_clear(&p);
                    if (rc < 0) goto out;
                    if (rc == 0) bad = NULL;
                }
            }
            if (bad != NULL) {
                result = Py_BuildValue("(ins)", 2, bn ? (Py_ssize_t)0 : pos, bad);
                goto out;
            }
        }
        PyObject *nb = joined;
        if (nb == NULL) {
            nb = PyBytes_FromStringAndSize(jp, jl);
            if (nb == NULL) goto out;
        } else
            Py_INCREF(nb);
        result = Py_BuildValue("(inNn)", 0, n, nb, bn ? (Py_ssize_t)0 : start);
        goto out;
    }
    Py_ssize_t consumed = end - bn; /* bytes of this data that belong to the head */
    if (end > max_head) {
        result = Py_BuildValue("(ins)", 2, fail_at, "the head is larger than the reader's limit");
        goto out;
    }
    raw = PyBytes_FromStringAndSize(jp, end);
    if (raw == NULL) goto out;
    const char *err = NULL;
    int rc = parse_core(PyBytes_AS_STRING(raw), end, request, &p, &err);
    if (rc < 0) goto out;
    if (rc == 1) {
        result = Py_BuildValue("(ins)", 2, fail_at, err);
        goto out;
    }
    Facts f;
    read_facts(p.headers, &f);
    int framing = -1, hold = 0;
    long long length = 0;
    if (request) {
        framing = request_framing(&f, &length, &err);
        if (framing < 0) {
            result = Py_BuildValue("(ins)", 2, fail_at, err);
            goto out;
        }
        hold = (PyBytes_GET_SIZE(p.method) == 7 && memcmp(PyBytes_AS_STRING(p.method), "CONNECT", 7) == 0) ||
               (f.upgrade && f.conn_upgrade);
    } else if (method != NULL) {
        framing = response_framing(&f, p.status, method, &length, &err);
        if (framing < 0) {
            result = Py_BuildValue("(ins)", 2, fail_at, err);
            goto out;
        }
        if (framing == 4) framing = -1;
    }
    head = make_head(raw, &p, keep_alive(&f, p.version));
    if (head == NULL) goto out;
    result = Py_BuildValue("(innOniLO)", 1, pos + consumed, bn ? (Py_ssize_t)-1 : start, head, fail_at, framing, length,
                           hold ? Py_True : Py_False);
out:
    parsed_clear(&p);
    Py_XDECREF(head);
    Py_XDECREF(raw);
    Py_XDECREF(joined);
    PyBuffer_Release(&view);
    return result;
}

/* ---- rewrite_head: headers.rewrite_request_head's bytes ----------------------------------- */

/* the bytes in a request head's start line after _prefixed (len; *split: where the prefix goes, or -1) */
static Py_ssize_t prefixed_len(const char *line, Py_ssize_t n, Py_ssize_t plen, Py_ssize_t *split) {
    *split = -1;
    if (plen == 0) return n;
    const char *sp = memchr(line, ' ', (size_t)n);
    if (sp == NULL) return n; /* partition: rest b"" does not start with "/" */
    Py_ssize_t at = (sp - line) + 1;
    if (at < n && line[at] == '/') {
        *split = at;
        return n + plen;
    }
    return n;
}

/* the name rewrite_request_head reads off a header line: line[: line.find(b":")] */
static Span line_name(const char *line, Py_ssize_t n) {
    const char *colon = n > 0 ? memchr(line, ':', (size_t)n) : NULL;
    Span s = {line, colon ? (Py_ssize_t)(colon - line) : (n > 0 ? n - 1 : 0)};
    return s;
}

static int dropped(Span name, int drop_host) {
    return IEQ(name.p, name.n, "traceparent") || IEQ(name.p, name.n, "tracestate") || (drop_host && IEQ(name.p, name.n, "host"));
}

/* a list of (bytes, bytes) pairs (rewrite_head's additions, rewrite_spare's lines and a head's headers) */
static int pairs_ok(PyObject *adds) {
    if (!PyList_Check(adds)) return 0;
    Py_ssize_t nadd = PyList_GET_SIZE(adds);
    for (Py_ssize_t i = 0; i < nadd; i++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(a, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(a, 1)))
            return 0;
    }
    return 1;
}

static PyObject *rewrite_bytes(PyObject *rawo, PyObject *host, PyObject *prefix, PyObject *adds);

/* rewrite_head(raw, host_header, target_prefix, additions) -> bytes: rewrite_request_head's head for a parsed head
   ``raw`` (host_header: bytes or None; additions: [(name, value), ...] bytes, from headers._additions) */
static PyObject *h1_rewrite_head(PyObject *mod, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) {
        PyErr_SetString(PyExc_TypeError, "rewrite_head(raw, host_header, target_prefix, additions)");
        return NULL;
    }
    PyObject *rawo = argv[0], *host = argv[1], *prefix = argv[2], *adds = argv[3];
    if (!PyBytes_Check(rawo) || !(host == Py_None || PyBytes_Check(host)) || !PyBytes_Check(prefix) || !PyList_Check(adds)) {
        PyErr_SetString(PyExc_TypeError, "rewrite_head(): raw, target_prefix bytes, host_header bytes or None, additions a list");
        return NULL;
    }
    if (!pairs_ok(adds)) {
        PyErr_SetString(PyExc_TypeError, "rewrite_head(): additions must be (bytes, bytes) pairs");
        return NULL;
    }
    return rewrite_bytes(rawo, host, prefix, adds);
}

/* rewrite_head's bytes, its arguments checked (raw, prefix bytes; host bytes or None; adds: pairs_ok) */
static PyObject *rewrite_bytes(PyObject *rawo, PyObject *host, PyObject *prefix, PyObject *adds) {
    Py_ssize_t nadd = PyList_GET_SIZE(adds);
    const char *raw = PyBytes_AS_STRING(rawo), *pre = PyBytes_AS_STRING(prefix);
    Py_ssize_t len = PyBytes_GET_SIZE(rawo), plen = PyBytes_GET_SIZE(prefix);
    int drop_host = host != Py_None;
    Py_ssize_t crlf = (len >= 2 && raw[len - 2] == '\r' && raw[len - 1] == '\n') ? 2 : 1;
    /* lines = raw.split(b"\n"): k of them; the header lines are lines[1:k-2] */
    Py_ssize_t k = 1;
    for (const char *q = raw; (q = memchr(q, '\n', (size_t)(raw + len - q))) != NULL; q++) k++;
    const char *first_nl = memchr(raw, '\n', (size_t)len);
    Py_ssize_t l0 = first_nl ? (Py_ssize_t)(first_nl - raw) : len; /* lines[0] */
    /* pass 1: are lines dropped (or is there a prefix), and how long is the body */
    int need_lines = plen > 0;
    Py_ssize_t split, body_len = prefixed_len(raw, l0, plen, &split) + 1;
    {
        Py_ssize_t pos = l0 + 1, idx = 1;
        int skip = 0;
        while (idx <= k - 3) {
            const char *nl = memchr(raw + pos, '\n', (size_t)(len - pos)); /* (there is one: idx < k - 1) */
            Py_ssize_t n = (Py_ssize_t)(nl - raw) - pos;
            const char *line = raw + pos;
            if (!(n > 0 && (line[0] == ' ' || line[0] == '\t'))) skip = dropped(line_name(line, n), drop_host);
            if (skip) need_lines = 1;
            else body_len += n + 1;
            pos += n + 1;
            idx++;
        }
    }
    if (!need_lines) body_len = len > crlf ? len - crlf : 0; /* raw[: len(raw) - len(crlf)] */
    Py_ssize_t total = body_len;
    Py_ssize_t nparts = nadd + (drop_host ? 1 : 0);
    if (drop_host) total += 6 + PyBytes_GET_SIZE(host);
    for (Py_ssize_t i = 0; i < nadd; i++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        total += PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 0)) + 2 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(a, 1));
    }
    total += (nparts > 1 ? (nparts - 1) * crlf : 0) + 2 * crlf;
    PyObject *res = PyBytes_FromStringAndSize(NULL, total);
    if (res == NULL) return NULL;
    char *w = PyBytes_AS_STRING(res);
    const char *eol = crlf == 2 ? "\r\n" : "\n";
    if (!need_lines) {
        memcpy(w, raw, (size_t)body_len);
        w += body_len;
    } else {
        if (split >= 0) {
            memcpy(w, raw, (size_t)split);
            memcpy(w + split, pre, (size_t)plen);
            memcpy(w + split + plen, raw + split, (size_t)(l0 - split));
            w += l0 + plen;
        } else {
            memcpy(w, raw, (size_t)l0);
            w += l0;
        }
        *w++ = '\n';
        Py_ssize_t pos = l0 + 1, idx = 1;
        int skip = 0;
        while (idx <= k - 3) {
            const char *nl = memchr(raw + pos, '\n', (size_t)(len - pos));
            Py_ssize_t n = (Py_ssize_t)(nl - raw) - pos;
            const char *line = raw + pos;
            if (!(n > 0 && (line[0] == ' ' || line[0] == '\t'))) skip = dropped(line_name(line, n), drop_host);
            if (!skip) {
                memcpy(w, line, (size_t)n);
                w += n;
                *w++ = '\n';
            }
            pos += n + 1;
            idx++;
        }
    }
    Py_ssize_t part = 0;
    if (drop_host) {
        memcpy(w, "Host: ", 6);
        memcpy(w + 6, PyBytes_AS_STRING(host), (size_t)PyBytes_GET_SIZE(host));
        w += 6 + PyBytes_GET_SIZE(host);
        part++;
    }
    for (Py_ssize_t i = 0; i < nadd; i++, part++) {
        PyObject *a = PyList_GET_ITEM(adds, i);
        PyObject *nm = PyTuple_GET_ITEM(a, 0), *vl = PyTuple_GET_ITEM(a, 1);
        if (part) {
            memcpy(w, eol, (size_t)crlf);
            w += crlf;
        }
        memcpy(w, PyBytes_AS_STRING(nm), (size_t)PyBytes_GET_SIZE(nm));
        w += PyBytes_GET_SIZE(nm);
        *w++ = ':';
        *w++ = ' ';
        memcpy(w, PyBytes_AS_STRING(vl), (size_t)PyBytes_GET_SIZE(vl));
        w += PyBytes_GET_SIZE(vl);
    }
    memcpy(w, eol, (size_t)crlf);
    memcpy(w + crlf, eol, (size_t)crlf);
    w += 2 * crlf;
    if (w != PyBytes_AS_STRING(res) + total) { /* (cannot happen: the two passes count the same bytes) */
        Py_DECREF(res);
        PyErr_SetString(PyExc_SystemError, "rewrite_head(): length mismatch");
        return NULL;
    }
    return res;
}

/* rewrite_spare(head, correlation_header, host_header, target_prefix, lines, request_id) -> headers.rewrite_spare:
   None for a head with a traceparent header (any case, any value); else (rewritten head, request id, created) as
   rewrite_request_head makes them with additions = lines (+ (correlation_header, request_id encoded) where the head's
   first correlation header is absent or empty; else its value, decoded latin-1, is the request id). NotImplemented
   (the caller runs the Python definition) where any argument or the head is not what feed_head makes: head not an
   h1.Head with raw bytes, headers a list of (bytes, bytes) pairs and no name index; correlation_header, target_prefix
   bytes; host_header bytes or None; lines a list of (bytes, bytes) pairs; request_id a str (or None: not where the
   head needs a new one) */
static PyObject *h1_rewrite_spare(PyObject *mod, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "rewrite_spare(head, correlation_header, host_header, target_prefix, lines, request_id)");
        return NULL;
    }
    PyObject *head = argv[0], *corr = argv[1], *host = argv[2], *prefix = argv[3], *lines = argv[4], *rid = argv[5];
    if (HeadType == NULL || !PyObject_TypeCheck(head, (PyTypeObject *)HeadType) || !PyBytes_Check(corr) ||
        !(host == Py_None || PyBytes_Check(host)) || !PyBytes_Check(prefix) || !pairs_ok(lines) || !(rid == Py_None || PyUnicode_Check(rid)))
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *rawo = *(PyObject **)((char *)head + SlotOffset[F_RAW]);
    PyObject *headers = *(PyObject **)((char *)head + SlotOffset[F_HEADERS]);
    PyObject *index = *(PyObject **)((char *)head + SlotOffset[F_INDEX]);
    if (rawo == NULL || !PyBytes_Check(rawo) || index != Py_None || headers == NULL || !pairs_ok(headers)) Py_RETURN_NOTIMPLEMENTED;
    const char *cp = PyBytes_AS_STRING(corr);
    Py_ssize_t cn = PyBytes_GET_SIZE(corr);
    PyObject *existing = NULL; /* borrowed: the first correlation header's value */
    Py_ssize_t count = PyList_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < count; i++) { /* (nothing below calls back into Python: the list cannot change) */
        PyObject *pair = PyList_GET_ITEM(headers, i);
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        const char *np = PyBytes_AS_STRING(name);
        Py_ssize_t nn = PyBytes_GET_SIZE(name);
        if (IEQ(np, nn, "traceparent")) Py_RETURN_NONE;
        if (existing == NULL && ieq(np, nn, cp, cn)) existing = PyTuple_GET_ITEM(pair, 1);
    }
    int created = existing == NULL || PyBytes_GET_SIZE(existing) == 0;
    if (created && rid == Py_None) Py_RETURN_NOTIMPLEMENTED; /* (a new request id: the Python definition makes it) */
    Py_ssize_t nlines = PyList_GET_SIZE(lines);
    PyObject *adds = PyList_New(nlines + (created ? 1 : 0));
    if (adds == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nlines; i++) {
        PyObject *a = PyList_GET_ITEM(lines, i);
        Py_INCREF(a);
        PyList_SET_ITEM(adds, i, a);
    }
    PyObject *out_rid = NULL;
    if (created) {
        PyObject *enc = PyUnicode_AsUTF8String(rid); /* (request_id.encode()) */
        if (enc == NULL) goto fail;
        PyObject *pair = PyTuple_Pack(2, corr, enc);
        Py_DECREF(enc);
        if (pair == NULL) goto fail;
        PyList_SET_ITEM(adds, nlines, pair);
        Py_INCREF(rid);
        out_rid = rid;
    } else {
        out_rid = PyUnicode_DecodeLatin1(PyBytes_AS_STRING(existing), PyBytes_GET_SIZE(existing), NULL);
        if (out_rid == NULL) goto fail;
    }
    PyObject *bytes = rewrite_bytes(rawo, host, prefix, adds);
    Py_DECREF(adds);
    if (bytes == NULL) {
        Py_DECREF(out_rid);
        return NULL;
    }
    return Py_BuildValue("(NNO)", bytes, out_rid, created ? Py_True : Py_False); /* (N steals both, also on failure) */
fail:
    Py_DECREF(adds);
    return NULL;
}

/* ---- head_end -------------------------------------------------------------------------- */

static Py_ssize_t head_end_at(const char *b, Py_ssize_t n, Py_ssize_t start) {
    if (start < 0) start = 0;
    Py_ssize_t i = start;
    while (i < n) {
        const char *nl = memchr(b + i, '\n', (size_t)(n - i));
        if (nl == NULL) break;
        Py_ssize_t j = (nl - b) + 1;
        if (j < n && b[j] == '\n') return j + 1;
        if (j + 1 < n && b[j] == '\r' && b[j + 1] == '\n') return j + 2;
        i = j;
    }
    return -1;
}

static PyObject *h1_head_end(PyObject *mod, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &view, &start)) return NULL;
    Py_ssize_t found = head_end_at((const char *)view.buf, view.len, start);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(found);
}

/* ---- body ------------------------------------------------------------------------------ */

static int add_body(PyObject *out, Py_ssize_t a, Py_ssize_t b) {
    PyObject *ev = Py_BuildValue("(inn)", BODY, a, b);
    if (ev == NULL) return -1;
    int rc = PyList_Append(out, ev);
    Py_DECREF(ev);
    return rc;
}

/* bytes(buf) + bytes(p[0:n]) as a new bytes object */
static PyObject *concat(PyObject *buf, const char *p, Py_ssize_t n) {
    Py_ssize_t bn = PyBytes_GET_SIZE(buf);
    if (n <= 0) {
        Py_INCREF(buf);
        return buf;
    }
    if (bn > PY_SSIZE_T_MAX - n) {
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *r = PyBytes_FromStringAndSize(NULL, bn + n);
    if (r == NULL) return NULL;
    memcpy(PyBytes_AS_STRING(r), PyBytes_AS_STRING(buf), (size_t)bn);
    memcpy(PyBytes_AS_STRING(r) + bn, p, (size_t)n);
    return r;
}

/* the chunk size of line[0:n] (after ";" extensions are cut and OWS stripped), or -1 */
static long long chunk_size(const char *line, Py_ssize_t n) {
    if (n > 0 && line[n - 1] == '\r') n--;
    const char *semi = n > 0 ? memchr(line, ';', (size_t)n) : NULL;
    if (semi) n = semi - line;
    Span s = strip_ows(line, n);
    if (s.n == 0 || s.n > 15) return -1;
    long long v = 0;
    for (Py_ssize_t i = 0; i < s.n; i++) {
        int h = HEXV[(unsigned char)s.p[i]];
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static PyObject *body_impl(PyObject *mod, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 6) {
        PyErr_SetString(PyExc_TypeError, "body(data, pos, state, remaining, buf, out)");
        return NULL;
    }
    if (!PyBytes_Check(argv[4]) || !PyList_Check(argv[5])) {
        PyErr_SetString(PyExc_TypeError, "body(): buf must be bytes and out a list");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(argv[1]);
    if (pos == -1 && PyErr_Occurred()) return NULL;
    long st = PyLong_AsLong(argv[2]);
    if (st == -1 && PyErr_Occurred()) return NULL;
    long long remaining = PyLong_AsLongLong(argv[3]);
    if (remaining == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *d = (const char *)view.buf;
    Py_ssize_t n = view.len;
    PyObject *out = argv[5];
    PyObject *buf = argv[4];
    Py_INCREF(buf);
    int how = 0;
    Py_ssize_t err_pos = 0;
    const char *reason = NULL;
    if (pos < 0) pos = 0;
    while (pos < n && how == 0) {
        if (st == S_LENGTH || st == S_CHUNK_DATA) {
            Py_ssize_t avail = n - pos;
            Py_ssize_t take = remaining < (long long)avail ? (Py_ssize_t)remaining : avail;
            if (add_body(out, pos, pos + take) < 0) goto fail;
            pos += take;
            remaining -= take;
            if (remaining) continue;
            if (st == S_LENGTH) {
                how = 1;
                break;
            }
            if (pos + 1 < n && d[pos] == '\r' && d[pos + 1] == '\n') {
                pos += 2;
                st = S_CHUNK_SIZE;
            } else {
                st = S_CHUNK_CRLF;
            }
            Py_SETREF(buf, PyBytes_FromStringAndSize("", 0));
            if (buf == NULL) goto fail_nobuf;
        } else if (st == S_CHUNK_SIZE) {
            const char *nl = memchr(d + pos, '\n', (size_t)(n - pos));
            Py_ssize_t bn = PyBytes_GET_SIZE(buf);
            if (bn == 0 && nl != NULL) {
                /* the line is d[pos:nl] (its "\r" included) */
                Py_ssize_t ln = (Py_ssize_t)(nl - d) - pos;
                if (ln > MAX_CHUNK_LINE) {
                    how = 2, err_pos = pos, reason = "chunk-size line too long";
                    break;
                }
                long long size = chunk_size(d + pos, ln);
                if (size < 0) {
                    how = 2, err_pos = pos, reason = "invalid chunk size";
                    break;
                }
                pos = (nl - d) + 1;
                if (size) st = S_CHUNK_DATA, remaining = size;
                else st = S_TRAILER, remaining = 0;
                continue;
            }
            if (nl == NULL) {
                PyObject *nb = concat(buf, d + pos, n - pos);
                if (nb == NULL) goto fail;
                Py_SETREF(buf, nb);
                if (PyBytes_GET_SIZE(buf) > MAX_CHUNK_LINE) {
                    how = 2, err_pos = pos, reason = "chunk-size line too long";
                    break;
                }
                pos = n;
                break;
            }
            PyObject *line = concat(buf, d + pos, (nl - d) - pos);
            if (line == NULL) goto fail;
            Py_SETREF(buf, PyBytes_FromStringAndSize("", 0));
            if (buf == NULL) {
                Py_DECREF(line);
                goto fail_nobuf;
            }
            if (PyBytes_GET_SIZE(line) > MAX_CHUNK_LINE) {
                Py_DECREF(line);
                how = 2, err_pos = pos, reason = "chunk-size line too long";
                break;
            }
            long long size = chunk_size(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line));
            Py_DECREF(line);
            if (size < 0) {
                how = 2, err_pos = pos, reason = "invalid chunk size";
                break;
            }
            pos = (nl - d) + 1;
            if (size) st = S_CHUNK_DATA, remaining = size;
            else st = S_TRAILER, remaining = 0;
        } else if (st == S_CHUNK_CRLF) {
            Py_ssize_t bn = PyBytes_GET_SIZE(buf);
            const char *b = PyBytes_AS_STRING(buf);
            /* cur = buf + data[pos : pos + 2 - bn] */
            char cur[2];
            Py_ssize_t cn = 0, want = 2 - bn, used;
            for (Py_ssize_t k = 0; k < bn && cn < 2; k++) cur[cn++] = b[k];
            if (bn > 2) want = 0;
            used = 0;
            for (Py_ssize_t k = 0; k < want && pos + k < n; k++, used++) cur[cn++] = d[pos + k];
            if (cn >= 1 && cur[0] == '\n') {
                st = S_CHUNK_SIZE;
                pos += 1;
                continue;
            }
            if (cn < 2) {
                if (!(cn == 1 && cur[0] == '\r')) {
                    how = 2, err_pos = pos, reason = "chunk data not followed by CRLF";
                    break;
                }
                PyObject *nb = PyBytes_FromStringAndSize(cur, cn);
                if (nb == NULL) goto fail;
                Py_SETREF(buf, nb);
                pos += used;
                continue;
            }
            if (!(cn == 2 && bn <= 2 && cur[0] == '\r' && cur[1] == '\n')) {
                how = 2, err_pos = pos, reason = "chunk data not followed by CRLF";
                break;
            }
            st = S_CHUNK_SIZE;
            Py_SETREF(buf, PyBytes_FromStringAndSize("", 0));
            if (buf == NULL) goto fail_nobuf;
            pos += used;
        } else if (st == S_TRAILER) {
            const char *nl = memchr(d + pos, '\n', (size_t)(n - pos));
            if (nl == NULL) {
                PyObject *nb = concat(buf, d + pos, n - pos);
                if (nb == NULL) goto fail;
                Py_SETREF(buf, nb);
                if (remaining + PyBytes_GET_SIZE(buf) > MAX_CHUNK_LINE) {
                    how = 2, err_pos = pos, reason = "trailer section too long";
                    break;
                }
                pos = n;
                break;
            }
            Py_ssize_t bn = PyBytes_GET_SIZE(buf);
            Py_ssize_t ln = bn + ((nl - d) - pos);
            int blank = ln == 0 || (ln == 1 && (bn ? PyBytes_AS_STRING(buf)[0] : d[pos]) == '\r');
            Py_SETREF(buf, PyBytes_FromStringAndSize("", 0));
            if (buf == NULL) goto fail_nobuf;
            remaining += ln + 1;
            if (remaining > MAX_CHUNK_LINE) {
                how = 2, err_pos = pos, reason = "trailer section too long";
                break;
            }
            pos = (nl - d) + 1;
            if (blank) {
                how = 1;
                break;
            }
        } else {
            break; /* not a body state: the Python loop goes on */
        }
    }
    PyBuffer_Release(&view);
    PyObject *arg;
    if (how == 2)
        arg = Py_BuildValue("(ns)", err_pos, reason);
    else {
        arg = Py_None;
        Py_INCREF(arg);
    }
    if (arg == NULL) {
        Py_DECREF(buf);
        return NULL;
    }
    PyObject *r = Py_BuildValue("(nlLNiN)", pos, st, remaining, buf, how, arg);
    return r; /* (N steals buf and arg, also on failure) */
fail:
    Py_DECREF(buf);
fail_nobuf:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"parse_head", h1_parse_head, METH_VARARGS, "parse_head(raw, request) -> (method, target, version, status, reason, headers, index)"},
    {"feed_head", (PyCFunction)(void (*)(void))h1_feed_head, METH_FASTCALL,
     "feed_head(data, pos, buf, request, max_head) -> Reader._feed_head's outcome (see the source)"},
    {"set_head", h1_set_head, METH_O, "set_head(Head): the class feed_head makes heads of"},
    {"header_values", (PyCFunction)(void (*)(void))h1_header_values, METH_FASTCALL,
     "header_values(headers, lname, all) -> Head.values(lname) (all) / Head.get(lname), or NotImplemented"},
    {"rewrite_head", (PyCFunction)(void (*)(void))h1_rewrite_head, METH_FASTCALL,
     "rewrite_head(raw, host_header, target_prefix, additions) -> headers.rewrite_request_head's bytes"},
    {"rewrite_spare", (PyCFunction)(void (*)(void))h1_rewrite_spare, METH_FASTCALL,
     "rewrite_spare(head, correlation_header, host_header, target_prefix, lines, request_id) -> headers.rewrite_spare's result"},
    {"head_end", h1_head_end, METH_VARARGS, "head_end(buf, start) -> offset past the head's empty line, or -1"},
    {"body", (PyCFunction)(void (*)(void))body_impl, METH_FASTCALL, "body(data, pos, state, remaining, buf, out) -> (pos, state, remaining, buf, how, arg)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_h1", "C accelerator of deltatap.net.h1", -1, methods};

PyMODINIT_FUNC PyInit__h1(void) {
    init_tables();
    if (EmptyTuple == NULL) {
        EmptyTuple = PyTuple_New(0);
        if (EmptyTuple == NULL) return NULL;
        struct {
            PyObject **slot;
            const char *name;
        } names[] = {{&S_raw, "raw"},         {&S_method, "method"}, {&S_target, "target"},   {&S_version, "version"},
                     {&S_status, "status"},   {&S_reason, "reason"}, {&S_headers, "headers"}, {&S_index, "_index"},
                     {&S_keep_alive, "_keep_alive"}};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            *names[i].slot = PyUnicode_InternFromString(names[i].name);
            if (*names[i].slot == NULL) return NULL;
        }
    }
    return PyModule_Create(&module);
}

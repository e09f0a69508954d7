/* The C accelerator of deltatap.net.h1: head parsing and body framing, one C call per read.

h1.py is the definition; these functions do exactly what its Python does (tests/kernel/test_h1_native.py
compares them on generated messages split at random points, malformed chunk sizes, oversize lines):

* parse_head(raw, request) -> (method, target, version, status, reason, headers, index) or ValueError(reason):
  h1.parse_head without building the Head (index: what Head.values builds, lower-cased name -> values);
* head_end(buf, start) -> int: h1._head_end;
* body(data, pos, state, remaining, buf, out) -> (pos, state, remaining, buf, how, arg): Reader.feed's body
  states (Content-Length, chunk size / data / CRLF, trailers) stepped over the read until the message ends
  (how 1: the caller ends it at pos), the framing is wrong (how 2: the caller fails at arg[0] with arg[1]) or
  the read is used up or the state is not a body state (how 0). BODY events are appended to ``out``.

Every read is checked against the buffer's length; no fixed-size buffer is fed by input lengths; every
CPython call is checked and references are released on every path. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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

static PyObject *h1_parse_head(PyObject *mod, PyObject *args) {
    Py_buffer view;
    int request;
    if (!PyArg_ParseTuple(args, "y*p", &view, &request)) return NULL;
    const char *raw = (const char *)view.buf;
    Py_ssize_t len = view.len;
    PyObject *headers = NULL, *method = NULL, *target = NULL, *version = NULL, *reason = NULL, *result = NULL;
    int status = 0;
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
        PyBuffer_Release(&view);
        return value_error("empty head");
    }
    /* iterate over the lines of raw[0:end] */
    Py_ssize_t pos = 0;
    int first = 1;
    headers = PyList_New(0);
    if (headers == NULL) goto done;
    for (;;) {
        const char *nl = end > pos ? memchr(raw + pos, '\n', (size_t)(end - pos)) : NULL;
        Py_ssize_t stop = nl ? (Py_ssize_t)(nl - raw) : end;
        const char *line = raw + pos;
        Py_ssize_t n = stop - pos;
        if (n > 0 && line[n - 1] == '\r') n--;
        if (first) {
            first = 0;
            if (request) {
                const char *sp1 = memchr(line, ' ', (size_t)n);
                const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line + n - sp1 - 1)) : NULL;
                const char *sp3 = sp2 ? memchr(sp2 + 1, ' ', (size_t)(line + n - sp2 - 1)) : NULL;
                if (sp1 == NULL || sp2 == NULL || sp3 != NULL) {
                    value_error("request line is not METHOD SP TARGET SP VERSION");
                    goto done;
                }
                Py_ssize_t mn = sp1 - line, tn = sp2 - sp1 - 1, vn = line + n - sp2 - 1;
                if (mn == 0 || !all_tchar(line, mn)) {
                    value_error("invalid method");
                    goto done;
                }
                int bad = tn == 0;
                for (Py_ssize_t i = 0; i < tn && !bad; i++) {
                    unsigned char c = (unsigned char)sp1[1 + i];
                    if (c <= 0x20 || c == 0x7f) bad = 1;
                }
                if (bad) {
                    value_error("invalid request target");
                    goto done;
                }
                if (!version_ok(sp2 + 1, vn)) {
                    value_error("invalid HTTP version");
                    goto done;
                }
                method = bytes_of(line, mn);
                target = bytes_of(sp1 + 1, tn);
                version = bytes_of(sp2 + 1, vn);
                reason = bytes_of("", 0);
                if (!method || !target || !version || !reason) goto done;
            } else {
                const char *sp1 = memchr(line, ' ', (size_t)n);
                const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(line + n - sp1 - 1)) : NULL;
                Py_ssize_t v0 = sp1 ? sp1 - line : n;
                Py_ssize_t cn = sp1 ? (sp2 ? sp2 - sp1 - 1 : line + n - sp1 - 1) : 0;
                const char *code = sp1 ? sp1 + 1 : NULL;
                int ok = sp1 != NULL && version_ok(line, v0) && cn == 3;
                for (int i = 0; ok && i < 3; i++)
                    if (code[i] < '0' || code[i] > '9') ok = 0;
                if (!ok) {
                    value_error("invalid status line");
                    goto done;
                }
                status = (code[0] - '0') * 100 + (code[1] - '0') * 10 + (code[2] - '0');
                version = bytes_of(line, v0);
                reason = sp2 ? bytes_of(sp2 + 1, line + n - sp2 - 1) : bytes_of("", 0);
                method = bytes_of("", 0);
                target = bytes_of("", 0);
                if (!method || !target || !version || !reason) goto done;
                if (status < 100) {
                    value_error("invalid status code");
                    goto done;
                }
            }
        } else if (n > 0 && is_ows(line[0])) { /* obs-fold */
            if (PyList_GET_SIZE(headers) == 0) {
                value_error("continuation line before any header");
                goto done;
            }
            if (fold(headers, line, n) < 0) goto done;
        } else {
            const char *colon = n > 0 ? memchr(line, ':', (size_t)n) : NULL;
            if (colon == NULL || colon == line) {
                value_error("header line without a name and colon");
                goto done;
            }
            Py_ssize_t nn = colon - line;
            if (!all_tchar(line, nn)) {
                value_error("invalid header name");
                goto done;
            }
            Span v = strip_ows(colon + 1, line + n - colon - 1);
            if (v.n > 0 && (memchr(v.p, '\r', (size_t)v.n) || memchr(v.p, 0, (size_t)v.n))) {
                value_error("invalid byte in a header value");
                goto done;
            }
            PyObject *name = bytes_of(line, nn);
            if (name == NULL) goto done;
            PyObject *value = bytes_of(v.p, v.n);
            if (value == NULL) {
                Py_DECREF(name);
                goto done;
            }
            PyObject *pair = PyTuple_New(2);
            if (pair == NULL) {
                Py_DECREF(name);
                Py_DECREF(value);
                goto done;
            }
            PyTuple_SET_ITEM(pair, 0, name);
            PyTuple_SET_ITEM(pair, 1, value);
            int rc = PyList_Append(headers, pair);
            Py_DECREF(pair);
            if (rc < 0) goto done;
        }
        if (nl == NULL) break;
        pos = stop + 1;
    }
    {
        /* the Head's name index (Head.values): lower-cased name -> its values, in order */
        PyObject *index = PyDict_New();
        if (index == NULL) goto done;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
            PyObject *pair = PyList_GET_ITEM(headers, i);
            PyObject *name = PyTuple_GET_ITEM(pair, 0);
            Py_ssize_t nn = PyBytes_GET_SIZE(name);
            PyObject *lname = PyBytes_FromStringAndSize(NULL, nn);
            if (lname == NULL) {
                Py_DECREF(index);
                goto done;
            }
            const char *src = PyBytes_AS_STRING(name);
            char *dst = PyBytes_AS_STRING(lname);
            for (Py_ssize_t k = 0; k < nn; k++) dst[k] = (src[k] >= 'A' && src[k] <= 'Z') ? (char)(src[k] + 32) : src[k];
            PyObject *values = PyDict_GetItemWithError(index, lname); /* borrowed */
            int rc;
            if (values == NULL) {
                if (PyErr_Occurred()) rc = -1;
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
                goto done;
            }
        }
        result = Py_BuildValue("(OOOiOON)", method, target, version, status, reason, headers, index);
    }
done:
    Py_XDECREF(method);
    Py_XDECREF(target);
    Py_XDECREF(version);
    Py_XDECREF(reason);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return result;
}

/* ---- head_end -------------------------------------------------------------------------- */

static PyObject *h1_head_end(PyObject *mod, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "y*n", &view, &start)) return NULL;
    const char *b = (const char *)view.buf;
    Py_ssize_t n = view.len, found = -1;
    if (start < 0) start = 0;
    Py_ssize_t i = start;
    while (i < n) {
        const char *nl = memchr(b + i, '\n', (size_t)(n - i));
        if (nl == NULL) break;
        Py_ssize_t j = (nl - b) + 1;
        if (j < n && b[j] == '\n') {
            found = j + 1;
            break;
        }
        if (j + 1 < n && b[j] == '\r' && b[j + 1] == '\n') {
            found = j + 2;
            break;
        }
        i = j;
    }
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
    {"head_end", h1_head_end, METH_VARARGS, "head_end(buf, start) -> offset past the head's empty line, or -1"},
    {"body", (PyCFunction)(void (*)(void))body_impl, METH_FASTCALL, "body(data, pos, state, remaining, buf, out) -> (pos, state, remaining, buf, how, arg)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_h1", "C accelerator of deltatap.net.h1", -1, methods};

PyMODINIT_FUNC PyInit__h1(void) {
    init_tables();
    return PyModule_Create(&module);
}

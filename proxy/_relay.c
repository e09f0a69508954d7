/* The C accelerator of deltatap.proxy.relay's response side: one C call per upstream read (and per cuts list).

relay.py is the definition (Upstream._watch, _body and StreamObserver.forwarded, after h1.Reader.feed); this module
does exactly what they do for the usual read, and nothing for any other:

* watch(up, d, data, t, bound, tw, bw) -> bool: one read of ``up`` (an Upstream), already forwarded by ``d``'s
  write (tw, bw). It handles the read only when it is body bytes alone: the response reader is in a body state
  (Content-Length, chunk size / data / CRLF, trailers) and its framing (h1's C ``body`` step, called as h1.Reader.feed
  calls it) uses the whole read without the message ending or the framing failing; the downstream's last write is
  placed (``d.unplaced is None``); an exchange waits, its first token's write placed (``first_unplaced is None``); its response has a stream observer (a StreamObserver with the
  C observer, ``SseParser.observe``) or neither an observer nor a capture. Then it writes the reader's new state,
  counts each BODY piece on the record (``response_bytes``), feeds it to the observer (``observe``, what
  StreamObserver.feed calls), counts the read (``chunks``, ``end``) and does the observer's ``forwarded``
  bookkeeping, in the order the Python does, and returns True. Otherwise it changes nothing and returns False:
  the caller runs the Python path for the whole read (a head, a message end, a framing error, a placed write,
  a capture, a state this does not handle).
* watch_cuts(up, d, data, pieces, start, tw, bw) -> int: Upstream.cuts_received's loop over ``pieces``
  (``[(start, end, t, bound), ...]``) from ``pieces[start]`` on, each piece as watch() would take it (and
  ``up.last_read_t``/``_bound`` set as the loop sets them); returns the index of the first piece it did not take
  (``len(pieces)``: all): the caller's loop watches that one and calls again for the rest.

* reads_setup(...): the read itself, as C methods put in place of relay.py's Upstream.data_received,
  Upstream.cuts_received, _Watches.run and _Watches._round (their definitions, kept there as _py_*): see the section "the read
  itself" below.

An exception raised inside (by the observer's Python ``take``, say) propagates with the same changes made as the
Python path makes before it raises. tests/proxy/test_relay_native.py compares both paths on generated responses,
tests/proxy/test_relay_s21_native.py the C methods with their definitions.

Every object read is type-checked before its contents are used; references are held across every call back into
Python and released on every path; no buffer is copied except the bytes object of a piece (as the Python slices). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

static PyObject *Body;         /* deltatap.net._h1.body (h1._body) */
static PyObject *BodyStates;   /* h1._BODY_STATES (a frozenset of ints) */
static PyObject *ObserverType; /* deltatap.core.sse.StreamObserver, or None: no observer path */
static PyObject *ParserType;   /* deltatap.core._content.SseParser (the observing parser) */
static PyObject *GapsObserve;  /* deltatap.core._content.gaps_observe */
static PyObject *Zero;
static PyObject *S_reader, *S_state, *S_remaining, *S_buf, *S_pending_from, *S_unplaced, *S_exchanges, *S_rec,
    *S_stream, *S_capture_out, *S_response_bytes, *S_chunks, *S_end, *S_last_unplaced, *S_first_unplaced, *S_parser, *S_observe,
    *S_unfwd, *S_unfwd_first, *S_gaps_forwarded, *S_ltf_t, *S_ltf_b, *S_ftf_t, *S_ftf_b, *S_plain, *S_last_read_t,
    *S_last_read_bound;

/* the __slots__ attributes read and written on every read, through their member descriptors (what attribute access
   on these objects finds: their classes have no instance dict; ctx_take checks each object's exact type) */
typedef struct {
    PyObject *desc;
    PyMemberDef *def;
} Slot;

static PyObject *ReaderType, *ExchangeType, *RecordType;
static Slot R_state, R_remaining, R_buf, R_pending_from, X_rec, X_capture_out, X_last_unplaced, C_stream,
    C_response_bytes, C_chunks, C_end, O_parser;

static int slot_init(Slot *s, PyObject *type, PyObject *name) {
    PyObject *desc = PyObject_GetAttr(type, name);
    if (desc == NULL) return -1;
    if (!Py_IS_TYPE(desc, &PyMemberDescr_Type) || (((PyMemberDescrObject *)desc)->d_member->flags & READONLY)) {
        PyErr_Format(PyExc_TypeError, "setup(): %R.%U is not a writable __slots__ attribute", type, name);
        Py_DECREF(desc);
        return -1;
    }
    Py_XSETREF(s->desc, desc);
    s->def = ((PyMemberDescrObject *)desc)->d_member;
    return 0;
}

/* every other attribute read and written here: through deltatap.net._pktring's slot access where that module is built
   (its capsule _slot_api: a __slots__ attribute straight from its slot, the offset cached per type and name; anything
   else, the generic call), else the generic calls themselves; and a stamped transport's rx_mono_ns / rx_bound_ns read
   from its C state (api_rx: 1 set, 0 None, -1 not such a transport: the attributes are read) */
#include "../deltatap/net/_slot_api.h"
static PyObject *(*a_get)(PyObject *, PyObject *) = PyObject_GetAttr;
static int (*a_set)(PyObject *, PyObject *, PyObject *) = PyObject_SetAttr;
static int no_rx(PyObject *tr, long long *mono_ns, long long *bound_ns) { return -1; }
static int (*a_rx)(PyObject *, long long *, long long *) = no_rx;

static void slot_api_take(void) {
    pk_slot_api *api = PyCapsule_Import("deltatap.net._pktring._slot_api", 0);
    if (api == NULL) { /* (not built: the generic calls) */
        PyErr_Clear();
        return;
    }
    a_get = api->get;
    a_set = api->set;
    a_rx = api->rx;
}

static inline PyObject *sget(Slot *s, PyObject *obj) { return PyMember_GetOne((const char *)obj, s->def); }
static inline int sset(Slot *s, PyObject *obj, PyObject *v) { return PyMember_SetOne((char *)obj, s->def, v); }

/* what one call watches with: taken once (a cuts list's pieces share it: nothing the fast path does changes it) */
typedef struct {
    PyObject *reader, *ex, *rec, *obs, *parser; /* owned; obs and parser NULL: count only */
} Ctx;

static void ctx_clear(Ctx *c) {
    Py_CLEAR(c->reader);
    Py_CLEAR(c->ex);
    Py_CLEAR(c->rec);
    Py_CLEAR(c->obs);
    Py_CLEAR(c->parser);
}

/* 1: the read may take the fast path (c filled); 0: it may not (c empty); -1: an error */
static int ctx_take(Ctx *c, PyObject *up, PyObject *d) {
    PyObject *v;
    memset(c, 0, sizeof(*c));
    if (Body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "deltatap.proxy._relay.setup() was not called");
        return -1;
    }
    v = a_get(d, S_unplaced);
    if (v == NULL) return -1;
    int placed = v == Py_None;
    Py_DECREF(v);
    if (!placed) return 0;
    PyObject *exs = a_get(d, S_exchanges);
    if (exs == NULL) return -1;
    Py_ssize_t n = PyObject_Size(exs);
    if (n <= 0) {
        Py_DECREF(exs);
        return n < 0 ? -1 : 0;
    }
    c->ex = PySequence_GetItem(exs, 0);
    Py_DECREF(exs);
    if (c->ex == NULL) return -1;
    if ((PyObject *)Py_TYPE(c->ex) != ExchangeType) goto no;
    v = a_get(c->ex, S_first_unplaced);
    if (v == NULL) goto error;
    int first_placed = v == Py_None;
    Py_DECREF(v);
    if (!first_placed) goto no; /* (the first token's write was not out yet when placed: Python's, which places it) */
    if ((c->rec = sget(&X_rec, c->ex)) == NULL) goto error;
    if ((PyObject *)Py_TYPE(c->rec) != RecordType) goto no;
    PyObject *obs = sget(&C_stream, c->rec);
    if (obs == NULL) goto error;
    if (obs == Py_None) {
        Py_DECREF(obs);
        v = sget(&X_capture_out, c->ex);
        if (v == NULL) goto error;
        int capturing = v != Py_None;
        Py_DECREF(v);
        if (capturing) goto no; /* (a capture: Python's) */
    } else {
        c->obs = obs;
        /* StreamObserver itself (a subclass may watch differently) with the C observer */
        if (ObserverType == Py_None || (PyObject *)Py_TYPE(obs) != ObserverType) goto no;
        if ((c->parser = sget(&O_parser, obs)) == NULL) goto error;
        if ((PyObject *)Py_TYPE(c->parser) != ParserType) goto no;
    }
    if ((c->reader = a_get(up, S_reader)) == NULL) goto error;
    if ((PyObject *)Py_TYPE(c->reader) != ReaderType) goto no;
    return 1;
no:
    ctx_clear(c);
    return 0;
error:
    ctx_clear(c);
    return -1;
}

/* the slot obj.s += n */
static int slot_add(Slot *s, PyObject *obj, Py_ssize_t n) {
    PyObject *v = sget(s, obj);
    if (v == NULL) return -1;
    PyObject *dn = PyLong_FromSsize_t(n);
    if (dn == NULL) {
        Py_DECREF(v);
        return -1;
    }
    PyObject *sum = PyNumber_Add(v, dn);
    Py_DECREF(v);
    Py_DECREF(dn);
    if (sum == NULL) return -1;
    int rc = sset(s, obj, sum);
    Py_DECREF(sum);
    return rc;
}

/* StreamObserver.forwarded(tw, bw) (its native branch: the observer's gaps are GapCore) */
static int forwarded(PyObject *obs, PyObject *tw, PyObject *bw) {
    PyObject *unf = a_get(obs, S_unfwd);
    if (unf == NULL) return -1;
    PyObject *gaps = a_get(obs, S_gaps_forwarded);
    if (gaps == NULL) {
        Py_DECREF(unf);
        return -1;
    }
    PyObject *args[3] = {gaps, tw, unf};
    PyObject *r = PyObject_Vectorcall(GapsObserve, args, 3, NULL);
    Py_DECREF(gaps);
    if (r == NULL) {
        Py_DECREF(unf);
        return -1;
    }
    Py_DECREF(r);
    int any = PyObject_IsTrue(unf);
    Py_DECREF(unf);
    if (any < 0) return -1;
    if (any && (a_set(obs, S_ltf_t, tw) < 0 || a_set(obs, S_ltf_b, bw) < 0)) return -1;
    PyObject *first = a_get(obs, S_unfwd_first);
    if (first == NULL) return -1;
    int had = PyObject_IsTrue(first);
    Py_DECREF(first);
    if (had < 0) return -1;
    if (had && (a_set(obs, S_ftf_t, tw) < 0 || a_set(obs, S_ftf_b, bw) < 0)) return -1;
    if (a_set(obs, S_unfwd, Zero) < 0 || a_set(obs, S_unfwd_first, Py_False) < 0) return -1;
    return 0;
}

/* one read (or piece): 1 watched, 0 not taken (nothing changed), -1 an error (raised, after what the Python path
   changes before it raises) */
static int watch_one(Ctx *c, PyObject *data, PyObject *t, PyObject *bound, PyObject *tw, PyObject *bw) {
    if (!PyBytes_Check(data)) return 0;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n == 0) return 0;
    PyObject *reader = c->reader;
    PyObject *state = sget(&R_state, reader);
    if (state == NULL) return -1;
    int in_body = PySet_Contains(BodyStates, state);
    if (in_body <= 0) {
        Py_DECREF(state);
        return in_body;
    }
    PyObject *rem = sget(&R_remaining, reader);
    if (rem == NULL) {
        Py_DECREF(state);
        return -1;
    }
    PyObject *buf = sget(&R_buf, reader);
    if (buf == NULL) {
        Py_DECREF(state);
        Py_DECREF(rem);
        return -1;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        Py_DECREF(state);
        Py_DECREF(rem);
        Py_DECREF(buf);
        return -1;
    }
    /* h1.Reader.feed's step for the body states: body(data, pos, state, remaining, buf, out) */
    PyObject *args[6] = {data, Zero, state, rem, buf, out};
    PyObject *res = PyObject_Vectorcall(Body, args, 6, NULL);
    Py_DECREF(state);
    Py_DECREF(rem);
    Py_DECREF(buf);
    if (res == NULL) {
        Py_DECREF(out);
        return -1; /* (reader.feed raises the same, before it changes anything) */
    }
    int rc = 0;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 6) {
        PyErr_SetString(PyExc_TypeError, "deltatap.net._h1.body returned an unexpected value");
        rc = -1;
        goto done;
    }
    /* the whole read used in body states, the message not ended, the framing not failed */
    Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(res, 0));
    if (pos == -1 && PyErr_Occurred()) {
        rc = -1;
        goto done;
    }
    long how = PyLong_AsLong(PyTuple_GET_ITEM(res, 4));
    if (how == -1 && PyErr_Occurred()) {
        rc = -1;
        goto done;
    }
    if (how != 0 || pos != n) goto done; /* (rc 0: Python's) */
    Py_ssize_t nev = PyList_GET_SIZE(out);
    for (Py_ssize_t i = 0; i < nev; i++) { /* (body appends BODY events only: checked, each is read below) */
        PyObject *ev = PyList_GET_ITEM(out, i);
        if (!PyTuple_Check(ev) || PyTuple_GET_SIZE(ev) != 3) goto done;
    }
    /* reader.feed's state after the read */
    if (sset(&R_state, reader, PyTuple_GET_ITEM(res, 1)) < 0 || sset(&R_remaining, reader, PyTuple_GET_ITEM(res, 2)) < 0 ||
        sset(&R_buf, reader, PyTuple_GET_ITEM(res, 3)) < 0 || sset(&R_pending_from, reader, Py_None) < 0) {
        rc = -1;
        goto done;
    }
    rc = 1;
    if (nev == 0) goto done; /* (chunk framing alone: nothing to watch) */
    /* Upstream._body for each piece */
    PyObject *rec = c->rec, *obs = c->obs;
    Py_ssize_t content = 0;
    const char *bytes = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < nev; i++) {
        PyObject *ev = PyList_GET_ITEM(out, i);
        Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(ev, 1)), b = PyLong_AsSsize_t(PyTuple_GET_ITEM(ev, 2));
        if ((a == -1 || b == -1) && PyErr_Occurred()) {
            rc = -1;
            goto done;
        }
        if (a < 0 || b < a || b > n) {
            PyErr_SetString(PyExc_ValueError, "deltatap.net._h1.body gave a piece outside the read");
            rc = -1;
            goto done;
        }
        if (slot_add(&C_response_bytes, rec, b - a) < 0) {
            rc = -1;
            goto done;
        }
        if (obs == NULL) continue;
        PyObject *piece;
        if (a == 0 && b == n) {
            piece = data;
            Py_INCREF(piece);
        } else if ((piece = PyBytes_FromStringAndSize(bytes + a, b - a)) == NULL) {
            rc = -1;
            goto done;
        }
        PyObject *oargs[5] = {c->parser, obs, piece, t, bound};
        PyObject *got = PyObject_VectorcallMethod(S_observe, oargs, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(piece);
        if (got == NULL) {
            rc = -1;
            goto done;
        }
        Py_ssize_t k = PyLong_AsSsize_t(got);
        Py_DECREF(got);
        if (k == -1 && PyErr_Occurred()) {
            rc = -1;
            goto done;
        }
        content += k;
    }
    /* Upstream._watch (one piece) / _watch_events (several): the read counted, then the observer told */
    if (slot_add(&C_chunks, rec, 1) < 0 || sset(&C_end, rec, tw) < 0) {
        rc = -1;
        goto done;
    }
    if (obs == NULL) goto done;
    int tell;
    if (nev == 1)
        tell = content > 0;
    else { /* (_forward_tokens with the write placed: the exchange's last unplaced write is dropped when tokens came) */
        PyObject *unf = a_get(obs, S_unfwd);
        if (unf == NULL) {
            rc = -1;
            goto done;
        }
        int any = PyObject_IsTrue(unf);
        Py_DECREF(unf);
        if (any < 0) {
            rc = -1;
            goto done;
        }
        if (any && sset(&X_last_unplaced, c->ex, Py_None) < 0) {
            rc = -1;
            goto done;
        }
        if (forwarded(obs, tw, bw) < 0) rc = -1;
        goto done;
    }
    if (tell && (sset(&X_last_unplaced, c->ex, Py_None) < 0 || forwarded(obs, tw, bw) < 0)) rc = -1;
done:
    Py_DECREF(res);
    Py_DECREF(out);
    return rc;
}

/* watch(): 1 watched, 0 left to the Python path, -1 an error */
static int watch_read(PyObject *const *args) {
    Ctx c;
    int rc = ctx_take(&c, args[0], args[1]);
    if (rc <= 0) return rc;
    rc = watch_one(&c, args[2], args[3], args[4], args[5], args[6]);
    ctx_clear(&c);
    return rc;
}

static PyObject *relay_watch(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "watch(up, d, data, t, bound, tw, bw)");
        return NULL;
    }
    int rc = watch_read(args);
    if (rc < 0) return NULL;
    return PyBool_FromLong(rc);
}

/* watch_cuts() from piece i (args: up, d, data, pieces, -, tw, bw): the first piece not taken, or -1 (an error) */
static Py_ssize_t watch_cuts_from(PyObject *const *args, Py_ssize_t i) {
    PyObject *up = args[0], *data = args[2], *pieces = args[3], *tw = args[5], *bw = args[6];
    if (!PyBytes_Check(data) || !PyList_Check(pieces) || i < 0 || i >= PyList_GET_SIZE(pieces)) return i;
    PyObject *plain = a_get(up, S_plain);
    if (plain == NULL) return -1;
    int is_plain = PyObject_IsTrue(plain);
    Py_DECREF(plain);
    if (is_plain < 0) return -1;
    if (!is_plain) return i;
    Ctx c;
    int rc = ctx_take(&c, up, args[1]);
    if (rc < 0) return -1;
    if (rc == 0) return i;
    Py_INCREF(pieces); /* (Python code the observer calls cannot take it away) */
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    for (; i < PyList_GET_SIZE(pieces); i++) {
        PyObject *p = PyList_GET_ITEM(pieces, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 4) break;
        Py_INCREF(p);
        Py_ssize_t a = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 0)), b = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 1));
        if ((a == -1 || b == -1) && PyErr_Occurred()) {
            PyErr_Clear(); /* (Python's loop meets it) */
            Py_DECREF(p);
            break;
        }
        if (a < 0 || b > n || b <= a) { /* (an empty or odd piece: Python's) */
            Py_DECREF(p);
            break;
        }
        PyObject *t = PyTuple_GET_ITEM(p, 2), *bound = PyTuple_GET_ITEM(p, 3);
        PyObject *piece;
        if (a == 0 && b == n) {
            piece = data;
            Py_INCREF(piece);
        } else if ((piece = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + a, b - a)) == NULL) {
            Py_DECREF(p);
            rc = -1;
            break;
        }
        /* (the loop stamps the connection's latest read first) */
        if (a_set(up, S_last_read_t, t) < 0 || a_set(up, S_last_read_bound, bound) < 0)
            rc = -1;
        else
            rc = watch_one(&c, piece, t, bound, tw, bw);
        Py_DECREF(piece);
        Py_DECREF(p);
        if (rc <= 0) break;
    }
    Py_DECREF(pieces);
    ctx_clear(&c);
    return rc < 0 ? -1 : i;
}

static PyObject *relay_watch_cuts(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "watch_cuts(up, d, data, pieces, start, tw, bw)");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[4]);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0) return Py_NewRef(args[4]);
    Py_ssize_t got = watch_cuts_from(args, i);
    if (got < 0) return NULL;
    return got == i ? Py_NewRef(args[4]) : PyLong_FromSsize_t(got);
}

/* ---- the read itself: Upstream.data_received and _Watches.run ---------------------------------------------

reads_setup() makes two method descriptors (method_descriptor, as list.append's: the reader callback's
PyObject_VectorcallMethod calls them without a bound method or a Python frame) that relay.py puts in place of its
definitions, Upstream.data_received and _Watches.run, which stay the Python path (and the whole path with
DELTATAP_NATIVE=0):

* data_received(data): with deferral off (up.watches None) the definition runs; else the pair's pending watches
  run first (w.run(), as the definition); a read that is not the usual one (no kernel or no downstream, not plain,
  bytes kept to replay, no kernel stamp) goes to StampedProtocol.data_received, as the definition sends it; the
  usual one is forwarded (d.send(data): for StampedProtocol.send itself, its C twin k._wfast(d, k, data) first, as
  send calls it, and send only where that returns None), stamped (last_read_t / last_read_bound), its item
  (up, d, data, t, bound, tw, bw) appended to w.items, up.deferred set and w._round queued once per round
  (w.loop.call_soon), in the definition's order.
* cuts_received(data, pieces): the pair's pending watches first; no downstream, or a request's account waiting
  (d.accounting): the definition; else the read is
  forwarded (as above), d.replay cleared, and the pieces watched as the definition's loop does: the body pieces by
  relay.py's _watch_cuts (this module's watch_cuts() called directly), each other piece as Upstream._watch_piece
  (for a plain connection and a 4-tuple in C: the read's stamp, data[start:end], up._watch(d, piece,
  up.reader.feed(piece), ...); else _watch_piece itself), until the pieces end or the pair comes apart.
* run(): the deferred accounts first (w.settle() where w.accounts is not empty, as the definition), then _Watches.run's
  loop over w.items from w.next (read from the attribute on every turn: a watch may run it
  again), each item watched by relay.py's _watch_read (this module's watch() called directly) and else by
  up._watch(d, data, up.reader.feed(data), ...); an exception from an item goes to up.kernel._fatal(exc,
  "protocol.data_received() failed") with sys.exc_info() set as the definition's except block has it, and the rest
  still run; then the list is cleared and w.next set to 0.
* _round(): w.scheduled = False, then w.run() (the call_soon of a round). */
static PyObject *DataReceivedPy, *RunPy, *CutsReceivedPy, *StampedDataReceived, *StampedSend, *RelayGlobals;
static PyObject *S_watches, *S_deferred, *S_kernel, *S_down, *S_replay, *S_rx_mono_ns, *S_rx_bound_ns, *S_send, *S_wfast,
    *S_items, *S_scheduled, *S_loop, *S_round, *S_call_soon, *S_run, *S_next, *S_watch_read, *S_watch, *S_feed, *S_fatal,
    *S_dr_failed, *S_watch_cuts, *S_watch_piece, *S_accounts, *S_settle, *S_accounting;

/* the pending exception to tr._fatal(exc, msg) with sys.exc_info() set to it during the call (the definition's
   ``except BaseException as exc`` block): 0, or -1 with the exception _fatal (or the lookup of tr) raised */
static int fatal_call(PyObject *up) {
    PyObject *type, *value, *tb;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_SystemError, "_Watches.run: a watch failed without an exception");
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value == NULL) { /* (normalizing failed and left nothing: report that instead) */
        Py_XDECREF(type);
        Py_XDECREF(tb);
        PyErr_SetString(PyExc_SystemError, "_Watches.run: a watch's exception could not be normalized");
        return -1;
    }
    if (tb != NULL) PyException_SetTraceback(value, tb);
    PyObject *ot, *ov, *otb;
    PyErr_GetExcInfo(&ot, &ov, &otb);
    Py_XINCREF(type);
    Py_XINCREF(value);
    Py_XINCREF(tb);
    PyErr_SetExcInfo(type, value, tb);
    PyObject *r = NULL, *tr = a_get(up, S_kernel);
    if (tr != NULL) {
        PyObject *args[3] = {tr, value, S_dr_failed};
        r = PyObject_VectorcallMethod(S_fatal, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(tr);
    }
    PyErr_SetExcInfo(ot, ov, otb);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* a read method called with ``want`` arguments (its signature ``sig`` for the error) after reads_setup(): 0, -1 */
static int reads_ready(Py_ssize_t nargs, Py_ssize_t want, const char *sig) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, sig);
        return -1;
    }
    if (RelayGlobals == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "deltatap.proxy._relay.reads_setup() was not called");
        return -1;
    }
    return 0;
}

/* truthiness of obj.name: 1, 0, -1 */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = a_get(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* obj.name is None: 1, 0, -1 */
static int attr_none(PyObject *obj, PyObject *name) {
    PyObject *v = a_get(obj, name);
    if (v == NULL) return -1;
    int r = v == Py_None;
    Py_DECREF(v);
    return r;
}

/* one item of _Watches.run: 0, or -1 with an exception (for _fatal) */
static int run_item(PyObject *const *it) {
    PyObject *f = PyDict_GetItemWithError(RelayGlobals, S_watch_read); /* (borrowed: held below while called) */
    if (f == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_NameError, "name '_watch_read' is not defined");
        return -1;
    }
    int took = 0;
    if (f != Py_None) {
        if (PyCFunction_Check(f) && PyCFunction_GET_FUNCTION(f) == (PyCFunction)(void (*)(void))relay_watch) {
            took = watch_read(it);
        } else {
            Py_INCREF(f);
            PyObject *r = PyObject_Vectorcall(f, it, 7, NULL);
            Py_DECREF(f);
            if (r == NULL) return -1;
            took = PyObject_IsTrue(r);
            Py_DECREF(r);
        }
        if (took < 0) return -1;
        if (took) return 0;
    }
    PyObject *up = it[0], *reader = a_get(up, S_reader);
    if (reader == NULL) return -1;
    PyObject *fargs[2] = {reader, it[2]};
    PyObject *events = PyObject_VectorcallMethod(S_feed, fargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(reader);
    if (events == NULL) return -1;
    PyObject *wargs[8] = {up, it[1], it[2], events, it[3], it[4], it[5], it[6]};
    PyObject *r = PyObject_VectorcallMethod(S_watch, wargs, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(events);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *watches_run(PyObject *w, PyObject *const *args, Py_ssize_t nargs) {
    if (reads_ready(nargs, 0, "run() takes no arguments") < 0) return NULL;
    int acc = attr_true(w, S_accounts); /* the deferred accounts first: w.settle(), as the definition */
    if (acc < 0) return NULL;
    if (acc) {
        PyObject *rr = PyObject_VectorcallMethod(S_settle, &w, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (rr == NULL) return NULL;
        Py_DECREF(rr);
    }
    PyObject *items = a_get(w, S_items);
    if (items == NULL) return NULL;
    if (!PyList_CheckExact(items)) { /* (the definition's, for anything else) */
        Py_DECREF(items);
        return PyObject_Vectorcall(RunPy, &w, 1, NULL);
    }
    for (;;) {
        PyObject *v = a_get(w, S_next);
        if (v == NULL) goto error;
        Py_ssize_t next = PyLong_AsSsize_t(v);
        Py_DECREF(v);
        if (next == -1 && PyErr_Occurred()) goto error;
        if (next < 0) { /* (the definition's indexing from the end: not an item this loop makes) */
            Py_DECREF(items);
            return PyObject_Vectorcall(RunPy, &w, 1, NULL);
        }
        if (next >= PyList_GET_SIZE(items)) break;
        PyObject *item = PyList_GET_ITEM(items, next);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
            PyErr_SetString(PyExc_ValueError, "_Watches.run: an item that is not (up, d, data, t, bound, tw, bw)");
            goto error;
        }
        Py_INCREF(item);
        v = PyLong_FromSsize_t(next + 1);
        int rc = v == NULL ? -1 : a_set(w, S_next, v);
        Py_XDECREF(v);
        if (rc == 0) rc = a_set(PyTuple_GET_ITEM(item, 0), S_deferred, Py_False);
        if (rc < 0) {
            Py_DECREF(item);
            goto error;
        }
        if (run_item(&PyTuple_GET_ITEM(item, 0)) < 0 && fatal_call(PyTuple_GET_ITEM(item, 0)) < 0) {
            Py_DECREF(item);
            goto error;
        }
        Py_DECREF(item);
    }
    if (PyList_SetSlice(items, 0, PyList_GET_SIZE(items), NULL) < 0 || a_set(w, S_next, Zero) < 0) goto error;
    Py_DECREF(items);
    Py_RETURN_NONE;
error:
    Py_DECREF(items);
    return NULL;
}

/* _Watches._round(): w.scheduled = False; w.run() */
static PyObject *watches_round(PyObject *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "_round() takes no arguments");
        return NULL;
    }
    if (a_set(w, S_scheduled, Py_False) < 0) return NULL;
    return PyObject_VectorcallMethod(S_run, &w, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* tw, bw = got (a 2-tuple kept as it is, anything else unpacked as Python unpacks): 0, -1 */
static int unpack2(PyObject *got, PyObject **tw, PyObject **bw) {
    PyObject *seq = PyTuple_CheckExact(got) ? Py_NewRef(got) : PySequence_Tuple(got);
    if (seq == NULL) return -1;
    if (PyTuple_GET_SIZE(seq) != 2) {
        if (PyTuple_GET_SIZE(seq) > 2) PyErr_SetString(PyExc_ValueError, "too many values to unpack (expected 2)");
        else PyErr_Format(PyExc_ValueError, "not enough values to unpack (expected 2, got %zd)", PyTuple_GET_SIZE(seq));
        Py_DECREF(seq);
        return -1;
    }
    Py_XSETREF(*tw, Py_NewRef(PyTuple_GET_ITEM(seq, 0)));
    Py_XSETREF(*bw, Py_NewRef(PyTuple_GET_ITEM(seq, 1)));
    Py_DECREF(seq);
    return 0;
}

/* tw, bw = d.send(data): 0, -1 */
static int send_down(PyObject *d, PyObject *data, PyObject **tw, PyObject **bw) {
    PyObject *got = NULL;
    if (_PyType_Lookup(Py_TYPE(d), S_send) == StampedSend) { /* StampedProtocol.send: its C twin first, as it calls it */
        PyObject *k = a_get(d, S_kernel);
        if (k == NULL) return -1;
        if (k != Py_None) {
            PyObject *fast = a_get(k, S_wfast);
            if (fast == NULL) {
                Py_DECREF(k);
                return -1;
            }
            if (fast != Py_None) {
                PyObject *fargs[3] = {d, k, data};
                got = PyObject_Vectorcall(fast, fargs, 3, NULL);
                if (got == Py_None) Py_CLEAR(got);
                else if (got == NULL) {
                    Py_DECREF(fast);
                    Py_DECREF(k);
                    return -1;
                }
            }
            Py_DECREF(fast);
        }
        Py_DECREF(k);
    }
    if (got == NULL) {
        PyObject *sargs[2] = {d, data};
        got = PyObject_VectorcallMethod(S_send, sargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (got == NULL) return -1;
    }
    int rc = unpack2(got, tw, bw);
    Py_DECREF(got);
    return rc;
}

static PyObject *up_data_received(PyObject *up, PyObject *const *args, Py_ssize_t nargs) {
    if (reads_ready(nargs, 1, "data_received(data)") < 0) return NULL;
    PyObject *data = args[0], *pargs[2] = {up, data};
    PyObject *w = a_get(up, S_watches), *k = NULL, *d = NULL, *tw = NULL, *bw = NULL, *t = NULL, *bound = NULL,
             *out = NULL;
    if (w == NULL) return NULL;
    if (w == Py_None) { /* deferral off: the definition, whole */
        Py_DECREF(w);
        return PyObject_Vectorcall(DataReceivedPy, pargs, 2, NULL);
    }
    int r = attr_true(up, S_deferred);
    if (r < 0) goto done;
    if (r) {
        PyObject *rr = PyObject_VectorcallMethod(S_run, &w, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (rr == NULL) goto done;
        Py_DECREF(rr);
    }
    if ((k = a_get(up, S_kernel)) == NULL || (d = a_get(up, S_down)) == NULL) goto done;
    int usual = k != Py_None && d != Py_None;
    if (usual && (usual = attr_true(up, S_plain)) < 0) goto done;
    if (usual && (usual = attr_none(d, S_replay)) < 0) goto done;
    if (usual) {
        long long rt, rb;
        int got = a_rx(k, &rt, &rb); /* (the transport's C state; else its attribute) */
        if (got < 0) {
            if ((r = attr_none(k, S_rx_mono_ns)) < 0) goto done;
            got = !r;
        }
        if (!got) usual = 0;
    }
    if (!usual) {
        out = PyObject_Vectorcall(StampedDataReceived, pargs, 2, NULL); /* (-> on_data) */
        if (out != NULL) Py_SETREF(out, Py_NewRef(Py_None));
        goto done;
    }
    if (send_down(d, data, &tw, &bw) < 0) goto done;
    {
        long long rt, rb;
        if (a_rx(k, &rt, &rb) == 1) { /* (the values the attributes give, made once) */
            if ((t = PyLong_FromLongLong(rt)) == NULL || (bound = PyLong_FromLongLong(rb)) == NULL) goto done;
        } else if ((t = a_get(k, S_rx_mono_ns)) == NULL || (bound = a_get(k, S_rx_bound_ns)) == NULL) {
            goto done;
        }
    }
    if (a_set(up, S_last_read_t, t) < 0 || a_set(up, S_last_read_bound, bound) < 0) goto done;
    {
        PyObject *item = PyTuple_Pack(7, up, d, data, t, bound, tw, bw);
        if (item == NULL) goto done;
        PyObject *items = a_get(w, S_items);
        if (items == NULL) {
            Py_DECREF(item);
            goto done;
        }
        int rc = PyList_CheckExact(items) ? PyList_Append(items, item) : -2;
        if (rc == -2) {
            PyObject *rr = PyObject_CallMethod(items, "append", "O", item);
            rc = rr == NULL ? -1 : 0;
            Py_XDECREF(rr);
        }
        Py_DECREF(items);
        Py_DECREF(item);
        if (rc < 0 || a_set(up, S_deferred, Py_True) < 0) goto done;
    }
    if ((r = attr_true(w, S_scheduled)) < 0) goto done;
    if (!r) {
        if (a_set(w, S_scheduled, Py_True) < 0) goto done;
        PyObject *loop = a_get(w, S_loop);
        if (loop == NULL) goto done;
        PyObject *rnd = a_get(w, S_round);
        if (rnd == NULL) {
            Py_DECREF(loop);
            goto done;
        }
        PyObject *cargs[2] = {loop, rnd};
        PyObject *h = PyObject_VectorcallMethod(S_call_soon, cargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(loop);
        Py_DECREF(rnd);
        if (h == NULL) goto done;
        Py_DECREF(h);
    }
    out = Py_NewRef(Py_None);
done:
    Py_DECREF(w);
    Py_XDECREF(k);
    Py_XDECREF(d);
    Py_XDECREF(tw);
    Py_XDECREF(bw);
    Py_XDECREF(t);
    Py_XDECREF(bound);
    return out;
}


/* Upstream._watch_piece(d, data, cut, tw, bw) for a plain connection and a (start, end, t, bound) tuple (else the
   definition): 1 (tw, bw replaced), 0 (the pair came apart: the definition's None), -1 */
static int watch_piece(PyObject *up, PyObject *d, PyObject *data, PyObject *cut, PyObject **tw, PyObject **bw) {
    int plain = PyTuple_CheckExact(cut) && PyTuple_GET_SIZE(cut) == 4 ? attr_true(up, S_plain) : 0;
    if (plain < 0) return -1;
    if (!plain) {
        PyObject *args[6] = {up, d, data, cut, *tw, *bw};
        PyObject *got = PyObject_VectorcallMethod(S_watch_piece, args, 6 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (got == NULL) return -1;
        int rc = got == Py_None ? 0 : unpack2(got, tw, bw) < 0 ? -1 : 1;
        Py_DECREF(got);
        return rc;
    }
    PyObject *t = PyTuple_GET_ITEM(cut, 2), *bound = PyTuple_GET_ITEM(cut, 3);
    if (a_set(up, S_last_read_t, t) < 0 || a_set(up, S_last_read_bound, bound) < 0) return -1;
    PyObject *slice = PySlice_New(PyTuple_GET_ITEM(cut, 0), PyTuple_GET_ITEM(cut, 1), NULL);
    if (slice == NULL) return -1;
    PyObject *piece = PyObject_GetItem(data, slice); /* data[start:end] */
    Py_DECREF(slice);
    if (piece == NULL) return -1;
    PyObject *reader = a_get(up, S_reader), *events = NULL, *got = NULL;
    if (reader != NULL) {
        PyObject *fargs[2] = {reader, piece};
        events = PyObject_VectorcallMethod(S_feed, fargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(reader);
    }
    if (events != NULL) {
        PyObject *wargs[8] = {up, d, piece, events, t, bound, *tw, *bw};
        got = PyObject_VectorcallMethod(S_watch, wargs, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(events);
    }
    Py_DECREF(piece);
    if (got == NULL) return -1;
    int rc = unpack2(got, tw, bw);
    Py_DECREF(got);
    if (rc < 0) return -1;
    rc = attr_none(up, S_down);
    return rc < 0 ? -1 : !rc;
}

static PyObject *up_cuts_received(PyObject *up, PyObject *const *args, Py_ssize_t nargs) {
    if (reads_ready(nargs, 2, "cuts_received(data, pieces)") < 0) return NULL;
    PyObject *data = args[0], *pieces = args[1], *d = NULL, *tw = NULL, *bw = NULL, *wc = NULL, *cut = NULL;
    int r = attr_true(up, S_deferred);
    if (r < 0) return NULL;
    if (r) {
        PyObject *w = a_get(up, S_watches);
        if (w == NULL) return NULL;
        PyObject *rr = PyObject_VectorcallMethod(S_run, &w, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(w);
        if (rr == NULL) return NULL;
        Py_DECREF(rr);
    }
    if ((d = a_get(up, S_down)) == NULL) return NULL;
    r = d == Py_None ? 1 : attr_true(d, S_accounting);
    if (r) { /* (the definition: the connection closed, or a request's account waits: run after the forward there) */
        Py_DECREF(d);
        if (r < 0) return NULL;
        PyObject *pargs[3] = {up, data, pieces};
        return PyObject_Vectorcall(CutsReceivedPy, pargs, 3, NULL);
    }
    PyObject *out = NULL;
    if (send_down(d, data, &tw, &bw) < 0 || a_set(d, S_replay, Py_None) < 0) goto done;
    if ((wc = PyDict_GetItemWithError(RelayGlobals, S_watch_cuts)) == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_NameError, "name '_watch_cuts' is not defined");
        goto done;
    }
    Py_INCREF(wc);
    Py_ssize_t i = 0, n = PyObject_Size(pieces);
    if (n < 0) goto done;
    int builtin = PyCFunction_Check(wc) && PyCFunction_GET_FUNCTION(wc) == (PyCFunction)(void (*)(void))relay_watch_cuts;
    while (i < n) {
        if (wc != Py_None) { /* the pieces of body bytes alone in C, up to the first other one */
            if ((r = attr_true(up, S_plain)) < 0) goto done;
            if (r) {
                if (builtin) {
                    PyObject *cargs[7] = {up, d, data, pieces, NULL, tw, bw};
                    if ((i = watch_cuts_from(cargs, i)) < 0) goto done;
                } else {
                    PyObject *iv = PyLong_FromSsize_t(i);
                    if (iv == NULL) goto done;
                    PyObject *cargs[7] = {up, d, data, pieces, iv, tw, bw};
                    PyObject *got = PyObject_Vectorcall(wc, cargs, 7, NULL);
                    Py_DECREF(iv);
                    if (got == NULL) goto done;
                    i = PyLong_AsSsize_t(got);
                    Py_DECREF(got);
                    if (i == -1 && PyErr_Occurred()) goto done;
                }
                if (i >= n) break;
            }
        }
        if ((cut = PySequence_GetItem(pieces, i)) == NULL) goto done;
        r = watch_piece(up, d, data, cut, &tw, &bw);
        Py_CLEAR(cut);
        i++;
        if (r < 0) goto done;
        if (r == 0) break;
    }
    out = Py_NewRef(Py_None);
done:
    Py_DECREF(d);
    Py_XDECREF(tw);
    Py_XDECREF(bw);
    Py_XDECREF(wc);
    return out;
}

static PyMethodDef cuts_received_def = {"cuts_received", (PyCFunction)(void (*)(void))up_cuts_received, METH_FASTCALL,
                                        "Upstream.cuts_received in C (deltatap.proxy._relay; relay.py's is the definition)"};
static PyMethodDef data_received_def = {"data_received", (PyCFunction)(void (*)(void))up_data_received, METH_FASTCALL,
                                        "Upstream.data_received in C (deltatap.proxy._relay; relay.py's is the definition)"};
static PyMethodDef round_def = {"_round", (PyCFunction)(void (*)(void))watches_round, METH_FASTCALL,
                                "_Watches._round in C (deltatap.proxy._relay; relay.py's is the definition)"};
static PyMethodDef run_def = {"run", (PyCFunction)(void (*)(void))watches_run, METH_FASTCALL,
                              "_Watches.run in C (deltatap.proxy._relay; relay.py's is the definition)"};

/* reads_setup(upstream_type, watches_type, data_received, run, cuts_received, stamped_data_received, stamped_send,
   relay_globals) -> (data_received, run, cuts_received, _round): the C methods for upstream_type and watches_type; the
   functions given are the definitions they fall back to */
static PyObject *relay_reads_setup(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyFunction_Check(args[2]) ||
        !PyFunction_Check(args[3]) || !PyFunction_Check(args[4]) || !PyFunction_Check(args[5]) ||
        !PyFunction_Check(args[6]) || !PyDict_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "reads_setup(upstream_type, watches_type, data_received, run, cuts_received, "
                                         "stamped_data_received, stamped_send, relay_globals)");
        return NULL;
    }
    if (Body == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "reads_setup(): setup() first");
        return NULL;
    }
#define INTERN(var, s) \
    if (var == NULL && (var = PyUnicode_InternFromString(s)) == NULL) return NULL;
    INTERN(S_watches, "watches") INTERN(S_deferred, "deferred") INTERN(S_kernel, "kernel") INTERN(S_down, "down")
    INTERN(S_replay, "replay") INTERN(S_rx_mono_ns, "rx_mono_ns") INTERN(S_rx_bound_ns, "rx_bound_ns")
    INTERN(S_send, "send") INTERN(S_wfast, "_wfast") INTERN(S_items, "items") INTERN(S_scheduled, "scheduled")
    INTERN(S_loop, "loop") INTERN(S_round, "_round") INTERN(S_call_soon, "call_soon") INTERN(S_run, "run")
    INTERN(S_next, "next") INTERN(S_watch_read, "_watch_read") INTERN(S_watch, "_watch") INTERN(S_feed, "feed")
    INTERN(S_fatal, "_fatal") INTERN(S_dr_failed, "protocol.data_received() failed")
    INTERN(S_watch_cuts, "_watch_cuts") INTERN(S_watch_piece, "_watch_piece") INTERN(S_accounts, "accounts")
    INTERN(S_settle, "settle") INTERN(S_accounting, "accounting")
#undef INTERN
    PyObject *dr = PyDescr_NewMethod((PyTypeObject *)args[0], &data_received_def);
    if (dr == NULL) return NULL;
    PyObject *run = PyDescr_NewMethod((PyTypeObject *)args[1], &run_def);
    PyObject *cr = PyDescr_NewMethod((PyTypeObject *)args[0], &cuts_received_def);
    PyObject *rnd = PyDescr_NewMethod((PyTypeObject *)args[1], &round_def);
    PyObject *out = run == NULL || cr == NULL || rnd == NULL ? NULL : PyTuple_Pack(4, dr, run, cr, rnd);
    Py_DECREF(dr);
    Py_XDECREF(run);
    Py_XDECREF(cr);
    Py_XDECREF(rnd);
    if (out == NULL) return NULL;
    PyObject **objs[6] = {&DataReceivedPy, &RunPy, &CutsReceivedPy, &StampedDataReceived, &StampedSend, &RelayGlobals};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(args[i + 2]);
        Py_XSETREF(*objs[i], args[i + 2]);
    }
    return out;
}

static PyObject *relay_setup(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyCallable_Check(args[0]) || !PyAnySet_Check(args[1]) || !PyType_Check(args[5]) ||
        !PyType_Check(args[6]) || !PyType_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "setup(h1_body, body_states, observer_type, parser_type, gaps_observe, "
                                         "reader_type, exchange_type, record_type)");
        return NULL;
    }
    if (args[2] != Py_None && (!PyType_Check(args[2]) || !PyType_Check(args[3]) || !PyCallable_Check(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "setup(): observer_type and parser_type must be types, gaps_observe callable");
        return NULL;
    }
#define INTERN(var, s) \
    if (var == NULL && (var = PyUnicode_InternFromString(s)) == NULL) return NULL;
    INTERN(S_reader, "reader") INTERN(S_state, "_state") INTERN(S_remaining, "_remaining") INTERN(S_buf, "_buf")
    INTERN(S_pending_from, "pending_from") INTERN(S_unplaced, "unplaced") INTERN(S_exchanges, "exchanges")
    INTERN(S_rec, "rec") INTERN(S_stream, "stream") INTERN(S_capture_out, "capture_out")
    INTERN(S_response_bytes, "response_bytes") INTERN(S_chunks, "chunks") INTERN(S_end, "end")
    INTERN(S_last_unplaced, "last_unplaced") INTERN(S_first_unplaced, "first_unplaced") INTERN(S_parser, "parser") INTERN(S_observe, "observe")
    INTERN(S_unfwd, "_unforwarded") INTERN(S_unfwd_first, "_unforwarded_first")
    INTERN(S_gaps_forwarded, "gaps_forwarded") INTERN(S_ltf_t, "last_token_forwarded_mono_ns")
    INTERN(S_ltf_b, "last_token_forwarded_bound_ns") INTERN(S_ftf_t, "first_token_forwarded_mono_ns")
    INTERN(S_ftf_b, "first_token_forwarded_bound_ns") INTERN(S_plain, "plain") INTERN(S_last_read_t, "last_read_t")
    INTERN(S_last_read_bound, "last_read_bound")
#undef INTERN
    slot_api_take();
    if (Zero == NULL && (Zero = PyLong_FromLong(0)) == NULL) return NULL;
    if (slot_init(&R_state, args[5], S_state) < 0 || slot_init(&R_remaining, args[5], S_remaining) < 0 ||
        slot_init(&R_buf, args[5], S_buf) < 0 || slot_init(&R_pending_from, args[5], S_pending_from) < 0 ||
        slot_init(&X_rec, args[6], S_rec) < 0 || slot_init(&X_capture_out, args[6], S_capture_out) < 0 ||
        slot_init(&X_last_unplaced, args[6], S_last_unplaced) < 0 || slot_init(&C_stream, args[7], S_stream) < 0 ||
        slot_init(&C_response_bytes, args[7], S_response_bytes) < 0 || slot_init(&C_chunks, args[7], S_chunks) < 0 ||
        slot_init(&C_end, args[7], S_end) < 0)
        return NULL;
    if (args[2] != Py_None && slot_init(&O_parser, args[2], S_parser) < 0) return NULL;
    PyObject **objs[8] = {&Body, &BodyStates, &ObserverType, &ParserType, &GapsObserve, &ReaderType, &ExchangeType, &RecordType};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*objs[i], args[i]);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))relay_setup, METH_FASTCALL,
     "setup(h1_body, body_states, observer_type, parser_type, gaps_observe, reader_type, exchange_type, record_type)"},
    {"watch", (PyCFunction)(void (*)(void))relay_watch, METH_FASTCALL,
     "watch(up, d, data, t, bound, tw, bw) -> bool: the read watched (True), or left to the Python path"},
    {"watch_cuts", (PyCFunction)(void (*)(void))relay_watch_cuts, METH_FASTCALL,
     "watch_cuts(up, d, data, pieces, start, tw, bw) -> int: the first piece from start on not watched here"},
    {"reads_setup", (PyCFunction)(void (*)(void))relay_reads_setup, METH_FASTCALL,
     "reads_setup(upstream_type, watches_type, data_received, run, stamped_data_received, stamped_send, relay_globals)"
     " -> (data_received, run): the C methods that relay.py puts in place of its definitions"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_relay", "C accelerator of deltatap.proxy.relay's response side", -1, methods};

PyMODINIT_FUNC PyInit__relay(void) { return PyModule_Create(&module); }

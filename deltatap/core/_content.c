/* The C accelerator of deltatap.core.sse.StreamObserver's per-read step: one C call per body read.

deltatap.core._content is deltatap.core._sse's parser (this file includes _sse.c) plus SseParser.observe(obs, data,
t, bound), which does what StreamObserver.feed does in Python (sse.py, the definition): counts the read, parses its
events and, for each one in order, does what ContentStream.take and ContentStream.count do, then what
StreamObserver._events does with the read's content events (GapStats.observe, the unforwarded count and flags).

It handles only the events it is sure of: "[DONE]", an empty data, and openai-chat / openai-completions JSON
objects: once the observer's format is one of those, or, before a format is detected, when it is the one
detect_format tries first (the path's hint, or openai-chat without one) and detects the event by its "object"
string or its first choice's "delta" / "text" key (the format and its name are then set, as take sets them). From
those it records what extract records: model and id (unescaped strings, while unknown; other types are ignored as
_model_and_id ignores them), usage's integer prompt_tokens / completion_tokens (an object; null, strings, arrays and
objects are not ints; other keys and nested details are skipped), each choice's non-empty unescaped string
finish_reason (take_finish: once each, in order), and each choice's delta content / reasoning_content / reasoning /
refusal strings (chat) or text (completions); timings, error null and tool_calls null or []. With keep_text (parts
a list) each content event's text goes into parts as extract joins it (per choice, the delta's keys in
_CHAT_TEXT_KEYS order), decoded piece by piece with "replace" (each piece lies between ASCII quotes, so that is the
whole data's decoding of it). The first-content-token rule it applies is ContentStream.count's (a content event's
text is whitespace-only when every character is, by str.isspace). Every other event (other formats, escaped
model / id / finish_reason / kept text, non-integer or boolean token counts, finish reasons of other types, tool
calls, timings, errors, repeated keys, anything invalid or nested too deeply for the scanner) goes to
obs.take(event, t, bound) in Python, in order, after the counters this call has gathered are written to the
observer; so the observer ends each read in the state the Python alone gives (tests/kernel/test_content_native.py
compares them on generated streams split at random points).

The JSON scanner is a validator of a strict subset of what json accepts: every read is bounds-checked against the
event's length, nesting is bounded (deeper goes to Python), nothing is copied. */
#define SSE_MODULE "_content"
#define SSE_INIT PyInit__content
#define SSE_OBSERVER observe_event
#define SSE_PARSER_METHODS \
    {"observe", (PyCFunction)(void (*)(void))parser_observe, METH_FASTCALL, \
     "observe(obs, data, t_mono_ns, bound_ns) -> int: StreamObserver.feed in one call"},
#define SSE_MODULE_METHODS \
    {"gaps_observe", (PyCFunction)(void (*)(void))module_gaps_observe, METH_FASTCALL, \
     "gaps_observe(gaps, t_mono_ns, n): what n calls of gaps.observe(t_mono_ns) do"}, \
    {"setup_observer", (PyCFunction)(void (*)(void))setup_observer, METH_FASTCALL, \
     "setup_observer(chat, completions, heappush, heapreplace, log_gamma)"}, \
    {"slot_access", module_slot_access, METH_O, \
     "slot_access(on) -> bool: on, take _pktring's slot access (when loaded) at the next observe(); off, the generic " \
     "attribute calls from now on (tests run both); returns whether it is in use"},

#define PY_SSIZE_T_CLEAN
#include <Python.h>
static int observe_event(void *self);
static PyObject *parser_observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static PyObject *setup_observer(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
static PyObject *module_gaps_observe(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);
static PyObject *module_slot_access(PyObject *mod, PyObject *on);

static int add_gap_type(PyObject *m);
#define SSE_MODULE_INIT(m) add_gap_type(m)
#include "_sse.c"

#include <limits.h>
#include <math.h>

static PyObject *One, *ChatFmt, *ComplFmt, *ChatName, *ComplName;
static double LogGamma;
static PyObject *S_take, *S_fmt, *S_parts, *S_facts, *S_model, *S_response_id, *S_events, *S_content_events,
    *S_tokens, *S_leading_ws, *S_done, *S_first_t, *S_first_b, *S_last_t, *S_last_b, *S_gaps, *S_observe,
    *S_chunks, *S_bytes, *S_first_chunk, *S_unfwd, *S_unfwd_first, *S_last_had_first, *S_hint, *S_format,
    *S_input_tokens, *S_output_tokens, *S_finish_reasons;

enum { FMT_OTHER = 0, FMT_CHAT = 1, FMT_COMPLETIONS = 2 };

typedef struct {
    PyObject *obs, *t, *bound; /* borrowed: observe()'s arguments */
    int fmt;                   /* the observer's format, when one the scanner knows (or the one to detect) */
    int keep;                  /* keep_text: parts is a list, each content event's text is appended to it */
    int detect;                /* no format yet: fmt is the one detect_format tries first (the path's hint, or
                                  openai-chat first of all), which an event handled here must be detected as */
    int waiting;               /* first_token_mono_ns is None */
    int need_model, need_id;   /* facts.model / facts.response_id is None */
    /* what the events handled here add, not yet written to the observer */
    Py_ssize_t events, content, leading_ws;
    int done, last, first;
    Py_ssize_t n_content; /* content events of this read, here and in Python: its gaps */
    /* take raised: the rest of the read is parsed but not observed, and observe() raises it (as the Python does:
       the parser has read the whole chunk, the events after the failing one are not taken, the gaps of the content
       events before it are in, the unforwarded count and flags are not updated) */
    int failed;
    PyObject *exc_type, *exc_value, *exc_tb;
} Obs;

/* ---- the observer's attributes ---------------------------------------------------------------------------- */

/* read and written through deltatap.net._pktring's slot access once that module is loaded (its capsule _slot_api,
   defined there, the one proxy/_relay.c takes too; StreamObserver's and ContentStream's attributes are __slots__: each
   straight from its slot, the offset cached per type and name; anything else, the generic call), else the generic
   calls themselves. Looked for (not imported) at each observe() until found. */
#include "../net/_slot_api.h"
static PyObject *(*a_get)(PyObject *, PyObject *) = PyObject_GetAttr;
static int (*a_set)(PyObject *, PyObject *, PyObject *) = PyObject_SetAttr;
static int a_taken;

static void slot_api_take(void) {
    static PyObject *name;
    if (name == NULL && (name = PyUnicode_InternFromString("deltatap.net._pktring")) == NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *m = PyImport_GetModule(name); /* (sys.modules only: nothing imported here) */
    if (m == NULL) {
        PyErr_Clear();
        return;
    }
    a_taken = 1;
    PyObject *cap = PyObject_GetAttrString(m, "_slot_api");
    Py_DECREF(m);
    pk_slot_api *api = cap == NULL ? NULL : PyCapsule_GetPointer(cap, "deltatap.net._pktring._slot_api");
    Py_XDECREF(cap);
    if (api == NULL) {
        PyErr_Clear();
        return;
    }
    a_get = api->get;
    a_set = api->set;
}

static PyObject *module_slot_access(PyObject *mod, PyObject *on) {
    int want = PyObject_IsTrue(on);
    if (want < 0) return NULL;
    a_get = PyObject_GetAttr;
    a_set = PyObject_SetAttr;
    a_taken = !want; /* (on: looked for again at the next observe) */
    if (want) slot_api_take();
    return PyBool_FromLong(a_get != PyObject_GetAttr);
}

static int is_none_attr(PyObject *o, PyObject *name, int *out) {
    PyObject *v = a_get(o, name);
    if (v == NULL) return -1;
    *out = v == Py_None;
    Py_DECREF(v);
    return 0;
}

/* what the scanner may take for granted: re-read after anything Python did */
static int obs_refresh(Obs *c) {
    PyObject *v = a_get(c->obs, S_fmt);
    if (v == NULL) return -1;
    c->fmt = v == ChatFmt ? FMT_CHAT : v == ComplFmt ? FMT_COMPLETIONS : FMT_OTHER;
    c->detect = 0;
    if (v == Py_None) { /* ContentStream.take: detect_format(obj, event, self._hint), the hint tried first */
        PyObject *h = a_get(c->obs, S_hint);
        if (h == NULL) {
            Py_DECREF(v);
            return -1;
        }
        int hnone = h == Py_None;
        int hc = hnone ? 0 : PyUnicode_Check(h) ? PyObject_RichCompareBool(h, ChatName, Py_EQ) : -2;
        int hp = hc == 0 && !hnone ? PyObject_RichCompareBool(h, ComplName, Py_EQ) : 0;
        Py_DECREF(h);
        if (hc == -1 || hp == -1) {
            Py_DECREF(v);
            return -1;
        }
        if (hp == 1)
            c->fmt = FMT_COMPLETIONS, c->detect = 1;
        else if (hc == 1 || hnone)
            c->fmt = FMT_CHAT, c->detect = 1;
        /* (another hint: Python) */
    }
    Py_DECREF(v);
    PyObject *parts = a_get(c->obs, S_parts);
    if (parts == NULL) return -1;
    c->keep = parts != Py_None;
    if (c->keep && !PyList_CheckExact(parts)) c->fmt = FMT_OTHER; /* (not the list count appends to: Python) */
    Py_DECREF(parts);
    if (is_none_attr(c->obs, S_first_t, &c->waiting) < 0) return -1;
    if (c->fmt == FMT_OTHER) return 0;
    PyObject *facts = a_get(c->obs, S_facts);
    if (facts == NULL) return -1;
    int rc = is_none_attr(facts, S_model, &c->need_model);
    if (rc == 0) rc = is_none_attr(facts, S_response_id, &c->need_id);
    Py_DECREF(facts);
    return rc;
}

static int add_attr(PyObject *o, PyObject *name, Py_ssize_t n) {
    if (n == 0) return 0;
    PyObject *v = a_get(o, name);
    if (v == NULL) return -1;
    PyObject *d = PyLong_FromSsize_t(n);
    if (d == NULL) {
        Py_DECREF(v);
        return -1;
    }
    PyObject *s = PyNumber_Add(v, d);
    Py_DECREF(v);
    Py_DECREF(d);
    if (s == NULL) return -1;
    int rc = a_set(o, name, s);
    Py_DECREF(s);
    return rc;
}

/* write what the events handled here added (ContentStream.take's and count's counters) */
static int obs_flush(Obs *c) {
    PyObject *o = c->obs;
    if (add_attr(o, S_events, c->events) < 0 || add_attr(o, S_content_events, c->content) < 0 ||
        add_attr(o, S_tokens, c->content) < 0 || add_attr(o, S_leading_ws, c->leading_ws) < 0)
        return -1;
    if (c->done && a_set(o, S_done, Py_True) < 0) return -1;
    if (c->last && (a_set(o, S_last_t, c->t) < 0 || a_set(o, S_last_b, c->bound) < 0)) return -1;
    if (c->first && (a_set(o, S_first_t, c->t) < 0 || a_set(o, S_first_b, c->bound) < 0)) return -1;
    c->events = c->content = c->leading_ws = 0;
    c->done = c->last = c->first = 0;
    return 0;
}

/* ---- the JSON scanner ----------------------------------------------------------------------------------- */

#define MAX_DEPTH 48
#define MAX_NUMBER 64

typedef struct {
    const unsigned char *p, *e;
} J;

typedef struct {
    const unsigned char *s; /* NULL: none */
    Py_ssize_t n;
} Str;

#define MAX_PIECES 16

typedef struct {
    int nonempty; /* a content string that is not "" */
    int allspace; /* every character of every content string is whitespace */
    int keep;     /* keep_text: the pieces of the event's text, in extract's order (an escaped one: Python) */
    int np;
    Str pieces[MAX_PIECES];
} Text;

#define MAX_FINISH 8

/* the facts one event gives (applied only once the whole event scanned as sure): model and id (unescaped strings,
   when still unknown), usage's integer prompt_tokens / completion_tokens, the choices' non-empty unescaped
   finish_reason strings in order, and whether it is the format being detected */
typedef struct {
    Text t;
    Str model, id, in, out;
    Str finish[MAX_FINISH];
    int nfinish;
    int detected;
} Scan;

static void jws(J *j) {
    while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* the code point of a well-formed UTF-8 sequence at p (len set), or -1 (the decoder would replace it) */
static long utf8_at(const unsigned char *p, const unsigned char *e, int *len) {
    unsigned char c = p[0];
    long cp;
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return -1;
    if (e - p < n) return -1;
    for (int k = 1; k < n; k++) {
        unsigned char d = p[k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -1;
        cp = (cp << 6) | (d & 0x3F);
    }
    *len = n;
    return cp;
}

/* a JSON string (j->p on its opening quote): *s, *n its raw bytes, *esc whether it had an escape; with t, whether
   its characters are all whitespace is folded into t->allspace. -1: not a string json would accept. */
static int jstr(J *j, const unsigned char **s, Py_ssize_t *n, int *esc, Text *t) {
    const unsigned char *p = j->p + 1, *e = j->e, *start = p;
    int escaped = 0, allspace = 1;
    while (p < e) {
        unsigned char c = *p;
        if (c == '"') {
            *s = start;
            *n = p - start;
            if (esc) *esc = escaped;
            if (t != NULL && p > start) {
                t->nonempty = 1;
                if (!allspace) t->allspace = 0;
            }
            j->p = p + 1;
            return 0;
        }
        if (c < 0x20) return -1; /* json's strict mode: no raw control characters */
        if (c == '\\') {
            escaped = 1;
            if (e - p < 2) return -1;
            c = p[1];
            switch (c) {
            case '"': case '\\': case '/': case 'b':
                allspace = 0;
                p += 2;
                break;
            case 'f': case 'n': case 'r': case 't':
                p += 2;
                break;
            case 'u': {
                if (e - p < 6) return -1;
                long cp = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hexval(p[k]);
                    if (h < 0) return -1;
                    cp = cp * 16 + h;
                }
                if (!Py_UNICODE_ISSPACE((Py_UCS4)cp)) allspace = 0; /* (surrogates are not whitespace, alone or paired) */
                p += 6;
                break;
            }
            default:
                return -1;
            }
        } else if (c < 0x80) {
            if (c != ' ') allspace = 0; /* (the other ASCII whitespace are control characters: refused above) */
            p++;
        } else if (allspace && t != NULL) {
            int len = 1;
            long cp = utf8_at(p, e, &len);
            if (cp < 0 || !Py_UNICODE_ISSPACE((Py_UCS4)cp)) allspace = 0; /* (invalid bytes decode to U+FFFD) */
            p += len;
        } else
            p++;
    }
    return -1;
}

static int jlit(J *j, const char *lit, Py_ssize_t n) {
    if (j->e - j->p < n || memcmp(j->p, lit, (size_t)n) != 0) return -1;
    j->p += n;
    return 0;
}

/* json's number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? (bounded length: a longer one goes to Python) */
static int jnum(J *j) {
    const unsigned char *p = j->p, *e = j->e, *start = p;
    if (p < e && *p == '-') p++;
    if (p >= e) return -1;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < e && *p >= '0' && *p <= '9') p++;
    else
        return -1;
    if (p < e && *p == '.') {
        const unsigned char *q = ++p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        if (p == q) return -1;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        const unsigned char *q = p;
        while (p < e && *p >= '0' && *p <= '9') p++;
        if (p == q) return -1;
    }
    if (p - start > MAX_NUMBER) return -1;
    j->p = p;
    return 0;
}

static int jvalue(J *j, int depth);

static int jobject(J *j, int depth) {
    j->p++;
    jws(j);
    if (j->p < j->e && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        const unsigned char *s;
        Py_ssize_t n;
        if (j->p >= j->e || *j->p != '"' || jstr(j, &s, &n, NULL, NULL) < 0) return -1;
        jws(j);
        if (j->p >= j->e || *j->p != ':') return -1;
        j->p++;
        jws(j);
        if (jvalue(j, depth + 1) < 0) return -1;
        jws(j);
        if (j->p >= j->e) return -1;
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
        if (*j->p != ',') return -1;
        j->p++;
        jws(j);
    }
}

static int jarray(J *j, int depth) {
    j->p++;
    jws(j);
    if (j->p < j->e && *j->p == ']') {
        j->p++;
        return 0;
    }
    for (;;) {
        if (jvalue(j, depth + 1) < 0) return -1;
        jws(j);
        if (j->p >= j->e) return -1;
        if (*j->p == ']') {
            j->p++;
            return 0;
        }
        if (*j->p != ',') return -1;
        j->p++;
        jws(j);
    }
}

/* any JSON value at j->p (whitespace before it skipped by the caller) */
static int jvalue(J *j, int depth) {
    if (j->p >= j->e || depth > MAX_DEPTH) return -1;
    const unsigned char *s;
    Py_ssize_t n;
    switch (*j->p) {
    case '{': return jobject(j, depth);
    case '[': return jarray(j, depth);
    case '"': return jstr(j, &s, &n, NULL, NULL);
    case 't': return jlit(j, "true", 4);
    case 'f': return jlit(j, "false", 5);
    case 'n': return jlit(j, "null", 4);
    default: return jnum(j);
    }
}

/* an object's members one by one: 1 with the key (unescaped only: an escaped key goes to Python) and j->p on the
   value, 0 at the closing brace, -1 invalid. *first starts at 1. */
static int jmember(J *j, int *first, const unsigned char **k, Py_ssize_t *kn) {
    jws(j);
    if (j->p >= j->e) return -1;
    if (*first) {
        *first = 0;
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
    } else {
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
        if (*j->p != ',') return -1;
        j->p++;
        jws(j);
    }
    int esc;
    if (j->p >= j->e || *j->p != '"' || jstr(j, k, kn, &esc, NULL) < 0 || esc) return -1;
    jws(j);
    if (j->p >= j->e || *j->p != ':') return -1;
    j->p++;
    jws(j);
    return j->p < j->e ? 1 : -1;
}

#define KEY(lit) (kn == (Py_ssize_t)sizeof(lit) - 1 && memcmp(k, lit, sizeof(lit) - 1) == 0)

static int once(unsigned *seen, unsigned bit) {
    if (*seen & bit) return -1; /* a repeated key: json keeps the last, Python decides */
    *seen |= bit;
    return 0;
}

/* a string (content; a non-empty one in *slot), or any other value (not content) */
static int jtext(J *j, Text *t, Str *slot) {
    const unsigned char *s;
    Py_ssize_t n;
    int esc;
    if (*j->p != '"') return jvalue(j, 3);
    if (jstr(j, &s, &n, &esc, t) < 0) return -1;
    if (t->keep && esc) return -1; /* keep_text: Python unescapes the text */
    if (n > 0) {
        slot->s = s;
        slot->n = n;
    }
    return 0;
}

static int keep_piece(Text *t, Str s) {
    if (!t->keep || s.s == NULL) return 0;
    if (t->np == MAX_PIECES) return -1;
    t->pieces[t->np++] = s;
    return 0;
}

/* chat: one delta object's members */
static int chat_delta(J *j, Text *t) {
    int first = 1, r;
    unsigned seen = 0;
    const unsigned char *k;
    Py_ssize_t kn;
    Str slots[4] = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}}; /* _CHAT_TEXT_KEYS's order, not the JSON's */
    j->p++;
    while ((r = jmember(j, &first, &k, &kn)) == 1) {
        if (KEY("content") || KEY("reasoning_content") || KEY("reasoning") || KEY("refusal")) {
            int i = KEY("content") ? 0 : KEY("reasoning_content") ? 1 : KEY("reasoning") ? 2 : 3;
            if (once(&seen, 1u << i) < 0) return -1;
            if (jtext(j, t, &slots[i]) < 0) return -1;
        } else if (KEY("tool_calls")) {
            if (once(&seen, 16) < 0) return -1;
            if (jlit(j, "null", 4) == 0) continue;
            if (*j->p != '[') return -1; /* tool calls: Python */
            j->p++;
            jws(j);
            if (j->p >= j->e || *j->p != ']') return -1;
            j->p++;
        } else if (jvalue(j, 3) < 0)
            return -1;
    }
    for (int i = 0; r == 0 && i < 4; i++)
        if (keep_piece(t, slots[i]) < 0) return -1;
    return r;
}

/* an unescaped string (j->p on its quote): -1 for an escaped one (Python unescapes) */
static int jplain(J *j, Str *out) {
    int esc;
    if (jstr(j, &out->s, &out->n, &esc, NULL) < 0 || esc) return -1;
    return 0;
}

/* one choice object's members; head: the first choice (detect_format looks at its "delta" / "text" key) */
static int choice(J *j, int fmt, Scan *sc, int head) {
    int first = 1, r;
    unsigned seen = 0;
    const unsigned char *k;
    Py_ssize_t kn;
    Text *t = &sc->t;
    j->p++;
    while ((r = jmember(j, &first, &k, &kn)) == 1) {
        if (KEY("finish_reason")) { /* StreamFacts.take_finish: a non-empty str, once */
            if (once(&seen, 1) < 0) return -1;
            if (jlit(j, "null", 4) == 0) continue;
            if (*j->p != '"') return -1; /* a reason of another type: Python */
            Str f;
            if (jplain(j, &f) < 0) return -1;
            if (f.n > 0) {
                if (sc->nfinish == MAX_FINISH) return -1;
                sc->finish[sc->nfinish++] = f;
            }
        } else if (fmt == FMT_CHAT && KEY("delta")) {
            if (once(&seen, 2) < 0) return -1;
            if (head) sc->detected = 1; /* OpenAIChat.detect: "delta" in choices[0] */
            if (*j->p == '{') {
                if (chat_delta(j, t) < 0) return -1;
            } else if (jvalue(j, 2) < 0)
                return -1;
        } else if (fmt == FMT_COMPLETIONS && KEY("text")) {
            if (once(&seen, 2) < 0) return -1;
            if (head) sc->detected = 1; /* OpenAICompletions.detect: "text" in choices[0] */
            Str text = {NULL, 0};
            if (jtext(j, t, &text) < 0 || keep_piece(t, text) < 0) return -1;
        } else if (jvalue(j, 2) < 0)
            return -1;
    }
    return r;
}

/* an integer json reads as int (no fraction, no exponent): -1 for any other number (Python) */
static int jint(J *j, Str *out) {
    const unsigned char *start = j->p;
    if (jnum(j) < 0) return -1;
    for (const unsigned char *q = start; q < j->p; q++)
        if (*q == '.' || *q == 'e' || *q == 'E') return -1;
    out->s = start;
    out->n = j->p - start;
    return 0;
}

/* StreamFacts.take_usage(usage, "prompt_tokens", "completion_tokens") on an object: its int members; null and
   strings, arrays, objects are not int (nothing); true/false (bool is an int) and other numbers go to Python */
static int usage_obj(J *j, Scan *sc) {
    int first = 1, r;
    unsigned seen = 0;
    const unsigned char *k;
    Py_ssize_t kn;
    j->p++;
    while ((r = jmember(j, &first, &k, &kn)) == 1) {
        int in = KEY("prompt_tokens");
        if (in || KEY("completion_tokens")) {
            if (once(&seen, in ? 1 : 2) < 0) return -1;
            unsigned char c = *j->p;
            Str *dst = in ? &sc->in : &sc->out;
            if (c == '-' || (c >= '0' && c <= '9')) {
                if (jint(j, dst) < 0) return -1;
            } else if (c == 't' || c == 'f')
                return -1;
            else if (jvalue(j, 3) < 0)
                return -1;
        } else if (jvalue(j, 3) < 0)
            return -1;
    }
    return r;
}

/* the event's data: 1 sure (sc says its content and facts), -1 Python's to decide */
static int scan_event(const unsigned char *p, Py_ssize_t n, Obs *c, Scan *sc) {
    J j = {p, p + n};
    int first = 1, r;
    unsigned seen = 0;
    const unsigned char *k;
    Py_ssize_t kn;
    jws(&j);
    if (j.p >= j.e || *j.p != '{') return -1;
    j.p++;
    while ((r = jmember(&j, &first, &k, &kn)) == 1) {
        if (KEY("usage")) {
            if (once(&seen, 1) < 0) return -1;
            if (jlit(&j, "null", 4) == 0) continue;
            if (*j.p != '{' || usage_obj(&j, sc) < 0) return -1; /* (usage that is no object: Python) */
        } else if (KEY("timings") || KEY("error")) {
            if (once(&seen, KEY("timings") ? 2 : 4) < 0 || jlit(&j, "null", 4) < 0) return -1;
        } else if (KEY("model") || KEY("id")) { /* _model_and_id: a str, while unknown */
            int m = KEY("model");
            if (once(&seen, m ? 16 : 32) < 0) return -1;
            if ((m ? c->need_model : c->need_id) && *j.p == '"') {
                if (jplain(&j, m ? &sc->model : &sc->id) < 0) return -1;
            } else if (jvalue(&j, 1) < 0)
                return -1;
        } else if (c->detect && KEY("object")) { /* detect: obj.get("object") == "chat.completion.chunk" / "text_completion" */
            if (once(&seen, 64) < 0) return -1;
            if (*j.p == '"') {
                Str o;
                if (jplain(&j, &o) < 0) return -1;
                const char *want = c->fmt == FMT_CHAT ? "chat.completion.chunk" : "text_completion";
                if (o.n == (Py_ssize_t)strlen(want) && memcmp(o.s, want, (size_t)o.n) == 0) sc->detected = 1;
            } else if (jvalue(&j, 1) < 0)
                return -1;
        } else if (KEY("choices")) {
            if (once(&seen, 8) < 0) return -1;
            if (jlit(&j, "null", 4) == 0) continue;
            if (*j.p != '[') return -1;
            j.p++;
            jws(&j);
            if (j.p < j.e && *j.p == ']') {
                j.p++;
                continue;
            }
            for (int head = 1;; head = 0) {
                if (j.p >= j.e) return -1;
                if (*j.p == '{') {
                    if (choice(&j, c->fmt, sc, head) < 0) return -1;
                } else if (jvalue(&j, 1) < 0) /* (a choice that is not an object carries nothing) */
                    return -1;
                jws(&j);
                if (j.p >= j.e) return -1;
                if (*j.p == ']') {
                    j.p++;
                    break;
                }
                if (*j.p != ',') return -1;
                j.p++;
                jws(&j);
            }
        } else if (jvalue(&j, 1) < 0)
            return -1;
    }
    if (r < 0) return -1;
    jws(&j);
    if (j.p != j.e) return -1;
    return c->detect && !sc->detected ? -1 : 1; /* (not the format tried first: detect_format in Python) */
}

/* a str from an unescaped JSON string's bytes: the event's data was decoded with "replace" as a whole, and a string
   is delimited by ASCII quotes, so decoding its bytes alone gives the same characters */
static PyObject *str_of(Str s) {
    return PyUnicode_DecodeUTF8((const char *)s.s, s.n, "replace");
}

static int set_str(PyObject *o, PyObject *name, Str s) {
    PyObject *v = str_of(s);
    if (v == NULL) return -1;
    int rc = a_set(o, name, v);
    Py_DECREF(v);
    return rc;
}

static int set_int(PyObject *o, PyObject *name, Str s) {
    char buf[MAX_NUMBER + 1]; /* (jnum bounds a number's length) */
    if (s.n > MAX_NUMBER) {
        PyErr_SetString(PyExc_RuntimeError, "_content: number too long");
        return -1;
    }
    memcpy(buf, s.s, (size_t)s.n);
    buf[s.n] = 0;
    PyObject *v = PyLong_FromString(buf, NULL, 10);
    if (v == NULL) return -1;
    int rc = a_set(o, name, v);
    Py_DECREF(v);
    return rc;
}

/* what extract (and detect_format) record for a sure event: the format, model, id, usage, finish reasons */
static int apply_facts(Obs *c, Scan *sc) {
    if (c->detect) { /* ContentStream.take: self._fmt, self.format */
        if (a_set(c->obs, S_fmt, c->fmt == FMT_CHAT ? ChatFmt : ComplFmt) < 0 ||
            a_set(c->obs, S_format, c->fmt == FMT_CHAT ? ChatName : ComplName) < 0)
            return -1;
        c->detect = 0;
    }
    if (!sc->model.s && !sc->id.s && !sc->in.s && !sc->out.s && sc->nfinish == 0) return 0;
    PyObject *facts = a_get(c->obs, S_facts);
    if (facts == NULL) return -1;
    int rc = 0;
    if (sc->model.s && (rc = set_str(facts, S_model, sc->model)) == 0) c->need_model = 0;
    if (rc == 0 && sc->id.s && (rc = set_str(facts, S_response_id, sc->id)) == 0) c->need_id = 0;
    if (rc == 0 && sc->in.s) rc = set_int(facts, S_input_tokens, sc->in);
    if (rc == 0 && sc->out.s) rc = set_int(facts, S_output_tokens, sc->out);
    if (rc == 0 && sc->nfinish > 0) { /* StreamFacts.take_finish: each reason once, in order */
        PyObject *reasons = a_get(facts, S_finish_reasons);
        if (reasons == NULL) rc = -1;
        for (int i = 0; rc == 0 && i < sc->nfinish; i++) {
            PyObject *v = str_of(sc->finish[i]);
            if (v == NULL) {
                rc = -1;
                break;
            }
            int has = PySequence_Contains(reasons, v);
            if (has < 0)
                rc = -1;
            else if (has == 0) {
                PyObject *r = PyObject_CallMethod(reasons, "append", "O", v);
                if (r == NULL) rc = -1;
                Py_XDECREF(r);
            }
            Py_DECREF(v);
        }
        Py_XDECREF(reasons);
    }
    Py_DECREF(facts);
    return rc;
}

/* ContentStream.count's parts.append(text): the pieces decoded one by one (each between ASCII quotes: as the whole
   data's decoding gives them) and joined */
static int keep_text(Obs *c, Text *t) {
    PyObject *text;
    if (t->np == 1)
        text = str_of(t->pieces[0]);
    else {
        PyObject *list = PyList_New(t->np);
        if (list == NULL) return -1;
        for (int i = 0; i < t->np; i++) {
            PyObject *v = str_of(t->pieces[i]);
            if (v == NULL) {
                Py_DECREF(list);
                return -1;
            }
            PyList_SET_ITEM(list, i, v);
        }
        PyObject *empty = PyUnicode_New(0, 0);
        text = empty == NULL ? NULL : PyUnicode_Join(empty, list);
        Py_XDECREF(empty);
        Py_DECREF(list);
    }
    if (text == NULL) return -1;
    PyObject *parts = a_get(c->obs, S_parts);
    int rc = -1;
    if (parts != NULL) {
        if (PyList_Check(parts))
            rc = PyList_Append(parts, text);
        else
            PyErr_SetString(PyExc_RuntimeError, "_content: parts is no longer a list");
        Py_DECREF(parts);
    }
    Py_DECREF(text);
    return rc;
}

/* ---- one dispatched event --------------------------------------------------------------------------------- */

static int observe_event(void *vself) {
    Parser *self = (Parser *)vself;
    Obs *c = (Obs *)self->ctx;
    if (c->failed) return 0;
    const unsigned char *p = (const unsigned char *)(self->data.p ? self->data.p : "");
    Py_ssize_t n = self->data.len;
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0) {
        c->events++;
        c->done = 1;
        return 0;
    }
    if (n == 0) {
        c->events++;
        return 0;
    }
    if (c->fmt != FMT_OTHER) {
        Scan sc;
        memset(&sc, 0, sizeof sc);
        sc.t.allspace = 1;
        sc.t.keep = c->keep;
        if (scan_event(p, n, c, &sc) == 1) {
            Text *t = &sc.t;
            if (apply_facts(c, &sc) < 0) return -1;
            if (t->nonempty && t->keep && keep_text(c, t) < 0) return -1;
            c->events++;
            if (t->nonempty) {
                c->content++;
                c->n_content++;
                c->last = 1;
                if (c->waiting) {
                    if (t->allspace)
                        c->leading_ws++;
                    else {
                        c->first = 1;
                        c->waiting = 0;
                    }
                }
            }
            return 0;
        }
    }
    /* Python's: ContentStream.take, with the counters so far written first */
    if (obs_flush(c) < 0) return -1;
    PyObject *ev = make_event(self);
    if (ev == NULL) return -1;
    PyObject *got = PyObject_CallMethodObjArgs(c->obs, S_take, ev, c->t, c->bound, NULL);
    Py_DECREF(ev);
    int yes = -1;
    if (got != NULL) {
        PyObject *text = PySequence_GetItem(got, 0);
        Py_DECREF(got);
        if (text != NULL) {
            yes = PyObject_IsTrue(text);
            Py_DECREF(text);
        }
    }
    if (yes > 0) c->n_content++;
    if (yes < 0 || obs_refresh(c) < 0) {
        c->failed = 1;
        PyErr_Fetch(&c->exc_type, &c->exc_value, &c->exc_tb);
    }
    return 0;
}

/* ---- GapStats in C: GapCore ------------------------------------------------------------------------------

deltatap.core.gap_stats.GapStats is the definition; GapCore keeps the same state (count, total_ns, max_ns, _top: the
min-heap of the top_k largest gaps, _buckets: the sketch dict, _zeros, _last) and does observe() and add() the same
way; sse.py's subclass of it borrows GapStats's quantile_ns and p99_ns, which read that state (mean_ns is a getter
here: GapStats.mean_ns's division, in one C call). The heap is a C array of the gaps, kept with heapq's own
algorithm (_heapq.c's siftdown / siftup: heappush, heapreplace), so ``_top`` (a list made from it when read) is the
list GapStats's heapq calls leave, item for item; no int object per gap. Counts and sums are C long long: a total
past 2^63 ns (292 years) raises OverflowError instead of growing. */

typedef struct {
    PyObject_HEAD
    long long count, total_ns, max_ns, zeros;
    Py_ssize_t top_k;
    long long *top;    /* the heap: n_top gaps (room for cap_top), as heapq keeps GapStats._top */
    Py_ssize_t n_top, cap_top;
    PyObject *top_list; /* _top as read: one list, made at the first read and brought up to date at each */
    PyObject *buckets;  /* dict */
    PyObject *last;    /* int or NULL (None) */
} Gaps;

static PyTypeObject GapsType;

static PyObject *gaps_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"top_k", NULL};
    Py_ssize_t top_k = 128;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:GapCore", kwlist, &top_k)) return NULL;
    Gaps *self = (Gaps *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->top_k = top_k;
    self->buckets = PyDict_New();
    if (self->buckets == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int gaps_traverse(Gaps *self, visitproc visit, void *arg) {
    Py_VISIT(self->top_list);
    Py_VISIT(self->buckets);
    Py_VISIT(self->last);
    return 0;
}

static int gaps_clear(Gaps *self) {
    Py_CLEAR(self->top_list);
    Py_CLEAR(self->buckets);
    Py_CLEAR(self->last);
    return 0;
}

static void gaps_dealloc(Gaps *self) {
    PyObject_GC_UnTrack(self);
    gaps_clear(self);
    PyMem_Free(self->top);
    self->top = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* heapq's siftdown(heap, startpos, pos) and siftup(heap, pos) (Modules/_heapq.c, Lib/heapq.py's _siftdown / _siftup),
   on the array: the same moves, so the same order */
static void heap_siftdown(long long *heap, Py_ssize_t startpos, Py_ssize_t pos) {
    long long newitem = heap[pos];
    while (pos > startpos) {
        Py_ssize_t parentpos = (pos - 1) >> 1;
        long long parent = heap[parentpos];
        if (!(newitem < parent)) break;
        heap[pos] = parent;
        pos = parentpos;
    }
    heap[pos] = newitem;
}

static void heap_siftup(long long *heap, Py_ssize_t endpos, Py_ssize_t pos) {
    Py_ssize_t startpos = pos, limit = endpos >> 1; /* (limit: the smallest pos without a child) */
    long long newitem = heap[pos];
    while (pos < limit) {
        Py_ssize_t childpos = 2 * pos + 1; /* the smaller child */
        if (childpos + 1 < endpos && !(heap[childpos] < heap[childpos + 1])) childpos++;
        heap[pos] = heap[childpos];
        pos = childpos;
    }
    heap[pos] = newitem;
    heap_siftdown(heap, startpos, pos);
}

/* heapq.heappush(top, g) */
static int heap_push(Gaps *self, long long g) {
    if (self->n_top == self->cap_top) {
        Py_ssize_t cap = self->cap_top ? self->cap_top * 2 : 16;
        if (cap > self->top_k) cap = self->top_k;
        long long *grown = PyMem_Realloc(self->top, (size_t)cap * sizeof(long long));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->top = grown;
        self->cap_top = cap;
    }
    self->top[self->n_top++] = g;
    heap_siftdown(self->top, 0, self->n_top - 1);
    return 0;
}

/* GapStats.add(g) */
static int gap_add(Gaps *self, long long g) {
    if (g < 0) g = 0;
    long long total;
    if (__builtin_add_overflow(self->total_ns, g, &total)) {
        PyErr_SetString(PyExc_OverflowError, "GapCore: the sum of the gaps passed 2^63 ns");
        return -1;
    }
    if (self->buckets == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GapCore: cleared");
        return -1;
    }
    self->count++;
    self->total_ns = total;
    if (g > self->max_ns) self->max_ns = g;
    if (self->n_top < self->top_k) return heap_push(self, g);
    if (self->n_top > 0 && g > self->top[0]) { /* heapreplace (top_k 0: every gap goes to the sketch) */
        long long smallest = self->top[0];
        self->top[0] = g;
        heap_siftup(self->top, self->n_top, 0);
        g = smallest;
    }
    if (g == 0) {
        self->zeros++;
        return 0;
    }
    PyObject *key = PyLong_FromLongLong((long long)ceil(log((double)g) / LogGamma));
    if (key == NULL) return -1;
    PyObject *had = PyDict_GetItemWithError(self->buckets, key);
    if (had == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    PyObject *now = had ? PyNumber_Add(had, One) : PyLong_FromLong(1);
    if (now == NULL) {
        Py_DECREF(key);
        return -1;
    }
    int rc = PyDict_SetItem(self->buckets, key, now);
    Py_DECREF(key);
    Py_DECREF(now);
    return rc;
}

/* n calls of GapStats.observe(t): one gap since the last stamp, then zero gaps (one read's events share t) */
static int gap_observe_n(Gaps *self, PyObject *t_obj, Py_ssize_t n) {
    if (n <= 0) return 0;
    long long t = PyLong_AsLongLong(t_obj);
    if (t == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t zero_gaps = n - 1;
    if (self->last != NULL) {
        long long last = PyLong_AsLongLong(self->last), g;
        if (last == -1 && PyErr_Occurred()) return -1;
        if (__builtin_sub_overflow(t, last, &g)) g = t > last ? LLONG_MAX : 0;
        if (gap_add(self, g) < 0) return -1;
    }
    /* zero gaps: kept while the top is not full, then counted in the sketch's zeros (no kept gap is below 0) */
    while (zero_gaps > 0 && self->buckets != NULL && self->n_top < self->top_k) {
        if (gap_add(self, 0) < 0) return -1;
        zero_gaps--;
    }
    if (zero_gaps > 0) {
        self->count += zero_gaps;
        self->zeros += zero_gaps;
    }
    Py_INCREF(t_obj);
    Py_XSETREF(self->last, t_obj);
    return 0;
}

static int gaps_observe(PyObject *gaps, PyObject *t_obj, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (PyObject_TypeCheck(gaps, &GapsType) && PyLong_CheckExact(t_obj)) return gap_observe_n((Gaps *)gaps, t_obj, n);
    for (Py_ssize_t i = 0; i < n; i++) { /* another GapStats: its own observe */
        PyObject *r = PyObject_CallMethodOneArg(gaps, S_observe, t_obj);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *gaps_py_observe(Gaps *self, PyObject *t) {
    if (!PyLong_Check(t)) {
        PyErr_SetString(PyExc_TypeError, "GapCore.observe(t_ns): an int");
        return NULL;
    }
    if (gap_observe_n(self, t, 1) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gaps_py_add(Gaps *self, PyObject *g) {
    long long x = PyLong_AsLongLong(g);
    if (x == -1 && PyErr_Occurred()) return NULL;
    if (gap_add(self, x) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gaps_get_last(Gaps *self, void *closure) {
    return Py_NewRef(self->last ? self->last : Py_None);
}

/* GapStats._top: the heap as a list, the same list at every read (as GapStats's attribute is), its items brought up
   to date when read (GapStats's code only reads it) */
static PyObject *gaps_get_top(Gaps *self, void *closure) {
    PyObject *fresh = PyList_New(self->n_top);
    if (fresh == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n_top; i++) {
        PyObject *v = PyLong_FromLongLong(self->top[i]);
        if (v == NULL) {
            Py_DECREF(fresh);
            return NULL;
        }
        PyList_SET_ITEM(fresh, i, v);
    }
    if (self->top_list == NULL) {
        self->top_list = fresh;
        return Py_NewRef(fresh);
    }
    int rc = PyList_SetSlice(self->top_list, 0, PY_SSIZE_T_MAX, fresh);
    Py_DECREF(fresh);
    if (rc < 0) return NULL;
    return Py_NewRef(self->top_list);
}

/* GapStats.mean_ns: total_ns / count (Python's int division: exact rounding), 0.0 without a gap */
static PyObject *gaps_get_mean(Gaps *self, void *closure) {
    if (!self->count) return PyFloat_FromDouble(0.0);
    PyObject *total = PyLong_FromLongLong(self->total_ns), *count = PyLong_FromLongLong(self->count), *out = NULL;
    if (total != NULL && count != NULL) out = PyNumber_TrueDivide(total, count);
    Py_XDECREF(total);
    Py_XDECREF(count);
    return out;
}

static PyMethodDef gaps_methods[] = {
    {"observe", (PyCFunction)gaps_py_observe, METH_O, "observe(t_ns): add the gap since the previous call"},
    {"add", (PyCFunction)gaps_py_add, METH_O, "add(gap_ns)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef gaps_members[] = {
    {"count", T_LONGLONG, offsetof(Gaps, count), READONLY, NULL},
    {"total_ns", T_LONGLONG, offsetof(Gaps, total_ns), READONLY, NULL},
    {"max_ns", T_LONGLONG, offsetof(Gaps, max_ns), READONLY, NULL},
    {"_zeros", T_LONGLONG, offsetof(Gaps, zeros), READONLY, NULL},
    {"_top_k", T_PYSSIZET, offsetof(Gaps, top_k), READONLY, NULL},
    {"_buckets", T_OBJECT_EX, offsetof(Gaps, buckets), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef gaps_getset[] = {
    {"_last", (getter)gaps_get_last, NULL, NULL, NULL},
    {"_top", (getter)gaps_get_top, NULL, "the min-heap of the top_k largest gaps (a list made when read)", NULL},
    {"mean_ns", (getter)gaps_get_mean, NULL, "GapStats.mean_ns", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GapsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deltatap.core._content.GapCore",
    .tp_basicsize = sizeof(Gaps),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_doc = "deltatap.core.gap_stats.GapStats's state, observe() and add() in C (the Python class is the definition)",
    .tp_new = gaps_new,
    .tp_dealloc = (destructor)gaps_dealloc,
    .tp_traverse = (traverseproc)gaps_traverse,
    .tp_clear = (inquiry)gaps_clear,
    .tp_methods = gaps_methods,
    .tp_members = gaps_members,
    .tp_getset = gaps_getset,
};

/* ---- SseParser.observe ------------------------------------------------------------------------------------ */

static PyObject *parser_observe(PyObject *pself, PyObject *const *args, Py_ssize_t nargs) {
    Parser *self = (Parser *)pself;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "observe(obs, data, t_mono_ns, bound_ns)");
        return NULL;
    }
    if (ChatFmt == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "deltatap.core._content.setup_observer() was not called");
        return NULL;
    }
    if (self->ctx != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "SseParser.observe() re-entered");
        return NULL;
    }
    if (!a_taken) slot_api_take();
    Obs c = {0};
    c.obs = args[0];
    c.t = args[2];
    c.bound = args[3];
    PyObject *obs = c.obs;
    Py_ssize_t size = PyObject_Size(args[1]);
    if (size < 0) return NULL;
    /* StreamObserver.feed: the read's count, bytes and first stamp */
    if (add_attr(obs, S_chunks, 1) < 0 || add_attr(obs, S_bytes, size) < 0) return NULL;
    int none;
    if (is_none_attr(obs, S_first_chunk, &none) < 0) return NULL;
    if (none && a_set(obs, S_first_chunk, c.t) < 0) return NULL;
    if (obs_refresh(&c) < 0) return NULL;
    int waiting = c.waiting;
    self->ctx = &c;
    PyObject *none_list = parser_feed(self, args[1]); /* every event goes to observe_event: the list stays empty */
    self->ctx = NULL;
    if (c.failed) {
        /* the Python observes each content event's gap as it takes it: those before the failing one are in */
        Py_XDECREF(none_list);
        PyErr_Clear(); /* (the first error wins) */
        PyObject *gaps = a_get(obs, S_gaps);
        if (gaps != NULL) {
            gaps_observe(gaps, c.t, c.n_content);
            Py_DECREF(gaps);
        }
        PyErr_Restore(c.exc_type, c.exc_value, c.exc_tb);
        return NULL;
    }
    if (none_list == NULL) return NULL;
    Py_DECREF(none_list);
    if (obs_flush(&c) < 0) return NULL;
    /* StreamObserver._events */
    if (c.n_content > 0) {
        PyObject *gaps = a_get(obs, S_gaps);
        if (gaps == NULL) return NULL;
        int rc = gaps_observe(gaps, c.t, c.n_content);
        Py_DECREF(gaps);
        if (rc < 0) return NULL;
        if (add_attr(obs, S_unfwd, c.n_content) < 0) return NULL;
    }
    int had_first = waiting && !c.waiting;
    if (had_first && a_set(obs, S_unfwd_first, Py_True) < 0) return NULL;
    if (a_set(obs, S_last_had_first, had_first ? Py_True : Py_False) < 0) return NULL;
    return PyLong_FromSsize_t(c.n_content);
}

static PyObject *module_gaps_observe(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "gaps_observe(gaps, t_mono_ns, n)");
        return NULL;
    }
    if (ChatFmt == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "deltatap.core._content.setup_observer() was not called");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (gaps_observe(args[0], args[1], n) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *setup_observer(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    /* (heappush and heapreplace: GapCore keeps its heap with their algorithm itself; still taken, not kept, so that
       callers built for either signature - benchmarks/observer_cpu.py loads older trees' modules - pass the same) */
    if (nargs != 5 || !PyFloat_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "setup_observer(chat, completions, heappush, heapreplace, log_gamma)");
        return NULL;
    }
#define INTERN(var, s) \
    if (var == NULL && (var = PyUnicode_InternFromString(s)) == NULL) return NULL;
    INTERN(S_take, "take") INTERN(S_fmt, "_fmt") INTERN(S_parts, "parts") INTERN(S_facts, "facts")
    INTERN(S_model, "model") INTERN(S_response_id, "response_id") INTERN(S_events, "events")
    INTERN(S_content_events, "content_events") INTERN(S_tokens, "tokens")
    INTERN(S_leading_ws, "leading_whitespace_events") INTERN(S_done, "done") INTERN(S_first_t, "first_token_mono_ns")
    INTERN(S_first_b, "first_token_bound_ns") INTERN(S_last_t, "last_token_mono_ns")
    INTERN(S_last_b, "last_token_bound_ns") INTERN(S_gaps, "gaps") INTERN(S_observe, "observe")
    INTERN(S_chunks, "chunks") INTERN(S_bytes, "bytes") INTERN(S_first_chunk, "first_chunk_mono_ns")
    INTERN(S_unfwd, "_unforwarded") INTERN(S_unfwd_first, "_unforwarded_first")
    INTERN(S_last_had_first, "_last_had_first") INTERN(S_hint, "_hint") INTERN(S_format, "format")
    INTERN(S_input_tokens, "input_tokens") INTERN(S_output_tokens, "output_tokens")
    INTERN(S_finish_reasons, "finish_reasons")
#undef INTERN
    if (One == NULL && (One = PyLong_FromLong(1)) == NULL) return NULL;
    PyObject **slots[2] = {&ChatFmt, &ComplFmt};
    for (int i = 0; i < 2; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    LogGamma = PyFloat_AS_DOUBLE(args[4]);
    PyObject *chat_name = PyObject_GetAttrString(ChatFmt, "name"), *compl_name = PyObject_GetAttrString(ComplFmt, "name");
    if (chat_name == NULL || compl_name == NULL || !PyUnicode_Check(chat_name) || !PyUnicode_Check(compl_name)) {
        Py_XDECREF(chat_name);
        Py_XDECREF(compl_name);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "setup_observer: the formats' names are str");
        return NULL;
    }
    Py_XSETREF(ChatName, chat_name);
    Py_XSETREF(ComplName, compl_name);
    Py_RETURN_NONE;
}

static int add_gap_type(PyObject *m) {
    if (PyType_Ready(&GapsType) < 0) return -1;
    Py_INCREF(&GapsType);
    if (PyModule_AddObject(m, "GapCore", (PyObject *)&GapsType) < 0) {
        Py_DECREF(&GapsType);
        return -1;
    }
    return 0;
}

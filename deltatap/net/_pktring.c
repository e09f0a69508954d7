/* deltatap.net._pktring: the C twin of the stamped read path's per-read work (deltatap/net/pktstamp.py,
 * deltatap/net/kstamp.py). Each function does exactly what its Python reference does, in one call:
 *
 *   tcp_counters(sock)            pktstamp.tcp_counters: (tcpi_data_segs_in, tcpi_bytes_received) or None
 *   tcp_notsent(sock)             pktstamp.tcp_notsent: tcpi_notsent_bytes or None
 *   recv(sock, buffer, flags)     kstamp._recv_stamped: recvmsg into a writable buffer, the software receive stamp
 *                                 of its SO_TIMESTAMPING control message parsed here -> (n, kernel_ns or 0)
 *   ring_newest(ring, head[, top])  PacketLog._newest_from: one past the newest filled frame in [head, top), top
 *                                 (the released word + the ring's frames: PacketLog._window) at most head + frames,
 *                                 its default
 *   ring_release(ring, hw, end)   PacketLog.maintain's hand-back: the log's words hw (16 bytes, shared by the processes
 *                                 of a shared log: the head, then the released word) - when no hand-back is under way
 *                                 (released == head), the head moved from its value to end by a compare-and-swap, the
 *                                 status words of the frames claimed, [head, end), zeroed, then released stored = end
 *                                 (release order) -> the head after (nothing zeroed where the head was already at or
 *                                 past end, or another hand-back is under way)
 *   ring_reaches(ring, head, wall_ns, limit[, top])               PacketLog.reaches
 *   ring_segments(ring, head, pattern, base_seq, limit[, top])    PacketLog.segments_since
 *   ring_newest_segment(ring, head, pattern, limit[, top])        PacketLog.newest_segment
 *   ring_cuts(ring, head, pattern, base, limit, n, last_ns, read_size[, top])  PacketLog.cuts
 *   read_setup(read_lag, merged, offset, measure_offset, read_size, search_frames, placement_tol[, prompt_ns])  binds kstamp's process-wide state
 *   to_mono(k)                    kstamp._to_mono (the shared offset list; re-measured by kstamp._measure_offset)
 *   read_one(transport)           KernelStampTransport._one_segment + _hand_over_read(taken=True) + _deliver, up to
 *                                 the protocol's data_received, which the caller makes: the read's bytes (its
 *                                 rx_mono_ns, rx_bound_ns, _rx_off, _segs_in, _empty_mono set, READ_LAG counted),
 *                                 None (nothing waited), True (end of stream) or False (several segments wait, or
 *                                 no counters: the caller's split path); raises OSError where the reference's
 *                                 _recv calls _fatal
 *   read_split(transport)         _on_readable's path when several segments wait: the one-byte peek, the counters
 *                                 read_one kept, READ_LAG, and read_packets with MERGED_READS counted (see pk_read_split)
 *   read_plain(transport)         the read of a transport without the packet log (KernelStampTransport._read_merged's
 *                                 peek and counters, _read_late's prompt read, _hand_over_read(taken=True), _deliver):
 *                                 the read's bytes, None, True (end of stream) or (first, lag, counts, segments) for
 *                                 the reference's _read_late (a late read); readable calls it for such a transport
 *   ring_newest_near(ring, head[, top])  ring_newest, from where this process's last call on that ring found it (the
 *                                 write's look, send's _left_by: a few frames read, not a bisection of the ring)
 *   write_setup(slow_sends, slow_ns[, left_frames])  binds kstamp.SLOW_SENDS, _SLOW_SEND_NS and _LEFT_FRAMES
 *   send(protocol, transport, data)   KernelStampTransport._write into an empty buffer + StampedProtocol.send's
 *                                 bookkeeping (with _sent's _left_by: the packet log showing the write gone asks
 *                                 TCP nothing) -> (t, bound); None: the reference's path (see pk_send)
 *   transport_base(cls)           the class (a subclass of cls: asyncio.Transport) kstamp's transport derives from: its
 *                                 per-read and per-write counts as C long longs under the slots' names, which read_one,
 *                                 read_split, read_packets and send touch in place (and refuse any other object); the
 *                                 packet-log keys _tkey / _pkey as their 12-byte patterns, _iss1 / _irs1 as long longs
 *   ReadLag()                     kstamp.ReadLag's C twin, counted in place by the read paths (kstamp.READ_LAG)
 *   readable(transport)           KernelStampTransport._on_readable as the loop's reader callback: read_one and its
 *                                 outcome handed on, no Python frame of the transport's for the usual read (see
 *                                 pk_readable)
 *   stamped_protocol(fn)          registers conn.StampedProtocol.data_received: readable hands a protocol that keeps it
 *                                 its read as that method would, on_data(data, rx_mono_ns, rx_bound_ns) (stamped_data)
 *
 * ``ring``: any buffer laid out as TPACKET_V2 frames of FRAME bytes (the packet log's mmap, or a bytearray in the
 * tests); its length / FRAME is the number of frames. Every read from it is bounds-checked against its length:
 * what the kernel wrote there is trusted no more than network input. ``pattern``: the 12 bytes PacketLog._pattern
 * builds (source and destination address, source and destination port).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#ifndef SO_TIMESTAMPING
#define SO_TIMESTAMPING 37
#endif

#define FRAME 256
#define PATTERN 12
#define TCP_INFO_LEN 160
#define BYTES_RECEIVED_AT 128
#define NOTSENT_AT 144
#define DATA_SEGS_IN_AT 152
#define TP_STATUS_USER 1u

/* ---- little readers (the caller has checked the bounds) ---------------------------------------------- */
static inline uint32_t rd_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t rd_u16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint16_t rd_be16(const unsigned char *p) { return (uint16_t)(((unsigned)p[0] << 8) | p[1]); }

/* ---- TCP_INFO ---------------------------------------------------------------------------------------- */
/* struct tcp_info into buf; its length, or -1 (the Python: getsockopt raised OSError) */
static int tcp_info(PyObject *sock, unsigned char *buf, int *fail) {
    int fd = PyObject_AsFileDescriptor(sock);
    *fail = 0;
    if (fd < 0) {
        /* sock.getsockopt on a closed socket raises OSError (EBADF): the reference returns None */
        if (PyErr_ExceptionMatches(PyExc_ValueError) || PyErr_ExceptionMatches(PyExc_OSError)) {
            PyErr_Clear();
            return -1;
        }
        *fail = 1;
        return -1;
    }
    socklen_t len = TCP_INFO_LEN;
    memset(buf, 0, TCP_INFO_LEN);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, buf, &len) != 0) return -1;
    return (int)len;
}

static PyObject *pk_tcp_counters(PyObject *self, PyObject *sock) {
    unsigned char buf[TCP_INFO_LEN];
    int fail;
    int len = tcp_info(sock, buf, &fail);
    if (fail) return NULL;
    if (len < DATA_SEGS_IN_AT + 4) Py_RETURN_NONE;
    uint32_t segs = rd_u32(buf + DATA_SEGS_IN_AT);
    uint64_t got;
    memcpy(&got, buf + BYTES_RECEIVED_AT, 8);
    return Py_BuildValue("(kK)", (unsigned long)segs, (unsigned long long)got);
}

static PyObject *pk_tcp_notsent(PyObject *self, PyObject *sock) {
    unsigned char buf[TCP_INFO_LEN];
    int fail;
    int len = tcp_info(sock, buf, &fail);
    if (fail) return NULL;
    if (len < NOTSENT_AT + 4) Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(rd_u32(buf + NOTSENT_AT));
}

/* ---- recvmsg with the receive stamp ------------------------------------------------------------------ */
/* recvmsg on fd into buf: bytes read (>= 0) and *k the software receive stamp (0: none); -1 with errno set, or -2
 * with a Python exception set (a signal handler raised during EINTR) */
static Py_ssize_t recv_stamp(int fd, void *buf, size_t len, int flags, long long *k) {
    union {
        struct cmsghdr align;
        unsigned char raw[CMSG_SPACE(3 * 2 * sizeof(int64_t))];
    } control;
    struct iovec iov;
    struct msghdr msg;
    ssize_t n;
    for (;;) {
        iov.iov_base = buf;
        iov.iov_len = len;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.raw;
        msg.msg_controllen = sizeof control.raw;
        /* never blocks (the GIL is held): kstamp's sockets are non-blocking, and the reference passes it too */
        n = recvmsg(fd, &msg, flags | MSG_DONTWAIT);
        if (n >= 0 || errno != EINTR) break;
        if (PyErr_CheckSignals() != 0) return -2;
    }
    if (n < 0) return -1;
    *k = 0;
    if (msg.msg_controllen > sizeof control.raw) msg.msg_controllen = sizeof control.raw;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        size_t at = (size_t)((unsigned char *)c - control.raw);
        size_t room = msg.msg_controllen - at; /* what of this message is in the buffer */
        size_t clen = c->cmsg_len < room ? c->cmsg_len : room;
        if (clen < CMSG_LEN(0)) break;
        size_t dlen = clen - CMSG_LEN(0);
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING && dlen >= 2 * sizeof(int64_t)) {
            int64_t ts[2];
            memcpy(ts, CMSG_DATA(c), sizeof ts);
            *k = (long long)ts[0] * 1000000000LL + (long long)ts[1];
            break;
        }
    }
    return (Py_ssize_t)n;
}

/* the socket's descriptor, or -1 with OSError(EBADF) set for a closed one (what recvmsg_into raises) */
static int sock_fd(PyObject *sock) {
    int fd = PyObject_AsFileDescriptor(sock);
    if (fd < 0) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError)) return -1;
        PyErr_Clear(); /* a closed socket (fileno -1): recvmsg_into raises OSError(EBADF) */
        errno = EBADF;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return fd;
}

static PyObject *pk_recv(PyObject *self, PyObject *args) {
    PyObject *sock;
    Py_buffer view;
    int flags;
    if (!PyArg_ParseTuple(args, "Ow*i", &sock, &view, &flags)) return NULL;
    int fd = sock_fd(sock);
    if (fd < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    long long k = 0;
    Py_ssize_t n = recv_stamp(fd, view.buf, (size_t)view.len, flags, &k);
    PyBuffer_Release(&view);
    if (n == -2) return NULL;
    if (n < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(nL)", n, k);
}

/* ---- the ring ---------------------------------------------------------------------------------------- */
typedef struct {
    Py_buffer view;
    const unsigned char *p;
    Py_ssize_t len;
    long long frames;
} ring_t;

static int ring_get(PyObject *obj, ring_t *r, int writable) {
    if (PyObject_GetBuffer(obj, &r->view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) return -1;
    r->p = (const unsigned char *)r->view.buf;
    r->len = r->view.len;
    r->frames = (long long)(r->len / FRAME);
    if (r->frames <= 0) {
        PyBuffer_Release(&r->view);
        PyErr_SetString(PyExc_ValueError, "ring: shorter than one frame");
        return -1;
    }
    return 0;
}

static inline long long pymod(long long a, long long b) {
    long long m = a % b;
    return m < 0 ? m + b : m;
}
static inline Py_ssize_t frame_at(const ring_t *r, long long frame) { return (Py_ssize_t)(pymod(frame, r->frames) * FRAME); }
static inline int filled(const ring_t *r, long long frame) { return (rd_u32(r->p + frame_at(r, frame)) & TP_STATUS_USER) != 0; }

/* one past the newest filled frame in [head, top) (top: at most head + frames, see PacketLog._newest_from) */
static long long newest(const ring_t *r, long long head, long long top) {
    long long lo = head, hi = head + r->frames;
    if (top < hi) hi = top;
    if (hi <= lo || !filled(r, lo)) return lo;
    while (hi - lo > 1) {
        long long mid = lo + ((hi - lo) >> 1);
        if (filled(r, mid)) lo = mid;
        else hi = mid;
    }
    return hi;
}

static PyObject *pk_ring_newest(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long head, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OL|L", &obj, &head, &top)) return NULL;
    if (ring_get(obj, &r, 0) != 0) return NULL;
    long long out = newest(&r, head, top);
    PyBuffer_Release(&r.view);
    return PyLong_FromLongLong(out);
}

/* the words of a packet log (PacketLog._hwv: 16 bytes, aligned; word[0] the head, word[1] the released word): its
 * buffer held in *view, the words at *word */
static int head_word(PyObject *obj, Py_buffer *view, long long **word, int writable) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) return -1;
    if (view->len < 16 || ((uintptr_t)view->buf & 7) != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "head words: 16 aligned bytes");
        return -1;
    }
    *word = (long long *)view->buf;
    return 0;
}

static PyObject *pk_ring_release(PyObject *self, PyObject *args) {
    PyObject *obj, *hw;
    long long end, *word;
    ring_t r;
    Py_buffer hv;
    if (!PyArg_ParseTuple(args, "OOL", &obj, &hw, &end)) return NULL;
    if (ring_get(obj, &r, 1) != 0) return NULL;
    if (head_word(hw, &hv, &word, 1) != 0) {
        PyBuffer_Release(&r.view);
        return NULL;
    }
    /* claim [head, end) when no hand-back is under way (released == head; released read first: it never passes the
     * head): only the process whose swap moved the head zeroes those frames (a stale end, or a swap lost: none), then
     * publishes released = end after the zeroing (a search's window ends at released + frames: PacketLog._window) */
    long long released = __atomic_load_n(word + 1, __ATOMIC_ACQUIRE);
    long long head = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    long long after = head;
    if (released == head && head < end && __atomic_compare_exchange_n(word, &head, end, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        unsigned char *w = (unsigned char *)r.view.buf;
        for (; head < end; head++) __atomic_store_n((uint32_t *)(w + frame_at(&r, head)), 0u, __ATOMIC_RELEASE);
        __atomic_store_n(word + 1, end, __ATOMIC_RELEASE);
        after = end;
    } else if (head > after) {
        after = head; /* (the swap lost: the head another process moved it to) */
    }
    PyBuffer_Release(&hv);
    PyBuffer_Release(&r.view);
    return PyLong_FromLongLong(after);
}

/* PacketLog.reaches from head: whether the oldest frame a search limit frames back from the newest reads (still the
 * user's: else not there) came no later than wall */
static int reaches_from(const ring_t *r, long long head, long long top, long long wall, long long limit) {
    long long nw = newest(r, head, top);
    long long oldest = nw - limit > head ? nw - limit : head;
    if (nw <= oldest) return 0;
    const unsigned char *f = r->p + frame_at(r, oldest);
    if (!(rd_u32(f) & TP_STATUS_USER)) return 0;
    return (long long)rd_u32(f + 16) * 1000000000LL + (long long)rd_u32(f + 20) <= wall;
}

static PyObject *pk_ring_reaches(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long head, wall, limit, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OLLL|L", &obj, &head, &wall, &limit, &top)) return NULL;
    if (ring_get(obj, &r, 0) != 0) return NULL;
    int out = reaches_from(&r, head, top, wall, limit);
    PyBuffer_Release(&r.view);
    return PyBool_FromLong(out);
}

typedef struct {
    uint32_t seq, end;
    long long wall;
} seg_t;

/* PacketLog._segment_at: 1 and *s for a data segment, 0 for none (nor where the frame is not the user's before or
 * after its fields are read, or its stamp changed meanwhile: handed back by another process of a shared log, and
 * perhaps filled again by the kernel, under the read) */
static int segment_at(const ring_t *r, Py_ssize_t off, Py_ssize_t ip, seg_t *s) {
    const unsigned char *f = r->p + off;
    uint32_t status = __atomic_load_n((const uint32_t *)f, __ATOMIC_ACQUIRE);
    if (!(status & TP_STATUS_USER)) return 0;
    uint32_t sec = rd_u32(f + 16), nsec = rd_u32(f + 20);
    if (rd_u32(f + 8) < 40) return 0; /* tp_snaplen */
    if (ip < 0 || ip + 20 > r->len) return 0;
    const unsigned char *iph = r->p + ip;
    Py_ssize_t ihl = (Py_ssize_t)(iph[0] & 0xF) * 4;
    long total = rd_be16(iph + 2);
    if (ip + ihl + 13 > r->len) return 0; /* (the TCP header's fields read: past the ring's end, none) */
    const unsigned char *tcp = iph + ihl;
    uint32_t seq = rd_be32(tcp + 4);
    long payload = total - (long)ihl - (long)(tcp[12] >> 4) * 4;
    if (payload <= 0) return 0;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n((const uint32_t *)f, __ATOMIC_RELAXED) != status || rd_u32(f + 16) != sec || rd_u32(f + 20) != nsec)
        return 0; /* (handed back, or filled again, under the read) */
    s->seq = seq;
    s->end = (uint32_t)(seq + (uint32_t)payload);
    s->wall = (long long)sec * 1000000000LL + (long long)nsec;
    return 1;
}

/* PacketLog._matches, one step at a time: frames holding a segment toward the pattern, newest first.
 * The reference finds them with mmap.rfind; a frame is a hit there exactly when the pattern sits at its own
 * IP header + 12 (net + 12 inside the frame) and ends before the search's current end (the span's end, or
 * the previous hit's frame), which is what this checks frame by frame. */
typedef struct {
    const ring_t *r;
    const unsigned char *pat;
    long long span[2][2]; /* [first, last) frames of each span, newest first */
    int nspans, si;
    long long frame;  /* next frame to look at in span si (counting down), */
    Py_ssize_t end;   /* the search's end in bytes */
} matcher_t;

static int matcher_init_at(matcher_t *m, const ring_t *r, const unsigned char *pat, long long head, long long nw, long long limit);

static int matcher_init(matcher_t *m, const ring_t *r, const unsigned char *pat, long long head, long long top, long long limit) {
    return matcher_init_at(m, r, pat, head, newest(r, head, top), limit);
}

/* matcher_init from the newest frame nw (one past it) found by the caller */
static int matcher_init_at(matcher_t *m, const ring_t *r, const unsigned char *pat, long long head, long long nw, long long limit) {
    long long oldest = nw - limit > head ? nw - limit : head;
    m->r = r;
    m->pat = pat;
    m->nspans = 0;
    m->si = 0;
    if (nw <= oldest) return 0;
    long long hi = pymod(nw, r->frames), lo = pymod(oldest, r->frames);
    if (lo < hi) {
        m->span[0][0] = lo; m->span[0][1] = hi;
        m->nspans = 1;
    } else {
        m->span[0][0] = 0; m->span[0][1] = hi;
        m->span[1][0] = lo; m->span[1][1] = r->frames;
        m->nspans = 2;
    }
    m->frame = m->span[0][1] - 1;
    m->end = (Py_ssize_t)(m->span[0][1] * FRAME);
    return 0;
}

/* the next hit: 1 with *off, *ip; 0 when done */
static int matcher_next(matcher_t *m, Py_ssize_t *off, Py_ssize_t *ip) {
    while (m->si < m->nspans) {
        long long first = m->span[m->si][0];
        for (; m->frame >= first; m->frame--) {
            Py_ssize_t o = (Py_ssize_t)(m->frame * FRAME);
            unsigned net = rd_u16(m->r->p + o + 14);
            Py_ssize_t at = o + (Py_ssize_t)net + 12;
            if (net + 12 >= FRAME || at + PATTERN > m->end) continue;
            if (memcmp(m->r->p + at, m->pat, PATTERN) != 0) continue;
            *off = o;
            *ip = o + net;
            m->end = o;
            m->frame--;
            return 1;
        }
        m->si++;
        if (m->si < m->nspans) {
            m->frame = m->span[m->si][1] - 1;
            m->end = (Py_ssize_t)(m->span[m->si][1] * FRAME);
        }
    }
    return 0;
}

static int parse_ring_pattern(PyObject *obj, Py_buffer *pat, ring_t *r) {
    if (pat->len != PATTERN) {
        PyErr_SetString(PyExc_ValueError, "pattern: 12 bytes (addresses and ports)");
        return -1;
    }
    return ring_get(obj, r, 0);
}

/* segments toward the pattern holding base or bytes after it (every copy: the search stops at one ending at or
 * before base, not at the newest holding base, which may be a retransmission), oldest first, into a malloc'd array */
static int collect(const ring_t *r, const unsigned char *pat, long long head, long long top, uint32_t base, long long limit, seg_t **out,
                   Py_ssize_t *count) {
    matcher_t m;
    Py_ssize_t cap = 0, n = 0, off, ip;
    seg_t *segs = NULL, s;
    matcher_init(&m, r, pat, head, top, limit);
    while (matcher_next(&m, &off, &ip)) {
        if (!segment_at(r, off, ip, &s)) continue;
        uint32_t rel_end = s.end - base;
        if (rel_end == 0 || rel_end > 0x7FFFFFFFu) break;
        if (n == cap) {
            Py_ssize_t ncap = cap ? cap * 2 : 16;
            seg_t *grown = PyMem_Realloc(segs, (size_t)ncap * sizeof(seg_t));
            if (grown == NULL) {
                PyMem_Free(segs);
                PyErr_NoMemory();
                return -1;
            }
            segs = grown;
            cap = ncap;
        }
        segs[n++] = s; /* (one holding base too: an older copy of it, the first to arrive, may follow) */
    }
    for (Py_ssize_t i = 0; i < n / 2; i++) { /* oldest first */
        seg_t t = segs[i];
        segs[i] = segs[n - 1 - i];
        segs[n - 1 - i] = t;
    }
    *out = segs;
    *count = n;
    return 0;
}

static PyObject *seg_tuple(const seg_t *s) {
    return Py_BuildValue("(kkL)", (unsigned long)s->seq, (unsigned long)s->end, s->wall);
}

static PyObject *pk_ring_segments(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_buffer pat;
    long long head, base, limit, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OLy*LL|L", &obj, &head, &pat, &base, &limit, &top)) return NULL;
    if (parse_ring_pattern(obj, &pat, &r) != 0) {
        PyBuffer_Release(&pat);
        return NULL;
    }
    seg_t *segs = NULL;
    Py_ssize_t n = 0;
    int rc = collect(&r, (const unsigned char *)pat.buf, head, top, (uint32_t)base, limit, &segs, &n);
    PyBuffer_Release(&r.view);
    PyBuffer_Release(&pat);
    if (rc != 0) return NULL;
    PyObject *list = PyList_New(n);
    if (list == NULL) {
        PyMem_Free(segs);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = seg_tuple(&segs[i]);
        if (t == NULL) {
            Py_DECREF(list);
            PyMem_Free(segs);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    PyMem_Free(segs);
    return list;
}

static PyObject *pk_ring_newest_segment(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_buffer pat;
    long long head, limit, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OLy*L|L", &obj, &head, &pat, &limit, &top)) return NULL;
    if (parse_ring_pattern(obj, &pat, &r) != 0) {
        PyBuffer_Release(&pat);
        return NULL;
    }
    matcher_t m;
    Py_ssize_t off, ip;
    seg_t s;
    int found = 0;
    matcher_init(&m, &r, (const unsigned char *)pat.buf, head, top, limit);
    while (matcher_next(&m, &off, &ip)) {
        if (segment_at(&r, off, ip, &s)) {
            found = 1;
            break;
        }
    }
    PyBuffer_Release(&r.view);
    PyBuffer_Release(&pat);
    if (!found) Py_RETURN_NONE;
    return seg_tuple(&s);
}

/* PacketLog.cuts over the collected segments: the cuts into out (room for count + 1), their number in *nc and
 * *unlogged; or how they could not be placed (CUTS_GAP: a segment missed, *why_a bytes in; CUTS_PAST: a segment
 * ending *why_a bytes past the waiting bytes; CUTS_NONE: none of them in the log) */
enum { CUTS_PLACED, CUTS_GAP, CUTS_PAST, CUTS_NONE };
typedef struct {
    long long end, wall;
} cut_t;

static int place_cuts(const seg_t *segs, Py_ssize_t count, uint32_t base, long long n, long long last_ns, long long read_size,
                      cut_t *out, Py_ssize_t *nc, int *unlogged, long long *why_a) {
    long long pos = 0;
    Py_ssize_t c = 0;
    *unlogged = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        long long rel_end = (long long)(uint32_t)(segs[i].end - base);
        if (rel_end <= pos) continue; /* a copy of bytes already placed */
        long long rel_start = (long long)(uint32_t)(segs[i].seq - base);
        if (pos < rel_start && rel_start <= 0x7FFFFFFFLL) {
            *why_a = rel_start - pos;
            return CUTS_GAP;
        }
        if (rel_end >= n) {
            if (rel_end > n && n < read_size) {
                *why_a = rel_end - n;
                return CUTS_PAST;
            }
            out[c].end = n;
            out[c++].wall = segs[i].wall;
            *nc = c;
            return CUTS_PLACED;
        }
        out[c].end = rel_end;
        out[c++].wall = segs[i].wall;
        pos = rel_end;
    }
    if (c == 0) return CUTS_NONE;
    out[c].end = n;
    out[c++].wall = last_ns;
    *nc = c;
    *unlogged = 1;
    return CUTS_PLACED;
}

/* PacketLog.cuts: (cuts, unlogged_tail, None) or (None, False, why) */
static PyObject *pk_ring_cuts(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_buffer pat;
    long long head, base_ll, limit, n, last_ns, read_size, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OLy*LLLLL|L", &obj, &head, &pat, &base_ll, &limit, &n, &last_ns, &read_size, &top)) return NULL;
    if (parse_ring_pattern(obj, &pat, &r) != 0) {
        PyBuffer_Release(&pat);
        return NULL;
    }
    seg_t *segs = NULL;
    Py_ssize_t count = 0, nc = 0;
    uint32_t base = (uint32_t)base_ll;
    int rc = collect(&r, (const unsigned char *)pat.buf, head, top, base, limit, &segs, &count);
    PyBuffer_Release(&r.view);
    PyBuffer_Release(&pat);
    if (rc != 0) return NULL;
    cut_t *cuts = PyMem_Malloc((size_t)(count + 1) * sizeof(cut_t));
    if (cuts == NULL) {
        PyMem_Free(segs);
        return PyErr_NoMemory();
    }
    int unlogged = 0;
    long long why_a = 0;
    int how = place_cuts(segs, count, base, n, last_ns, read_size, cuts, &nc, &unlogged, &why_a);
    PyMem_Free(segs);
    PyObject *out = NULL, *why = NULL;
    if (how == CUTS_PLACED) {
        PyObject *list = PyList_New(nc);
        if (list == NULL) goto done;
        for (Py_ssize_t i = 0; i < nc; i++) {
            PyObject *item = Py_BuildValue("(LL)", cuts[i].end, cuts[i].wall);
            if (item == NULL) {
                Py_DECREF(list);
                goto done;
            }
            PyList_SET_ITEM(list, i, item);
        }
        out = Py_BuildValue("(NOO)", list, unlogged ? Py_True : Py_False, Py_None);
        goto done;
    }
    if (how == CUTS_GAP)
        why = PyUnicode_FromFormat("packet path: %lld waiting bytes, the log's segments start %lld bytes in (%zd found)", n, why_a, count);
    else if (how == CUTS_PAST)
        why = PyUnicode_FromFormat("packet path: the log's segment ends %lld bytes past the waiting bytes", why_a);
    else
        why = PyUnicode_FromFormat("packet path: %lld waiting bytes, no segment of them in the log", n);
    if (why != NULL) out = Py_BuildValue("(OON)", Py_None, Py_False, why);
done:
    PyMem_Free(cuts);
    return out;
}

/* ---- the transport's per-read and per-write state, held natively ---------------------------------------------
 * transport_base(asyncio.Transport) -> TransportState: a subclass of the given class whose instances hold
 * KernelStampTransport's counters as C long longs after the base's own layout, exposed under the names the Python
 * reference uses (_segs_in, _rx_off, _empty_mono, rx_bound_ns, _tx_off, writes, last_write_bound_ns: int members;
 * rx_mono_ns, last_write_mono_ns: an int or None). kstamp's transport derives from it where this module is built (its
 * Python then reads and writes these through the descriptors, as it would its own slots), so the C read and write
 * paths touch the counters in place instead of making an int object per value (aset / get_ll were ~4 % of a tap's
 * CPU in the 10k-stream soak). Created once per process; the layout offset is found at run time from the base. */
typedef struct {
    long long segs_in, rx_off, empty_mono, rx_mono_ns, rx_bound_ns, tx_off, writes, last_write_mono_ns, last_write_bound_ns;
    long long split_segs, split_got; /* _split_counts: (tcpi_data_segs_in, tcpi_bytes_received) when split_set */
    char rx_set, lw_set, split_set; /* rx_mono_ns / last_write_mono_ns / _split_counts hold a value (else None) */
    char closed_in; /* read_one's TCP_INFO said TCP_CLOSE (a reset came in): the read may not be the loop's last report */
    /* _iss1 / _irs1 (an int or None: iss1_set / irs1_set) and _tkey / _pkey (a connection key or None: tkey_set /
     * pkey_set), the key held as its 12-byte pattern (key_pattern): the send's packet-log look (left_by) and the split
     * read's read them here, not through a tuple of four objects and an int object per read or write */
    long long iss1, irs1;
    char iss1_set, irs1_set, tkey_set, pkey_set;
    unsigned char tkey_pat[12], pkey_pat[12];
} kstate_t;

static PyTypeObject *g_state_type;
static Py_ssize_t g_state_off;

/* the state of an instance of TransportState (or a subclass), else NULL (no exception set) */
static inline kstate_t *kstate(PyObject *tr) {
    if (g_state_type == NULL || !PyObject_TypeCheck(tr, g_state_type)) return NULL;
    return (kstate_t *)((char *)tr + g_state_off);
}

/* the transport's state, or NULL with TypeError: the C read and write paths serve only kstamp's transport */
static kstate_t *kstate_or_fail(PyObject *tr) {
    kstate_t *st = kstate(tr);
    if (st == NULL) PyErr_Format(PyExc_TypeError, "a transport derived from _pktring.transport_base(), not %.100s", Py_TYPE(tr)->tp_name);
    return st;
}

static PyObject *opt_get(long long v, char set) { return set ? PyLong_FromLongLong(v) : Py_NewRef(Py_None); }

static int opt_set(PyObject *v, long long *slot, char *set, const char *name) {
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "can't delete %s", name);
        return -1;
    }
    if (v == Py_None) {
        *set = 0;
        return 0;
    }
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%s: an int or None, not %.100s", name, Py_TYPE(v)->tp_name);
        return -1;
    }
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) return -1;
    *slot = x;
    *set = 1;
    return 0;
}

/* rx_mono_ns and last_write_mono_ns: an int or None, one getter and setter for both (the closure says which) */
typedef struct {
    size_t value, set; /* offsets in kstate_t of the long long and of its "holds a value" flag */
    const char *name;
} opt_field_t;
static const opt_field_t rx_mono_field = {offsetof(kstate_t, rx_mono_ns), offsetof(kstate_t, rx_set), "rx_mono_ns"};
static const opt_field_t lw_mono_field = {offsetof(kstate_t, last_write_mono_ns), offsetof(kstate_t, lw_set), "last_write_mono_ns"};

static PyObject *st_get_opt(PyObject *o, void *closure) {
    const opt_field_t *f = closure;
    kstate_t *st = kstate_or_fail(o);
    return st == NULL ? NULL : opt_get(*(long long *)((char *)st + f->value), *((char *)st + f->set));
}
static int st_set_opt(PyObject *o, PyObject *v, void *closure) {
    const opt_field_t *f = closure;
    kstate_t *st = kstate_or_fail(o);
    return st == NULL ? -1 : opt_set(v, (long long *)((char *)st + f->value), (char *)st + f->set, f->name);
}

static const opt_field_t iss1_field = {offsetof(kstate_t, iss1), offsetof(kstate_t, iss1_set), "_iss1"};
static const opt_field_t irs1_field = {offsetof(kstate_t, irs1), offsetof(kstate_t, irs1_set), "_irs1"};

/* _tkey and _pkey: None or a connection key (bytes(4), port, bytes(4), port), held as its pattern (the closure:
 * key_field_t); the getter makes the tuple again (equal to the one set), the setter takes what key_pattern takes */
static int key_pattern(PyObject *key, unsigned char *pat);
typedef struct {
    size_t pat, set;
    const char *name;
} key_field_t;
static const key_field_t tkey_field = {offsetof(kstate_t, tkey_pat), offsetof(kstate_t, tkey_set), "_tkey"};
static const key_field_t pkey_field = {offsetof(kstate_t, pkey_pat), offsetof(kstate_t, pkey_set), "_pkey"};

static PyObject *st_get_key(PyObject *o, void *closure) {
    const key_field_t *f = closure;
    kstate_t *st = kstate_or_fail(o);
    if (st == NULL) return NULL;
    if (!*((char *)st + f->set)) Py_RETURN_NONE;
    const unsigned char *p = (const unsigned char *)st + f->pat;
    return Py_BuildValue("(y#iy#i)", (const char *)p, (Py_ssize_t)4, (p[8] << 8) | p[9], (const char *)p + 4, (Py_ssize_t)4,
                         (p[10] << 8) | p[11]);
}
static int st_set_key(PyObject *o, PyObject *v, void *closure) {
    const key_field_t *f = closure;
    kstate_t *st = kstate_or_fail(o);
    if (st == NULL) return -1;
    if (v == NULL) {
        PyErr_Format(PyExc_TypeError, "can't delete %s", f->name);
        return -1;
    }
    if (v == Py_None) {
        *((char *)st + f->set) = 0;
        return 0;
    }
    unsigned char pat[12];
    if (key_pattern(v, pat) != 0) return -1;
    memcpy((unsigned char *)st + f->pat, pat, sizeof pat);
    *((char *)st + f->set) = 1;
    return 0;
}

static PyObject *st_get_split(PyObject *o, void *Py_UNUSED(c)) {
    kstate_t *st = kstate_or_fail(o);
    if (st == NULL) return NULL;
    if (!st->split_set) Py_RETURN_NONE;
    return Py_BuildValue("(kK)", (unsigned long)st->split_segs, (unsigned long long)st->split_got);
}
static int st_set_split(PyObject *o, PyObject *v, void *Py_UNUSED(c)) {
    kstate_t *st = kstate_or_fail(o);
    if (st == NULL) return -1;
    if (v == NULL) {
        PyErr_SetString(PyExc_TypeError, "can't delete _split_counts");
        return -1;
    }
    if (v == Py_None) {
        st->split_set = 0;
        return 0;
    }
    long long a, b;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != 2 || !PyLong_Check(PyTuple_GET_ITEM(v, 0)) || !PyLong_Check(PyTuple_GET_ITEM(v, 1))) {
        PyErr_SetString(PyExc_TypeError, "_split_counts: None or (segments, bytes)");
        return -1;
    }
    a = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 0));
    if (a == -1 && PyErr_Occurred()) return -1;
    b = PyLong_AsLongLong(PyTuple_GET_ITEM(v, 1));
    if (b == -1 && PyErr_Occurred()) return -1;
    if (a < 0 || a > 0xFFFFFFFFLL || b < 0) {
        PyErr_SetString(PyExc_ValueError, "_split_counts: TCP's counters (a u32 and a u64)");
        return -1;
    }
    st->split_segs = a;
    st->split_got = b;
    st->split_set = 1;
    return 0;
}

static PyGetSetDef state_getset[] = {
    {"_split_counts", st_get_split, st_set_split, "the counters read_one read when several segments waited, or None", NULL},
    {"rx_mono_ns", st_get_opt, st_set_opt, "kernel stamp (mono_ns) of the read being delivered, or None", (void *)&rx_mono_field},
    {"last_write_mono_ns", st_get_opt, st_set_opt, "when the latest write's bytes left (mono_ns), or None", (void *)&lw_mono_field},
    {"_iss1", st_get_opt, st_set_opt, "TCP sequence number of our stream offset 0, or None", (void *)&iss1_field},
    {"_irs1", st_get_opt, st_set_opt, "TCP sequence number of the peer's stream offset 0, or None", (void *)&irs1_field},
    {"_tkey", st_get_key, st_set_key, "(local ip, port, peer ip, port): our own segments' key, or None", (void *)&tkey_field},
    {"_pkey", st_get_key, st_set_key, "(peer ip, port, local ip, port): the peer's segments' key, or None", (void *)&pkey_field},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyMemberDef state_members[8];

static PyObject *pk_transport_base(PyObject *self, PyObject *base) {
    if (!PyType_Check(base)) {
        PyErr_SetString(PyExc_TypeError, "transport_base(cls): a class");
        return NULL;
    }
    if (g_state_type != NULL) {
        if (g_state_type->tp_base != (PyTypeObject *)base) {
            PyErr_SetString(PyExc_ValueError, "transport_base: made once per process, on one base class");
            return NULL;
        }
        return Py_NewRef((PyObject *)g_state_type);
    }
    PyTypeObject *b = (PyTypeObject *)base;
    if (b->tp_itemsize != 0 || b->tp_dictoffset != 0 || b->tp_weaklistoffset != 0) {
        PyErr_SetString(PyExc_TypeError, "transport_base: a base with a fixed layout (__slots__, no __dict__)");
        return NULL;
    }
    Py_ssize_t off = (b->tp_basicsize + 7) & ~(Py_ssize_t)7;
    struct {
        const char *name;
        size_t at;
        const char *doc;
    } fields[] = {
        {"_segs_in", offsetof(kstate_t, segs_in), "tcpi_data_segs_in at the last read"},
        {"_rx_off", offsetof(kstate_t, rx_off), "stream offset of the next byte to read"},
        {"_empty_mono", offsetof(kstate_t, empty_mono), "the last moment the receive queue was seen empty"},
        {"rx_bound_ns", offsetof(kstate_t, rx_bound_ns), "the read's bytes arrived at most this much before rx_mono_ns"},
        {"_tx_off", offsetof(kstate_t, tx_off), "bytes handed to the kernel so far"},
        {"writes", offsetof(kstate_t, writes), "writes stamped"},
        {"last_write_bound_ns", offsetof(kstate_t, last_write_bound_ns), "the latest write's bytes left at most this much later"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        state_members[i] = (PyMemberDef){fields[i].name, T_LONGLONG, off + (Py_ssize_t)fields[i].at, 0, fields[i].doc};
    state_members[sizeof fields / sizeof fields[0]] = (PyMemberDef){NULL, 0, 0, 0, NULL};
    PyType_Slot slots[] = {
        {Py_tp_members, state_members},
        {Py_tp_getset, state_getset},
        {Py_tp_doc, "KernelStampTransport's per-read and per-write counts, held as C long longs (deltatap/net/_pktring.c)"},
        {0, NULL},
    };
    PyType_Spec spec = {"deltatap.net._pktring.TransportState", (int)(off + (Py_ssize_t)sizeof(kstate_t)), 0,
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
    PyObject *bases = PyTuple_Pack(1, base);
    if (bases == NULL) return NULL;
    PyObject *t = PyType_FromSpecWithBases(&spec, bases);
    Py_DECREF(bases);
    if (t == NULL) return NULL;
    g_state_type = (PyTypeObject *)Py_NewRef(t);
    g_state_off = off;
    return t;
}

/* kstamp.ReadLag's C twin (the same buckets, count and total_ns; add(ns)): what the read paths count into where built
 * (kstamp.READ_LAG is one of these then; /metrics reads it through the same attributes) */
#define LAG_BUCKETS 48
typedef struct {
    PyObject_HEAD
    long long buckets[LAG_BUCKETS];
    long long count;
    __int128 total_ns; /* (a sum of long longs: exact, as the reference's int) */
} lag_t;

static PyTypeObject LagType;

static inline void lag_count(lag_t *l, long long ns) {
    if (ns < 0) ns = 0;
    int bucket = ns ? 64 - __builtin_clzll((unsigned long long)ns) : 0;
    if (bucket > LAG_BUCKETS - 1) bucket = LAG_BUCKETS - 1;
    l->buckets[bucket]++;
    l->count++;
    l->total_ns += ns;
}

static PyObject *lag_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (!_PyArg_NoPositional("ReadLag", args) || !_PyArg_NoKeywords("ReadLag", kw)) return NULL;
    return type->tp_alloc(type, 0); /* (zeroed) */
}

static PyObject *lag_add_method(PyObject *self, PyObject *arg) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "ReadLag.add: an int, not %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    int overflow = 0;
    long long ns = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (ns == -1 && PyErr_Occurred()) return NULL;
    if (overflow) { /* (beyond 2**63: the last bucket, as the reference's min(bit_length, 47); its total as a long long) */
        PyErr_SetString(PyExc_OverflowError, "ReadLag.add: a lag beyond 2**63 ns");
        return NULL;
    }
    lag_count((lag_t *)self, ns);
    Py_RETURN_NONE;
}

static PyObject *lag_buckets(PyObject *self, void *Py_UNUSED(c)) {
    lag_t *l = (lag_t *)self;
    PyObject *list = PyList_New(LAG_BUCKETS);
    if (list == NULL) return NULL;
    for (int i = 0; i < LAG_BUCKETS; i++) {
        PyObject *v = PyLong_FromLongLong(l->buckets[i]);
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, v);
    }
    return list;
}

static PyMethodDef lag_methods[] = {
    {"add", lag_add_method, METH_O, "count one read's lag (ns)"},
    {NULL, NULL, 0, NULL},
};
static PyObject *lag_total(PyObject *self, void *Py_UNUSED(c)) {
    __int128 v = ((lag_t *)self)->total_ns;
    if (v >= LLONG_MIN && v <= LLONG_MAX) return PyLong_FromLongLong((long long)v);
    unsigned char raw[16];
    memcpy(raw, &v, 16);
    return _PyLong_FromByteArray(raw, 16, 1, 1); /* (little-endian, signed) */
}

static PyMemberDef lag_members[] = {
    {"count", T_LONGLONG, offsetof(lag_t, count), READONLY, "reads counted"},
    {NULL, 0, 0, 0, NULL},
};
static PyGetSetDef lag_getset[] = {
    {"buckets", lag_buckets, NULL, "the 48 power-of-two buckets' counts (a new list)", NULL},
    {"total_ns", lag_total, NULL, "the counted lags' sum (ns)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};
static PyTypeObject LagType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "deltatap.net._pktring.ReadLag",
    .tp_basicsize = sizeof(lag_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "kstamp.ReadLag's C twin: how late this process reads, in power-of-two buckets of ns",
    .tp_new = lag_new,
    .tp_methods = lag_methods,
    .tp_members = lag_members,
    .tp_getset = lag_getset,
};

/* ---- the stamped read (kstamp.KernelStampTransport's fast path) ------------------------------------- */
/* kstamp's process-wide state, bound once by read_setup: READ_LAG, the _offset list, _measure_offset, the read
 * buffer's size (the reference's shared view: a read that fills it may leave bytes waiting) and the packet log's
 * maintenance period. The buffer is this module's own (every read is copied out before read_one returns, with the
 * GIL held throughout, as the reference's per-thread view). */
static PyObject *g_read_lag, *g_merged, *g_offset, *g_measure;
static unsigned char *g_buf;
static Py_ssize_t g_buf_len;
static long long g_search_frames, g_placement_tol;
static long long g_prompt_ns = -1; /* kstamp._PROMPT_NS (read_setup; -1: not given, read_plain leaves every read to the reference) */
static PyObject *s_sock, *s_plog, *s_due_ns, *s_due, *s_protocol, *s_cuts_received, *s_mv, *s_hw, *s_pkey,
    *s_irs1, *s_anchor, *s_unlogged_tail, *s_out_of_reach;
/* the stamped write's (write_setup: kstamp.SLOW_SENDS, _SLOW_SEND_NS) and the attributes it reads and sets */
static PyObject *g_slow_sends;
static long long g_slow_ns, g_left_frames; /* (g_left_frames: kstamp._LEFT_FRAMES; 0: _left_by's look not set up) */
static PyObject *s_iss1, *s_tkey, *s_tx_anchor;
static PyObject *s_eof, *s_lost, *s_wbuf, *s_unplaced_write, *s_lazy_placement, *s_restamp_write, *s_sent, *s_fatal,
    *s_last_write_mono, *s_last_write_bound, *s_unplaced, *s_bounded, *s_packets, *s_fallback;

#define OFFSET_EVERY_NS 200000000LL
#define MAX_AGE_NS (60LL * 1000000000LL)

static inline long long clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}
/* time.perf_counter_ns (kstamp._mono) and time.time_ns (kstamp._wall) on Linux */
static inline long long mono_now(void) { return clock_ns(CLOCK_MONOTONIC); }
static inline long long wall_now(void) { return clock_ns(CLOCK_REALTIME); }

static PyObject *pk_read_setup(PyObject *self, PyObject *args) {
    PyObject *lag, *merged, *offset, *measure;
    Py_ssize_t size;
    long long frames, tol, prompt = g_prompt_ns;
    if (!PyArg_ParseTuple(args, "O!O!O!OnLL|L", &LagType, &lag, &PyDict_Type, &merged, &PyList_Type, &offset, &measure, &size, &frames,
                          &tol, &prompt))
        return NULL;
    if (PyList_GET_SIZE(offset) != 3 || !PyCallable_Check(measure) || size <= 0) {
        PyErr_SetString(PyExc_ValueError, "read_setup: a 3-item offset list, a callable and a positive read size");
        return NULL;
    }
    unsigned char *buf = PyMem_RawMalloc((size_t)size);
    if (buf == NULL) return PyErr_NoMemory();
    PyMem_RawFree(g_buf);
    g_buf = buf;
    g_buf_len = size;
    Py_INCREF(lag);
    Py_INCREF(merged);
    Py_INCREF(offset);
    Py_INCREF(measure);
    Py_XSETREF(g_read_lag, lag);
    Py_XSETREF(g_merged, merged);
    Py_XSETREF(g_offset, offset);
    Py_XSETREF(g_measure, measure);
    g_search_frames = frames;
    g_placement_tol = tol;
    g_prompt_ns = prompt;
    Py_RETURN_NONE;
}

/* Attributes of the read and write path's objects (the transport, READ_LAG: classes with __slots__) read and set
 * straight in their slots: the generic attribute protocol was ~15 % of a tap's CPU per SSE event in C callers' lookups
 * (perf, soak 2000 streams). Only where the object's type uses the generic getattr/setattr and the name resolves to a
 * writable object slot (a member descriptor found in the type's MRO, which takes precedence over any instance dict);
 * the offset is cached per (type, name) and checked against the type's version tag (any change to the type or its
 * bases gives it a new one). Anything else, and an unset slot (AttributeError), takes the generic path. */
#define SLOT_CACHE 256
typedef struct {
    PyTypeObject *type;
    unsigned int version;
    PyObject *name;
    Py_ssize_t off;
} slot_entry;
static slot_entry g_slots[SLOT_CACHE];

static Py_ssize_t slot_offset(PyObject *obj, PyObject *name) {
    PyTypeObject *t = Py_TYPE(obj);
    if (t->tp_getattro != PyObject_GenericGetAttr || t->tp_setattro != PyObject_GenericSetAttr) return -1;
    slot_entry *e = &g_slots[(((uintptr_t)t >> 4) ^ (((uintptr_t)name >> 4) * 31u)) % SLOT_CACHE];
    if (e->type == t && e->name == name && (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && e->version == t->tp_version_tag)
        return e->off;
    PyObject *d = _PyType_Lookup(t, name); /* (borrowed; sets no exception) */
    if (d == NULL || Py_TYPE(d) != &PyMemberDescr_Type || !(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY) || m->offset < (Py_ssize_t)sizeof(PyObject)) return -1;
    e->type = t;
    e->version = t->tp_version_tag;
    e->name = name;
    e->off = m->offset;
    return m->offset;
}

/* obj.<name> (a new reference), or NULL with an exception */
static PyObject *aget(PyObject *obj, PyObject *name) {
    Py_ssize_t off = slot_offset(obj, name);
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

/* obj.<name> = v: 0, or -1 with an exception */
static int aset(PyObject *obj, PyObject *name, PyObject *v) {
    Py_ssize_t off = slot_offset(obj, name);
    if (off < 0) return PyObject_SetAttr(obj, name, v);
    PyObject **p = (PyObject **)((char *)obj + off), *old = *p;
    *p = Py_NewRef(v);
    Py_XDECREF(old);
    return 0;
}

/* The slot access above, and a stamped transport's read stamp, for deltatap.proxy._relay's per-read attributes (one
 * definition, here): a capsule, _pktring._slot_api (relay falls back to the generic attribute calls without it) */
#include "_slot_api.h" /* (the struct: aget, aset, api_rx) */

/* the transport's rx_mono_ns and rx_bound_ns: 1 (both set), 0 (rx_mono_ns is None), -1 (not a transport derived
 * from transport_base(): the caller reads the attributes; no exception) */
static int api_rx(PyObject *tr, long long *mono_ns, long long *bound_ns) {
    kstate_t *st = kstate(tr);
    if (st == NULL) return -1;
    if (!st->rx_set) return 0;
    *mono_ns = st->rx_mono_ns;
    *bound_ns = st->rx_bound_ns;
    return 1;
}

static pk_slot_api g_slot_api;

static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = aget(obj, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *obj, PyObject *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = aset(obj, name, v);
    Py_DECREF(v);
    return rc;
}

/* kstamp._measure_offset(now) -> the offset, or -1 with an exception (the offset itself is any int: *out) */
static int measure(long long now, long long *out) {
    PyObject *r = PyObject_CallFunction(g_measure, "L", now);
    if (r == NULL) return -1;
    *out = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* kstamp._to_mono: 0 and *t, or -1 with an exception */
static int to_mono(long long k, long long *t) {
    long long now = mono_now(), off, x;
    if (!k) {
        *t = now;
        return 0;
    }
    if (PyList_GET_SIZE(g_offset) < 3) {
        PyErr_SetString(PyExc_ValueError, "kstamp._offset: 3 items");
        return -1;
    }
    long long at = PyLong_AsLongLong(PyList_GET_ITEM(g_offset, 2));
    if (at == -1 && PyErr_Occurred()) return -1;
    if (now - at < OFFSET_EVERY_NS) {
        off = PyLong_AsLongLong(PyList_GET_ITEM(g_offset, 0));
        if (off == -1 && PyErr_Occurred()) return -1;
    } else if (measure(now, &off) != 0) {
        return -1;
    }
    x = k - off;
    if (x <= now + 1000000LL && now - x <= MAX_AGE_NS) {
        *t = x <= now ? x : now;
        return 0;
    }
    if (measure(now, &off) != 0) return -1; /* (implausible: the wall clock may have stepped; measure again, once) */
    x = k - off;
    if (x <= now + 1000000LL && now - x <= MAX_AGE_NS) {
        *t = x <= now ? x : now;
        return 0;
    }
    *t = now;
    return 0;
}

static PyObject *pk_to_mono(PyObject *self, PyObject *arg) {
    if (g_offset == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "to_mono: read_setup() first");
        return NULL;
    }
    long long k = PyLong_AsLongLong(arg), t;
    if (k == -1 && PyErr_Occurred()) return NULL;
    if (to_mono(k, &t) != 0) return NULL;
    return PyLong_FromLongLong(t);
}

/* ReadLag.add(ns) on kstamp.READ_LAG (the C twin, checked by read_setup) */
static inline void lag_add(long long ns) { lag_count((lag_t *)g_read_lag, ns); }

/* PacketLog._window: the head and the search's top (the released word, loaded first, + the ring's frames: the
 * frames read past it may be a hand-back's not zeroed yet) -> 0; or -1 with an exception */
static int plog_head(PyObject *plog, long long frames, long long *head, long long *top) {
    PyObject *hw = aget(plog, s_hw);
    if (hw == NULL) return -1;
    Py_buffer hv;
    long long *word;
    int rc = head_word(hw, &hv, &word, 0);
    Py_DECREF(hw);
    if (rc != 0) return -1;
    *top = __atomic_load_n(word + 1, __ATOMIC_ACQUIRE) + frames;
    *head = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&hv);
    return 0;
}

/* PacketLog.read_due(): PacketLog.due() once its _due_ns has passed (it arms the loop's hand-back timer, or hands
 * back when that timer is late), else nothing */
static int read_due(PyObject *plog) {
    long long due;
    if (get_ll(plog, s_due_ns, &due) != 0) return -1;
    if (mono_now() < due) return 0;
    PyObject *r = PyObject_CallMethodNoArgs(plog, s_due);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *pk_read_one(PyObject *self, PyObject *tr) {
    if (g_buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_one: read_setup() first");
        return NULL;
    }
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    PyObject *sock = aget(tr, s_sock), *plog = NULL, *data = NULL;
    if (sock == NULL) return NULL;
    unsigned char info[TCP_INFO_LEN];
    int fd = PyObject_AsFileDescriptor(sock);
    Py_DECREF(sock);
    socklen_t ilen = TCP_INFO_LEN;
    if (fd < 0) {
        /* the reference's getsockopt on a closed socket raises OSError: no counters, its split path */
        if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_OSError)) return NULL;
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    memset(info, 0, sizeof info);
    st->closed_in = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &ilen) != 0 || ilen < DATA_SEGS_IN_AT + 4) Py_RETURN_FALSE;
    st->closed_in = info[0] == TCP_CLOSE; /* tcpi_state: the first byte */
    long long segs = (long long)rd_u32(info + DATA_SEGS_IN_AT), got_bytes;
    uint64_t received;
    memcpy(&received, info + BYTES_RECEIVED_AT, 8);
    got_bytes = (long long)received;
    long long segments = segs - st->segs_in;
    if (segments > 1) { /* (the counters for the split path that follows at once: _split_counts) */
        st->split_segs = segs;
        st->split_got = got_bytes;
        st->split_set = 1;
        Py_RETURN_FALSE;
    }
    st->segs_in = segs;
    plog = aget(tr, s_plog);
    if (plog == NULL) return NULL;
    int rc = plog == Py_None ? 0 : read_due(plog);
    Py_DECREF(plog);
    if (rc != 0) return NULL;
    long long t_read = mono_now(), k = 0;
    Py_ssize_t n = recv_stamp(fd, g_buf, (size_t)g_buf_len, 0, &k);
    if (n == -2) return NULL;
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n == 0) Py_RETURN_TRUE;
    /* copied out at once: what runs below may run Python code (a collection, the offset's measure), and with it
     * another thread's read into the same buffer */
    data = PyBytes_FromStringAndSize((const char *)g_buf, n);
    if (data == NULL) return NULL;
    if (k) lag_add(wall_now() - k);
    long long rx_off = st->rx_off, empty_since = st->empty_mono;
    if ((long long)n != got_bytes - rx_off) segments = 2; /* (bytes came after the count: the read may hold another) */
    /* _hand_over_read(view, n, [(n, k)], segments, t_read, taken=True) */
    long long t = t_read, bound;
    if (k && to_mono(k, &t) != 0) {
        Py_DECREF(data);
        return NULL;
    }
    int exact = 0 < segments && segments <= 1;
    if (exact && k) bound = 0;
    else bound = t - empty_since > 0 ? t - empty_since : 0;
    if (n < g_buf_len) st->empty_mono = t_read;
    /* _deliver(bytes(view[:n]), t if k else 0, bound) */
    long long rx_mono = k ? t : 0;
    if (!rx_mono) rx_mono = mono_now();
    st->rx_mono_ns = rx_mono;
    st->rx_set = 1;
    st->rx_bound_ns = bound;
    st->rx_off = rx_off + n;
    return data;
}

/* the 12-byte pattern of a connection key (pktstamp._pattern): 0, or -1 with an exception */
static int key_pattern(PyObject *key, unsigned char *pat) {
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 4) {
        PyErr_SetString(PyExc_TypeError, "a connection key: (bytes, port, bytes, port)");
        return -1;
    }
    PyObject *src = PyTuple_GET_ITEM(key, 0), *dst = PyTuple_GET_ITEM(key, 2);
    if (!PyBytes_Check(src) || !PyBytes_Check(dst) || PyBytes_GET_SIZE(src) != 4 || PyBytes_GET_SIZE(dst) != 4) {
        PyErr_SetString(PyExc_ValueError, "a connection key: IPv4 addresses of 4 bytes");
        return -1;
    }
    long sport = PyLong_AsLong(PyTuple_GET_ITEM(key, 1)), dport = PyLong_AsLong(PyTuple_GET_ITEM(key, 3));
    if ((sport == -1 || dport == -1) && PyErr_Occurred()) return -1;
    if (sport < 0 || sport > 0xFFFF || dport < 0 || dport > 0xFFFF) {
        PyErr_SetString(PyExc_OverflowError, "a connection key: ports of 16 bits");
        return -1;
    }
    memcpy(pat, PyBytes_AS_STRING(src), 4);
    memcpy(pat + 4, PyBytes_AS_STRING(dst), 4);
    pat[8] = (unsigned char)(sport >> 8);
    pat[9] = (unsigned char)sport;
    pat[10] = (unsigned char)(dport >> 8);
    pat[11] = (unsigned char)dport;
    return 0;
}

/* KernelStampTransport._checked_cuts(n, last, first): 1 with the cuts in *out (PyMem, *nc of them), 0 for None,
 * -1 with an exception. Sets the transport's _irs1 (found here when unknown) and _unlogged_tail as the reference. */
static int checked_cuts(PyObject *tr, PyObject *plog, const unsigned char *pat, long long n, long long last, long long first,
                        cut_t **out, Py_ssize_t *nc, int *unlogged) {
    long long irs1, rx_off, head, top;
    *out = NULL;
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return -1;
    if (!st->irs1_set) {
        PyObject *v = PyObject_CallMethodNoArgs(tr, s_anchor);
        if (v == NULL) return -1;
        int rc = aset(tr, s_irs1, v);
        Py_DECREF(v);
        if (rc != 0) return -1;
        if (!st->irs1_set) return 0; /* (None; the reference logs it at debug level) */
    }
    irs1 = st->irs1;
    rx_off = st->rx_off;
    uint32_t base = (uint32_t)((irs1 + rx_off) & 0xFFFFFFFFLL);
    PyObject *mv = aget(plog, s_mv);
    if (mv == NULL) return -1;
    ring_t r;
    int rc = ring_get(mv, &r, 0);
    Py_DECREF(mv);
    if (rc != 0) return -1;
    if (plog_head(plog, r.frames, &head, &top) != 0) {
        PyBuffer_Release(&r.view);
        return -1;
    }
    seg_t *segs = NULL;
    Py_ssize_t count = 0;
    rc = collect(&r, pat, head, top, base, g_search_frames, &segs, &count);
    PyBuffer_Release(&r.view);
    if (rc != 0) return -1;
    cut_t *cuts = PyMem_Malloc((size_t)(count + 1) * sizeof(cut_t));
    if (cuts == NULL) {
        PyMem_Free(segs);
        PyErr_NoMemory();
        return -1;
    }
    long long why_a;
    int how = place_cuts(segs, count, base, n, last ? last : first, g_buf_len, cuts, nc, unlogged, &why_a);
    PyMem_Free(segs);
    if (how != CUTS_PLACED) *unlogged = 0;
    if (aset(tr, s_unlogged_tail, *unlogged ? Py_True : Py_False) != 0) {
        PyMem_Free(cuts);
        return -1;
    }
    if (how != CUTS_PLACED) {
        PyMem_Free(cuts);
        return 0;
    }
    long long d = cuts[*nc - 1].wall - last;
    if (last && !*unlogged && (d < 0 ? -d : d) > g_placement_tol) { /* a stale anchor: not used */
        PyMem_Free(cuts);
        return 0;
    }
    *out = cuts;
    return 1;
}

/* KernelStampTransport._read_by_packets(view, first) for a protocol with cuts_received: (data, pieces) for the caller
 * to hand over (every stamp and bound, _rx_off, _empty_mono set), True (handled: nothing to hand over), False (the log
 * cannot place the bytes: nothing taken in), None (the reference's own path: one cut, no cuts_received); raises
 * OSError where the reference's _recv calls _fatal */
static PyObject *read_packets(PyObject *tr, long long first) {
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    PyObject *proto = aget(tr, s_protocol), *bulk, *plog = NULL, *out = NULL, *data = NULL, *pieces = NULL;
    if (proto == NULL) return NULL;
    if (_PyObject_LookupAttr(proto, s_cuts_received, &bulk) < 0) {
        Py_DECREF(proto);
        return NULL;
    }
    Py_DECREF(proto);
    if (bulk == NULL) Py_RETURN_NONE;
    Py_DECREF(bulk);
    unsigned char pat[PATTERN];
    cut_t *cuts = NULL;
    Py_ssize_t nc = 0;
    int unlogged = 0;
    plog = aget(tr, s_plog);
    if (plog == NULL) return NULL;
    if (!st->pkey_set) { /* (what key_pattern says of None) */
        PyErr_SetString(PyExc_TypeError, "a connection key: (bytes, port, bytes, port)");
        goto done;
    }
    memcpy(pat, st->pkey_pat, PATTERN);
    if (first) { /* PacketLog.reaches(first, _SEARCH_FRAMES) */
        long long head, top;
        ring_t r;
        PyObject *mv = aget(plog, s_mv);
        if (mv == NULL) goto done;
        int rc = ring_get(mv, &r, 0);
        Py_DECREF(mv);
        if (rc != 0) goto done;
        if (plog_head(plog, r.frames, &head, &top) != 0) {
            PyBuffer_Release(&r.view);
            goto done;
        }
        int reaches = reaches_from(&r, head, top, first, g_search_frames);
        PyBuffer_Release(&r.view);
        if (!reaches) {
            PyObject *c = PyDict_GetItemWithError(g_merged, s_out_of_reach);
            long long cn = c == NULL ? 0 : PyLong_AsLongLong(c);
            if ((c == NULL || cn == -1) && PyErr_Occurred()) goto done;
            PyObject *nv = PyLong_FromLongLong(cn + 1);
            if (nv == NULL) goto done;
            int src = PyDict_SetItem(g_merged, s_out_of_reach, nv);
            Py_DECREF(nv);
            if (src != 0) goto done;
            out = Py_NewRef(Py_False);
            goto done;
        }
    }
    int fd = -1;
    {
        PyObject *sock = aget(tr, s_sock);
        if (sock == NULL) goto done;
        fd = sock_fd(sock);
        Py_DECREF(sock);
        if (fd < 0) goto done;
    }
    long long t_read = mono_now(), last = 0;
    Py_ssize_t n = recv_stamp(fd, g_buf, (size_t)g_buf_len, MSG_PEEK, &last);
    if (n == -2) goto done;
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) out = Py_NewRef(Py_True);
        else PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    /* copied out at once (the placement below may run Python code: the anchor, and with it another thread's read) */
    data = PyBytes_FromStringAndSize((const char *)g_buf, n);
    if (data == NULL) goto done;
    int rc = checked_cuts(tr, plog, pat, n, last, first, &cuts, &nc, &unlogged);
    if (rc < 0) goto done;
    if (rc == 0) {
        if (st->irs1_set) { /* the anchor may be stale: once more */
            st->irs1_set = 0;
            rc = checked_cuts(tr, plog, pat, n, last, first, &cuts, &nc, &unlogged);
            if (rc < 0) goto done;
        }
        if (rc == 0) {
            out = Py_NewRef(Py_False);
            goto done;
        }
    }
    if (nc < 2) { /* one piece: the reference hands it over as a plain read */
        out = Py_NewRef(Py_None);
        goto done;
    }
    /* out = [(end, _to_mono(k) if k else 0, 0) ...], the unlogged tail's bound back to the piece before it */
    long long *tm = PyMem_Malloc((size_t)nc * 2 * sizeof(long long));
    if (tm == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long *bd = tm + nc;
    for (Py_ssize_t i = 0; i < nc; i++) {
        bd[i] = 0;
        tm[i] = 0;
        if (cuts[i].wall && to_mono(cuts[i].wall, &tm[i]) != 0) {
            PyMem_Free(tm);
            goto done;
        }
    }
    if (unlogged) {
        long long a = tm[nc - 1] ? tm[nc - 1] : mono_now();
        long long b = tm[nc - 2] ? tm[nc - 2] : mono_now();
        bd[nc - 1] = a - b > 0 ? a - b : 0;
    }
    /* _hand_over(view, n, out), the bulk case */
    long long k_unused;
    Py_ssize_t got = recv_stamp(fd, g_buf, (size_t)n, MSG_TRUNC, &k_unused);
    if (got < 0) {
        PyMem_Free(tm);
        if (got == -1) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) out = Py_NewRef(Py_True);
            else PyErr_SetFromErrno(PyExc_OSError);
        }
        goto done;
    }
    pieces = PyList_New(0);
    if (pieces == NULL) {
        PyMem_Free(tm);
        goto done;
    }
    long long start = 0, last_t = 0, last_b = 0;
    for (Py_ssize_t i = 0; i < nc; i++) {
        long long e = cuts[i].end < got ? cuts[i].end : got;
        if (e > start) {
            last_t = tm[i] ? tm[i] : mono_now();
            last_b = bd[i];
            PyObject *item = Py_BuildValue("(LLLL)", start, e, last_t, last_b);
            if (item == NULL || PyList_Append(pieces, item) != 0) {
                Py_XDECREF(item);
                PyMem_Free(tm);
                goto done;
            }
            Py_DECREF(item);
        }
        start = e;
    }
    PyMem_Free(tm);
    if (PyList_GET_SIZE(pieces) == 0) { /* (nothing taken in: the reference would fail on pieces[-1]) */
        out = Py_NewRef(Py_True);
        goto done;
    }
    st->rx_mono_ns = last_t;
    st->rx_set = 1;
    st->rx_bound_ns = last_b;
    st->rx_off += got;
    if (got >= n && n < g_buf_len) st->empty_mono = t_read;
    if (got < n) {
        PyObject *cut = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data), got);
        if (cut == NULL) goto done;
        Py_SETREF(data, cut);
    }
    out = PyTuple_Pack(2, data, pieces);
done:
    PyMem_Free(cuts);
    Py_XDECREF(plog);
    Py_XDECREF(data);
    Py_XDECREF(pieces);
    return out;
}

static PyObject *pk_read_packets(PyObject *self, PyObject *args) {
    PyObject *tr;
    long long first;
    if (!PyArg_ParseTuple(args, "OL", &tr, &first)) return NULL;
    if (g_buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_packets: read_setup() first");
        return NULL;
    }
    return read_packets(tr, first);
}

/* d[key] += 1 on one of kstamp's counter dicts (MERGED_READS, SLOW_SENDS): 0, or -1 with an exception */
static int dict_incr(PyObject *d, PyObject *key) {
    PyObject *c = PyDict_GetItemWithError(d, key);
    long long cn = c == NULL ? 0 : PyLong_AsLongLong(c);
    if ((c == NULL || cn == -1) && PyErr_Occurred()) return -1;
    PyObject *nv = PyLong_FromLongLong(cn + 1);
    if (nv == NULL) return -1;
    int rc = PyDict_SetItem(d, key, nv);
    Py_DECREF(nv);
    return rc;
}

/* The data segments a split or plain read holds (_split_counts, else the counters read here; _segs_in moves on):
 * their number since the previous read, or -1 when no counters could be had (*pending 0). ``*pending``, ``*p_segs`` and
 * ``*p_got``: read_one's counters when it left them (the caller takes them from the state before its peek). */
static inline long long read_counts(int fd, kstate_t *st, int *pending, long long *p_segs, long long *p_got) {
    if (!*pending) { /* (no counters from read_one: read them) */
        unsigned char info[TCP_INFO_LEN];
        socklen_t ilen = TCP_INFO_LEN;
        memset(info, 0, sizeof info);
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &ilen) == 0 && ilen >= DATA_SEGS_IN_AT + 4) {
            uint64_t received;
            memcpy(&received, info + BYTES_RECEIVED_AT, 8);
            *p_segs = (long long)rd_u32(info + DATA_SEGS_IN_AT);
            *p_got = (long long)received;
            *pending = 1;
        }
    }
    if (!*pending) return -1;
    long long segments = *p_segs - st->segs_in;
    st->segs_in = *p_segs;
    return segments;
}

/* KernelStampTransport._on_readable after read_one found several segments waiting (or no counters), through
 * _read_by_packets: the one-byte peek (None: nothing waits; True: end of stream), READ_LAG, the counters read_one
 * read (_split_counts; read here where it left none) and _segs_in; then, for more than one segment since the last read, read_packets with MERGED_READS counted as the
 * reference counts it: (data, pieces) for the caller's cuts_received, None when it was handled otherwise, an OSError
 * raised where the reference's _fatal runs. Else (first, lag, counts or None, segments, how) for the reference to go
 * on from: how 0 (not placed: one segment or fewer), 1 (the log could not place the bytes: fallback counted), 2
 * (read_packets' None: the reference's own _read_by_packets runs). */
static PyObject *pk_read_split(PyObject *self, PyObject *tr) {
    if (g_buf == NULL || g_merged == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_split: read_setup() first");
        return NULL;
    }
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    int pending = st->split_set; /* counts, self._split_counts = self._split_counts, None */
    long long p_segs = st->split_segs, p_got = st->split_got;
    st->split_set = 0;
    PyObject *sock = aget(tr, s_sock);
    if (sock == NULL) return NULL;
    int fd = sock_fd(sock);
    Py_DECREF(sock);
    if (fd < 0) return NULL;
    long long first = 0;
    Py_ssize_t n = recv_stamp(fd, g_buf, 1, MSG_PEEK | MSG_TRUNC, &first);
    if (n == -2) return NULL;
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) Py_RETURN_NONE;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n == 0) Py_RETURN_TRUE;
    long long lag = first ? wall_now() - first : 0;
    if (first) lag_add(lag);
    long long segments = read_counts(fd, st, &pending, &p_segs, &p_got);
    int how = 0;
    if (segments > 1) {
        PyObject *got = read_packets(tr, first);
        if (got == NULL) {
            if (PyErr_ExceptionMatches(PyExc_OSError)) { /* (the reference: _fatal, and the read counted as handled) */
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                int rc = dict_incr(g_merged, s_packets);
                if (rc == 0) PyErr_Restore(type, value, tb);
                else {
                    Py_XDECREF(type);
                    Py_XDECREF(value);
                    Py_XDECREF(tb);
                }
            }
            return NULL;
        }
        if (got == Py_None) {
            Py_DECREF(got);
            how = 2;
        } else if (got == Py_False) {
            Py_DECREF(got);
            how = 1;
            if (dict_incr(g_merged, s_fallback) != 0) return NULL;
        } else {
            if (dict_incr(g_merged, s_packets) != 0) {
                Py_DECREF(got);
                return NULL;
            }
            if (PyTuple_Check(got)) return got;
            Py_DECREF(got); /* (True: handled) */
            Py_RETURN_NONE;
        }
    }
    /* (the counters as the reference holds them, made only for its continuation) */
    PyObject *counts = pending ? Py_BuildValue("(kK)", (unsigned long)p_segs, (unsigned long long)p_got) : Py_NewRef(Py_None);
    if (counts == NULL) return NULL;
    return Py_BuildValue("(LLNLi)", first, lag, counts, segments, how);
}

/* KernelStampTransport._read_merged for a transport without the packet log (no CAP_NET_RAW, IPv6): the one-byte peek,
 * READ_LAG, the counters (and _segs_in), then _read_late's prompt read (the process read within _PROMPT_NS of the first
 * byte's arrival, or it is unstamped): the read, the counters again where one segment was counted and the read is
 * stamped, _hand_over_read(taken=True) and _deliver up to the protocol's data_received, which the caller makes -> the
 * read's bytes (rx_mono_ns, rx_bound_ns, _rx_off, _empty_mono set); None (nothing waited); True (end of stream); or
 * (first, lag, counts, segments) for the reference's _read_late (a late read: split at its arrivals there). Raises
 * OSError where the reference's _recv calls _fatal. */
static PyObject *pk_read_plain(PyObject *self, PyObject *tr) {
    if (g_buf == NULL || g_read_lag == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "read_plain: read_setup() first");
        return NULL;
    }
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    int pending = st->split_set; /* counts, self._split_counts = self._split_counts, None */
    long long p_segs = st->split_segs, p_got = st->split_got;
    st->split_set = 0;
    PyObject *sock = aget(tr, s_sock);
    if (sock == NULL) return NULL;
    int fd = sock_fd(sock);
    Py_DECREF(sock);
    if (fd < 0) return NULL;
    long long first = 0;
    Py_ssize_t n = recv_stamp(fd, g_buf, 1, MSG_PEEK | MSG_TRUNC, &first);
    if (n == -2) return NULL;
    if (n < 0) return PyErr_SetFromErrno(PyExc_OSError); /* (EAGAIN: BlockingIOError, the caller's nothing-to-read) */
    if (n == 0) Py_RETURN_TRUE;
    long long lag = first ? wall_now() - first : 0;
    if (first) lag_add(lag);
    long long segments = read_counts(fd, st, &pending, &p_segs, &p_got);
    if (g_prompt_ns < 0 || (first && lag >= g_prompt_ns)) { /* late: the reference's _read_late splits it */
        PyObject *counts = pending ? Py_BuildValue("(kK)", (unsigned long)p_segs, (unsigned long long)p_got) : Py_NewRef(Py_None);
        if (counts == NULL) return NULL;
        return Py_BuildValue("(LLNL)", first, lag, counts, segments);
    }
    long long t_read = mono_now(), k = 0;
    n = recv_stamp(fd, g_buf, (size_t)g_buf_len, 0, &k);
    if (n == -2) return NULL;
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) Py_RETURN_NONE; /* (the reference's _recv: None, nothing done) */
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)g_buf, n); /* (copied out at once, as read_one) */
    if (data == NULL) return NULL;
    if (segments == 1 && k) { /* tcp_counters(sock) != counts: another segment came while this was read */
        unsigned char info[TCP_INFO_LEN];
        socklen_t ilen = TCP_INFO_LEN;
        memset(info, 0, sizeof info);
        int same = 0;
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &ilen) == 0 && ilen >= DATA_SEGS_IN_AT + 4) {
            uint64_t received;
            memcpy(&received, info + BYTES_RECEIVED_AT, 8);
            same = (long long)rd_u32(info + DATA_SEGS_IN_AT) == p_segs && (long long)received == p_got;
        }
        if (!same) segments = 2;
    }
    /* _hand_over_read(view, n, [(n, k)], segments, t_read, taken=True), then _deliver */
    long long empty_since = st->empty_mono, t = t_read, bound;
    if (k && to_mono(k, &t) != 0) {
        Py_DECREF(data);
        return NULL;
    }
    int exact = 0 < segments && segments <= 1;
    if (exact && k) bound = 0;
    else bound = t - empty_since > 0 ? t - empty_since : 0;
    if (n < g_buf_len) st->empty_mono = t_read;
    long long rx_mono = k ? t : 0;
    if (!rx_mono) rx_mono = mono_now();
    st->rx_mono_ns = rx_mono;
    st->rx_set = 1;
    st->rx_bound_ns = bound;
    st->rx_off += n;
    return data;
}

/* ---- the read handler --------------------------------------------------------------------------------------- */

/* readable(transport): KernelStampTransport._on_readable as the loop's reader callback itself (add_reader(fd,
 * readable, transport)), so that the usual read runs no Python frame of the transport's: the transport lost, nothing;
 * a transport without the packet log, or whose _fast is not read_one (the reference's, or a test's), its own
 * _on_readable; else read_one, and its outcome handed on as _on_readable hands it: bytes to the protocol's
 * data_received (an exception from it to _fatal(exc, "protocol.data_received() failed")), None nothing, True
 * _peer_eof(), False (several segments wait) what _several -> _split_fast does: read_split, and its outcome handed
 * on likewise (data and pieces to the protocol's cuts_received, an exception from it to _fatal(exc, "protocol.
 * cuts_received() failed"); None nothing; True _peer_eof(); the reference's continuation to _split_rest(got)).
 * read_one's or read_split's BlockingIOError / InterruptedError end the call; any other OSError goes to _fatal(exc);
 * any other exception propagates, as from the reference. kstamp registers it only where its _read_split is
 * read_split. */
static PyObject *s_late_rest;
static PyObject *s_data_received, *s_fast, *s_peer_eof, *s_on_readable, *s_dr_failed, *s_cr_failed, *s_split_rest, *s_reread;

static int fatal_call(PyObject *tr, PyObject *msg) {
    /* the pending exception to tr._fatal(exc[, msg]), handled there as the reference's ``except ... as exc`` block
     * does (sys.exc_info() is it during the call): 0, or -1 with _fatal's own exception */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    PyObject *ot, *ov, *otb;
    PyErr_GetExcInfo(&ot, &ov, &otb);
    Py_XINCREF(type);
    Py_XINCREF(value);
    Py_XINCREF(tb);
    PyErr_SetExcInfo(type, value, tb);
    PyObject *r = msg == NULL ? PyObject_CallMethodOneArg(tr, s_fatal, value)
                              : PyObject_CallMethodObjArgs(tr, s_fatal, value, msg, NULL);
    PyErr_SetExcInfo(ot, ov, otb);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *call0(PyObject *obj, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* read_one's or read_split's exception, as _on_readable meets it: BlockingIOError / InterruptedError end the call,
 * any other OSError goes to _fatal(exc), anything else propagates */
static PyObject *read_failed(PyObject *tr) {
    if (PyErr_ExceptionMatches(PyExc_BlockingIOError) || PyErr_ExceptionMatches(PyExc_InterruptedError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyErr_ExceptionMatches(PyExc_OSError)) return fatal_call(tr, NULL) < 0 ? NULL : Py_NewRef(Py_None);
    return NULL;
}

/* deltatap.net.conn.StampedProtocol.data_received, registered by conn (stamped_protocol(fn)); NULL: not registered */
static PyObject *g_stamped_dr, *s_kernel, *s_on_data;

static PyObject *pk_stamped_protocol(PyObject *self, PyObject *fn) {
    if (!PyFunction_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "stamped_protocol(StampedProtocol.data_received): a function");
        return NULL;
    }
    Py_XSETREF(g_stamped_dr, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* hand_over's data_received where the protocol's data_received is StampedProtocol.data_received itself (found through
 * the protocol as a call would find it: not overridden by its class or an instance attribute), its ``kernel`` is this
 * transport and the read's stamp is set: what that method does then, on_data(data, rx_mono_ns, rx_bound_ns), without
 * its Python frame. 1: done (*r the result, or NULL with the exception: the caller's _fatal as for data_received's), 0:
 * not this case, nothing called (the caller calls data_received) */
static int stamped_data(PyObject *tr, PyObject *proto, PyObject *data, PyObject **r) {
    kstate_t *st = kstate(tr);
    if (g_stamped_dr == NULL || st == NULL || !st->rx_set) return 0;
    PyObject *meth;
    int found = _PyObject_LookupAttr(proto, s_data_received, &meth);
    if (found <= 0) return 0; /* (an error or none: the caller's call meets it again) */
    int ours = PyMethod_Check(meth) && PyMethod_GET_FUNCTION(meth) == g_stamped_dr && PyMethod_GET_SELF(meth) == proto;
    if (!ours) { /* (what a call finds: call it) */
        *r = PyObject_CallOneArg(meth, data);
        Py_DECREF(meth);
        return 1;
    }
    Py_DECREF(meth);
    PyObject *k = aget(proto, s_kernel);
    if (k == NULL) {
        *r = NULL;
        return 1;
    }
    int same = k == tr;
    Py_DECREF(k);
    if (!same) return 0;
    PyObject *t = PyLong_FromLongLong(st->rx_mono_ns), *b = t == NULL ? NULL : PyLong_FromLongLong(st->rx_bound_ns);
    if (b == NULL) {
        Py_XDECREF(t);
        *r = NULL;
        return 1;
    }
    PyObject *call[4] = {proto, data, t, b};
    *r = PyObject_VectorcallMethod(s_on_data, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(t);
    Py_DECREF(b);
    return 1;
}

/* the protocol's method ``name`` called with args[0..n): its exception to _fatal(exc, failed) */
static PyObject *hand_over(PyObject *tr, PyObject *name, PyObject *const *args, size_t n, PyObject *failed) {
    PyObject *proto = aget(tr, s_protocol), *r = NULL;
    if (proto != NULL) {
        if (!(name == s_data_received && n == 1 && stamped_data(tr, proto, args[0], &r))) {
            PyObject *call[3] = {proto, n > 0 ? args[0] : NULL, n > 1 ? args[1] : NULL};
            r = PyObject_VectorcallMethod(name, call, (1 + n) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        }
        Py_DECREF(proto);
    }
    if (r != NULL) {
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    return fatal_call(tr, failed) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *readable_fast(PyObject *tr);
static PyObject *readable_plain(PyObject *tr, kstate_t *st);
static int get_true(PyObject *obj, PyObject *name);

static PyObject *pk_readable(PyObject *self, PyObject *tr) {
    PyObject *v = aget(tr, s_lost);
    if (v == NULL) return NULL;
    int lost = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (lost < 0) return NULL;
    if (lost) Py_RETURN_NONE;
    v = aget(tr, s_plog);
    if (v == NULL) return NULL;
    int plog = v != Py_None;
    Py_DECREF(v);
    v = aget(tr, s_fast);
    if (v == NULL) return NULL;
    int fast = PyCFunction_Check(v) && PyCFunction_GET_FUNCTION(v) == (PyCFunction)pk_read_one;
    Py_DECREF(v);
    if (!fast) return call0(tr, s_on_readable); /* (the reference, whole) */
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    if (!plog) return readable_plain(tr, st);
    long long off = st->rx_off;
    PyObject *r = readable_fast(tr);
    /* KernelStampTransport._reread: bytes were handed over while a reset waited behind them (uvloop reports a socket
     * whose readiness carried POLLERR no more: this read may have been its last report) */
    if (r != NULL && st->closed_in && st->rx_off != off) {
        Py_DECREF(r);
        return call0(tr, s_reread);
    }
    return r;
}

/* readable's read once the transport is known to take read_one (its fast path) */
static PyObject *readable_fast(PyObject *tr) {
    PyObject *got = pk_read_one(NULL, tr);
    if (got == NULL) return read_failed(tr);
    if (PyBytes_CheckExact(got)) {
        PyObject *r = hand_over(tr, s_data_received, &got, 1, s_dr_failed);
        Py_DECREF(got);
        return r;
    }
    if (got == Py_None) return got;
    if (got == Py_True) {
        Py_DECREF(got);
        return call0(tr, s_peer_eof);
    }
    Py_DECREF(got); /* (False: several segments wait: _several, whose _read_split is read_split, as _split_fast does) */
    got = pk_read_split(NULL, tr);
    if (got == NULL) return read_failed(tr);
    if (got == Py_None) return got;
    if (got == Py_True) {
        Py_DECREF(got);
        return call0(tr, s_peer_eof);
    }
    if (!PyTuple_Check(got)) {
        Py_DECREF(got);
        PyErr_SetString(PyExc_SystemError, "readable: read_split returned neither a tuple, None nor True");
        return NULL;
    }
    if (PyTuple_GET_SIZE(got) == 2) { /* (data, pieces): the protocol's cuts_received */
        PyObject *r = hand_over(tr, s_cuts_received, PySequence_Fast_ITEMS(got), 2, s_cr_failed);
        Py_DECREF(got);
        return r;
    }
    PyObject *r = PyObject_CallMethodOneArg(tr, s_split_rest, got); /* (the reference goes on) */
    Py_DECREF(got);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* readable for a transport without the packet log: _on_readable with _read_once's read_plain branch (its outcome
 * handed on: the bytes to data_received, end of stream to _peer_eof, a late read to _late_rest), then, where bytes
 * were handed over and the transport is not lost, the TCP_INFO read after them: TCP_CLOSE -> _reread */
static PyObject *readable_plain(PyObject *tr, kstate_t *st) {
    long long off = st->rx_off;
    PyObject *got = pk_read_plain(NULL, tr), *r;
    if (got == NULL) {
        r = read_failed(tr);
    } else if (PyBytes_CheckExact(got)) {
        r = hand_over(tr, s_data_received, &got, 1, s_dr_failed);
        Py_DECREF(got);
    } else if (got == Py_None) {
        r = got;
    } else if (got == Py_True) {
        Py_DECREF(got);
        r = call0(tr, s_peer_eof);
    } else {
        r = PyObject_CallMethodOneArg(tr, s_late_rest, got);
        Py_DECREF(got);
        if (r != NULL) Py_SETREF(r, Py_NewRef(Py_None));
    }
    if (r == NULL || st->rx_off == off) return r;
    int lost = get_true(tr, s_lost);
    if (lost != 0) {
        Py_DECREF(r);
        return lost < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *sock = aget(tr, s_sock);
    if (sock == NULL) {
        Py_DECREF(r);
        return NULL;
    }
    int fd = PyObject_AsFileDescriptor(sock);
    Py_DECREF(sock);
    if (fd < 0) { /* (the reference's getsockopt on a closed socket: OSError, no check) */
        if (!PyErr_ExceptionMatches(PyExc_ValueError) && !PyErr_ExceptionMatches(PyExc_OSError)) {
            Py_DECREF(r);
            return NULL;
        }
        PyErr_Clear();
        return r;
    }
    unsigned char info[TCP_INFO_LEN];
    socklen_t ilen = TCP_INFO_LEN;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &ilen) == 0 && ilen >= 1 && info[0] == TCP_CLOSE) {
        Py_DECREF(r);
        return call0(tr, s_reread);
    }
    return r;
}

/* ---- the stamped write ------------------------------------------------------------------------------------- */

static PyObject *pk_write_setup(PyObject *self, PyObject *args) {
    PyObject *slow;
    long long slow_ns, left = g_left_frames;
    if (!PyArg_ParseTuple(args, "O!L|L", &PyDict_Type, &slow, &slow_ns, &left)) return NULL;
    Py_INCREF(slow);
    Py_XSETREF(g_slow_sends, slow);
    g_slow_ns = slow_ns;
    g_left_frames = left > 0 ? left : 0;
    Py_RETURN_NONE;
}

/* one past the newest filled frame in [head, top), as newest() finds it, starting from where the last call of this
 * process on the same ring found it (frames are filled in order and stay filled until handed back, which moves the
 * head past them: the newest only moves on, a few frames per write, so a gallop from there reads a few frames that
 * the kernel just wrote instead of newest()'s bisection over the whole ring, whose first reads miss the cache) */
static const void *g_near_ring;
static long long g_near;
static long long newest_near(const ring_t *r, long long head, long long top) {
    long long lo = g_near_ring == (const void *)r->p ? g_near : head, hi = head + r->frames;
    if (top < hi) hi = top;
    long long out;
    if (lo <= head || lo >= hi || !filled(r, lo - 1)) {
        out = newest(r, head, top);
    } else { /* filled(lo - 1): the newest is at lo or past it; gallop to a frame not filled, then bisect */
        long long step = 1, up = lo;
        while (up < hi && filled(r, up)) {
            lo = up + 1;
            up = lo + step < hi ? lo + step : hi;
            step <<= 1;
        }
        while (up - lo > 0) { /* filled(lo - 1), not filled(up) (or up == hi) */
            long long mid = lo + ((up - lo) >> 1);
            if (filled(r, mid)) lo = mid + 1;
            else up = mid;
        }
        out = lo;
    }
    g_near_ring = (const void *)r->p;
    g_near = out;
    return out;
}

static PyObject *pk_ring_newest_near(PyObject *self, PyObject *args) {
    PyObject *obj;
    long long head, top = LLONG_MAX;
    ring_t r;
    if (!PyArg_ParseTuple(args, "OL|L", &obj, &head, &top)) return NULL;
    if (ring_get(obj, &r, 0) != 0) return NULL;
    long long out = newest_near(&r, head, top);
    PyBuffer_Release(&r.view);
    return PyLong_FromLongLong(out);
}

/* KernelStampTransport._left_by(t1): 1 (the packet log shows the write's last byte gone by t1: TCP holds none of it),
 * 0 (the log cannot tell), -1 with an exception */
static int left_by(PyObject *tr, kstate_t *st, PyObject *plog, long long t1) {
    if (g_left_frames <= 0 || plog == Py_None || !st->iss1_set) return 0;
    long long iss1 = st->iss1;
    if (!st->tkey_set) { /* (what key_pattern says of None) */
        PyErr_SetString(PyExc_TypeError, "a connection key: (bytes, port, bytes, port)");
        return -1;
    }
    const unsigned char *pat = st->tkey_pat;
    PyObject *mv = aget(plog, s_mv);
    if (mv == NULL) return -1;
    ring_t r;
    int rc = ring_get(mv, &r, 0);
    Py_DECREF(mv);
    if (rc != 0) return -1;
    long long head, top;
    if (plog_head(plog, r.frames, &head, &top) != 0) {
        PyBuffer_Release(&r.view);
        return -1;
    }
    matcher_t m; /* PacketLog.newest_segment(_tkey, _LEFT_FRAMES) */
    Py_ssize_t off, ip;
    seg_t s;
    int found = 0;
    matcher_init_at(&m, &r, pat, head, newest_near(&r, head, top), g_left_frames);
    while (matcher_next(&m, &off, &ip)) {
        if (segment_at(&r, off, ip, &s)) {
            found = 1;
            break;
        }
    }
    PyBuffer_Release(&r.view);
    if (!found) return 0;
    if (s.end != (uint32_t)((iss1 + st->tx_off) & 0xFFFFFFFFLL)) return 0; /* (it ends where the write does) */
    long long t;
    if (to_mono(s.wall, &t) != 0) return -1;
    return t <= t1;
}

/* truthiness of tr.<name>: 1, 0, or -1 with an exception */
static int get_true(PyObject *obj, PyObject *name) {
    PyObject *v = aget(obj, name);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* send(protocol, transport, data): KernelStampTransport._write(data) where the transport's buffer is empty and it is
 * neither lost nor half-closed (the readings around send(2), _tx_off, the bound, the slow-send rule: SLOW_SENDS,
 * unplaced_write or _restamp_write), then StampedProtocol.send's bookkeeping on ``protocol`` (last_write_mono,
 * last_write_bound, unplaced; None: the transport's own write, no protocol) -> (t, bound). A partial send (or none:
 * EAGAIN) goes on in the reference's _sent, an error in its _fatal, as the reference's write does. None (nothing
 * done): anything else (empty data, not a contiguous buffer, bytes waiting, _lost, _eof, a closed socket): the
 * reference runs. */
static PyObject *pk_send(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "send(protocol, transport, data)");
        return NULL;
    }
    if (g_slow_sends == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "send: write_setup() first");
        return NULL;
    }
    PyObject *proto = args[0], *tr = args[1], *data = args[2];
    kstate_t *st = kstate_or_fail(tr);
    if (st == NULL) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int r = 0;
    if (view.len == 0 || (r = get_true(tr, s_eof)) != 0 || (r = get_true(tr, s_lost)) != 0) goto not_mine;
    {
        PyObject *wbuf = aget(tr, s_wbuf);
        if (wbuf == NULL) goto fail;
        Py_ssize_t waiting = PyObject_Size(wbuf);
        Py_DECREF(wbuf);
        if (waiting < 0) goto fail;
        if (waiting) goto not_mine;
    }
    PyObject *sock = aget(tr, s_sock);
    if (sock == NULL) goto fail;
    int fd = PyObject_AsFileDescriptor(sock);
    Py_DECREF(sock);
    if (fd < 0) {
        PyErr_Clear(); /* (a closed socket: the reference's send raises, and _fatal runs there) */
        goto not_mine;
    }
    st->writes++;
    if (aset(tr, s_unplaced_write, Py_None) != 0) goto fail;
    long long t0 = mono_now();
    st->last_write_mono_ns = t0;
    st->lw_set = 1;
    ssize_t n;
    for (;;) {
        n = send(fd, view.buf, (size_t)view.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n >= 0 || errno != EINTR) break;
        if (PyErr_CheckSignals() != 0) goto fail; /* (a signal handler raised: so would the reference's send) */
    }
    long long t1 = mono_now();
    int err = n < 0 ? errno : 0;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    long long t = t0, bound = 0;
    PyObject *unplaced = Py_None;
    int known = 1; /* t, bound and unplaced known here (else read back from the transport) */
    if (n == len) {
        long long tx_off = st->tx_off;
        st->tx_off = tx_off + n;
        /* _sent: TCP still holding bytes (tcp_notsent: tcpi_notsent_bytes): they leave after t1, by an unknown time;
         * not asked where the packet log shows the write gone by t1 (_left_by), with the anchor found at the first write */
        PyObject *plog = aget(tr, s_plog);
        if (plog == NULL) return NULL;
        if (st->writes == 1 && plog != Py_None && !st->iss1_set) {
            PyObject *a = PyObject_CallMethodNoArgs(tr, s_tx_anchor);
            if (a != NULL && aset(tr, s_iss1, a) != 0) Py_CLEAR(a);
            if (a == NULL) {
                Py_DECREF(plog);
                return NULL;
            }
            Py_DECREF(a);
        }
        int left = left_by(tr, st, plog, t1);
        Py_DECREF(plog);
        if (left < 0) return NULL;
        int queued = 0;
        if (!left) {
            unsigned char info[TCP_INFO_LEN];
            socklen_t ilen = TCP_INFO_LEN;
            memset(info, 0, sizeof info);
            queued = getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &ilen) == 0 && ilen >= NOTSENT_AT + 4 && rd_u32(info + NOTSENT_AT) > 0;
        }
        bound = queued ? -1 : t1 - t0;
        st->last_write_bound_ns = bound;
        if (queued || t1 - t0 > g_slow_ns) {
            PyObject *plog = aget(tr, s_plog);
            if (plog == NULL) return NULL;
            int none = plog == Py_None;
            Py_DECREF(plog);
            if (none) {
                if (dict_incr(g_slow_sends, s_bounded) != 0) return NULL;
            } else if ((r = get_true(tr, s_lazy_placement)) < 0) {
                return NULL;
            } else if (r) {
                unplaced = Py_BuildValue("(LLLOL)", t0, t1, tx_off + n, queued ? Py_True : Py_False, tx_off);
                if (unplaced == NULL) return NULL;
                int rc = aset(tr, s_unplaced_write, unplaced);
                Py_DECREF(unplaced); /* (the transport holds it) */
                if (rc != 0) return NULL;
            } else {
                PyObject *got = PyObject_CallMethod(tr, "_restamp_write", "LLOL", t0, t1, queued ? Py_True : Py_False, tx_off);
                if (got == NULL) return NULL;
                Py_DECREF(got);
                known = 0;
            }
        }
    } else if (n >= 0 || err == EAGAIN || err == EWOULDBLOCK) {
        PyObject *got = PyObject_CallMethod(tr, "_sent", "OnLL", data, (Py_ssize_t)(n >= 0 ? n : 0), t0, t1);
        if (got == NULL) return NULL;
        Py_DECREF(got);
        known = 0;
    } else {
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", err, strerror(err));
        if (exc == NULL) return NULL;
        PyObject *got = PyObject_CallMethodOneArg(tr, s_fatal, exc);
        Py_DECREF(exc);
        if (got == NULL) return NULL;
        Py_DECREF(got);
        known = 0;
    }
    PyObject *tv = NULL, *bv = NULL, *out = NULL;
    if (known) {
        tv = PyLong_FromLongLong(t);
        bv = PyLong_FromLongLong(bound);
        Py_INCREF(unplaced);
    } else { /* t = k.last_write_mono_ns or mono_ns(); bound = k.last_write_bound_ns; unplaced = k.unplaced_write */
        tv = PyLong_FromLongLong(st->lw_set && st->last_write_mono_ns ? st->last_write_mono_ns : mono_now());
        bv = PyLong_FromLongLong(st->last_write_bound_ns);
        unplaced = aget(tr, s_unplaced_write);
    }
    if (tv == NULL || bv == NULL || unplaced == NULL) goto done;
    if (proto != Py_None && (aset(proto, s_last_write_mono, tv) != 0 || aset(proto, s_last_write_bound, bv) != 0 ||
                             aset(proto, s_unplaced, unplaced) != 0))
        goto done;
    out = PyTuple_Pack(2, tv, bv);
done:
    Py_XDECREF(tv);
    Py_XDECREF(bv);
    Py_XDECREF(unplaced);
    return out;
not_mine:
    PyBuffer_Release(&view);
    if (r < 0) return NULL;
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"tcp_counters", pk_tcp_counters, METH_O, "(tcpi_data_segs_in, tcpi_bytes_received) of a TCP socket, or None"},
    {"tcp_notsent", pk_tcp_notsent, METH_O, "tcpi_notsent_bytes of a TCP socket, or None"},
    {"recv", pk_recv, METH_VARARGS, "recv(sock, buffer, flags) -> (n, kernel_ns): recvmsg with its receive stamp"},
    {"ring_newest", pk_ring_newest, METH_VARARGS, "one past the newest filled frame"},
    {"ring_newest_near", pk_ring_newest_near, METH_VARARGS, "ring_newest from where the last call on that ring ended (the write's look)"},
    {"ring_release", pk_ring_release, METH_VARARGS, "hand frames [head, end) back to the kernel -> new head"},
    {"ring_reaches", pk_ring_reaches, METH_VARARGS, "PacketLog.reaches"},
    {"ring_segments", pk_ring_segments, METH_VARARGS, "PacketLog.segments_since"},
    {"ring_newest_segment", pk_ring_newest_segment, METH_VARARGS, "PacketLog.newest_segment"},
    {"ring_cuts", pk_ring_cuts, METH_VARARGS, "PacketLog.cuts"},
    {"read_setup", pk_read_setup, METH_VARARGS, "read_setup(read_lag, offset, measure_offset, read_size, maintain_every_ns)"},
    {"to_mono", pk_to_mono, METH_O, "kstamp._to_mono: a kernel stamp on the mono_ns scale"},
    {"read_packets", pk_read_packets, METH_VARARGS, "kstamp's read of several segments placed from the packet log"},
    {"read_one", pk_read_one, METH_O, "kstamp's one-segment read: bytes, None, True (end of stream) or False (split path)"},
    {"read_plain", pk_read_plain, METH_O, "kstamp's read without the packet log: bytes, None, True (end of stream) or (first, lag, counts, segments)"},
    {"read_split", pk_read_split, METH_O, "kstamp's read of several segments: the peek, the counters and read_packets"},
    {"write_setup", pk_write_setup, METH_VARARGS, "write_setup(slow_sends, slow_send_ns[, left_frames])"},
    {"send", (PyCFunction)(void (*)(void))pk_send, METH_FASTCALL, "send(protocol, transport, data) -> (t, bound), or None"},
    {"transport_base", pk_transport_base, METH_O, "transport_base(asyncio.Transport): the class holding a stamped transport's counters in C"},
    {"stamped_protocol", pk_stamped_protocol, METH_O,
     "stamped_protocol(StampedProtocol.data_received): readable hands a read to a protocol that takes that method unchanged "
     "as it would (on_data(data, rx_mono_ns, rx_bound_ns)), without its frame"},
    {"readable", pk_readable, METH_O, "readable(transport): KernelStampTransport._on_readable as the loop's reader callback"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_pktring", "C twin of the packet log ring and the stamped read", -1, methods};

PyMODINIT_FUNC PyInit__pktring(void) {
    PyObject *m = PyModule_Create(&mod);
    if (m == NULL) return NULL;
    if (PyType_Ready(&LagType) != 0 || PyModule_AddObjectRef(m, "ReadLag", (PyObject *)&LagType) != 0 ||
        PyModule_AddIntConstant(m, "FRAME", FRAME) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    g_slot_api.get = aget;
    g_slot_api.set = aset;
    g_slot_api.rx = api_rx;
    PyObject *cap = PyCapsule_New(&g_slot_api, "deltatap.net._pktring._slot_api", NULL);
    if (cap == NULL || PyModule_AddObject(m, "_slot_api", cap) != 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_sock, "_sock"}, {&s_plog, "_plog"}, {&s_due_ns, "_due_ns"}, {&s_due, "due"},
        {&s_protocol, "_protocol"}, {&s_cuts_received, "cuts_received"}, {&s_mv, "_mv"},
        {&s_hw, "_hwv"}, {&s_pkey, "_pkey"}, {&s_irs1, "_irs1"}, {&s_anchor, "_anchor"}, {&s_unlogged_tail, "_unlogged_tail"},
        {&s_out_of_reach, "out_of_reach"},
        {&s_eof, "_eof"}, {&s_lost, "_lost"}, {&s_wbuf, "_wbuf"}, {&s_unplaced_write, "unplaced_write"},
        {&s_lazy_placement, "lazy_placement"}, {&s_restamp_write, "_restamp_write"}, {&s_sent, "_sent"}, {&s_fatal, "_fatal"},
        {&s_last_write_mono, "last_write_mono"}, {&s_last_write_bound, "last_write_bound"}, {&s_unplaced, "unplaced"},
        {&s_late_rest, "_late_rest"}, {&s_iss1, "_iss1"}, {&s_tkey, "_tkey"}, {&s_tx_anchor, "_tx_anchor"},
        {&s_bounded, "bounded"}, {&s_packets, "packets"}, {&s_fallback, "fallback"},
        {&s_data_received, "data_received"}, {&s_fast, "_fast"}, {&s_peer_eof, "_peer_eof"}, {&s_split_rest, "_split_rest"}, {&s_reread, "_reread"},
        {&s_on_readable, "_on_readable"}, {&s_dr_failed, "protocol.data_received() failed"},
        {&s_cr_failed, "protocol.cuts_received() failed"}, {&s_kernel, "kernel"}, {&s_on_data, "on_data"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].slot != NULL) continue;
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}

/* The one definition of deltatap.net._pktring's capsule _slot_api (PyCapsule "deltatap.net._pktring._slot_api"):
 * _pktring.c fills it; deltatap/core/_content.c and proxy/_relay.c take it, when that module is loaded, to read and
 * write their objects' __slots__ attributes straight from their slots (the offset cached per type and name; anything
 * else: the generic call) and a stamped transport's read stamp from its C state. */
#ifndef DELTATAP_SLOT_API_H
#define DELTATAP_SLOT_API_H

#include <Python.h>

typedef struct {
    PyObject *(*get)(PyObject *obj, PyObject *name);            /* obj.<name>: a new reference, or NULL */
    int (*set)(PyObject *obj, PyObject *name, PyObject *v);     /* obj.<name> = v: 0, or -1 */
    /* a stamped transport's rx_mono_ns and rx_bound_ns: 1 (both set), 0 (rx_mono_ns is None), -1 (not such a
     * transport: the caller reads the attributes; no exception) */
    int (*rx)(PyObject *tr, long long *mono_ns, long long *bound_ns);
} pk_slot_api;

#endif

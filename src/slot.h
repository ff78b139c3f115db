/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slot: one reservation whose address never changes, and the physical
 * memory mapped behind it at times. The application-visible state machine is
 * vmmrt_slot_state; the driver-side truth (mapped or not, which handle) is
 * owned by the slot's driver worker, the only thread that maps or unmaps it.
 *
 * slot.c: reservation, the requests queued for a slot, the public calls.
 * slot-work.c (below it): what the worker does with those requests, and
 * each worker's handle pool.
 */
#ifndef VMMRT_SLOT_H
#define VMMRT_SLOT_H

#include <urcu/uatomic.h>
#include <urcu/urcu-bp.h>

#include "runtime.h"
#include "worker.h"

struct vmmrt_slot {
	vmmrt_runtime *rt;
	uint64_t id;
	vmmrt_devptr va;
	size_t size;           /* reserved = mapped size, a multiple of the granularity */
	unsigned worker;       /* every request for this slot goes to this worker */

	int32_t state;         /* vmmrt_slot_state, uatomic */
	int32_t error;         /* last asynchronous failure, uatomic; cleared by vmmrt_slot_error */
	char errmsg[192];      /* its message, written before error is published */

	/* worker-owned */
	bool mapped;
	vmmrt__bhandle handle;
	/* set before its first request: remap's budget covers this slot's
	 * memory (counted in rt->budgeted_handles while mapped) */
	bool budgeted;

	/* one preallocated request per kind: a slot never has two of a kind queued */
	vmmrt__request map_req;
	vmmrt__request release_req;

	/* Made by vmmrt_slot_create (set before its first request): the
	 * application's memory, always given back to the driver, never kept in
	 * a worker's handle pool: an application releases a slot so that the
	 * memory comes back. */
	bool app;

	bool dying;            /* destroy was requested: later requests are cancelled */
	struct cds_list_head link;  /* rt->slots */
	struct rcu_head rcu;   /* the worker frees the slot through call_rcu */
};

static inline void vmmrt__slot_set_state(vmmrt_slot *s, vmmrt_slot_state st)
{
	uatomic_set(&s->state, (int32_t)st);
}

/* ------------------------------------------------------------ slot-work.c */

/*
 * A slot's requests, for vmmrt__request_init(req, ops, slot): map (an
 * error if mapped), ensure (map unless mapped), release (unmap, the handle
 * to the pool or cuMemRelease), destroy (unmap and release what is mapped,
 * free the VA, free the slot after an RCU grace period; requests still
 * waiting for the slot on its worker are cancelled first).
 */
extern const vmmrt__request_ops vmmrt__slot_map_ops;
extern const vmmrt__request_ops vmmrt__slot_ensure_ops;
extern const vmmrt__request_ops vmmrt__slot_release_ops;
extern const vmmrt__request_ops vmmrt__slot_destroy_ops;

/* The runtime's workers are of this class: each keeps a handle pool. */
extern const vmmrt__worker_class vmmrt__slot_worker_class;

/* Map h at the slot's address and set access; on failure the mapping is
 * rolled back and h is still the caller's. On the slot's worker (or, inline,
 * on the launch thread). */
vmmrt_status vmmrt__slot_attach(vmmrt_slot *s, vmmrt__bhandle h);
/* Unmap; the handle goes back to the caller (*h). */
vmmrt_status vmmrt__slot_detach(vmmrt_slot *s, vmmrt__bhandle *h);

/* The pools of a set of workers of vmmrt__slot_worker_class. */
typedef struct vmmrt__slot_pool_stats {
	uint64_t oom_retries;    /* out-of-memory retries made */
	uint64_t pool_hits;      /* maps served from the handle pool */
	uint64_t pool_handles;   /* handles held in the pools now */
} vmmrt__slot_pool_stats;
void vmmrt__slot_pools_stats(vmmrt__workers *w, vmmrt__slot_pool_stats *out);
/* Free the handles the pools hold (also done at stop). Runs on the workers. */
vmmrt_status vmmrt__slot_pools_trim(vmmrt__workers *w);

/* ------------------------------------------------------------ slot.c */

/* Reserve the VA (any thread: cuMemAddressReserve is not a hot VMM call). */
vmmrt_status vmmrt__slot_reserve(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out);

/* Queue a map / release on the slot's worker; done(req, status, arg) runs on
 * the worker when it finishes. Safe in a host function (release) and on the
 * launch thread (never blocks). */
vmmrt_status vmmrt__slot_map_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);
vmmrt_status vmmrt__slot_release_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);

/* vmmrt_slot_map and vmmrt_slot_destroy without the public prologue, for the library's own use. */
vmmrt_status vmmrt__slot_map(vmmrt_slot *s);
vmmrt_status vmmrt__slot_destroy(vmmrt_slot *s);

#endif

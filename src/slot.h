/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slot: one reservation whose address never changes, and the physical
 * memory mapped behind it at times. The application-visible state machine is
 * vmmrt_slot_state; the driver-side truth (mapped or not, which handle) is
 * owned by the slot's driver worker, the only thread that maps or unmaps it.
 */
#ifndef VMMRT_SLOT_H
#define VMMRT_SLOT_H

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

	/* one preallocated request per kind: a slot never has two of a kind queued */
	vmmrt__request map_req;
	vmmrt__request release_req;

	bool dying;            /* destroy was requested: later requests are cancelled */
	struct cds_list_head link;  /* rt->slots */
	struct rcu_head rcu;   /* the worker frees the slot through call_rcu */
};

/* Reserve the VA (any thread: cuMemAddressReserve is not a hot VMM call). */
vmmrt_status vmmrt__slot_reserve(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out);

/* Worker side: map h at the slot's address and set access; on failure the
 * mapping is rolled back and h is still the caller's. */
vmmrt_status vmmrt__slot_attach(vmmrt_slot *s, vmmrt__bhandle h);
/* Worker side: unmap; the handle goes back to the caller (*h). */
vmmrt_status vmmrt__slot_detach(vmmrt_slot *s, vmmrt__bhandle *h);
/* Worker side (DESTROY): unmap and release what is mapped, free the VA,
 * unlink the slot and free it after an RCU grace period. */
vmmrt_status vmmrt__slot_teardown(vmmrt_slot *s, vmmrt__bhandle *handle_out, bool *had_handle);
void vmmrt__slot_retire(vmmrt_slot *s);

/* Queue a map / release on the slot's worker; done(req, status, arg) runs on
 * the worker when it finishes. Safe in a host function (release) and on the
 * launch thread (never blocks). */
vmmrt_status vmmrt__slot_map_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);
vmmrt_status vmmrt__slot_release_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);

/* Record a failure on the slot (worker side) so the next API call reports it. */
void vmmrt__slot_publish_error(vmmrt_slot *s, vmmrt_status st);

/* vmmrt_slot_map and vmmrt_slot_destroy without the public prologue, for the library's own use. */
vmmrt_status vmmrt__slot_map(vmmrt_slot *s);
vmmrt_status vmmrt__slot_destroy(vmmrt_slot *s);

#endif

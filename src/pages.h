/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Physical pages (vmmrt_pages): driver handles that several slots map at
 * their fixed addresses at once (vmmrt_slot_map_pages), so that tensors whose
 * lives do not overlap share memory with no driver call per step. One handle
 * per granule ("chunk"): cuMemMap maps a whole handle only (its offset must
 * be 0: CUDA_ERROR_NOT_SUPPORTED otherwise, on the H200's driver), so a slot
 * bound at an offset maps the chunks its bytes cover, one by one. The
 * handles are created and released on a driver worker, as every cuMem* call
 * is; the caller's destroy releases them at once, and the driver keeps the
 * memory until the last slot mapping them is unmapped (cuMemRelease's rule,
 * which the host backend models).
 *
 * pages.c: the object, its two requests, the runtime's teardown of those
 * left behind. slot.c binds slots to it; slot-work.c leaves a bound slot's
 * handle alone when it unmaps it.
 */
#ifndef VMMRT__PAGES_H
#define VMMRT__PAGES_H

#include <urcu/rculist.h>
#include <urcu/uatomic.h>

#include "runtime.h"
#include "worker.h"

struct vmmrt_pages {
	vmmrt_runtime *rt;
	uint64_t id;
	size_t size;             /* a multiple of the granularity */
	unsigned worker;         /* its create and release run there, in order */
	size_t chunk;            /* the bytes of each handle: the granularity */
	size_t nchunks;          /* size / chunk */
	/* worker-owned; read by the caller once its create's wait returned */
	vmmrt__bhandle *handles; /* nchunks of them, 0 where none is live */
	bool created;            /* every handle is live (not released yet) */
	vmmrt__request create_req;
	vmmrt__request release_req;
	/* the caller's: a create or destroy whose wait timed out left the object
	 * to the runtime's destroy, which frees it once the workers drained */
	bool abandoned;
	struct cds_list_head link; /* rt->pages, under rt->slots_lock */
};

/*
 * The application's device memory as the statistics report it (slot_bytes
 * and its peak): the slots' own memory while mapped, the pages' from create
 * to destroy (a bound slot adds nothing: its bytes are the pages').
 */
static inline void vmmrt__app_bytes_add(vmmrt_runtime *rt, int64_t delta)
{
	int64_t now = uatomic_add_return(&rt->slot_bytes, delta);
	for (int64_t peak = uatomic_read(&rt->slot_peak_bytes); now > peak; peak = uatomic_read(&rt->slot_peak_bytes))
		if (uatomic_cmpxchg(&rt->slot_peak_bytes, peak, now) == peak)
			break;
}

/* At the runtime's destroy, after its slots (none is bound any more):
 * destroy the pages the application left; once the workers have drained,
 * free what is left of them (those abandoned, those whose release failed:
 * live_handles says so). */
void vmmrt__pages_destroy_leftover(vmmrt_runtime *rt);
void vmmrt__pages_free_leftover(vmmrt_runtime *rt);

#endif

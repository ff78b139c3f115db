/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Physical pages (vmmrt_pages): one driver handle that several slots map at
 * their fixed addresses at once (vmmrt_slot_map_pages), so that tensors whose
 * lives do not overlap share memory with no driver call per step. The handle
 * is created and released on a driver worker, as every cuMem* call is; the
 * caller's destroy releases it at once, and the driver keeps the memory until
 * the last slot mapping it is unmapped (cuMemRelease's rule, which the host
 * backend models).
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
	/* worker-owned; read by the caller once its create's wait returned */
	vmmrt__bhandle handle;
	bool created;            /* handle is live (not released yet) */
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

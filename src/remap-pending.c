/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap: when a stream may wait for a map. A restore requested ahead
 * (look-ahead) has its map queued at once, but its wait goes on the H2D
 * stream only once that map needs nothing more from the launch thread: the
 * releases it waits for (its group's own, and those that make room in the
 * budget) are all handed off. A GPU wait that hangs on a release still to be
 * handed off deadlocks against any call that synchronizes the device in the
 * meantime, from any thread: the device waits for the launch thread, which
 * waits for the driver (found by vmmrt-torture on the H200). All of this
 * runs on the launch thread.
 */
#include "config.h"

#include "driver.h"
#include "error.h"
#include "pipeline.h"
#include "remap-pending.h"

/*
 * Will the map of group g that needs `need` releases be admitted without any
 * more work from the launch thread, i.e. with only the releases handed off
 * (or owed) so far? Its own releases must all be; and the groups that stay
 * mapped once those ran must leave it room in the budget. Counting every
 * map requested errs on the side of "not yet": the caller only waits longer.
 */
static bool map_assured(vmmrt__offload *off, vmmrt_group *g, uint64_t need)
{
	if (g->remap.releases_planned < need)
		return false;
	if (need == 0)
		return true; /* the initial backing: it takes no budget */
	int64_t mapped = 0;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *h = off->groups[i];
		if (h == g || !h->slot)
			continue;
		/* The backing allocation maps is outside the budget (counted). */
		mapped += h->remap.maps_requested > h->remap.releases_planned;
	}
	return mapped < off->remap.budget;
}

/* The restore: behind the map on the H2D stream, never on the launch thread. */
static vmmrt_status enqueue_restore(vmmrt__offload *off, const vmmrt__pending_map *p)
{
	vmmrt_group *g = p->g;
	vmmrt_status st;
	if ((st = vmmrt__drv_stream_wait_value32(off->rt, off->h2d, g->remap.flag_dev, p->seq)) != VMMRT_OK ||
	    (st = vmmrt__offload_h2d(off, g)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': restore", g->name);
	g->restore_use = p->use + 1;
	return VMMRT_OK;
}

/*
 * Take the pending maps, in ticket order, that are assured, and those of
 * uses up to `now` in any case: at a use's begin every earlier use has
 * ended and handed its release off, and a map waits only for earlier
 * tickets. A restore whose map is taken goes on the H2D stream.
 */
vmmrt_status vmmrt__remap_pending_flush(vmmrt__offload *off, uint64_t now)
{
	while (off->remap.pending_n) {
		vmmrt__pending_map *p = &off->remap.pending[off->remap.pending_head];
		if (p->use > now && !map_assured(off, p->g, p->need))
			return VMMRT_OK; /* and every later one with it: tickets go in order */
		vmmrt__pending_map taken = *p;
		off->remap.pending_head = (off->remap.pending_head + 1) % VMMRT__PENDING_MAPS;
		off->remap.pending_n--;
		if (taken.backward) {
			vmmrt_status st = enqueue_restore(off, &taken);
			if (st != VMMRT_OK)
				return st;
		}
	}
	return VMMRT_OK;
}

vmmrt_status vmmrt__remap_pending_add(vmmrt__offload *off, const vmmrt__pending_map *p)
{
	if (off->rt->driver_inline) /* mapped already, by this thread */
		return p->backward ? enqueue_restore(off, p) : VMMRT_OK;
	vmmrt_status st;
	if (off->remap.pending_n == VMMRT__PENDING_MAPS &&
	    (st = vmmrt__remap_pending_flush(off, off->remap.pending[off->remap.pending_head].use)) != VMMRT_OK)
		return st;
	off->remap.pending[(off->remap.pending_head + off->remap.pending_n++) % VMMRT__PENDING_MAPS] = *p;
	return vmmrt__remap_pending_flush(off, off->sched.use);
}

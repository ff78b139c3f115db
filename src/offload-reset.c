/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Leaving the steady state without destroying the runtime: abandon the
 * iteration under way (vmmrt_offload_abort: a step skipped for a NaN loss
 * or an out-of-memory), and discover groups again for a new shape
 * (vmmrt_group_rediscover, then vmmrt_offload_allocate; the old memory goes
 * at vmmrt_offload_release_retired). Neither moves an address that a
 * captured graph uses: the groups that stay keep theirs, and a
 * re-discovered group's old memory stays mapped at its old address until the
 * application says its graphs are done with it.
 */
#include "config.h"

#include <stdio.h>

#include "api.h"
#include "error.h"
#include "offload.h"
#include "pipeline.h"

/* Stream i of the ones an abort drains: the groups' last hook streams, then
 * their capture-copy streams; NULL where a group has none. */
static const vmmrt_stream *stream_of(const vmmrt__offload *off, unsigned i)
{
	const vmmrt_group *g = off->groups[i % off->ngroups];
	if (i < off->ngroups)
		return g->streamed ? &g->stream : NULL;
	return g->save_streamed ? &g->save_stream : NULL;
}

/*
 * Wait for everything the pipeline has in flight (the compute streams the
 * hooks ran on, the copies, the workers), then put it back to the start of
 * an iteration. Copies and releases already handed off are let
 * finish, not cancelled: a host copy half written, or a release cut before
 * its unmap, would lose bytes or leak memory; what only the abandoned uses
 * would have needed (remap's maps for them, ping-pong's deferred restores)
 * is undone by the strategy's reset.
 */
static vmmrt_status drain_and_reset(vmmrt__offload *off)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st = VMMRT_OK;
	if (off->ops->unblock)
		off->ops->unblock(off);
	/* The graphs launched between the hooks read and write the groups'
	 * memory, which the reset releases (remap), as may a copy made at
	 * capture: the streams they ran on drain first, each once. */
	for (unsigned i = 0; i < 2 * off->ngroups && st == VMMRT_OK; i++) {
		if (!stream_of(off, i))
			continue;
		vmmrt_stream s = *stream_of(off, i);
		bool seen = false;
		for (unsigned j = 0; j < i && !seen; j++)
			seen = stream_of(off, j) && *stream_of(off, j) == s;
		if (!seen)
			st = vmmrt__offload_drain_stream(rt, s, i < off->ngroups ? "compute" : "capture copy");
	}
	if (st == VMMRT_OK)
		st = vmmrt__offload_drain_stream(rt, off->d2h, "d2h");
	if (st == VMMRT_OK)
		st = vmmrt__offload_drain_stream(rt, off->h2d, "h2d");
	if (st == VMMRT_OK)
		st = vmmrt__offload_worker_barrier(rt);
	if (st == VMMRT_OK && !VMMRT__PLANTED(off, VMMRT__PLANT_ABORT_NO_RESET))
		st = off->ops->reset(off);
	if (st != VMMRT_OK) {
		/* Still in flight: the pipeline stays refused, and the call may be
		 * made again (or the runtime destroyed). */
		snprintf(off->broken_why, sizeof(off->broken_why), "abort could not drain the pipeline: %s",
			 vmmrt_last_error());
		off->broken = true;
		return st;
	}
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		g->begun = VMMRT__BEGUN_NONE;
		g->restore_use = 0;
		/* Failures of the abandoned uses: the abort is what they asked for. */
		(void)vmmrt__group_take_error(g);
	}
	vmmrt__error_clear();
	vmmrt__schedule_restart(&off->sched);
	off->broken = false;
	off->broken_why[0] = '\0';
	return VMMRT_OK;
}

vmmrt_status vmmrt_offload_abort(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	vmmrt__offload *off = rt->offload;
	if (!off || !off->allocated)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "offload not allocated (vmmrt_offload_allocate): no "
				    "iteration to abort");
	uatomic_inc(&rt->launch_blocking); /* it waits for the GPU, by design */
	vmmrt_status st = drain_and_reset(off);
	if (st == VMMRT_OK)
		off->aborts++;
	return st;
}

vmmrt_status vmmrt_group_rediscover(vmmrt_group *g)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(g, "group is NULL");
	vmmrt__offload *off = g->off;
	if (g->state == VMMRT_GROUP_CAPTURING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s' is capturing: end the capture first", g->name);
	if (g->state == VMMRT_GROUP_DISCOVERING) {
		/* Nothing allocated yet: discovery starts over. */
		g->ndesc = 0;
		g->bytes = 0;
		return VMMRT_OK;
	}
	for (unsigned i = 0; i < off->ngroups; i++)
		if (off->groups[i]->begun != VMMRT__BEGUN_NONE)
			return vmmrt__error(VMMRT_E_INVALID_STATE,
					    "group '%s': the %s of group '%s' was begun and not ended; end it, or "
					    "vmmrt_offload_abort the iteration",
					    g->name, off->groups[i]->begun == VMMRT__BEGUN_FORWARD ? "forward" : "backward",
					    off->groups[i]->name);
	if (vmmrt__schedule_mid_iteration(&off->sched) && !off->needs_allocate)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				    "group '%s': an iteration is under way; finish it, or vmmrt_offload_abort it, "
				    "before discovering again", g->name);
	uatomic_inc(&off->rt->launch_blocking);
	/* Prefetches made for the next iteration (remap's maps for its first
	 * uses) would hold the old memory: drain, as an abort does. */
	vmmrt_status st = off->needs_allocate ? VMMRT_OK : drain_and_reset(off);
	if (st != VMMRT_OK)
		return st;
	if ((st = vmmrt__group_retire(g)) != VMMRT_OK)
		return st;
	off->needs_allocate = true;
	return VMMRT_OK;
}

vmmrt_status vmmrt_offload_release_retired(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	vmmrt__offload *off = rt->offload;
	if (!off || !off->nretired)
		return VMMRT_OK;
	/* The copies of a retired group drained when it was re-discovered. */
	vmmrt__group_free_retired(off);
	return VMMRT_OK;
}

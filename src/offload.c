/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The offload hooks: where the schedule (which use comes now, what to
 * prefetch) meets the strategy (what that means for memory). Also the
 * offload state's creation with the runtime, allocation, synchronization,
 * statistics and teardown.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "clock.h"
#include "error.h"
#include "offload.h"
#include "pipeline.h"
#include "worker.h"

vmmrt_status vmmrt__offload_create(vmmrt_runtime *rt)
{
	vmmrt__offload *off = calloc(1, sizeof(*off));
	if (!off)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "offload state");
	off->rt = rt;
	switch (rt->mode) {
	case VMMRT_MODE_PINGPONG: off->ops = &vmmrt__strategy_pingpong; break;
	case VMMRT_MODE_REMAP: off->ops = &vmmrt__strategy_remap; break;
	default: off->ops = &vmmrt__strategy_none; break;
	}
	rt->offload = off;
	return VMMRT_OK;
}

/* Undo allocation, keeping the groups and their descriptors. */
static void release_allocation(vmmrt__offload *off)
{
	vmmrt_runtime *rt = off->rt;
	if (off->allocated && off->ops->quiesce)
		off->ops->quiesce(off);
	if ((off->d2h && vmmrt__offload_drain_stream(rt, off->d2h, "d2h") != VMMRT_OK) ||
	    (off->h2d && vmmrt__offload_drain_stream(rt, off->h2d, "h2d") != VMMRT_OK))
		off->stuck = true;
	vmmrt__group_free_retired(off);
	off->ops->destroy(off);
	for (unsigned i = 0; i < off->ngroups; i++)
		vmmrt__group_release(off->groups[i]);
	/* A stuck stream stays: destroying it may wait for its work (the host
	 * backend joins its thread), which is waiting for a map that will not
	 * come. The backend's close abandons it. */
	if (off->d2h && !off->stuck)
		(void)vmmrt__drv_stream_destroy(rt, off->d2h);
	if (off->h2d && !off->stuck)
		(void)vmmrt__drv_stream_destroy(rt, off->h2d);
	off->d2h = off->h2d = NULL;
	vmmrt__schedule_free(&off->sched);
	off->allocated = false;
	off->needs_allocate = false;
}

/* The schedule for this allocation: declared, or to be recorded. */
static vmmrt_status prepare_schedule(vmmrt__offload *off, unsigned n)
{
	vmmrt__schedule_free(&off->sched);
	vmmrt_status st = vmmrt__schedule_init(&off->sched, n, off->ngroups);
	if (st != VMMRT_OK || !off->declared)
		return st;
	const char **names = calloc(off->ngroups ? off->ngroups : 1, sizeof(*names));
	if (!names)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "schedule");
	for (unsigned i = 0; i < off->ngroups; i++)
		names[i] = off->groups[i]->name;
	for (unsigned k = 0; k < off->ndeclared && st == VMMRT_OK; k++)
		if (!off->groups[off->declared[k].group]->ndesc)
			st = vmmrt__error(VMMRT_E_MISMATCH, "declared schedule, use %u: group '%s' has no tensors (its "
					  "hooks do nothing, so it has no place in the order)", k,
					  names[off->declared[k].group]);
	if (st == VMMRT_OK)
		st = vmmrt__schedule_declare(&off->sched, off->declared, off->ndeclared, names);
	free(names);
	return st;
}

/* A re-allocation failed: the groups it was for go back to discovery. */
static void undo_new(vmmrt__offload *off, const bool *fresh)
{
	for (unsigned i = 0; i < off->ngroups; i++)
		if (fresh[i]) {
			off->ops->free_group(off, off->groups[i]);
			vmmrt__group_release(off->groups[i]);
		}
}

vmmrt_status vmmrt_offload_allocate(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	vmmrt_status st;
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	vmmrt__offload *off = rt->offload;
	if (off->allocated && !off->needs_allocate)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "offload already allocated (vmmrt_group_rediscover makes "
				    "groups to allocate again)");
	bool again = off->allocated;
	unsigned n = 0;
	bool *fresh = calloc(off->ngroups ? off->ngroups : 1, sizeof(*fresh));
	if (!fresh)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "allocation");
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		n += g->ndesc != 0;
		fresh[i] = g->state == VMMRT_GROUP_DISCOVERING;
	}
	if ((st = prepare_schedule(off, n)) != VMMRT_OK)
		goto fail;
	if (!off->d2h && ((st = vmmrt__drv_stream_create(rt, &off->d2h)) != VMMRT_OK ||
			  (st = vmmrt__drv_stream_create(rt, &off->h2d)) != VMMRT_OK))
		goto fail;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (fresh[i] && g->ndesc && (st = vmmrt__group_alloc_common(g)) != VMMRT_OK)
			goto fail;
	}
	if ((st = off->ops->allocate(off)) != VMMRT_OK)
		goto fail;
	for (unsigned i = 0; i < off->ngroups; i++)
		if (fresh[i])
			off->groups[i]->state = VMMRT_GROUP_ALLOCATED;
	if (off->sched.recorded)
		off->ops->plan(off);
	off->allocated = true;
	off->needs_allocate = false;
	free(off->declared);
	off->declared = NULL;
	off->ndeclared = 0;
	free(fresh);
	return VMMRT_OK;
fail:;
	/* Leave nothing half-built: allocation can be retried, or the runtime
	 * destroyed. The clean-up may fail too; the caller hears of the cause. */
	char why[512];
	snprintf(why, sizeof(why), "%s", vmmrt_last_error());
	if (again) {
		undo_new(off, fresh);
		vmmrt__schedule_free(&off->sched);
	} else {
		release_allocation(off);
	}
	free(fresh);
	vmmrt__error_adopt(why);
	return st;
}

vmmrt_status vmmrt_offload_set_schedule(vmmrt_runtime *rt, const vmmrt_schedule_step *steps, size_t nsteps)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(steps || nsteps == 0, "steps is NULL");
	vmmrt__offload *off = rt->offload;
	if (off->allocated && !off->needs_allocate)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "the schedule is declared before vmmrt_offload_allocate (the "
				    "ping-pong banks are made from it, and the graphs see their addresses)");
	if (nsteps > 2ull * off->ngroups)
		return vmmrt__error(VMMRT_E_MISMATCH, "%zu steps for %u groups (at most a forward and a backward each)",
				    nsteps, off->ngroups);
	vmmrt__use *uses = calloc(nsteps ? nsteps : 1, sizeof(*uses));
	if (!uses)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "schedule of %zu steps", nsteps);
	for (size_t k = 0; k < nsteps; k++) {
		vmmrt_group *g = steps[k].group;
		if (!g || g->off != off || g->index >= off->ngroups || off->groups[g->index] != g) {
			free(uses);
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "step %zu: %s", k,
					    g ? "a group of another runtime" : "group is NULL");
		}
		if (steps[k].backward > 1) {
			free(uses);
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "step %zu: backward is %u (0 or 1)", k,
					    steps[k].backward);
		}
		uses[k] = (vmmrt__use){g->index, steps[k].backward != 0};
	}
	/* Checked now against the rules of an order (the group counts are
	 * checked again at allocation, when discovery is over). */
	vmmrt__schedule trial;
	unsigned n = (unsigned)(nsteps / 2);
	vmmrt_status st = vmmrt__schedule_init(&trial, n, off->ngroups);
	if (st == VMMRT_OK) {
		const char **names = calloc(off->ngroups ? off->ngroups : 1, sizeof(*names));
		if (!names) {
			st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "schedule");
		} else {
			for (unsigned i = 0; i < off->ngroups; i++)
				names[i] = off->groups[i]->name;
			st = nsteps % 2 ? vmmrt__error(VMMRT_E_MISMATCH, "%zu steps: an odd count (each group has a "
						       "forward and a backward)", nsteps)
					: vmmrt__schedule_declare(&trial, uses, (unsigned)nsteps, names);
			free(names);
		}
		vmmrt__schedule_free(&trial);
	}
	if (st != VMMRT_OK) {
		free(uses);
		return st;
	}
	free(off->declared);
	off->declared = nsteps ? uses : NULL;
	off->ndeclared = (unsigned)nsteps;
	if (!nsteps)
		free(uses); /* an empty schedule: back to recording it */
	return VMMRT_OK;
}

/*
 * The hooks' waits and event records must run on the compute stream, not go
 * into a graph being captured on it: a captured record never happens, so the
 * event a worker polls before a release reads as complete, and the slot is
 * unmapped before the restore and the backward that need it have run. Such a
 * stream is refused before the hook changes anything.
 */
static vmmrt_status refuse_capturing(vmmrt_runtime *rt, vmmrt_stream compute, const char *what)
{
	bool capturing = false;
	vmmrt_status st = vmmrt__drv_stream_is_capturing(rt, compute, &capturing);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: asking whether the compute stream is capturing", what);
	if (capturing)
		return vmmrt__error(VMMRT_E_CAPTURE, "%s: stream is capturing a graph", what);
	return VMMRT_OK;
}

/* After the public prologue (VMMRT__API_ENTER): may the hook run on g now?
 * asked: this call asked already whether compute is capturing (the begin
 * of vmmrt_group_replay's use: its end asks no second time, a driver call
 * per use on the launch thread's path). */
static vmmrt_status hook_entry(vmmrt_group *g, vmmrt_stream compute, const char *what, bool asked)
{
	vmmrt_status st;
	VMMRT__CHECK_ARG(g, "group is NULL");
	if (!g->off->allocated || g->state == VMMRT_GROUP_DISCOVERING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' is not allocated", what, g->name);
	if (g->state == VMMRT_GROUP_CAPTURING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' is capturing", what, g->name);
	if (g->off->needs_allocate)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "%s: groups were re-discovered; vmmrt_offload_allocate them before the next iteration",
				   what);
	if (g->off->broken)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "%s: an earlier hook failed part-way (%s); vmmrt_offload_abort the iteration (or "
				   "destroy the runtime)",
				   what, g->off->broken_why);
	/* Before the group's error is reported, since reporting clears it. Empty
	 * groups too: a hook on a capturing stream is a mistake whatever the group. */
	if (!asked && (st = refuse_capturing(g->off->rt, compute, what)) != VMMRT_OK)
		return st;
	/* An earlier asynchronous failure is reported by the next hook on the group. */
	return vmmrt__group_take_error(g);
}

/* The current use must have been requested before the strategy waits on it. */
static vmmrt_status ensure_current(vmmrt__offload *off, vmmrt_group *g, bool backward)
{
	vmmrt__schedule *s = &off->sched;
	if (s->requested > s->use)
		return VMMRT_OK;
	vmmrt_status st = off->ops->prefetch(off, g, backward, s->use);
	if (st == VMMRT_OK)
		s->requested = s->use + 1;
	return st;
}

/*
 * The look-ahead window, requested after the current use has started, so a
 * strategy sees uses in schedule order: a restore that would overwrite a bank
 * still in use by the current graph is deferred until that graph has ended.
 */
static vmmrt_status prefetch_window(vmmrt__offload *off)
{
	vmmrt__schedule *s = &off->sched;
	uint64_t from, to;
	vmmrt__schedule_window(s, off->lookahead_in_force, &from, &to);
	for (uint64_t u = from; u < to; u++) {
		bool b;
		vmmrt_group *next = off->groups[vmmrt__schedule_group_of(s, u, &b)];
		vmmrt_status st = off->ops->prefetch(off, next, b, u);
		if (st != VMMRT_OK)
			return st;
	}
	return VMMRT_OK;
}

/*
 * A hook that fails after its checks may have enqueued part of its work (a
 * copy without its release, a map without its restore): continuing would
 * run later uses against a pipeline that no longer matches the schedule,
 * so the offload refuses every later hook. Whatever was enqueued drains.
 */
static vmmrt_status mark_broken(vmmrt__offload *off, vmmrt_status st)
{
	if (st != VMMRT_OK && !off->broken) {
		snprintf(off->broken_why, sizeof(off->broken_why), "%s", vmmrt_last_error());
		off->broken = true;
	}
	return st;
}

static vmmrt_status begin(vmmrt_group *g, vmmrt_stream compute, bool backward, const char *what)
{
	vmmrt_status st = hook_entry(g, compute, what, false);
	if (st != VMMRT_OK || g->ndesc == 0)
		return st;
	vmmrt__offload *off = g->off;
	if (g->begun != VMMRT__BEGUN_NONE)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' has a %s that was not ended", what, g->name,
				   g->begun == VMMRT__BEGUN_FORWARD ? "forward" : "backward");
	bool known = off->sched.recorded;
	if ((st = vmmrt__schedule_enter(&off->sched, g, backward)) != VMMRT_OK)
		return st;
	if (!known && off->sched.recorded)
		off->ops->plan(off); /* the first iteration has shown the order */
	if ((st = ensure_current(off, g, backward)) != VMMRT_OK ||
	    (st = (backward ? off->ops->backward_begin : off->ops->forward_begin)(off, g, compute)) != VMMRT_OK)
		return mark_broken(off, st);
	g->begun = backward ? VMMRT__BEGUN_BACKWARD : VMMRT__BEGUN_FORWARD;
	g->stream = compute; /* what an abort waits for */
	g->streamed = true;
	return mark_broken(off, prefetch_window(off));
}

static vmmrt_status end(vmmrt_group *g, vmmrt_stream compute, bool backward, const char *what, bool asked)
{
	vmmrt_status st = hook_entry(g, compute, what, asked);
	if (st != VMMRT_OK || g->ndesc == 0)
		return st;
	if (g->begun != (backward ? VMMRT__BEGUN_BACKWARD : VMMRT__BEGUN_FORWARD))
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' has no %s begun", what, g->name,
				   backward ? "backward" : "forward");
	vmmrt__offload *off = g->off;
	st = mark_broken(off, (backward ? off->ops->backward_end : off->ops->forward_end)(off, g, compute));
	if (st == VMMRT_OK) {
		g->begun = VMMRT__BEGUN_NONE;
		if (backward && off->sched.use % (2ull * off->sched.n) == 2ull * off->sched.n - 1)
			off->iterations++;
	}
	return st;
}

vmmrt_status vmmrt_forward_begin(vmmrt_group *g, vmmrt_stream compute)
{
	VMMRT__API_ENTER();
	return begin(g, compute, false, __func__);
}

vmmrt_status vmmrt_forward_end(vmmrt_group *g, vmmrt_stream compute)
{
	VMMRT__API_ENTER();
	return end(g, compute, false, __func__, false);
}

vmmrt_status vmmrt_backward_begin(vmmrt_group *g, vmmrt_stream compute)
{
	VMMRT__API_ENTER();
	return begin(g, compute, true, __func__);
}

vmmrt_status vmmrt_backward_end(vmmrt_group *g, vmmrt_stream compute)
{
	VMMRT__API_ENTER();
	return end(g, compute, true, __func__, false);
}

/*
 * The copies of vmmrt_group_replay_copies, checked before the begin hook so
 * that a bad one leaves the iteration as it was: the driver would take an
 * overlapping pair (cuMemcpyDtoDAsync's result is then undefined) or a NULL
 * address (a fault on the stream, found at the next synchronize).
 */
static vmmrt_status check_copies(const vmmrt_group *g, const vmmrt_replay_copy *copies, size_t ncopies)
{
	if (ncopies && !copies)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "vmmrt_group_replay_copies: group '%s': copies is NULL "
				    "and ncopies %zu",
				    g->name, ncopies);
	for (size_t i = 0; i < ncopies; i++) {
		const vmmrt_replay_copy *c = &copies[i];
		if (c->bytes == 0 || c->dst == c->src)
			continue;
		if (!c->dst || !c->src)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "vmmrt_group_replay_copies: group '%s': copy %zu "
					    "has a NULL %s",
					    g->name, i, c->dst ? "source" : "destination");
		if (c->dst + c->bytes < c->dst || c->src + c->bytes < c->src)
			return vmmrt__error(VMMRT_E_INVALID_SIZE, "vmmrt_group_replay_copies: group '%s': copy %zu "
					    "of %zu bytes wraps around the address space",
					    g->name, i, c->bytes);
		if (c->dst < c->src + c->bytes && c->src < c->dst + c->bytes)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "vmmrt_group_replay_copies: group '%s': copy %zu "
					    "overlaps its source (0x%llx <- 0x%llx, %zu bytes)",
					    g->name, i, (unsigned long long)c->dst, (unsigned long long)c->src, c->bytes);
	}
	return VMMRT_OK;
}

/*
 * A use's two hooks and its graph in one call, for a caller that pays for
 * every call it makes (a Python autograd Function: a call per hook and one
 * per replay were most of its time per layer). The handle and the copies are
 * checked before the begin hook, so a wrong one leaves the iteration as it
 * was; a copy or launch that fails after the begin leaves part of the use
 * enqueued, as any hook failing part-way does: the offload is then refused
 * until an abort. The copies come after the begin because it is what makes
 * writing the group's bytes safe: in ping-pong a bank's earlier group may
 * still be on its way to the host until the forward's fence.
 */
static vmmrt_status replay(vmmrt_group *g, int backward, uintptr_t graph_exec, vmmrt_stream compute,
			   const vmmrt_replay_copy *copies, size_t ncopies, const char *what)
{
	VMMRT__CHECK_ARG(g, "group is NULL");
	if (backward != 0 && backward != 1)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: backward is %d: 0 (the forward) or 1 (the backward)",
				    what, backward);
	vmmrt_runtime *rt = g->off->rt;
	vmmrt_status st;
	if (graph_exec != 0 && (st = vmmrt__drv_exec_check(rt, graph_exec)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: group '%s'", what, g->name);
	if ((st = check_copies(g, copies, ncopies)) != VMMRT_OK)
		return st;
	if ((st = begin(g, compute, backward, what)) != VMMRT_OK)
		return st;
	for (size_t i = 0; i < ncopies; i++) {
		const vmmrt_replay_copy *c = &copies[i];
		if (c->bytes == 0 || c->dst == c->src)
			continue;
		if ((st = vmmrt__drv_memcpy_dtod_async(rt, c->dst, c->src, c->bytes, compute)) != VMMRT_OK) {
			st = vmmrt__error_wrap(st, "%s: group '%s': copy %zu after its %s began", what, g->name, i,
					       backward ? "backward" : "forward");
			return g->ndesc ? mark_broken(g->off, st) : st;
		}
	}
	if (graph_exec != 0 && (st = vmmrt__drv_exec_launch(rt, graph_exec, compute)) != VMMRT_OK) {
		st = vmmrt__error_wrap(st, "%s: group '%s': launching its graph after its %s began", what, g->name,
				       backward ? "backward" : "forward");
		return g->ndesc ? mark_broken(g->off, st) : st;
	}
	return end(g, compute, backward, what, true);
}

vmmrt_status vmmrt_group_replay(vmmrt_group *g, int backward, uintptr_t graph_exec, vmmrt_stream compute)
{
	VMMRT__API_ENTER();
	return replay(g, backward, graph_exec, compute, NULL, 0, __func__);
}

vmmrt_status vmmrt_group_replay_copies(vmmrt_group *g, int backward, uintptr_t graph_exec, vmmrt_stream compute,
				       const vmmrt_replay_copy *copies, size_t ncopies)
{
	VMMRT__API_ENTER();
	return replay(g, backward, graph_exec, compute, copies, ncopies, __func__);
}

int vmmrt_group_stays(const vmmrt_group *g)
{
	/* No API entry: a query of the launch thread's own state, as
	 * vmmrt_group_bytes, that neither fails nor sets the last error. */
	return g && g->off && g->off->allocated && g->ndesc && vmmrt__offload_stays(g->off, g);
}

vmmrt_status vmmrt_offload_sync(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	vmmrt_status st;
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	vmmrt__offload *off = rt->offload;
	if (!off || !off->allocated)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "offload not allocated (vmmrt_offload_allocate)");
	/* A group that failed may have left a stream waiting for it: say so now
	 * rather than time out on the stream. */
	for (unsigned i = 0; i < off->ngroups; i++)
		if ((st = vmmrt__group_take_error(off->groups[i])) != VMMRT_OK)
			return st;
	uatomic_inc(&rt->launch_blocking);
	if ((st = vmmrt__offload_drain_stream(rt, off->d2h, "d2h")) != VMMRT_OK || (st = vmmrt__offload_drain_stream(rt, off->h2d, "h2d")) != VMMRT_OK) {
		/* A group that failed while we waited is why the stream is stuck: say that. */
		for (unsigned i = 0; i < off->ngroups; i++) {
			vmmrt_status gst = vmmrt__group_take_error(off->groups[i]);
			if (gst != VMMRT_OK)
				return gst;
		}
		return st;
	}
	/* Releases pushed by the last host functions may still be queued. */
	if ((st = vmmrt__offload_worker_barrier(rt)) != VMMRT_OK)
		return st;
	for (unsigned i = 0; i < off->ngroups; i++)
		if ((st = vmmrt__group_take_error(off->groups[i])) != VMMRT_OK)
			return st;
	return VMMRT_OK;
}

vmmrt_status vmmrt_offload_stats_get(vmmrt_runtime *rt, vmmrt_offload_stats *out)
{
	VMMRT__API_ENTER(); /* the copy times come from driver events */
	VMMRT__CHECK_ARG(rt && out, "NULL argument");
	vmmrt_offload_stats full = {.size = sizeof(full)};
	vmmrt_offload_stats *o = &full;
	o->mode = rt->mode;
	o->lookahead = rt->lookahead;
	o->launch_thread_blocking = vmmrt__drv_launch_thread_blocking(rt);
	o->slot_bytes = (uint64_t)uatomic_read(&rt->slot_bytes);
	o->slot_peak_bytes = (uint64_t)uatomic_read(&rt->slot_peak_bytes);
	vmmrt__offload *off = rt->offload;
	if (!off)
		return VMMRT__SIZED_OUT(out, full, VMMRT__OFFLOAD_STATS_SIZE_V1, "vmmrt_offload_stats");
	o->groups = off->ngroups;
	o->iterations = off->iterations;
	o->schedule_recorded = off->sched.recorded;
	o->schedule_declared = off->sched.declared;
	o->lookahead_in_force = off->sched.recorded ? off->lookahead_in_force : 0;
	o->aborts = off->aborts;
	o->retired_groups = off->nretired;
	off->ops->stats(off, o);
	o->bytes_offloaded = uatomic_read(&off->bytes_offloaded);
	o->bytes_restored = uatomic_read(&off->bytes_restored);
	o->activation_bytes = (uint64_t)uatomic_read(&off->activation_bytes);
	o->activation_peak_bytes = (uint64_t)uatomic_read(&off->activation_peak);
	o->maps = uatomic_read(&off->maps);
	o->releases = uatomic_read(&off->releases);
	o->bank_conflicts = off->bank_conflicts;
	/* Completed copies only: an event still pending is skipped, not waited for. */
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		float ms;
		if (g->timed_d2h && vmmrt__drv_event_elapsed_ms(rt, g->d2h_start, g->d2h_done, &ms) == VMMRT_OK) {
			o->last_d2h_ms += ms;
			o->last_d2h_bytes += g->bytes;
		}
		if (g->timed_h2d && vmmrt__drv_event_elapsed_ms(rt, g->h2d_start, g->restored, &ms) == VMMRT_OK) {
			o->last_h2d_ms += ms;
			o->last_h2d_bytes += g->bytes;
		}
	}
	vmmrt__error_clear(); /* a pending event is not a failure of this call */
	return VMMRT__SIZED_OUT(out, full, VMMRT__OFFLOAD_STATS_SIZE_V1, "vmmrt_offload_stats");
}

vmmrt_status vmmrt_offload_stats_reset(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	/* The peak from what is mapped now; a worker mapping meanwhile raises
	 * it again past this value, which is what a peak from now on means. */
	uatomic_set(&rt->slot_peak_bytes, uatomic_read(&rt->slot_bytes));
	vmmrt__offload *off = rt->offload;
	if (!off)
		return VMMRT_OK;
	/* Allocation maps every group once, for capture: a peak measured from
	 * there says nothing about the steady state, so callers restart it. */
	uatomic_set(&off->activation_peak, uatomic_read(&off->activation_bytes));
	uatomic_set(&off->bytes_offloaded, 0);
	uatomic_set(&off->bytes_restored, 0);
	uatomic_set(&off->maps, 0);
	uatomic_set(&off->releases, 0);
	off->bank_conflicts = 0;
	return VMMRT_OK;
}

vmmrt_status vmmrt__offload_destroy(vmmrt_runtime *rt)
{
	vmmrt__offload *off = rt->offload;
	if (!off)
		return VMMRT_OK;
	/* Copies and host functions in flight refer to the groups: they finish first. */
	release_allocation(off);
	free(off->declared);
	free(off->retired);
	bool stuck = off->stuck;
	for (unsigned i = 0; i < off->ngroups; i++)
		vmmrt__group_free(off->groups[i]);
	free(off->groups);
	free(off);
	rt->offload = NULL;
	if (stuck)
		return vmmrt__error(VMMRT_E_BUSY, "offload teardown: a copy stream still waits for a map that could "
				   "not be made; the words it polls were left allocated");
	return VMMRT_OK;
}


/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The offload hooks: where the schedule (which use comes now, what to
 * prefetch) meets the strategy (what that means for memory). Also allocation,
 * synchronization, statistics and teardown of the runtime's offload state.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "error.h"
#include "offload.h"

vmmrt__offload *vmmrt__offload_get(vmmrt_runtime *rt, vmmrt_status *st)
{
	if (rt->offload)
		return rt->offload;
	vmmrt__offload *off = calloc(1, sizeof(*off));
	if (!off) {
		*st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "offload state");
		return NULL;
	}
	off->rt = rt;
	switch (rt->mode) {
	case VMMRT_MODE_PINGPONG: off->ops = &vmmrt__strategy_pingpong; break;
	case VMMRT_MODE_REMAP: off->ops = &vmmrt__strategy_remap; break;
	default: off->ops = &vmmrt__strategy_none; break;
	}
	rt->offload = off;
	return off;
}

void vmmrt__offload_account(vmmrt__offload *off, int64_t delta)
{
	int64_t now = uatomic_add_return(&off->activation_bytes, delta);
	for (int64_t peak = uatomic_read(&off->activation_peak); now > peak;
	     peak = uatomic_read(&off->activation_peak))
		if (uatomic_cmpxchg(&off->activation_peak, peak, now) == peak)
			break;
}

static vmmrt_status get_ready(vmmrt_runtime *rt, vmmrt__offload **out)
{
	vmmrt__error_clear();
	vmmrt_status st = vmmrt__drv_check_caller("vmmrt offload");
	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(rt, "runtime is NULL");
	if (!rt->offload || !rt->offload->allocated)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "offload not allocated (vmmrt_offload_allocate)");
	*out = rt->offload;
	return VMMRT_OK;
}

/* Bounded wait for a stream without cuStreamSynchronize's unbounded block. */
static vmmrt_status drain_stream(vmmrt_runtime *rt, vmmrt_stream s, const char *name)
{
	uint64_t deadline = vmmrt__now_ns() + rt->timeout_ms * 1000000ull;
	for (unsigned spin = 0;; spin++) {
		bool done = false;
		vmmrt_status st = vmmrt__drv_stream_query(rt, s, &done);
		if (st != VMMRT_OK || done)
			return st;
		if (vmmrt__now_ns() > deadline)
			return vmmrt__error(VMMRT_E_TIMEOUT, "offload %s stream still busy after %llu ms", name,
					   (unsigned long long)rt->timeout_ms);
		struct timespec ts = {0, spin < 100 ? 20000 : 1000000};
		nanosleep(&ts, NULL);
	}
}

/* Undo allocation, keeping the groups and their descriptors. */
static void release_allocation(vmmrt__offload *off)
{
	vmmrt_runtime *rt = off->rt;
	if (off->allocated && off->ops->quiesce)
		off->ops->quiesce(off);
	if ((off->d2h && drain_stream(rt, off->d2h, "d2h") != VMMRT_OK) ||
	    (off->h2d && drain_stream(rt, off->h2d, "h2d") != VMMRT_OK))
		off->stuck = true;
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
}

vmmrt_status vmmrt_offload_allocate(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER();
	vmmrt_status st;
	VMMRT_CHECK_ARG(rt, "runtime is NULL");
	vmmrt__offload *off = vmmrt__offload_get(rt, &st);
	if (!off)
		return st;
	if (off->allocated)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "offload already allocated");
	unsigned n = 0;
	for (unsigned i = 0; i < off->ngroups; i++)
		if (off->groups[i]->ndesc)
			n++;
	if ((st = vmmrt__schedule_init(&off->sched, n)) != VMMRT_OK)
		return st;
	if ((st = vmmrt__drv_stream_create(rt, &off->d2h)) != VMMRT_OK ||
	    (st = vmmrt__drv_stream_create(rt, &off->h2d)) != VMMRT_OK)
		goto fail;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (g->ndesc && (st = vmmrt__group_alloc_common(g)) != VMMRT_OK)
			goto fail;
	}
	if ((st = off->ops->allocate(off)) != VMMRT_OK)
		goto fail;
	for (unsigned i = 0; i < off->ngroups; i++)
		off->groups[i]->state = VMMRT_GROUP_ALLOCATED;
	off->allocated = true;
	return VMMRT_OK;
fail:;
	/* Leave nothing half-built: allocation can be retried, or the runtime
	 * destroyed. The clean-up may fail too; the caller hears of the cause. */
	char why[512];
	snprintf(why, sizeof(why), "%s", vmmrt_last_error());
	release_allocation(off);
	vmmrt__error_adopt(why);
	return st;
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

static vmmrt_status hook_entry(vmmrt_group *g, vmmrt_stream compute, const char *what)
{
	vmmrt__error_clear();
	vmmrt_status st = vmmrt__drv_check_caller(what);
	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(g, "group is NULL");
	if (!g->off->allocated || g->state == VMMRT_GROUP_DISCOVERING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' is not allocated", what, g->name);
	if (g->state == VMMRT_GROUP_CAPTURING)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' is capturing", what, g->name);
	if (g->off->broken)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "%s: an earlier hook failed part-way (%s); drain with vmmrt_offload_sync and "
				   "destroy the runtime",
				   what, g->off->broken_why);
	/* Before the group's error is reported, since reporting clears it. Empty
	 * groups too: a hook on a capturing stream is a mistake whatever the group. */
	if ((st = refuse_capturing(g->off->rt, compute, what)) != VMMRT_OK)
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
	unsigned la = off->rt->lookahead < off->ops->max_lookahead ? off->rt->lookahead : off->ops->max_lookahead;
	vmmrt__schedule_window(s, la, &from, &to);
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
static vmmrt_status broke(vmmrt__offload *off, vmmrt_status st)
{
	if (st != VMMRT_OK && !off->broken) {
		snprintf(off->broken_why, sizeof(off->broken_why), "%s", vmmrt_last_error());
		off->broken = true;
	}
	return st;
}

static vmmrt_status begin(vmmrt_group *g, vmmrt_stream compute, bool backward, const char *what)
{
	vmmrt_status st = hook_entry(g, compute, what);
	if (st != VMMRT_OK || g->ndesc == 0)
		return st;
	vmmrt__offload *off = g->off;
	if (g->open)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' has a %s that was not ended", what, g->name,
				   g->open == 1 ? "forward" : "backward");
	if ((st = vmmrt__schedule_enter(&off->sched, g, backward)) != VMMRT_OK)
		return st;
	if ((st = ensure_current(off, g, backward)) != VMMRT_OK ||
	    (st = (backward ? off->ops->backward_begin : off->ops->forward_begin)(off, g, compute)) != VMMRT_OK)
		return broke(off, st);
	g->open = backward ? 2 : 1;
	return broke(off, prefetch_window(off));
}

static vmmrt_status end(vmmrt_group *g, vmmrt_stream compute, bool backward, const char *what)
{
	vmmrt_status st = hook_entry(g, compute, what);
	if (st != VMMRT_OK || g->ndesc == 0)
		return st;
	if (g->open != (backward ? 2 : 1))
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: group '%s' has no %s begun", what, g->name,
				   backward ? "backward" : "forward");
	vmmrt__offload *off = g->off;
	st = broke(off, (backward ? off->ops->backward_end : off->ops->forward_end)(off, g, compute));
	if (st == VMMRT_OK) {
		g->open = 0;
		if (backward && off->sched.use % (2ull * off->sched.n) == 2ull * off->sched.n - 1)
			off->iterations++;
	}
	return st;
}

vmmrt_status vmmrt_forward_begin(vmmrt_group *g, vmmrt_stream compute)
{
	return begin(g, compute, false, __func__);
}

vmmrt_status vmmrt_forward_end(vmmrt_group *g, vmmrt_stream compute)
{
	return end(g, compute, false, __func__);
}

vmmrt_status vmmrt_backward_begin(vmmrt_group *g, vmmrt_stream compute)
{
	return begin(g, compute, true, __func__);
}

vmmrt_status vmmrt_backward_end(vmmrt_group *g, vmmrt_stream compute)
{
	return end(g, compute, true, __func__);
}

vmmrt_status vmmrt_offload_sync(vmmrt_runtime *rt)
{
	vmmrt__offload *off = NULL;
	vmmrt_status st = get_ready(rt, &off);
	if (st != VMMRT_OK)
		return st;
	/* A group that failed may have left a stream waiting for it: say so now
	 * rather than time out on the stream. */
	for (unsigned i = 0; i < off->ngroups; i++)
		if ((st = vmmrt__group_take_error(off->groups[i])) != VMMRT_OK)
			return st;
	uatomic_inc(&rt->launch_blocking);
	if ((st = drain_stream(rt, off->d2h, "d2h")) != VMMRT_OK || (st = drain_stream(rt, off->h2d, "h2d")) != VMMRT_OK) {
		/* A group that failed while we waited is why the stream is stuck: say that. */
		for (unsigned i = 0; i < off->ngroups; i++) {
			vmmrt_status gst = vmmrt__group_take_error(off->groups[i]);
			if (gst != VMMRT_OK)
				return gst;
		}
		return st;
	}
	/* Releases pushed by the last host functions may still be queued: a
	 * no-op request behind them on every worker is the barrier. It is on the
	 * heap so a timed-out wait can leave it to the worker. */
	for (unsigned w = 0; w < vmmrt__workers_count(rt->workers); w++) {
		vmmrt__request *barrier = malloc(sizeof(*barrier));
		if (!barrier)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "offload sync");
		vmmrt__request_init(barrier, VMMRT_REQ_CALL, NULL);
		if ((st = vmmrt__worker_push(rt->workers, w, barrier)) != VMMRT_OK) {
			free(barrier);
			return st;
		}
		if ((st = vmmrt__request_wait_owned(barrier, rt->timeout_ms)) != VMMRT_OK)
			return st;
	}
	for (unsigned i = 0; i < off->ngroups; i++)
		if ((st = vmmrt__group_take_error(off->groups[i])) != VMMRT_OK)
			return st;
	return VMMRT_OK;
}

vmmrt_status vmmrt_offload_stats_get(vmmrt_runtime *rt, vmmrt_offload_stats *out)
{
	VMMRT__API_ENTER(); /* the copy times come from driver events */
	VMMRT_CHECK_ARG(rt && out, "NULL argument");
	vmmrt_offload_stats full = {.size = sizeof(full)};
	vmmrt_offload_stats *o = &full;
	o->mode = rt->mode;
	o->lookahead = rt->lookahead;
	o->launch_thread_blocking = vmmrt__drv_launch_thread_blocking(rt);
	vmmrt__offload *off = rt->offload;
	if (!off)
		return VMMRT__SIZED_OUT(out, full, VMMRT__OFFLOAD_STATS_SIZE_V1, "vmmrt_offload_stats");
	o->groups = off->ngroups;
	o->iterations = off->iterations;
	o->schedule_recorded = off->sched.recorded;
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
	VMMRT_CHECK_ARG(rt, "runtime is NULL");
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

vmmrt_status vmmrt__offload_wait(vmmrt__offload *off, vmmrt_stream s, vmmrt__bevent *e)
{
	bool done = false;
	if (vmmrt__drv_event_query(off->rt, e, &done) == VMMRT_OK) {
		if (done)
			return VMMRT_OK;
	} else {
		/* the wait below does the same job, so a failed poll is no failure of the call */
		vmmrt__error_clear();
	}
	return vmmrt__drv_stream_wait_event(off->rt, s, e);
}

/* Timing events around the copy give the bandwidth "while copying". */
vmmrt_status vmmrt__offload_d2h(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st;
	if ((st = vmmrt__drv_event_record(rt, g->d2h_start, off->d2h)) != VMMRT_OK ||
	    (st = g->d2h_graph ? vmmrt__drv_graph_launch(rt, g->d2h_graph, off->d2h)
			       : vmmrt__drv_memcpy_dtoh_async(rt, g->host, g->base, g->bytes, off->d2h)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_record(rt, g->d2h_done, off->d2h)) != VMMRT_OK)
		return st;
	g->timed_d2h = true;
	uatomic_add(&off->bytes_offloaded, g->bytes);
	return VMMRT_OK;
}

vmmrt_status vmmrt__offload_h2d(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st;
	if ((st = vmmrt__drv_event_record(rt, g->h2d_start, off->h2d)) != VMMRT_OK ||
	    (st = g->h2d_graph ? vmmrt__drv_graph_launch(rt, g->h2d_graph, off->h2d)
			       : vmmrt__drv_memcpy_htod_async(rt, g->base, g->host, g->bytes, off->h2d)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_record(rt, g->restored, off->h2d)) != VMMRT_OK)
		return st;
	g->timed_h2d = true;
	uatomic_add(&off->bytes_restored, g->bytes);
	return VMMRT_OK;
}

static vmmrt_status capture_copy(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream s, bool to_host,
				 vmmrt__bgraph **out)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st = vmmrt__drv_begin_capture(rt, s);
	if (st != VMMRT_OK)
		return st;
	vmmrt_status cst = to_host ? vmmrt__drv_memcpy_dtoh_async(rt, g->host, g->base, g->bytes, s)
				   : vmmrt__drv_memcpy_htod_async(rt, g->base, g->host, g->bytes, s);
	vmmrt__bgraph *graph = NULL;
	st = vmmrt__drv_end_capture(rt, s, &graph); /* always end what was begun */
	if (cst != VMMRT_OK) {
		if (graph)
			(void)vmmrt__drv_graph_destroy(rt, graph);
		return cst;
	}
	if (st == VMMRT_OK)
		*out = graph;
	return st;
}

vmmrt_status vmmrt__offload_capture_copies(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_stream s;
	vmmrt_status st = vmmrt__drv_stream_create(off->rt, &s);
	if (st != VMMRT_OK)
		return st;
	st = capture_copy(off, g, s, true, &g->d2h_graph);
	if (st == VMMRT_OK)
		st = capture_copy(off, g, s, false, &g->h2d_graph);
	(void)vmmrt__drv_stream_destroy(off->rt, s);
	if (st != VMMRT_OK) {
		vmmrt__offload_free_copies(off, g);
		return vmmrt__error_wrap(st, "group '%s': capture of its copies", g->name);
	}
	return VMMRT_OK;
}

void vmmrt__offload_free_copies(vmmrt__offload *off, vmmrt_group *g)
{
	if (g->d2h_graph)
		(void)vmmrt__drv_graph_destroy(off->rt, g->d2h_graph);
	if (g->h2d_graph)
		(void)vmmrt__drv_graph_destroy(off->rt, g->h2d_graph);
	g->d2h_graph = g->h2d_graph = NULL;
}

void vmmrt__offload_destroy_slot(vmmrt_slot *s)
{
	vmmrt_status st = vmmrt__slot_destroy(s);
	/* A refused unmap or VA free leaves the slot alive and whole: try once
	 * more rather than drop it. A timeout leaves it to the worker. */
	if (st != VMMRT_OK && st != VMMRT_E_TIMEOUT)
		(void)vmmrt__slot_destroy(s);
}

bool vmmrt__offload_is_tail(const vmmrt__offload *off, const vmmrt_group *g, uint64_t use, bool backward)
{
	const vmmrt__schedule *s = &off->sched;
	uint64_t fwd_use = backward ? use - 1 : use;
	return s->recorded && s->n && use >= 1 && fwd_use >= 2ull * s->n && s->fwd[s->n - 1] == g->index &&
	       s->bwd[0] == g->index;
}

/* Host function: runs on the driver's callback thread, so it only pushes the
 * preallocated request (wait-free, no allocation, no lock). */
static void push_from_host_func(void *arg)
{
	vmmrt__remap_req *r = arg;
	vmmrt_status st = vmmrt__worker_push(r->g->rt->workers, r->g->slot->worker, &r->req);
	if (st != VMMRT_OK) {
		/* The slot stays mapped. The release was counted as handed off when
		 * this function was launched: count it finished, in stream order, or
		 * the group's next map would wait for it forever. */
		vmmrt__group_fail(r->g, st, "queue a release after the copy");
		vmmrt__remap_release_counted(r->g);
	}
}

vmmrt_status vmmrt__offload_push_after(vmmrt__offload *off, vmmrt_stream s, vmmrt__remap_req *r)
{
	return vmmrt__drv_launch_host_func(off->rt, s, push_from_host_func, r);
}

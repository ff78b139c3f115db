/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap: every group has its own fixed-VA slot; physical memory exists only
 * around its uses. After the forward's D2H a host function on the D2H stream
 * queues a RELEASE; before a use a MAP is queued (look-ahead), and the GPU
 * waits for it with a stream wait-value on a host-pinned word the worker
 * stores the map's sequence number into. A restore is then an H2D on the H2D
 * stream behind that wait, and the compute stream waits on its event.
 *
 * The driver workers admit MAPs in schedule order (a ticket), only after the
 * group's previous uses were released, and only while fewer than
 * lookahead + 1 groups are mapped: the device memory of activations never
 * exceeds that, and no worker ever waits on another.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <urcu/uatomic.h>

#include "clock.h"
#include "driver.h"
#include "error.h"
#include "pipeline.h"
#include "remap-admit.h"
#include "remap-pending.h"
#include "remap-teardown.h"
#include "remap-yield.h"

/* The first map of a group finds this backing in place (it needs no
 * release), so the graphs can be captured over mapped memory. */
static vmmrt_status initial_backing(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_status st = vmmrt__slot_map(g->slot);
	if (st != VMMRT_OK)
		return st;
	g->remap.maps_requested = g->remap.releases_planned = 0;
	uatomic_set(&g->remap.releases_done, 0);
	vmmrt__offload_account(off, (int64_t)g->slot->size);
	return VMMRT_OK;
}

static vmmrt_status rm_allocate_group(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st = vmmrt__slot_reserve(rt, g->bytes, &g->slot);
	if (st == VMMRT_OK) {
		g->slot->budgeted = true; /* before any request: its worker reads it */
		st = vmmrt__slot_map(g->slot); /* the initial backing, for capture */
	}
	if (st == VMMRT_OK)
		st = vmmrt__drv_host_alloc(rt, 64, (void **)&g->remap.flag);
	if (st == VMMRT_OK)
		st = vmmrt__drv_host_devptr(rt, g->remap.flag, &g->remap.flag_dev);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': slot of %zu bytes", g->name, g->bytes);
	*g->remap.flag = 0;
	g->base = vmmrt_slot_address(g->slot);
	if ((st = vmmrt__offload_capture_copies(off, g)) != VMMRT_OK)
		return st;
	vmmrt__offload_account(off, (int64_t)g->slot->size);
	vmmrt__remap_requests_init(g);
	for (int j = 0; j < VMMRT__REQ_RING; j++)
		if ((st = vmmrt__drv_event_create(rt, false, &g->remap.rel[VMMRT__USE_BACKWARD][j].ev)) != VMMRT_OK)
			return vmmrt__error_wrap(st, "group '%s': release events", g->name);
	g->remap.owed_index = VMMRT__NOT_OWED;
	return VMMRT_OK;
}

/*
 * Handle reuse: a release keeps its handle for the next map of that size,
 * which then costs cuMemMap + cuMemSetAccess instead of cuMemCreate too
 * (and the release no cuMemRelease): on the H200 about 140 us less on the
 * path from a D2H's end to the next forward's map. The pool holds at most
 * the budget, and a map it cannot serve empties it first (slot-work.c), so
 * the memory mapped and pooled stays within the budget. Only with one
 * worker: another worker's pool would be memory this one cannot empty.
 */
static void set_reuse(vmmrt__offload *off, int64_t budget)
{
	vmmrt_runtime *rt = off->rt;
	bool on = vmmrt__opt_u(&rt->opts, VMMRT_OPT_HANDLE_REUSE) && !rt->driver_inline &&
		  vmmrt__workers_count(rt->workers) == 1;
	uatomic_set(&rt->reuse_cap, on ? budget : 0);
}

static vmmrt_status rm_allocate(vmmrt__offload *off)
{
	uatomic_set(&off->remap.budget, (int64_t)off->rt->lookahead + 1); /* until the schedule says more */
	set_reuse(off, (int64_t)off->rt->lookahead + 1);
	off->remap.d2h_yield = vmmrt__opt_u(&off->rt->opts, VMMRT_OPT_D2H_YIELD) && !off->rt->driver_inline;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		vmmrt_status st = VMMRT_OK;
		if (g->ndesc && g->state == VMMRT_GROUP_DISCOVERING)
			st = rm_allocate_group(off, g);
		else if (g->slot && vmmrt_slot_get_state(g->slot) != VMMRT_SLOT_MAPPED)
			/* Re-allocation: the groups allocated before start again as
			 * new ones do, from a backing their first map finds; else a
			 * first map could wait for room that only a later use makes. */
			st = initial_backing(off, g);
		if (st != VMMRT_OK)
			return st;
	}
	return VMMRT_OK;
}

static void rm_plan(vmmrt__offload *off)
{
	off->lookahead_in_force = off->rt->lookahead;
	int64_t budget = (int64_t)off->lookahead_in_force + 1;
	if (off->sched.recorded) {
		int64_t peak = vmmrt__schedule_peak_mapped(&off->sched, off->lookahead_in_force);
		budget = peak < budget ? peak : budget;
	}
	uatomic_set(&off->remap.budget, budget); /* workers read it at admission */
	set_reuse(off, budget);
	vmmrt__workers_kick(off->rt->workers); /* a larger budget may admit a parked map */
}

static vmmrt_status rm_prefetch(vmmrt__offload *off, vmmrt_group *g, bool backward, uint64_t use)
{
	if (backward && vmmrt__offload_resident(off, g, use, true)) {
		g->timed_h2d = false;
		return VMMRT_OK; /* still mapped since its forward */
	}
	vmmrt_status st = vmmrt__remap_request_map(off, g, backward ? VMMRT__USE_BACKWARD : VMMRT__USE_FORWARD, use);
	if (st != VMMRT_OK)
		return st;
	int kind = backward ? VMMRT__USE_BACKWARD : VMMRT__USE_FORWARD;
	vmmrt__pending_map p = {g, use, g->remap.map[kind][(g->remap.map_next[kind] - 1) % VMMRT__REQ_RING].need,
				      g->remap.map_seq_of[kind], backward};
	return vmmrt__remap_pending_add(off, &p);
}

static vmmrt_status rm_forward_begin(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_status st = vmmrt__remap_pending_flush(off, off->sched.use);
	if (st != VMMRT_OK)
		return st;
	/* The worker stores the flag once the map call returned: if it is there
	 * already, the memory is mapped and nothing needs to wait on the GPU. */
	uint32_t seq = g->remap.map_seq_of[VMMRT__USE_FORWARD];
	if ((int32_t)(uatomic_read(g->remap.flag) - seq) >= 0)
		return VMMRT_OK;
	return vmmrt__drv_stream_wait_value32(off->rt, compute, g->remap.flag_dev, seq);
}

/* After `s` reaches this point (`done` is recorded there), the group's memory
 * is released by a worker; inline, the launch thread waits for `done` itself. */
static vmmrt_status release_after(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream s, int kind, vmmrt__bevent *done)
{
	vmmrt__remap_req *r = &g->remap.rel[kind][g->remap.rel_next[kind]++ % VMMRT__REQ_RING];
	if (off->rt->driver_inline) {
		vmmrt_status st = vmmrt__drv_event_synchronize(off->rt, done);
		if (st == VMMRT_OK)
			st = vmmrt__remap_inline_release(off, r);
		return st;
	}
	vmmrt_status st = vmmrt__remap_reclaim(off, &r->req);
	if (st == VMMRT_OK && kind == VMMRT__USE_FORWARD && VMMRT__PLANTED(off, VMMRT__PLANT_EARLY_RELEASE))
		st = vmmrt__worker_push(off->rt->workers, g->slot->worker, &r->req); /* planted bug: not after the D2H */
	else if (st == VMMRT_OK)
		st = vmmrt__remap_push_after(off, s, r);
	return st;
}

static vmmrt_status rm_forward_end(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_runtime *rt = off->rt;
	if (vmmrt__offload_resident(off, g, off->sched.use, false)) {
		g->timed_d2h = false;
		return VMMRT_OK; /* its backward is next: it stays mapped */
	}
	vmmrt_status st;
	uint64_t index = g->remap.releases_planned++;
	if ((st = vmmrt__drv_event_record(rt, g->fwd_done, compute)) != VMMRT_OK ||
	    (st = vmmrt__drv_stream_wait_event(rt, off->d2h, g->fwd_done)) != VMMRT_OK ||
	    (off->remap.d2h_yield && (st = vmmrt__remap_yield_d2h(off, g)) != VMMRT_OK) ||
	    (st = vmmrt__offload_d2h(off, g)) != VMMRT_OK ||
	    (st = release_after(off, g, off->d2h, VMMRT__USE_FORWARD, g->d2h_done)) != VMMRT_OK) {
		char why[512];
		snprintf(why, sizeof(why), "%s", vmmrt_last_error());
		vmmrt__remap_owe_release(off, g, index);
		vmmrt__error_adopt(why);
		return vmmrt__error_wrap(st, "group '%s': offload", g->name);
	}
	return vmmrt__remap_pending_flush(off, off->sched.use); /* a restore may have waited for this release */
}

static vmmrt_status rm_backward_begin(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_status st = vmmrt__remap_pending_flush(off, off->sched.use);
	if (st != VMMRT_OK)
		return st;
	if (vmmrt__offload_resident(off, g, off->sched.use, true))
		return VMMRT_OK;
	if (g->restore_use != off->sched.use + 1)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': restore was not requested", g->name);
	return vmmrt__offload_wait(off, compute, g->restored);
}

static vmmrt_status rm_backward_end(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt__remap_req *r = &g->remap.rel[VMMRT__USE_BACKWARD][g->remap.rel_next[VMMRT__USE_BACKWARD]++ % VMMRT__REQ_RING];
	vmmrt_status st;
	uint64_t index = g->remap.releases_planned++;
	/*
	 * The release must follow the graph that read the slot. No host function
	 * on a stream waiting for the compute stream (a gap before every graph:
	 * worker.h, `after`): the worker is handed the request now, with the
	 * event to wait for, and polls it. Each request of the ring
	 * has its own event, so a later iteration cannot re-record it early.
	 */
	if ((st = vmmrt__remap_reclaim(off, &r->req)) != VMMRT_OK || (st = vmmrt__drv_event_record(rt, r->ev, compute)) != VMMRT_OK)
		goto owed;
	if (rt->driver_inline) {
		if ((st = vmmrt__drv_event_synchronize(rt, r->ev)) != VMMRT_OK)
			goto owed;
		return vmmrt__remap_inline_release(off, r);
	}
	r->req.after = r->ev;
	if ((st = vmmrt__worker_push(rt->workers, g->slot->worker, &r->req)) != VMMRT_OK)
		goto owed;
	return vmmrt__remap_pending_flush(off, off->sched.use); /* a restore may have waited for this release */
owed:;
	char why[512];
	snprintf(why, sizeof(why), "%s", vmmrt_last_error());
	vmmrt__remap_owe_release(off, g, index);
	vmmrt__error_adopt(why);
	return vmmrt__error_wrap(st, "group '%s': release after backward", g->name);
}

/* For a hang report: admission, and what each group's GPU waits are waiting for. */
static void rm_dump(vmmrt__offload *off, int fd)
{
	dprintf(fd, "; tickets admitted %" PRIu64 " of %" PRIu64 "; resident %" PRId64 " of %" PRId64
		    "; D2H waits for maps %" PRIu64 "; handles kept for reuse up to %" PRId64,
		(uint64_t)uatomic_read(&off->remap.admit_ticket), off->remap.next_ticket,
		(int64_t)uatomic_read(&off->remap.resident), off->remap.budget,
		(uint64_t)uatomic_read(&off->remap.d2h_yields), (int64_t)uatomic_read(&off->rt->reuse_cap));
}

static void rm_dump_group(vmmrt__offload *off, vmmrt_group *g, int fd)
{
	vmmrt__remap_group *rg = &g->remap;
	if (!rg->flag)
		return;
	dprintf(fd,
		", flag %u (maps: last %u, fwd %u, bwd %u), maps requested %" PRIu64 ", releases planned %" PRIu64
		" done %" PRIu64,
		uatomic_read(rg->flag), rg->map_seq, rg->map_seq_of[0], rg->map_seq_of[1], rg->maps_requested,
		rg->releases_planned, (uint64_t)uatomic_read(&rg->releases_done));
	if (uatomic_read(&rg->owed_index) != VMMRT__NOT_OWED)
		dprintf(fd, ", owes release %" PRIu64, (uint64_t)uatomic_read(&rg->owed_index));
}

/* The budget's largest groups: at most that many are mapped at once. */
static void rm_stats(const vmmrt__offload *off, vmmrt_offload_stats *o)
{
	o->budget_groups = (uint32_t)uatomic_read(&off->remap.budget);
	o->bound_bytes = vmmrt__offload_largest(off, o->budget_groups);
}

const vmmrt__strategy_ops vmmrt__strategy_remap = {
	.name = "remap",
	.max_lookahead = 16,
	.quiesce = vmmrt__remap_quiesce,
	.plan = rm_plan,
	.unblock = vmmrt__remap_unblock,
	.reset = vmmrt__remap_reset,
	.free_group = vmmrt__remap_free_group,
	.allocate = rm_allocate,
	.forward_begin = rm_forward_begin,
	.forward_end = rm_forward_end,
	.prefetch = rm_prefetch,
	.backward_begin = rm_backward_begin,
	.backward_end = rm_backward_end,
	.destroy = vmmrt__remap_destroy,
	.stats = rm_stats,
	.dump = rm_dump,
	.dump_group = rm_dump_group,
};

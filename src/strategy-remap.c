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
#include "remap-pending.h"

static void release_counted(vmmrt_group *g);

/* Releases the streams waiting on this word (a plain store reaches the GPU).
 * Only ever forward: teardown may have moved it past this map already. */
static void publish_flag(vmmrt_group *g, uint32_t seq)
{
	for (uint32_t cur = uatomic_read(g->remap.flag); (int32_t)(seq - cur) > 0; cur = uatomic_read(g->remap.flag))
		if (uatomic_cmpxchg(g->remap.flag, cur, seq) == cur)
			break;
}

static bool admit_map(vmmrt__request *req, void *arg)
{
	vmmrt__remap_req *r = arg;
	vmmrt_group *g = r->g;
	vmmrt__offload *off = g->off;

	bool aborting = uatomic_read(&off->remap.aborting);
	if (!aborting && (uint64_t)uatomic_read(&off->remap.admit_ticket) != r->ticket)
		return false;
	/* Even in an abort: a map must not pass a release of its group still
	 * to come, which would unmap what a copy then writes. */
	if (uatomic_read(&g->remap.releases_done) < r->need)
		return false;
	/* Runs on the slot's own worker: g->slot->mapped is ours to read. */
	r->grew = !g->slot->mapped;
	if (r->grew) {
		if (!aborting && uatomic_read(&off->remap.resident) >= uatomic_read(&off->remap.budget))
			return false;
		uatomic_inc(&off->remap.resident);
		uatomic_set(&g->remap.counted, 1);
	}
	uatomic_inc(&off->remap.admit_ticket);
	/* The next ticket may be parked on another worker. */
	vmmrt__workers_kick(g->rt->workers);
	return true;
}

static void map_done(vmmrt__request *req, vmmrt_status st, void *arg)
{
	vmmrt__remap_req *r = arg;
	vmmrt_group *g = r->g;
	vmmrt__offload *off = g->off;

	if (st != VMMRT_OK) {
		if (r->grew && uatomic_xchg(&g->remap.counted, 0))
			uatomic_dec(&off->remap.resident);
		if (st != VMMRT_E_CANCELLED)
			vmmrt__group_fail(g, st, "map before use");
		return;
	}
	if (r->grew)
		vmmrt__offload_account(off, (int64_t)g->slot->size);
	uatomic_inc(&off->maps);
	publish_flag(g, r->seq);
}

static void map_retrying(vmmrt__request *req, vmmrt_status st, void *arg)
{
	vmmrt__remap_req *r = arg;
	/* Reported now, while the worker keeps trying: the streams that wait on
	 * this map resume as soon as memory comes back. */
	vmmrt__group_fail(r->g, st, "map before use (still retrying)");
}

static void release_retrying(vmmrt__request *req, vmmrt_status st, void *arg)
{
	vmmrt__remap_req *r = arg;
	/* Until it goes, the budget of mapped groups counts this one. */
	vmmrt__group_fail(r->g, st, "release after use (still retrying)");
}

static void release_done(vmmrt__request *req, vmmrt_status st, void *arg)
{
	vmmrt__remap_req *r = arg;
	vmmrt_group *g = r->g;
	vmmrt__offload *off = g->off;

	if (st == VMMRT_OK) {
		/* Account first, then free the budget: a map admitted on another
		 * worker the moment the budget frees must not see these bytes too. */
		vmmrt__offload_account(off, -(int64_t)g->slot->size);
		if (uatomic_xchg(&g->remap.counted, 0))
			uatomic_dec(&off->remap.resident);
		uatomic_inc(&off->releases);
	} else if (st != VMMRT_E_CANCELLED) {
		vmmrt__group_fail(g, st, "release after use");
	}
	/* Counted even on failure: a slot left mapped is reused as it is, and no
	 * later map may wait forever for a release that will not come. */
	release_counted(g);
}

/*
 * One release of g has run (or failed, or was cancelled): count it, and the
 * owed one after it, if a failed hook left one there. Either this or
 * owe_release counts an owed release, never both: each publishes its side
 * (the count, the owed index) with a full barrier before it reads the other.
 */
static void release_counted(vmmrt_group *g)
{
	uint64_t done = uatomic_add_return(&g->remap.releases_done, 1);
	if (uatomic_read(&g->remap.owed_index) == done && uatomic_cmpxchg(&g->remap.owed_index, done, VMMRT_NOT_OWED) == done)
		uatomic_inc(&g->remap.releases_done);
	vmmrt__workers_kick(g->rt->workers);
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
		release_counted(r->g);
	}
}

/* Enqueue on s a host function that pushes r to its slot's worker. */
static vmmrt_status push_after(vmmrt__offload *off, vmmrt_stream s, vmmrt__remap_req *r)
{
	return vmmrt__drv_launch_host_func(off->rt, s, push_from_host_func, r);
}

/*
 * driver_inline: the comparison the workers are measured against. The launch
 * thread makes the VMM calls itself (the seed's first version), and so must
 * wait for each copy or graph before it may release the memory behind it.
 */
static vmmrt_status inline_map(vmmrt__offload *off, vmmrt__remap_req *r)
{
	vmmrt_group *g = r->g;
	vmmrt_status st = VMMRT_OK;
	r->grew = !g->slot->mapped;
	if (r->grew) {
		vmmrt__bhandle h;
		uatomic_inc(&off->remap.resident); /* as admission does; map_done undoes it on failure */
		uatomic_set(&g->remap.counted, 1);
		st = vmmrt__drv_mem_create(off->rt, g->slot->size, &h);
		if (st == VMMRT_OK && (st = vmmrt__slot_attach(g->slot, h)) != VMMRT_OK)
			(void)vmmrt__drv_mem_release(off->rt, h);
	}
	map_done(&r->req, st, r);
	return st;
}

static vmmrt_status inline_release(vmmrt__offload *off, vmmrt__remap_req *r)
{
	vmmrt__bhandle h;
	vmmrt_status st = vmmrt__slot_detach(r->g->slot, &h);
	if (st == VMMRT_OK)
		st = vmmrt__drv_mem_release(off->rt, h);
	release_done(&r->req, st, r);
	return st;
}

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
	for (int k = 0; k < 2; k++)
		for (int j = 0; j < VMMRT_REQ_RING; j++) {
			vmmrt__remap_req *m = &g->remap.map[k][j], *r = &g->remap.rel[k][j];
			/* ensure: the first map finds the initial backing */
			vmmrt__request_init(&m->req, &vmmrt__slot_ensure_ops, g->slot);
			m->req.admit = admit_map;
			m->req.persist = true; /* the GPU waits for it: retry, never abandon */
			m->req.retrying = map_retrying;
			m->req.done = map_done;
			m->req.done_arg = m;
			m->g = g;
			vmmrt__request_init(&r->req, &vmmrt__slot_release_ops, g->slot);
			r->req.done = release_done;
			r->req.done_arg = r;
			r->req.persist = true;
			r->req.retrying = release_retrying;
			r->g = g;
			if (k == USE_B && (st = vmmrt__drv_event_create(rt, false, &r->ev)) != VMMRT_OK)
				return vmmrt__error_wrap(st, "group '%s': release events", g->name);
		}
	g->remap.owed_index = VMMRT_NOT_OWED;
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
	off->la = off->rt->lookahead;
	int64_t budget = (int64_t)off->la + 1;
	if (off->sched.recorded) {
		int64_t peak = vmmrt__schedule_peak_mapped(&off->sched, off->la);
		budget = peak < budget ? peak : budget;
	}
	uatomic_set(&off->remap.budget, budget); /* workers read it at admission */
	set_reuse(off, budget);
	vmmrt__workers_kick(off->rt->workers); /* a larger budget may admit a parked map */
}

/* A request object still in flight from an earlier iteration means the launch
 * thread ran a whole iteration ahead of the workers: wait, and count it. */
static vmmrt_status reclaim(vmmrt__offload *off, vmmrt__request *req)
{
	if (vmmrt__request_poll(req, NULL))
		return VMMRT_OK;
	uatomic_inc(&off->rt->launch_blocking);
	vmmrt_status st = vmmrt__request_wait(req, off->rt->timeout_ms);
	return st == VMMRT_E_TIMEOUT ? st : VMMRT_OK;
}

/*
 * A hook failed before it handed off release `index` of the group: the slot
 * stays mapped, and the release is counted in its turn, once the releases
 * before it ran (by whoever is last: this, or the worker that finishes the
 * one before), so no map waits for it forever and none passes a release
 * still in flight. A failed hook ends the pipeline (every later hook
 * refuses), so a group owes at most one.
 */
static void owe_release(vmmrt__offload *off, vmmrt_group *g, uint64_t index)
{
	if (off->rt->driver_inline) { /* no admission reads the count */
		uatomic_inc(&g->remap.releases_done);
		return;
	}
	if (uatomic_cmpxchg(&g->remap.owed_index, VMMRT_NOT_OWED, index) != VMMRT_NOT_OWED) {
		vmmrt__group_fail(g, VMMRT_E_INVALID_STATE, "a second release owed (left uncounted)");
		return;
	}
	if (uatomic_read(&g->remap.releases_done) == index &&
	    uatomic_cmpxchg(&g->remap.owed_index, index, VMMRT_NOT_OWED) == index) {
		uatomic_inc(&g->remap.releases_done);
		vmmrt__workers_kick(off->rt->workers);
	}
}

static vmmrt_status request_map(vmmrt__offload *off, vmmrt_group *g, int kind, uint64_t use)
{
	vmmrt__remap_req *r = &g->remap.map[kind][g->remap.map_next[kind]++ % VMMRT_REQ_RING];
	vmmrt_status st = reclaim(off, &r->req);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': previous map", g->name);
	uint32_t prev_seq_of = g->remap.map_seq_of[kind];
	r->seq = ++g->remap.map_seq;
	g->remap.map_seq_of[kind] = r->seq;
	r->ticket = off->remap.next_ticket++;
	/* Every earlier map of this group is followed by a release, which must
	 * have run first (the first map finds the initial backing in place). */
	r->need = g->remap.maps_requested++;
	if (off->rt->driver_inline) {
		st = inline_map(off, r);
	} else if ((st = vmmrt__worker_push(off->rt->workers, g->slot->worker, &r->req)) != VMMRT_OK) {
		/* Not queued: give the ticket and the counts back, or every later
		 * map would wait for this one forever (admission goes in order). */
		off->remap.next_ticket--;
		g->remap.maps_requested--;
		g->remap.map_seq--;
		g->remap.map_seq_of[kind] = prev_seq_of;
	}
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': %s map", g->name, off->rt->driver_inline ? "inline" : "queue");
	return VMMRT_OK;
}

static vmmrt_status rm_prefetch(vmmrt__offload *off, vmmrt_group *g, bool backward, uint64_t use)
{
	if (backward && vmmrt__offload_resident(off, g, use, true)) {
		g->timed_h2d = false;
		return VMMRT_OK; /* still mapped since its forward */
	}
	vmmrt_status st = request_map(off, g, backward ? USE_B : USE_F, use);
	if (st != VMMRT_OK)
		return st;
	int kind = backward ? USE_B : USE_F;
	vmmrt__pending_map p = {g, use, g->remap.map[kind][(g->remap.map_next[kind] - 1) % VMMRT_REQ_RING].need,
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
	uint32_t seq = g->remap.map_seq_of[USE_F];
	if ((int32_t)(uatomic_read(g->remap.flag) - seq) >= 0)
		return VMMRT_OK;
	return vmmrt__drv_stream_wait_value32(off->rt, compute, g->remap.flag_dev, seq);
}

/* After `s` reaches this point (`done` is recorded there), the group's memory
 * is released by a worker; inline, the launch thread waits for `done` itself. */
static vmmrt_status release_after(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream s, int kind, vmmrt__bevent *done)
{
	vmmrt__remap_req *r = &g->remap.rel[kind][g->remap.rel_next[kind]++ % VMMRT_REQ_RING];
	if (off->rt->driver_inline) {
		vmmrt_status st = vmmrt__drv_event_synchronize(off->rt, done);
		if (st == VMMRT_OK)
			st = inline_release(off, r);
		return st;
	}
	vmmrt_status st = reclaim(off, &r->req);
	if (st == VMMRT_OK && kind == USE_F && VMMRT__PLANTED(off, VMMRT__PLANT_EARLY_RELEASE))
		st = vmmrt__worker_push(off->rt->workers, g->slot->worker, &r->req); /* planted bug: not after the D2H */
	else if (st == VMMRT_OK)
		st = push_after(off, s, r);
	return st;
}

/*
 * A D2H copy in flight makes cuMemSetAccess about ten times slower on the
 * H200 (the figures: backend/host.c's latency model), and in the forward pass of a copy-bound model one is always in flight: the
 * map of layer k, due when layer k-2's D2H has ended, would run beside layer
 * k-1's. So, before g's D2H, the D2H stream waits for the maps already due:
 * in ticket order (admission's), each whose releases were all handed off
 * and which the budget admits with g still mapped (g's release comes after
 * this copy, so a map that needs it must not be waited for here), up to the
 * first that is not so. The copy engine idles for those maps' calls instead.
 */
#define YIELD_MAX 32
static uint64_t last_ticket(const vmmrt_group *x)
{
	uint64_t t = 0;
	for (int k = 0; k < 2; k++)
		if (x->remap.map_next[k]) {
			uint64_t tk = x->remap.map[k][(x->remap.map_next[k] - 1) % VMMRT_REQ_RING].ticket;
			t = tk > t ? tk : t;
		}
	return t;
}

static vmmrt_status yield_d2h(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt__remap_req *due[YIELD_MAX];
	unsigned n = 0;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *h = off->groups[i];
		if (h == g || !h->slot || !h->remap.flag)
			continue;
		for (int k = 0; k < 2; k++) {
			if (!h->remap.map_next[k])
				continue;
			vmmrt__remap_req *r = &h->remap.map[k][(h->remap.map_next[k] - 1) % VMMRT_REQ_RING];
			if ((int32_t)(uatomic_read(h->remap.flag) - r->seq) >= 0)
				continue; /* mapped already */
			if (n == YIELD_MAX)
				return VMMRT_OK; /* more than it may reason about: no wait */
			due[n++] = r;
		}
	}
	for (unsigned left = n; left; left--) {
		unsigned best = 0;
		for (unsigned j = 1; j < left; j++)
			if (due[j]->ticket < due[best]->ticket)
				best = j;
		vmmrt__remap_req *r = due[best];
		due[best] = due[left - 1];
		vmmrt_group *h = r->g;
		if (h->remap.releases_planned < r->need)
			break;
		/* Mapped when r is admitted (tickets go in order): g, and each group
		 * whose map without a release yet has an earlier ticket. */
		int64_t mapped = 1;
		for (unsigned i = 0; i < off->ngroups; i++) {
			vmmrt_group *x = off->groups[i];
			if (x == g || x == h || !x->slot || x->remap.maps_requested <= x->remap.releases_planned)
				continue;
			mapped += last_ticket(x) < r->ticket;
		}
		if (mapped >= uatomic_read(&off->remap.budget))
			break;
		vmmrt_status st = vmmrt__drv_stream_wait_value32(off->rt, off->d2h, h->remap.flag_dev, r->seq);
		if (st != VMMRT_OK)
			return vmmrt__error_wrap(st, "group '%s': D2H behind the map of group '%s'", g->name, h->name);
		uatomic_inc(&off->remap.d2h_yields);
	}
	return VMMRT_OK;
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
	    (off->remap.d2h_yield && (st = yield_d2h(off, g)) != VMMRT_OK) ||
	    (st = vmmrt__offload_d2h(off, g)) != VMMRT_OK ||
	    (st = release_after(off, g, off->d2h, USE_F, g->d2h_done)) != VMMRT_OK) {
		char why[512];
		snprintf(why, sizeof(why), "%s", vmmrt_last_error());
		owe_release(off, g, index);
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
	vmmrt__remap_req *r = &g->remap.rel[USE_B][g->remap.rel_next[USE_B]++ % VMMRT_REQ_RING];
	vmmrt_status st;
	uint64_t index = g->remap.releases_planned++;
	/*
	 * The release must follow the graph that read the slot. No host function
	 * on a stream waiting for the compute stream (it would cost the compute
	 * stream 1.25 us before every graph): the worker is handed the request
	 * now, with the event to wait for, and polls it. Each request of the ring
	 * has its own event, so a later iteration cannot re-record it early.
	 */
	if ((st = reclaim(off, &r->req)) != VMMRT_OK || (st = vmmrt__drv_event_record(rt, r->ev, compute)) != VMMRT_OK)
		goto owed;
	if (rt->driver_inline) {
		if ((st = vmmrt__drv_event_synchronize(rt, r->ev)) != VMMRT_OK)
			goto owed;
		return inline_release(off, r);
	}
	r->req.after = r->ev;
	if ((st = vmmrt__worker_push(rt->workers, g->slot->worker, &r->req)) != VMMRT_OK)
		goto owed;
	return vmmrt__remap_pending_flush(off, off->sched.use); /* a restore may have waited for this release */
owed:;
	char why[512];
	snprintf(why, sizeof(why), "%s", vmmrt_last_error());
	owe_release(off, g, index);
	vmmrt__error_adopt(why);
	return vmmrt__error_wrap(st, "group '%s': release after backward", g->name);
}

/*
 * A stream may be waiting for a map that will not come now (the map kept
 * failing, or the application gave up after a failed hook). Before anything
 * is freed: map each such slot (no budget, no order: this is teardown) and
 * move its flag past every map requested, so the waiting streams run, on
 * mapped memory, and drain. Never while one of the group's releases is still
 * in flight (behind its D2H, or its backward's event): that release would
 * then unmap the slot under the copy the flag lets start. Those run as the
 * streams drain, which the flags published for other groups may be what
 * allows: so in rounds, until none is left or the timeout passed. If a map
 * cannot be made or a release never comes, the flag stays: the teardown then
 * finds the streams busy and reports it rather than free what they read.
 */
static bool quiesce_group(vmmrt__offload *off, vmmrt_group *g, uint64_t deadline)
{
	vmmrt_runtime *rt = off->rt;
	/* Until the deadline: memory a failed create wanted often comes back. */
	for (unsigned attempt = 0;; attempt++) {
		vmmrt__request *req = malloc(sizeof(*req));
		if (!req)
			return false;
		vmmrt__request_init(req, &vmmrt__slot_ensure_ops, g->slot);
		if (vmmrt__worker_push(rt->workers, g->slot->worker, req) != VMMRT_OK) {
			free(req);
			return false;
		}
		if (vmmrt__request_wait_owned(req, rt->timeout_ms) == VMMRT_OK) {
			publish_flag(g, g->remap.map_seq);
			return true;
		}
		if (vmmrt__now_ns() > deadline)
			return false;
		vmmrt__sleep_ns(attempt < 6 ? 1000000ull << attempt : 50000000ull);
	}
}

static void rm_quiesce(vmmrt__offload *off)
{
	uint64_t deadline = vmmrt__now_ns() + off->rt->timeout_ms * 1000000ull;
	for (;;) {
		bool in_flight = false;
		for (unsigned i = 0; i < off->ngroups; i++) {
			vmmrt_group *g = off->groups[i];
			if (!g->slot || !g->remap.flag || (int32_t)(uatomic_read(g->remap.flag) - g->remap.map_seq) >= 0)
				continue;
			if (uatomic_read(&g->remap.releases_done) < g->remap.releases_planned)
				in_flight = true;
			else if (!quiesce_group(off, g, deadline))
				off->stuck = true;
		}
		if (!in_flight || off->stuck)
			break;
		if (vmmrt__now_ns() > deadline) {
			off->stuck = true;
			break;
		}
		vmmrt__sleep_ns(1000000);
	}
}

/* Abort, before the streams drain: let every map a stream may wait for run. */
static void rm_unblock(vmmrt__offload *off)
{
	uatomic_set(&off->remap.aborting, 1);
	vmmrt__workers_kick(off->rt->workers);
}

/* Poll until every map (or release) of every group has come back from its
 * worker. A release after a backward waits there for its graph's event: the
 * compute stream is still reading the slot until then. */
static vmmrt_status ring_back(vmmrt__offload *off, bool maps)
{
	uint64_t deadline = vmmrt__now_ns() + off->rt->timeout_ms * 1000000ull;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (!g->slot)
			continue;
		for (int k = 0; k < 2; k++)
			for (int j = 0; j < VMMRT_REQ_RING; j++) {
				vmmrt__request *req = maps ? &g->remap.map[k][j].req : &g->remap.rel[k][j].req;
				while (!vmmrt__request_poll(req, NULL)) {
					if (vmmrt__now_ns() > deadline)
						return vmmrt__error(VMMRT_E_TIMEOUT, "group '%s': a %s still queued after %llu ms",
								    g->name, maps ? "map" : "release",
								    (unsigned long long)off->rt->timeout_ms);
					vmmrt__sleep_ns(100000);
				}
			}
	}
	return VMMRT_OK;
}

/* Release g's memory if it is mapped, on its worker (or inline). */
static vmmrt_status trim(vmmrt__offload *off, vmmrt_group *g)
{
	if (vmmrt_slot_get_state(g->slot) != VMMRT_SLOT_MAPPED)
		return VMMRT_OK;
	vmmrt_status st;
	if (off->rt->driver_inline) {
		vmmrt__bhandle h;
		if ((st = vmmrt__slot_detach(g->slot, &h)) == VMMRT_OK)
			st = vmmrt__drv_mem_release(off->rt, h);
		vmmrt__slot_set_state(g->slot, g->slot->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
	} else {
		vmmrt__request *req = malloc(sizeof(*req));
		if (!req)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "group '%s': release", g->name);
		vmmrt__request_init(req, &vmmrt__slot_release_ops, g->slot);
		if ((st = vmmrt__worker_push(off->rt->workers, g->slot->worker, req)) != VMMRT_OK) {
			free(req);
			return st;
		}
		st = vmmrt__request_wait_owned(req, off->rt->timeout_ms);
	}
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': release after an abort", g->name);
	vmmrt__offload_account(off, -(int64_t)g->slot->size);
	if (uatomic_xchg(&g->remap.counted, 0))
		uatomic_dec(&off->remap.resident);
	return VMMRT_OK;
}

/*
 * The copy streams have drained; once every release handed off has run
 * (those after a backward wait for its graph on the compute stream), maps
 * requested for uses that never came still wait for releases those uses
 * would have made; count them made (the slot just stays mapped, and the map
 * finds it so), let the maps run, then release every slot: the next
 * iteration starts as any steady-state one does, from nothing mapped.
 */
static vmmrt_status rm_reset(vmmrt__offload *off)
{
	vmmrt_status st = ring_back(off, false);
	if (st != VMMRT_OK)
		return st;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt__remap_group *rg = &off->groups[i]->remap;
		if (!off->groups[i]->slot)
			continue;
		rg->releases_planned = rg->maps_requested;
		uatomic_set(&rg->owed_index, VMMRT_NOT_OWED);
		uatomic_set(&rg->releases_done, rg->maps_requested);
	}
	vmmrt__workers_kick(off->rt->workers);
	if ((st = ring_back(off, true)) != VMMRT_OK || (!off->rt->driver_inline && (st = vmmrt__offload_worker_barrier(off->rt)) != VMMRT_OK))
		return st;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (!g->slot)
			continue;
		vmmrt__remap_group *rg = &g->remap;
		if ((st = trim(off, g)) != VMMRT_OK)
			return st;
		/* The next map needs every release so far, and has it. */
		uint64_t c = rg->maps_requested ? rg->maps_requested : 1;
		rg->maps_requested = rg->releases_planned = c;
		uatomic_set(&rg->releases_done, c);
		publish_flag(g, rg->map_seq);
		g->restore_use = 0;
		g->timed_h2d = g->timed_d2h = false;
	}
	/* Nothing is mapped now: what the pools kept goes back to the driver too. */
	if (!off->rt->driver_inline && (st = vmmrt__slot_pools_trim(off->rt->workers)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "abort: the handles kept for reuse");
	off->remap.pending_n = off->remap.pending_head = 0;
	off->remap.next_ticket = uatomic_read(&off->remap.admit_ticket) > off->remap.next_ticket
					 ? uatomic_read(&off->remap.admit_ticket)
					 : off->remap.next_ticket;
	uatomic_set(&off->remap.admit_ticket, off->remap.next_ticket);
	uatomic_set(&off->remap.resident, 0);
	uatomic_set(&off->remap.aborting, 0);
	return VMMRT_OK;
}

static void rm_free_group(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	if (!off->stuck) /* a stuck stream may still have a copy graph to run */
		vmmrt__offload_free_copies(off, g);
	/* Queued behind this group's requests; parked maps are cancelled. */
	if (g->slot) {
		if (vmmrt_slot_get_state(g->slot) == VMMRT_SLOT_MAPPED)
			vmmrt__offload_account(off, -(int64_t)g->slot->size);
		vmmrt__offload_destroy_slot(g->slot);
	}
	g->slot = NULL;
	for (int j = 0; j < VMMRT_REQ_RING; j++) {
		if (g->remap.rel[USE_B][j].ev)
			(void)vmmrt__drv_event_destroy(rt, g->remap.rel[USE_B][j].ev);
		g->remap.rel[USE_B][j].ev = NULL;
	}
	if (g->remap.flag && !off->stuck)
		(void)vmmrt__drv_host_free(rt, g->remap.flag);
	g->remap.flag = NULL;
}

static void rm_destroy(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->ngroups; i++)
		rm_free_group(off, off->groups[i]);
	uatomic_set(&off->activation_bytes, 0);
	uatomic_set(&off->remap.resident, 0);
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
	if (uatomic_read(&rg->owed_index) != VMMRT_NOT_OWED)
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
	.quiesce = rm_quiesce,
	.plan = rm_plan,
	.unblock = rm_unblock,
	.reset = rm_reset,
	.free_group = rm_free_group,
	.allocate = rm_allocate,
	.forward_begin = rm_forward_begin,
	.forward_end = rm_forward_end,
	.prefetch = rm_prefetch,
	.backward_begin = rm_backward_begin,
	.backward_end = rm_backward_end,
	.destroy = rm_destroy,
	.stats = rm_stats,
	.dump = rm_dump,
	.dump_group = rm_dump_group,
};

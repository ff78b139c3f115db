/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap's requests and their admission: the map and release requests of
 * each group's rings and what their callbacks do when a worker ran them, the
 * tickets that admit maps in schedule order only after the group's previous
 * uses were released and only within the budget of groups mapped at once,
 * the release counts a map waits for (and the release a failed hook owes),
 * and the flag each map publishes for the GPU waiting on it. The callbacks
 * run on the workers (or on the driver's callback thread: a host function's
 * push); the rest on the launch thread.
 */
#include "config.h"

#include <stdlib.h>

#include <urcu/uatomic.h>

#include "driver.h"
#include "error.h"
#include "pipeline.h"
#include "remap-admit.h"

static void release_counted(vmmrt_group *g);

/* Releases the streams waiting on this word (a plain store reaches the GPU).
 * Only ever forward: teardown may have moved it past this map already. */
void vmmrt__remap_publish_flag(vmmrt_group *g, uint32_t seq)
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
	vmmrt__remap_publish_flag(g, r->seq);
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
	if (uatomic_read(&g->remap.owed_index) == done && uatomic_cmpxchg(&g->remap.owed_index, done, VMMRT__NOT_OWED) == done)
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
vmmrt_status vmmrt__remap_push_after(vmmrt__offload *off, vmmrt_stream s, vmmrt__remap_req *r)
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

vmmrt_status vmmrt__remap_inline_release(vmmrt__offload *off, vmmrt__remap_req *r)
{
	vmmrt__bhandle h;
	vmmrt_status st = vmmrt__slot_detach(r->g->slot, &h);
	if (st == VMMRT_OK)
		st = vmmrt__drv_mem_release(off->rt, h);
	release_done(&r->req, st, r);
	return st;
}

/* The requests of g's rings: what each runs, and what it tells the offload. */
void vmmrt__remap_requests_init(vmmrt_group *g)
{
	for (int k = 0; k < 2; k++)
		for (int j = 0; j < VMMRT__REQ_RING; j++) {
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
		}
}

/* A request object still in flight from an earlier iteration means the launch
 * thread ran a whole iteration ahead of the workers: wait, and count it. */
vmmrt_status vmmrt__remap_reclaim(vmmrt__offload *off, vmmrt__request *req)
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
void vmmrt__remap_owe_release(vmmrt__offload *off, vmmrt_group *g, uint64_t index)
{
	if (off->rt->driver_inline) { /* no admission reads the count */
		uatomic_inc(&g->remap.releases_done);
		return;
	}
	if (uatomic_cmpxchg(&g->remap.owed_index, VMMRT__NOT_OWED, index) != VMMRT__NOT_OWED) {
		vmmrt__group_fail(g, VMMRT_E_INVALID_STATE, "a second release owed (left uncounted)");
		return;
	}
	if (uatomic_read(&g->remap.releases_done) == index &&
	    uatomic_cmpxchg(&g->remap.owed_index, index, VMMRT__NOT_OWED) == index) {
		uatomic_inc(&g->remap.releases_done);
		vmmrt__workers_kick(off->rt->workers);
	}
}

vmmrt_status vmmrt__remap_request_map(vmmrt__offload *off, vmmrt_group *g, int kind, uint64_t use)
{
	vmmrt__remap_req *r = &g->remap.map[kind][g->remap.map_next[kind]++ % VMMRT__REQ_RING];
	vmmrt_status st = vmmrt__remap_reclaim(off, &r->req);
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

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap's teardown and abort: quiesce (let every stream waiting for a map
 * run before anything is freed), unblock and reset (an abort: admit what
 * streams wait for, then put every group back to nothing mapped), and the
 * freeing of a group's slot, events and flag.
 */
#include "config.h"

#include <stdlib.h>

#include <urcu/uatomic.h>

#include "clock.h"
#include "driver.h"
#include "error.h"
#include "pipeline.h"
#include "remap-admit.h"
#include "remap-teardown.h"

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
			vmmrt__remap_publish_flag(g, g->remap.map_seq);
			return true;
		}
		if (vmmrt__now_ns() > deadline)
			return false;
		vmmrt__sleep_ns(attempt < 6 ? 1000000ull << attempt : 50000000ull);
	}
}

void vmmrt__remap_quiesce(vmmrt__offload *off)
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
void vmmrt__remap_unblock(vmmrt__offload *off)
{
	uatomic_set(&off->remap.aborting, 1);
	vmmrt__workers_kick(off->rt->workers);
}

/* Poll until every map (or release) of every group has come back from its
 * worker. A release after a backward waits there for its graph's event: the
 * compute stream is still reading the slot until then. */
static vmmrt_status wait_rings_idle(vmmrt__offload *off, bool maps)
{
	uint64_t deadline = vmmrt__now_ns() + off->rt->timeout_ms * 1000000ull;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (!g->slot)
			continue;
		for (int k = 0; k < 2; k++)
			for (int j = 0; j < VMMRT__REQ_RING; j++) {
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
vmmrt_status vmmrt__remap_reset(vmmrt__offload *off)
{
	vmmrt_status st = wait_rings_idle(off, false);
	if (st != VMMRT_OK)
		return st;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt__remap_group *rg = &off->groups[i]->remap;
		if (!off->groups[i]->slot)
			continue;
		rg->releases_planned = rg->maps_requested;
		uatomic_set(&rg->owed_index, VMMRT__NOT_OWED);
		uatomic_set(&rg->releases_done, rg->maps_requested);
	}
	vmmrt__workers_kick(off->rt->workers);
	if ((st = wait_rings_idle(off, true)) != VMMRT_OK || (!off->rt->driver_inline && (st = vmmrt__offload_worker_barrier(off->rt)) != VMMRT_OK))
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
		vmmrt__remap_publish_flag(g, rg->map_seq);
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

void vmmrt__remap_free_group(vmmrt__offload *off, vmmrt_group *g)
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
	for (int j = 0; j < VMMRT__REQ_RING; j++) {
		if (g->remap.rel[VMMRT__USE_BACKWARD][j].ev)
			(void)vmmrt__drv_event_destroy(rt, g->remap.rel[VMMRT__USE_BACKWARD][j].ev);
		g->remap.rel[VMMRT__USE_BACKWARD][j].ev = NULL;
	}
	if (g->remap.flag && !off->stuck)
		(void)vmmrt__drv_host_free(rt, g->remap.flag);
	g->remap.flag = NULL;
}

void vmmrt__remap_destroy(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->ngroups; i++)
		vmmrt__remap_free_group(off, off->groups[i]);
	uatomic_set(&off->activation_bytes, 0);
	uatomic_set(&off->remap.resident, 0);
}

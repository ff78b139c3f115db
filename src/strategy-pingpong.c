/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Ping-pong: two resident banks (one fixed VA each, mapped once at allocation)
 * shared by all groups, alternately. No driver VMM call after allocation.
 *
 * Each bank remembers its latest user (a forward writing it, or a restore
 * followed by the backward reading it) and the event recorded when that user
 * let go of it: the forward's D2H completion, or the backward graph's end.
 *   fence 1 (forward): a forward rewrites a bank only after the D2H of the
 *           bank's previous forward has finished (its activation is saved);
 *   fence 2 (backward): a restore rewrites a bank only after the graph that
 *           last read it has finished (and after the D2H of what it held).
 * Both are stream waits on the GPU; the launch thread never blocks. A restore
 * whose bank is still held by the use running now is deferred to that use's
 * end (a bank conflict: the backward order did not alternate the banks).
 */
#include "config.h"

#include <stdio.h>

#include <urcu/uatomic.h>

#include "driver.h"
#include "error.h"
#include "pipeline.h"

static vmmrt_status pp_allocate(vmmrt__offload *off)
{
	vmmrt_runtime *rt = off->rt;
	size_t max = 0;
	for (unsigned i = 0; i < off->ngroups; i++)
		if (off->groups[i]->bytes > max)
			max = off->groups[i]->bytes;
	if (max == 0)
		return VMMRT_OK; /* only empty groups: nothing to allocate */
	for (unsigned b = 0; b < 2; b++) {
		vmmrt_status st = vmmrt__slot_reserve(rt, max, &off->pingpong.bank[b].slot);
		if (st == VMMRT_OK)
			st = vmmrt__slot_map(off->pingpong.bank[b].slot);
		if (st != VMMRT_OK)
			return vmmrt__error_wrap(st, "ping-pong bank %u of %zu bytes", b, max);
		off->pingpong.bank[b].user_done = true;
		vmmrt__offload_account(off, (int64_t)vmmrt_slot_size(off->pingpong.bank[b].slot));
	}
	/* Alternate in forward order: with the usual reverse backward order the
	 * backward alternates too, so each restore overlaps the graph before it. */
	unsigned k = 0;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (!g->ndesc)
			continue;
		g->pingpong.bank = k++ % 2;
		g->base = vmmrt_slot_address(off->pingpong.bank[g->pingpong.bank].slot);
	}
	return VMMRT_OK;
}

static vmmrt_status enqueue_restore(vmmrt__offload *off, vmmrt_group *g, uint64_t use)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	vmmrt_status st = VMMRT_OK;

	if (bank->free_ev && !(off->drop_fence & VMMRT_DROP_BACKWARD_FENCE))
		st = vmmrt__drv_stream_wait_event(rt, off->h2d, bank->free_ev);
	if (st == VMMRT_OK)
		st = vmmrt__offload_h2d(off, g);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': restore", g->name);
	bank->user = g;
	bank->user_done = false;
	g->restore_use = use + 1;
	return VMMRT_OK;
}

/* The bank's user let go of it at free_ev: start the restore that waited. */
static vmmrt_status release_bank(vmmrt__offload *off, vmmrt__bank *bank, vmmrt__bevent *free_ev)
{
	bank->free_ev = free_ev;
	bank->user_done = true;
	if (!bank->pending)
		return VMMRT_OK;
	vmmrt_group *g = bank->pending;
	bank->pending = NULL;
	return enqueue_restore(off, g, bank->pending_use);
}

static vmmrt_status pp_prefetch(vmmrt__offload *off, vmmrt_group *g, bool backward, uint64_t use)
{
	if (!backward)
		return VMMRT_OK; /* a forward needs nothing ahead */
	if (vmmrt__offload_is_tail(off, g, use, true)) {
		g->timed_h2d = false;
		return VMMRT_OK; /* the tail never left */
	}
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	if (bank->user_done)
		return enqueue_restore(off, g, use);
	if (bank->pending)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "group '%s': bank %u already has a deferred restore (look-ahead beyond two banks)",
				   g->name, g->pingpong.bank);
	if (off->sched.recorded)
		off->bank_conflicts++;
	bank->pending = g;
	bank->pending_use = use;
	return VMMRT_OK;
}

static vmmrt_status pp_forward_begin(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	if (!bank->user_done)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "group '%s': bank %u is still held by group '%s'", g->name,
				   g->pingpong.bank, bank->user ? bank->user->name : "?");
	/* Fence 1: the previous activation in this bank has reached host memory. */
	if (bank->free_ev && !(off->drop_fence & VMMRT_DROP_FORWARD_FENCE)) {
		vmmrt_status st = vmmrt__offload_wait(off, compute, bank->free_ev);
		if (st != VMMRT_OK)
			return st;
	}
	bank->user = g;
	bank->user_done = false;
	return VMMRT_OK;
}

static vmmrt_status pp_forward_end(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	if (vmmrt__offload_is_tail(off, g, off->sched.use, false)) {
		g->timed_d2h = false;
		return VMMRT_OK; /* its backward is next: it stays in the bank */
	}
	vmmrt_status st = vmmrt__drv_event_record(rt, g->fwd_done, compute);
	if (st == VMMRT_OK)
		st = vmmrt__drv_stream_wait_event(rt, off->d2h, g->fwd_done);
	if (st == VMMRT_OK)
		st = vmmrt__offload_d2h(off, g);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "group '%s': offload", g->name);
	return release_bank(off, bank, g->d2h_done);
}

static vmmrt_status pp_backward_begin(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	if (vmmrt__offload_is_tail(off, g, off->sched.use, true))
		return VMMRT_OK;
	if (g->restore_use != off->sched.use + 1)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "group '%s': its restore could not start (bank %u still held by group '%s')",
				   g->name, g->pingpong.bank, off->pingpong.bank[g->pingpong.bank].user ? off->pingpong.bank[g->pingpong.bank].user->name : "?");
	/* The compute stream waits on the GPU for the H2D; the launch thread goes on. */
	return vmmrt__offload_wait(off, compute, g->restored);
}

static vmmrt_status pp_backward_end(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	vmmrt_status st = vmmrt__drv_event_record(off->rt, g->consumed, compute);
	if (st != VMMRT_OK)
		return st;
	return release_bank(off, &off->pingpong.bank[g->pingpong.bank], g->consumed);
}

static void pp_destroy(vmmrt__offload *off)
{
	for (unsigned b = 0; b < 2; b++) {
		vmmrt__bank *bank = &off->pingpong.bank[b];
		if (bank->slot) {
			vmmrt__offload_account(off, -(int64_t)vmmrt_slot_size(bank->slot));
			vmmrt__offload_destroy_slot(bank->slot);
		}
		*bank = (vmmrt__bank){0};
	}
}

/* For a hang report: who holds each bank, and the restore waiting for it. */
static void pp_dump(vmmrt__offload *off, int fd)
{
	if (!off->pingpong.bank[0].slot) {
		dprintf(fd, "; no banks");
		return;
	}
	for (unsigned b = 0; b < 2; b++) {
		const vmmrt__bank *bank = &off->pingpong.bank[b];
		dprintf(fd, "; bank %u: user '%s', %s%s%s", b, bank->user ? bank->user->name : "",
			bank->user_done ? "let go" : "held", bank->pending ? ", restore of '" : "",
			bank->pending ? bank->pending->name : "");
		if (bank->pending)
			dprintf(fd, "' waits");
	}
}

static void pp_dump_group(vmmrt__offload *off, vmmrt_group *g, int fd)
{
	if (g->ndesc)
		dprintf(fd, ", bank %u", g->pingpong.bank);
}

const vmmrt__strategy_ops vmmrt__strategy_pingpong = {
	.name = "pingpong",
	.max_lookahead = 1, /* the bank not being read is the only one to restore into */
	.allocate = pp_allocate,
	.forward_begin = pp_forward_begin,
	.forward_end = pp_forward_end,
	.prefetch = pp_prefetch,
	.backward_begin = pp_backward_begin,
	.backward_end = pp_backward_end,
	.destroy = pp_destroy,
	.dump = pp_dump,
	.dump_group = pp_dump_group,
};

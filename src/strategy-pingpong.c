/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Ping-pong: resident banks (one fixed VA each, mapped once at allocation)
 * shared by the groups. No driver VMM call after allocation.
 *
 * Each bank remembers its latest user (a forward writing it, or a restore
 * followed by the backward reading it) and the event recorded when that user
 * let go of it: the forward's D2H completion, or the backward graph's end.
 *   fence 1 (forward): a forward rewrites a bank only after the D2H of the
 *           bank's previous forward has finished (its activation is saved);
 *   fence 2 (backward): a restore rewrites a bank only after the graph that
 *           last read it has finished (and after the D2H of what it held).
 * Both are stream waits on the GPU; the launch thread never blocks.
 *
 * Which group gets which bank: with a schedule declared before allocation,
 * as vmmrt__schedule_banks says (no two groups of one bank ever hold it at
 * once under the look-ahead, so no restore waits for the graph before it and
 * a forward never finds its bank taken); the look-ahead is shortened until
 * that fits in max_banks. Otherwise two banks, alternating in creation
 * order, and a look-ahead of at most 1: the order is recorded only after
 * the graphs were captured over those addresses. A restore whose bank is
 * still held by the use running now is then deferred to that use's end (a
 * bank conflict: the order did not alternate the banks).
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include <urcu/uatomic.h>

#include "driver.h"
#include "error.h"
#include "pipeline.h"

static bool allocating(const vmmrt_group *g)
{
	return g->ndesc && g->state == VMMRT_GROUP_DISCOVERING;
}

static vmmrt_status add_banks(vmmrt__offload *off, unsigned count)
{
	vmmrt__pingpong *pp = &off->pingpong;
	if (pp->nbanks + count > pp->cap) {
		unsigned cap = pp->nbanks + count + 4;
		vmmrt__bank *nb = realloc(pp->bank, cap * sizeof(*nb));
		if (!nb)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "ping-pong banks");
		pp->bank = nb;
		pp->cap = cap;
	}
	for (unsigned b = 0; b < count; b++)
		pp->bank[pp->nbanks + b] = (vmmrt__bank){.user_done = true};
	return VMMRT_OK;
}

/* The longest look-ahead up to the option whose banks fit in max_banks, for
 * the groups being allocated; every other group keeps its bank, so no two
 * of those may clash under it either. */
static unsigned color(vmmrt__offload *off, const bool *pick, unsigned *bank)
{
	const vmmrt__schedule *s = &off->sched;
	for (unsigned lookahead = off->rt->lookahead;; lookahead--) {
		unsigned used = vmmrt__schedule_banks(s, lookahead, pick, bank);
		bool ok = used <= off->rt->max_banks || lookahead == 0;
		for (unsigned a = 0; ok && a < off->ngroups; a++)
			for (unsigned b = a + 1; ok && b < off->ngroups; b++) {
				vmmrt_group *ga = off->groups[a], *gb = off->groups[b];
				ok = !(ga->pingpong.has_bank && gb->pingpong.has_bank &&
				       ga->pingpong.bank == gb->pingpong.bank && vmmrt__schedule_clash(s, lookahead, a, b));
			}
		if (ok) {
			off->pingpong.banks_lookahead = lookahead;
			off->pingpong.planned = true;
			return used;
		}
	}
}

static vmmrt_status pp_allocate(vmmrt__offload *off)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt__pingpong *pp = &off->pingpong;
	unsigned n = off->ngroups, count = 0, first = pp->nbanks;
	vmmrt_status st = VMMRT_OK;
	bool *pick = calloc(n ? n : 1, sizeof(*pick));
	unsigned *bank = calloc(n ? n : 1, sizeof(*bank));
	size_t *size = NULL;
	if (!pick || !bank) {
		st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "ping-pong bank assignment");
		goto out;
	}
	unsigned k = 0;
	for (unsigned i = 0; i < n; i++)
		if ((pick[i] = allocating(off->groups[i])))
			bank[i] = k++ % 2; /* without a declared schedule: alternate in creation order */
	if (k == 0)
		goto out; /* only empty groups: nothing to allocate */
	if (off->sched.declared) {
		count = color(off, pick, bank);
		if (VMMRT__PLANTED(off, VMMRT__PLANT_NAIVE_BANKS)) {
			/* planted: the look-ahead of the schedule's banks, the assignment of none */
			for (unsigned i = 0, j = 0; i < n; i++)
				if (pick[i])
					bank[i] = j++ % 2;
			if (count < 2 && k > 1)
				count = 2;
		}
	} else {
		count = 2; /* as before schedules were declared, even for one group */
	}
	if (!(size = calloc(count, sizeof(*size)))) {
		st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "ping-pong banks");
		goto out;
	}
	size_t largest = 0;
	for (unsigned i = 0; i < n; i++)
		if (pick[i] && off->groups[i]->bytes > size[bank[i]])
			size[bank[i]] = off->groups[i]->bytes;
	for (unsigned b = 0; b < count; b++)
		largest = size[b] > largest ? size[b] : largest;
	for (unsigned b = 0; b < count; b++)
		if (!size[b] || !off->sched.declared)
			size[b] = largest; /* as before schedules were declared: two banks of the largest group */
	if ((st = add_banks(off, count)) != VMMRT_OK)
		goto out;
	/* Counted at once: a bank half made is released with the others. */
	pp->nbanks += count;
	for (unsigned b = 0; b < count; b++) {
		vmmrt__bank *bk = &pp->bank[first + b];
		st = vmmrt__slot_reserve(rt, size[b], &bk->slot);
		if (st == VMMRT_OK && (st = vmmrt__slot_map(bk->slot)) != VMMRT_OK) {
			vmmrt__offload_destroy_slot(bk->slot);
			bk->slot = NULL;
		}
		if (st != VMMRT_OK) {
			st = vmmrt__error_wrap(st, "ping-pong bank %u of %zu bytes", first + b, size[b]);
			goto out;
		}
		vmmrt__offload_account(off, (int64_t)vmmrt_slot_size(bk->slot));
	}
	for (unsigned i = 0; i < n; i++) {
		vmmrt_group *g = off->groups[i];
		if (!pick[i])
			continue;
		g->pingpong.bank = first + bank[i];
		g->pingpong.has_bank = true;
		pp->bank[g->pingpong.bank].groups++;
		g->base = vmmrt_slot_address(pp->bank[g->pingpong.bank].slot);
	}
out:
	free(pick);
	free(bank);
	free(size);
	return st;
}

/* Which groups stay in their bank from their forward to their backward
 * (vmmrt__schedule_stays): no D2H, no restore. Without the memory to ask,
 * none does: they are copied, as before. */
static void plan_stays(vmmrt__offload *off)
{
	unsigned n = off->ngroups;
	bool *pick = calloc(n ? n : 1, sizeof(*pick));
	unsigned *bank = calloc(n ? n : 1, sizeof(*bank));
	for (unsigned i = 0; i < n; i++) {
		vmmrt_group *g = off->groups[i];
		g->stays = false;
		if (pick && bank && g->pingpong.has_bank && g->ndesc) {
			pick[i] = true;
			bank[i] = g->pingpong.bank;
		}
	}
	if (pick && bank)
		for (unsigned i = 0; i < n; i++)
			off->groups[i]->stays =
				pick[i] && vmmrt__schedule_stays(&off->sched, off->lookahead_in_force, pick, bank, i);
	free(pick);
	free(bank);
}

static void pp_plan(vmmrt__offload *off)
{
	/* A declared schedule's banks were made for their look-ahead; without
	 * one, the bank not being read is the only one to restore into. */
	if (off->sched.declared && off->pingpong.planned)
		off->lookahead_in_force = off->pingpong.banks_lookahead;
	else
		off->lookahead_in_force = off->rt->lookahead < 1 ? off->rt->lookahead : 1;
	plan_stays(off);
}

static vmmrt_status enqueue_restore(vmmrt__offload *off, vmmrt_group *g, uint64_t use)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	vmmrt_status st = VMMRT_OK;

	if (bank->free_ev && !VMMRT__PLANTED(off, VMMRT__DROP_BACKWARD_FENCE))
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
	if (vmmrt__offload_resident(off, g, use, true)) {
		g->timed_h2d = false;
		return VMMRT_OK; /* it never left */
	}
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	if (bank->user_done)
		return enqueue_restore(off, g, use);
	if (bank->pending)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "group '%s': bank %u already has a deferred restore (look-ahead beyond its banks)",
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
	/* Fence 1: the previous activation in this bank has reached host memory
	 * (or the graph that last read it has finished). */
	if (bank->free_ev && !VMMRT__PLANTED(off, VMMRT__DROP_FORWARD_FENCE)) {
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
	if (vmmrt__offload_resident(off, g, off->sched.use, false)) {
		g->timed_d2h = false;
		return VMMRT_OK; /* its backward comes before anyone else needs the bank */
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
	if (vmmrt__offload_resident(off, g, off->sched.use, true))
		return VMMRT_OK;
	if (g->restore_use != off->sched.use + 1) {
		vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "group '%s': its restore could not start (bank %u still held by group '%s')",
				   g->name, g->pingpong.bank, bank->user ? bank->user->name : "?");
	}
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

/* The pipeline is drained, the compute streams too: every bank is free,
 * every event has completed, so no fence is left to wait for (and the
 * events of a group re-discovered next may be destroyed with its retired
 * copy). */
static vmmrt_status pp_reset(vmmrt__offload *off)
{
	for (unsigned b = 0; b < off->pingpong.nbanks; b++) {
		vmmrt__bank *bank = &off->pingpong.bank[b];
		bank->user = bank->pending = NULL;
		bank->user_done = true;
		bank->free_ev = NULL;
	}
	return VMMRT_OK;
}

static void release_bank_memory(vmmrt__offload *off, vmmrt__bank *bank)
{
	if (!bank->slot)
		return;
	vmmrt__offload_account(off, -(int64_t)vmmrt_slot_size(bank->slot));
	vmmrt__offload_destroy_slot(bank->slot);
	bank->slot = NULL;
	bank->free_ev = NULL;
}

/* A bank goes when the last group (or retired copy) in it does. */
static void pp_free_group(vmmrt__offload *off, vmmrt_group *g)
{
	if (!g->pingpong.has_bank)
		return;
	vmmrt__bank *bank = &off->pingpong.bank[g->pingpong.bank];
	g->pingpong.has_bank = false;
	if (bank->groups && --bank->groups == 0)
		release_bank_memory(off, bank);
}

static void pp_destroy(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->ngroups; i++)
		pp_free_group(off, off->groups[i]);
	for (unsigned b = 0; b < off->pingpong.nbanks; b++)
		release_bank_memory(off, &off->pingpong.bank[b]); /* a bank half made at a failed allocation */
	free(off->pingpong.bank);
	off->pingpong = (vmmrt__pingpong){0};
}

/* For a hang report: who holds each bank, and the restore waiting for it. */
static void pp_dump(vmmrt__offload *off, int fd)
{
	if (!off->pingpong.nbanks) {
		dprintf(fd, "; no banks");
		return;
	}
	for (unsigned b = 0; b < off->pingpong.nbanks; b++) {
		const vmmrt__bank *bank = &off->pingpong.bank[b];
		if (!bank->slot)
			continue;
		dprintf(fd, "; bank %u: user '%s', %s%s%s", b, bank->user ? bank->user->name : "",
			bank->user_done ? "let go" : "held", bank->pending ? ", restore of '" : "",
			bank->pending ? bank->pending->name : "");
		if (bank->pending)
			dprintf(fd, "' waits");
	}
}

static void pp_dump_group(vmmrt__offload *off, vmmrt_group *g, int fd)
{
	if (g->pingpong.has_bank)
		dprintf(fd, ", bank %u", g->pingpong.bank);
}

/* The banks made: nothing else of the groups' is on the device. */
static void pp_stats(const vmmrt__offload *off, vmmrt_offload_stats *o)
{
	for (unsigned b = 0; b < off->pingpong.nbanks; b++)
		if (off->pingpong.bank[b].slot) {
			o->banks++;
			o->bound_bytes += vmmrt_slot_size(off->pingpong.bank[b].slot);
		}
}

const vmmrt__strategy_ops vmmrt__strategy_pingpong = {
	.name = "pingpong",
	.max_lookahead = 1,
	.plan = pp_plan,
	.reset = pp_reset,
	.free_group = pp_free_group,
	.allocate = pp_allocate,
	.forward_begin = pp_forward_begin,
	.forward_end = pp_forward_end,
	.prefetch = pp_prefetch,
	.backward_begin = pp_backward_begin,
	.backward_end = pp_backward_end,
	.destroy = pp_destroy,
	.stats = pp_stats,
	.dump = pp_dump,
	.dump_group = pp_dump_group,
};

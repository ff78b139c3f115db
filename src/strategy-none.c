/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * No offload: every group keeps its own slot mapped for the whole run. This
 * is the baseline the A/B is measured against (graphs, activations resident),
 * behind the same hooks so the application code does not change.
 */
#include "config.h"

#include "error.h"
#include "pipeline.h"

static vmmrt_status none_allocate(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		if (!g->ndesc || g->state != VMMRT_GROUP_DISCOVERING)
			continue; /* empty, or allocated before a re-discovery of others */
		vmmrt_status st = vmmrt__slot_reserve(off->rt, g->bytes, &g->slot);
		if (st == VMMRT_OK)
			st = vmmrt__slot_map(g->slot);
		if (st != VMMRT_OK)
			return vmmrt__error_wrap(st, "group '%s': slot of %zu bytes", g->name, g->bytes);
		g->base = vmmrt_slot_address(g->slot);
		vmmrt__offload_account(off, (int64_t)g->slot->size);
	}
	return VMMRT_OK;
}

static vmmrt_status none_hook(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute)
{
	return VMMRT_OK;
}

static vmmrt_status none_prefetch(vmmrt__offload *off, vmmrt_group *g, bool backward, uint64_t use)
{
	return VMMRT_OK;
}

static void none_plan(vmmrt__offload *off)
{
	off->lookahead_in_force = 0;
}

static vmmrt_status none_reset(vmmrt__offload *off)
{
	return VMMRT_OK;
}

static void none_free_group(vmmrt__offload *off, vmmrt_group *g)
{
	if (g->slot) {
		vmmrt__offload_account(off, -(int64_t)g->slot->size);
		vmmrt__offload_destroy_slot(g->slot);
		g->slot = NULL;
	}
}

static void none_destroy(vmmrt__offload *off)
{
	for (unsigned i = 0; i < off->ngroups; i++)
		none_free_group(off, off->groups[i]);
}

/* Every group resident: the bound is all of them. */
static void none_stats(const vmmrt__offload *off, vmmrt_offload_stats *o)
{
	o->budget_groups = off->ngroups;
	o->bound_bytes = vmmrt__offload_largest(off, off->ngroups);
}

const vmmrt__strategy_ops vmmrt__strategy_none = {
	.name = "none",
	.max_lookahead = 0,
	.plan = none_plan,
	.reset = none_reset,
	.free_group = none_free_group,
	.allocate = none_allocate,
	.forward_begin = none_hook,
	.forward_end = none_hook,
	.prefetch = none_prefetch,
	.backward_begin = none_hook,
	.backward_end = none_hook,
	.destroy = none_destroy,
	.stats = none_stats,
};

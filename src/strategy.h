/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A strategy: what the hooks do to memory. One per runtime (the A/B switch),
 * chosen when the runtime is made; offload.c calls it through this table,
 * and it keeps its state in its part of the offload state and of each group
 * (strategy-pingpong.h, strategy-remap.h).
 */
#ifndef VMMRT__STRATEGY_H
#define VMMRT__STRATEGY_H

#include <stdbool.h>
#include <stdint.h>

#include "vmmrt.h"

typedef struct vmmrt__offload vmmrt__offload;

typedef struct vmmrt__strategy_ops {
	const char *name;
	/* The deepest look-ahead it can use without a recorded schedule. */
	unsigned max_lookahead;
	/* The schedule became known (declared at allocation, or recorded by the
	 * first iteration): set off->lookahead_in_force and what follows from the order. */
	void (*plan)(vmmrt__offload *off);
	/* Optional, before an abort drains the streams: let whatever a stream
	 * may wait for go ahead. */
	void (*unblock)(vmmrt__offload *off);
	/* After the pipeline was drained (abort, re-allocation): put the state
	 * back to what the first use of an iteration expects, releasing what
	 * the abandoned uses left mapped. */
	vmmrt_status (*reset)(vmmrt__offload *off);
	/* Free what g (a group, or a retired copy of one) holds of the strategy's. */
	void (*free_group)(vmmrt__offload *off, vmmrt_group *g);
	/* Before teardown: release whatever a stream may still wait for. */
	void (*quiesce)(vmmrt__offload *off);
	/* Reserve/map what the groups still discovering need (every group at the
	 * first allocation, the re-discovered ones later). */
	vmmrt_status (*allocate)(vmmrt__offload *off);
	/* Before F(g) on compute: make the memory writable (fence 1, or the map). */
	vmmrt_status (*forward_begin)(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute);
	/* After F(g): D2H, and what follows it (release). */
	vmmrt_status (*forward_end)(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute);
	/* Prepare use k ahead of time (look-ahead): map, or restore for a B use. */
	vmmrt_status (*prefetch)(vmmrt__offload *off, vmmrt_group *g, bool backward, uint64_t use);
	/* Before B(g): the compute stream waits for the restore. */
	vmmrt_status (*backward_begin)(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute);
	/* After B(g): record consumption, free the memory (fence 2, or the release). */
	vmmrt_status (*backward_end)(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream compute);
	void (*destroy)(vmmrt__offload *off);
	/* For vmmrt_offload_stats_get (any thread, racy reads): its memory bound,
	 * bound_bytes, and what it is made of (banks, or budget_groups). */
	void (*stats)(const vmmrt__offload *off, vmmrt_offload_stats *o);
	/* Optional, for a hang report (racy reads): append the strategy's state
	 * to the runtime's line, and to each group's (no newline). */
	void (*dump)(vmmrt__offload *off, int fd);
	void (*dump_group)(vmmrt__offload *off, vmmrt_group *g, int fd);
} vmmrt__strategy_ops;

extern const vmmrt__strategy_ops vmmrt__strategy_pingpong;
extern const vmmrt__strategy_ops vmmrt__strategy_remap;
extern const vmmrt__strategy_ops vmmrt__strategy_none;

#endif

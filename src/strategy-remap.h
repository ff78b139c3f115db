/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap's part of the offload state (strategy-remap.c and remap-pending.c
 * own it): the requests it hands the driver workers, the flags the GPU waits
 * on, the release accounting, admission and the maps not yet assured. Types
 * only: the offload state and each group embed them (offload.h, group.h).
 */
#ifndef VMMRT__STRATEGY_REMAP_H
#define VMMRT__STRATEGY_REMAP_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "worker.h"

enum { VMMRT__USE_FORWARD = 0, VMMRT__USE_BACKWARD = 1 };
#define VMMRT__REQ_RING 8
#define VMMRT__PENDING_MAPS 32 /* > the largest look-ahead + 1 */
#define VMMRT__NOT_OWED UINT64_MAX

/* Everything the remap strategy needs to hand a request to a worker. */
typedef struct vmmrt__remap_req {
	vmmrt__request req;
	vmmrt_group *g;
	uint64_t ticket;   /* MAP: admission order (schedule order) */
	uint64_t need;     /* MAP: releases of this group that must have run first */
	uint32_t seq;      /* MAP: value written to the group's flag when mapped */
	bool grew;         /* MAP: it created memory (the slot was not mapped) */
	vmmrt__bevent *ev;  /* RELEASE after a backward: recorded after its graph */
} vmmrt__remap_req;

/* A map requested and not yet known to need no more of the launch thread's work. */
typedef struct vmmrt__pending_map {
	vmmrt_group *g;
	uint64_t use, need;
	uint32_t seq;
	bool backward;
} vmmrt__pending_map;

/* Per offload state: admission in schedule order under a budget of groups. */
typedef struct vmmrt__remap {
	uint64_t next_ticket;         /* launch thread */
	/*
	 * Launch thread: maps requested and not yet known to need no more of
	 * the launch thread's work, in ticket order (remap-pending.c). A
	 * restore's wait goes on the H2D stream only once its map is known so:
	 * a GPU wait that hangs on a release still to be handed off would
	 * deadlock against any call that synchronizes the device meanwhile.
	 */
	vmmrt__pending_map pending[VMMRT__PENDING_MAPS];
	unsigned pending_head, pending_n;
	uint64_t admit_ticket;        /* uatomic, workers */
	int64_t resident;             /* uatomic: groups mapped or admitted */
	int64_t budget;               /* the most groups mapped at once the schedule needs */
	/* Abort (uatomic, read by the workers): admit maps out of ticket order
	 * and past the budget, so everything a stream may wait for can run. */
	int32_t aborting;
	bool d2h_yield;               /* option d2h_yield (and not driver_inline) */
	uint64_t d2h_yields;          /* uatomic: waits the D2H stream made for maps */
} vmmrt__remap;

/* Per group. */
typedef struct vmmrt__remap_group {
	/* the GPU waits for *flag >= seq of the map it needs */
	uint32_t *flag;
	vmmrt_devptr flag_dev;
	uint32_t map_seq;             /* last seq requested */
	/*
	 * Map k needs the group's releases 0..k-1 done (every map is followed
	 * by a release, in use order). A release a failed hook could not hand
	 * off is owed: the slot stays mapped, and it is counted in its turn,
	 * once the releases before it ran (see release_counted), so no map
	 * waits for it forever and none passes a release still in flight.
	 */
	uint64_t maps_requested;      /* launch thread */
	uint64_t releases_planned;    /* launch thread: release obligations, in use order */
	uint64_t releases_done;       /* uatomic, workers */
	uint64_t owed_index;          /* uatomic: the release owed, or VMMRT__NOT_OWED */
	/*
	 * uatomic: the memory mapped now counts in the budget. Not so for the
	 * backing allocation maps for capture: in an order where a backward
	 * comes before some group's first forward (1F1B), that group's initial
	 * backing, still mapped, would otherwise hold the budget that the
	 * backward's map waits for, until a forward that comes after it.
	 */
	int32_t counted;
	/*
	 * Requests per use kind, in rings: the launch thread may run up to
	 * VMMRT__REQ_RING iterations ahead of the GPU before it has to wait for
	 * one of its own requests to come back (and that wait is counted).
	 */
	vmmrt__remap_req map[2][VMMRT__REQ_RING], rel[2][VMMRT__REQ_RING];
	unsigned map_next[2], rel_next[2];
	uint32_t map_seq_of[2];       /* seq of the last map requested per kind */
} vmmrt__remap_group;

#endif

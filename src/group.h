/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Offload groups (group.c): one per runner, the tensors its forward saves
 * for its backward, and what every strategy keeps per group (the pinned
 * host copy, the events of its copies) next to what its strategy keeps
 * (the strategy's part, which the rest never reads).
 */
#ifndef VMMRT__GROUP_H
#define VMMRT__GROUP_H

#include "runtime.h"
#include "strategy-pingpong.h"
#include "strategy-remap.h"

typedef struct vmmrt__offload vmmrt__offload;

/* Which begin hook of a group has its end still due. */
typedef enum vmmrt__begun { VMMRT__BEGUN_NONE, VMMRT__BEGUN_FORWARD, VMMRT__BEGUN_BACKWARD } vmmrt__begun;

struct vmmrt_group {
	vmmrt_runtime *rt;
	vmmrt__offload *off;
	char name[48];
	unsigned index;               /* registration order */
	vmmrt_group_state state;

	/* discovery */
	vmmrt_tensor_desc *desc;
	size_t *offset;               /* of each tensor inside the slot */
	unsigned ndesc, cap;
	size_t bytes;                 /* all tensors, aligned: the slot's payload */
	unsigned saved;               /* capture: next tensor to save */

	/* allocation */
	vmmrt_slot *slot;             /* remap, none: the group's own slot */
	vmmrt_devptr base;
	void *host;                   /* pinned copy of the activations */
	vmmrt__bevent *fwd_done, *d2h_done, *restored, *consumed;
	/* timing events bracketing the copies (d2h_done/restored end them) */
	vmmrt__bevent *d2h_start, *h2d_start;
	bool timed_d2h, timed_h2d;    /* the last iteration copied this group */
	/*
	 * The copies as captured graphs (remap). The driver checks a copy's
	 * addresses when it is enqueued, and a remap slot is often not mapped yet
	 * then (its map waits on the stream, behind a wait-value); a graph
	 * captured while it was mapped replays at the same address without that
	 * check. NULL: plain async copies (ping-pong banks are always mapped).
	 */
	vmmrt__bgraph *d2h_graph, *h2d_graph;

	/* pipeline, launch thread */
	uint64_t restore_use;         /* use number of the last restore enqueued, +1 (0: none) */
	/* the strategy keeps it where it is from its forward to its backward,
	 * beyond the schedule's rule (vmmrt__offload_resident): ping-pong, when
	 * no other group takes its bank in between (vmmrt__schedule_stays) */
	bool stays;

	/* the strategy's part */
	union {
		vmmrt__pingpong_group pingpong;
		vmmrt__remap_group remap;
	};

	vmmrt__begun begun;           /* the begin hook whose end is due */
	vmmrt_stream stream;          /* the compute stream of its last begin hook: an abort waits for it */
	bool streamed;                /* a begin hook set it */
	vmmrt_stream save_stream;     /* the stream of its last copy at capture (vmmrt_group_save): an abort waits for it too */
	bool save_streamed;           /* a copying save set it */
	int32_t error;                /* first asynchronous failure (uatomic) */
	char errmsg[256];
};

/* Pinned host buffer and the events every strategy uses. */
vmmrt_status vmmrt__group_alloc_common(vmmrt_group *g);
/* Undo vmmrt__group_alloc_common (the strategy frees slots and banks). */
void vmmrt__group_release(vmmrt_group *g);
void vmmrt__group_free(vmmrt_group *g);
/* Re-discovery: move what g was allocated to a retired copy in the offload
 * state, and put g back to discovery with no descriptors. */
vmmrt_status vmmrt__group_retire(vmmrt_group *g);
/* Free every retired copy (the strategy's part through its ops). */
void vmmrt__group_free_retired(vmmrt__offload *off);
/* Keep g's first asynchronous failure for the next hook to report (any thread). */
void vmmrt__group_fail(vmmrt_group *g, vmmrt_status st, const char *what);
/* vmmrt_group_error without the public prologue, for the library's own use. */
vmmrt_status vmmrt__group_take_error(vmmrt_group *g);

#endif

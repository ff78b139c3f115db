/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Offload internals shared by the group, schedule and strategy files.
 *
 * Naming: a "use" is one graph of one group in the iteration's sequence
 * F(fwd[0]) .. F(fwd[n-1]) B(bwd[0]) .. B(bwd[n-1]); uses are numbered
 * across iterations (use k is position k mod 2n of iteration k / 2n).
 * Everything here runs on the launch thread unless it says otherwise.
 */
#ifndef VMMRT_OFFLOAD_H
#define VMMRT_OFFLOAD_H

#include "runtime.h"
#include "slot.h"

typedef struct vmmrt__offload vmmrt__offload;

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

enum { USE_F = 0, USE_B = 1 };
#define VMMRT_REQ_RING 8
#define VMMRT_PENDING_MAPS 32 /* > the largest look-ahead + 1 */
#define VMMRT_NOT_OWED UINT64_MAX

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
	unsigned bank;                /* pingpong */
	vmmrt_devptr base;
	void *host;                   /* pinned copy of the activations */
	vmmrt__bevent *fwd_done, *d2h_done, *restored, *consumed;
	/* timing events bracketing the copies (d2h_done/restored end them) */
	vmmrt__bevent *d2h_start, *h2d_start;
	bool timed_d2h, timed_h2d;    /* the last iteration copied this group */
	/*
	 * remap: the copies as captured graphs. The driver checks a copy's
	 * addresses when it is enqueued, and a remap slot is often not mapped yet
	 * then (its map waits on the stream, behind a wait-value); a graph
	 * captured while it was mapped replays at the same address without that
	 * check. NULL: plain async copies (ping-pong banks are always mapped).
	 */
	vmmrt__bgraph *d2h_graph, *h2d_graph;

	/* remap: the GPU waits for *flag >= seq of the map it needs */
	uint32_t *flag;
	vmmrt_devptr flag_dev;
	uint32_t map_seq;             /* last seq requested */
	/*
	 * Map k needs the group's releases 0..k-1 done (every map is followed
	 * by a release, in use order). A release a failed hook could not hand
	 * off is owed: the slot stays mapped, and it is counted in its turn,
	 * once the releases before it ran (vmmrt__remap_release_counted), so no
	 * map waits for it forever and none passes a release still in flight.
	 */
	uint64_t maps_requested;      /* launch thread */
	uint64_t releases_planned;    /* launch thread: release obligations, in use order */
	uint64_t releases_done;       /* uatomic, workers */
	uint64_t owed_index;          /* uatomic: the release owed, or VMMRT_NOT_OWED */
	/*
	 * Requests per use kind, in rings: the launch thread may run up to
	 * VMMRT_REQ_RING iterations ahead of the GPU before it has to wait for
	 * one of its own requests to come back (and that wait is counted).
	 */
	vmmrt__remap_req map[2][VMMRT_REQ_RING], rel[2][VMMRT_REQ_RING];
	unsigned map_next[2], rel_next[2];
	uint32_t map_seq_of[2];       /* seq of the last map requested per kind */

	/* pipeline, launch thread */
	uint64_t restore_use;         /* use number of the last restore enqueued, +1 (0: none) */
	uint64_t map_use[2];          /* use number of the last map requested per kind, +1 */

	int open;                     /* 0, or the begin hook whose end is due: 1 fwd, 2 bwd */
	int32_t error;                /* first asynchronous failure (uatomic) */
	char errmsg[256];
};

/* The recorded order and the cursor through it. */
typedef struct vmmrt__schedule {
	unsigned n;
	unsigned *fwd, *bwd;          /* group indexes in the order they ran */
	unsigned nfwd, nbwd;          /* recorded so far (first iteration) */
	bool recorded;
	uint64_t iteration;
	uint64_t use;                 /* the current use number */
	uint64_t requested;           /* uses < requested have been prefetched */
	bool in_backward;
} vmmrt__schedule;

/* A strategy: what the hooks do to memory. One per runtime (the A/B switch). */
typedef struct vmmrt__strategy_ops {
	const char *name;
	/* The deepest look-ahead it can use (ping-pong: one restore per spare bank). */
	unsigned max_lookahead;
	/* Before teardown: release whatever a stream may still wait for. */
	void (*quiesce)(vmmrt__offload *off);
	/* Reserve/map what the groups need, after discovery. */
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
} vmmrt__strategy_ops;

extern const vmmrt__strategy_ops vmmrt__strategy_pingpong;
extern const vmmrt__strategy_ops vmmrt__strategy_remap;
extern const vmmrt__strategy_ops vmmrt__strategy_none;

typedef struct vmmrt__bank {
	vmmrt_slot *slot;
	vmmrt__bevent *free_ev;        /* recorded when the last user of the bank let go of it */
	vmmrt_group *user;            /* last group to use it (forward or backward) */
	bool user_done;               /* its free_ev has been recorded */
	vmmrt_group *pending;         /* a restore waiting for user_done */
	uint64_t pending_use;
} vmmrt__bank;

/*
 * Test-only planted bugs, to prove the tests can see what they guard against:
 * drop a ping-pong fence (corruption), or (remap) queue the release after a
 * forward from the launch thread at once instead of from the D2H stream once
 * the copy is done, so the memory may go before the D2H has read it.
 */
enum { VMMRT_DROP_FORWARD_FENCE = 1, VMMRT_DROP_BACKWARD_FENCE = 2, VMMRT_PLANT_EARLY_RELEASE = 4 };

struct vmmrt__offload {
	vmmrt_runtime *rt;
	const vmmrt__strategy_ops *ops;
	vmmrt_stream d2h, h2d;
	vmmrt_group **groups;
	unsigned ngroups, cap;
	bool allocated;
	vmmrt__schedule sched;

	/* ping-pong */
	vmmrt__bank bank[2];
	int drop_fence;

	/* remap: admission in schedule order under a budget of groups */
	uint64_t next_ticket;         /* launch thread */
	/*
	 * remap, launch thread: maps requested and not yet known to need no
	 * more of the launch thread's work, in ticket order (see rm_prefetch).
	 * A restore's wait goes on the H2D stream only once its map is known
	 * so: a GPU wait that hangs on a release still to be handed off would
	 * deadlock against any call that synchronizes the device meanwhile.
	 */
	struct vmmrt__pending_map {
		vmmrt_group *g;
		uint64_t use, need;
		uint32_t seq;
		bool backward;
	} pending[VMMRT_PENDING_MAPS];
	unsigned pending_head, pending_n;
	uint64_t admit_ticket;        /* uatomic, workers */
	int64_t resident;             /* uatomic: groups mapped or admitted */
	int64_t budget;

	/* statistics (uatomic where workers or host functions write) */
	uint64_t bytes_offloaded, bytes_restored;
	int64_t activation_bytes, activation_peak;
	uint64_t maps, releases, bank_conflicts;
	uint64_t iterations;          /* last backward hooks ended */
	/* Teardown found a stream still waiting on a flag: those words are not
	 * freed (a stream polls them), and destroy reports it. */
	bool stuck;
	/* A hook failed after it had enqueued part of its work: the pipeline no
	 * longer matches the schedule, so every later hook refuses (launch
	 * thread). What is enqueued still drains; the message says what failed. */
	bool broken;
	char broken_why[256];
};

/* offload-dump.c: the pipeline's state, for a hang report (racy reads). */
void vmmrt__offload_dump(vmmrt_runtime *rt, int fd);

/* remap-pending.c: a map requested (in ticket order); the restore of a
 * backward one goes on the H2D stream once the map is assured. */
vmmrt_status vmmrt__remap_pending_add(vmmrt__offload *off, const struct vmmrt__pending_map *p);
/* Take what is assured now, and what uses up to `now` need in any case. */
vmmrt_status vmmrt__remap_pending_flush(vmmrt__offload *off, uint64_t now);

/* strategy-remap.c: count one of g's releases as run (any thread). */
void vmmrt__remap_release_counted(vmmrt_group *g);

/* offload.c */
vmmrt__offload *vmmrt__offload_get(vmmrt_runtime *rt, vmmrt_status *st);
vmmrt_status vmmrt__offload_destroy(vmmrt_runtime *rt);
void vmmrt__offload_account(vmmrt__offload *off, int64_t delta_bytes);
void vmmrt__group_fail(vmmrt_group *g, vmmrt_status st, const char *what);

/* group.c */
vmmrt_status vmmrt__group_alloc_common(vmmrt_group *g);
/* Undo vmmrt__group_alloc_common (the strategy frees slots and banks). */
void vmmrt__group_release(vmmrt_group *g);
void vmmrt__group_free(vmmrt_group *g);

/*
 * Is use `use` of g (its forward, or its backward) the tail: the last forward
 * followed at once by its own backward? Its activations then stay on the
 * device: no D2H, no restore, no release in between. Decided by use number,
 * not by the moment of the call: only from the second iteration on, when the
 * forward already ran under the recorded schedule, so the forward and the
 * backward (and a prefetch made before either) always agree.
 */
bool vmmrt__offload_is_tail(const vmmrt__offload *off, const vmmrt_group *g, uint64_t use, bool backward);
/*
 * Make `s` wait for e, unless e has already completed: a dependency that is
 * already satisfied costs the compute stream a gap for nothing (about 0.5 us
 * of the 1.8 us between two graphs on the H200), a query costs the launch
 * thread a non-blocking driver call.
 */
vmmrt_status vmmrt__offload_wait(vmmrt__offload *off, vmmrt_stream s, vmmrt__bevent *e);
/* Enqueue a copy bracketed by the group's timing events. */
vmmrt_status vmmrt__offload_d2h(vmmrt__offload *off, vmmrt_group *g);
vmmrt_status vmmrt__offload_h2d(vmmrt__offload *off, vmmrt_group *g);
/* Capture g's two copies as graphs (the slot must be mapped now). */
vmmrt_status vmmrt__offload_capture_copies(vmmrt__offload *off, vmmrt_group *g);
void vmmrt__offload_free_copies(vmmrt__offload *off, vmmrt_group *g);
/* Destroy a slot of the offload state (a bank, a group's slot), once more if
 * the first teardown failed, so its memory is not held until runtime destroy. */
void vmmrt__offload_destroy_slot(vmmrt_slot *s);
/* Enqueue a host function that pushes req to its slot's worker. */
vmmrt_status vmmrt__offload_push_after(vmmrt__offload *off, vmmrt_stream s, vmmrt__remap_req *r);

/* schedule.c */
vmmrt_status vmmrt__schedule_init(vmmrt__schedule *s, unsigned n);
void vmmrt__schedule_free(vmmrt__schedule *s);
/* Check/record that g's forward (backward) runs now; sets s->use. */
vmmrt_status vmmrt__schedule_enter(vmmrt__schedule *s, vmmrt_group *g, bool backward);
/* The group and kind of use number k (only once recorded). */
unsigned vmmrt__schedule_group_of(const vmmrt__schedule *s, uint64_t use, bool *backward);
/* Uses to prefetch now: [*from, *to). Empty until the order is recorded. */
void vmmrt__schedule_window(vmmrt__schedule *s, unsigned lookahead, uint64_t *from, uint64_t *to);

/* vmmrt_group_error without the public prologue, for the library's own use. */
vmmrt_status vmmrt__group_take_error(vmmrt_group *g);

#endif

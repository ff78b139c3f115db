/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slot: one reservation whose address never changes, and the physical
 * memory mapped behind it at times. The application-visible state machine is
 * vmmrt_slot_state; the driver-side truth (mapped or not, which handle) is
 * owned by the slot's driver worker, the only thread that maps or unmaps it.
 *
 * slot.c: reservation, the requests queued for a slot, the public calls.
 * slot-work.c (below it): what the worker does with those requests, and
 * each worker's handle pool.
 */
#ifndef VMMRT__SLOT_H
#define VMMRT__SLOT_H

#include <urcu/uatomic.h>
#include <urcu/urcu-bp.h>

#include "runtime.h"
#include "worker.h"

/*
 * Stream-ordered backing (vmmrt_slot_map_async, vmmrt_slot_release_after).
 * A release waits on the worker for an event recorded on the caller's
 * stream (vmmrt__request.after), so it can be overtaken there by a map the
 * caller asked for later; the slot's `backing` word makes such a release a
 * no-op. It is the map generation times two, plus VMMRT__SLOT_UNBACKED:
 *
 *  - map_async (the caller's thread) moves to the next generation and
 *    clears UNBACKED in one compare-and-swap, then pushes an ensure map
 *    only if UNBACKED was set;
 *  - release_after records the generation g it was asked in;
 *  - the release, when its event has completed, runs only if it swaps
 *    2g (generation g, UNBACKED clear) for 2g + 1 (the claim), and then
 *    unmaps and gives the memory to the driver in the same run;
 *  - a failed map sets UNBACKED again (the slot has no memory after all).
 *
 * Why a slot ends mapped exactly when a map_async came after the release
 * was requested (let M be the first such map_async, R the release):
 *  - M's swap before R's claim: the generation is no longer g, so R's claim
 *    fails and R does nothing, whether it runs before or after the map M
 *    pushed (if any). M pushed nothing only if UNBACKED was clear: no
 *    release had claimed since the map that backs the slot, which has
 *    ended before R starts (below).
 *  - R's claim before M's swap: M sees UNBACKED (only a map_async or a
 *    synchronous map clears it, both on the caller's thread) and pushes an
 *    ensure map. R is running or done by then, and the worker runs one
 *    request at a time, so the map runs after R's unmap: mapped.
 *  - No map_async after R: the generation is still g when R runs; R claims
 *    (UNBACKED is clear unless the map backing the slot failed, and then
 *    there is nothing to release) and releases.
 * A release starts only once the map asked before it has ended (its
 * map_seq reached the flag: the arelease ops' ready), whatever the events
 * they wait for: a map that follows an event on a busy stream
 * (vmmrt_slot_map_after) would otherwise be passed by a release after an
 * idle stream, which would claim, find nothing mapped, and leave the map
 * to land behind it with no release to come.
 * UNBACKED set too often costs an ensure map that finds the slot mapped
 * and does nothing; clear too early would leave a slot unbacked for good,
 * so everything that may unback the slot sets it first.
 */
/*
 * Stream waits (vmmrt_slot_map_after, vmmrt_slot_wait_stream): each push of
 * amap_req takes the next map_seq, and its done callback stores that number
 * into *flag, a host-pinned word, whether the map was made, failed or was
 * cancelled: a stream that waits for it (a wait-value, as remap's restores
 * wait for their map) must never wait forever. The flag exists once the
 * first stream-ordered map is pushed (made before the push: the worker may
 * end it before the push returns), and goes with the slot: freed by the
 * destroy's caller once the worker has run it, never on the worker (slot.c).
 */
#define VMMRT__SLOT_UNBACKED 1ull
#define VMMRT__SLOT_GENERATION 2ull
/* Stream-ordered releases a slot may have in flight: a launch thread runs a
 * few steps ahead of the GPU; one more waits for the oldest (bounded). */
#define VMMRT__SLOT_RELEASES 4
/* The last stream waits of a slot whose passing its destroy waits for
 * before the flag goes (a stream still behind one would read freed memory). */
#define VMMRT__SLOT_WAITS 4

typedef struct vmmrt__slot_release {
	vmmrt__request req;   /* its `after` is event; req.owner the slot */
	vmmrt__bevent *event; /* recorded on the caller's stream; made on first use */
	uint64_t gen;         /* the slot's map generation when it was requested */
	uint32_t map_seq;     /* the slot's map_seq then: it starts once that map ended */
} vmmrt__slot_release;

struct vmmrt_slot {
	vmmrt_runtime *rt;
	uint64_t id;
	vmmrt_devptr va;
	size_t size;           /* the mapped size, a multiple of the granularity */
	size_t reserved;       /* the reservation, freed whole (vmmrt_slot_truncate lowers size alone) */
	unsigned worker;       /* every request for this slot goes to this worker */

	int32_t state;         /* vmmrt_slot_state, uatomic */
	int32_t error;         /* last asynchronous failure, uatomic; cleared by vmmrt_slot_error */
	char errmsg[192];      /* its message, written before error is published */

	/* worker-owned */
	bool mapped;
	/* What is mapped is a vmmrt_pages' memory (vmmrt_slot_map_pages): an
	 * unmap, a release or the destroy unmaps it and leaves the handle to
	 * the pages. Read by the caller only when none of the slot's requests
	 * that change it is in flight (they are all synchronous). */
	bool bound;
	vmmrt__bhandle handle;
	/* set before its first request: remap's budget covers this slot's
	 * memory (counted in rt->budgeted_handles while mapped) */
	bool budgeted;

	/* one preallocated request per kind: a slot never has two of a kind queued */
	vmmrt__request map_req;
	vmmrt__request release_req;
	/* vmmrt_slot_map_pages: the pages and the offset its request maps, set
	 * by the caller before the push; bind_chunk, the pages' chunk, stays
	 * while bound (the pages may be destroyed first): a bound slot is
	 * unmapped chunk by chunk, as it was mapped */
	vmmrt__request bind_req;
	const struct vmmrt_pages *bind_pages;
	size_t bind_offset;
	size_t bind_chunk;
	/* vmmrt_slot_map_pages_table: the pages' offset of each of the slot's
	 * chunks (NULL: chunk i at bind_offset + i * chunk, the linear bind).
	 * The caller's copy, set with bind_pages before the push; from the push
	 * on it is the bind request's: the worker frees it once the bind has
	 * run, whatever its outcome (nothing reads it after the map: an unbind
	 * goes chunk by chunk over the slot's range, whichever handle is
	 * there), and the slot's free frees one whose bind was cancelled
	 * without running (the slot destroyed after a bind's wait timed out). */
	size_t *bind_table;

	/* Made by vmmrt_slot_create (set before its first request): the
	 * application's memory, counted in slot_bytes, and always given back to
	 * the driver, never kept in a worker's handle pool: an application
	 * releases a slot so that the memory comes back. */
	bool app;
	/* Stream-ordered backing (see above). */
	uint64_t backing;      /* uatomic: generation * 2 | VMMRT__SLOT_UNBACKED */
	int32_t queued;        /* uatomic: its map and releases not finished yet (PENDING) */
	vmmrt__request amap_req;        /* vmmrt_slot_map_async's and map_after's (ensure) */
	uint32_t *flag;                 /* host-pinned: the map_seq of the last map that ended */
	vmmrt_devptr flag_dev;          /* its device address, for the wait-values */
	uint32_t map_seq;               /* the caller's: the last amap_req pushed; read by its done */
	/* vmmrt_slot_map_after: the map follows the application's event as it
	 * was at the call, through a stream of the slot's own that waits for it
	 * and records order_event, which the worker polls (amap_req.after).
	 * Recorded only before a push, when the last map has ended. */
	vmmrt_stream order_stream;
	vmmrt__bevent *order_event;
	/* vmmrt_slot_wait_stream: an event recorded behind each of the last
	 * VMMRT__SLOT_WAITS waits (the caller's ring; made on first use), which
	 * the destroy synchronizes before it frees the flag. keep_flag: a wait
	 * whose event could not be recorded: the flag is left to the backend's
	 * close rather than freed under it. */
	vmmrt__bevent *waited[VMMRT__SLOT_WAITS];
	unsigned next_wait;
	bool keep_flag;
	vmmrt__slot_release *releases;  /* [VMMRT__SLOT_RELEASES], made by the first release_after */
	/* the caller's (one thread uses a slot at a time): */
	unsigned next_release;          /* the ring's next record */
	bool wanted;           /* mapped or a map requested, no release requested since */

	bool dying;            /* destroy was requested: later requests are cancelled */
	struct cds_list_head link;  /* rt->slots */
	struct rcu_head rcu;   /* the worker frees the slot through call_rcu */
};

static inline void vmmrt__slot_set_state(vmmrt_slot *s, vmmrt_slot_state st)
{
	uatomic_set(&s->state, (int32_t)st);
}

/* ------------------------------------------------------------ slot-work.c */

/*
 * A slot's requests, for vmmrt__request_init(req, ops, slot): map (an
 * error if mapped), ensure (map unless mapped), release (unmap, the handle
 * to the pool or cuMemRelease), destroy (unmap and release what is mapped,
 * free the VA, free the slot after an RCU grace period; requests still
 * waiting for the slot on its worker are cancelled first).
 */
extern const vmmrt__request_ops vmmrt__slot_map_ops;
extern const vmmrt__request_ops vmmrt__slot_ensure_ops;
extern const vmmrt__request_ops vmmrt__slot_release_ops;
extern const vmmrt__request_ops vmmrt__slot_destroy_ops;
/* bind: map bind_pages' chunks from bind_offset on, or those bind_table names
 * (an error if mapped), and free the table; the slot is then bound (`bound`):
 * what unmaps it leaves the memory to its pages. */
extern const vmmrt__request_ops vmmrt__slot_bind_ops;
/*
 * The stream-ordered ones: amap (ensure, sets VMMRT__SLOT_UNBACKED again if it
 * fails, publishes map_seq to the flag however it ends) and arelease (on a
 * vmmrt__slot_release: once the map asked before it ended, claims the
 * generation it was asked in, then unmaps and cuMemReleases). Both end by decrementing
 * the slot's `queued`, whatever the outcome (their done callback:
 * vmmrt__slot_async_done, which publishes a failure).
 */
extern const vmmrt__request_ops vmmrt__slot_amap_ops;
extern const vmmrt__request_ops vmmrt__slot_arelease_ops;
void vmmrt__slot_async_done(vmmrt__request *req, vmmrt_status st, void *arg);

/* The runtime's workers are of this class: each keeps a handle pool. */
extern const vmmrt__worker_class vmmrt__slot_worker_class;

/* Map h at the slot's address and set access; on failure the mapping is
 * rolled back and h is still the caller's. On the slot's worker (or, inline,
 * on the launch thread). */
vmmrt_status vmmrt__slot_attach(vmmrt_slot *s, vmmrt__bhandle h);
/* Unmap; the handle goes back to the caller (*h). */
vmmrt_status vmmrt__slot_detach(vmmrt_slot *s, vmmrt__bhandle *h);

/* The pools of a set of workers of vmmrt__slot_worker_class. */
typedef struct vmmrt__slot_pool_stats {
	uint64_t oom_retries;    /* out-of-memory retries made */
	uint64_t pool_hits;      /* maps served from the handle pool */
	uint64_t pool_handles;   /* handles held in the pools now */
} vmmrt__slot_pool_stats;
void vmmrt__slot_pools_stats(vmmrt__workers *w, vmmrt__slot_pool_stats *out);
/* Free the handles the pools hold (also done at stop). Runs on the workers. */
vmmrt_status vmmrt__slot_pools_trim(vmmrt__workers *w);

/* ------------------------------------------------------------ slot.c */

/* Reserve the VA (any thread: cuMemAddressReserve is not a hot VMM call). */
vmmrt_status vmmrt__slot_reserve(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out);

/* Queue a map / release on the slot's worker; done(req, status, arg) runs on
 * the worker when it finishes. Safe in a host function (release) and on the
 * launch thread (never blocks). */
vmmrt_status vmmrt__slot_map_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);
vmmrt_status vmmrt__slot_release_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg);

/* vmmrt_slot_map and vmmrt_slot_destroy without the public prologue, for the library's own use. */
vmmrt_status vmmrt__slot_map(vmmrt_slot *s);
vmmrt_status vmmrt__slot_destroy(vmmrt_slot *s);

#endif

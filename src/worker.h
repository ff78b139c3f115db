/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Resident driver workers. Each worker is a thread that owns its share of the
 * VMM calls (cuMemCreate/Map/SetAccess/Unmap/Release): requests reach it
 * through a wait-free queue (liburcu wfcqueue; many producers, one consumer)
 * and it sleeps on a ConcurrencyKit event count when the queue is empty.
 *
 * Producers include host functions running on the copy streams, so
 * vmmrt__worker_push() allocates nothing, takes no lock and makes no driver
 * call: it enqueues a request the caller preallocated and bumps the event
 * count, which makes a futex syscall only if the worker flagged itself asleep.
 *
 * All requests for one slot go to the same worker (vmmrt__workers_route), so a
 * slot's release and its later map can never run out of order.
 *
 * A request carries what it does (vmmrt__request_ops: slot-work.c has the
 * slots' map, release and destroy): the worker queues, admits, polls,
 * retries and runs it, and knows nothing of slots.
 */
#ifndef VMMRT__WORKER_H
#define VMMRT__WORKER_H

#include <stdbool.h>
#include <stdint.h>

#include <urcu/list.h>
#include <urcu/wfcqueue.h>

#include "clock.h" /* the requests' timestamps */
#include "vmmrt.h"

typedef struct vmmrt_runtime vmmrt_runtime;
typedef struct vmmrt__workers vmmrt__workers;
typedef struct vmmrt__worker vmmrt__worker; /* one of them, as a request's run sees it */
typedef struct vmmrt__request vmmrt__request;
typedef struct vmmrt__bevent vmmrt__bevent;

/*
 * What a request does, on its worker. The worker calls, in this order:
 * withdrawn (optional: the owner no longer wants it, say its slot is being
 * destroyed: it ends cancelled without running), run (inside an RCU
 * read-side section), unchanged (optional, after a failed run: nothing
 * changed, so a persistent request may run again later), settle (optional:
 * publish the outcome to the owner, before done). Before all of them, ready
 * (optional): may it start yet? One that must not pass another request of
 * its owner still waiting elsewhere (a slot's release and the map asked
 * before it, which waits for an event of its own) says not yet; the worker
 * asks again, with the `after` events, in no order (never among the parked
 * ones, which would hold up every request admitted after it). A request the worker
 * cancels (a stop without drain, its owner's destroy) does not run unless
 * it is uncancellable (a destroy, which must free what it owns).
 */
typedef struct vmmrt__request_ops {
	const char *name; /* "map": diagnostics */
	vmmrt_status (*run)(vmmrt__request *req, vmmrt__worker *wk);
	bool (*withdrawn)(const vmmrt__request *req);
	bool (*unchanged)(const vmmrt__request *req);
	void (*settle)(vmmrt__request *req, vmmrt_status st);
	bool (*ready)(const vmmrt__request *req);
	bool uncancellable;
} vmmrt__request_ops;

/* Request life: IDLE -> QUEUED (push) -> RUNNING -> DONE; waiters sleep on `state`. */
typedef enum vmmrt__req_state {
	VMMRT_REQ_IDLE = 0,
	VMMRT_REQ_QUEUED,
	VMMRT_REQ_RUNNING,
	VMMRT_REQ_DONE,
	VMMRT_REQ_ABANDONED, /* its waiter timed out; the worker frees it */
} vmmrt__req_state;

/*
 * Runs on the worker once the request has finished, with its status: the
 * offload layer uses it to publish completion to the GPU (a store to a
 * host-pinned flag a stream waits on). Must not block.
 */
typedef void (*vmmrt__req_done_fn)(vmmrt__request *req, vmmrt_status st, void *arg);

/*
 * Optional admission check, run on the worker before a request starts. When it
 * returns false the request is parked, in arrival order, and checked again at
 * the next wake-up (vmmrt__workers_kick): this is how the remap strategy keeps
 * the device memory of activations under its budget and maps in schedule
 * order without ever blocking a worker on another worker.
 */
typedef bool (*vmmrt__req_admit_fn)(vmmrt__request *req, void *arg);

struct vmmrt__request {
	struct cds_wfcq_node node;
	struct cds_list_head wait_node; /* worker-private: in its worker's parked or waiting list */
	vmmrt__req_admit_fn admit;     /* optional */
	const vmmrt__request_ops *ops;
	void *owner;                 /* what it acts on (a slot); vmmrt__worker_cancel_owned */
	void (*fn)(void *arg);       /* vmmrt__request_init_call */
	void *arg;
	vmmrt__req_done_fn done;      /* optional */
	void *done_arg;
	/*
	 * MAP and RELEASE: on failure, keep retrying (back-off capped at 100 ms)
	 * until it succeeds or the request is cancelled, calling `retrying`
	 * after each failed round. For requests a stream or a budget waits on:
	 * failing them for good would leave that wait forever, while memory
	 * released elsewhere, or a driver hiccup, usually passes.
	 */
	bool persist;
	vmmrt__req_done_fn retrying;
	/*
	 * Optional: start only once this event has completed; the worker polls
	 * it every VMMRT__WORKER_POLL_US while any request waits. This is how a
	 * release follows a compute-stream graph without a host function on a
	 * stream that waits for that graph, which costs the compute stream
	 * 1.25 us between every two graphs on the H200 (vmmrt-gap-probe).
	 * A query that fails never starts the request: a persistent one reports
	 * it through `retrying` and keeps polling, any other ends with the error.
	 */
	vmmrt__bevent *after;
	/* worker-private */
	bool admitted;
	bool after_failed;           /* a query of `after` failed (reported once) */
	uint32_t attempts;
	uint64_t retry_at;           /* CLOCK_MONOTONIC ns; 0: not waiting to retry */
	uint64_t enqueue_ns;         /* CLOCK_MONOTONIC at push: hand-off latency */
	uint64_t start_ns;           /* when the worker picked it up */
	/* published by the worker (uatomic) */
	int32_t state;               /* vmmrt__req_state; futex word */
	int32_t status;              /* vmmrt_status of the last run */
	char message[192];           /* the worker's error message, for the waiter */
};

/* Prepare a request for its first push. */
void vmmrt__request_init(vmmrt__request *req, const vmmrt__request_ops *ops, void *owner);
/* A request that runs fn(arg) on its worker (fn NULL: nothing, a barrier). */
void vmmrt__request_init_call(vmmrt__request *req, void (*fn)(void *arg), void *arg);

/*
 * What the layer above keeps per worker (the slots' handle pools): local
 * state of local_size bytes, zeroed, init'ed at create on the creating
 * thread, given to each request's run (vmmrt__worker_local); idle runs on
 * the worker before it sleeps, stop after its last request, fini at destroy.
 */
typedef struct vmmrt__worker_class {
	size_t local_size;
	vmmrt_status (*init)(void *local, vmmrt_runtime *rt);
	void (*idle)(void *local);
	void (*stop)(void *local);
	void (*fini)(void *local);
} vmmrt__worker_class;

/* Start n resident workers of class cls (NULL: none, for requests that
 * need no local state), each bound to the runtime's device context. */
vmmrt_status vmmrt__workers_create(vmmrt_runtime *rt, unsigned n, const vmmrt__worker_class *cls,
				   vmmrt__workers **out);
/*
 * Stop: requests still queued are cancelled (their status becomes
 * VMMRT_E_CANCELLED and their done callbacks run) unless drain is true, in which
 * case they are run first. Joins the threads. Returns how many were cancelled.
 */
uint64_t vmmrt__workers_destroy(vmmrt__workers *w, bool drain);
unsigned vmmrt__workers_count(const vmmrt__workers *w);
unsigned vmmrt__workers_route(const vmmrt__workers *w, uint64_t slot_id);

/*
 * Queue req on worker `index`. Wait-free, allocation-free, lock-free: safe in
 * a host function. VMMRT_E_BUSY if req is already queued or running (a
 * request object is in at most one queue), VMMRT_E_CANCELLED after shutdown
 * began.
 */
vmmrt_status vmmrt__worker_push(vmmrt__workers *w, unsigned index, vmmrt__request *req);
/* Wait (futex, bounded) until req is DONE; returns its status or VMMRT_E_TIMEOUT. */
vmmrt_status vmmrt__request_wait(vmmrt__request *req, uint64_t timeout_ms);
/*
 * For a malloc'ed request whose waiter owns it: wait like vmmrt__request_wait,
 * then free it. On a timeout the request is abandoned to the worker, which
 * frees it when it finishes, so a stalled worker never leaves a dangling wait.
 */
vmmrt_status vmmrt__request_wait_owned(vmmrt__request *req, uint64_t timeout_ms);
/* Non-blocking: has req finished (or never been pushed)? Then *status (if not
 * NULL) is the status of its last run. Not finished is an answer, not an error. */
bool vmmrt__request_poll(const vmmrt__request *req, vmmrt_status *status);

/* The class's local state: of the worker running a request, or of worker index. */
void *vmmrt__worker_local(vmmrt__worker *wk);
void *vmmrt__workers_local(vmmrt__workers *w, unsigned index);
/* In a request's run: cancel the requests of owner that wait on this worker
 * (parked for admission or for their event): they must not outlive it. */
void vmmrt__worker_cancel_owned(vmmrt__worker *wk, const void *owner);

/* Statistics. */
typedef struct vmmrt__worker_stats {
	uint64_t processed;      /* requests run */
	uint64_t cancelled;      /* requests cancelled at shutdown */
	uint64_t failed;         /* requests that ended with an error */
	uint64_t wakeups;        /* times a worker slept and was woken */
} vmmrt__worker_stats;
void vmmrt__workers_stats(const vmmrt__workers *w, vmmrt__worker_stats *out);

#define VMMRT__WORKER_POLL_US 50

/* Wake every worker so parked requests are checked again (host-function safe). */
void vmmrt__workers_kick(vmmrt__workers *w);

/* Diagnostics (vmmrt__offload_dump): each worker's queue, parked and waiting requests. */
void vmmrt__workers_dump(vmmrt__workers *w, int fd);

#endif

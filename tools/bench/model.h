/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The model's state, shared by modes.c (setup, the measured run,
 * verification, teardown) and iterate.c (one iteration of each mode).
 * Private to the bench.
 */
#ifndef VMMRT__BENCH_MODEL_H
#define VMMRT__BENCH_MODEL_H

#include "bench.h"
#include "model/synth.h"

/* --------------------------------------------------------------- the pool */

/*
 * eager-offload and naive: device buffers handed out like a caching allocator
 * with stream semantics: a buffer goes back to the pool as soon as the host
 * is done with it, with the event after which the device is done with it too;
 * whoever takes it next makes its stream wait for that event. All buffers stay
 * mapped for the whole run, so the naive graph reads stale bytes instead of
 * faulting (a fault on the host backend would kill the bench).
 */
typedef struct pool {
	vmmrt_slot **slot;
	vmmrt_devptr *addr;
	vmmrt_event **free_ev;    /* NULL: free now */
	unsigned n;
	unsigned *fifo;          /* free buffers, least recently freed first */
	unsigned count;
} pool;

/* Give buffer b back; the next user's stream waits for ev (NULL: free now). */
void bench_pool_give(pool *pl, unsigned b, vmmrt_event *ev);

/* ------------------------------------------------------------------ model */

typedef struct model {
	bench_ctx *ctx;
	bench_mode_id id;
	const bench_mode_desc *md;
	bench_params p;
	unsigned L;
	size_t A;
	vmmrt_runtime *rt;
	vmmrt_stream compute, d2h, h2d;   /* d2h, h2d: the pool modes' own copy streams */
	vmmrt_slot *input, *results;
	vmmrt_devptr input_addr, res_addr;
	uint64_t *host_results;           /* pinned [iteration][2L]: forward sums, backward sums */
	unsigned iters_total, iters_run;
	vmmrt_slot **act;                 /* eager: one per layer */
	pool pool;
	unsigned *cap_buf;                /* naive: the buffer each layer's graphs captured */
	int *fwd_buf, *bwd_buf;           /* pool buffer per layer / per backward step */
	vmmrt_event **d2h_done, **h2d_done;
	void **host;                      /* pool modes: pinned copy per layer (not the tail) */
	vmmrt_group **g;
	vmmrt_devptr *gaddr;
	vmmrt_graph **fwd, **bwd;
	/* The order of an iteration: use k is runner use_runner[k]'s backward
	 * if use_bwd[k]; all forwards then all backwards in reverse, or 1F1B.
	 * A runner is a layer of one microbatch (runner m * layers + l). */
	unsigned *use_runner;
	bool *use_bwd;
	bool *after_forward;              /* per backward step: a forward came just before it */
	bool allocated;                   /* library modes: vmmrt_offload_allocate succeeded */
	bench_timing tm;
	bool traced;                      /* the runtime writes the --trace file */
	uint64_t created_ns;              /* CLOCK_MONOTONIC right after the runtime's creation */
	size_t base_free, fixed_free;
	bool skip;
	char err[384];
} model;

/* Keep the first failure's message (with the library's) for the row's note; returns st. */
vmmrt_status bench_failed(model *m, vmmrt_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define TRY(m, call, ...) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) \
			return bench_failed((m), st_, __VA_ARGS__); \
	} while (0)

#define REC(m, ev, s) TRY((m), vmmrt_event_record((m)->rt, (ev), (s)), "timing event")

bool bench_is_pool_mode(const model *m);
/* The forward and backward of layer i on the activation at `a`: launched
 * directly (eager modes) or captured into graphs (the others). */
vmmrt_status bench_enqueue_forward(model *m, vmmrt_devptr a, unsigned i);
vmmrt_status bench_enqueue_backward(model *m, vmmrt_devptr a, unsigned i);
/* Enqueue iteration `it` of the model's mode; no host synchronization. */
vmmrt_status bench_run_iteration(model *m, unsigned it);
/* Wait for everything the iteration started; outside the timed region. */
vmmrt_status bench_iteration_sync(model *m);

#endif

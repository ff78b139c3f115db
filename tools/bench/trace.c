/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The --trace file: one Chrome/Perfetto trace for the whole run.
 *
 * Host threads: the library records every VMM driver call on the calling
 * thread's track when a runtime has a trace (rt->trace). Each mode has its own
 * runtime, so the bench hands each one the same trace object after creation
 * and takes it back before destruction (the runtime would close it), and names
 * the tracks of that runtime's driver workers from the workers themselves.
 *
 * Device streams: the bench adds spans measured with timing events on named
 * tracks ("compute", "d2h", "h2d", and "bench" for iterations). Event times
 * are relative to each other; to place them on the host's CLOCK_MONOTONIC
 * axis, a reference event is recorded on an idle stream and the host clock is
 * read as soon as a poll sees it complete. The offset is therefore
 * approximate: late by the polling interval plus the completion latency
 * (microseconds), which is fine for reading a timeline, not for measuring
 * host-to-device latency.
 */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"
#include "runtime.h"
#include "worker.h"

typedef struct name_req {
	vmmrt__request req;
	vmmrt__trace *trace;
	char name[48];
} name_req;

/* Runs on a driver worker: the trace keys tracks by the calling thread. */
static void name_worker(void *arg)
{
	name_req *r = arg;
	vmmrt__trace_thread_name(r->trace, r->name);
}

vmmrt_status bench_trace_attach(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode)
{
	if (!ctx->trace)
		return VMMRT_OK;
	if (rt->trace) {
		/* VMMRT_TRACE in the environment gave this runtime a trace of its own:
		 * leave it, the driver calls go there (and each mode overwrites it). */
		fprintf(stderr,
			"vmmrt-bench: %s: VMMRT_TRACE is set, so this runtime writes its own trace; driver calls "
			"are missing from --trace (unset VMMRT_TRACE)\n",
			mode);
		return VMMRT_OK;
	}
	/* No driver call is in flight yet (the workers are idle after creation), and
	 * the queue push below orders this store before anything a worker does next. */
	rt->trace = ctx->trace;
	unsigned n = vmmrt__workers_count(rt->workers);
	for (unsigned w = 0; w < n; w++) {
		/* malloc'ed and waited on with wait_owned: should the worker stall past
		 * the timeout, it frees the request itself when it gets to it. */
		name_req *r = calloc(1, sizeof(*r));
		if (!r)
			return VMMRT_E_HOST_OUT_OF_MEMORY;
		vmmrt__request_init_call(&r->req, name_worker, r);
		r->trace = ctx->trace;
		snprintf(r->name, sizeof(r->name), "%s driver-worker-%u", mode, w);
		vmmrt_status st = vmmrt__worker_push(rt->workers, w, &r->req);
		if (st != VMMRT_OK) {
			free(r);
		} else {
			st = vmmrt__request_wait_owned(&r->req, rt->timeout_ms);
		}
		if (st != VMMRT_OK)
			fprintf(stderr, "vmmrt-bench: %s: naming driver worker %u in the trace: %s\n", mode, w,
				vmmrt_last_error());
	}
	return VMMRT_OK;
}

void bench_trace_detach(bench_ctx *ctx, vmmrt_runtime *rt)
{
	/* Called after every stream and worker request of the mode has finished
	 * (offload sync), so no worker is reading the pointer. */
	if (ctx->trace && rt->trace == ctx->trace)
		rt->trace = NULL;
}

vmmrt_status bench_trace_align(bench_timing *t, vmmrt_stream s)
{
	vmmrt_status st = vmmrt__drv_event_record(t->rt, t->ref, s);
	if (st != VMMRT_OK)
		return st;
	/* Poll, not synchronize: the host clock must be read the moment it completes. */
	uint64_t deadline = vmmrt__now_ns() + 10ull * 1000000000ull;
	bool done = false;
	while ((st = vmmrt__drv_event_query(t->rt, t->ref, &done)) == VMMRT_OK && !done) {
		if (vmmrt__now_ns() > deadline)
			return VMMRT_E_TIMEOUT;
	}
	t->ref_host_ns = vmmrt__now_ns();
	return st;
}

uint64_t bench_trace_time(bench_timing *t, vmmrt__bevent *e)
{
	float ms = 0;
	if (vmmrt__drv_event_elapsed_ms(t->rt, t->ref, e, &ms) != VMMRT_OK)
		return t->ref_host_ns;
	double ns = (double)t->ref_host_ns + (double)ms * 1e6;
	return ns > 0 ? (uint64_t)ns : 0;
}

void bench_trace_span(bench_ctx *ctx, const char *track, uint64_t t0, uint64_t t1, const char *fmt, ...)
{
	if (!ctx->trace)
		return;
	char name[48];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	/* the trace format needs dur >= 0; the library treats t1 == 0 as metadata */
	if (t1 < t0)
		t1 = t0;
	if (t1 == 0)
		return;
	vmmrt__trace_span(ctx->trace, track, name, t0, t1);
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The --trace file, one mode's part: its runtime's trace option, the device
 * spans the bench adds to that runtime's trace, and the span that lets
 * trace-file.c merge the runtime's file into the whole run's.
 *
 * Host threads: the library records every VMM driver call on the calling
 * thread's track, and names its driver workers' tracks itself (vmmrt-drv-N);
 * the merge prefixes them with the mode.
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
#include <string.h>
#include <time.h>

#include "bench.h"

uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

vmmrt_status bench_trace_option(const bench_ctx *ctx, vmmrt_options *o)
{
	return ctx->trace ? vmmrt_options_set(o, "trace", ctx->trace_path) : VMMRT_OK;
}

bool bench_trace_check(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode)
{
	if (!ctx->trace)
		return false;
	char path[512];
	if (bench_runtime_option(ctx, rt, "trace", path, sizeof(path)) == VMMRT_OK &&
	    strcmp(path, ctx->trace_path) == 0)
		return true;
	/* VMMRT_TRACE in the environment replaced the option: this runtime
	 * writes that file (each mode overwrites it), not the bench's. */
	fprintf(stderr,
		"vmmrt-bench: %s: VMMRT_TRACE is set, so this runtime writes its own trace; this mode is missing "
		"from --trace (unset VMMRT_TRACE)\n",
		mode);
	return false;
}

void bench_trace_mark(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode, uint64_t created_ns)
{
	uint64_t now = bench_now_ns();
	bench_trace_span(ctx, rt, "bench", created_ns, now > created_ns ? now : created_ns, "%s runtime", mode);
}

vmmrt_status bench_trace_align(bench_timing *t, vmmrt_stream s)
{
	vmmrt_status st = vmmrt_event_record(t->rt, t->ref, s);
	if (st != VMMRT_OK)
		return st;
	/* Poll, not synchronize: the host clock must be read the moment it completes. */
	uint64_t deadline = bench_now_ns() + 10ull * 1000000000ull;
	int done = 0;
	while ((st = vmmrt_event_query(t->rt, t->ref, &done)) == VMMRT_OK && !done) {
		if (bench_now_ns() > deadline)
			return VMMRT_E_TIMEOUT;
	}
	t->ref_host_ns = bench_now_ns();
	return st;
}

uint64_t bench_trace_time(bench_timing *t, vmmrt_event *e)
{
	float ms = 0;
	if (vmmrt_event_elapsed_ms(t->rt, t->ref, e, &ms) != VMMRT_OK)
		return t->ref_host_ns;
	double ns = (double)t->ref_host_ns + (double)ms * 1e6;
	return ns > 0 ? (uint64_t)ns : 0;
}

void bench_trace_span(const bench_ctx *ctx, vmmrt_runtime *rt, const char *track, uint64_t t0, uint64_t t1,
		      const char *fmt, ...)
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
	(void)vmmrt_trace_span(rt, track, name, t0, t1);
}

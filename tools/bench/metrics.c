/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What the bench measures, and how: device timing events for everything on a
 * stream (iterations, graphs, copies), a sampler thread for the driver's
 * memory info, percentiles, and the raw pinned copy bandwidth.
 *
 * Host clocks time nothing here: the launch thread runs ahead of the GPU, so
 * only events recorded on the streams say when work ran.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double bench_percentile(double *v, size_t n, double q)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	/* nearest rank on the sorted samples, as the library's driver statistics do */
	size_t i = (size_t)((double)(n - 1) * q + 0.5);
	return v[i < n ? i : n - 1];
}

/* ------------------------------------------------------------ timing events */

static vmmrt_status event_array(vmmrt_runtime *rt, unsigned n, vmmrt_event ***out)
{
	vmmrt_event **a = calloc(n ? n : 1, sizeof(*a));
	if (!a)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	*out = a;
	for (unsigned i = 0; i < n; i++) {
		vmmrt_status st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &a[i]);
		if (st != VMMRT_OK)
			return st;
	}
	return VMMRT_OK;
}

static void event_array_free(vmmrt_runtime *rt, vmmrt_event **a, unsigned n)
{
	if (!a)
		return;
	for (unsigned i = 0; i < n; i++)
		if (a[i])
			(void)vmmrt_event_destroy(rt, a[i]);
	free(a);
}

vmmrt_status bench_timing_create(vmmrt_runtime *rt, unsigned layers, bench_timing *t)
{
	vmmrt_status st;
	memset(t, 0, sizeof(*t));
	t->rt = rt;
	t->layers = layers;
	/* Per iteration: one D2H per forward and one H2D per backward at most, two
	 * events each (the pool modes' copies; the library's are its own). */
	t->npool = 4 * layers + 4;
	t->maxspan = 2 * layers + 2;
	if ((st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &t->ref)) != VMMRT_OK ||
	    (st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &t->it_s)) != VMMRT_OK ||
	    (st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &t->it_e)) != VMMRT_OK ||
	    (st = event_array(rt, layers, &t->fwd_s)) != VMMRT_OK ||
	    (st = event_array(rt, layers, &t->fwd_e)) != VMMRT_OK ||
	    (st = event_array(rt, layers, &t->bwd_s)) != VMMRT_OK ||
	    (st = event_array(rt, layers, &t->bwd_e)) != VMMRT_OK ||
	    (st = event_array(rt, t->npool, &t->pool)) != VMMRT_OK)
		return st;
	t->span = calloc(t->maxspan, sizeof(*t->span));
	return t->span ? VMMRT_OK : VMMRT_E_HOST_OUT_OF_MEMORY;
}

void bench_timing_destroy(bench_timing *t)
{
	if (!t->rt)
		return;
	vmmrt_event *single[] = {t->ref, t->it_s, t->it_e};
	for (unsigned i = 0; i < 3; i++)
		if (single[i])
			(void)vmmrt_event_destroy(t->rt, single[i]);
	event_array_free(t->rt, t->fwd_s, t->layers);
	event_array_free(t->rt, t->fwd_e, t->layers);
	event_array_free(t->rt, t->bwd_s, t->layers);
	event_array_free(t->rt, t->bwd_e, t->layers);
	event_array_free(t->rt, t->pool, t->npool);
	free(t->span);
	memset(t, 0, sizeof(*t));
}

void bench_timing_reset(bench_timing *t)
{
	t->used = 0;
	t->nspan = 0;
}

vmmrt_event *bench_timing_take(bench_timing *t)
{
	return t->used < t->npool ? t->pool[t->used++] : NULL;
}

bench_span *bench_timing_add_span(bench_timing *t)
{
	if (t->nspan >= t->maxspan)
		return NULL;
	bench_span *s = &t->span[t->nspan++];
	memset(s, 0, sizeof(*s));
	s->layer = -1;
	return s;
}

vmmrt_status bench_acc_init(bench_acc *a, unsigned iterations, unsigned layers)
{
	memset(a, 0, sizeof(*a));
	a->iter_ms = calloc(iterations ? iterations : 1, sizeof(*a->iter_ms));
	a->gap_us = calloc((size_t)(iterations ? iterations : 1) * (layers ? layers : 1), sizeof(*a->gap_us));
	a->fwd_gap_us = calloc((size_t)(iterations ? iterations : 1) * (layers ? layers : 1), sizeof(*a->fwd_gap_us));
	return a->iter_ms && a->gap_us && a->fwd_gap_us ? VMMRT_OK : VMMRT_E_HOST_OUT_OF_MEMORY;
}

void bench_acc_free(bench_acc *a)
{
	free(a->iter_ms);
	free(a->gap_us);
	free(a->fwd_gap_us);
	memset(a, 0, sizeof(*a));
}

static vmmrt_status elapsed(bench_timing *t, vmmrt_event *a, vmmrt_event *b, double *ms)
{
	float f = 0;
	vmmrt_status st = vmmrt_event_elapsed_ms(t->rt, a, b, &f);
	*ms = f;
	return st;
}

vmmrt_status bench_timing_collect(bench_timing *t, bench_acc *acc, bench_ctx *ctx, const char *mode,
				  unsigned iteration)
{
	vmmrt_status st;
	double ms;
	unsigned L = t->layers;

	if ((st = elapsed(t, t->it_s, t->it_e, &ms)) != VMMRT_OK)
		return st;
	acc->iter_ms[acc->n_iter++] = ms;
	/* The gap between backward graph k-1's end and graph k's start: what the
	 * compute stream spent waiting for a restore (or for the launch thread). */
	for (unsigned k = 1; k < L; k++) {
		if (t->after_forward && t->after_forward[k])
			continue;
		if ((st = elapsed(t, t->bwd_e[k - 1], t->bwd_s[k], &ms)) != VMMRT_OK)
			return st;
		acc->gap_us[acc->n_gap++] = ms * 1000.0;
		acc->bwd_wait_ms += ms;
	}
	/* Forward graph i after forward graph i-1: the wait between them is
	 * forward_begin's (remap: the map of layer i, which waits for the
	 * release of the layer whose memory it takes). The eager modes record
	 * these events too; 1F1B mixes the uses, and is left out. */
	for (unsigned i = 1; i < L && !t->after_forward && t->fwd_s[i]; i++) {
		if ((st = elapsed(t, t->fwd_e[i - 1], t->fwd_s[i], &ms)) != VMMRT_OK)
			return st;
		acc->fwd_gap_us[acc->n_fwd_gap++] = ms * 1000.0;
		acc->fwd_wait_ms += ms;
	}
	for (unsigned i = 0; i < t->nspan; i++) {
		bench_span *s = &t->span[i];
		double a, b;
		/* times relative to the iteration start, as every other span */
		if ((st = elapsed(t, t->it_s, s->a, &a)) != VMMRT_OK || (st = elapsed(t, t->it_s, s->b, &b)) != VMMRT_OK)
			return st;
		double d = b > a ? b - a : 0;
		if (s->h2d) {
			acc->span_h2d_ms += d;
			acc->span_h2d_bytes += s->bytes;
		} else {
			acc->span_d2h_ms += d;
			acc->span_d2h_bytes += s->bytes;
		}
	}
	if (!ctx->trace)
		return VMMRT_OK;

	/* The trace: the iteration, each graph (or eager layer) and each copy. */
	vmmrt_runtime *rt = t->rt;
	uint64_t it0 = bench_trace_time(t, t->it_s), it1 = bench_trace_time(t, t->it_e);
	if (!acc->trace_first_ns)
		acc->trace_first_ns = it0;
	acc->trace_last_ns = it1;
	bench_trace_span(ctx, rt, "bench", it0, it1, "%s iteration %u", mode, iteration);
	for (unsigned i = 0; i < L; i++)
		bench_trace_span(ctx, rt, "compute", bench_trace_time(t, t->fwd_s[i]), bench_trace_time(t, t->fwd_e[i]),
				 "%s F%u", mode, i);
	for (unsigned k = 0; k < L; k++)
		bench_trace_span(ctx, rt, "compute", bench_trace_time(t, t->bwd_s[k]), bench_trace_time(t, t->bwd_e[k]),
				 "%s B%u", mode, L - 1 - k);
	for (unsigned i = 0; i < t->nspan; i++) {
		bench_span *s = &t->span[i];
		uint64_t a = bench_trace_time(t, s->a), b = bench_trace_time(t, s->b);
		const char *what = s->h2d ? "restore" : "offload";
		if (s->layer >= 0)
			bench_trace_span(ctx, rt, s->h2d ? "h2d" : "d2h", a, b, "%s %s L%d", mode, what, s->layer);
		else
			bench_trace_span(ctx, rt, s->h2d ? "h2d" : "d2h", a, b, "%s %s x%u", mode, what, s->copies);
	}
	return VMMRT_OK;
}

/* ----------------------------------------------------------- memory sampler */

struct bench_sampler {
	vmmrt_runtime *rt;
	pthread_t thread;
	atomic_bool stop;
	size_t *free_samples;
	size_t n, cap;
	size_t min_free;
};

static void *sampler_main(void *arg)
{
	bench_sampler *s = arg;
	/* ~100 us between samples: fine enough to see a remap's transient, coarse
	 * enough that cuMemGetInfo does not become the load being measured. */
	struct timespec period = {0, 100000};
	while (!atomic_load(&s->stop)) {
		size_t f, total;
		if (vmmrt_mem_info(s->rt, &f, &total) == VMMRT_OK) {
			if (f < s->min_free)
				s->min_free = f;
			if (s->n == s->cap) {
				size_t cap = s->cap ? s->cap * 2 : 16384;
				size_t *ns = realloc(s->free_samples, cap * sizeof(*ns));
				if (ns) {
					s->free_samples = ns;
					s->cap = cap;
				}
			}
			if (s->n < s->cap)
				s->free_samples[s->n++] = f;
		}
		nanosleep(&period, NULL);
	}
	return NULL;
}

vmmrt_status bench_sampler_start(vmmrt_runtime *rt, bench_sampler **out)
{
	bench_sampler *s = calloc(1, sizeof(*s));
	if (!s)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	s->rt = rt;
	s->min_free = SIZE_MAX;
	atomic_init(&s->stop, false);
	int rc = pthread_create(&s->thread, NULL, sampler_main, s);
	if (rc != 0) {
		free(s);
		fprintf(stderr, "vmmrt-bench: memory sampler thread: %s\n", strerror(rc));
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	}
	*out = s;
	return VMMRT_OK;
}

void bench_sampler_stop(bench_sampler *s, size_t ref_free, size_t *min_free, int64_t *median_used)
{
	atomic_store(&s->stop, true);
	pthread_join(s->thread, NULL);
	/* one last sample, so a very short run still has one */
	size_t f, total;
	if (vmmrt_mem_info(s->rt, &f, &total) == VMMRT_OK && f < s->min_free)
		s->min_free = f;
	*min_free = s->min_free;
	*median_used = 0;
	if (s->n) {
		double *used = malloc(s->n * sizeof(*used));
		if (used) {
			for (size_t i = 0; i < s->n; i++)
				used[i] = (double)ref_free - (double)s->free_samples[i];
			double m = bench_percentile(used, s->n, 0.5);
			*median_used = m > 0 ? (int64_t)m : 0;
			free(used);
		}
	}
	free(s->free_samples);
	free(s);
}

/* ------------------------------------------------------------ raw bandwidth */

vmmrt_status bench_raw_bandwidth(bench_ctx *ctx, vmmrt_runtime *rt)
{
	/* Large enough to reach the copy engines' plateau (64 MiB and up on the H200),
	 * small enough to be quick on the host backend. */
	size_t bytes = strcmp(ctx->backend, "cuda") == 0 ? 256u << 20 : 64u << 20;
	vmmrt_slot *slot = NULL;
	vmmrt_stream s = NULL;
	vmmrt_event *e0 = NULL, *e1 = NULL;
	void *host = NULL;
	vmmrt_status st;
	double h2d[3], d2h[3];

	if ((st = vmmrt_slot_create(rt, bytes, &slot)) != VMMRT_OK || (st = vmmrt_slot_map(slot)) != VMMRT_OK ||
	    (st = vmmrt_stream_create(rt, &s)) != VMMRT_OK || (st = vmmrt_host_alloc(rt, bytes, &host)) != VMMRT_OK ||
	    (st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &e0)) != VMMRT_OK ||
	    (st = vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &e1)) != VMMRT_OK)
		goto out;
	memset(host, 0x5a, bytes); /* touch the pages: first-touch faults are not bandwidth */
	vmmrt_devptr dev = vmmrt_slot_address(slot);
	/* one untimed round trip, then three timed copies each way; the median counts */
	for (int rep = -1; rep < 3; rep++) {
		for (int dir = 0; dir < 2; dir++) {
			float ms = 0;
			if ((st = vmmrt_event_record(rt, e0, s)) != VMMRT_OK ||
			    (st = dir == 0 ? vmmrt_copy_to_device_async(rt, dev, host, bytes, s)
					   : vmmrt_copy_to_host_async(rt, host, dev, bytes, s)) != VMMRT_OK ||
			    (st = vmmrt_event_record(rt, e1, s)) != VMMRT_OK ||
			    (st = vmmrt_stream_synchronize(rt, s)) != VMMRT_OK ||
			    (st = vmmrt_event_elapsed_ms(rt, e0, e1, &ms)) != VMMRT_OK)
				goto out;
			if (rep >= 0)
				(dir == 0 ? h2d : d2h)[rep] = ms > 0 ? (double)bytes / (ms * 1e6) : NAN;
		}
	}
	ctx->raw_h2d_gbps = bench_percentile(h2d, 3, 0.5);
	ctx->raw_d2h_gbps = bench_percentile(d2h, 3, 0.5);
	ctx->raw_bytes = bytes;
out:
	if (st != VMMRT_OK)
		fprintf(stderr, "vmmrt-bench: raw copy bandwidth (%zu MiB): %s\n", bytes >> 20, vmmrt_last_error());
	if (s)
		(void)vmmrt_stream_synchronize(rt, s);
	if (e0)
		(void)vmmrt_event_destroy(rt, e0);
	if (e1)
		(void)vmmrt_event_destroy(rt, e1);
	if (host)
		(void)vmmrt_host_free(rt, host);
	if (s)
		(void)vmmrt_stream_destroy(rt, s);
	if (slot)
		(void)vmmrt_slot_destroy(slot);
	return st;
}

/* ------------------------------------------------------------- expectations */

bool bench_checksum_selftest(void)
{
	uint64_t buf[512];
	for (size_t w = 0; w < 512; w++)
		buf[w] = vmmrt_fill_word(7, w) ^ vmmrt_fill_word(1003, w);
	return vmmrt_checksum_host(buf, sizeof(buf)) == vmmrt_layer_checksum_host(sizeof(buf), 7, 1003);
}

double bench_offload_budget(const bench_preset *pr, double d2h_gbps)
{
	if (!(d2h_gbps > 0))
		return NAN;
	double copy_ms = pr->saved_mib * MiB_D / (d2h_gbps * 1e6);
	double f = pr->fwd_ms / copy_ms;
	return f < 1 ? f : 1;
}

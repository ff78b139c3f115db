/*
 * vmmrt-bench: the A/B comparison of libvmmrt's offload strategies against
 * eager execution, whole-layer graphs without offload, and the naive graph
 * reload that libvmmrt exists to replace.
 *
 * One concept per file:
 *   vmmrt-bench.c  command line, defaults, presets, the run, exit status
 *   modes.c        the synthetic model: each mode from setup to verification
 *   iterate.c      one iteration of each mode (model.h: their shared state)
 *   metrics.c      timing events, the memory sampler, percentiles, raw bandwidth
 *   output.c       the table on stdout and the JSON file
 *   trace.c        the Chrome/Perfetto trace: device clock alignment, spans, worker tracks
 *   sweep.c        the copy/compute sweep and its SVG plot
 *
 * The bench links the library's convenience archive and uses a few internal
 * headers: timing events (driver.h), the runtime's trace and copy streams
 * (runtime.h, offload.h) and the checksum definition (backend.h).
 */
#ifndef VMMRT_BENCH_H
#define VMMRT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vmmrt.h"
#include "driver.h"
#include "options.h"
#include "trace.h"

#define MiB_D (1024.0 * 1024.0)

/* ------------------------------------------------------------------ modes */

typedef enum bench_mode_id {
	BM_EAGER = 0,      /* no graph, no offload */
	BM_EAGER_OFFLOAD,  /* no graph, offload + reload into whatever pool buffer is free */
	BM_GRAPH,          /* graphs, activations resident (runtime mode=none): the baseline */
	BM_PINGPONG,       /* graphs + libvmmrt ping-pong */
	BM_REMAP,          /* graphs + libvmmrt remap, driver calls on the workers */
	BM_REMAP_INLINE,   /* graphs + libvmmrt remap, driver calls on the launch thread */
	BM_NAIVE,          /* graphs + reload into a fresh buffer: must fail verification */
	BM_COUNT_
} bench_mode_id;

typedef struct bench_mode_desc {
	const char *name;
	const char *what;      /* one line, for --help */
	bool graphs;           /* replays captured graphs */
	bool offload;          /* moves activations to the host and back */
	const char *lib_mode;  /* runtime option mode=..., NULL when the bench manages memory itself */
	bool must_fail;        /* the negative case: verification must fail */
} bench_mode_desc;

extern const bench_mode_desc bench_modes[BM_COUNT_];
int bench_mode_find(const char *name);

/* ------------------------------------------------------------- parameters */

typedef struct bench_params {
	unsigned layers;
	size_t act_bytes;         /* per layer, a multiple of 8 */
	double fwd_ms, bwd_ms;    /* compute time of one layer's forward / backward */
	unsigned iterations, warmup;
	unsigned lookahead;       /* effective (command line, then VMMRT_LOOKAHEAD) */
	unsigned workers;         /* effective driver_workers */
} bench_params;

/* One real layer measured on the H200 (shared/gpu/README.md). */
typedef struct bench_preset {
	const char *name;
	const char *what;
	double fwd_ms, bwd_ms;
	double saved_mib;
} bench_preset;

#define BENCH_NPRESETS 4
extern const bench_preset bench_presets[BENCH_NPRESETS];

/* Everything a run shares between its modes. */
typedef struct bench_ctx {
	vmmrt_options base;       /* runtime options from the command line */
	bench_params p;
	const bench_preset *preset;
	double offload_fraction;
	char backend[16];
	char device[96];
	char backend_note[192];
	size_t granularity;
	bool host_latency;        /* the host backend's latency model was on */
	double raw_h2d_gbps, raw_d2h_gbps;
	size_t raw_bytes;
	vmmrt__trace *trace;       /* --trace, or NULL */
	bool quiet;
	/* the host's expectation of the first iteration's forward checksums */
	size_t expect_bytes;
	unsigned expect_layers;
	uint64_t expect[2];       /* layers 0 and layers-1 */
} bench_ctx;

/* ----------------------------------------------------------------- results */

typedef struct bench_result {
	bench_mode_id mode;
	double ratio;                   /* sweep: the copy/compute ratio of this point */
	bench_params p;                 /* what this row ran with */
	bool ran;                       /* every iteration was launched and synchronized */
	bool skipped;                   /* not run, for the reason in note */
	char note[384];                 /* why skipped, the error, or a warning */
	unsigned pool_buffers;          /* eager-offload, naive: device buffers in the pool */
	double iter_ms_median, iter_ms_p90;
	double vs_graph_ratio;          /* NAN without a graph row */
	int64_t activation_device_bytes, peak_device_bytes;
	double d2h_gbps, h2d_gbps;      /* NAN: this mode copies nothing */
	double bwd_gap_us_median;
	vmmrt_driver_stats calls[VMMRT_DRIVER_CALLS];
	double driver_call_us_p99;      /* worst p99 over the call types; NAN without calls */
	uint64_t launch_thread_blocking;
	bool verified;
	unsigned checked, bad;
	unsigned first_bad_iter, first_bad_layer;
	uint64_t lib_activation_peak_bytes;
	uint64_t bank_conflicts;
} bench_result;

/* Did this row come out as it must (correct modes verified, naive failed)? */
bool bench_result_as_expected(const bench_result *r);

/* modes.c: run one mode from runtime creation to destruction. */
extern const char *volatile bench_current_mode; /* for the crash message */
void bench_run_mode(bench_ctx *ctx, bench_mode_id id, const bench_params *p, bench_result *out);

/* ----------------------------------------------------------------- metrics */

/* Sorts v in place. */
double bench_percentile(double *v, size_t n, double q);

/* Timing events of one iteration, reused every iteration (all complete after its sync). */
typedef struct bench_span {
	bool h2d;
	int layer;                 /* -1: several layers */
	unsigned copies;
	uint64_t bytes;
	vmmrt__bevent *a, *b;       /* on the copy stream: before and after the copy */
} bench_span;

typedef struct bench_timing {
	vmmrt_runtime *rt;
	unsigned layers;
	vmmrt__bevent *ref, *it_s, *it_e;
	vmmrt__bevent **fwd_s, **fwd_e, **bwd_s, **bwd_e;
	vmmrt__bevent **pool;       /* copy-span events */
	unsigned npool, used;
	bench_span *span;
	unsigned nspan, maxspan;
	uint64_t ref_host_ns;      /* CLOCK_MONOTONIC when `ref` completed */
} bench_timing;

vmmrt_status bench_timing_create(vmmrt_runtime *rt, unsigned layers, bench_timing *t);
void bench_timing_destroy(bench_timing *t);
/* Start an iteration: forget its spans. */
void bench_timing_reset(bench_timing *t);
/* A copy-span event, or NULL when the iteration used them all. */
vmmrt__bevent *bench_timing_take(bench_timing *t);
bench_span *bench_timing_add_span(bench_timing *t);

/* What the measured iterations add up to. */
typedef struct bench_acc {
	double *iter_ms;
	size_t n_iter;
	double *gap_us;
	size_t n_gap;
	double span_d2h_ms, span_h2d_ms;      /* the bench's own copy spans */
	uint64_t span_d2h_bytes, span_h2d_bytes;
	double lib_d2h_ms, lib_h2d_ms;        /* the library's offload statistics */
	uint64_t lib_d2h_bytes, lib_h2d_bytes;
	uint64_t blocking;
	uint64_t trace_first_ns, trace_last_ns; /* the measured window, on the trace's clock */
} bench_acc;

vmmrt_status bench_acc_init(bench_acc *a, unsigned iterations, unsigned layers);
void bench_acc_free(bench_acc *a);
/* After the iteration's sync: read its events into acc (and the trace). */
vmmrt_status bench_timing_collect(bench_timing *t, bench_acc *acc, bench_ctx *ctx, const char *mode,
				  unsigned iteration);

/* Device memory sampled every ~100 us by a thread, during the measured iterations. */
typedef struct bench_sampler bench_sampler;
vmmrt_status bench_sampler_start(vmmrt_runtime *rt, bench_sampler **out);
/* Stops the thread; the smallest free value and the median of (ref - free). */
void bench_sampler_stop(bench_sampler *s, size_t ref_free, size_t *min_free, int64_t *median_used);

/* The raw pinned copy bandwidth of the device behind rt (fills ctx->raw_*). */
vmmrt_status bench_raw_bandwidth(bench_ctx *ctx, vmmrt_runtime *rt);

/* The checksum the device computes over a layer's activation in iteration 0. */
/* Does vmmrt_layer_checksum_host agree with the library's vmmrt_checksum_host? */
bool bench_checksum_selftest(void);

/* The largest share of a preset's saved bytes that the D2H bandwidth can hide
 * behind its forward compute: min(1, fwd_ms / copy_ms). */
double bench_offload_budget(const bench_preset *pr, double d2h_gbps);

/* ------------------------------------------------------------------ output */

void bench_print_budget(FILE *f, const bench_ctx *ctx);
void bench_print_table(FILE *f, const bench_ctx *ctx, const bench_result *r, size_t n);
/* Returns 0, or -1 with a message on stderr. */
int bench_write_json(const char *path, const bench_ctx *ctx, const bench_result *rows, size_t n,
		     const bench_result *sweep, size_t nsweep);
void bench_json_string(FILE *f, const char *s);

/* ------------------------------------------------------------------- trace */

/* Give the runtime the bench's trace (driver calls) and name its workers' tracks. */
vmmrt_status bench_trace_attach(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode);
void bench_trace_detach(bench_ctx *ctx, vmmrt_runtime *rt);
/* Tie the device clock to CLOCK_MONOTONIC: a reference event on `s`. */
vmmrt_status bench_trace_align(bench_timing *t, vmmrt_stream s);
/* The CLOCK_MONOTONIC time of a completed event, through the reference. */
uint64_t bench_trace_time(bench_timing *t, vmmrt__bevent *e);
void bench_trace_span(bench_ctx *ctx, const char *track, uint64_t t0, uint64_t t1, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* ------------------------------------------------------------------- sweep */

/* Runs graph, pingpong and remap at each ratio; fills rows (caller frees). */
int bench_sweep(bench_ctx *ctx, const double *ratios, unsigned nratios, bench_result **rows, size_t *nrows);
/* Returns 0, or -1 with a message on stderr. */
int bench_write_svg(const char *path, const bench_ctx *ctx, const bench_result *rows, size_t n);

#endif

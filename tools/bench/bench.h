/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-bench: the A/B comparison of libvmmrt's offload strategies against
 * eager execution, whole-layer graphs without offload, and the naive graph
 * reload that libvmmrt exists to replace.
 *
 * One concept per file:
 *   vmmrt-bench.c  command line, defaults, presets, the run, exit status
 *   modes.c        the synthetic model: each mode from setup to verification
 *   iterate.c      one iteration of each mode (model.h: their shared state)
 *   options.c      runtime options: the command line's, replayed for each runtime
 *   metrics.c      timing events, the memory sampler, percentiles, raw bandwidth
 *   output.c       the table on stdout and the JSON file
 *   trace.c        the Chrome/Perfetto trace: device clock alignment, spans, one runtime's part
 *   trace-file.c   reading a runtime's trace file, writing the merged --trace file
 *   sweep.c        the copy/compute sweep and its SVG plot
 *
 * A client of the public API only (<vmmrt.h>), linked with the shared library
 * like any application.
 */
#ifndef VMMRT__BENCH_H
#define VMMRT__BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <vmmrt.h>

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
	/* --schedule=1f1b: one pipeline stage running `microbatches` through the
	 * layers, `inflight` at once; a runner (group, graphs) per layer and
	 * microbatch, as Megatron's per-microbatch graphs. */
	bool one_f_one_b;
	unsigned inflight, microbatches;
} bench_params;

/* One real layer measured on the H200 (the table: tools/vmmrt-bench.c). */
typedef struct bench_preset {
	const char *name;
	const char *what;
	double fwd_ms, bwd_ms;
	double saved_mib;
} bench_preset;

#define BENCH_NPRESETS 4
extern const bench_preset bench_presets[BENCH_NPRESETS];

typedef struct bench_option bench_option;
typedef struct bench_trace bench_trace;

/* Everything a run shares between its modes. */
typedef struct bench_ctx {
	bench_option *opts;       /* runtime options from the command line (and the probe), in order */
	size_t nopts;
	vmmrt_options *scratch;   /* options are validated on it and read from a runtime into it */
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
	bench_trace *trace;       /* --trace, or NULL */
	const char *trace_path;   /* its file */
	bool quiet;
	/* the host's expectation of the first iteration's forward checksums */
	size_t expect_bytes;
	unsigned expect_layers;
	uint64_t expect[2];       /* layers 0 and layers-1 */
} bench_ctx;

/* ---------------------------------------------------------------- options */

vmmrt_status bench_options_init(bench_ctx *ctx);
void bench_options_free(bench_ctx *ctx);
/* Give every later runtime name=value (validated now; the message is vmmrt_last_error). */
vmmrt_status bench_options_set(bench_ctx *ctx, const char *name, const char *value);
/* --name=value and --name value for every library option (dashes for
 * underscores); other arguments are left in argv (compacted), *argc updated. */
vmmrt_status bench_options_parse_args(bench_ctx *ctx, int *argc, char **argv);
/* A new options object with the settings made so far (vmmrt_options_destroy it). */
vmmrt_status bench_options_new(const bench_ctx *ctx, vmmrt_options **out);
/* Does this library have the option? */
bool bench_option_exists(const char *name);
/* The value rt has in force (the environment applied), as vmmrt_options_get writes it. */
vmmrt_status bench_runtime_option(bench_ctx *ctx, const vmmrt_runtime *rt, const char *name, char *buf, size_t len);
vmmrt_status bench_runtime_flag(bench_ctx *ctx, const vmmrt_runtime *rt, const char *name, bool *on);

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
	double fwd_gap_us_median;
	/* per iteration: the compute stream's waits before forward graphs (remap:
	 * for maps) and before backward graphs (for restores) */
	double fwd_wait_ms, bwd_wait_ms;
	vmmrt_driver_stats calls[VMMRT_DRIVER_CALLS];
	double driver_call_us_p99;      /* worst p99 over the call types; NAN without calls */
	uint64_t launch_thread_blocking;
	bool verified;
	unsigned checked, bad;
	unsigned first_bad_iter, first_bad_layer;
	uint64_t lib_activation_peak_bytes;
	uint64_t bank_conflicts;
	/* the schedule's bound (library modes): what vmmrt_offload_stats says */
	uint32_t banks, budget_groups, lookahead_in_force;
	uint64_t bound_bytes;
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
	vmmrt_event *a, *b;        /* on the copy stream: before and after the copy */
} bench_span;

typedef struct bench_timing {
	vmmrt_runtime *rt;
	unsigned layers;
	vmmrt_event *ref, *it_s, *it_e;
	vmmrt_event **fwd_s, **fwd_e, **bwd_s, **bwd_e;
	vmmrt_event **pool;       /* copy-span events */
	unsigned npool, used;
	bench_span *span;
	unsigned nspan, maxspan;
	uint64_t ref_host_ns;      /* CLOCK_MONOTONIC when `ref` completed */
	/* NULL, or per backward step: it follows a forward (1F1B), so the gap
	 * before it is no wait for a restore and is not counted */
	const bool *after_forward;
} bench_timing;

vmmrt_status bench_timing_create(vmmrt_runtime *rt, unsigned layers, bench_timing *t);
void bench_timing_destroy(bench_timing *t);
/* Start an iteration: forget its spans. */
void bench_timing_reset(bench_timing *t);
/* A copy-span event, or NULL when the iteration used them all. */
vmmrt_event *bench_timing_take(bench_timing *t);
bench_span *bench_timing_add_span(bench_timing *t);

/* What the measured iterations add up to. */
typedef struct bench_acc {
	double *iter_ms;
	size_t n_iter;
	double *gap_us;
	size_t n_gap;
	/* The gap before each forward graph but an iteration's first (all
	 * forwards, then all backwards only): what the compute stream spent in
	 * forward_begin's wait, for remap its wait for the map. */
	double *fwd_gap_us;
	size_t n_fwd_gap;
	double fwd_wait_ms, bwd_wait_ms;      /* sums over the measured iterations */
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

/*
 * --trace=FILE. Each mode's runtime is created with the option "trace"=FILE:
 * it records its driver calls and its workers' tracks, the bench adds its
 * device spans with vmmrt_trace_span, and the runtime writes the file when it
 * is destroyed. The bench then reads the file back into one merged trace,
 * which it writes to FILE at the end: one file, every mode on one clock.
 */
/* Check that path can be written; returns 0, or -1 with a message on stderr. */
int bench_trace_open(bench_ctx *ctx, const char *path);
/* Write the merged trace to the file and free it; returns 0, or -1 with a message. */
int bench_trace_close(bench_ctx *ctx);
/* The option a mode's runtime needs for the trace (nothing without --trace). */
vmmrt_status bench_trace_option(const bench_ctx *ctx, vmmrt_options *o);
/* After a mode's runtime was created: does it write the --trace file? (It
 * does not when VMMRT_TRACE overrides the option; says so on stderr.) */
bool bench_trace_check(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode);
/* Just before that runtime is destroyed: the span of its life on the "bench"
 * track ("MODE runtime"), from created_ns, the host clock right after creation.
 * Its file's times are relative to an origin of the file's own; this span is
 * how the merge puts them back on the host clock. */
void bench_trace_mark(bench_ctx *ctx, vmmrt_runtime *rt, const char *mode, uint64_t created_ns);
/* After it was destroyed: take its file's events into the merged trace. A
 * failure is said on stderr, and bench_trace_close then returns -1. */
void bench_trace_absorb(bench_ctx *ctx, const char *mode, uint64_t created_ns);

/* CLOCK_MONOTONIC in nanoseconds: the clock of the runtime's trace. */
uint64_t bench_now_ns(void);
/* Tie the device clock to CLOCK_MONOTONIC: a reference event on `s`. */
vmmrt_status bench_trace_align(bench_timing *t, vmmrt_stream s);
/* The CLOCK_MONOTONIC time of a completed event, through the reference. */
uint64_t bench_trace_time(bench_timing *t, vmmrt_event *e);
/* A span on a named track of rt's trace (nothing without --trace). */
void bench_trace_span(const bench_ctx *ctx, vmmrt_runtime *rt, const char *track, uint64_t t0, uint64_t t1,
		      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ------------------------------------------------------------------- sweep */

/* Runs graph, pingpong and remap at each ratio; fills rows (caller frees). */
int bench_sweep(bench_ctx *ctx, const double *ratios, unsigned nratios, bench_result **rows, size_t *nrows);
/* Returns 0, or -1 with a message on stderr. */
int bench_write_svg(const char *path, const bench_ctx *ctx, const bench_result *rows, size_t n);

#endif

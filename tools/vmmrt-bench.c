/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-bench: the A/B of libvmmrt. A synthetic model of L layers runs in
 * every mode (eager, eager-offload, graph, pingpong, remap, remap-inline,
 * naive) with the same iterations and warm-up; per mode the bench reports the
 * iteration time from device events, device memory from the driver, copy
 * bandwidth, the compute stream's gap between backward graphs, driver call
 * latency, the launch thread's blocking calls and whether every restored
 * activation was intact. naive must fail: that the bench sees it fail is what
 * makes the other rows' "verified" mean something.
 *
 * This file: the command line, the defaults per backend, the presets, the
 * order of the run and the exit status. See tools/bench/bench.h for the rest.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"

/* Real layers measured on the H200 (PyTorch 2.11, bf16): vmmrt-bench(1), --preset. */
const bench_preset bench_presets[BENCH_NPRESETS] = {
	{"llama8b-s4096", "Llama-3-8B shape, seq 4096, batch 1", 3.10, 7.07, 721},
	{"llama8b-s8192", "Llama-3-8B shape, seq 8192, batch 1", 6.45, 15.85, 1441},
	{"70b-s4096", "70B-like (h 8192, ffn 28672), seq 4096", 11.30, 24.90, 1425},
	{"1.3b-s2048-b8", "1.3B-like (h 2048), seq 2048, batch 8", 4.39, 9.38, 1665},
};

/* Defaults per backend: all modes in well under a minute (host: on 2 cores). */
static const bench_params defaults_host = {.layers = 6, .act_bytes = 8u << 20, .fwd_ms = 2, .bwd_ms = 4,
					   .iterations = 8, .warmup = 2};
static const bench_params defaults_cuda = {.layers = 8, .act_bytes = 256u << 20, .fwd_ms = 6, .bwd_ms = 12,
					   .iterations = 20, .warmup = 3};

static const double default_ratios[] = {0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3};

typedef struct cli {
	bool help, version, sweep, quiet;
	bool has_layers, has_mib, has_fwd, has_bwd, has_iters, has_warmup, host_latency_given;
	unsigned layers, iterations, warmup, inflight, microbatches;
	bool one_f_one_b, has_microbatches;
	double mib, fwd_ms, bwd_ms, fraction;
	const char *preset, *modes, *json, *trace, *sweep_out;
	double ratios[32];
	unsigned nratios;
} cli;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: vmmrt-bench [OPTION]... [RUNTIME OPTION]...\n"
		"\n"
		"Runs a synthetic model of L layers in each mode and compares them: iteration time (device\n"
		"events), device memory (driver memory info), copy bandwidth, the gap between backward graphs,\n"
		"driver call latency, blocking calls on the launch thread, and whether every activation the\n"
		"backward read was intact. Exits non-zero when a mode that must be correct fails verification\n"
		"or when naive does not fail.\n"
		"\n"
		"Model:\n"
		"  --layers=N             layers (default: host 6, cuda 8)\n"
		"  --activation-mib=X     activation bytes each layer saves, MiB (default: host 8, cuda 256)\n"
		"  --fwd-ms=X             forward compute time of one layer (default: host 2, cuda 6)\n"
		"  --bwd-ms=X             backward compute time of one layer (default: host 4, cuda 12)\n"
		"  --iterations=N         measured iterations per mode (default: host 8, cuda 20)\n"
		"  --warmup=N             warm-up iterations per mode, not measured (default: host 2, cuda 3)\n"
		"  --schedule=afab|1f1b   the order of an iteration: all forwards then all backwards (default),\n"
		"                         or one pipeline stage's 1F1B (a runner per layer and microbatch; the\n"
		"                         pool modes are left out) with the schedule's memory bound reported\n"
		"  --inflight=P           1F1B: microbatches in flight (default 2)\n"
		"  --microbatches=M       1F1B: microbatches per iteration (default 2 P)\n"
		"  --preset=NAME          a real layer measured on the H200 (forward/backward time, saved bytes):\n");
	for (unsigned i = 0; i < BENCH_NPRESETS; i++)
		fprintf(f, "                           %-14s %5.2f / %5.2f ms, %4.0f MiB  %s\n", bench_presets[i].name,
			bench_presets[i].fwd_ms, bench_presets[i].bwd_ms, bench_presets[i].saved_mib, bench_presets[i].what);
	fprintf(f,
		"  --offload-fraction=F   with --preset: offload this share of each layer's saved bytes (0 < F <= 1,\n"
		"                         default 1); the offload budget table says which share the bandwidth hides\n"
		"  look-ahead, worker count and backend are runtime options: --lookahead=N, --driver-workers=N,\n"
		"  --backend=auto|cuda|host (below). On the host backend the latency model is on by default\n"
		"  (--host-latency=0 turns it off).\n"
		"\n"
		"Run:\n"
		"  --modes=LIST           comma-separated modes (default: all, in this order):\n");
	for (int i = 0; i < BM_COUNT_; i++)
		fprintf(f, "                           %-14s %s\n", bench_modes[i].name, bench_modes[i].what);
	fprintf(f,
		"  --json=FILE            write the results as JSON\n"
		"  --trace=FILE           write a Chrome/Perfetto trace (streams, graphs, copies, driver calls)\n"
		"  --sweep                instead of the modes: graph, pingpong and remap over a range of\n"
		"                         copy/compute ratios (compute time varied at fixed bytes)\n"
		"  --sweep-ratios=LIST    the ratios (default 0.25,0.5,0.75,1,1.5,2,2.5,3)\n"
		"  --sweep-out=FILE       the SVG plot of the sweep (default vmmrt-bench-sweep.svg)\n"
		"  --quiet                no progress lines on stderr\n"
		"  -h, --help             this help;  --version  the version\n"
		"\n"
		"Runtime options (every mode's runtime gets them; VMMRT_* variables override them).\n"
		"Not here: mode (each mode sets its own; --mode is refused) and trace (--trace above is the\n"
		"bench's: one file for all modes, merged from each mode's runtime trace):\n");
	/* the option table itself, so help and library cannot disagree */
	vmmrt_option_info info = {.size = sizeof(info)};
	for (size_t i = 0; vmmrt_option_describe(i, &info) == VMMRT_OK; i++) {
		if (strcmp(info.name, "mode") == 0 || strcmp(info.name, "trace") == 0)
			continue;
		char flag[64];
		snprintf(flag, sizeof(flag), "--%s=VALUE", info.name);
		for (char *q = flag; *q; q++)
			if (*q == '_')
				*q = '-';
		const char *def = info.default_value[0] ? info.default_value : "empty";
		if (strcmp(info.name, "host_latency") == 0)
			def = "1 in vmmrt-bench on the host backend (0 in the library)";
		fprintf(f, "  %-24s %s\n  %-24s [%s; %s; default %s]\n", flag, info.doc, "", info.env, info.range, def);
	}
	fprintf(f, "\nExit status: 0 all modes as expected; 1 a mode failed verification, naive did not fail,\n"
		   "or a mode could not run; 2 a usage or setup error. See vmmrt-bench(1).\n");
}

static bool parse_uint(const char *s, unsigned min, unsigned max, unsigned *out)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return false;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return false;
	*out = (unsigned)v;
	return true;
}

static bool parse_double(const char *s, double min, double max, double *out)
{
	char *end;
	errno = 0;
	if (!s || !*s)
		return false;
	double v = strtod(s, &end);
	if (errno || *end || !isfinite(v) || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static bool parse_ratios(const char *s, cli *c)
{
	char buf[512];
	if (!s || strlen(s) >= sizeof(buf))
		return false;
	strcpy(buf, s);
	c->nratios = 0;
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (c->nratios == sizeof(c->ratios) / sizeof(c->ratios[0]) ||
		    !parse_double(tok, 0.001, 1000, &c->ratios[c->nratios]))
			return false;
		c->nratios++;
	}
	return c->nratios > 0;
}

enum {
	O_LAYERS, O_MIB, O_FWD, O_BWD, O_ITERS, O_WARMUP, O_MODES, O_PRESET, O_FRACTION, O_JSON, O_TRACE, O_SWEEP,
	O_SWEEP_OUT, O_SWEEP_RATIOS, O_QUIET, O_HELP, O_VERSION, O_SCHEDULE, O_INFLIGHT, O_MICROBATCHES, O_COUNT_
};
static const struct {
	const char *name;
	bool arg;
} bench_opts[O_COUNT_] = {
	[O_LAYERS] = {"layers", true},       [O_MIB] = {"activation-mib", true},
	[O_FWD] = {"fwd-ms", true},          [O_BWD] = {"bwd-ms", true},
	[O_ITERS] = {"iterations", true},    [O_WARMUP] = {"warmup", true},
	[O_MODES] = {"modes", true},         [O_PRESET] = {"preset", true},
	[O_FRACTION] = {"offload-fraction", true}, [O_JSON] = {"json", true},
	[O_TRACE] = {"trace", true},         [O_SWEEP] = {"sweep", false},
	[O_SWEEP_OUT] = {"sweep-out", true}, [O_SWEEP_RATIOS] = {"sweep-ratios", true},
	[O_QUIET] = {"quiet", false},        [O_HELP] = {"help", false},
	[O_VERSION] = {"version", false},
	[O_SCHEDULE] = {"schedule", true},   [O_INFLIGHT] = {"inflight", true},
	[O_MICROBATCHES] = {"microbatches", true},
};

/*
 * The bench's own options come out of argv first, so that --trace (also the
 * name of a runtime option, which would make each runtime overwrite the file)
 * means the bench's trace; the rest goes to bench_options_parse_args.
 */
static int parse_cli(cli *c, int *argc, char **argv)
{
	int keep = 1;
	for (int i = 1; i < *argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0) {
			c->help = true;
			continue;
		}
		if (strncmp(a, "--", 2) != 0) {
			argv[keep++] = argv[i];
			continue;
		}
		const char *eq = strchr(a + 2, '=');
		size_t n = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
		if (n == 4 && strncmp(a + 2, "mode", 4) == 0) {
			fprintf(stderr, "vmmrt-bench: --mode would force one strategy on every row: use --modes=LIST\n");
			return -1;
		}
		if (n == 12 && strncmp(a + 2, "host-latency", 12) == 0)
			c->host_latency_given = true;
		int id = -1;
		for (int k = 0; k < O_COUNT_; k++)
			if (strlen(bench_opts[k].name) == n && strncmp(a + 2, bench_opts[k].name, n) == 0)
				id = k;
		if (id < 0) {
			argv[keep++] = argv[i];
			continue;
		}
		const char *v = NULL;
		if (bench_opts[id].arg) {
			v = eq ? eq + 1 : (i + 1 < *argc ? argv[++i] : NULL);
			if (!v) {
				fprintf(stderr, "vmmrt-bench: --%s needs a value\n", bench_opts[id].name);
				return -1;
			}
		} else if (eq) {
			fprintf(stderr, "vmmrt-bench: --%s takes no value\n", bench_opts[id].name);
			return -1;
		}
		bool ok = true;
		switch (id) {
		case O_LAYERS: ok = parse_uint(v, 1, 4096, &c->layers); c->has_layers = true; break;
		case O_MIB: ok = parse_double(v, 8.0 / MiB_D, 1 << 20, &c->mib); c->has_mib = true; break;
		case O_FWD: ok = parse_double(v, 0, 60000, &c->fwd_ms); c->has_fwd = true; break;
		case O_BWD: ok = parse_double(v, 0, 60000, &c->bwd_ms); c->has_bwd = true; break;
		case O_ITERS: ok = parse_uint(v, 1, 1000000, &c->iterations); c->has_iters = true; break;
		case O_WARMUP: ok = parse_uint(v, 0, 1000000, &c->warmup); c->has_warmup = true; break;
		case O_MODES: c->modes = v; break;
		case O_PRESET: c->preset = v; break;
		case O_FRACTION: ok = parse_double(v, 1e-6, 1, &c->fraction) && c->fraction > 0; break;
		case O_JSON: c->json = v; break;
		case O_TRACE: c->trace = v; break;
		case O_SWEEP: c->sweep = true; break;
		case O_SWEEP_OUT: c->sweep_out = v; break;
		case O_SWEEP_RATIOS: ok = parse_ratios(v, c); break;
		case O_QUIET: c->quiet = true; break;
		case O_HELP: c->help = true; break;
		case O_VERSION: c->version = true; break;
		case O_SCHEDULE:
			ok = !strcmp(v, "afab") || !strcmp(v, "1f1b");
			c->one_f_one_b = ok && !strcmp(v, "1f1b");
			break;
		case O_INFLIGHT: ok = parse_uint(v, 1, 256, &c->inflight); break;
		case O_MICROBATCHES: ok = parse_uint(v, 1, 1024, &c->microbatches); c->has_microbatches = true; break;
		default: break;
		}
		if (!ok) {
			fprintf(stderr, "vmmrt-bench: --%s: '%s' is not a valid value (see --help)\n", bench_opts[id].name, v);
			return -1;
		}
	}
	argv[keep] = NULL;
	*argc = keep;
	return 0;
}

/* Which modes, in the order given (default: all). */
static int parse_modes(const char *list, bench_mode_id *out, unsigned *n)
{
	*n = 0;
	if (!list) {
		for (int i = 0; i < BM_COUNT_; i++)
			out[(*n)++] = (bench_mode_id)i;
		return 0;
	}
	char buf[256];
	if (strlen(list) >= sizeof(buf)) {
		fprintf(stderr, "vmmrt-bench: --modes: list too long\n");
		return -1;
	}
	strcpy(buf, list);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int id = bench_mode_find(tok);
		if (id < 0) {
			fprintf(stderr, "vmmrt-bench: --modes: unknown mode '%s' (modes: ", tok);
			for (int i = 0; i < BM_COUNT_; i++)
				fprintf(stderr, "%s%s", i ? ", " : "", bench_modes[i].name);
			fprintf(stderr, ")\n");
			return -1;
		}
		for (unsigned k = 0; k < *n; k++)
			if (out[k] == (bench_mode_id)id) {
				fprintf(stderr, "vmmrt-bench: --modes: '%s' given twice\n", tok);
				return -1;
			}
		out[(*n)++] = (bench_mode_id)id;
	}
	if (!*n) {
		fprintf(stderr, "vmmrt-bench: --modes: empty list\n");
		return -1;
	}
	return 0;
}

/*
 * A first runtime, before any mode: it resolves backend=auto, tells whether
 * the host backend's latency model should be switched on, gives the device's
 * name and the effective look-ahead and worker count, and measures the raw
 * copy bandwidth.
 */
static int probe(bench_ctx *ctx, const cli *c)
{
	vmmrt_runtime *rt = NULL;
	vmmrt_runtime_info info = {.size = sizeof(info)};
	bool latency = false;
	for (int attempt = 0; attempt < 2; attempt++) {
		vmmrt_options *o = NULL;
		vmmrt_status st = bench_options_new(ctx, &o);
		if (st == VMMRT_OK && (st = vmmrt_options_set(o, "mode", "none")) == VMMRT_OK)
			st = vmmrt_runtime_create(o, &rt);
		vmmrt_options_destroy(o);
		if (st != VMMRT_OK) {
			fprintf(stderr, "vmmrt-bench: cannot create a runtime: %s\n", vmmrt_last_error());
			return -1;
		}
		if (vmmrt_runtime_info_get(rt, &info) != VMMRT_OK ||
		    bench_runtime_flag(ctx, rt, "host_latency", &latency) != VMMRT_OK) {
			fprintf(stderr, "vmmrt-bench: runtime info: %s\n", vmmrt_last_error());
			(void)vmmrt_runtime_destroy(rt);
			return -1;
		}
		/* A CPU has no copy engines and no driver: without the H200's costs
		 * modelled, the A/B would compare memcpy with memcpy. */
		bool host = strcmp(info.backend, "host") == 0;
		if (attempt == 0 && host && !c->host_latency_given && !getenv("VMMRT_HOST_LATENCY") && !latency) {
			(void)vmmrt_runtime_destroy(rt);
			rt = NULL;
			if (bench_options_set(ctx, "host_latency", "1") != VMMRT_OK) {
				fprintf(stderr, "vmmrt-bench: host_latency=1: %s\n", vmmrt_last_error());
				return -1;
			}
			continue;
		}
		break;
	}
	snprintf(ctx->backend, sizeof(ctx->backend), "%s", info.backend);
	snprintf(ctx->device, sizeof(ctx->device), "%s", info.device);
	snprintf(ctx->backend_note, sizeof(ctx->backend_note), "%s", info.backend_note);
	ctx->granularity = info.granularity;
	ctx->host_latency = strcmp(info.backend, "host") == 0 && latency;
	ctx->p.lookahead = info.lookahead;
	ctx->p.workers = info.driver_workers;
	/* The modes' runtimes must open the same backend the probe found. */
	if (bench_options_set(ctx, "backend", info.backend) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-bench: backend=%s: %s\n", info.backend, vmmrt_last_error());
		(void)vmmrt_runtime_destroy(rt);
		return -1;
	}
	if (!c->quiet)
		fprintf(stderr, "vmmrt-bench: measuring the raw pinned copy bandwidth ...\n");
	int rc = bench_raw_bandwidth(ctx, rt) == VMMRT_OK ? 0 : -1;
	if (vmmrt_runtime_destroy(rt) != VMMRT_OK)
		fprintf(stderr, "vmmrt-bench: probe runtime destroy: %s\n", vmmrt_last_error());
	return rc;
}

/* What can be checked before a runtime exists (the probe takes seconds). */
static int check_preset(bench_ctx *ctx, const cli *c)
{
	ctx->offload_fraction = c->fraction > 0 ? c->fraction : 1.0;
	if (!c->preset) {
		if (c->fraction > 0) {
			fprintf(stderr, "vmmrt-bench: --offload-fraction applies to a --preset's saved bytes\n");
			return -1;
		}
		return 0;
	}
	for (unsigned i = 0; i < BENCH_NPRESETS; i++)
		if (strcmp(c->preset, bench_presets[i].name) == 0)
			ctx->preset = &bench_presets[i];
	if (ctx->preset)
		return 0;
	fprintf(stderr, "vmmrt-bench: --preset: unknown preset '%s' (presets:", c->preset);
	for (unsigned i = 0; i < BENCH_NPRESETS; i++)
		fprintf(stderr, " %s", bench_presets[i].name);
	fprintf(stderr, ")\n");
	return -1;
}

static int resolve_params(bench_ctx *ctx, const cli *c)
{
	bool cuda = strcmp(ctx->backend, "cuda") == 0;
	const bench_params *d = cuda ? &defaults_cuda : &defaults_host;
	bench_params *p = &ctx->p;
	unsigned lookahead = p->lookahead, workers = p->workers;
	*p = *d;
	p->lookahead = lookahead;
	p->workers = workers;
	if (ctx->preset) {
		p->fwd_ms = ctx->preset->fwd_ms;
		p->bwd_ms = ctx->preset->bwd_ms;
		p->act_bytes = (size_t)(ctx->preset->saved_mib * ctx->offload_fraction * MiB_D);
	}
	/* explicit values win over the preset and the defaults */
	if (c->has_layers)
		p->layers = c->layers;
	if (c->has_mib)
		p->act_bytes = (size_t)(c->mib * MiB_D);
	if (c->has_fwd)
		p->fwd_ms = c->fwd_ms;
	if (c->has_bwd)
		p->bwd_ms = c->bwd_ms;
	if (c->has_iters)
		p->iterations = c->iterations;
	if (c->has_warmup)
		p->warmup = c->warmup;
	p->one_f_one_b = c->one_f_one_b;
	p->inflight = c->inflight ? c->inflight : 2;
	p->microbatches = c->has_microbatches ? c->microbatches : 2 * p->inflight;
	if (p->one_f_one_b && p->microbatches < p->inflight) {
		fprintf(stderr, "vmmrt-bench: --microbatches=%u is fewer than --inflight=%u\n", p->microbatches,
			p->inflight);
		return -1;
	}
	if ((c->inflight || c->has_microbatches) && !p->one_f_one_b) {
		fprintf(stderr, "vmmrt-bench: --inflight and --microbatches go with --schedule=1f1b\n");
		return -1;
	}
	p->act_bytes &= ~(size_t)7; /* the checksum kernels work on 8-byte words */
	if (p->act_bytes < 8) {
		fprintf(stderr, "vmmrt-bench: an activation must be at least 8 bytes\n");
		return -1;
	}
	return 0;
}

static void print_header(const bench_ctx *ctx)
{
	const bench_params *p = &ctx->p;
	printf("vmmrt-bench %s: backend %s (%s), device %s\n", PACKAGE_VERSION, ctx->backend, ctx->backend_note,
	       ctx->device);
	if (strcmp(ctx->backend, "host") == 0)
		printf("host latency model: %s\n", ctx->host_latency ? "on (H200 driver-call and copy costs)" : "off");
	printf("model: %u layers x %.2f MiB, forward %.2f ms, backward %.2f ms; %u iterations after %u warm-up; "
	       "look-ahead %u, %u driver worker%s",
	       p->layers, (double)p->act_bytes / MiB_D, p->fwd_ms, p->bwd_ms, p->iterations, p->warmup, p->lookahead,
	       p->workers, p->workers == 1 ? "" : "s");
	if (ctx->preset)
		printf("; preset %s, offload fraction %.3g", ctx->preset->name, ctx->offload_fraction);
	if (p->one_f_one_b)
		printf("\nschedule: 1F1B on one pipeline stage, %u microbatches, %u in flight: %u runners (a layer of "
		       "one microbatch each), declared to the library before allocation",
		       p->microbatches, p->inflight, p->layers * p->microbatches);
	printf("\nraw pinned copies (%zu MiB): H2D %.1f GB/s, D2H %.1f GB/s\n\n", ctx->raw_bytes >> 20, ctx->raw_h2d_gbps,
	       ctx->raw_d2h_gbps);
	bench_print_budget(stdout, ctx);
	printf("\n");
}

/*
 * 1F1B: each library mode's activation memory against what the schedule
 * holds it to (vmmrt_offload_stats: the banks, remap's budget of groups,
 * every slot). The steady-state peak the library accounts must be within
 * it; the driver's median of the run is printed next to it.
 */
static int report_bounds(const bench_result *rows, size_t n)
{
	int bad = 0;
	printf("\nmemory against the schedule's bound:\n");
	for (size_t k = 0; k < n; k++) {
		const bench_result *r = &rows[k];
		if (!bench_modes[r->mode].lib_mode || !r->ran)
			continue;
		char what[64];
		if (r->banks)
			snprintf(what, sizeof(what), "%u banks", r->banks);
		else
			snprintf(what, sizeof(what), "%u groups mapped at most", r->budget_groups);
		bool within = r->lib_activation_peak_bytes <= r->bound_bytes;
		printf("  %-14s %s (look-ahead in force %u): bound %.1f MiB, activation peak %.1f MiB, driver median "
		       "%.1f MiB: %s\n",
		       bench_modes[r->mode].name, what, r->lookahead_in_force, (double)r->bound_bytes / MiB_D,
		       (double)r->lib_activation_peak_bytes / MiB_D, (double)r->activation_device_bytes / MiB_D,
		       within ? "within" : "OVER THE BOUND");
		bad |= !within;
	}
	return bad;
}

/* One line per row that is not as it must be, and the verdict. */
static int report_verdicts(const bench_result *rows, size_t n, bool sweep)
{
	int bad = 0;
	printf("\nverification:\n");
	for (size_t k = 0; k < n; k++) {
		const bench_result *r = &rows[k];
		const char *name = bench_modes[r->mode].name;
		char where[64] = "";
		if (sweep)
			snprintf(where, sizeof(where), " (ratio %g)", r->ratio);
		if (r->skipped) {
			printf("  skip   %s%s: %s\n", name, where, r->note);
		} else if (!r->ran) {
			printf("  ERROR  %s%s: %s\n", name, where, r->note[0] ? r->note : "did not run");
			bad++;
		} else if (bench_modes[r->mode].must_fail) {
			if (r->verified) {
				printf("  FAIL   %s%s: passed verification, but it must fail: the backward graph read its "
				       "own bytes, so the negative case is not visible\n",
				       name, where);
				bad++;
			} else {
				printf("  ok     %s%s: failed verification, as it must (%u of %u activations were not what "
				       "the forward saved; first: iteration %u, layer %u)\n",
				       name, where, r->bad, r->checked, r->first_bad_iter, r->first_bad_layer);
			}
		} else if (!r->verified) {
			printf("  FAIL   %s%s: %u of %u activations corrupted (first: iteration %u, layer %u)%s%s\n", name,
			       where, r->bad, r->checked, r->first_bad_iter, r->first_bad_layer, r->note[0] ? "; " : "",
			       r->note);
			bad++;
		} else if (!sweep) {
			printf("  ok     %s: all %u activations intact\n", name, r->checked);
		}
	}
	if (bad)
		printf("result: %d row%s NOT as expected\n", bad, bad == 1 ? "" : "s");
	else
		printf("result: every mode as expected\n");
	return bad;
}

/*
 * A fault inside a mode (the library, a backend or the device) kills the
 * process; say which mode was running before it goes, so the run can be
 * repeated without it (--modes). Only async-signal-safe calls here; the
 * signal is then delivered again with its default action (core, status).
 */
static void on_crash(int sig)
{
	static const char head[] = "\nvmmrt-bench: crashed (";
	const char *mode = bench_current_mode;
	const char *name = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
			   : sig == SIGILL ? "SIGILL" : "SIGABRT";
	ssize_t rc = write(STDERR_FILENO, head, sizeof(head) - 1);
	rc = write(STDERR_FILENO, name, strlen(name));
	if (mode) {
		static const char mid[] = ") while running mode ";
		rc = write(STDERR_FILENO, mid, sizeof(mid) - 1);
		rc = write(STDERR_FILENO, mode, strlen(mode));
		static const char tail[] = ": a fault in libvmmrt, its backend or the device; --modes can leave it out\n";
		rc = write(STDERR_FILENO, tail, sizeof(tail) - 1);
	} else {
		rc = write(STDERR_FILENO, ")\n", 2);
	}
	(void)rc;
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install_crash_handler(void)
{
	int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
	for (unsigned i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_crash;
		sigemptyset(&sa.sa_mask);
		sa.sa_flags = SA_RESETHAND;
		sigaction(sigs[i], &sa, NULL);
	}
}

/* Everything up to the modes; returns 0, or the exit status of a usage or setup error. */
static int setup(bench_ctx *ctx, cli *c, int *argc, char **argv, bench_mode_id *modes, unsigned *nmodes)
{
	if (parse_cli(c, argc, argv) != 0)
		return 2;
	if (c->help || c->version)
		return 0;
	if (bench_options_parse_args(ctx, argc, argv) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-bench: %s\n", vmmrt_last_error());
		return 2;
	}
	if (*argc > 1) {
		fprintf(stderr, "vmmrt-bench: unknown argument '%s' (see --help)\n", argv[1]);
		return 2;
	}
	if (parse_modes(c->modes, modes, nmodes) != 0 || check_preset(ctx, c) != 0)
		return 2;
	if (c->sweep && c->modes)
		fprintf(stderr, "vmmrt-bench: --sweep runs graph, pingpong and remap; --modes is ignored\n");
	if (!bench_checksum_selftest()) {
		fprintf(stderr, "vmmrt-bench: the bench's checksum formula disagrees with vmmrt_checksum_host: "
				"rebuild the bench with this library\n");
		return 2;
	}
	if (getenv("VMMRT_MODE"))
		fprintf(stderr, "vmmrt-bench: warning: VMMRT_MODE is set and overrides every mode's strategy; "
				"those rows are reported as skipped\n");
	ctx->quiet = c->quiet;

	if (probe(ctx, c) != 0 || resolve_params(ctx, c) != 0)
		return 2;
	print_header(ctx);
	fflush(stdout);
	if (c->trace && bench_trace_open(ctx, c->trace) != 0)
		return 2;
	return 0;
}

int main(int argc, char **argv)
{
	cli c = {0};
	bench_ctx ctx;
	bench_mode_id modes[BM_COUNT_];
	unsigned nmodes = 0;
	bench_result *rows = NULL, *sweep_rows = NULL;
	size_t nrows = 0, nsweep = 0;
	int exit_code = 2;

	memset(&ctx, 0, sizeof(ctx));
	install_crash_handler();
	if (bench_options_init(&ctx) != VMMRT_OK) {
		fprintf(stderr, "vmmrt-bench: %s\n", vmmrt_last_error());
		return 2;
	}
	if ((exit_code = setup(&ctx, &c, &argc, argv, modes, &nmodes)) != 0)
		goto out;
	if (c.help) {
		usage(stdout);
		goto out;
	}
	if (c.version) {
		printf("vmmrt-bench (libvmmrt) %s\n", PACKAGE_VERSION);
		goto out;
	}
	exit_code = 2;

	int bad = 0;
	if (c.sweep) {
		const double *ratios = c.nratios ? c.ratios : default_ratios;
		unsigned nr = c.nratios ? c.nratios : (unsigned)(sizeof(default_ratios) / sizeof(default_ratios[0]));
		if (bench_sweep(&ctx, ratios, nr, &sweep_rows, &nsweep) != 0)
			goto out;
		bad = report_verdicts(sweep_rows, nsweep, true);
		const char *svg = c.sweep_out ? c.sweep_out : "vmmrt-bench-sweep.svg";
		if (bench_write_svg(svg, &ctx, sweep_rows, nsweep) != 0)
			goto out;
		printf("sweep plot: %s\n", svg);
	} else {
		if (!(rows = calloc(nmodes, sizeof(*rows)))) {
			fprintf(stderr, "vmmrt-bench: out of host memory\n");
			goto out;
		}
		for (unsigned k = 0; k < nmodes; k++)
			bench_run_mode(&ctx, modes[k], &ctx.p, &rows[nrows++]);
		/* the ratio against graph from this same run */
		double g = NAN;
		for (size_t k = 0; k < nrows; k++)
			if (rows[k].mode == BM_GRAPH && rows[k].ran)
				g = rows[k].iter_ms_median;
		for (size_t k = 0; k < nrows; k++)
			rows[k].vs_graph_ratio = rows[k].ran && g > 0 ? rows[k].iter_ms_median / g : NAN;
		bench_print_table(stdout, &ctx, rows, nrows);
		if (ctx.p.one_f_one_b)
			bad |= report_bounds(rows, nrows);
		bad |= report_verdicts(rows, nrows, false);
	}
	exit_code = bad ? 1 : 0;
	if (c.json) {
		if (bench_write_json(c.json, &ctx, rows, nrows, sweep_rows, nsweep) != 0)
			exit_code = 2;
		else
			printf("json: %s\n", c.json);
	}
out:
	if (ctx.trace) {
		if (bench_trace_close(&ctx) != 0)
			exit_code = 2;
		else
			printf("trace: %s\n", c.trace);
	}
	bench_options_free(&ctx);
	free(rows);
	free(sweep_rows);
	return exit_code;
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What the bench prints: the offload budget of the real layer shapes, one
 * table row per mode on stdout (the seed's style: one line per configuration,
 * the baseline's ratio next to it), and the same numbers as JSON.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "bench.h"

void bench_print_budget(FILE *f, const bench_ctx *ctx)
{
	fprintf(f, "offload budget at the measured D2H bandwidth (%.1f GB/s): the share of each layer's saved bytes\n"
		   "whose copy hides behind its forward, min(1, fwd_ms / copy_ms)\n",
		ctx->raw_d2h_gbps);
	fprintf(f, "  %-16s %8s %8s %10s %9s %8s\n", "preset", "fwd ms", "bwd ms", "saved MiB", "copy ms", "budget");
	for (unsigned i = 0; i < BENCH_NPRESETS; i++) {
		const bench_preset *pr = &bench_presets[i];
		double copy_ms = ctx->raw_d2h_gbps > 0 ? pr->saved_mib * MiB_D / (ctx->raw_d2h_gbps * 1e6) : NAN;
		fprintf(f, "  %-16s %8.2f %8.2f %10.0f %9.2f %8.3f\n", pr->name, pr->fwd_ms, pr->bwd_ms, pr->saved_mib,
			copy_ms, bench_offload_budget(pr, ctx->raw_d2h_gbps));
	}
}

static void cell(char *buf, size_t len, const char *fmt, double v)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, fmt, v);
}

static void gbps_cell(char *buf, size_t len, double v, double raw)
{
	if (isnan(v))
		snprintf(buf, len, "-");
	else if (raw > 0)
		snprintf(buf, len, "%.1f (%.0f%%)", v, 100.0 * v / raw);
	else
		snprintf(buf, len, "%.1f", v);
}

static const char *verdict(const bench_result *r)
{
	if (r->skipped)
		return "skipped";
	if (!r->ran)
		return "ERROR";
	if (bench_modes[r->mode].must_fail)
		return r->verified ? "yes (MUST FAIL)" : "no (expected)";
	return r->verified ? "yes" : "NO";
}

void bench_print_table(FILE *f, const bench_ctx *ctx, const bench_result *rows, size_t n)
{
	char a[32], b[32], c[32], d[32], e[32], g[32], h[32], i2[32], i3[32], j[32];
	fprintf(f, "%-13s %9s %9s %8s %9s %9s %15s %15s %10s %10s %10s %8s  %s\n", "mode", "iter ms", "p90 ms",
		"vs graph", "act MiB", "peak MiB", "D2H GB/s", "H2D GB/s", "fwd gap us", "bwd gap us", "drv p99 us",
		"blocking", "verified");
	for (size_t k = 0; k < n; k++) {
		const bench_result *r = &rows[k];
		if (!r->ran) {
			fprintf(f, "%-13s %9s %9s %8s %9s %9s %15s %15s %10s %10s %10s %8s  %s\n", bench_modes[r->mode].name,
				"-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", verdict(r));
			continue;
		}
		cell(a, sizeof(a), "%.2f", r->iter_ms_median);
		cell(b, sizeof(b), "%.2f", r->iter_ms_p90);
		cell(c, sizeof(c), "%.3f", r->vs_graph_ratio);
		cell(d, sizeof(d), "%.1f", (double)r->activation_device_bytes / MiB_D);
		cell(e, sizeof(e), "%.1f", (double)r->peak_device_bytes / MiB_D);
		gbps_cell(g, sizeof(g), r->d2h_gbps, ctx->raw_d2h_gbps);
		gbps_cell(h, sizeof(h), r->h2d_gbps, ctx->raw_h2d_gbps);
		cell(i2, sizeof(i2), "%.1f", r->bwd_gap_us_median);
		cell(i3, sizeof(i3), "%.1f", r->fwd_gap_us_median);
		cell(j, sizeof(j), "%.1f", r->driver_call_us_p99);
		fprintf(f, "%-13s %9s %9s %8s %9s %9s %15s %15s %10s %10s %10s %8" PRIu64 "  %s\n",
			bench_modes[r->mode].name, a, b, c, d, e, g, h, i3, i2, j, r->launch_thread_blocking, verdict(r));
	}
	/* Remap's price against ping-pong, where it is paid: the compute
	 * stream waiting for a map before a forward (the release of the layer
	 * whose memory it takes, then create/map/set-access), or for a restore
	 * before a backward (whose H2D waited for its map). */
	for (size_t k = 0; k < n; k++) {
		const bench_result *r = &rows[k];
		if (!r->ran || strncmp(bench_modes[r->mode].name, "remap", 5) || r->fwd_wait_ms != r->fwd_wait_ms)
			continue;
		fprintf(f, "\n%s waited %.2f ms per iteration for maps before forward graphs (median %.1f us per layer, "
			"%.1f%% of the iteration) and %.2f ms for restores before backward graphs",
			bench_modes[r->mode].name, r->fwd_wait_ms, r->fwd_gap_us_median,
			100.0 * r->fwd_wait_ms / r->iter_ms_median, r->bwd_wait_ms);
		for (size_t q = 0; q < n; q++)
			if (rows[q].ran && !strcmp(bench_modes[rows[q].mode].name, "pingpong") &&
			    rows[q].fwd_wait_ms == rows[q].fwd_wait_ms)
				fprintf(f, " (pingpong: %.2f and %.2f ms, for its bank's D2H and for restores)",
					rows[q].fwd_wait_ms, rows[q].bwd_wait_ms);
		fprintf(f, "\n");
	}
	/* The driver calls per type, for the rows that made any. */
	bool header = false;
	for (size_t k = 0; k < n; k++) {
		const bench_result *r = &rows[k];
		if (!r->ran)
			continue;
		for (unsigned cidx = 0; cidx < VMMRT_DRIVER_CALLS; cidx++) {
			const vmmrt_driver_stats *s = &r->calls[cidx];
			if (!s->count)
				continue;
			if (!header) {
				fprintf(f, "\ndriver calls during the measured iterations (p50 / p99 / max us):\n");
				header = true;
			}
			fprintf(f, "  %-13s %-15s %8" PRIu64 " calls  %8.1f %8.1f %8.1f\n", bench_modes[r->mode].name,
				s->name ? s->name : "?", s->count, s->p50_us, s->p99_us, s->max_us);
		}
	}
}

void bench_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* JSON has no NaN: a value that was not measured is null. */
static void json_num(FILE *f, const char *key, double v, bool comma)
{
	fprintf(f, "\"%s\": ", key);
	if (isnan(v) || isinf(v))
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
	if (comma)
		fputs(", ", f);
}

static void json_row(FILE *f, const bench_result *r, bool with_ratio)
{
	fputs("    {", f);
	fputs("\"mode\": ", f);
	bench_json_string(f, bench_modes[r->mode].name);
	fputs(", ", f);
	if (with_ratio) {
		json_num(f, "copy_compute_ratio", r->ratio, true);
		json_num(f, "fwd_ms", r->p.fwd_ms, true);
		json_num(f, "bwd_ms", r->p.bwd_ms, true);
	}
	json_num(f, "iter_ms_median", r->ran ? r->iter_ms_median : NAN, true);
	json_num(f, "iter_ms_p90", r->ran ? r->iter_ms_p90 : NAN, true);
	json_num(f, "vs_graph_ratio", r->ran ? r->vs_graph_ratio : NAN, true);
	if (r->ran)
		fprintf(f, "\"activation_device_bytes\": %" PRId64 ", \"peak_device_bytes\": %" PRId64 ", ",
			r->activation_device_bytes, r->peak_device_bytes);
	else
		fputs("\"activation_device_bytes\": null, \"peak_device_bytes\": null, ", f);
	json_num(f, "d2h_gbps", r->ran ? r->d2h_gbps : NAN, true);
	json_num(f, "h2d_gbps", r->ran ? r->h2d_gbps : NAN, true);
	json_num(f, "bwd_gap_us_median", r->ran ? r->bwd_gap_us_median : NAN, true);
	json_num(f, "fwd_gap_us_median", r->ran ? r->fwd_gap_us_median : NAN, true);
	json_num(f, "fwd_wait_ms", r->ran ? r->fwd_wait_ms : NAN, true);
	json_num(f, "bwd_wait_ms", r->ran ? r->bwd_wait_ms : NAN, true);
	json_num(f, "driver_call_us_p99", r->ran ? r->driver_call_us_p99 : NAN, true);
	if (r->ran)
		fprintf(f, "\"launch_thread_blocking_calls\": %" PRIu64 ", ", r->launch_thread_blocking);
	else
		fputs("\"launch_thread_blocking_calls\": null, ", f);
	fprintf(f, "\"verified\": %s, ", r->ran && r->verified ? "true" : "false");
	/* beyond the fixed keys: what a reader needs to trust or question a row */
	fprintf(f, "\"expected_to_fail\": %s, \"as_expected\": %s, \"skipped\": %s, \"ran\": %s, ",
		bench_modes[r->mode].must_fail ? "true" : "false", bench_result_as_expected(r) ? "true" : "false",
		r->skipped ? "true" : "false", r->ran ? "true" : "false");
	/* copy_gbps_estimated: the bench no longer estimates the library's copies
	 * (it has no access to the runtime's copy streams): always false */
	fprintf(f, "\"checked\": %u, \"corrupted\": %u, \"copy_gbps_estimated\": false, ", r->checked, r->bad);
	if (r->pool_buffers)
		fprintf(f, "\"pool_buffers\": %u, ", r->pool_buffers);
	if (bench_modes[r->mode].lib_mode)
		fprintf(f, "\"library_activation_peak_bytes\": %" PRIu64 ", \"bank_conflicts\": %" PRIu64 ", "
			"\"banks\": %u, \"budget_groups\": %u, \"lookahead_in_force\": %u, \"bound_bytes\": %" PRIu64 ", ",
			r->lib_activation_peak_bytes, r->bank_conflicts, r->banks, r->budget_groups, r->lookahead_in_force,
			r->bound_bytes);
	fputs("\"driver_calls\": {", f);
	bool first = true;
	for (unsigned c = 0; c < VMMRT_DRIVER_CALLS; c++) {
		const vmmrt_driver_stats *s = &r->calls[c];
		if (!s->count || !s->name)
			continue;
		fprintf(f, "%s\"%s\": {\"count\": %" PRIu64 ", ", first ? "" : ", ", s->name, s->count);
		json_num(f, "p50_us", s->p50_us, true);
		json_num(f, "p99_us", s->p99_us, true);
		json_num(f, "max_us", s->max_us, false);
		fputc('}', f);
		first = false;
	}
	fputs("}, \"note\": ", f);
	bench_json_string(f, r->note);
	fputc('}', f);
}

int bench_write_json(const char *path, const bench_ctx *ctx, const bench_result *rows, size_t n,
		     const bench_result *sweep, size_t nsweep)
{
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "vmmrt-bench: --json %s: cannot write: %m\n", path);
		return -1;
	}
	const bench_params *p = &ctx->p;
	fputs("{\n  \"tool\": \"vmmrt-bench\", \"backend\": ", f);
	bench_json_string(f, ctx->backend);
	fputs(", \"device\": ", f);
	bench_json_string(f, ctx->device);
	fputs(", \"backend_note\": ", f);
	bench_json_string(f, ctx->backend_note);
	fprintf(f, ",\n  \"layers\": %u, \"activation_bytes\": %zu, ", p->layers, p->act_bytes);
	json_num(f, "activation_mib", (double)p->act_bytes / MiB_D, true);
	json_num(f, "fwd_ms", p->fwd_ms, true);
	json_num(f, "bwd_ms", p->bwd_ms, false);
	fprintf(f, ", \"iterations\": %u, \"warmup\": %u, \"lookahead\": %u, \"driver_workers\": %u, ", p->iterations,
		p->warmup, p->lookahead, p->workers);
	fprintf(f, "\"host_latency\": %s, \"preset\": ", ctx->host_latency ? "true" : "false");
	if (ctx->preset)
		bench_json_string(f, ctx->preset->name);
	else
		fputs("null", f);
	fputs(", ", f);
	json_num(f, "offload_fraction", ctx->preset ? ctx->offload_fraction : NAN, false);
	fputs(",\n  ", f);
	json_num(f, "raw_h2d_gbps", ctx->raw_h2d_gbps, true);
	json_num(f, "raw_d2h_gbps", ctx->raw_d2h_gbps, true);
	fprintf(f, "\"raw_copy_bytes\": %zu,\n  \"offload_budget\": [", ctx->raw_bytes);
	for (unsigned i = 0; i < BENCH_NPRESETS; i++) {
		const bench_preset *pr = &bench_presets[i];
		fprintf(f, "%s\n    {\"preset\": ", i ? "," : "");
		bench_json_string(f, pr->name);
		fputs(", ", f);
		json_num(f, "fwd_ms", pr->fwd_ms, true);
		json_num(f, "bwd_ms", pr->bwd_ms, true);
		json_num(f, "saved_mib", pr->saved_mib, true);
		json_num(f, "budget", bench_offload_budget(pr, ctx->raw_d2h_gbps), false);
		fputc('}', f);
	}
	fputs("],\n  \"modes\": [", f);
	for (size_t k = 0; k < n; k++) {
		fputs(k ? ",\n" : "\n", f);
		json_row(f, &rows[k], false);
	}
	fputs(n ? "\n  ]" : "]", f);
	if (sweep) {
		fputs(",\n  \"sweep\": [", f);
		for (size_t k = 0; k < nsweep; k++) {
			fputs(k ? ",\n" : "\n", f);
			json_row(f, &sweep[k], true);
		}
		fputs(nsweep ? "\n  ]" : "]", f);
	}
	bool ok = true;
	for (size_t k = 0; k < n; k++)
		ok &= bench_result_as_expected(&rows[k]);
	for (size_t k = 0; k < nsweep; k++)
		ok &= bench_result_as_expected(&sweep[k]);
	fprintf(f, ",\n  \"all_as_expected\": %s\n}\n", ok ? "true" : "false");
	if (fclose(f) != 0) {
		fprintf(stderr, "vmmrt-bench: --json %s: write failed: %m\n", path);
		return -1;
	}
	return 0;
}

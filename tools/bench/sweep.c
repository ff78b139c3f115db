/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * --sweep: where does offload stop being free? At fixed activation bytes, the
 * compute time is varied so that the copy/compute ratio (the D2H time of one
 * activation at the measured raw bandwidth over one forward's time) runs over
 * a range; graph, pingpong and remap run at each point, and the overhead of
 * the two strategies against graph is plotted as an SVG written here by hand
 * (axes, one polyline per mode, a legend), so the bench needs no plotting
 * library.
 */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static const bench_mode_id sweep_modes[] = {BM_GRAPH, BM_PINGPONG, BM_REMAP};
#define NSWEEP_MODES (sizeof(sweep_modes) / sizeof(sweep_modes[0]))

int bench_sweep(bench_ctx *ctx, const double *ratios, unsigned nratios, bench_result **rows, size_t *nrows)
{
	const bench_params *p = &ctx->p;
	if (!(ctx->raw_d2h_gbps > 0)) {
		fprintf(stderr, "vmmrt-bench: --sweep needs the raw D2H bandwidth, which could not be measured\n");
		return -1;
	}
	bench_result *out = calloc((size_t)nratios * NSWEEP_MODES, sizeof(*out));
	if (!out) {
		fprintf(stderr, "vmmrt-bench: --sweep: out of host memory\n");
		return -1;
	}
	/* copy time of one activation at the raw bandwidth, in ms */
	double copy_ms = (double)p->act_bytes / (ctx->raw_d2h_gbps * 1e6);
	double bwd_per_fwd = p->fwd_ms > 0 ? p->bwd_ms / p->fwd_ms : 2.0;
	size_t n = 0;

	printf("sweep: %u layers x %.1f MiB, copy %.3f ms per activation at %.1f GB/s; backward = %.2f x forward\n",
	       p->layers, (double)p->act_bytes / MiB_D, copy_ms, ctx->raw_d2h_gbps, bwd_per_fwd);
	printf("%8s %9s %11s %11s %11s %11s %11s  %s\n", "ratio", "fwd ms", "graph ms", "pingpong ms", "overhead",
	       "remap ms", "overhead", "verified");
	fflush(stdout);
	for (unsigned k = 0; k < nratios; k++) {
		bench_params q = *p;
		q.fwd_ms = copy_ms / ratios[k];
		q.bwd_ms = q.fwd_ms * bwd_per_fwd;
		bench_result *pt = &out[n];
		for (size_t m = 0; m < NSWEEP_MODES; m++) {
			bench_run_mode(ctx, sweep_modes[m], &q, &out[n]);
			out[n].ratio = ratios[k];
			n++;
		}
		double g = pt[0].ran ? pt[0].iter_ms_median : NAN;
		bool ok = true;
		for (size_t m = 0; m < NSWEEP_MODES; m++) {
			pt[m].vs_graph_ratio = pt[m].ran && g > 0 ? pt[m].iter_ms_median / g : NAN;
			ok &= bench_result_as_expected(&pt[m]);
		}
		printf("%8.3f %9.3f %11.2f %11.2f %10.1f%% %11.2f %10.1f%%  %s\n", ratios[k], q.fwd_ms, g,
		       pt[1].iter_ms_median, (pt[1].vs_graph_ratio - 1) * 100, pt[2].iter_ms_median,
		       (pt[2].vs_graph_ratio - 1) * 100, ok ? "yes" : "NO");
		fflush(stdout);
	}
	*rows = out;
	*nrows = n;
	return 0;
}

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '&': fputs("&amp;", f); break;
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*s, f);
		}
	}
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double range, int want)
{
	double raw = range / want;
	double p10 = pow(10, floor(log10(raw)));
	double m = raw / p10;
	return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p10;
}

int bench_write_svg(const char *path, const bench_ctx *ctx, const bench_result *rows, size_t n)
{
	static const struct {
		bench_mode_id mode;
		const char *color;
		const char *dash;
	} series[] = {{BM_GRAPH, "#7f7f7f", "6,4"}, {BM_PINGPONG, "#1f77b4", ""}, {BM_REMAP, "#d62728", ""}};
	const double W = 760, H = 460, ml = 80, mr = 170, mt = 60, mb = 70;
	const double pw = W - ml - mr, ph = H - mt - mb;

	double xmax = 0, ymin = 0, ymax = 1;
	for (size_t k = 0; k < n; k++) {
		if (rows[k].ratio > xmax)
			xmax = rows[k].ratio;
		double y = (rows[k].vs_graph_ratio - 1) * 100;
		if (!isnan(y)) {
			if (y < ymin)
				ymin = y;
			if (y > ymax)
				ymax = y;
		}
	}
	if (xmax <= 0)
		xmax = 1;
	double xstep = nice_step(xmax, 6), ystep = nice_step(ymax - ymin, 6);
	xmax = ceil(xmax / xstep) * xstep;
	ymin = floor(ymin / ystep) * ystep;
	ymax = ceil(ymax / ystep) * ystep;
	if (ymax <= ymin)
		ymax = ymin + ystep;

	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "vmmrt-bench: --sweep-out %s: cannot write: %m\n", path);
		return -1;
	}
#define X(v) (ml + (v) / xmax * pw)
#define Y(v) (mt + ph - ((v) - ymin) / (ymax - ymin) * ph)
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
		   "font-family=\"sans-serif\" font-size=\"12\">\n",
		W, H, W, H);
	fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
	fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">libvmmrt offload overhead vs graph</text>\n",
		ml);
	fprintf(f, "<text x=\"%.0f\" y=\"42\" fill=\"#444\">", ml);
	char sub[256];
	snprintf(sub, sizeof(sub), "%s backend, %s; %u layers x %.1f MiB, %u iterations, look-ahead %u", ctx->backend,
		 ctx->device, ctx->p.layers, (double)ctx->p.act_bytes / MiB_D, ctx->p.iterations, ctx->p.lookahead);
	xml_text(f, sub);
	fputs("</text>\n", f);

	/* grid and tick labels */
	for (double x = 0; x <= xmax + xstep / 2; x += xstep) {
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", X(x), Y(ymin), X(x),
			Y(ymax));
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", X(x), Y(ymin) + 18, x);
	}
	for (double y = ymin; y <= ymax + ystep / 2; y += ystep) {
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>\n", X(0), Y(y), X(xmax),
			Y(y));
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", X(0) - 6, Y(y) + 4,
			fabs(y) < ystep / 1000 ? 0.0 : y);
	}
	/* axes */
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", X(0), Y(ymin), X(xmax),
		Y(ymin));
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", X(0), Y(ymin), X(0),
		Y(ymax));
	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">copy/compute ratio (D2H time of one activation / "
		   "forward time)</text>\n",
		ml + pw / 2, H - 22);
	fprintf(f, "<text transform=\"translate(22 %.1f) rotate(-90)\" text-anchor=\"middle\">iteration time vs graph "
		   "(%% overhead)</text>\n",
		mt + ph / 2);

	/* one line per mode, broken where a point did not run */
	for (size_t s = 0; s < sizeof(series) / sizeof(series[0]); s++) {
		fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s%s%s d=\"", series[s].color,
			series[s].dash[0] ? " stroke-dasharray=\"" : "", series[s].dash, series[s].dash[0] ? "\"" : "");
		bool pen = false;
		for (size_t k = 0; k < n; k++) {
			if (rows[k].mode != series[s].mode)
				continue;
			double y = (rows[k].vs_graph_ratio - 1) * 100;
			if (isnan(y)) {
				pen = false;
				continue;
			}
			fprintf(f, "%s%.1f %.1f ", pen ? "L" : "M", X(rows[k].ratio), Y(y));
			pen = true;
		}
		fputs("\"/>\n", f);
		for (size_t k = 0; k < n; k++) {
			double y = (rows[k].vs_graph_ratio - 1) * 100;
			if (rows[k].mode != series[s].mode || isnan(y))
				continue;
			/* a point that failed verification is hollow */
			bool ok = bench_result_as_expected(&rows[k]);
			fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"%s\"><title>%s ratio %g: "
				   "%+.1f%%%s</title></circle>\n",
				X(rows[k].ratio), Y(y), ok ? series[s].color : "white", series[s].color,
				bench_modes[series[s].mode].name, rows[k].ratio, y, ok ? "" : " (verification failed)");
		}
	}
	/* legend */
	double lx = ml + pw + 20, ly = mt + 10;
	fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"140\" height=\"78\" fill=\"white\" stroke=\"#999\"/>\n", lx - 8,
		ly - 4);
	for (size_t s = 0; s < sizeof(series) / sizeof(series[0]); s++) {
		double y = ly + 14 + 22 * (double)s;
		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/>\n",
			lx, y - 4, lx + 26, y - 4, series[s].color, series[s].dash[0] ? " stroke-dasharray=\"" : "",
			series[s].dash, series[s].dash[0] ? "\"" : "");
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", lx + 34, y, bench_modes[series[s].mode].name);
	}
#undef X
#undef Y
	fputs("</svg>\n", f);
	if (fclose(f) != 0) {
		fprintf(stderr, "vmmrt-bench: --sweep-out %s: write failed: %m\n", path);
		return -1;
	}
	return 0;
}

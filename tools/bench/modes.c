/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The seven ways of running the synthetic model (its order and its layers:
 * tools/model/synth.h).
 *
 * L layers. Forward of layer i: act_i = input ^ pattern(1000 + i), lasting
 * fwd_ms, then a checksum of act_i into fwd_sum[i]. Backward of layer i: busy
 * for bwd_ms, then a checksum of the activation it reads into bwd_sum[i]
 * (computing first, so a restore that lands late or overwrites early is seen).
 * The input is refilled with the iteration's seed, so no iteration's bytes
 * equal another's. Verification: bwd_sum == fwd_sum for every layer of every
 * iteration, and the first iteration's fwd_sum against the host's own
 * computation (layers 0 and L-1), so that two wrong sums cannot agree.
 *
 * Each mode gets its own runtime; all run the same iterations, with one
 * synchronization at the end of each (outside the timed region), so every
 * iteration starts from an idle device and stands on its own.
 */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

const bench_mode_desc bench_modes[BM_COUNT_] = {
	[BM_EAGER] = {"eager", "no graph, no offload: kernels launched directly, activations resident", false, false,
		      NULL, false},
	[BM_EAGER_OFFLOAD] = {"eager-offload",
			      "no graph; D2H after the forward, reload into whatever pool buffer is free "
			      "(the kernels get the new address)",
			      false, true, NULL, false},
	[BM_GRAPH] = {"graph", "whole-layer graphs, activations resident (runtime mode=none): the baseline", true,
		      false, "none", false},
	[BM_PINGPONG] = {"pingpong", "graphs + libvmmrt offload into two resident banks (mode=pingpong)", true, true,
			 "pingpong", false},
	[BM_REMAP] = {"remap",
		      "graphs + libvmmrt offload, release after D2H and create+map before H2D on the driver "
		      "workers (mode=remap)",
		      true, true, "remap", false},
	[BM_REMAP_INLINE] = {"remap-inline",
			     "remap with the driver calls made on the launch thread (driver_inline=1, "
			     "checked_threads=0)",
			     true, true, "remap", false},
	[BM_NAIVE] = {"naive",
		      "graphs + reload into a fresh pool buffer: the backward graph still reads the captured "
		      "address, which another layer rewrote (must FAIL verification)",
		      true, true, NULL, true},
};

const char *volatile bench_current_mode;

int bench_mode_find(const char *name)
{
	for (int i = 0; i < BM_COUNT_; i++)
		if (strcmp(name, bench_modes[i].name) == 0)
			return i;
	return -1;
}

bool bench_result_as_expected(const bench_result *r)
{
	if (r->skipped)
		return true;
	if (!r->ran)
		return false;
	return bench_modes[r->mode].must_fail ? !r->verified : r->verified;
}

vmmrt_status bench_failed(model *m, vmmrt_status st, const char *fmt, ...)
{
	if (!m->err[0]) {
		char what[160];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(what, sizeof(what), fmt, ap);
		va_end(ap);
		snprintf(m->err, sizeof(m->err), "%s: %s (%s)", what, vmmrt_last_error(), vmmrt_status_name(st));
	}
	return st;
}

static vmmrt_status capture(model *m, unsigned i, vmmrt_devptr a)
{
	vmmrt_status st;
	for (int dir = 0; dir < 2; dir++) {
		const char *what = dir ? "backward" : "forward";
		TRY(m, vmmrt_graph_begin_capture(m->rt, m->compute), "capture of layer %u's %s", i, what);
		st = dir ? bench_enqueue_backward(m, a, i) : bench_enqueue_forward(m, a, i);
		/* end the capture even after a failure, so the stream is usable again */
		vmmrt_graph *gr = NULL;
		vmmrt_status st2 = vmmrt_graph_end_capture(m->rt, m->compute, &gr);
		*(dir ? &m->bwd[i] : &m->fwd[i]) = gr; /* destroyed at teardown, even if unused */
		if (st != VMMRT_OK)
			return st;
		if (st2 != VMMRT_OK)
			return bench_failed(m, st2, "capture of layer %u's %s", i, what);
	}
	return VMMRT_OK;
}

static vmmrt_status new_slot(model *m, size_t bytes, vmmrt_slot **out, const char *what)
{
	TRY(m, vmmrt_slot_create(m->rt, bytes, out), "reserve %s (%zu bytes)", what, bytes);
	TRY(m, vmmrt_slot_map(*out), "map %s (%zu bytes)", what, bytes);
	return VMMRT_OK;
}

static void *xcalloc(model *m, size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	if (!p)
		bench_failed(m, VMMRT_E_HOST_OUT_OF_MEMORY, "host memory for %zu x %zu bytes", n, size);
	return p;
}

/* The runtime options of this mode: the command line's, then the mode's own. */
static vmmrt_status mode_options(model *m, vmmrt_options *o)
{
	const char *mode = m->md->lib_mode ? m->md->lib_mode : "none";
	TRY(m, vmmrt_options_set(o, "mode", mode), "option mode=%s", mode);
	if (m->id == BM_REMAP_INLINE) {
		if (!bench_option_exists("driver_inline")) {
			m->skip = true;
			snprintf(m->err, sizeof(m->err),
				 "this libvmmrt has no driver_inline option yet: remap-inline cannot run");
			return VMMRT_E_NOT_SUPPORTED;
		}
		TRY(m, vmmrt_options_set(o, "driver_inline", "1"), "option driver_inline=1");
		TRY(m, vmmrt_options_set(o, "checked_threads", "0"), "option checked_threads=0");
	}
	TRY(m, bench_trace_option(m->ctx, o), "option trace=%s", m->ctx->trace_path);
	return VMMRT_OK;
}

/* The runtime of this mode, with its options. */
static vmmrt_status mode_runtime(model *m)
{
	vmmrt_options *o = NULL;
	vmmrt_status st;
	TRY(m, bench_options_new(m->ctx, &o), "runtime options");
	if ((st = mode_options(m, o)) == VMMRT_OK && (st = vmmrt_runtime_create(o, &m->rt)) != VMMRT_OK)
		bench_failed(m, st, "runtime for mode %s", m->md->name);
	vmmrt_options_destroy(o);
	return st;
}

/* The environment (VMMRT_*) overrides the command line and the mode: say so
 * when that changes what this row means. */
static vmmrt_status check_runtime(model *m)
{
	vmmrt_runtime_info info = {.size = sizeof(info)};
	TRY(m, vmmrt_runtime_info_get(m->rt, &info), "runtime info");
	if (m->md->lib_mode) {
		vmmrt_mode want = strcmp(m->md->lib_mode, "pingpong") == 0 ? VMMRT_MODE_PINGPONG
				  : strcmp(m->md->lib_mode, "remap") == 0  ? VMMRT_MODE_REMAP
									   : VMMRT_MODE_NONE;
		if (info.mode != want) {
			m->skip = true;
			snprintf(m->err, sizeof(m->err),
				 "VMMRT_MODE in the environment overrides mode=%s (unset it to compare modes)",
				 m->md->lib_mode);
			return VMMRT_E_INVALID_OPTION;
		}
	}
	if (m->id == BM_REMAP_INLINE) {
		bool inline_calls, checked;
		TRY(m, bench_runtime_flag(m->ctx, m->rt, "driver_inline", &inline_calls), "option driver_inline");
		TRY(m, bench_runtime_flag(m->ctx, m->rt, "checked_threads", &checked), "option checked_threads");
		checked = checked && !inline_calls; /* driver_inline turns checked_threads off (vmmrt(7)) */
		if (!inline_calls || checked) {
			m->skip = true;
			snprintf(m->err, sizeof(m->err),
				 "VMMRT_DRIVER_INLINE=0 or VMMRT_CHECKED_THREADS=1 in the environment overrides what "
				 "remap-inline needs (driver_inline=1, checked_threads=0)");
			return VMMRT_E_INVALID_OPTION;
		}
	}
	return VMMRT_OK;
}

/*
 * The order of an iteration (synth_order): all forwards, then the backwards
 * in reverse; or one pipeline stage's 1F1B.
 */
static vmmrt_status make_order(model *m)
{
	unsigned R = m->L, nb = 0;
	if (!(m->use_runner = xcalloc(m, 2 * R, sizeof(*m->use_runner))) ||
	    !(m->use_bwd = xcalloc(m, 2 * R, sizeof(*m->use_bwd))) ||
	    !(m->after_forward = xcalloc(m, R, sizeof(*m->after_forward))))
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	synth_order_cfg o = {.schedule = m->p.one_f_one_b ? "1f1b" : "afab",
			     .layers = m->p.one_f_one_b ? m->p.layers : R,
			     .microbatches = m->p.one_f_one_b ? m->p.microbatches : 1,
			     .inflight = m->p.inflight};
	TRY(m, synth_order(&o, m->use_runner, m->use_bwd), "the order of %u layers", R);
	for (unsigned u = 0; u < 2 * R; u++)
		if (m->use_bwd[u])
			m->after_forward[nb++] = u > 0 && !m->use_bwd[u - 1];
	return VMMRT_OK;
}

/* The library's groups learn the order before allocation: ping-pong makes
 * the banks it needs from it (vmmrt_offload_set_schedule(3)). */
static vmmrt_status declare_order(model *m)
{
	TRY(m, synth_declare(m->rt, m->g, m->use_runner, m->use_bwd, 2 * m->L), "the 1F1B schedule");
	return VMMRT_OK;
}

static vmmrt_status model_setup(model *m)
{
	unsigned L = m->L;
	size_t total;

	if (m->p.one_f_one_b && bench_is_pool_mode(m)) {
		m->skip = true;
		snprintf(m->err, sizeof(m->err), "the pool modes model all forwards, then all backwards only");
		return VMMRT_E_NOT_SUPPORTED;
	}
	if (make_order(m) != VMMRT_OK)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	if (mode_runtime(m) != VMMRT_OK)
		return VMMRT_E_INVALID_OPTION;
	m->created_ns = bench_now_ns();
	m->traced = bench_trace_check(m->ctx, m->rt, m->md->name);
	if (check_runtime(m) != VMMRT_OK)
		return VMMRT_E_INVALID_OPTION;
	TRY(m, vmmrt_mem_info(m->rt, &m->base_free, &total), "device memory info");

	TRY(m, vmmrt_stream_create(m->rt, &m->compute), "compute stream");
	if (bench_is_pool_mode(m)) {
		TRY(m, vmmrt_stream_create(m->rt, &m->d2h), "D2H stream");
		TRY(m, vmmrt_stream_create(m->rt, &m->h2d), "H2D stream");
	}
	if (new_slot(m, m->A, &m->input, "the input") != VMMRT_OK ||
	    new_slot(m, 16 * (size_t)L, &m->results, "the checksums") != VMMRT_OK)
		return VMMRT_E_OUT_OF_MEMORY;
	m->input_addr = vmmrt_slot_address(m->input);
	m->res_addr = vmmrt_slot_address(m->results);
	TRY(m, vmmrt_host_alloc(m->rt, (size_t)m->iters_total * 16 * L, (void **)&m->host_results),
	    "pinned memory for %u iterations of checksums", m->iters_total);
	memset(m->host_results, 0, (size_t)m->iters_total * 16 * L);
	/* What the bench itself holds; activations are measured from here. */
	TRY(m, vmmrt_mem_info(m->rt, &m->fixed_free, &total), "device memory info");

	m->fwd = xcalloc(m, L, sizeof(*m->fwd));
	m->bwd = xcalloc(m, L, sizeof(*m->bwd));
	if (!m->fwd || !m->bwd)
		return VMMRT_E_HOST_OUT_OF_MEMORY;

	switch (m->id) {
	case BM_EAGER:
		if (!(m->act = xcalloc(m, L, sizeof(*m->act))))
			return VMMRT_E_HOST_OUT_OF_MEMORY;
		for (unsigned i = 0; i < L; i++)
			if (new_slot(m, m->A, &m->act[i], "an activation") != VMMRT_OK)
				return VMMRT_E_OUT_OF_MEMORY;
		break;
	case BM_EAGER_OFFLOAD:
	case BM_NAIVE: {
		/* One buffer being read by the backward, `lookahead` being reloaded, one
		 * more for the forward's D2H in flight; never more than the layers. */
		unsigned P = m->p.lookahead + 2 < L ? m->p.lookahead + 2 : L;
		if (P < 2)
			P = 2;
		pool *pl = &m->pool;
		pl->n = P;
		if (!(pl->slot = xcalloc(m, P, sizeof(*pl->slot))) || !(pl->addr = xcalloc(m, P, sizeof(*pl->addr))) ||
		    !(pl->free_ev = xcalloc(m, P, sizeof(*pl->free_ev))) || !(pl->fifo = xcalloc(m, P, sizeof(*pl->fifo))) ||
		    !(m->fwd_buf = xcalloc(m, L, sizeof(*m->fwd_buf))) || !(m->bwd_buf = xcalloc(m, L, sizeof(*m->bwd_buf))) ||
		    !(m->d2h_done = xcalloc(m, L, sizeof(*m->d2h_done))) ||
		    !(m->h2d_done = xcalloc(m, L, sizeof(*m->h2d_done))) || !(m->host = xcalloc(m, L, sizeof(*m->host))) ||
		    !(m->cap_buf = xcalloc(m, L, sizeof(*m->cap_buf))))
			return VMMRT_E_HOST_OUT_OF_MEMORY;
		for (unsigned b = 0; b < P; b++) {
			if (new_slot(m, m->A, &pl->slot[b], "a pool buffer") != VMMRT_OK)
				return VMMRT_E_OUT_OF_MEMORY;
			pl->addr[b] = vmmrt_slot_address(pl->slot[b]);
			bench_pool_give(pl, b, NULL);
		}
		for (unsigned i = 0; i + 1 < L; i++) /* the tail's activation never leaves */
			TRY(m, vmmrt_host_alloc(m->rt, m->A, &m->host[i]), "pinned copy of layer %u", i);
		if (m->id == BM_NAIVE) {
			/* The forwards share the first min(P, L-1) buffers: with fewer buffers
			 * than layers, a later layer's forward rewrites an earlier layer's
			 * captured buffer (the interloper), and a free buffer is left for
			 * the reloads. */
			unsigned pn = P < L - 1 ? P : L - 1;
			for (unsigned i = 0; i < L; i++) {
				m->cap_buf[i] = i % pn;
				if (capture(m, i, pl->addr[m->cap_buf[i]]) != VMMRT_OK)
					return VMMRT_E_CAPTURE;
			}
		}
		break;
	}
	default: {
		/* The library's groups: discovery, allocation, then capture at the slot's address. */
		if (!(m->g = xcalloc(m, L, sizeof(*m->g))) || !(m->gaddr = xcalloc(m, L, sizeof(*m->gaddr))))
			return VMMRT_E_HOST_OUT_OF_MEMORY;
		vmmrt_tensor_desc d = {.bytes = m->A, .dtype = 7, .ndim = 1, .shape = {(int64_t)(m->A / 8)}, .stride = {1}};
		for (unsigned i = 0; i < L; i++) {
			char name[24];
			if (m->p.one_f_one_b)
				snprintf(name, sizeof(name), "L%u.m%u", i % m->p.layers, i / m->p.layers);
			else
				snprintf(name, sizeof(name), "L%u", i);
			TRY(m, vmmrt_group_create(m->rt, name, &m->g[i]), "group of layer %u", i);
			TRY(m, vmmrt_group_discover(m->g[i], &d), "discovery of layer %u", i);
		}
		if (m->p.one_f_one_b && declare_order(m) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
		TRY(m, vmmrt_offload_allocate(m->rt), "offload allocation (%u groups of %zu bytes)", L, m->A);
		m->allocated = true;
		for (unsigned i = 0; i < L; i++) {
			TRY(m, vmmrt_group_begin_capture(m->g[i]), "group capture of layer %u", i);
			TRY(m, vmmrt_group_save(m->g[i], &d, 0, NULL, &m->gaddr[i]), "saving layer %u's activation", i);
			TRY(m, vmmrt_group_end_capture(m->g[i]), "group capture of layer %u", i);
			if (capture(m, i, m->gaddr[i]) != VMMRT_OK)
				return VMMRT_E_CAPTURE;
		}
		break;
	}
	}
	TRY(m, bench_timing_create(m->rt, L, &m->tm), "timing events");
	m->tm.after_forward = m->p.one_f_one_b ? m->after_forward : NULL;
	return VMMRT_OK;
}

static void model_teardown(model *m)
{
	vmmrt_runtime *rt = m->rt;
	if (!rt)
		return;
	/* Nothing may be in flight when memory is freed. */
	if (m->compute)
		(void)vmmrt_stream_synchronize(rt, m->compute);
	if (m->d2h)
		(void)vmmrt_stream_synchronize(rt, m->d2h);
	if (m->h2d)
		(void)vmmrt_stream_synchronize(rt, m->h2d);
	if (m->allocated)
		(void)vmmrt_offload_sync(rt);
	for (unsigned i = 0; i < m->L; i++) {
		if (m->fwd && m->fwd[i])
			(void)vmmrt_graph_destroy(rt, m->fwd[i]);
		if (m->bwd && m->bwd[i])
			(void)vmmrt_graph_destroy(rt, m->bwd[i]);
		if (m->act && m->act[i])
			(void)vmmrt_slot_destroy(m->act[i]);
		if (m->host && m->host[i])
			(void)vmmrt_host_free(rt, m->host[i]);
	}
	for (unsigned b = 0; m->pool.slot && b < m->pool.n; b++)
		if (m->pool.slot[b])
			(void)vmmrt_slot_destroy(m->pool.slot[b]);
	bench_timing_destroy(&m->tm);
	if (m->input)
		(void)vmmrt_slot_destroy(m->input);
	if (m->results)
		(void)vmmrt_slot_destroy(m->results);
	if (m->host_results)
		(void)vmmrt_host_free(rt, m->host_results);
	vmmrt_stream s[] = {m->compute, m->d2h, m->h2d};
	for (unsigned i = 0; i < 3; i++)
		if (s[i])
			(void)vmmrt_stream_destroy(rt, s[i]);
	if (m->traced)
		bench_trace_mark(m->ctx, rt, m->md->name, m->created_ns);
	/* Groups belong to the runtime: destroy frees them with their slots; it
	 * writes the runtime's trace. */
	if (vmmrt_runtime_destroy(rt) != VMMRT_OK)
		fprintf(stderr, "vmmrt-bench: %s: runtime destroy: %s\n", m->md->name, vmmrt_last_error());
	m->rt = NULL;
	if (m->traced)
		bench_trace_absorb(m->ctx, m->md->name, m->created_ns);
	free(m->fwd);
	free(m->bwd);
	free(m->use_runner);
	free(m->use_bwd);
	free(m->after_forward);
	free(m->act);
	free(m->pool.slot);
	free(m->pool.addr);
	free(m->pool.free_ev);
	free(m->pool.fifo);
	free(m->fwd_buf);
	free(m->bwd_buf);
	free(m->d2h_done);
	free(m->h2d_done);
	free(m->host);
	free(m->cap_buf);
	free(m->g);
	free(m->gaddr);
}

/* The blocking calls application threads have made on rt so far (the offload
 * statistics count them in every mode, with or without groups). */
static uint64_t blocking_now(vmmrt_runtime *rt)
{
	vmmrt_offload_stats s = {.size = sizeof(s)};
	return vmmrt_offload_stats_get(rt, &s) == VMMRT_OK ? s.launch_thread_blocking : 0;
}

/* ----------------------------------------------------------- verification */

static void verify(model *m, bench_result *r)
{
	unsigned L = m->L;
	bench_ctx *ctx = m->ctx;
	r->checked = r->bad = 0;
	for (unsigned it = 0; it < m->iters_run; it++)
		for (unsigned i = 0; i < L; i++) {
			const uint64_t *row = &m->host_results[(size_t)it * 2 * L];
			r->checked++;
			if (row[i] != row[L + i]) {
				if (!r->bad) {
					r->first_bad_iter = it;
					r->first_bad_layer = i;
				}
				r->bad++;
			}
		}
	/* The forward sums of iteration 0 against the host's own arithmetic:
	 * layers 0 and L-1 (the others differ only by the seed). */
	if (m->iters_run) {
		if (ctx->expect_bytes != m->A || ctx->expect_layers != L) {
			ctx->expect[0] = vmmrt_layer_checksum_host(m->A, 1, 1000);
			ctx->expect[1] = vmmrt_layer_checksum_host(m->A, 1, 1000 + L - 1);
			ctx->expect_bytes = m->A;
			ctx->expect_layers = L;
		}
		unsigned layers[2] = {0, L - 1};
		for (unsigned k = 0; k < 2; k++)
			if (m->host_results[layers[k]] != ctx->expect[k]) {
				r->bad++;
				r->checked++;
				snprintf(r->note, sizeof(r->note),
					 "the forward checksum of layer %u differs from the host's: the device "
					 "kernels do not compute what the bench expects",
					 layers[k]);
			}
	}
	r->verified = r->checked > 0 && r->bad == 0;
}

/* ------------------------------------------------------------------- run */

static void fill_result(model *m, bench_acc *acc, bench_result *r)
{
	r->iter_ms_median = bench_percentile(acc->iter_ms, acc->n_iter, 0.5);
	r->iter_ms_p90 = bench_percentile(acc->iter_ms, acc->n_iter, 0.9);
	r->bwd_gap_us_median = bench_percentile(acc->gap_us, acc->n_gap, 0.5);
	r->fwd_gap_us_median = acc->n_fwd_gap ? bench_percentile(acc->fwd_gap_us, acc->n_fwd_gap, 0.5) : NAN;
	r->fwd_wait_ms = acc->n_iter && acc->n_fwd_gap ? acc->fwd_wait_ms / (double)acc->n_iter : NAN;
	r->bwd_wait_ms = acc->n_iter ? acc->bwd_wait_ms / (double)acc->n_iter : NAN;
	r->launch_thread_blocking = acc->blocking;
	r->d2h_gbps = r->h2d_gbps = NAN;
	if (m->md->offload) {
		/* the library's copies from its statistics, the bench's from its own events */
		bool lib = m->md->lib_mode != NULL;
		double d2h_ms = lib ? acc->lib_d2h_ms : acc->span_d2h_ms, h2d_ms = lib ? acc->lib_h2d_ms : acc->span_h2d_ms;
		uint64_t d2h_b = lib ? acc->lib_d2h_bytes : acc->span_d2h_bytes;
		uint64_t h2d_b = lib ? acc->lib_h2d_bytes : acc->span_h2d_bytes;
		if (d2h_b && d2h_ms > 0)
			r->d2h_gbps = (double)d2h_b / (d2h_ms * 1e6);
		if (h2d_b && h2d_ms > 0)
			r->h2d_gbps = (double)h2d_b / (h2d_ms * 1e6);
	}
	r->driver_call_us_p99 = NAN;
	for (unsigned c = 0; c < VMMRT_DRIVER_CALLS; c++) {
		r->calls[c].size = sizeof(r->calls[c]);
		if (vmmrt_driver_stats_get(m->rt, c, &r->calls[c]) != VMMRT_OK)
			continue;
		if (r->calls[c].count && (isnan(r->driver_call_us_p99) || r->calls[c].p99_us > r->driver_call_us_p99))
			r->driver_call_us_p99 = r->calls[c].p99_us;
	}
}

static vmmrt_status run_all(model *m, bench_result *r)
{
	bench_acc acc;
	bench_sampler *sampler = NULL;
	vmmrt_status st;
	uint64_t conflicts0 = 0;
	bool lib_offload = m->md->lib_mode && m->md->offload;

	if ((st = bench_acc_init(&acc, m->p.iterations, m->L)) != VMMRT_OK)
		return bench_failed(m, st, "host memory for the measurements");
	for (unsigned w = 0; w < m->p.warmup; w++) {
		if ((st = bench_run_iteration(m, m->iters_run)) != VMMRT_OK || (st = bench_iteration_sync(m)) != VMMRT_OK)
			goto out;
		m->iters_run++;
	}

	/* The measured window: statistics from zero, memory sampled throughout. */
	if ((st = vmmrt_driver_stats_reset(m->rt)) != VMMRT_OK) {
		bench_failed(m, st, "driver statistics reset");
		goto out;
	}
	if (m->ctx->trace && (st = bench_trace_align(&m->tm, m->compute)) != VMMRT_OK) {
		bench_failed(m, st, "trace: aligning the device clock");
		goto out;
	}
	if (m->md->lib_mode) {
		/* the activation peak from the steady state, not from allocation */
		vmmrt_offload_stats s = {.size = sizeof(s)};
		if ((st = vmmrt_offload_stats_reset(m->rt)) != VMMRT_OK) {
			bench_failed(m, st, "offload statistics reset");
			goto out;
		}
		if (vmmrt_offload_stats_get(m->rt, &s) == VMMRT_OK)
			conflicts0 = s.bank_conflicts;
	}
	if ((st = bench_sampler_start(m->rt, &sampler)) != VMMRT_OK) {
		bench_failed(m, st, "memory sampler");
		goto out;
	}
	for (unsigned n = 0; n < m->p.iterations; n++) {
		unsigned it = m->iters_run;
		/* Only the hooks' blocking calls: counted before this iteration's sync. */
		uint64_t b0 = blocking_now(m->rt);
		if ((st = bench_run_iteration(m, it)) != VMMRT_OK)
			break;
		acc.blocking += blocking_now(m->rt) - b0;
		if ((st = bench_iteration_sync(m)) != VMMRT_OK)
			break;
		m->iters_run++;
		if (lib_offload) {
			vmmrt_offload_stats s = {.size = sizeof(s)};
			if (vmmrt_offload_stats_get(m->rt, &s) == VMMRT_OK) {
				acc.lib_d2h_ms += s.last_d2h_ms;
				acc.lib_h2d_ms += s.last_h2d_ms;
				acc.lib_d2h_bytes += s.last_d2h_bytes;
				acc.lib_h2d_bytes += s.last_h2d_bytes;
			}
		}
		if ((st = bench_timing_collect(&m->tm, &acc, m->ctx, m->md->name, n)) != VMMRT_OK) {
			bench_failed(m, st, "reading the timing events");
			break;
		}
	}
	size_t min_free;
	int64_t median_used;
	bench_sampler_stop(sampler, m->fixed_free, &min_free, &median_used);
	if (st != VMMRT_OK)
		goto out;
	r->activation_device_bytes = median_used;
	r->peak_device_bytes = min_free <= m->base_free ? (int64_t)(m->base_free - min_free) : 0;
	if (m->md->lib_mode) {
		vmmrt_offload_stats s = {.size = sizeof(s)};
		if (vmmrt_offload_stats_get(m->rt, &s) == VMMRT_OK) {
			r->lib_activation_peak_bytes = s.activation_peak_bytes;
			r->bank_conflicts = s.bank_conflicts - conflicts0;
			r->banks = s.banks;
			r->budget_groups = s.budget_groups;
			r->lookahead_in_force = s.lookahead_in_force;
			r->bound_bytes = s.bound_bytes;
		}
	}
	fill_result(m, &acc, r);
	if (m->ctx->trace && acc.trace_last_ns)
		bench_trace_span(m->ctx, m->rt, "bench", acc.trace_first_ns, acc.trace_last_ns, "%s (%u iterations)",
				 m->md->name, m->p.iterations);
	r->ran = true;
out:
	bench_acc_free(&acc);
	return st;
}

void bench_run_mode(bench_ctx *ctx, bench_mode_id id, const bench_params *p, bench_result *r)
{
	model m = {.ctx = ctx, .id = id, .md = &bench_modes[id], .p = *p,
		   .L = p->layers * (p->one_f_one_b ? p->microbatches : 1), .A = p->act_bytes};
	m.iters_total = p->warmup + p->iterations;
	memset(r, 0, sizeof(*r));
	r->mode = id;
	r->p = *p;
	r->vs_graph_ratio = r->iter_ms_median = r->iter_ms_p90 = r->bwd_gap_us_median = r->fwd_gap_us_median = NAN;
	r->fwd_wait_ms = r->bwd_wait_ms = NAN;
	r->d2h_gbps = r->h2d_gbps = r->driver_call_us_p99 = NAN;

	if (id == BM_NAIVE && p->layers < 2) {
		r->skipped = true;
		snprintf(r->note, sizeof(r->note), "naive needs at least 2 layers (with one, nothing is offloaded)");
		return;
	}
	if (!ctx->quiet)
		fprintf(stderr, "vmmrt-bench: running %s ...\n", m.md->name);
	bench_current_mode = m.md->name;
	if (model_setup(&m) == VMMRT_OK && run_all(&m, r) == VMMRT_OK)
		verify(&m, r);
	if (bench_is_pool_mode(&m))
		r->pool_buffers = m.pool.n;
	if (m.skip) {
		r->skipped = true;
		r->ran = false;
	}
	if (m.err[0] && !r->note[0])
		snprintf(r->note, sizeof(r->note), "%s", m.err);
	model_teardown(&m);
	bench_current_mode = NULL;
}

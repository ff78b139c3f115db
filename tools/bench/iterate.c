/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * One iteration of each kind of mode, enqueued without a host wait:
 *   eager          kernels on the per-layer activations;
 *   eager-offload  kernels on pool buffers, D2H after each forward, reload into
 *                  whatever buffer is free before each backward (look-ahead);
 *   naive          the same traffic, but replaying graphs captured on fixed
 *                  buffers, so the backward reads the forward's buffer;
 *   library modes  graphs between libvmmrt's hooks.
 * Timing events go around each iteration, each forward and backward and each
 * copy the bench makes itself (metrics.c reads them after the sync).
 */
#include "config.h"

#include <string.h>

#include "model.h"

/* The least recently freed buffer at another address than `avoid` if there is
 * one (a reload lands at a new address, as with a caching allocator), else
 * the first free one; -1 when none is free. */
static int pool_take(pool *pl, vmmrt_devptr avoid)
{
	if (!pl->count)
		return -1;
	unsigned k = 0;
	for (unsigned j = 0; j < pl->count; j++)
		if (pl->addr[pl->fifo[j]] != avoid) {
			k = j;
			break;
		}
	unsigned b = pl->fifo[k];
	memmove(&pl->fifo[k], &pl->fifo[k + 1], (pl->count - k - 1) * sizeof(*pl->fifo));
	pl->count--;
	return (int)b;
}

static bool pool_remove(pool *pl, unsigned b)
{
	for (unsigned j = 0; j < pl->count; j++)
		if (pl->fifo[j] == b) {
			memmove(&pl->fifo[j], &pl->fifo[j + 1], (pl->count - j - 1) * sizeof(*pl->fifo));
			pl->count--;
			return true;
		}
	return false;
}

void bench_pool_give(pool *pl, unsigned b, vmmrt_event *ev)
{
	pl->free_ev[b] = ev;
	pl->fifo[pl->count++] = b;
}

bool bench_is_pool_mode(const model *m)
{
	return m->id == BM_EAGER_OFFLOAD || m->id == BM_NAIVE;
}
static uint64_t ns(double ms)
{
	return (uint64_t)(ms * 1e6 + 0.5);
}

/* Layer i of the synthetic model (synth.h) on the activation at `a`: its
 * forward's checksum at res[i], its backward's at res[L + i]. */
static synth_tensor tensor(const model *m, vmmrt_devptr a, unsigned i)
{
	return (synth_tensor){.act = a, .bytes = m->A, .pattern = 1000 + i, .fwd_sum = m->res_addr + 8 * i,
			      .bwd_sum = m->res_addr + 8 * (m->L + i)};
}

static synth_layer layer(const model *m, const synth_tensor *t)
{
	return (synth_layer){.input = m->input_addr, .fwd_ns = ns(m->p.fwd_ms), .bwd_ns = ns(m->p.bwd_ms), .n = 1,
			     .t = t};
}

/* The forward and backward of layer i on the activation at `a`: launched
 * directly (eager modes) or captured into graphs (the others). */
vmmrt_status bench_enqueue_forward(model *m, vmmrt_devptr a, unsigned i)
{
	synth_tensor t = tensor(m, a, i);
	synth_layer l = layer(m, &t);
	TRY(m, synth_forward(m->rt, m->compute, &l), "forward of layer %u", i);
	return VMMRT_OK;
}

vmmrt_status bench_enqueue_backward(model *m, vmmrt_devptr a, unsigned i)
{
	synth_tensor t = tensor(m, a, i);
	synth_layer l = layer(m, &t);
	TRY(m, synth_backward(m->rt, m->compute, &l), "backward of layer %u", i);
	return VMMRT_OK;
}

/* ------------------------------------------------------------- iterations */

static vmmrt_event *take_event(model *m)
{
	vmmrt_event *e = bench_timing_take(&m->tm);
	if (!e)
		bench_failed(m, VMMRT_E_INVALID_STATE, "bench: out of copy timing events (a bug)");
	return e;
}

static vmmrt_status iteration_start(model *m, unsigned it)
{
	bench_timing_reset(&m->tm);
	/* A new input each iteration, before the timed region. */
	TRY(m, vmmrt_kernel_fill(m->rt, m->compute, m->input_addr, m->A, it + 1), "input fill");
	REC(m, m->tm.it_s, m->compute);
	return VMMRT_OK;
}

static vmmrt_status iteration_end(model *m, unsigned it)
{
	REC(m, m->tm.it_e, m->compute);
	/* The checksums of this iteration, asynchronously, after the timed region. */
	TRY(m, vmmrt_copy_to_host_async(m->rt, &m->host_results[(size_t)it * 2 * m->L], m->res_addr, 16 * (size_t)m->L,
					   m->compute),
	    "copy of the checksums");
	return VMMRT_OK;
}

static vmmrt_status iter_eager(model *m, unsigned it)
{
	if (iteration_start(m, it) != VMMRT_OK)
		return VMMRT_E_INVALID_STATE;
	for (unsigned u = 0, k = 0; u < 2 * m->L; u++) {
		unsigned i = m->use_runner[u];
		if (!m->use_bwd[u]) {
			REC(m, m->tm.fwd_s[i], m->compute);
			if (bench_enqueue_forward(m, vmmrt_slot_address(m->act[i]), i) != VMMRT_OK)
				return VMMRT_E_INVALID_STATE;
			REC(m, m->tm.fwd_e[i], m->compute);
			continue;
		}
		REC(m, m->tm.bwd_s[k], m->compute);
		if (bench_enqueue_backward(m, vmmrt_slot_address(m->act[i]), i) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
		REC(m, m->tm.bwd_e[k], m->compute);
		k++;
	}
	return iteration_end(m, it);
}

/* Reload the activation of backward step j into a free pool buffer. */
static vmmrt_status pool_restore(model *m, unsigned j, bool *done)
{
	unsigned layer = m->L - 1 - j;
	pool *pl = &m->pool;
	int b = pool_take(pl, pl->addr[m->fwd_buf[layer]]);
	*done = false;
	if (b < 0)
		return VMMRT_OK; /* none free now: asked again at the next step */
	if (pl->free_ev[b])
		TRY(m, vmmrt_stream_wait_event(m->rt, m->h2d, pl->free_ev[b]), "H2D wait for a free buffer");
	/* the host copy must be complete */
	TRY(m, vmmrt_stream_wait_event(m->rt, m->h2d, m->d2h_done[layer]), "H2D wait for the D2H");
	vmmrt_event *a = take_event(m), *e = take_event(m);
	bench_span *sp = bench_timing_add_span(&m->tm);
	if (!a || !e || !sp)
		return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: out of copy spans (a bug)");
	REC(m, a, m->h2d);
	TRY(m, vmmrt_copy_to_device_async(m->rt, pl->addr[b], m->host[layer], m->A, m->h2d), "reload of layer %u",
	    layer);
	REC(m, e, m->h2d);
	*sp = (bench_span){.h2d = true, .layer = (int)layer, .copies = 1, .bytes = m->A, .a = a, .b = e};
	m->bwd_buf[j] = b;
	m->h2d_done[j] = e;
	*done = true;
	return VMMRT_OK;
}

/*
 * eager-offload: each forward takes a free buffer, its D2H gives it back; each
 * backward reloads into whatever is free and the kernels read it there.
 * naive: the same traffic, but the graphs were captured on fixed buffers, so
 * the backward graph reads the forward's buffer, not the reload.
 */
static vmmrt_status iter_pool(model *m, unsigned it)
{
	unsigned L = m->L;
	bool naive = m->id == BM_NAIVE;
	pool *pl = &m->pool;
	if (iteration_start(m, it) != VMMRT_OK)
		return VMMRT_E_INVALID_STATE;
	for (unsigned i = 0; i < L; i++) {
		int b;
		if (naive) {
			b = (int)m->cap_buf[i];
			if (!pool_remove(pl, (unsigned)b))
				return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: captured buffer %d is not free (a bug)", b);
		} else if ((b = pool_take(pl, 0)) < 0) {
			return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: no free pool buffer for layer %u (a bug)", i);
		}
		if (pl->free_ev[b])
			TRY(m, vmmrt_stream_wait_event(m->rt, m->compute, pl->free_ev[b]), "wait for a free buffer");
		REC(m, m->tm.fwd_s[i], m->compute);
		if (naive)
			TRY(m, vmmrt_graph_launch(m->rt, m->fwd[i], m->compute), "forward graph of layer %u", i);
		else if (bench_enqueue_forward(m, pl->addr[b], i) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
		REC(m, m->tm.fwd_e[i], m->compute);
		m->fwd_buf[i] = b;
		if (i + 1 == L)
			break; /* the tail: its backward comes next, it stays */
		vmmrt_event *a = take_event(m), *e = take_event(m);
		bench_span *sp = bench_timing_add_span(&m->tm);
		if (!a || !e || !sp)
			return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: out of copy spans (a bug)");
		TRY(m, vmmrt_stream_wait_event(m->rt, m->d2h, m->tm.fwd_e[i]), "D2H wait for the forward");
		REC(m, a, m->d2h);
		TRY(m, vmmrt_copy_to_host_async(m->rt, m->host[i], pl->addr[b], m->A, m->d2h), "offload of layer %u",
		    i);
		REC(m, e, m->d2h);
		*sp = (bench_span){.h2d = false, .layer = (int)i, .copies = 1, .bytes = m->A, .a = a, .b = e};
		m->d2h_done[i] = e;
		bench_pool_give(pl, (unsigned)b, e); /* the storage goes back once the copy is done */
	}
	m->bwd_buf[0] = m->fwd_buf[L - 1];
	unsigned next = 1; /* step 0 is the tail: nothing to reload */
	for (unsigned k = 0; k < L; k++) {
		unsigned i = L - 1 - k;
		/* look-ahead: the reloads of the next `lookahead` steps start now */
		while (next < L && next <= k + m->p.lookahead) {
			bool done;
			if (pool_restore(m, next, &done) != VMMRT_OK)
				return VMMRT_E_INVALID_STATE;
			if (!done)
				break;
			next++;
		}
		if (next <= k) {
			bool done = false;
			if (pool_restore(m, k, &done) != VMMRT_OK)
				return VMMRT_E_INVALID_STATE;
			if (!done)
				return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: no pool buffer for the reload of layer %u (a bug)",
					      i);
			next = k + 1;
		}
		if (k > 0)
			TRY(m, vmmrt_stream_wait_event(m->rt, m->compute, m->h2d_done[k]), "wait for the reload");
		REC(m, m->tm.bwd_s[k], m->compute);
		if (naive)
			TRY(m, vmmrt_graph_launch(m->rt, m->bwd[i], m->compute), "backward graph of layer %u", i);
		else if (bench_enqueue_backward(m, pl->addr[m->bwd_buf[k]], i) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
		REC(m, m->tm.bwd_e[k], m->compute);
		bench_pool_give(pl, (unsigned)m->bwd_buf[k], m->tm.bwd_e[k]);
	}
	return iteration_end(m, it);
}

/* A hook of the library, on the compute stream. Its copies run on the
 * runtime's own copy streams, which the public API does not show: the
 * library's offload statistics time them. */
static vmmrt_status hook(model *m, vmmrt_status (*fn)(vmmrt_group *, vmmrt_stream), const char *name, unsigned layer)
{
	TRY(m, fn(m->g[layer], m->compute), "%s of layer %u", name, layer);
	return VMMRT_OK;
}

static vmmrt_status iter_library(model *m, unsigned it)
{
	if (iteration_start(m, it) != VMMRT_OK)
		return VMMRT_E_INVALID_STATE;
	for (unsigned u = 0, k = 0; u < 2 * m->L; u++) {
		unsigned i = m->use_runner[u];
		if (m->use_bwd[u]) {
			if (hook(m, vmmrt_backward_begin, "backward_begin", i) != VMMRT_OK)
				return VMMRT_E_INVALID_STATE;
			/* after backward_begin: its stream wait for the restore is enqueued,
			 * so the gap before this event includes any wait for the H2D */
			REC(m, m->tm.bwd_s[k], m->compute);
			TRY(m, vmmrt_graph_launch(m->rt, m->bwd[i], m->compute), "backward graph of layer %u", i);
			REC(m, m->tm.bwd_e[k], m->compute);
			if (hook(m, vmmrt_backward_end, "backward_end", i) != VMMRT_OK)
				return VMMRT_E_INVALID_STATE;
			k++;
			continue;
		}
		if (hook(m, vmmrt_forward_begin, "forward_begin", i) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
		REC(m, m->tm.fwd_s[i], m->compute);
		TRY(m, vmmrt_graph_launch(m->rt, m->fwd[i], m->compute), "forward graph of layer %u", i);
		REC(m, m->tm.fwd_e[i], m->compute);
		if (hook(m, vmmrt_forward_end, "forward_end", i) != VMMRT_OK)
			return VMMRT_E_INVALID_STATE;
	}
	return iteration_end(m, it);
}

vmmrt_status bench_run_iteration(model *m, unsigned it)
{
	switch (m->id) {
	case BM_EAGER: return iter_eager(m, it);
	case BM_EAGER_OFFLOAD:
	case BM_NAIVE: return iter_pool(m, it);
	default: return iter_library(m, it);
	}
}

/* Wait for everything the iteration started; outside the timed region. */
vmmrt_status bench_iteration_sync(model *m)
{
	TRY(m, vmmrt_stream_synchronize(m->rt, m->compute), "compute stream synchronize");
	if (bench_is_pool_mode(m)) {
		TRY(m, vmmrt_stream_synchronize(m->rt, m->d2h), "D2H stream synchronize");
		TRY(m, vmmrt_stream_synchronize(m->rt, m->h2d), "H2D stream synchronize");
		if (m->pool.count != m->pool.n)
			return bench_failed(m, VMMRT_E_INVALID_STATE, "bench: %u of %u pool buffers came back (a bug)",
				      m->pool.count, m->pool.n);
		for (unsigned b = 0; b < m->pool.n; b++)
			m->pool.free_ev[b] = NULL; /* all complete; the events get re-recorded */
	} else if (m->md->lib_mode) {
		TRY(m, vmmrt_offload_sync(m->rt), "offload sync");
	}
	return VMMRT_OK;
}

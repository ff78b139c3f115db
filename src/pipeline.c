/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The steps every strategy's pipeline is made of: see pipeline.h. */
#include "config.h"

#include <stdlib.h>

#include <urcu/uatomic.h>

#include "clock.h"

#include "driver.h"
#include "error.h"
#include "pipeline.h"
#include "worker.h"

void vmmrt__offload_account(vmmrt__offload *off, int64_t delta)
{
	int64_t now = uatomic_add_return(&off->activation_bytes, delta);
	for (int64_t peak = uatomic_read(&off->activation_peak); now > peak;
	     peak = uatomic_read(&off->activation_peak))
		if (uatomic_cmpxchg(&off->activation_peak, peak, now) == peak)
			break;
}

vmmrt_status vmmrt__offload_wait(vmmrt__offload *off, vmmrt_stream s, vmmrt__bevent *e)
{
	bool done = false;
	if (vmmrt__drv_event_query(off->rt, e, &done) == VMMRT_OK) {
		if (done)
			return VMMRT_OK;
	} else {
		/* the wait below does the same job, so a failed poll is no failure of the call */
		vmmrt__error_clear();
	}
	return vmmrt__drv_stream_wait_event(off->rt, s, e);
}

/* Timing events around the copy give the bandwidth "while copying". */
vmmrt_status vmmrt__offload_d2h(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st;
	if ((st = vmmrt__drv_event_record(rt, g->d2h_start, off->d2h)) != VMMRT_OK ||
	    (st = g->d2h_graph ? vmmrt__drv_graph_launch(rt, g->d2h_graph, off->d2h)
			       : vmmrt__drv_memcpy_dtoh_async(rt, g->host, g->base, g->bytes, off->d2h)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_record(rt, g->d2h_done, off->d2h)) != VMMRT_OK)
		return st;
	g->timed_d2h = true;
	uatomic_add(&off->bytes_offloaded, g->bytes);
	return VMMRT_OK;
}

vmmrt_status vmmrt__offload_h2d(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st;
	if ((st = vmmrt__drv_event_record(rt, g->h2d_start, off->h2d)) != VMMRT_OK ||
	    (st = g->h2d_graph ? vmmrt__drv_graph_launch(rt, g->h2d_graph, off->h2d)
			       : vmmrt__drv_memcpy_htod_async(rt, g->base, g->host, g->bytes, off->h2d)) != VMMRT_OK ||
	    (st = vmmrt__drv_event_record(rt, g->restored, off->h2d)) != VMMRT_OK)
		return st;
	g->timed_h2d = true;
	uatomic_add(&off->bytes_restored, g->bytes);
	return VMMRT_OK;
}

static vmmrt_status capture_copy(vmmrt__offload *off, vmmrt_group *g, vmmrt_stream s, bool to_host,
				 vmmrt__bgraph **out)
{
	vmmrt_runtime *rt = off->rt;
	vmmrt_status st = vmmrt__drv_stream_begin_capture(rt, s);
	if (st != VMMRT_OK)
		return st;
	vmmrt_status cst = to_host ? vmmrt__drv_memcpy_dtoh_async(rt, g->host, g->base, g->bytes, s)
				   : vmmrt__drv_memcpy_htod_async(rt, g->base, g->host, g->bytes, s);
	vmmrt__bgraph *graph = NULL;
	st = vmmrt__drv_stream_end_capture(rt, s, &graph); /* always end what was begun */
	if (cst != VMMRT_OK) {
		if (graph)
			(void)vmmrt__drv_graph_destroy(rt, graph);
		return cst;
	}
	if (st == VMMRT_OK)
		*out = graph;
	return st;
}

vmmrt_status vmmrt__offload_capture_copies(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt_stream s;
	vmmrt_status st = vmmrt__drv_stream_create(off->rt, &s);
	if (st != VMMRT_OK)
		return st;
	st = capture_copy(off, g, s, true, &g->d2h_graph);
	if (st == VMMRT_OK)
		st = capture_copy(off, g, s, false, &g->h2d_graph);
	(void)vmmrt__drv_stream_destroy(off->rt, s);
	if (st != VMMRT_OK) {
		vmmrt__offload_free_copies(off, g);
		return vmmrt__error_wrap(st, "group '%s': capture of its copies", g->name);
	}
	return VMMRT_OK;
}

void vmmrt__offload_free_copies(vmmrt__offload *off, vmmrt_group *g)
{
	if (g->d2h_graph)
		(void)vmmrt__drv_graph_destroy(off->rt, g->d2h_graph);
	if (g->h2d_graph)
		(void)vmmrt__drv_graph_destroy(off->rt, g->h2d_graph);
	g->d2h_graph = g->h2d_graph = NULL;
}

void vmmrt__offload_destroy_slot(vmmrt_slot *s)
{
	vmmrt_status st = vmmrt__slot_destroy(s);
	/* A refused unmap or VA free leaves the slot alive and whole: try once
	 * more rather than drop it. A timeout leaves it to the worker. */
	if (st != VMMRT_OK && st != VMMRT_E_TIMEOUT)
		(void)vmmrt__slot_destroy(s);
}

bool vmmrt__offload_stays(const vmmrt__offload *off, const vmmrt_group *g)
{
	const vmmrt__schedule *s = &off->sched;
	return s->recorded && s->n && (g->stays || vmmrt__schedule_resident(s, g->index, off->lookahead_in_force));
}

bool vmmrt__offload_resident(const vmmrt__offload *off, const vmmrt_group *g, uint64_t use, bool backward)
{
	const vmmrt__schedule *s = &off->sched;
	if (!vmmrt__offload_stays(off, g))
		return false;
	uint64_t apart = s->pos_b[g->index] - s->pos_f[g->index];
	if (backward && use < apart)
		return false;
	uint64_t fwd_use = backward ? use - apart : use;
	return s->declared || fwd_use >= 2ull * s->n;
}

vmmrt_status vmmrt__offload_drain_stream(vmmrt_runtime *rt, vmmrt_stream s, const char *name)
{
	uint64_t deadline = vmmrt__now_ns() + rt->timeout_ms * 1000000ull;
	for (unsigned spin = 0;; spin++) {
		bool done = false;
		vmmrt_status st = vmmrt__drv_stream_query(rt, s, &done);
		if (st != VMMRT_OK || done)
			return st;
		if (vmmrt__now_ns() > deadline)
			return vmmrt__error(VMMRT_E_TIMEOUT, "offload %s stream still busy after %llu ms", name,
					   (unsigned long long)rt->timeout_ms);
		vmmrt__sleep_ns(spin < 100 ? 20000 : 1000000);
	}
}

vmmrt_status vmmrt__offload_worker_barrier(vmmrt_runtime *rt)
{
	/* A no-op request behind what is queued on every worker. It is on the
	 * heap so a timed-out wait can leave it to the worker. */
	for (unsigned w = 0; w < vmmrt__workers_count(rt->workers); w++) {
		vmmrt__request *barrier = malloc(sizeof(*barrier));
		if (!barrier)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "worker barrier");
		vmmrt__request_init_call(barrier, NULL, NULL);
		vmmrt_status st = vmmrt__worker_push(rt->workers, w, barrier);
		if (st != VMMRT_OK) {
			free(barrier);
			return st;
		}
		if ((st = vmmrt__request_wait_owned(barrier, rt->timeout_ms)) != VMMRT_OK)
			return st;
	}
	return VMMRT_OK;
}

uint64_t vmmrt__offload_largest(const vmmrt__offload *off, unsigned k)
{
	uint64_t sum = 0, below = UINT64_MAX;
	unsigned taken = 0;
	/* k passes over a few hundred groups at most: no sort, no allocation */
	while (taken < k) {
		uint64_t best = 0;
		unsigned count = 0;
		for (unsigned i = 0; i < off->ngroups; i++) {
			const vmmrt_group *g = off->groups[i];
			uint64_t b = g->slot ? vmmrt_slot_size(g->slot) : 0;
			if (b && b < below && b > best) {
				best = b;
				count = 0;
			}
			count += b && b == best;
		}
		if (!best)
			break;
		for (; count && taken < k; count--, taken++)
			sum += best;
		below = best;
	}
	return sum;
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The end of a scenario's runtime: drained or not, its objects destroyed,
 * nothing leaked. */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "driver.h"
#include "model/synth.h"
#include "offload.h"
#include "runtime.h"
#include "worker.h"

#include "scenario.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

/*
 * The application lets one and a half steps of the copy model pass (so a
 * teardown that is wrong lets the restore start early enough to be writing
 * the slot when its release unmaps it), and from then on every cuMemCreate
 * takes two steps (so the slot stays unmapped a while before the map that
 * waited for that release makes it again): what a wrong teardown does to the
 * slot then faults.
 */
void s_end_in_flight(scen *s)
{
	uint64_t step_ns = (uint64_t)(262144 / s->gbps);
	struct timespec ts = {(time_t)(step_ns * 3 / 2 / 1000000000), (long)(step_ns * 3 / 2 % 1000000000)};
	nanosleep(&ts, NULL);
	atomic_store(&s->fc.teardown_create_us, 2 * step_ns / 1000);
}

static void leak(scen *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void leak(scen *s, const char *fmt, ...)
{
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	atomic_fetch_add_explicit(&T.leaked, 1, memory_order_relaxed);
	t_fail(s->seed, "leak", "%s (%s, %u groups, pool %u%s%s)", msg, mode_name(s->mode), s->ng, s->pool,
	       s->errored ? "; after: " : "", s->errored ? s->errmsg : "");
}

static void destroy_own(scen *s)
{
	vmmrt_runtime *rt = s->rt;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (g->fwd)
			s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(rt, g->fwd)), "vmmrt_graph_destroy");
		if (g->bwd)
			s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(rt, g->bwd)), "vmmrt_graph_destroy");
		g->fwd = g->bwd = NULL;
	}
	for (unsigned i = 0; i < s->nold_graphs; i++)
		s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(rt, s->old_graphs[i])), "vmmrt_graph_destroy");
	s->nold_graphs = 0;
	if (s->input) {
		t_range_del(vmmrt_slot_address(s->input));
		s_ok(s, API(s, "vmmrt_slot_destroy", vmmrt_slot_destroy(s->input)), "vmmrt_slot_destroy(input)");
		s->input = NULL;
	}
	if (s->results) {
		t_range_del(vmmrt_slot_address(s->results));
		s_ok(s, API(s, "vmmrt_slot_destroy", vmmrt_slot_destroy(s->results)), "vmmrt_slot_destroy(results)");
		s->results = NULL;
	}
	if (s->hres)
		s_ok(s, API(s, "vmmrt_host_free", vmmrt_host_free(rt, s->hres)), "vmmrt_host_free");
	s->hres = NULL;
	for (unsigned i = 0; i < s->nleft; i++)
		s_ok(s, API(s, "vmmrt_slot_destroy", vmmrt_slot_destroy(s->leftover[i])), "vmmrt_slot_destroy(left over)");
	s->nleft = 0;
	if (s->compute)
		s_ok(s, API(s, "vmmrt_stream_destroy", vmmrt_stream_destroy(rt, s->compute)), "vmmrt_stream_destroy");
	s->compute = NULL;
}

/*
 * The end of a runtime. `sync`: quiesce with vmmrt_offload_sync first;
 * otherwise the library's copies, host functions and worker requests may
 * still be in flight when it is destroyed (only the application's own compute
 * stream is drained: destroying memory under one's own running graphs is the
 * application's bug, not the library's).
 */
void s_teardown(scen *s, bool sync)
{
	vmmrt_runtime *rt = s->rt;
	trng *r = &s->r;

	if (s->compute && !s->stuck) {
		if (sync && s->allocated && !s->errored)
			s_checkpoint(s, true);
		else if (s_drain_compute(s, s_drain_limit_ms(s))) {
			s_verify(s);
			hostfn_probe_check(s);
		} else {
			if (!s->errored)
				t_fail(s->seed, "hang", "the compute stream did not drain in %llu ms and no error was reported",
				       (unsigned long long)s_drain_limit_ms(s));
			s->stuck = true;
		}
	}
	if (s->stuck)
		s_excuse_pending(s);
	for (unsigned i = 0; i < s->ng; i++)
		if (s->G[i].nt && s->G[i].base)
			t_range_del(s->G[i].base);
	for (unsigned i = 0; i < s->nold_base; i++)
		t_range_del(s->old_base[i]);
	s->nold_base = 0;

	/* From here on only latency is injected: a failed free can only leak. */
	s_quiet(s, true);
	bool own = !s->stuck && s->compute;
	if (own)
		destroy_own(s);
	if (own && chance(r, 0.6)) {
		/* Two steps, so the counts and the driver's memory can be read in between. */
		heartbeat(s, "vmmrt__offload_destroy");
		vmmrt__offload_destroy(rt);
		(void)vmmrt__slot_pools_trim(rt->workers);
		int64_t h = (int64_t)__atomic_load_n(&rt->live_handles, __ATOMIC_SEQ_CST);
		int64_t v = (int64_t)__atomic_load_n(&rt->live_reservations, __ATOMIC_SEQ_CST);
		int64_t sl = (int64_t)__atomic_load_n(&rt->live_slots, __ATOMIC_SEQ_CST);
		if (h || v || sl)
			leak(s, "after the offload state was destroyed: %lld handles, %lld reservations, %lld slots live",
			     (long long)h, (long long)v, (long long)sl);
		size_t f = 0, t = 0;
		if (API(s, "vmmrt_mem_info", vmmrt_mem_info(rt, &f, &t)) != VMMRT_OK)
			t_fail(s->seed, "unexpected-error", "vmmrt_mem_info: %s", vmmrt_last_error());
		else if (!s->cuda && f != s->base_free)
			leak(s, "device memory: %zu bytes free, %zu at creation", f, s->base_free);
		else if (s->cuda && cfg.threads == 1 && f + 64 * MiB < s->base_free)
			leak(s, "device memory: %zu MiB free, %zu MiB at creation", f >> 20, s->base_free >> 20);
	}
	atomic_store(&s->th->rt, NULL);
	vmmrt_status st = API(s, "vmmrt_runtime_destroy", vmmrt_runtime_destroy(rt));
	if (st != VMMRT_OK)
		leak(s, "vmmrt_runtime_destroy: %s", vmmrt_last_error());
	s->rt = NULL;
}


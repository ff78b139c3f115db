/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A scenario's checks: every launched backward's results against the host's
 * checksums, the invariants of a quiet point, the bounded drain of the
 * compute stream they wait for. */
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

static uint64_t expected_sum(const tens *t, uint64_t iterseed)
{
	return vmmrt_layer_checksum_host(t->d.bytes, iterseed, t->seed);
}

/* What a wrong result looks like: stale, or another group's bytes. */
static void diagnose(scen *s, unsigned it, unsigned gi, unsigned ti, uint64_t got, char *out, size_t len)
{
	const tens *t = &s->G[gi].t[ti];
	snprintf(out, len, "matches nothing checked");
	for (unsigned j = it >= 3 ? it - 3 : 0; j < s->iters && j <= it + 1; j++) {
		for (unsigned h = 0; h < s->ng; h++) {
			for (unsigned u = 0; u < s->G[h].nt; u++) {
				const tens *o = &s->G[h].t[u];
				if (o->d.bytes < t->d.bytes || (j == it && h == gi && u == ti))
					continue;
				tens probe = *t;
				probe.seed = o->seed;
				if (expected_sum(&probe, s->iterseed[j]) == got) {
					snprintf(out, len, "holds group %s tensor %u of iteration %u%s", s->G[h].name, u, j,
						 j < it ? " (stale)" : j > it ? " (overwritten early)" : "");
					return;
				}
			}
		}
	}
}

void s_verify(scen *s)
{
	for (unsigned it = 0; it < s->iters; it++) {
		for (unsigned gi = 0; gi < s->ng; gi++) {
			grp *g = &s->G[gi];
			if (!s->launched[it][gi] || s->verified[it][gi])
				continue;
			s->verified[it][gi] = 1;
			for (unsigned k = 0; k < g->nt; k++) {
				const tens *t = &g->t[k];
				uint64_t got = s->hres[(size_t)it * s->nres + t->rix];
				uint64_t want = expected_sum(t, s->iterseed[it]);
				if (got == want) {
					atomic_fetch_add_explicit(&T.bytes_verified, t->d.bytes, memory_order_relaxed);
					atomic_fetch_add_explicit(&T.activations_verified, 1, memory_order_relaxed);
				} else if (got == RESULT_POISON && s->errored) {
					atomic_fetch_add_explicit(&T.excused, 1, memory_order_relaxed);
				} else if (got == RESULT_POISON) {
					t_fail(s->seed, "lost",
					       "iteration %u group %s tensor %u: the backward graph's result never arrived "
					       "although the compute stream drained and no error was reported", it, g->name, k);
				} else {
					char why[160];
					diagnose(s, it, gi, k, got, why, sizeof(why));
					atomic_fetch_add_explicit(&T.corrupted, 1, memory_order_relaxed);
					atomic_fetch_add_explicit(&T.corrupted_bytes, t->d.bytes, memory_order_relaxed);
					t_fail(s->seed, "corrupted",
					       "iteration %u group %s tensor %u (%zu bytes at 0x%llx, %s, lookahead %u, %u "
					       "groups%s): checksum %016" PRIx64 ", want %016" PRIx64 "; it %s%s%s",
					       it, g->name, k, t->d.bytes, (unsigned long long)t->addr, mode_name(s->mode),
					       s->lookahead, s->ng, s->latency ? ", latency model" : "", got, want, why,
					       s->errored ? "; error reported: " : "", s->errored ? s->errmsg : "");
				}
			}
		}
	}
}

/* Results of launched backwards we could not look at (the stream is stuck). */
void s_excuse_pending(scen *s)
{
	for (unsigned it = 0; it < s->iters; it++)
		for (unsigned gi = 0; gi < s->ng; gi++)
			if (s->launched[it][gi] && !s->verified[it][gi]) {
				s->verified[it][gi] = 1;
				atomic_fetch_add_explicit(&T.excused, s->G[gi].nt, memory_order_relaxed);
			}
}

/* Bounded wait until the application's compute stream is idle (the public
 * synchronize has no bound, and a stream behind a failed map never drains). */
bool s_drain_compute(scen *s, uint64_t limit_ms)
{
	uint64_t deadline = t_now_ns() + limit_ms * 1000000ull;
	for (unsigned spin = 0;; spin++) {
		bool done = false;
		vmmrt_status st = s->rt->ops->stream_query(s->rt->be, s->compute, &done);
		if (st != VMMRT_OK)
			return false; /* still capturing after a failed capture */
		if (done)
			return true;
		heartbeat(s, "draining the compute stream");
		if (t_now_ns() > deadline)
			return false;
		struct timespec ts = {0, spin < 50 ? 100000 : 2000000};
		nanosleep(&ts, NULL);
	}
}

uint64_t s_drain_limit_ms(scen *s)
{
	/* Fault-free, the stream drains as fast as the work allows; a stall or a
	 * failed map can hold it, the first for stall_ms, the second forever. */
	uint64_t base = (uint64_t)cfg.watchdog_s * 1000 / 2;
	if (s->errored)
		base = (uint64_t)cfg.timeout_ms * 2 + 2000;
	return base + (uint64_t)cfg.stall_ms;
}

/* Invariants that hold at any quiet point of a fault-free scenario. */
static void invariants(scen *s)
{
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (g->nt && vmmrt_group_address(g->g) != g->base)
			t_fail(s->seed, "moved", "group %s: address 0x%llx, was 0x%llx at capture", g->name,
			       (unsigned long long)vmmrt_group_address(g->g), (unsigned long long)g->base);
	}
	if (s->errored || fault_causes(&s->fc))
		return;
	vmmrt_offload_stats st = {.size = sizeof(st)};
	if (vmmrt_offload_stats_get(s->rt, &st) != VMMRT_OK) {
		t_fail(s->seed, "stats", "vmmrt_offload_stats_get: %s", vmmrt_last_error());
		return;
	}
	size_t maxslot = 0;
	for (unsigned i = 0; i < s->ng; i++)
		if (s->G[i].nt && round_up(s->G[i].bytes, s->gran) > maxslot)
			maxslot = round_up(s->G[i].bytes, s->gran);
	/* Ping-pong holds its banks, no more: two of the largest group without
	 * a declared schedule (until a re-discovery adds banks of other sizes),
	 * what the declared one needs otherwise. */
	if (s->mode == VMMRT_MODE_PINGPONG && (st.activation_bytes != st.bound_bytes ||
					       (!s->declared && !s->reallocated && st.activation_bytes != 2 * maxslot)))
		t_fail(s->seed, "memory-bound",
		       "ping-pong holds %llu bytes of activations, its %u banks %llu (two of %zu without a declared "
		       "schedule)", (unsigned long long)st.activation_bytes, st.banks, (unsigned long long)st.bound_bytes,
		       maxslot);
	if (s->mode == VMMRT_MODE_PINGPONG && s->declared && st.bank_conflicts)
		t_fail(s->seed, "bank-conflict", "%llu bank conflicts under a declared schedule (banks %u, look-ahead %u)",
		       (unsigned long long)st.bank_conflicts, st.banks, st.lookahead_in_force);
	if (s->mode == VMMRT_MODE_REMAP && s->stats_reset &&
	    (st.activation_peak_bytes > (uint64_t)st.budget_groups * maxslot || st.budget_groups > s->lookahead + 1))
		t_fail(s->seed, "memory-bound", "remap peak %llu bytes > budget %u x %zu (lookahead %u)",
		       (unsigned long long)st.activation_peak_bytes, st.budget_groups, maxslot, s->lookahead);
}

/* A quiet point: everything enqueued so far has finished and is checked. */
void s_checkpoint(scen *s, bool sync)
{
	if (sync && !s->errored)
		s_ok(s, API(s, "vmmrt_offload_sync", vmmrt_offload_sync(s->rt)), "vmmrt_offload_sync");
	if (s->stuck || !s_drain_compute(s, s_drain_limit_ms(s))) {
		if (!s->stuck && !s->errored)
			t_fail(s->seed, "hang",
			       "the compute stream did not drain in %llu ms and no error was reported (%s, %u groups)",
			       (unsigned long long)s_drain_limit_ms(s), mode_name(s->mode), s->ng);
		s->stuck = true;
		s_excuse_pending(s);
		return;
	}
	s_verify(s);
	hostfn_probe_check(s);
	invariants(s);
}


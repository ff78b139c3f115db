/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * One scenario: a runtime with a random configuration, driven from creation
 * to destruction through a random legal sequence with illegal calls mixed in,
 * every restored activation checked against its checksum.
 *
 * The model is the synthetic one (tools/model/synth.h), a layer per
 * non-empty group: its forward graph writes each of the group's
 * tensors as input ^ pattern(tensor) (the input is refilled with a new seed
 * every iteration) and a backward graph that first computes for a while (so a
 * restore that overwrites a bank too early is seen), then checksums each
 * tensor into a result slot, copied to pinned host memory after the graph.
 * The host knows what every checksum must be; a result that no backward graph
 * wrote keeps a poison value.
 *
 * Verdicts, per (iteration, group) whose backward was launched:
 *   right checksum                   verified;
 *   poison, after a reported error   excused (the pipeline stopped at the error);
 *   poison, no error reported        unexpected (a lost result: failure);
 *   any other value                  corrupted (failure, whatever was reported).
 * A legal call that fails must return a named error that an injected fault
 * explains; the scenario then winds down (the library's contract after an
 * error is: report it, keep the host copy, let the application destroy).
 */
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

/* ------------------------------------------------------------ bookkeeping */

void s_begin(scen *s, const char *what)
{
	atomic_store_explicit(&s->th->step, what, memory_order_relaxed);
	atomic_store_explicit(&s->th->heartbeat_ns, t_now_ns(), memory_order_relaxed);
	atomic_store_explicit(&s->th->busy, 1, memory_order_relaxed);
}

void s_end(scen *s)
{
	atomic_store_explicit(&s->th->heartbeat_ns, t_now_ns(), memory_order_relaxed);
	atomic_store_explicit(&s->th->busy, 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&T.operations, 1, memory_order_relaxed);
}

static void heartbeat(scen *s, const char *what)
{
	atomic_store_explicit(&s->th->step, what, memory_order_relaxed);
	atomic_store_explicit(&s->th->heartbeat_ns, t_now_ns(), memory_order_relaxed);
}

void s_quiet(scen *s, bool on)
{
	atomic_store(&s->fc.teardown, on ? 1 : 0);
}

static const char *mode_name(vmmrt_mode m)
{
	return m == VMMRT_MODE_REMAP ? "remap" : m == VMMRT_MODE_PINGPONG ? "pingpong" : "none";
}

/* An error is explained when a failure or a stall was injected before it, or,
 * for a timeout, when enough latency was injected to run a bounded wait out. */
static bool explained(scen *s, vmmrt_status st)
{
	if (fault_causes(&s->fc))
		return true;
	return st == VMMRT_E_TIMEOUT && atomic_load(&s->fc.delays) > 0;
}

/* A named error: a status of the enumeration, and a message that names it. */
static bool named(vmmrt_status st, const char *msg)
{
	return st > VMMRT_OK && st < VMMRT_STATUS_COUNT_ && msg && strstr(msg, vmmrt_status_name(st));
}

bool s_ok(scen *s, vmmrt_status st, const char *what)
{
	if (st == VMMRT_OK)
		return true;
	const char *msg = vmmrt_last_error();
	if (!named(st, msg))
		t_fail(s->seed, "unnamed-error", "%s returned %s (%d), but the message says \"%s\"", what,
		       vmmrt_status_name(st), (int)st, msg ? msg : "(null)");
	else if (!explained(s, st))
		t_fail(s->seed, "unexpected-error", "%s: %s (no fault was injected; %s, %u groups, lookahead %u)",
		       what, msg, mode_name(s->mode), s->ng, s->lookahead);
	else {
		atomic_fetch_add_explicit(&T.named_errors, 1, memory_order_relaxed);
		t_note(2, "scenario %016" PRIx64 ": %s: %s", s->seed, what, msg);
	}
	if (!s->errored) {
		s->errored = true;
		s->first_err = st;
		snprintf(s->errmsg, sizeof(s->errmsg), "%s: %s", what, msg ? msg : "");
		snprintf(s->th->lasterr, sizeof(s->th->lasterr), "%.200s", s->errmsg);
	}
	return false;
}

/* --------------------------------------------------------------- settings */

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

static void configure(scen *s)
{
	trng *r = &s->r;
	static const double gbps[] = {0.5, 1, 2, 5, 20};
	static const size_t aligns[] = {0, 8, 64, 256, 4096};

	if (cfg.strategy == STRAT_PINGPONG)
		s->mode = VMMRT_MODE_PINGPONG;
	else if (cfg.strategy == STRAT_REMAP)
		s->mode = VMMRT_MODE_REMAP;
	else
		s->mode = (rnd(r) & 1) ? VMMRT_MODE_REMAP : VMMRT_MODE_PINGPONG;
	s->ng = (unsigned)rnd_in(r, cfg.groups.lo, cfg.groups.hi);
	s->lookahead = (unsigned)rnd_in(r, cfg.lookahead.lo, cfg.lookahead.hi);
	s->workers = (unsigned)rnd_in(r, cfg.workers.lo, cfg.workers.hi);
	s->pool = (s->mode == VMMRT_MODE_REMAP && chance(r, 0.4)) ? (unsigned)rnd_in(r, 1, 4) : 0;
	s->oom_retries = (unsigned)rnd_in(r, 0, 3);
	s->latency = chance(r, 0.4);
	s->gbps = gbps[rnd(r) % 5];
	s->gran = chance(r, 0.8) ? 64 * KiB : 2 * MiB;
	s->fwd_ns = chance(r, 0.5) ? rnd_in(r, 0, 200000) : 0;
	s->bwd_ns = chance(r, 0.6) ? rnd_in(r, 0, 2000000) : 0;
	s->target_iters = (unsigned)rnd_in(r, cfg.iterations.lo, cfg.iterations.hi);

	s->nres = 0;
	s->nonempty = 0;
	s->input_bytes = 8;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		snprintf(g->name, sizeof(g->name), "L%u", i);
		g->nt = (s->ng > 1 && chance(r, 0.1)) ? 0 : (unsigned)rnd_in(r, cfg.tensors.lo, cfg.tensors.hi);
		if (i == s->ng - 1 && s->nonempty == 0 && g->nt == 0)
			g->nt = 1;
		if (g->nt)
			s->nonempty++;
		for (unsigned k = 0; k < g->nt; k++) {
			tens *t = &g->t[k];
			size_t bytes = (size_t)rnd_in(r, cfg.tensor_bytes.lo, cfg.tensor_bytes.hi) & ~(size_t)7;
			if (bytes < 8)
				bytes = 8;
			memset(&t->d, 0, sizeof(t->d));
			t->d.bytes = bytes;
			t->d.dtype = (uint32_t)(rnd(r) % 24);
			t->d.ndim = 1 + (uint32_t)(rnd(r) % 3);
			t->d.shape[0] = (int64_t)(bytes / 8);
			t->d.stride[0] = 1;
			for (unsigned d = 1; d < t->d.ndim; d++) {
				t->d.shape[d] = 1 + (int64_t)(rnd(r) % 7);
				t->d.stride[d] = (int64_t)(rnd(r) % 100);
			}
			t->d.align = aligns[rnd(r) % 5];
			t->seed = rnd(r) | 1;
			t->rix = s->nres++;
			if (bytes > s->input_bytes)
				s->input_bytes = bytes;
		}
	}
	/* Forward in registration order; backward reversed, or any order the
	 * first iteration records (the schedule must follow what it saw). */
	for (unsigned i = 0; i < s->ng; i++)
		s->fwd_order[i] = i;
	for (unsigned i = 0; i < s->ng; i++)
		s->bwd_order[i] = s->ng - 1 - i;
	if (chance(r, 0.4))
		for (unsigned i = s->ng; i > 1; i--) {
			unsigned j = (unsigned)(rnd(r) % i), tmp = s->bwd_order[i - 1];
			s->bwd_order[i - 1] = s->bwd_order[j];
			s->bwd_order[j] = tmp;
		}

	/* Faults: some scenarios run clean, so that long fault-free sequences are covered too. */
	fault_ctx *f = &s->fc;
	f->seed = vmmrt__mix64(s->seed ^ 0xfa017ULL);
	bool armed = cfg.fault_rate > 0 && chance(r, 0.65);
	f->rate = armed ? cfg.fault_rate : 0;
	f->delay_rate = (armed || chance(r, 0.3)) ? cfg.delay_rate : 0;
	f->max_delay_us = (uint64_t)cfg.max_delay_ms * 1000;
	f->stall_us = (uint64_t)cfg.stall_ms * 1000;
	f->stall_rate = 0.05;
	f->oom_retries = s->oom_retries;
	atomic_store(&f->armed, armed ? 1 : 0);
	atomic_store(&f->stall_left, (armed && cfg.stall_ms && chance(r, 1.0 / 6)) ? 1 : 0);

	/*
	 * Some remap scenarios end, without a sync, right after the last forward
	 * of their second iteration (the first one records the schedule, and
	 * only then does look-ahead begin), a while before the runtime is
	 * destroyed: the restore of the first backward was requested ahead and
	 * waits on the H2D stream for a map that waits for its group's release,
	 * itself still behind a slow D2H. Teardown must wait for that release
	 * before it lets the restore write the slot (#17); one that did not was
	 * missed by every other way a scenario ends. The group (k) has two
	 * tensors or more, of the largest size, so its copies take several of
	 * the latency model's 256 KiB steps (13 ms each here) and an unmap in
	 * the middle of one faults; the others' are small, so its D2H starts at
	 * once; the backward order starts with it.
	 */
	unsigned k = s->ng;
	for (unsigned i = 0; i + 1 < s->ng; i++)
		if (s->G[i].nt >= 2)
			k = i;
	s->end_in_flight = s->mode == VMMRT_MODE_REMAP && k < s->ng && cfg.lookahead.hi >= 1 && chance(r, 0.15);
	if (s->end_in_flight) {
		s->latency = true;
		s->gbps = 0.02;
		if (s->lookahead == 0)
			s->lookahead = 1;
		s->input_bytes = 8;
		for (unsigned i = 0; i < s->ng; i++)
			for (unsigned t = 0; t < s->G[i].nt; t++) {
				tens *x = &s->G[i].t[t];
				x->d.bytes = (size_t)(i == k ? cfg.tensor_bytes.hi : cfg.tensor_bytes.lo) & ~(size_t)7;
				if (x->d.bytes < 8)
					x->d.bytes = 8;
				x->d.shape[0] = (int64_t)(x->d.bytes / 8);
				if (x->d.bytes > s->input_bytes)
					s->input_bytes = x->d.bytes;
			}
		for (unsigned i = 0; i < s->ng; i++)
			if (s->bwd_order[i] == k) {
				s->bwd_order[i] = s->bwd_order[0];
				s->bwd_order[0] = k;
			}
	}

	/* The order: all forwards then all backwards, or (not for the end in
	 * flight, which needs that order) a random legal one: at each step a
	 * forward not yet run or a backward whose forward ran (1F1B and
	 * interleaved chunks are among them). Declared before allocation, or
	 * recorded by the first iteration. */
	s->interleaved = !s->end_in_flight && chance(r, 0.5);
	if (!s->interleaved) {
		synth_order_cfg o = {.layers = s->ng, .fwd_order = s->fwd_order, .bwd_order = s->bwd_order};
		(void)synth_order(&o, s->use_g, s->use_b); /* afab: it cannot fail */
	} else {
		bool fdone[MAXG] = {0}, bdone[MAXG] = {0};
		unsigned n = 0, nf = 0, nb = 0;
		while (n < 2 * s->ng) {
			bool fwd = nf < s->ng && (nb == nf || chance(r, 0.5));
			for (unsigned pick = (unsigned)(rnd(r) % s->ng), tries = 0;; pick = (pick + 1) % s->ng, tries++) {
				if (fwd ? !fdone[pick] : fdone[pick] && !bdone[pick]) {
					(fwd ? fdone : bdone)[pick] = true;
					s->use_g[n] = pick;
					s->use_b[n++] = !fwd;
					if (fwd)
						nf++;
					else
						nb++;
					break;
				}
				if (tries > s->ng)
					break; /* not reached: a forward or a backward is always ready */
			}
		}
	}
	s->declared = chance(r, 0.4);
	/* Allocation maps every group for capture, outside remap's budget, and
	 * a group the schedule keeps resident holds that backing until its first
	 * backward's release: the peak is measured from the end of iteration 1,
	 * when every group's first release has run (its second map waited for it). */
	s->reset_at = 2;
}

static vmmrt_status set_opt(vmmrt_options *o, const char *k, const char *v)
{
	vmmrt_status st = vmmrt_options_set(o, k, v);
	if (st != VMMRT_OK)
		t_fail(0, "setup", "option %s=%s: %s", k, v, vmmrt_last_error());
	return st;
}

static bool create_runtime(scen *s)
{
	vmmrt_options *o = NULL;
	char buf[64];
	bool good = false;

	if (vmmrt_options_create(&o) != VMMRT_OK) {
		t_fail(s->seed, "setup", "options: %s", vmmrt_last_error());
		return false;
	}
	if (set_opt(o, "backend", cfg.backend) || set_opt(o, "mode", mode_name(s->mode)))
		goto out;
#define OPTU(name, v) \
	do { \
		snprintf(buf, sizeof(buf), "%llu", (unsigned long long)(v)); \
		if (set_opt(o, name, buf)) \
			goto out; \
	} while (0)
	OPTU("lookahead", s->lookahead);
	OPTU("driver_workers", s->workers);
	OPTU("handle_pool", s->pool);
	OPTU("oom_retries", s->oom_retries);
	OPTU("oom_backoff_us", 50);
	OPTU("timeout_ms", cfg.timeout_ms);
	OPTU("checked_threads", 1);
	OPTU("host_granularity", s->gran);
	OPTU("host_latency", s->latency);
	snprintf(buf, sizeof(buf), "%g", s->gbps);
	if (set_opt(o, "host_copy_gbps", buf) || set_opt(o, "host_capacity", "1G"))
		goto out;
#undef OPTU
	/* No hook yet: creation itself must succeed. */
	vmmrt_status st = API(s, "vmmrt_runtime_create", vmmrt_runtime_create(o, &s->rt));
	if (st != VMMRT_OK) {
		t_fail(s->seed, "setup", "vmmrt_runtime_create: %s", vmmrt_last_error());
		s->rt = NULL;
		goto out;
	}
	vmmrt_runtime_info info = {.size = sizeof(info)};
	if (vmmrt_runtime_info_get(s->rt, &info) != VMMRT_OK || info.mode != s->mode ||
	    info.driver_workers != s->workers || info.lookahead != s->lookahead) {
		t_fail(s->seed, "setup", "runtime info does not match the options: %s", vmmrt_last_error());
		goto out;
	}
	s->cuda = strcmp(info.backend, "cuda") == 0;
	/* What the backend really uses: a GPU ignores host_granularity (2 MiB on the H200). */
	s->gran = info.granularity;
	if (API(s, "vmmrt_mem_info", vmmrt_mem_info(s->rt, &s->base_free, &s->base_total)) != VMMRT_OK) {
		t_fail(s->seed, "setup", "vmmrt_mem_info: %s", vmmrt_last_error());
		goto out;
	}
	vmmrt__drv_set_fault_hook(s->rt, t_fault_hook, &s->fc);
	atomic_store(&s->th->rt, s->rt);
	good = true;
out:
	vmmrt_options_destroy(o);
	return good;
}

/* ------------------------------------------------------------ verification */

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

static void verify(scen *s)
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
static void excuse_pending(scen *s)
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
static bool drain_compute(scen *s, uint64_t limit_ms)
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

static uint64_t drain_limit_ms(scen *s)
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
static void checkpoint(scen *s, bool sync)
{
	if (sync && !s->errored)
		s_ok(s, API(s, "vmmrt_offload_sync", vmmrt_offload_sync(s->rt)), "vmmrt_offload_sync");
	if (s->stuck || !drain_compute(s, drain_limit_ms(s))) {
		if (!s->stuck && !s->errored)
			t_fail(s->seed, "hang",
			       "the compute stream did not drain in %llu ms and no error was reported (%s, %u groups)",
			       (unsigned long long)drain_limit_ms(s), mode_name(s->mode), s->ng);
		s->stuck = true;
		excuse_pending(s);
		return;
	}
	verify(s);
	hostfn_probe_check(s);
	invariants(s);
}

/* ----------------------------------------------------------------- phases */

static bool discover(scen *s)
{
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (!s_ok(s, API(s, "vmmrt_group_create", vmmrt_group_create(s->rt, g->name, &g->g)),
			  "vmmrt_group_create"))
			return false;
		for (unsigned k = 0; k < g->nt; k++)
			if (!s_ok(s, API(s, "vmmrt_group_discover", vmmrt_group_discover(g->g, &g->t[k].d)),
				  "vmmrt_group_discover"))
				return false;
	}
	return true;
}

/* The order, for the library: the non-empty groups' uses. */
static bool declare(scen *s)
{
	vmmrt_group *groups[MAXG];
	for (unsigned i = 0; i < s->ng; i++)
		groups[i] = s->G[i].nt ? s->G[i].g : NULL;
	return s_ok(s, API(s, "vmmrt_offload_set_schedule", synth_declare(s->rt, groups, s->use_g, s->use_b, 2 * s->ng)),
		    "vmmrt_offload_set_schedule");
}

/* A failed allocation leaves nothing behind and may be retried. */
static bool allocate_retrying(scen *s)
{
	if (s->declared && !declare(s))
		return false;
	for (int attempt = 0;; attempt++) {
		vmmrt_status st = API(s, "vmmrt_offload_allocate", vmmrt_offload_allocate(s->rt));
		if (st == VMMRT_OK)
			break;
		if (attempt == 2 || !explained(s, st) || !named(st, vmmrt_last_error()))
			return s_ok(s, st, "vmmrt_offload_allocate");
		atomic_fetch_add_explicit(&T.named_errors, 1, memory_order_relaxed);
		t_note(2, "scenario %016" PRIx64 ": allocation failed (%s), retrying: %s", s->seed, vmmrt_status_name(st),
		       vmmrt_last_error());
	}
	s->recorded = s->declared;
	return true;
}

static bool allocate(scen *s)
{
	if (!allocate_retrying(s))
		return false;
	s->allocated = true;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (vmmrt_group_get_state(g->g) != VMMRT_GROUP_ALLOCATED)
			t_fail(s->seed, "state", "group %s: state %d after allocation", g->name,
			       (int)vmmrt_group_get_state(g->g));
		g->base = vmmrt_group_address(g->g);
		g->bytes = vmmrt_group_bytes(g->g);
		if (g->nt && !g->base)
			t_fail(s->seed, "state", "group %s: no address after allocation", g->name);
		if (g->nt)
			t_range_add(g->base, round_up(g->bytes, s->gran), s->seed);
	}
	static const int plant_bits[] = {
		[PLANT_NONE] = 0,
		[PLANT_FORWARD_FENCE] = VMMRT__DROP_FORWARD_FENCE,
		[PLANT_BACKWARD_FENCE] = VMMRT__DROP_BACKWARD_FENCE,
		[PLANT_EARLY_RELEASE] = VMMRT__PLANT_EARLY_RELEASE,
	};
	if (cfg.plant)
		vmmrt__offload_test_plant(s->rt, plant_bits[cfg.plant]);
	return true;
}

static bool app_objects(scen *s)
{
	if (!s_ok(s, API(s, "vmmrt_slot_create", vmmrt_slot_create(s->rt, s->input_bytes, &s->input)),
		  "vmmrt_slot_create(input)")) {
		s->input = NULL;
		return false;
	}
	if (!s_ok(s, API(s, "vmmrt_slot_map", vmmrt_slot_map(s->input)), "vmmrt_slot_map(input)"))
		return false;
	t_range_add(vmmrt_slot_address(s->input), vmmrt_slot_size(s->input), s->seed);
	if (!s_ok(s, API(s, "vmmrt_slot_create", vmmrt_slot_create(s->rt, 8 * (size_t)s->nres, &s->results)),
		  "vmmrt_slot_create(results)")) {
		s->results = NULL;
		return false;
	}
	if (!s_ok(s, API(s, "vmmrt_slot_map", vmmrt_slot_map(s->results)), "vmmrt_slot_map(results)"))
		return false;
	t_range_add(vmmrt_slot_address(s->results), vmmrt_slot_size(s->results), s->seed);
	void *p = NULL;
	if (!s_ok(s, API(s, "vmmrt_host_alloc", vmmrt_host_alloc(s->rt, (size_t)MAXIT * s->nres * 8, &p)),
		  "vmmrt_host_alloc(results)"))
		return false;
	s->hres = p;
	return true;
}

/* A descriptor that differs from discovery in one field. */
static void drift(trng *r, vmmrt_tensor_desc *d)
{
	switch (rnd(r) % 6) {
	case 0: d->bytes += 8; break;
	case 1: d->dtype ^= 1; break;
	case 2: d->ndim = d->ndim % VMMRT_MAX_DIMS + 1; break;
	case 3: d->shape[0]++; break;
	case 4: d->stride[0]++; break;
	default: d->align = (d->align ? d->align : 256) * 2; break;
	}
}

/* begin / save each tensor (with drifted saves refused) / end; addresses checked. */
static bool capture_group(scen *s, grp *g, bool again)
{
	vmmrt_devptr a;
	trng *r = &s->r;
	if (!s_ok(s, API(s, "vmmrt_group_begin_capture", vmmrt_group_begin_capture(g->g)), "vmmrt_group_begin_capture"))
		return false;
	if (g->nt && chance(r, 0.2)) {
		/* Hooks on a capturing group are refused. */
		s_expect(s, API(s, "vmmrt_forward_begin", vmmrt_forward_begin(g->g, s->compute)), VMMRT_E_INVALID_STATE,
			 "vmmrt_forward_begin on a capturing group");
	}
	for (unsigned k = 0; k < g->nt && !s->errored; k++) {
		tens *t = &g->t[k];
		if (chance(r, 0.15)) {
			vmmrt_tensor_desc d = t->d;
			drift(r, &d);
			s_expect(s, API(s, "vmmrt_group_save", vmmrt_group_save(g->g, &d, 0, NULL, &a)), VMMRT_E_MISMATCH,
				 "vmmrt_group_save with a drifted descriptor");
		}
		if (k + 1 == g->nt && chance(r, 0.1)) {
			/* Ending before the last save: refused, and the group needs a new capture. */
			s_expect(s, API(s, "vmmrt_group_end_capture", vmmrt_group_end_capture(g->g)), VMMRT_E_MISMATCH,
				 "vmmrt_group_end_capture with a tensor missing");
			if (s->errored)
				return false;
			return capture_group(s, g, again);
		}
		/* A copy source on the first capture, sometimes: a device-to-device copy into the slot. */
		bool copy = !again && chance(r, 0.3) && t->d.bytes <= s->input_bytes;
		vmmrt_status st = API(s, "vmmrt_group_save",
				      vmmrt_group_save(g->g, &t->d, copy ? vmmrt_slot_address(s->input) : 0,
						       copy ? s->compute : NULL, &a));
		if (!s_ok(s, st, "vmmrt_group_save"))
			return false;
		size_t al = t->d.align ? t->d.align : 256;
		if (a < g->base || a + t->d.bytes > g->base + g->bytes || a % al)
			t_fail(s->seed, "address",
			       "group %s tensor %u: address 0x%llx is outside [0x%llx, +%zu) or not aligned to %zu",
			       g->name, k, (unsigned long long)a, (unsigned long long)g->base, g->bytes, al);
		if (again && a != t->addr)
			t_fail(s->seed, "moved", "group %s tensor %u: captured again at 0x%llx, was 0x%llx", g->name, k,
			       (unsigned long long)a, (unsigned long long)t->addr);
		t->addr = a;
	}
	if (s->errored)
		return false;
	if (g->nt && chance(r, 0.1))
		s_expect(s, API(s, "vmmrt_group_save", vmmrt_group_save(g->g, &g->t[0].d, 0, NULL, &a)), VMMRT_E_MISMATCH,
			 "vmmrt_group_save past the last tensor");
	if (!s_ok(s, API(s, "vmmrt_group_end_capture", vmmrt_group_end_capture(g->g)), "vmmrt_group_end_capture"))
		return false;
	/* FAILED is legal: a map or release of an earlier iteration, retrying
	 * on a worker under an injected fault, reported meanwhile. The group's
	 * error must then name it (s_ok checks that, and that a fault explains it). */
	vmmrt_group_state gs = vmmrt_group_get_state(g->g);
	if (gs == VMMRT_GROUP_FAILED && !s->errored &&
	    s_ok(s, API(s, "vmmrt_group_error", vmmrt_group_error(g->g)), "vmmrt_group_error"))
		t_fail(s->seed, "state", "group %s: FAILED after capture, but vmmrt_group_error says nothing", g->name);
	else if (gs != VMMRT_GROUP_READY && gs != VMMRT_GROUP_FAILED && !s->errored)
		t_fail(s->seed, "state", "group %s: state %d after capture", g->name, (int)gs);
	return true;
}

/* A graph capture that failed half-way leaves the stream capturing: end it quietly. */
static void abandon_capture(scen *s)
{
	vmmrt_graph *gr = NULL;
	s_quiet(s, true);
	if (API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(s->rt, s->compute, &gr)) == VMMRT_OK)
		(void)API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(s->rt, gr));
	s_quiet(s, false);
}

/* The layer's library calls, each accounted for as any other of the
 * scenario's (s_ok: a failure must be named and explained). */
static vmmrt_status op_layer(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, vmmrt_devptr dst, vmmrt_devptr src,
			     size_t bytes, uint64_t pattern, uint64_t ns)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_layer", vmmrt_kernel_layer(rt, st, dst, src, bytes, pattern, ns));
	(void)s_ok(s, r, "vmmrt_kernel_layer");
	return r;
}

static vmmrt_status op_checksum(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, vmmrt_devptr src, size_t bytes,
				vmmrt_devptr result)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_checksum", vmmrt_kernel_checksum(rt, st, src, bytes, result));
	(void)s_ok(s, r, "vmmrt_kernel_checksum");
	return r;
}

static vmmrt_status op_busy(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, uint64_t ns)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_busy", vmmrt_kernel_busy(rt, st, ns));
	(void)s_ok(s, r, "vmmrt_kernel_busy");
	return r;
}

static const synth_ops scenario_ops = {op_layer, op_checksum, op_busy};

/* The group as the synthetic model's layer (synth.h): a tensor each, every
 * backward's checksum to the tensor's word of the result slot. */
static synth_layer as_layer(scen *s, const grp *g, synth_tensor *t)
{
	for (unsigned k = 0; k < g->nt; k++)
		t[k] = (synth_tensor){.act = g->t[k].addr, .bytes = g->t[k].d.bytes, .pattern = g->t[k].seed,
				      .bwd_sum = vmmrt_slot_address(s->results) + 8 * g->t[k].rix};
	return (synth_layer){.input = vmmrt_slot_address(s->input), .fwd_ns = s->fwd_ns, .bwd_ns = s->bwd_ns,
			     .n = g->nt, .t = t, .ops = &scenario_ops, .ctx = s};
}

/* One graph of the layer: its forward's or its backward's. */
static bool capture_graph(scen *s, const synth_layer *l, bool bwd, vmmrt_graph **out)
{
	vmmrt_runtime *rt = s->rt;
	if (!s_ok(s, API(s, "vmmrt_graph_begin_capture", vmmrt_graph_begin_capture(rt, s->compute)),
		  "vmmrt_graph_begin_capture"))
		return false;
	if ((bwd ? synth_backward : synth_forward)(rt, s->compute, l) != VMMRT_OK) {
		abandon_capture(s);
		return false;
	}
	if (!s_ok(s, API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(rt, s->compute, out)),
		  "vmmrt_graph_end_capture")) {
		*out = NULL;
		abandon_capture(s);
		return false;
	}
	return true;
}

static bool capture_graphs(scen *s, grp *g)
{
	synth_tensor t[MAXT];
	if (!g->nt)
		return true;
	synth_layer l = as_layer(s, g, t);
	return capture_graph(s, &l, false, &g->fwd) && capture_graph(s, &l, true, &g->bwd);
}

static bool capture(scen *s)
{
	for (unsigned i = 0; i < s->ng; i++)
		if (!capture_group(s, &s->G[i], false) || !capture_graphs(s, &s->G[i]))
			return false;
	s->captured = true;
	return true;
}

/* ------------------------------------------------------------- iterations */

typedef enum { RUN_DONE, RUN_ERROR, RUN_MIDWAY } run_end;

/*
 * A hook, and the check that it did not block the launch thread: a hook only
 * enqueues work. The one wait it may make (and count) is for a remap request
 * of its own still in flight from VMMRT__REQ_RING iterations back; after a
 * quiet point (a checkpoint: sync, compute stream drained) every request
 * made before it has finished, so the iterations that cannot reach that far
 * back (a look-ahead map for the next iteration included) must not block.
 */
static vmmrt_status hook(scen *s, unsigned it, grp *g, bool bwd, bool end)
{
	static const char *const names[2][2] = {{"vmmrt_forward_begin", "vmmrt_forward_end"},
						 {"vmmrt_backward_begin", "vmmrt_backward_end"}};
	vmmrt_status (*const fn[2][2])(vmmrt_group *, vmmrt_stream) = {{vmmrt_forward_begin, vmmrt_forward_end},
								       {vmmrt_backward_begin, vmmrt_backward_end}};
	uint64_t b0 = vmmrt__drv_launch_thread_blocking(s->rt);
	vmmrt_status st = API(s, names[bwd][end], fn[bwd][end](g->g, s->compute));
	uint64_t n = vmmrt__drv_launch_thread_blocking(s->rt) - b0;
	if (st == VMMRT_OK && n && it + 1 < s->quiet_it + VMMRT__REQ_RING)
		t_fail(s->seed, "blocking",
		       "%s of group %s blocked the launch thread %llu times in iteration %u (%u after the last quiet "
		       "point; %s, %u groups, lookahead %u, %u workers)",
		       names[bwd][end], g->name, (unsigned long long)n, it, it - s->quiet_it, mode_name(s->mode), s->ng,
		       s->lookahead, s->workers);
	return st;
}

/*
 * Abandon the iteration under way (vmmrt_offload_abort): what it enqueued
 * drains, every group is back at the start of an iteration, the results of
 * its backwards that ran are checked as any others. Remap must then hold no
 * memory at all. After a failed hook (recover), injected faults are off
 * around it: the abort is the clean-up.
 */
static bool abort_iteration(scen *s, unsigned it, bool recover)
{
	if (recover)
		s_quiet(s, true);
	vmmrt_status st = API(s, "vmmrt_offload_abort", vmmrt_offload_abort(s->rt));
	if (recover)
		s_quiet(s, false);
	if (!s_ok(s, st, "vmmrt_offload_abort"))
		return false;
	atomic_fetch_add_explicit(&T.aborts, 1, memory_order_relaxed);
	if (edges_here(s, 8 + it % 8))
		illegal_edges(s, s->ng, true);
	vmmrt_offload_stats os = {.size = sizeof(os)};
	if (!s_ok(s, API(s, "vmmrt_offload_stats_get", vmmrt_offload_stats_get(s->rt, &os)), "vmmrt_offload_stats_get"))
		return false;
	if (s->mode == VMMRT_MODE_REMAP && !fault_causes(&s->fc) && os.activation_bytes)
		t_fail(s->seed, "abort", "remap holds %llu bytes of activations after an abort in iteration %u",
		       (unsigned long long)os.activation_bytes, it);
	/* A recording completes when its last use begins: an abort after that
	 * (or a hook failing past that point) keeps the order, one before it
	 * starts the recording again. A known order is never forgotten. */
	if (s->recorded && !os.schedule_recorded)
		t_fail(s->seed, "abort", "the abort in iteration %u forgot the recorded order", it);
	s->recorded = os.schedule_recorded;
	/* Everything the abandoned iteration asked for has finished. Its maps
	 * ran past the budget (so that none a stream waited for was held): the
	 * peak is measured again from a whole iteration after it. */
	s->quiet_it = it + 1;
	s->stats_reset = false;
	s->reset_at = it + 2;
	return true;
}

/*
 * A new shape for some groups, between iterations: everything before is
 * verified with the old tensors; the groups are re-discovered with new
 * sizes and seeds, allocated again (new addresses, never one still held by a
 * retired allocation: t_range_add checks), captured again; the old graphs
 * and ranges stay until a release.
 */
static bool release_old(scen *s)
{
	for (unsigned i = 0; i < s->nold_graphs; i++)
		s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(s->rt, s->old_graphs[i])), "vmmrt_graph_destroy");
	s->nold_graphs = 0;
	for (unsigned i = 0; i < s->nold_base; i++)
		t_range_del(s->old_base[i]);
	s->nold_base = 0;
	return s_ok(s, API(s, "vmmrt_offload_release_retired", vmmrt_offload_release_retired(s->rt)),
		    "vmmrt_offload_release_retired");
}

static bool rediscover(scen *s)
{
	trng *r = &s->r;
	checkpoint(s, true);
	if (s->errored || s->stuck)
		return false;
	bool pick[MAXG] = {0};
	unsigned n = 0;
	for (unsigned i = 0; i < s->ng; i++)
		if (s->G[i].nt && (pick[i] = chance(r, 0.5)))
			n++;
	for (unsigned i = 0; i < s->ng && !n; i++)
		if (s->G[i].nt)
			pick[i] = true, n++;
	if (s->nold_graphs + 2 * n > 4 * MAXG && !release_old(s))
		return false;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (!pick[i])
			continue;
		if (!s_ok(s, API(s, "vmmrt_group_rediscover", vmmrt_group_rediscover(g->g)), "vmmrt_group_rediscover"))
			return false;
		/* the old graphs may still run over the old addresses: kept */
		s->old_graphs[s->nold_graphs++] = g->fwd;
		s->old_graphs[s->nold_graphs++] = g->bwd;
		g->fwd = g->bwd = NULL;
		s->old_base[s->nold_base++] = g->base;
		g->base = 0;
		for (unsigned k = 0; k < g->nt; k++) {
			tens *t = &g->t[k];
			size_t hi = cfg.tensor_bytes.hi < s->input_bytes ? cfg.tensor_bytes.hi : s->input_bytes;
			size_t bytes = (size_t)rnd_in(r, cfg.tensor_bytes.lo, hi) & ~(size_t)7;
			t->d.bytes = bytes < 8 ? 8 : bytes;
			t->d.shape[0] = (int64_t)(t->d.bytes / 8);
			t->seed = rnd(r) | 1;
			if (!s_ok(s, API(s, "vmmrt_group_discover", vmmrt_group_discover(g->g, &t->d)),
				  "vmmrt_group_discover"))
				return false;
		}
	}
	if (!allocate_retrying(s))
		return false;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		if (!pick[i])
			continue;
		g->base = vmmrt_group_address(g->g);
		g->bytes = vmmrt_group_bytes(g->g);
		t_range_add(g->base, round_up(g->bytes, s->gran), s->seed);
		if (!capture_group(s, g, false) || !capture_graphs(s, g))
			return false;
	}
	s->reallocated = true;
	/* New initial backings, outside the budget, until their first release:
	 * the peak is measured again from the end of the second iteration on. */
	s->stats_reset = false;
	s->reset_at = s->iters + 2;
	atomic_fetch_add_explicit(&T.rediscoveries, 1, memory_order_relaxed);
	return !chance(r, 0.5) || release_old(s);
}

static run_end run_iterations(scen *s)
{
	trng *r = &s->r;
	vmmrt_runtime *rt = s->rt;
	const double p_illegal = 0.08;
	/* Shutdown mid-run: stop at one use, with its hooks open or not. */
	bool mid = chance(r, 0.12);
	unsigned mid_it = (unsigned)rnd_in(r, 0, s->target_iters - 1);
	unsigned mid_pos = (unsigned)rnd_in(r, 0, 2 * s->ng - 1);
	bool mid_open = chance(r, 0.5);
	if (s->end_in_flight) {
		mid = true;
		mid_it = 1;     /* the schedule is recorded: look-ahead is on */
		mid_pos = s->ng; /* after the last forward's end, before the first backward */
		mid_open = false;
	}

	for (unsigned it = 0; it < s->target_iters && it < MAXIT; it++) {
		if (t_stopping())
			return RUN_DONE;
		/* An abort at some point of this iteration, after a begin or not. */
		bool abort_here = chance(r, 0.08);
		unsigned abort_pos = (unsigned)rnd_in(r, 0, 2 * s->ng);
		bool abort_open = chance(r, 0.4);
		bool aborted = false;
		s->iterseed[it] = rnd(r) | 1;
		for (unsigned k = 0; k < s->nres; k++)
			s->hres[(size_t)it * s->nres + k] = RESULT_POISON;
		s->iters = it + 1;
		if (!s_ok(s, API(s, "vmmrt_kernel_fill", vmmrt_kernel_fill(rt, s->compute, vmmrt_slot_address(s->input),
									    s->input_bytes, s->iterseed[it])),
			  "vmmrt_kernel_fill"))
			return RUN_ERROR;
		if (!s->probe_pending && chance(r, 0.08))
			hostfn_probe_launch(s);
		for (unsigned pos = 0; pos < 2 * s->ng && !aborted; pos++) {
			{
				bool bwd = s->use_b[pos];
				unsigned gi = s->use_g[pos];
				grp *g = &s->G[gi];
				if (chance(r, p_illegal))
					illegal_hooks(s, it, pos);
				if (it < 2 && edges_here(s, 16 + it * 2 * MAXG + pos) && !s->errored)
					illegal_edges(s, s->ng, true);
				if (s->errored)
					return RUN_ERROR;
				if (mid && it == mid_it && pos == mid_pos && !mid_open)
					return RUN_MIDWAY;
				if (abort_here && pos == abort_pos && !abort_open) {
					if (!abort_iteration(s, it, false))
						return RUN_ERROR;
					aborted = true;
					break;
				}
				vmmrt_status hst = hook(s, it, g, bwd, false);
				if (hst != VMMRT_OK &&
				    !s_ok(s, hst, bwd ? "vmmrt_backward_begin" : "vmmrt_forward_begin") && chance(r, 0.5) &&
				    s->fc.rate > 0 && !s->stuck) {
					/* A hook that failed: abandon the iteration and go on, instead
					 * of winding down (the graphs stay valid). */
					s->errored = false;
					if (!abort_iteration(s, it, true))
						return RUN_ERROR;
					atomic_fetch_add_explicit(&T.recoveries, 1, memory_order_relaxed);
					aborted = true;
					break;
				}
				if (hst != VMMRT_OK)
					return RUN_ERROR;
				if (g->nt && chance(r, p_illegal))
					illegal_open_hook(s, gi, bwd);
				if (s->errored)
					return RUN_ERROR;
				if (g->nt && !s_ok(s, API(s, "vmmrt_graph_launch",
							  vmmrt_graph_launch(rt, bwd ? g->bwd : g->fwd, s->compute)),
						   "vmmrt_graph_launch"))
					return RUN_ERROR;
				if (mid && it == mid_it && pos == mid_pos)
					return RUN_MIDWAY;
				if (abort_here && pos == abort_pos) {
					if (!abort_iteration(s, it, false))
						return RUN_ERROR;
					aborted = true;
					break;
				}
				if (!s_ok(s, hook(s, it, g, bwd, true), bwd ? "vmmrt_backward_end" : "vmmrt_forward_end"))
					return RUN_ERROR;
				if (bwd && g->nt) {
					unsigned rix = g->t[0].rix;
					if (!s_ok(s, API(s, "cuMemcpyDtoHAsync(results)",
							 vmmrt__drv_memcpy_dtoh_async(
								 rt, &s->hres[(size_t)it * s->nres + rix],
								 vmmrt_slot_address(s->results) + 8 * rix, 8 * g->nt,
								 s->compute)),
						  "result copy"))
						return RUN_ERROR;
					s->launched[it][gi] = 1;
				}
			}
		}
		if (!aborted) {
			s->recorded = true; /* a whole iteration ran: the order is known */
			atomic_fetch_add_explicit(&T.iterations, 1, memory_order_relaxed);
		}
		if (chance(r, 0.04) && !rediscover(s))
			return RUN_ERROR;
		/* Between iterations: capture a group again, poke at slots and handles, check. */
		if (chance(r, 0.06)) {
			unsigned gi = (unsigned)(rnd(r) % s->ng);
			if (s->G[gi].nt && !capture_group(s, &s->G[gi], true))
				return RUN_ERROR;
		}
		if (chance(r, 0.05))
			illegal_slots(s);
		if (chance(r, 0.05))
			slot_backing(s);
		if (chance(r, 0.03) && !s->cuda)
			illegal_handles(s);
		if (s->errored)
			return RUN_ERROR;
		if (it == 0 || chance(r, 0.2)) {
			checkpoint(s, true);
			if (s->errored || s->stuck)
				return RUN_ERROR;
			s->quiet_it = it + 1;
			if (!s->stats_reset && it + 1 >= s->reset_at) {
				(void)vmmrt_offload_stats_reset(rt);
				s->stats_reset = true;
			}
		}
	}
	return RUN_DONE;
}

/* --------------------------------------------------------------- teardown */

/*
 * The application lets one and a half steps of the copy model pass (so a
 * teardown that is wrong lets the restore start early enough to be writing
 * the slot when its release unmaps it), and from then on every cuMemCreate
 * takes two steps (so the slot stays unmapped a while before the map that
 * waited for that release makes it again): what a wrong teardown does to the
 * slot then faults.
 */
static void end_in_flight(scen *s)
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
static void teardown(scen *s, bool sync)
{
	vmmrt_runtime *rt = s->rt;
	trng *r = &s->r;

	if (s->compute && !s->stuck) {
		if (sync && s->allocated && !s->errored)
			checkpoint(s, true);
		else if (drain_compute(s, drain_limit_ms(s))) {
			verify(s);
			hostfn_probe_check(s);
		} else {
			if (!s->errored)
				t_fail(s->seed, "hang", "the compute stream did not drain in %llu ms and no error was reported",
				       (unsigned long long)drain_limit_ms(s));
			s->stuck = true;
		}
	}
	if (s->stuck)
		excuse_pending(s);
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

void scenario_run(tthread *th, uint64_t seed)
{
	scen *s = calloc(1, sizeof(*s));
	if (!s) {
		t_fail(seed, "setup", "out of memory");
		return;
	}
	s->th = th;
	s->seed = seed;
	s->r.s = seed;
	atomic_store(&th->scenario, seed);
	t_set_scenario(seed);
	th->lasterr[0] = '\0';
	configure(s);
	t_note(2, "scenario %016" PRIx64 ": %s, %u groups (%u empty), lookahead %u, %u workers, pool %u, %u iterations, "
		  "%s, fault rate %g%s; %s order, %s",
	       seed, mode_name(s->mode), s->ng, s->ng - s->nonempty, s->lookahead, s->workers, s->pool,
	       s->target_iters, s->latency ? "latency model" : "no latency model", s->fc.rate,
	       atomic_load(&s->fc.stall_left) ? ", one stall" : "", s->interleaved ? "an interleaved" : "the classic",
	       s->declared ? "declared" : "recorded");
	if (s->interleaved)
		atomic_fetch_add_explicit(&T.schedules_interleaved, 1, memory_order_relaxed);
	if (s->declared)
		atomic_fetch_add_explicit(&T.schedules_declared, 1, memory_order_relaxed);
	if (chance(&s->r, 0.05))
		illegal_options(s);
	if (!create_runtime(s)) {
		atomic_store(&th->rt, NULL);
		if (s->rt)
			(void)vmmrt_runtime_destroy(s->rt);
		free(s);
		return;
	}
	bool sync = chance(&s->r, 0.6);
	if (s_ok(s, API(s, "vmmrt_stream_create", vmmrt_stream_create(s->rt, &s->compute)), "vmmrt_stream_create")) {
		if (edges_here(s, 1))
			illegal_edges(s, 0, false);
		if (!s->errored && discover(s)) {
			if (chance(&s->r, 0.3))
				illegal_life_cycle(s, false);
			if (edges_here(s, 2) && !s->errored)
				illegal_edges(s, s->ng, false);
			if (!s->errored && allocate(s)) {
				if (chance(&s->r, 0.3))
					illegal_life_cycle(s, true);
				if (edges_here(s, 3) && !s->errored)
					illegal_edges(s, s->ng, true);
				if (!s->errored && app_objects(s) && capture(s)) {
					switch (run_iterations(s)) {
					case RUN_MIDWAY:
						if (s->end_in_flight)
							end_in_flight(s);
						atomic_fetch_add_explicit(&T.shutdowns_mid_run, 1, memory_order_relaxed);
						sync = false;
						break;
					case RUN_DONE:
						if (!sync)
							atomic_fetch_add_explicit(&T.destroys_in_flight, 1, memory_order_relaxed);
						break;
					case RUN_ERROR:
						break;
					}
				}
			}
		}
	} else {
		s->compute = NULL;
	}
	teardown(s, sync);
	if (fault_causes(&s->fc) && !s->errored)
		atomic_fetch_add_explicit(&T.absorbed, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&T.scenarios, 1, memory_order_relaxed);
	atomic_store(&th->scenario, 0);
	t_set_scenario(0);
	free(s);
}

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

void s_quiet(scen *s, bool on)
{
	atomic_store(&s->fc.teardown, on ? 1 : 0);
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
	s_checkpoint(s, true);
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
		if (!s_capture_group(s, g, false) || !s_capture_graphs(s, g))
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
			if (s->G[gi].nt && !s_capture_group(s, &s->G[gi], true))
				return RUN_ERROR;
		}
		if (chance(r, 0.05))
			illegal_slots(s);
		if (chance(r, 0.05))
			slot_backing(s);
		if (pages_here(s, it))
			slot_pages(s);
		if (chance(r, 0.03) && !s->cuda)
			illegal_handles(s);
		if (s->errored)
			return RUN_ERROR;
		if (it == 0 || chance(r, 0.2)) {
			s_checkpoint(s, true);
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
	s_configure(s);
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
	if (!s_create_runtime(s)) {
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
				if (!s->errored && app_objects(s) && s_capture(s)) {
					switch (run_iterations(s)) {
					case RUN_MIDWAY:
						if (s->end_in_flight)
							s_end_in_flight(s);
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
	s_teardown(s, sync);
	if (fault_causes(&s->fc) && !s->errored)
		atomic_fetch_add_explicit(&T.absorbed, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&T.scenarios, 1, memory_order_relaxed);
	atomic_store(&th->scenario, 0);
	t_set_scenario(0);
	free(s);
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Pipeline schedules on the host backend (and on a GPU: make gpu-suite):
 * 1F1B with p = 2 and 4 microbatches in flight and interleaved chunks, with
 * both strategies, declared before allocation or recorded by the first
 * iteration, every restored activation checked; the ping-pong banks a
 * schedule gets and their fences under the latency model (a dropped fence
 * and a naive bank assignment are caught); abort at every phase of an
 * iteration (a skipped reset is caught); re-discovery with the old graphs
 * still live.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <urcu/uatomic.h>

#include "offload-model.h"
#include "offload.h"
#include "runtime.h"
#include "test-common.h"
#include "test-layers.h"
#include "testing.h"

#define MiB (1024ull * 1024)

static const char *const modes[] = {"pingpong", "remap", "none"};

static vmmrt_offload_stats stats(model *m)
{
	vmmrt_offload_stats s = {.size = sizeof(s)};
	assert_int_equal(vmmrt_offload_stats_get(model_runtime(m), &s), VMMRT_OK);
	return s;
}

/* Run, verify every activation, and return the statistics of the steady state. */
static vmmrt_offload_stats run_and_verify(const model_cfg *cfg, unsigned iters)
{
	model *m;
	unsigned checked;
	assert_int_equal(model_create(cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	/* the steady state's peak: from after the first iteration's releases of
	 * the backing allocation mapped for capture */
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(vmmrt_offload_stats_reset(model_runtime(m)), VMMRT_OK);
	assert_int_equal(model_run(m, iters - 1), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(checked, iters * model_groups(m));
	assert_int_equal(model_stale_messages(m), 0);
	vmmrt_offload_stats s = stats(m);
	assert_int_equal(s.iterations, iters);
	assert_true(s.schedule_recorded);
	assert_int_equal(s.schedule_declared, cfg->declare);
	model_destroy(m);
	return s;
}

/* 1F1B with 2 and 4 microbatches in flight, through the same layers. */
static void one_f_one_b(void **state)
{
	for (unsigned p = 2; p <= 4; p += 2)
		for (int mode = 0; mode < 3; mode++)
			for (int declare = 0; declare < 2; declare++)
				for (unsigned la = 1; la <= 2; la++) {
					model_cfg cfg = {.mode = modes[mode], .layers = 3, .microbatches = 2 * p,
							 .schedule = "1f1b", .inflight = p, .act_bytes = 2 * MiB,
							 .lookahead = la, .declare = declare};
					printf("# 1f1b p=%u %s%s lookahead %u\n", p, cfg.mode, declare ? " declared" : "", la);
					vmmrt_offload_stats s = run_and_verify(&cfg, 3);
					if (mode == 0 && declare)
						assert_int_equal(s.bank_conflicts, 0); /* the banks follow the order */
					if (mode == 1)
						assert_true(s.activation_peak_bytes <= s.budget_groups * 2 * MiB);
				}
}

/* Interleaved: two model chunks of two layers, microbatches in blocks of 2. */
static void interleaved(void **state)
{
	for (int mode = 0; mode < 3; mode++)
		for (int declare = 0; declare < 2; declare++) {
			model_cfg cfg = {.mode = modes[mode], .layers = 4, .chunks = 2, .microbatches = 4,
					 .schedule = "interleaved", .inflight = 2, .act_bytes = 2 * MiB, .lookahead = 2,
					 .declare = declare};
			vmmrt_offload_stats s = run_and_verify(&cfg, 3);
			if (mode == 0 && declare)
				assert_int_equal(s.bank_conflicts, 0);
		}
}

/* The holds of a group on its bank, as the man page states them. */
static bool holds_at(const unsigned *grp, const bool *bwd, unsigned nuses, unsigned g, unsigned la, unsigned x)
{
	unsigned p = 0, q = 0;
	for (unsigned k = 0; k < nuses; k++)
		if (grp[k] == g) {
			if (bwd[k])
				q = k;
			else
				p = k;
		}
	unsigned reach = la ? la : 1;
	if (q - p <= reach)
		return x >= p && x <= q;
	return x == p || (x + la >= q && x <= q);
}

/*
 * The banks a declared schedule gets: all forwards then all backwards at
 * look-ahead 1 needs the two of old, a longer look-ahead one bank more per
 * restore in flight; max_banks caps them (the look-ahead is shortened);
 * and no two groups of one bank ever hold it at the same position.
 */
static void banks_follow_the_schedule(void **state)
{
	struct {
		const char *schedule;
		unsigned inflight, la, max_banks, want_banks, want_la;
	} cases[] = {
		{"afab", 1, 1, 0, 2, 1},
		{"afab", 1, 2, 0, 3, 2},
		{"afab", 1, 3, 2, 2, 1},
		{"1f1b", 2, 1, 0, 0, 1},
		{"1f1b", 4, 2, 0, 0, 2},
		{"1f1b", 4, 3, 2, 1, 0},
	};
	for (unsigned c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		model_cfg cfg = {.mode = "pingpong", .layers = 2, .microbatches = 4, .schedule = cases[c].schedule,
				 .inflight = cases[c].inflight, .act_bytes = 2 * MiB, .lookahead = cases[c].la,
				 .declare = true, .max_banks = cases[c].max_banks};
		model *m;
		unsigned checked;
		assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
		vmmrt_offload_stats s = stats(m);
		printf("# %s p=%u lookahead %u max_banks %u: %u banks, look-ahead in force %u\n", cfg.schedule,
		       cfg.inflight, cfg.lookahead, cfg.max_banks, s.banks, s.lookahead_in_force);
		if (cases[c].want_banks)
			assert_int_equal(s.banks, cases[c].want_banks);
		if (cases[c].max_banks)
			assert_true(s.banks <= cases[c].max_banks);
		assert_int_equal(s.lookahead_in_force, cases[c].want_la);
		assert_int_equal(s.bound_bytes, (uint64_t)s.banks * 2 * MiB);
		/* No clash: at every position, at most one holder per bank. */
		const unsigned *grp;
		const bool *bwd;
		unsigned nuses = model_uses(m, &grp, &bwd);
		for (unsigned x = 0; x < nuses; x++)
			for (unsigned a = 0; a < model_groups(m); a++)
				for (unsigned b = a + 1; b < model_groups(m); b++) {
					vmmrt_group *ga = model_group(m, a), *gb = model_group(m, b);
					if (vmmrt_group_address(ga) == vmmrt_group_address(gb))
						assert_false(holds_at(grp, bwd, nuses, a, s.lookahead_in_force, x) &&
							     holds_at(grp, bwd, nuses, b, s.lookahead_in_force, x));
				}
		assert_int_equal(model_run(m, 3), VMMRT_OK);
		assert_int_equal(model_verify(m, &checked), 0);
		s = stats(m);
		assert_int_equal(s.bank_conflicts, 0);
		assert_true(s.activation_peak_bytes <= s.bound_bytes);
		model_destroy(m);
	}
}

/*
 * The fences under 1F1B, with copies far slower than the graphs: clean with
 * both, and dropping either one (test switch) corrupts restored activations.
 */
static const model_cfg fence_cfg = {.mode = "pingpong", .layers = 2, .microbatches = 4, .schedule = "1f1b",
				    .inflight = 2, .act_bytes = 512 * 1024, .lookahead = 2, .declare = true,
				    .latency = true, .copy_gbps = 0.02, .fwd_ns = 100000, .bwd_ns = 3000000};

static unsigned run_planted_here(const model_cfg *base, int plant, unsigned *conflicts, vmmrt_status *st)
{
	model_cfg cfg = *base;
	cfg.plant = plant;
	model *m;
	unsigned checked, bad;
	*st = model_create(&cfg, &m);
	if (*st != VMMRT_OK)
		return 0;
	*st = model_run(m, 3);
	bad = model_verify(m, &checked);
	vmmrt_offload_stats s = {.size = sizeof(s)};
	(void)vmmrt_offload_stats_get(model_runtime(m), &s);
	*conflicts = (unsigned)s.bank_conflicts;
	model_destroy(m);
	return bad;
}

/* 1: the planted bug showed (corruption, a conflict or a failed hook). */
static int run_planted(const model_cfg *base, int plant)
{
	unsigned conflicts = 0;
	vmmrt_status st = VMMRT_OK;
#if defined(__SANITIZE_THREAD__)
	/* A dropped fence is a real race that ThreadSanitizer reports, as it
	 * should: the planted run goes to a child whose reports are its own. */
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		freopen("/dev/null", "w", stderr);
		unsigned bad = run_planted_here(base, plant, &conflicts, &st);
		_exit(bad || conflicts || st != VMMRT_OK ? 1 : 0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	return WIFEXITED(status) && WEXITSTATUS(status) == 1;
#else
	unsigned bad = run_planted_here(base, plant, &conflicts, &st);
	return bad || conflicts || st != VMMRT_OK;
#endif
}

static void fences_hold_under_1f1b(void **state)
{
	unsigned conflicts = 0;
	vmmrt_status st;
	assert_int_equal(run_planted_here(&fence_cfg, 0, &conflicts, &st), 0);
	assert_int_equal(st, VMMRT_OK);
	assert_int_equal(conflicts, 0);
}

static void dropped_fences_are_caught_under_1f1b(void **state)
{
	assert_true(run_planted(&fence_cfg, VMMRT__DROP_FORWARD_FENCE));
	assert_true(run_planted(&fence_cfg, VMMRT__DROP_BACKWARD_FENCE));
}

/* Alternating banks in creation order, as before schedules, under the
 * look-ahead the declared banks allow: restores then wait for the graph
 * before them, or find their bank taken. */
static void naive_bank_assignment_is_caught(void **state)
{
	model_cfg cfg = fence_cfg;
	cfg.latency = false;
	cfg.fwd_ns = cfg.bwd_ns = 0;
	assert_true(run_planted(&cfg, VMMRT__PLANT_NAIVE_BANKS));
}

/* The first iteration records a 1F1B order; a later one must follow it. */
static void recorded_order_is_followed(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .microbatches = 3, .schedule = "1f1b", .inflight = 2,
			 .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	unsigned checked;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, 2), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	const unsigned *grp;
	const bool *bwd;
	model_uses(m, &grp, &bwd);
	/* the second use instead of the first: a named error, nothing enqueued */
	assert_int_equal(vmmrt_forward_begin(model_group(m, grp[1]), c), VMMRT_E_MISMATCH);
	assert_non_null(strstr(vmmrt_last_error(), "recorded order"));
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(checked, 3 * model_groups(m));
	model_destroy(m);
}

static void declared_schedule_errors(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"lookahead", "1", NULL});
	vmmrt_group *a, *b;
	vmmrt_tensor_desc d = {.bytes = 2 * MiB, .dtype = 7, .ndim = 1, .shape = {(int64_t)(MiB / 4)}, .stride = {1}};
	assert_int_equal(vmmrt_group_create(rt, "a", &a), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "b", &b), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(a, &d), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(b, &d), VMMRT_OK);
	/* No steps: forgets a declared order (it wrote through arrays a
	 * schedule of no uses never has). */
	assert_int_equal(vmmrt_offload_set_schedule(rt, NULL, 0), VMMRT_OK);
	vmmrt_schedule_step bad_order[] = {{a, 0}, {b, 1}, {b, 0}, {a, 1}};
	assert_int_equal(vmmrt_offload_set_schedule(rt, bad_order, 4), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "before its forward"));
	vmmrt_schedule_step twice[] = {{a, 0}, {a, 0}, {b, 1}, {a, 1}};
	assert_int_equal(vmmrt_offload_set_schedule(rt, twice, 4), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_offload_set_schedule(rt, (vmmrt_schedule_step[]){{NULL, 0}}, 1),
			 VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_offload_set_schedule(rt, (vmmrt_schedule_step[]){{a, 2}, {a, 1}}, 2),
			 VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_offload_set_schedule(rt, (vmmrt_schedule_step[]){{a, 0}, {a, 1}, {b, 0}}, 3),
			 VMMRT_E_MISMATCH);
	assert_int_equal(vmmrt_offload_set_schedule(NULL, bad_order, 4), VMMRT_E_INVALID_ARGUMENT);
	/* Checked against discovery at allocation: b is missing. */
	assert_int_equal(vmmrt_offload_set_schedule(rt, (vmmrt_schedule_step[]){{a, 0}, {a, 1}}, 2), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_E_MISMATCH);
	assert_non_null(strstr(vmmrt_last_error(), "2 groups with tensors"));
	/* a, b, c forward then backward in reverse: two banks, a and c on one
	 * (c's forward comes once a's bytes left), b alone on the other */
	vmmrt_group *cg;
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_E_MISMATCH); /* (still b missing) */
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	rt = test_runtime((const char *const[]){"lookahead", "1", NULL});
	assert_int_equal(vmmrt_group_create(rt, "a", &a), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "b", &b), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "c", &cg), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(a, &d), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(b, &d), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(cg, &d), VMMRT_OK);
	vmmrt_schedule_step ok[] = {{a, 0}, {b, 0}, {cg, 0}, {cg, 1}, {b, 1}, {a, 1}};
	assert_int_equal(vmmrt_offload_set_schedule(rt, ok, 6), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	assert_int_equal(vmmrt_offload_set_schedule(rt, ok, 6), VMMRT_E_INVALID_STATE);
	assert_int_equal(a->pingpong.bank, cg->pingpong.bank);
	assert_int_not_equal(a->pingpong.bank, b->pingpong.bank);
	/* c (the tail) and b (no other group takes its bank between its
	 * forward and its backward) stay in their banks; a does not */
	assert_int_equal(vmmrt_group_stays(cg), 1);
	assert_int_equal(vmmrt_group_stays(b), 1);
	assert_int_equal(vmmrt_group_stays(a), 0);
	assert_int_equal(vmmrt_group_stays(NULL), 0);
	/* Look-ahead from the first iteration: a's backward is restored ahead. */
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(b, c), VMMRT_E_MISMATCH); /* a comes first */
	assert_int_equal(vmmrt_forward_begin(a, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(a, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(b, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(b, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(cg, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(cg, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_begin(cg, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_end(cg, c), VMMRT_OK);
	assert_int_equal(a->restore_use, 0);
	assert_int_equal(vmmrt_backward_begin(b, c), VMMRT_OK);
	assert_int_equal(a->restore_use, 6); /* use 5 was requested with b's begin */
	assert_int_equal(b->restore_use, 0); /* b never left */
	assert_int_equal(vmmrt_backward_end(b, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_begin(a, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_end(a, c), VMMRT_OK);
	vmmrt_offload_stats st = {.size = sizeof(st)};
	assert_int_equal(vmmrt_offload_stats_get(rt, &st), VMMRT_OK);
	assert_int_equal(st.bytes_offloaded, 2 * MiB); /* a's alone */
	assert_int_equal(st.bytes_restored, 2 * MiB);
	assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* Groups that move nothing (a layer whose every tensor stays): an empty
 * order is theirs, and the hooks do nothing. */
static void empty_schedule_of_groups_without_tensors(void **state)
{
	(void)state;
	vmmrt_runtime *rt = test_runtime((const char *const[]){"lookahead", "1", NULL});
	vmmrt_group *a, *b;
	assert_int_equal(vmmrt_group_create(rt, "a", &a), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "b", &b), VMMRT_OK);
	assert_int_equal(vmmrt_offload_set_schedule(rt, NULL, 0), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	for (int it = 0; it < 2; it++) {
		assert_int_equal(vmmrt_forward_begin(a, c), VMMRT_OK);
		assert_int_equal(vmmrt_forward_end(a, c), VMMRT_OK);
		assert_int_equal(vmmrt_forward_begin(b, c), VMMRT_OK);
		assert_int_equal(vmmrt_forward_end(b, c), VMMRT_OK);
		assert_int_equal(vmmrt_backward_begin(b, c), VMMRT_OK);
		assert_int_equal(vmmrt_backward_end(b, c), VMMRT_OK);
		assert_int_equal(vmmrt_backward_begin(a, c), VMMRT_OK);
		assert_int_equal(vmmrt_backward_end(a, c), VMMRT_OK);
	}
	assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * Abort at every phase: before the first use, after each use, and after
 * the begin hook (and graph) of each use whose end never comes, in the
 * first (recording) iteration and in the steady state, with each strategy
 * and both kinds of schedule. Afterwards the iterations run and verify, the
 * remap slots are all released, and the runtime's destroy finds no leak.
 */
static void abort_at_every_phase(void **state)
{
	for (int mode = 0; mode < 3; mode++)
		for (int declare = 0; declare < 2; declare++)
			for (int first = 0; first < 2; first++) {
				model_cfg cfg = {.mode = modes[mode], .layers = 2, .microbatches = 2, .schedule = "1f1b",
						 .inflight = 2, .act_bytes = 2 * MiB, .lookahead = 2, .declare = declare,
						 .workers = 2};
				unsigned nuses = 2 * 4;
				for (unsigned cut = 0; cut <= nuses; cut++)
					for (int half = 0; half < 2; half++) {
						if (half && cut == nuses)
							continue;
						model *m;
						unsigned checked;
						fprintf(stderr, "# abort: %s%s, %s iteration, after %u uses%s\n", cfg.mode,
						       declare ? " declared" : "", first ? "first" : "second", cut,
						       half ? " and a begin" : "");
						assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
						if (!first)
							assert_int_equal(model_run(m, 1), VMMRT_OK);
						assert_int_equal(model_run_part(m, cut, half), VMMRT_OK);
						assert_int_equal(model_abort(m), VMMRT_OK);
						vmmrt_offload_stats s = stats(m);
						assert_int_equal(s.aborts, 1);
						if (mode == 1)
							assert_int_equal(s.activation_bytes, 0); /* nothing left mapped */
						assert_int_equal(model_run(m, 2), VMMRT_OK);
						assert_int_equal(model_verify(m, &checked), 0);
						assert_int_equal(checked, (first ? 2 : 3) * model_groups(m));
						assert_int_equal(model_stale_messages(m), 0);
						model_destroy(m);
					}
			}
}

/* A hook that failed part-way used to leave only a runtime destroy; an
 * abort is enough now, and the graphs stay. */
static int32_t fail_next;
static const char *fail_op;

static vmmrt_status fail_once(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, fail_op) && uatomic_cmpxchg(&fail_next, 1, 0) == 1)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

static void abort_after_a_failed_hook(void **state)
{
	for (int mode = 0; mode < 2; mode++) {
		model_cfg cfg = {.mode = modes[mode], .layers = 2, .microbatches = 2, .schedule = "1f1b", .inflight = 2,
				 .act_bytes = 2 * MiB, .lookahead = 1};
		model *m;
		unsigned checked;
		assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
		vmmrt_runtime *rt = model_runtime(m);
		assert_int_equal(model_run(m, 1), VMMRT_OK);
		/* pingpong's D2H is a copy, remap's release a host function */
		fail_op = mode == 0 ? "cuMemcpyDtoHAsync" : "cuLaunchHostFunc";
		uatomic_set(&fail_next, 1);
		vmmrt__drv_set_fault_hook(rt, fail_once, NULL);
		assert_int_not_equal(model_run_part(m, 8, false), VMMRT_OK);
		vmmrt__drv_set_fault_hook(rt, NULL, NULL);
		/* broken: every hook refuses, and says what to do */
		assert_int_equal(vmmrt_forward_begin(model_group(m, 0), NULL), VMMRT_E_INVALID_STATE);
		assert_non_null(strstr(vmmrt_last_error(), "vmmrt_offload_abort"));
		assert_int_equal(model_abort(m), VMMRT_OK);
		assert_int_equal(model_run(m, 2), VMMRT_OK);
		assert_int_equal(model_verify(m, &checked), 0);
		assert_int_equal(checked, 3 * model_groups(m));
		model_destroy(m);
	}
}

/* Abort with its reset skipped (test switch): the next iteration fails. */
static void skipped_abort_reset_is_caught(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .microbatches = 2, .schedule = "1f1b", .inflight = 2,
			 .act_bytes = 2 * MiB, .lookahead = 2, .declare = true, .plant = VMMRT__PLANT_ABORT_NO_RESET};
	model *m;
	unsigned checked;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_run_part(m, 2, true), VMMRT_OK);
	assert_int_equal(model_abort(m), VMMRT_OK);
	vmmrt_status st = model_run(m, 1);
	unsigned bad = model_verify(m, &checked);
	assert_true(st != VMMRT_OK || bad > 0);
	model_destroy(m);
}

/*
 * Remap's handles kept for reuse count in its budget: what the driver holds
 * for the groups (mapped and kept, at its peak) is at most the budget's
 * groups, with or without reuse; reuse served maps from kept handles. The
 * backings allocation makes for capture (outside the budget) must not be
 * kept once released (found on the H200: 1F1B held three groups for two).
 */
static void remap_keeps_handles_within_its_budget(void **state)
{
	uint64_t creates[2];
	for (int reuse = 0; reuse < 2; reuse++) {
		const char *const opts[] = {"handle_reuse", reuse ? "1" : "0", NULL};
		model_cfg cfg = {.mode = "remap", .layers = 2, .microbatches = 4, .schedule = "1f1b", .inflight = 2,
				 .act_bytes = 2 * MiB, .lookahead = 1, .declare = true, .options = opts};
		model *m;
		unsigned checked;
		assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
		vmmrt_runtime *rt = model_runtime(m);
		/* from the end of the second iteration: every group's first release
		 * (of what allocation mapped) ran before its second map */
		assert_int_equal(model_run(m, 2), VMMRT_OK);
		assert_int_equal(model_verify(m, &checked), 0);
		assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
		(void)vmmrt__host_created_peak(rt->be, true);
		assert_int_equal(model_run(m, 3), VMMRT_OK);
		assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
		assert_int_equal(vmmrt_stream_synchronize(rt, NULL), VMMRT_OK);
		vmmrt_offload_stats s = stats(m);
		/* the peak before the abort (which lets the maps already requested run
		 * past the budget, by design); the abort gives back all the groups
		 * hold: what is left is the model's own memory */
		size_t peak = vmmrt__host_created_peak(rt->be, false);
		assert_int_equal(model_abort(m), VMMRT_OK);
		size_t held = peak - test_used(rt), mib = (size_t)MiB;
		vmmrt_driver_stats c = {.size = sizeof(c)};
		assert_int_equal(vmmrt_driver_stats_get(rt, 0 /* cuMemCreate */, &c), VMMRT_OK);
		creates[reuse] = c.count;
		fprintf(stderr, "# reuse %d: at most %zu MiB held for the groups in 3 iterations, budget %u groups of 2 MiB; "
			"%llu cuMemCreate calls\n", reuse, held / mib, s.budget_groups, (unsigned long long)c.count);
		assert_true(held <= s.budget_groups * 2 * MiB);
		assert_int_equal(model_run(m, 1), VMMRT_OK);
		assert_int_equal(model_verify(m, &checked), 0);
		assert_int_equal(checked, 6 * model_groups(m));
		model_destroy(m);
	}
	assert_true(creates[1] < creates[0]); /* reuse served maps */
}

/*
 * The same with groups of different sizes (remap_keeps_handles_within_its_budget
 * gives every group one): a kept handle serves only a map of its own size, so
 * a map the pool cannot serve empties it first (slot-work.c). What the driver
 * holds for the groups, mapped and kept, stays within the bytes of the
 * budget's largest groups, with or without reuse.
 */
static void remap_reuse_within_budget_with_sizes(void **state)
{
	static const unsigned mib[] = {2, 8, 4, 6, 2, 8, 4};
	enum { N = sizeof(mib) / sizeof(mib[0]) };
	for (int reuse = 0; reuse < 2; reuse++) {
		size_t sizes[N];
		for (unsigned i = 0; i < N; i++)
			sizes[i] = (size_t)mib[i] * MiB;
		const char *const opts[] = {"mode", "remap", "lookahead", "1", "handle_reuse", reuse ? "1" : "0", NULL};
		test_layers_cfg cfg = {.options = opts, .n = N, .sizes = sizes, .dtype = 7, .capture = true};
		vmmrt_runtime *rt;
		vmmrt_group *g[N];
		vmmrt_stream c;
		assert_int_equal(test_layers(&cfg, &rt, g, NULL), VMMRT_OK);
		assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
		for (int it = 0; it < 5; it++) {
			if (it == 2) { /* from here: every group's first release ran before its second map */
				assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
				assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
				(void)vmmrt__host_created_peak(rt->be, true);
			}
			for (unsigned i = 0; i < N; i++) {
				assert_int_equal(vmmrt_forward_begin(g[i], c), VMMRT_OK);
				assert_int_equal(vmmrt_kernel_fill(rt, c, vmmrt_group_address(g[i]), sizes[i], it), VMMRT_OK);
				assert_int_equal(vmmrt_forward_end(g[i], c), VMMRT_OK);
			}
			for (unsigned i = N; i-- > 0;) {
				assert_int_equal(vmmrt_backward_begin(g[i], c), VMMRT_OK);
				assert_int_equal(vmmrt_backward_end(g[i], c), VMMRT_OK);
			}
		}
		assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
		assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
		vmmrt_offload_stats s = {.size = sizeof(s)};
		assert_int_equal(vmmrt_offload_stats_get(rt, &s), VMMRT_OK);
		size_t peak = vmmrt__host_created_peak(rt->be, false);
		assert_int_equal(vmmrt_offload_abort(rt), VMMRT_OK); /* gives back what the groups hold */
		size_t held = peak - test_used(rt), bound = 0;
		unsigned sorted[N];
		memcpy(sorted, mib, sizeof(sorted));
		for (unsigned i = 0; i < N; i++) /* the budget's largest groups */
			for (unsigned j = i + 1; j < N; j++)
				if (sorted[j] > sorted[i]) {
					unsigned t = sorted[i];
					sorted[i] = sorted[j];
					sorted[j] = t;
				}
		for (unsigned i = 0; i < s.budget_groups && i < N; i++)
			bound += (size_t)sorted[i] * MiB;
		vmmrt_driver_stats ds = {.size = sizeof(ds)};
		assert_int_equal(vmmrt_driver_stats_get(rt, 0 /* cuMemCreate */, &ds), VMMRT_OK);
		fprintf(stderr, "# sizes 2..8 MiB, reuse %d: at most %zu MiB held for the groups in 3 iterations, budget %u "
			"groups (%zu MiB); %llu cuMemCreate calls\n", reuse, held / (size_t)MiB, s.budget_groups, bound / (size_t)MiB,
			(unsigned long long)ds.count);
		assert_true(s.budget_groups >= 2 && s.budget_groups < N);
		assert_true(held <= bound);
		assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
		assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	}
}

/*
 * An abort before any hook ran (remap releases what allocation mapped) must
 * wait for the copies vmmrt_group_save made into the slot: here one still
 * queued behind a busy kernel. Without that wait the copy writes unmapped
 * memory (SIGSEGV on the host backend; found by vmmrt-torture).
 */
static void abort_waits_for_capture_copies(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"mode", "remap", NULL});
	vmmrt_stream s;
	vmmrt_slot *src;
	vmmrt_group *g;
	vmmrt_devptr a;
	vmmrt_tensor_desc d = {.bytes = 1 * MiB, .dtype = 1, .ndim = 1, .shape = {1 << 20}, .stride = {1}};
	assert_int_equal(vmmrt_stream_create(rt, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, d.bytes, &src), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(src), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "L0", &g), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(g, &d), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, s, vmmrt_slot_address(src), d.bytes, 7), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_busy(rt, s, 200 * 1000 * 1000), VMMRT_OK);
	assert_int_equal(vmmrt_group_begin_capture(g), VMMRT_OK);
	assert_int_equal(vmmrt_group_save(g, &d, vmmrt_slot_address(src), s, &a), VMMRT_OK);
	assert_int_equal(vmmrt_group_end_capture(g), VMMRT_OK);
	assert_int_equal(vmmrt_offload_abort(rt), VMMRT_OK);
	vmmrt_offload_stats st = {.size = sizeof(st)};
	assert_int_equal(vmmrt_offload_stats_get(rt, &st), VMMRT_OK);
	assert_int_equal(st.activation_bytes, 0); /* released, after the copy */
	assert_int_equal(vmmrt_stream_synchronize(rt, s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(src), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void abort_misuse(void **state)
{
	assert_int_equal(vmmrt_offload_abort(NULL), VMMRT_E_INVALID_ARGUMENT);
	vmmrt_runtime *rt = test_runtime((const char *const[]){NULL});
	assert_int_equal(vmmrt_offload_abort(rt), VMMRT_E_INVALID_STATE); /* nothing allocated */
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * Re-discovery with a new shape while the last iterations' graphs may still
 * run: the new addresses are new, the old memory stays (an old graph still
 * replays over it in ping-pong and none), the iterations before and after
 * verify with their own sizes, and the old memory goes at release.
 */
static void rediscovery_with_live_graphs(void **state)
{
	for (int mode = 0; mode < 3; mode++)
		for (int declare = 0; declare < 2; declare++) {
			model_cfg cfg = {.mode = modes[mode], .layers = 2, .microbatches = 2, .schedule = "1f1b",
					 .inflight = 2, .act_bytes = 2 * MiB, .lookahead = 1, .declare = declare};
			model *m;
			unsigned checked, n;
			assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
			n = model_groups(m);
			vmmrt_devptr before[8];
			for (unsigned i = 0; i < n; i++)
				before[i] = vmmrt_group_address(model_group(m, i));
			assert_int_equal(model_run(m, 2), VMMRT_OK); /* no sync: the graphs may still run */
			assert_int_equal(model_rediscover(m, 4 * MiB), VMMRT_OK);
			vmmrt_offload_stats s = stats(m);
			assert_int_equal(s.retired_groups, n);
			for (unsigned i = 0; i < n; i++) {
				vmmrt_group *g = model_group(m, i);
				assert_int_equal(vmmrt_group_bytes(g), 4 * MiB);
				for (unsigned j = 0; j < n; j++)
					assert_true(vmmrt_group_address(g) != before[j]); /* never an old address */
			}
			if (mode != 1) { /* an old graph over its old memory: still there */
				vmmrt_devptr act;
				vmmrt_graph *old = model_old_graph(m, 0, &act);
				assert_non_null(old);
				assert_int_equal(act, before[0]);
				/* alone: it shares the model's input with the new graphs */
				assert_int_equal(model_verify(m, &checked), 0);
				assert_int_equal(vmmrt_graph_launch(model_runtime(m), old, NULL), VMMRT_OK);
				assert_int_equal(vmmrt_stream_synchronize(model_runtime(m), NULL), VMMRT_OK);
			}
			assert_int_equal(model_run(m, 2), VMMRT_OK);
			assert_int_equal(model_verify(m, &checked), 0);
			assert_int_equal(checked, 4 * n);
			uint64_t held = stats(m).activation_bytes;
			assert_int_equal(model_release_old(m), VMMRT_OK);
			s = stats(m);
			assert_int_equal(s.retired_groups, 0);
			if (mode != 1)
				assert_true(s.activation_bytes < held); /* the old banks or slots went */
			assert_int_equal(model_run(m, 1), VMMRT_OK);
			assert_int_equal(model_verify(m, &checked), 0);
			model_destroy(m);
		}
}

/* One group of several: the others keep their addresses; the rules. */
static void rediscovery_of_one_group(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_group *g0 = model_group(m, 0), *g1 = model_group(m, 1), *g2 = model_group(m, 2);
	vmmrt_devptr a0 = vmmrt_group_address(g0), a1 = vmmrt_group_address(g1), a2 = vmmrt_group_address(g2);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_run_part(m, 2, false), VMMRT_OK);
	assert_int_equal(vmmrt_group_rediscover(g0), VMMRT_E_INVALID_STATE); /* mid-iteration */
	assert_non_null(strstr(vmmrt_last_error(), "vmmrt_offload_abort"));
	assert_int_equal(model_abort(m), VMMRT_OK);
	assert_int_equal(vmmrt_group_rediscover(g0), VMMRT_OK);
	assert_int_equal(vmmrt_group_get_state(g0), VMMRT_GROUP_DISCOVERING);
	assert_int_equal(vmmrt_group_bytes(g0), 0);
	assert_int_equal(vmmrt_forward_begin(g1, NULL), VMMRT_E_INVALID_STATE); /* allocate first */
	vmmrt_tensor_desc d = {.bytes = 4 * MiB, .dtype = 7, .ndim = 1, .shape = {(int64_t)(MiB / 2)}, .stride = {1}};
	assert_int_equal(vmmrt_group_discover(g0, &d), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_E_INVALID_STATE);
	assert_true(vmmrt_group_address(g0) != a0 && vmmrt_group_address(g0) != a1);
	assert_int_equal(vmmrt_group_address(g1), a1);
	assert_int_equal(vmmrt_group_address(g2), a2);
	assert_int_equal(vmmrt_group_get_state(g1), VMMRT_GROUP_READY);
	assert_int_equal(vmmrt_group_get_state(g0), VMMRT_GROUP_ALLOCATED);
	assert_int_equal(stats(m).retired_groups, 1);
	assert_int_equal(vmmrt_offload_release_retired(rt), VMMRT_OK);
	assert_int_equal(stats(m).retired_groups, 0);
	assert_int_equal(vmmrt_group_rediscover(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_offload_release_retired(NULL), VMMRT_E_INVALID_ARGUMENT);
	model_destroy(m);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(one_f_one_b),
		cmocka_unit_test(interleaved),
		cmocka_unit_test(banks_follow_the_schedule),
		cmocka_unit_test(fences_hold_under_1f1b),
		/* the latency model makes copies slow enough for a missing fence to bite */
		host_only_test(dropped_fences_are_caught_under_1f1b),
		cmocka_unit_test(naive_bank_assignment_is_caught),
		cmocka_unit_test(recorded_order_is_followed),
		cmocka_unit_test(declared_schedule_errors),
		cmocka_unit_test(empty_schedule_of_groups_without_tensors),
		cmocka_unit_test(abort_at_every_phase),
		cmocka_unit_test(abort_after_a_failed_hook),
		cmocka_unit_test(skipped_abort_reset_is_caught),
		host_only_test(remap_keeps_handles_within_its_budget), /* the host backend's peak */
		host_only_test(remap_reuse_within_budget_with_sizes),
		cmocka_unit_test(abort_waits_for_capture_copies),
		cmocka_unit_test(abort_misuse),
		cmocka_unit_test(rediscovery_with_live_graphs),
		cmocka_unit_test(rediscovery_of_one_group),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Offload on the host backend: both strategies keep every restored activation
 * intact (checksums per layer and iteration), the ping-pong fences are needed
 * (dropping one is caught), the naive reload is wrong, look-ahead follows the
 * recorded backward order, device memory stays within its bound, and the
 * launch thread never blocks in steady state.
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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
#include "testing.h"

#define MiB (1024ull * 1024)

static void run_and_verify(const model_cfg *cfg, unsigned iters)
{
	model *m;
	unsigned checked;
	assert_int_equal(model_create(cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, iters), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(checked, iters * cfg->layers);
	vmmrt_offload_stats s = {.size = sizeof(s)};
	assert_int_equal(vmmrt_offload_stats_get(model_runtime(m), &s), VMMRT_OK);
	assert_int_equal(s.iterations, iters);
	assert_true(s.schedule_recorded);
	model_destroy(m);
}

/* The seed's example: F0 F1 F2, B2 B1 B0. */
static void three_layers_pingpong(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1};
	run_and_verify(&cfg, 4);
}

static void three_layers_remap(void **state)
{
	model_cfg cfg = {.mode = "remap", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1};
	run_and_verify(&cfg, 4);
}

static void three_layers_none(void **state)
{
	model_cfg cfg = {.mode = "none", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1};
	run_and_verify(&cfg, 3);
}

/* One layer: its forward is also the last one, so from the second iteration
 * on it is the tail and never leaves the device (regression: the tail was
 * decided at call time, and the first iteration's backward skipped a restore
 * its forward had not skipped). */
static void one_layer_each_strategy(void **state)
{
	const char *modes[] = {"pingpong", "remap", "none"};
	for (int i = 0; i < 3; i++) {
		model_cfg cfg = {.mode = modes[i], .layers = 1, .act_bytes = 2 * MiB, .lookahead = 1};
		run_and_verify(&cfg, 4);
	}
}

/* A model past its first iteration (which records the schedule and
 * blocks, for its verification), with the statistics of `iterations` more. */
static model *steady_state(const model_cfg *cfg, unsigned iterations, vmmrt_offload_stats *s)
{
	model *m;
	unsigned checked;
	assert_int_equal(model_create(cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	vmmrt__drv_reset_stats(model_runtime(m));
	assert_int_equal(model_run(m, iterations), VMMRT_OK);
	assert_int_equal(vmmrt_offload_stats_get(model_runtime(m), s), VMMRT_OK);
	return m;
}

/* The comparison mode: VMM calls on the launch thread, which then blocks
 * (regression: a look-ahead map ran before the release of the use before). */
static void remap_inline_verifies_and_blocks(void **state)
{
	model_cfg cfg = {.mode = "remap", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1, .driver_inline = true};
	unsigned checked;
	vmmrt_offload_stats s = {.size = sizeof(s)};
	model *m = steady_state(&cfg, 3, &s);
	assert_true(s.launch_thread_blocking > 0); /* what the workers are there to avoid */
	assert_int_equal(model_verify(m, &checked), 0);
	model_destroy(m);
}

static void remap_with_two_workers_and_lookahead_two(void **state)
{
	model_cfg cfg = {.mode = "remap", .layers = 5, .act_bytes = 2 * MiB, .lookahead = 2, .workers = 2,
			 .latency = true, .copy_gbps = 20, .fwd_ns = 100000, .bwd_ns = 100000};
	run_and_verify(&cfg, 3);
}

/*
 * The fences, under a latency model where copies are much slower than the
 * graphs, so a missing fence lets a graph or a restore overwrite a bank whose
 * bytes are still needed. With both fences the run is clean; dropping either
 * one (test switch) corrupts restored activations, and the test sees it.
 */
/* A 512 KiB copy takes 26 ms here, tens of times a layer kernel's own
 * time (under 1 ms on this CPU, a few ms under ASan or load), so the
 * overlap a missing fence allows happens whatever the machine does. */
static const model_cfg fence_cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 512 * 1024, .lookahead = 1,
				    .latency = true, .copy_gbps = 0.02, .fwd_ns = 100000, .bwd_ns = 3000000};

static unsigned run_with_fences(int drop)
{
	model *m;
	unsigned checked;
	assert_int_equal(model_create(&fence_cfg, &m), VMMRT_OK);
	vmmrt__offload_test_plant(model_runtime(m), drop);
	assert_int_equal(model_run(m, 3), VMMRT_OK);
	unsigned bad = model_verify(m, &checked);
	model_destroy(m);
	return bad;
}

#if defined(__SANITIZE_THREAD__)
#include <fcntl.h>
/*
 * A dropped fence is a real race on the emulated device memory, and
 * ThreadSanitizer reports it, as it should. The planted runs go to a child
 * process whose reports are its own (stderr silenced); pingpong_fences_hold,
 * in this process, proves the fences leave no race. Needs die_after_fork=0
 * (liburcu's call_rcu thread is running), which make check sets.
 */
static unsigned run_planted(int drop)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, STDERR_FILENO);
		model *m;
		unsigned checked;
		if (model_create(&fence_cfg, &m) != VMMRT_OK)
			_exit(3);
		vmmrt__offload_test_plant(model_runtime(m), drop);
		if (model_run(m, 3) != VMMRT_OK)
			_exit(3);
		unsigned bad = model_verify(m, &checked);
		model_destroy(m);
		_exit(bad ? 1 : 0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status) == 1;
}
#else
#define run_planted run_with_fences
#endif

static void pingpong_fences_hold(void **state)
{
	assert_int_equal(run_with_fences(0), 0);
}

static void dropping_forward_fence_is_caught(void **state)
{
	assert_true(run_planted(VMMRT__DROP_FORWARD_FENCE) > 0);
}

static void dropping_backward_fence_is_caught(void **state)
{
	assert_true(run_planted(VMMRT__DROP_BACKWARD_FENCE) > 0);
}

/* Look-ahead walks the recorded backward order, which is not the reverse here. */
static void lookahead_follows_recorded_order(void **state)
{
	static const unsigned order[] = {1, 3, 0, 2};
	for (int mode = 0; mode < 2; mode++) {
		model_cfg cfg = {.mode = mode ? "remap" : "pingpong", .layers = 4, .act_bytes = 2 * MiB,
				 .lookahead = 1, .bwd_order = order};
		model *m;
		unsigned checked;
		assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
		assert_int_equal(model_run(m, 2), VMMRT_OK);
		vmmrt_runtime *rt = model_runtime(m);
		vmmrt__offload *off = rt->offload;
		for (unsigned k = 0; k < 4; k++)
			assert_int_equal(off->sched.grp[4 + k], order[k]);
		/* In steady state, when backward of order[k] begins, order[k+1]'s restore is queued. */
		vmmrt_stream c;
		assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
		for (unsigned i = 0; i < 4; i++) {
			assert_int_equal(vmmrt_forward_begin(model_group(m, i), c), VMMRT_OK);
			assert_int_equal(vmmrt_forward_end(model_group(m, i), c), VMMRT_OK);
		}
		for (unsigned k = 0; k < 3; k++) {
			vmmrt_group *g = model_group(m, order[k]);
			assert_int_equal(vmmrt_backward_begin(g, c), VMMRT_OK);
			vmmrt_group *next = model_group(m, order[k + 1]);
			if (mode == 1)
				assert_int_equal(next->restore_use, off->sched.use + 2);
			else /* ping-pong: queued now, or deferred to this graph's end on a bank conflict */
				assert_true(next->restore_use == off->sched.use + 2 ||
					    off->pingpong.bank[next->pingpong.bank].pending == next);
			assert_int_equal(vmmrt_backward_end(g, c), VMMRT_OK);
			assert_int_equal(next->restore_use, off->sched.use + 2);
		}
		/* Out of the recorded order: a named error, nothing enqueued. */
		assert_int_equal(vmmrt_backward_begin(model_group(m, order[0]), c), VMMRT_E_MISMATCH);
		assert_non_null(strstr(vmmrt_last_error(), "recorded order"));
		assert_int_equal(vmmrt_backward_begin(model_group(m, order[3]), c), VMMRT_OK);
		assert_int_equal(vmmrt_backward_end(model_group(m, order[3]), c), VMMRT_OK);
		assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
		assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
		assert_int_equal(model_verify(m, &checked), 0);
		model_destroy(m);
	}
}

/* Poll the driver-level memory while the model runs: its peak must stay in bound. */
typedef struct poller {
	vmmrt_runtime *rt;
	int stop;
	size_t peak_used;
} poller;

static void *poll_mem(void *arg)
{
	poller *p = arg;
	while (!uatomic_read(&p->stop)) {
		size_t f, t;
		if (vmmrt_mem_info(p->rt, &f, &t) == VMMRT_OK && t - f > p->peak_used)
			p->peak_used = t - f;
		usleep(50);
	}
	return NULL;
}

/*
 * The driver-level peak of activation memory during steady-state iterations.
 * Streams, events and graphs take device memory of their own on a GPU, so the
 * baseline is taken after a first iteration and a sync: everything in use
 * then that is not an activation stays constant, and is subtracted.
 */
static size_t measure_peak_over(const model_cfg *cfg, unsigned iterations, vmmrt_offload_stats *s)
{
	model *m;
	unsigned checked;
	assert_int_equal(model_create(cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	assert_int_equal(model_run(m, 1), VMMRT_OK); /* records the schedule */
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(vmmrt_offload_stats_reset(rt), VMMRT_OK);
	assert_int_equal(vmmrt_offload_stats_get(rt, s), VMMRT_OK);
	size_t other = test_used(rt) - (size_t)s->activation_bytes;
	poller p = {.rt = rt};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, poll_mem, &p), 0);
	assert_int_equal(model_run(m, iterations), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	uatomic_set(&p.stop, 1);
	pthread_join(t, NULL);
	assert_int_equal(vmmrt_offload_stats_get(rt, s), VMMRT_OK);
	model_destroy(m);
	return p.peak_used - other;
}

static size_t measure_peak(const model_cfg *cfg, vmmrt_offload_stats *s)
{
	return measure_peak_over(cfg, 3, s);
}

static void device_memory_bounds(void **state)
{
	const size_t act = 4 * MiB; /* a multiple of the 2 MiB granularity */
	vmmrt_offload_stats s = {.size = sizeof(s)};

	model_cfg pp = {.mode = "pingpong", .layers = 6, .act_bytes = act, .lookahead = 1, .latency = true,
			.copy_gbps = 10, .fwd_ns = 200000, .bwd_ns = 200000};
	size_t peak = measure_peak(&pp, &s);
	printf("# pingpong: activation peak %zu MiB (driver), %llu MiB (accounted), 2 banks = %zu MiB\n",
	       peak >> 20, (unsigned long long)s.activation_peak_bytes >> 20, 2 * act >> 20);
	assert_int_equal(s.activation_peak_bytes, 2 * act); /* exactly two banks */
	assert_int_equal(s.activation_bytes, 2 * act);
	assert_true(peak <= 2 * act);

	for (unsigned la = 1; la <= 2; la++) {
		model_cfg rm = pp;
		rm.mode = "remap";
		rm.lookahead = la;
		peak = measure_peak(&rm, &s);
		printf("# remap lookahead %u: activation peak %zu MiB (driver), %llu MiB (accounted), bound %zu MiB\n",
		       la, peak >> 20, (unsigned long long)s.activation_peak_bytes >> 20, (la + 1) * act >> 20);
		assert_true(s.activation_peak_bytes <= (la + 1) * act);
		assert_true(s.activation_peak_bytes >= act);
		assert_true(peak <= (la + 1) * act);
		assert_true(s.maps > 0 && s.releases > 0);
	}

	model_cfg none = pp;
	none.mode = "none";
	peak = measure_peak(&none, &s);
	printf("# none: activation peak %zu MiB (driver), %llu MiB (accounted)\n", peak >> 20,
	       (unsigned long long)s.activation_bytes >> 20);
	assert_int_equal(s.activation_bytes, 6 * act);
	assert_true(peak <= 6 * act);
}

/*
 * The remap bound with several workers: a map admitted on one worker the
 * moment a release on another frees the budget must not find the released
 * bytes still counted (the release accounts them before it frees the
 * budget), or the accounted peak passes the bound for a moment.
 */
static void remap_memory_bound_with_several_workers(void **state)
{
	const size_t act = 2 * MiB;
	vmmrt_offload_stats s = {.size = sizeof(s)};
	for (unsigned workers = 2; workers <= 3; workers++) {
		for (unsigned la = 1; la <= 2; la++) {
			model_cfg rm = {.mode = "remap", .layers = 8, .act_bytes = act, .lookahead = la,
					.workers = workers, .latency = true, .copy_gbps = 20, .fwd_ns = 50000,
					.bwd_ns = 50000};
			size_t peak = measure_peak_over(&rm, 12, &s);
			printf("# remap, %u workers, lookahead %u: activation peak %zu MiB (driver), %llu MiB "
			       "(accounted), bound %zu MiB\n",
			       workers, la, peak >> 20, (unsigned long long)s.activation_peak_bytes >> 20,
			       (la + 1) * act >> 20);
			assert_true(s.activation_peak_bytes <= (la + 1) * act);
			assert_true(peak <= (la + 1) * act);
			assert_true(s.maps > 0 && s.releases > 0);
		}
	}
}

static void no_blocking_in_steady_state(void **state)
{
	const char *modes[] = {"pingpong", "remap"};
	for (int i = 0; i < 2; i++) {
		model_cfg cfg = {.mode = modes[i], .layers = 4, .act_bytes = 2 * MiB, .lookahead = 1};
		unsigned checked;
		vmmrt_offload_stats s = {.size = sizeof(s)};
		model *m = steady_state(&cfg, 4, &s);
		assert_int_equal(s.launch_thread_blocking, 0);
		assert_int_equal(model_verify(m, &checked), 0);
		assert_true(vmmrt__drv_launch_thread_blocking(model_runtime(m)) > 0); /* the verify itself did */
		assert_int_equal(model_stale_messages(m), 0);
		model_destroy(m);
	}
}

/* Two runtimes in one process, each with its own workers and streams, at once
 * (on a GPU both on device 0: each worker binds its own runtime's context). */
static void two_runtimes_at_once(void **state)
{
	model_job r[2] = {
		{.cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1, .fwd_ns = 100000,
			 .bwd_ns = 100000}, .iterations = 3},
		{.cfg = {.mode = "remap", .layers = 4, .act_bytes = 2 * MiB, .lookahead = 1, .workers = 2,
			 .fwd_ns = 100000, .bwd_ns = 100000}, .iterations = 3},
	};
	assert_int_equal(model_jobs_run(r, 2), 0);
}

/* Out of memory on the maps a stream waits for: reported, retried, no byte lost. */
static int32_t creates_to_fail;

static vmmrt_status fail_creates(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuMemCreate") && uatomic_read(&creates_to_fail) > 0) {
		uatomic_dec(&creates_to_fail);
		return VMMRT_E_OUT_OF_MEMORY;
	}
	return VMMRT_OK;
}

static void remap_survives_out_of_memory(void **state)
{
	/* every map creates (handle reuse would serve them from its pool) */
	const char *const opts[] = {"handle_reuse", "0", NULL};
	model_cfg cfg = {.mode = "remap", .layers = 4, .act_bytes = 2 * MiB, .lookahead = 1,
			 .fwd_ns = 200000, .bwd_ns = 200000, .options = opts};
	model *m;
	unsigned checked;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	/* More failures than one round of retries absorbs (oom_retries is 3). */
	uatomic_set(&creates_to_fail, 7);
	vmmrt__drv_set_fault_hook(rt, fail_creates, NULL);
	assert_int_equal(model_run(m, 3), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(checked, 4 * cfg.layers);
	assert_int_equal(uatomic_read(&creates_to_fail), 0);
	assert_true(model_reported(m) >= 1); /* the failure reached the application */
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	model_destroy(m);
}

/*
 * vmmrt_offload_sync's promise with several workers: once it returns, every
 * worker has taken what was queued on it. The releases worker 1 makes take
 * 40 ms each, so it lags behind worker 0; after a sync every release a copy
 * stream handed off has run. Then, with the streams idle, a request queued
 * on worker 1 takes 100 ms: the next sync must wait for it, worker 1's
 * barrier queued behind it, not return after worker 0's.
 */
static int32_t slow_releases, slow_call_done;
static vmmrt__request slow_call; /* static: a worker may still hold it when an assert fails */

static void sleep_then_mark(void *arg)
{
	usleep(100000);
	uatomic_set((int32_t *)arg, 1);
}

static vmmrt_status slow_on_worker_1(void *ctx, const char *op, uint64_t *delay_us)
{
	char name[32] = "";
	pthread_getname_np(pthread_self(), name, sizeof(name));
	if (!strcmp(op, "cuMemUnmap") && !strcmp(name, "vmmrt-drv-1")) {
		uatomic_inc(&slow_releases);
		*delay_us = 40000;
	}
	return VMMRT_OK;
}

static void sync_waits_for_every_worker(void **state)
{
	model_cfg cfg = {.mode = "remap", .layers = 4, .act_bytes = 2 * MiB, .lookahead = 1, .workers = 2};
	model *m;
	unsigned checked, on_worker_1 = 0;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	vmmrt__drv_set_fault_hook(rt, slow_on_worker_1, NULL);
	assert_int_equal(model_run(m, 2), VMMRT_OK);
	assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
	/* Every release a copy stream handed off (after a forward's D2H) has run. */
	for (unsigned i = 0; i < cfg.layers; i++) {
		vmmrt_group *g = model_group(m, i);
		on_worker_1 += g->slot->worker == 1;
		for (unsigned j = 0; j < VMMRT__REQ_RING; j++)
			assert_true(vmmrt__request_poll(&g->remap.rel[VMMRT__USE_FORWARD][j].req, NULL));
	}
	assert_true(on_worker_1 > 0 && on_worker_1 < cfg.layers); /* both workers have groups */
	assert_true(uatomic_read(&slow_releases) > 0);
	vmmrt__request_init_call(&slow_call, sleep_then_mark, &slow_call_done);
	assert_int_equal(vmmrt__worker_push(rt->workers, 1, &slow_call), VMMRT_OK);
	assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
	assert_int_equal(uatomic_read(&slow_call_done), 1);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(model_verify(m, &checked), 0);
	model_destroy(m);
}

/* ------------------------------------------------------ the negative case */

typedef struct naive {
	vmmrt_runtime *rt;
	vmmrt_stream s;
	vmmrt_slot *act, *result;
	vmmrt_graph *bwd;
	uint64_t expect;
} naive;

static void naive_setup(naive *n, size_t bytes)
{
	n->rt = test_runtime((const char *const[]){NULL});
	assert_int_equal(vmmrt_stream_create(n->rt, &n->s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(n->rt, bytes, &n->act), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(n->act), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(n->rt, 8, &n->result), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(n->result), VMMRT_OK);
	/* The backward graph captures the activation's address. */
	assert_int_equal(vmmrt_graph_begin_capture(n->rt, n->s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_checksum(n->rt, n->s, vmmrt_slot_address(n->act), bytes,
					       vmmrt_slot_address(n->result)), VMMRT_OK);
	assert_int_equal(vmmrt_graph_end_capture(n->rt, n->s, &n->bwd), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(n->rt, n->s, vmmrt_slot_address(n->act), bytes, 5), VMMRT_OK);
	assert_int_equal(vmmrt_graph_launch(n->rt, n->bwd, n->s), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(n->rt, n->s), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(n->rt, &n->expect, vmmrt_slot_address(n->result), 8), VMMRT_OK);
}

/*
 * Remap keeps its maps off running D2H copies (option d2h_yield): in a
 * copy-bound forward pass (a layer's D2H outlasts the next forward) each
 * forward's map is due when a D2H ends, and would run beside the next one,
 * where the H200 makes cuMemSetAccess ten times slower. Which maps a D2H
 * waits for is decided by vmmrt__remap_yield_due, checked on made-up groups
 * in test-remap-yield.c; whether a map then lands beside a copy depends on
 * the threads' timing (a loaded machine changes it), so this run reports the
 * host backend's count of cuMemSetAccess calls begun while a D2H ran and
 * asserts only what timing cannot change: every byte comes back in each
 * setting, and without the option the D2H stream never waits for a map.
 */
typedef struct beside {
	unsigned long set_access, yields;
} beside;

static beside set_access_beside_d2h(int yield) /* 1, 0, or -1: the option's default */
{
	const char *const opts[] = {yield < 0 ? NULL : "d2h_yield", yield ? "1" : "0", NULL};
	/* copy-bound even in a sanitizer build: 32 ms per D2H against 1 ms forwards */
	model_cfg cfg = {.mode = "remap", .layers = 6, .act_bytes = 8 << 20, .fwd_ns = 1000000, .bwd_ns = 20000000,
			 .lookahead = 1, .latency = true, .copy_gbps = 0.25, .options = opts};
	model *m;
	unsigned checked;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	assert_int_equal(model_run(m, 1), VMMRT_OK);
	assert_int_equal(vmmrt_offload_sync(model_runtime(m)), VMMRT_OK);
	vmmrt__offload *off = model_group(m, 0)->off;
	unsigned long before = vmmrt__host_set_access_beside_d2h(model_runtime(m)->be);
	assert_true(off->remap.d2h_yield == (yield != 0)); /* the default yields (vmmrt(7), d2h_yield) */
	assert_int_equal(model_run(m, 3), VMMRT_OK);
	assert_int_equal(model_verify(m, &checked), 0);
	assert_int_equal(checked, 4 * model_groups(m));
	beside n = {vmmrt__host_set_access_beside_d2h(model_runtime(m)->be) - before,
		    uatomic_read(&off->remap.d2h_yields)};
	model_destroy(m);
	return n;
}

static void maps_beside_d2h_counted(void **state)
{
	beside with = set_access_beside_d2h(1), without = set_access_beside_d2h(0), dflt = set_access_beside_d2h(-1);
	fprintf(stderr, "# cuMemSetAccess beside a D2H in 3 iterations: %lu with d2h_yield (%lu waits), %lu without, "
			"%lu by default (%lu waits)\n", with.set_access, with.yields, without.set_access, dflt.set_access,
		dflt.yields);
	assert_int_equal(without.yields, 0);
}

static void naive_reload_reads_wrong_bytes(void **state)
{
	const size_t bytes = 2 * MiB;
	naive n;
	void *host;
	uint64_t got;
	naive_setup(&n, bytes);
	/* Offload, then "release": the allocator hands the range to someone else. */
	assert_int_equal(vmmrt_host_alloc(n.rt, bytes, &host), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(n.rt, host, vmmrt_slot_address(n.act), bytes), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(n.rt, n.s, vmmrt_slot_address(n.act), bytes, 99), VMMRT_OK);
	/* Naive reload: a fresh allocation at another address. */
	vmmrt_slot *fresh;
	assert_int_equal(vmmrt_slot_create(n.rt, bytes, &fresh), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(fresh), VMMRT_OK);
	assert_true(vmmrt_slot_address(fresh) != vmmrt_slot_address(n.act));
	assert_int_equal(vmmrt_copy_to_device(n.rt, vmmrt_slot_address(fresh), host, bytes), VMMRT_OK);
	assert_int_equal(vmmrt_graph_launch(n.rt, n.bwd, n.s), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(n.rt, n.s), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(n.rt, &got, vmmrt_slot_address(n.result), 8), VMMRT_OK);
	assert_true(got != n.expect); /* the graph read the interloper, not the reload */
	/* The fixed-VA reload, for contrast: same address, right bytes. */
	assert_int_equal(vmmrt_slot_unmap(n.act), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(n.act), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_device(n.rt, vmmrt_slot_address(n.act), host, bytes), VMMRT_OK);
	assert_int_equal(vmmrt_graph_launch(n.rt, n.bwd, n.s), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(n.rt, n.s), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(n.rt, &got, vmmrt_slot_address(n.result), 8), VMMRT_OK);
	assert_int_equal(got, n.expect);
	assert_int_equal(vmmrt_host_free(n.rt, host), VMMRT_OK);
	assert_int_equal(vmmrt_graph_destroy(n.rt, n.bwd), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(n.rt, n.s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(n.rt), VMMRT_OK);
}

static void reading_a_released_slot_faults(void **state)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Child: replay the graph after the remap slot was released. cmocka
		 * catches SIGSEGV to report crashes; the child must die of it instead. */
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		naive n;
		naive_setup(&n, 2 * MiB);
		if (vmmrt_slot_unmap(n.act) != VMMRT_OK)
			_exit(3);
		vmmrt_graph_launch(n.rt, n.bwd, n.s);
		vmmrt_stream_synchronize(n.rt, n.s);
		_exit(0); /* not reached if the read faulted */
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_true(WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS);
}

static void api_misuse(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	vmmrt_group *g, *empty;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_group_create(rt, "late", &g), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_E_INVALID_STATE);
	g = model_group(m, 0);
	assert_int_equal(vmmrt_forward_end(g, c), VMMRT_E_INVALID_STATE);   /* no begin */
	assert_int_equal(vmmrt_backward_begin(g, c), VMMRT_E_INVALID_STATE); /* forwards first */
	assert_int_equal(vmmrt_forward_begin(NULL, c), VMMRT_E_INVALID_ARGUMENT);
	/* A compute stream capturing a graph is refused, and nothing changes:
	 * the first iteration then starts as if the calls were never made. */
	vmmrt_graph *gr;
	assert_int_equal(vmmrt_graph_begin_capture(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(g, c), VMMRT_E_CAPTURE);
	assert_int_equal(vmmrt_forward_end(g, c), VMMRT_E_CAPTURE);
	assert_int_equal(vmmrt_graph_end_capture(rt, c, &gr), VMMRT_OK);
	assert_int_equal(vmmrt_graph_destroy(rt, gr), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(g, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(g, c), VMMRT_E_INVALID_STATE);  /* twice */
	assert_int_equal(vmmrt_forward_end(g, c), VMMRT_OK);
	/* Capture drift: a different shape than discovered is a named error. */
	vmmrt_devptr a;
	vmmrt_tensor_desc d = {.bytes = 2 * MiB, .dtype = 7, .ndim = 1, .shape = {(int64_t)(MiB / 4)}, .stride = {1}};
	assert_int_equal(vmmrt_group_begin_capture(g), VMMRT_OK);
	d.shape[0] = 3;
	assert_int_equal(vmmrt_group_save(g, &d, 0, NULL, &a), VMMRT_E_MISMATCH);
	d.shape[0] = (int64_t)(MiB / 4);
	d.dtype = 8;
	assert_int_equal(vmmrt_group_save(g, &d, 0, NULL, &a), VMMRT_E_MISMATCH);
	assert_int_equal(vmmrt_group_end_capture(g), VMMRT_E_MISMATCH); /* 0 of 1 saved */
	d.dtype = 7;
	assert_int_equal(vmmrt_group_begin_capture(g), VMMRT_OK);
	assert_int_equal(vmmrt_group_save(g, &d, 0, NULL, &a), VMMRT_OK);
	assert_int_equal(a, vmmrt_group_address(g));
	assert_int_equal(vmmrt_group_save(g, &d, 0, NULL, &a), VMMRT_E_MISMATCH); /* one too many */
	assert_int_equal(vmmrt_group_end_capture(g), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	model_destroy(m);

	/* Empty groups are no-ops; bad descriptors are refused at discovery. */
	rt = test_runtime((const char *const[]){NULL});
	assert_int_equal(vmmrt_group_create(rt, "empty", &empty), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(empty, &(vmmrt_tensor_desc){.bytes = 0}), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_group_discover(empty, &(vmmrt_tensor_desc){.bytes = 8, .ndim = 9}),
			 VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_group_discover(empty, &(vmmrt_tensor_desc){.bytes = 8, .align = 3}),
			 VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_forward_begin(empty, (vmmrt_stream)0x1), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_begin(empty, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(empty, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* vmmrt_group_replay: each use's hooks and graph in one call keep every
 * restored activation intact, as the three calls do. */
static void one_call_per_use(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1, .one_call = true};
	run_and_verify(&cfg, 4);
	cfg.mode = "remap";
	run_and_verify(&cfg, 4);
}

static void one_call_misuse(void **state)
{
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_group *g = model_group(m, 0);
	vmmrt_stream c;
	vmmrt_graph *gr;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_group_replay(NULL, 0, 0, c), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_group_replay(g, 2, 0, c), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_group_replay(g, 1, 0, c), VMMRT_E_INVALID_STATE); /* forwards first */
	/* a capturing stream is refused as by the hooks */
	assert_int_equal(vmmrt_graph_begin_capture(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_group_replay(g, 0, 0, c), VMMRT_E_CAPTURE);
	assert_int_equal(vmmrt_graph_end_capture(rt, c, &gr), VMMRT_OK);
	/* an executable graph the host backend did not make is refused before
	 * any hook work: the forward then begins as if it was never asked */
	if (test_on_host()) {
		uintptr_t foreign = (uintptr_t)&cfg;
		assert_int_equal(vmmrt_group_replay(g, 0, foreign, c), VMMRT_E_NOT_SUPPORTED);
		assert_non_null(strstr(vmmrt_last_error(), "not a graph of this backend"));
	}
	assert_int_equal(vmmrt_group_replay(g, 0, vmmrt__test_graph_exec(rt, gr), c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(g, c), VMMRT_E_INVALID_STATE); /* the call ended it */
	assert_int_equal(vmmrt_graph_destroy(rt, gr), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	model_destroy(m);
}

/*
 * vmmrt_group_replay_copies writes a group's bytes after the begin hook: in
 * ping-pong the third layer's forward shares the first one's bank, whose
 * bytes are still on their way to the host until the forward's fence, and a
 * backward's bytes are in its bank only once its restore has landed. The
 * latency model moves a copy in chunks of 256 KiB over its modelled time,
 * so a group of 2 MiB reaches its last chunk 7 chunks' time after its
 * first: each forward copies its input into that last chunk (the second
 * forward none, so that the third comes right after the first), each
 * backward copies the chunk out, and each gets back what it was given.
 * Copies made before the begin hook fail both ways.
 */
static void replay_copies_follow_the_bank_fence(void **state)
{
	(void)state;
	const model_cfg cfg = {.mode = "pingpong", .layers = 3, .act_bytes = 2 * MiB, .lookahead = 1,
			       .latency = true, .copy_gbps = 0.02};
	const size_t part = 256 * 1024, at = cfg.act_bytes - part;
	model *m;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	enum { L = 3, ITERS = 2 };
	vmmrt_slot *in[L], *out[L];
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	for (unsigned i = 0; i < L; i++) {
		assert_int_equal(vmmrt_slot_create(rt, part, &in[i]), VMMRT_OK);
		assert_int_equal(vmmrt_slot_map(in[i]), VMMRT_OK);
		assert_int_equal(vmmrt_slot_create(rt, part, &out[i]), VMMRT_OK);
		assert_int_equal(vmmrt_slot_map(out[i]), VMMRT_OK);
	}
	uint64_t *want = malloc(part), *got = malloc(part);
	assert_non_null(want);
	assert_non_null(got);
	for (unsigned it = 0; it < ITERS; it++) {
		for (unsigned i = 0; i < L; i++) {
			vmmrt_group *g = model_group(m, i);
			assert_int_equal(vmmrt_kernel_fill(rt, c, vmmrt_slot_address(in[i]), part, 100 * it + i + 1),
					 VMMRT_OK);
			vmmrt_replay_copy cp = {vmmrt_group_address(g) + at, vmmrt_slot_address(in[i]), i == 1 ? 0 : part};
			assert_int_equal(vmmrt_group_replay_copies(g, 0, 0, c, &cp, 1), VMMRT_OK);
		}
		for (unsigned i = L; i-- > 0;) {
			vmmrt_group *g = model_group(m, i);
			vmmrt_replay_copy cp = {vmmrt_slot_address(out[i]), vmmrt_group_address(g) + at, part};
			assert_int_equal(vmmrt_group_replay_copies(g, 1, 0, c, &cp, 1), VMMRT_OK);
		}
		assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
		for (unsigned i = 0; i < L; i += 2) {
			assert_int_equal(vmmrt_copy_to_host(rt, want, vmmrt_slot_address(in[i]), part), VMMRT_OK);
			assert_int_equal(vmmrt_copy_to_host(rt, got, vmmrt_slot_address(out[i]), part), VMMRT_OK);
			if (memcmp(want, got, part))
				fail_msg("iteration %u, layer %u: the restored bytes are not its input's", it, i);
		}
	}
	free(want);
	free(got);
	for (unsigned i = 0; i < L; i++) {
		assert_int_equal(vmmrt_slot_destroy(in[i]), VMMRT_OK);
		assert_int_equal(vmmrt_slot_destroy(out[i]), VMMRT_OK);
	}
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	model_destroy(m);
}

/* Bad copies are refused before the begin hook: the use can still begin. */
static void replay_copies_misuse(void **state)
{
	(void)state;
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_group *g = model_group(m, 0);
	vmmrt_devptr a = vmmrt_group_address(g);
	vmmrt_stream c;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_group_replay_copies(g, 0, 0, c, NULL, 1), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "copies is NULL"));
	vmmrt_replay_copy bad[] = {
		{a, 0, 64}, {0, a, 64}, {a + 32, a, 64}, {a, a + 32, 64}, {a, UINTPTR_MAX - 8, 64},
	};
	const char *why[] = {"NULL source", "NULL destination", "overlaps", "overlaps", "wraps"};
	for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		vmmrt_replay_copy two[] = {{a, a, 64}, bad[k]}; /* the first, a no-op, is skipped */
		assert_int_not_equal(vmmrt_group_replay_copies(g, 0, 0, c, two, 2), VMMRT_OK);
		assert_non_null(strstr(vmmrt_last_error(), why[k]));
		assert_non_null(strstr(vmmrt_last_error(), "copy 1"));
	}
	/* skipped: 0 bytes, and dst == src (even NULL) */
	vmmrt_replay_copy none[] = {{0, 0, 0}, {a, 0, 0}, {a, a, 64}};
	assert_int_equal(vmmrt_group_replay_copies(g, 0, 0, c, none, 3), VMMRT_OK);
	assert_int_equal(vmmrt_group_replay_copies(g, 1, 0, c, NULL, 0), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	model_destroy(m);
}

static vmmrt_status count_capture_queries(void *ctx, const char *op, uint64_t *delay_us)
{
	(void)delay_us;
	if (!strcmp(op, "cuStreamIsCapturing"))
		(*(unsigned *)ctx)++;
	return VMMRT_OK;
}

/* A use in one call asks once whether the stream is capturing (a driver
 * call on the launch thread); its three calls ask at each hook. */
static void one_call_asks_the_stream_once(void **state)
{
	(void)state;
	model_cfg cfg = {.mode = "pingpong", .layers = 2, .act_bytes = 2 * MiB, .lookahead = 1};
	model *m;
	assert_int_equal(model_create(&cfg, &m), VMMRT_OK);
	vmmrt_runtime *rt = model_runtime(m);
	vmmrt_stream c;
	vmmrt_graph *gr;
	assert_int_equal(vmmrt_stream_create(rt, &c), VMMRT_OK);
	assert_int_equal(vmmrt_graph_begin_capture(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_graph_end_capture(rt, c, &gr), VMMRT_OK);
	uintptr_t exec = vmmrt__test_graph_exec(rt, gr);
	unsigned asked = 0;
	vmmrt__drv_set_fault_hook(rt, count_capture_queries, &asked);
	assert_int_equal(vmmrt_group_replay(model_group(m, 0), 0, exec, c), VMMRT_OK);
	assert_int_equal(asked, 1);
	asked = 0;
	assert_int_equal(vmmrt_forward_begin(model_group(m, 1), c), VMMRT_OK);
	assert_int_equal(vmmrt_graph_launch(rt, gr, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(model_group(m, 1), c), VMMRT_OK);
	assert_int_equal(asked, 2);
	asked = 0;
	assert_int_equal(vmmrt_group_replay(model_group(m, 1), 1, exec, c), VMMRT_OK);
	assert_int_equal(asked, 1);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_stream_synchronize(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_graph_destroy(rt, gr), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	model_destroy(m);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(three_layers_pingpong),
		cmocka_unit_test(three_layers_remap),
		cmocka_unit_test(three_layers_none),
		cmocka_unit_test(remap_with_two_workers_and_lookahead_two),
		cmocka_unit_test(one_layer_each_strategy),
		cmocka_unit_test(remap_inline_verifies_and_blocks),
		cmocka_unit_test(pingpong_fences_hold),
		/* the latency model makes copies slow enough for a missing fence to bite */
		host_only_test(dropping_forward_fence_is_caught),
		host_only_test(dropping_backward_fence_is_caught),
		cmocka_unit_test(lookahead_follows_recorded_order),
		cmocka_unit_test(device_memory_bounds),
		cmocka_unit_test(remap_memory_bound_with_several_workers),
		cmocka_unit_test(no_blocking_in_steady_state),
		cmocka_unit_test(remap_survives_out_of_memory),
		cmocka_unit_test(sync_waits_for_every_worker),
		cmocka_unit_test(two_runtimes_at_once),
		host_only_test(maps_beside_d2h_counted), /* it reads the host backend's count */
		cmocka_unit_test(naive_reload_reads_wrong_bytes),
		host_only_test(reading_a_released_slot_faults), /* a GPU fault is no signal */
		cmocka_unit_test(api_misuse),
		cmocka_unit_test(one_call_per_use),
		cmocka_unit_test(one_call_misuse),
		cmocka_unit_test(one_call_asks_the_stream_once),
		cmocka_unit_test(replay_copies_follow_the_bank_fence),
		cmocka_unit_test(replay_copies_misuse),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap: a slot's releases and maps stay in order whatever fails. A map may
 * run only once every release handed off before it ran: one that passes a
 * release still in flight is unmapped under the copy or graph it let start
 * (on the host backend that is a SIGSEGV, so a bug cannot hide; each test
 * runs in a child process). Found by vmmrt-torture and its API fuzzer:
 *
 *  #16 a cuEventQuery that failed on the worker polling a backward's release
 *      ended that release at once, and admission counted it: the restore's
 *      map passed the group's forward release, still queued behind its D2H;
 *  #17 teardown moved a group's flag past a map that only waited behind a
 *      release in flight: the H2D started, the release then unmapped the slot;
 *  a hook that failed before handing its release off left the group's next
 *      map waiting for a release that never came (and every later map behind
 *      it, in schedule order): the streams stalled until teardown.
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

#include "driver.h"
#include "test-layers.h"
#include "testing.h"

#define MiB (1024ull * 1024)

/* A remap runtime (host backend) whose copies of 1 MiB take 50 ms each.
 * Every map creates its memory (no handle reuse): these bugs were found, and
 * are replayed, with a cuMemCreate on the map's path. */
static const char *lookahead = "1";

static vmmrt_runtime *slow_remap(unsigned ngroups, vmmrt_group **g, vmmrt_stream *c)
{
	vmmrt_runtime *rt;
	const char *const opts[] = {"mode", "remap", "host_latency", "1", "host_copy_gbps", "0.02", "timeout_ms", "2000",
				    "host_granularity", "64K", "lookahead", lookahead, "handle_reuse", "0", NULL};
	test_layers_cfg cfg = {.options = opts, .n = ngroups, .bytes = MiB, .dtype = 1, .capture = true};
	if (test_layers(&cfg, &rt, g, NULL))
		_exit(10);
	if (vmmrt_stream_create(rt, c))
		_exit(11);
	return rt;
}

/* Runs body in a child process, which dies of a fault as the process would
 * (cmocka would catch it otherwise): the test fails on any signal or on a
 * non-zero exit status (the step that went wrong). */
static void in_child(void (*body)(void))
{
	int status;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		alarm(60);
		body();
		_exit(0);
	}
	assert_true(pid >= 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status))
		fail_msg("the child died of signal %d", WTERMSIG(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static int32_t query_failures, creates_fail;

/* #16: the first cuEventQuery a driver worker makes fails; creates fail after. */
static vmmrt_status fail_query(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuEventQuery") && vmmrt__thread_role_get() == VMMRT_ROLE_WORKER &&
	    uatomic_add_return(&query_failures, 1) == 1) {
		uatomic_set(&creates_fail, 1);
		return VMMRT_E_DRIVER;
	}
	if (!strcmp(op, "cuMemCreate") && uatomic_read(&creates_fail))
		return VMMRT_E_OUT_OF_MEMORY;
	return VMMRT_OK;
}

static void event_query_failure_keeps_release_order_child(void)
{
	vmmrt_group *g;
	vmmrt_stream c;
	vmmrt_runtime *rt = slow_remap(1, &g, &c);
	vmmrt__drv_set_fault_hook(rt, fail_query, NULL);
	/* One iteration: the forward's release waits 50 ms behind its D2H;
	 * the backward's release (and its failed query) comes 20 ms in. */
	if (vmmrt_forward_begin(g, c) || vmmrt_forward_end(g, c) || vmmrt_backward_begin(g, c))
		_exit(12);
	usleep(20000);
	if (vmmrt_backward_end(g, c))
		_exit(13);
	/* The restore's map waits for the forward's release (50 ms), then
	 * for memory (creates fail: it retries); the H2D takes 50 ms. */
	usleep(200000);
	uatomic_set(&creates_fail, 0);
	/* The failed query was reported; the release then ran after all. */
	vmmrt_status st = vmmrt_offload_sync(rt);
	if (st == VMMRT_OK)
		_exit(14); /* the failed query must be reported */
	/* The backward's release follows its event on the compute stream, which
	 * is the application's: vmmrt_offload_sync does not wait for it, so the
	 * release has run only once that stream is done (under load it had not). */
	if (vmmrt_stream_synchronize(rt, c) != VMMRT_OK || vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(15);
	vmmrt_offload_stats s = {.size = sizeof(s)};
	if (vmmrt_offload_stats_get(rt, &s) || s.releases != 2)
		_exit(16);
	_exit(vmmrt_runtime_destroy(rt) == VMMRT_OK ? 0 : 17);
}

static void event_query_failure_keeps_release_order(void **state)
{
	in_child(event_query_failure_keeps_release_order_child);
}

static vmmrt_status fail_creates(void *ctx, const char *op, uint64_t *delay_us)
{
	return uatomic_read(&creates_fail) && !strcmp(op, "cuMemCreate") ? VMMRT_E_OUT_OF_MEMORY : VMMRT_OK;
}

static void *creates_come_back(void *arg)
{
	usleep(300000);
	uatomic_set(&creates_fail, 0);
	return NULL;
}

/* #17: destroy while the forward's D2H still runs (its release not queued
 * yet) and the restore's map waits for that release. */
static void teardown(bool memory_comes_back)
{
	vmmrt_group *g;
	vmmrt_stream c;
	pthread_t t;
	vmmrt_runtime *rt = slow_remap(1, &g, &c);
	vmmrt__drv_set_fault_hook(rt, fail_creates, NULL);
	if (vmmrt_forward_begin(g, c) || vmmrt_forward_end(g, c) || vmmrt_backward_begin(g, c))
		_exit(12);
	usleep(30000);
	uatomic_set(&creates_fail, 1);
	if (memory_comes_back && pthread_create(&t, NULL, creates_come_back, NULL))
		_exit(13);
	vmmrt_status st = vmmrt_runtime_destroy(rt);
	/* Memory back: the restore ran on mapped memory and everything is
	 * freed. Never back: the copy stream still waits for a map that
	 * cannot be made, which destroy reports instead of freeing what
	 * the stream would read. */
	if (memory_comes_back) {
		pthread_join(t, NULL);
		_exit(st == VMMRT_OK ? 0 : 14);
	}
	_exit(st == VMMRT_E_BUSY ? 0 : 15);
}

static void teardown_memory_back(void)
{
	teardown(true);
}

static void teardown_memory_gone(void)
{
	teardown(false);
}

static void teardown_waits_for_a_release_in_flight(void **state)
{
	in_child(teardown_memory_back);
}

static void teardown_reports_a_map_never_made(void **state)
{
	in_child(teardown_memory_gone);
}

static int32_t launches_to_fail;

/* The first host function launched from the launch thread fails: the
 * forward's release is never handed off. */
static vmmrt_status fail_launch(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuLaunchHostFunc") && uatomic_read(&launches_to_fail) > 0 &&
	    uatomic_add_return(&launches_to_fail, -1) >= 0)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

/* The application's iteration, going on after a failed hook (as a training
 * loop that logs and goes on): the hooks after it must refuse. */
static vmmrt_status iteration(vmmrt_group **g, unsigned n, vmmrt_stream c, unsigned *refused)
{
	vmmrt_status first = VMMRT_OK, st;
#define STEP(call)                                                                                                     \
	do {                                                                                                           \
		st = (call);                                                                                           \
		if (st != VMMRT_OK && first != VMMRT_OK)                                                               \
			*refused += st == VMMRT_E_INVALID_STATE;                                                       \
		if (st != VMMRT_OK && first == VMMRT_OK)                                                               \
			first = st;                                                                                    \
	} while (0)
	for (unsigned i = 0; i < n; i++) {
		STEP(vmmrt_forward_begin(g[i], c));
		STEP(vmmrt_forward_end(g[i], c));
	}
	for (unsigned i = n; i-- > 0;) {
		STEP(vmmrt_backward_begin(g[i], c));
		STEP(vmmrt_backward_end(g[i], c));
	}
#undef STEP
	return first;
}

static void failed_hook_owes_no_release_child(void)
{
	vmmrt_group *g[3];
	vmmrt_stream c;
	unsigned refused = 0;
	vmmrt_runtime *rt = slow_remap(3, g, &c);
	if (iteration(g, 3, c, &refused) != VMMRT_OK || vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(12);
	/* The first group's forward release is not handed off. */
	vmmrt__drv_set_fault_hook(rt, fail_launch, NULL);
	uatomic_set(&launches_to_fail, 1);
	if (iteration(g, 3, c, &refused) != VMMRT_E_DRIVER || refused != 10)
		_exit(13);
	if (iteration(g, 3, c, &refused) != VMMRT_E_INVALID_STATE)
		_exit(14);
	/* Nothing waits for the release that was not handed off: the
	 * streams drain (a timeout here is the bug). */
	if (vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(15);
	_exit(vmmrt_runtime_destroy(rt) == VMMRT_OK ? 0 : 16);
}

static void failed_hook_owes_no_release(void **state)
{
	in_child(failed_hook_owes_no_release_child);
}

static int32_t records_to_fail;

static vmmrt_status fail_record(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuEventRecord") && uatomic_read(&records_to_fail) > 0 &&
	    uatomic_add_return(&records_to_fail, -1) >= 0)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

/* The last backward's release is not handed off, and the next forward map
 * of that group, requested ahead, needs it: it is owed and counted in its
 * turn (the H200 torture: a request standing for it queued behind that map
 * on the worker, so neither ever ran and teardown found the stream stuck). */
static void owed_release_behind_a_map_ahead_child(void)
{
	vmmrt_group *g[2];
	vmmrt_stream c;
	unsigned refused = 0;
	lookahead = "1";
	vmmrt_runtime *rt = slow_remap(2, g, &c);
	if (iteration(g, 2, c, &refused) != VMMRT_OK || vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(12);
	vmmrt__drv_set_fault_hook(rt, fail_record, NULL);
	if (vmmrt_forward_begin(g[0], c) || vmmrt_forward_end(g[0], c) || vmmrt_forward_begin(g[1], c) ||
	    vmmrt_forward_end(g[1], c) || vmmrt_backward_begin(g[1], c) || vmmrt_backward_end(g[1], c) ||
	    vmmrt_backward_begin(g[0], c))
		_exit(13);
	uatomic_set(&records_to_fail, 1);
	if (vmmrt_backward_end(g[0], c) != VMMRT_E_DRIVER)
		_exit(14);
	if (vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(15);
	_exit(vmmrt_runtime_destroy(rt) == VMMRT_OK ? 0 : 16);
}

static void owed_release_behind_a_map_ahead(void **state)
{
	in_child(owed_release_behind_a_map_ahead_child);
}

/*
 * Look-ahead 2, backward order 1, 0, 2: group 1's restore is requested at
 * the forward of group 1 itself, and its map needs the release that this
 * forward's end will hand off. Its wait must not be on the H2D stream yet:
 * in between, the copy streams must drain (on CUDA, any call that
 * synchronizes the device, from any thread, deadlocked there: the GPU waited
 * for the launch thread, the launch thread for the driver's lock).
 */
static void no_gpu_wait_on_the_launch_threads_future_child(void)
{
	vmmrt_group *g[3];
	vmmrt_stream c;
	lookahead = "2";
	vmmrt_runtime *rt = slow_remap(3, g, &c);
	static const unsigned bwd[] = {1, 0, 2};
	for (int it = 0; it < 3; it++) {
		for (unsigned i = 0; i < 3; i++) {
			if (vmmrt_forward_begin(g[i], c))
				_exit(12);
			/* Between the hooks of a forward: nothing the GPU waits for
			 * may need the launch thread to go on first. */
			if (i == 1 && vmmrt_offload_sync(rt) != VMMRT_OK)
				_exit(13);
			if (vmmrt_forward_end(g[i], c))
				_exit(14);
		}
		for (unsigned k = 0; k < 3; k++)
			if (vmmrt_backward_begin(g[bwd[k]], c) || vmmrt_backward_end(g[bwd[k]], c))
				_exit(15);
	}
	if (vmmrt_offload_sync(rt) != VMMRT_OK)
		_exit(16);
	_exit(vmmrt_runtime_destroy(rt) == VMMRT_OK ? 0 : 17);
}

static void no_gpu_wait_on_the_launch_threads_future(void **state)
{
	in_child(no_gpu_wait_on_the_launch_threads_future_child);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(event_query_failure_keeps_release_order),
		cmocka_unit_test(teardown_waits_for_a_release_in_flight),
		cmocka_unit_test(teardown_reports_a_map_never_made),
		cmocka_unit_test(failed_hook_owes_no_release),
		cmocka_unit_test(no_gpu_wait_on_the_launch_threads_future),
		cmocka_unit_test(owed_release_behind_a_map_ahead),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * Reproducers of library bugs that vmmrt-torture and the API fuzzer found and
 * that are not fixed yet (numbers as in the torture's report). This program is
 * in XFAIL_TESTS: each test fails while its bug is open (XFAIL). A test that
 * passes is an XPASS, which fails `make check`: the bug is fixed, so move the
 * test to test-torture-regress.c, where it must keep passing.
 *
 * Each runs in a child process, since the bugs end in SIGSEGV (a copy into a
 * slot that is not mapped: on the host backend any access to one faults).
 *
 *  #16 remap: a cuEventQuery that fails on the worker polling a backward's
 *      release ends that release at once, and release_done() counts it in
 *      releases_done, which admission reads as "the group's earlier release
 *      ran": the restore's map passes the group's forward release, still
 *      queued behind its D2H. That release then unmaps the slot under the H2D.
 *  #17 remap teardown: rm_quiesce moves a group's flag past every map
 *      requested, also past a map that only waits for its turn behind a
 *      release in flight; the H2D starts on the still-mapped slot, and the
 *      pending release then unmaps it under the copy.
 */
#include "config.h"

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

#include "backend/backend.h"
#include "driver.h"

#define MiB (1024ull * 1024)

/* A remap runtime with one group of 1 MiB whose copies take 50 ms each. */
static vmmrt_runtime *slow_remap(vmmrt_group **g, vmmrt_stream *c)
{
	vmmrt_options *o;
	vmmrt_runtime *rt;
	vmmrt_devptr a;
	vmmrt_tensor_desc d = {.bytes = MiB, .dtype = 1, .ndim = 1, .shape = {(int64_t)(MiB / 8)}, .stride = {1}};
	if (vmmrt_options_create(&o) || vmmrt_options_set(o, "backend", "host") || vmmrt_options_set(o, "mode", "remap") ||
	    vmmrt_options_set(o, "host_latency", "1") || vmmrt_options_set(o, "host_copy_gbps", "0.02") ||
	    vmmrt_options_set(o, "host_granularity", "64K") || vmmrt_runtime_create(o, &rt))
		_exit(10);
	vmmrt_options_destroy(o);
	if (vmmrt_stream_create(rt, c) || vmmrt_group_create(rt, "g", g) || vmmrt_group_discover(*g, &d) ||
	    vmmrt_offload_allocate(rt) || vmmrt_group_begin_capture(*g) || vmmrt_group_save(*g, &d, 0, NULL, &a) ||
	    vmmrt_group_end_capture(*g))
		_exit(11);
	return rt;
}

static int32_t query_failures, creates_fail;

/* #16: the first cuEventQuery a driver worker makes fails; creates fail after. */
static vmmrt_status hook16(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuEventQuery") && vmmrt_thread_role_get() == VMMRT_ROLE_WORKER &&
	    uatomic_add_return(&query_failures, 1) == 1) {
		uatomic_set(&creates_fail, 1);
		return VMMRT_E_DRIVER;
	}
	if (!strcmp(op, "cuMemCreate") && uatomic_read(&creates_fail))
		return VMMRT_E_OUT_OF_MEMORY;
	return VMMRT_OK;
}

/* #17: once destroy has begun, creates fail for a while. */
static vmmrt_status hook17(void *ctx, const char *op, uint64_t *delay_us)
{
	return uatomic_read(&creates_fail) && !strcmp(op, "cuMemCreate") ? VMMRT_E_OUT_OF_MEMORY : VMMRT_OK;
}

/* In the child: die of a fault, as the process would (cmocka catches it otherwise). */
static void child_signals(void)
{
	signal(SIGSEGV, SIG_DFL);
	signal(SIGBUS, SIG_DFL);
	alarm(60);
}

static void expect_clean_child(pid_t pid)
{
	int status;
	assert_true(pid >= 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status))
		fail_msg("the child died of signal %d", WTERMSIG(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void event_query_failure_keeps_release_order(void **state)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		child_signals();
		vmmrt_group *g;
		vmmrt_stream c;
		vmmrt_runtime *rt = slow_remap(&g, &c);
		vmmrt_drv_set_fault_hook(rt, hook16, NULL);
		/* One iteration: the forward's release waits 50 ms behind its D2H;
		 * the backward's release (and its failed query) comes 20 ms in. */
		if (vmmrt_forward_begin(g, c) || vmmrt_forward_end(g, c) || vmmrt_backward_begin(g, c))
			_exit(12);
		usleep(20000);
		if (vmmrt_backward_end(g, c))
			_exit(13);
		/* The restore's map must wait for the forward's release: let both run
		 * (the release comes after the 50 ms D2H, the H2D takes 50 ms). */
		usleep(200000);
		/* No destroy: this bug needs no teardown (that one is #17). */
		_exit(0);
	}
	expect_clean_child(pid);
}

static void teardown_quiesce_waits_for_releases(void **state)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		child_signals();
		vmmrt_group *g;
		vmmrt_stream c;
		vmmrt_runtime *rt = slow_remap(&g, &c);
		vmmrt_drv_set_fault_hook(rt, hook17, NULL);
		if (vmmrt_forward_begin(g, c) || vmmrt_forward_end(g, c) || vmmrt_backward_begin(g, c))
			_exit(12);
		usleep(30000); /* the D2H still runs: the forward's release is not queued yet */
		uatomic_set(&creates_fail, 1);
		(void)vmmrt_runtime_destroy(rt); /* destroy with work in flight */
		_exit(0);
	}
	expect_clean_child(pid);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(event_query_failure_keeps_release_order),
		cmocka_unit_test(teardown_quiesce_waits_for_releases),
	};
	/* The verdicts are the TAP lines (XFAIL while the bugs are open); the exit
	 * status would make the harness report an error on top of them. */
	(void)cmocka_run_group_tests(tests, NULL, NULL);
	return 0;
}

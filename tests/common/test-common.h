/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What the runtime-level tests share: they run on the host backend by
 * default and on a GPU when VMMRT_BACKEND=cuda is set (make gpu-suite). Tests
 * that rely on the host emulation (a capacity to run out of, the latency
 * model, a SIGSEGV on an unmapped read) are marked HOST_ONLY and left out of
 * the plan on a GPU; without a GPU a cuda run is a TAP skip, not a failure.
 */
#ifndef VMMRT__TEST_COMMON_H
#define VMMRT__TEST_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check-ok.h"
#include "test-layers.h"
#include "vmmrt.h"

#define HOST_ONLY ((void *)"host-only")
#define host_only_test(f) {#f, f, NULL, NULL, HOST_ONLY}

static inline const char *test_backend(void)
{
	const char *b = getenv("VMMRT_BACKEND");
	return b && *b ? b : "host";
}

static inline bool test_on_host(void)
{
	return strcmp(test_backend(), "host") == 0;
}

/* Device memory in use now, for deltas (a GPU has other users of its memory). */
static inline size_t test_used(vmmrt_runtime *rt)
{
	size_t f = 0, t = 0;
	if (vmmrt_mem_info(rt, &f, &t) != VMMRT_OK)
		return (size_t)-1;
	return t - f;
}

/* Device memory in use when test_runtime made the last runtime: tests measure from there. */
static size_t test_baseline;

/* test_layers_runtime's runtime, asserted; it records the baseline. */
static inline vmmrt_runtime *test_runtime(const char *const *kv)
{
	vmmrt_runtime *rt = NULL;
	assert_int_equal(test_layers_runtime(kv, &rt), VMMRT_OK);
	test_baseline = test_used(rt);
	return rt;
}

/* Device memory used since test_runtime. */
static inline void test_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* 64 MiB of host capacity and one quick OOM retry: the slot tests' runtime. */
static inline vmmrt_runtime *test_slot_runtime(void)
{
	return test_runtime((const char *const[]){"host_capacity", "64M", "oom_retries", "1", "oom_backoff_us", "10",
						  NULL});
}

/* The worker runs a release once its event has completed and it polls
 * again (every 50 us): wait, bounded, until the slot leaves PENDING. */
static inline vmmrt_slot_state test_settled_state(vmmrt_slot *s)
{
	for (int i = 0; i < 5000 && vmmrt_slot_get_state(s) == VMMRT_SLOT_PENDING; i++)
		test_sleep_ms(1);
	return vmmrt_slot_get_state(s);
}

static inline size_t used(vmmrt_runtime *rt)
{
	return test_used(rt) - test_baseline;
}

static inline int test_run(struct CMUnitTest *tests, size_t n)
{
	if (!test_on_host()) {
		vmmrt_runtime *rt;
		vmmrt_status st = vmmrt_runtime_create(NULL, &rt);
		if (st != VMMRT_OK) {
			/* The TAP driver counts exit 77 as an error: report a skipped plan. */
			printf("1..0 # SKIP %s backend unavailable: %s\n", test_backend(), vmmrt_last_error());
			return getenv("CMOCKA_MESSAGE_OUTPUT") ? 0 : 77;
		}
		vmmrt_runtime_destroy(rt);
	}
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (test_on_host() || tests[i].initial_state != HOST_ONLY)
			tests[m++] = tests[i];
	for (size_t i = 0; i < m; i++)
		tests[i].initial_state = NULL;
	return _cmocka_run_group_tests("tests", tests, m, NULL, NULL);
}

#endif

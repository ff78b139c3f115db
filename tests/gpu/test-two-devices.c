/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * One runtime per device, both running the offload cycle at once in one
 * process: each runtime's workers bind its own device's context. Needs two
 * GPUs; with fewer it is a TAP skip (run it with VMMRT_BACKEND=cuda).
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "offload-model.h"

#define MiB (1024ull * 1024)

static void one_runtime_per_device(void **state)
{
	model_job r[2] = {
		{.cfg = {.mode = "pingpong", .layers = 4, .act_bytes = 64 * MiB, .lookahead = 1, .fwd_ns = 500000,
			 .bwd_ns = 1000000, .device = 0}, .iterations = 4},
		{.cfg = {.mode = "remap", .layers = 4, .act_bytes = 64 * MiB, .lookahead = 1, .fwd_ns = 500000,
			 .bwd_ns = 1000000, .device = 1}, .iterations = 4},
	};
	assert_int_equal(model_jobs_run(r, 2), 0);
}

int main(void)
{
	/* Two devices or nothing: probe device 1 on the CUDA backend. */
	vmmrt_options *o;
	vmmrt_runtime *rt;
	if (vmmrt_options_create(&o) != VMMRT_OK)
		return 1;
	vmmrt_options_set(o, "backend", "cuda");
	vmmrt_options_set(o, "device", "1");
	vmmrt_status st = vmmrt_runtime_create(o, &rt);
	vmmrt_options_destroy(o);
	if (st != VMMRT_OK) {
		printf("1..0 # SKIP needs two CUDA devices: %s\n", vmmrt_last_error());
		return getenv("CMOCKA_MESSAGE_OUTPUT") ? 0 : 77;
	}
	vmmrt_runtime_destroy(rt);
	setenv("VMMRT_BACKEND", "cuda", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(one_runtime_per_device),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

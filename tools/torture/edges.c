/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Edge arguments: the offload calls with their zero, NULL and
 * one-past-the-end arguments, in whatever state the scenario reached (before
 * discovery, after it, after allocation, before a use of an iteration, after
 * an abort). Each must come back with its named error and change nothing,
 * which the scenario proves by carrying on and verifying every activation.
 * Before allocation, a scenario that records its order also declares the
 * empty schedule, which is valid there (vmmrt.torch declares one when no
 * layer moves anything, and it once crashed the runtime with groups).
 *
 * Whether a state gets them follows from the seed, never from the
 * scenario's random stream: the same seed makes the same scenario with or
 * without them (the regression seeds stay what they were).
 */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "options.h"
#include "scenario.h"

#define EXPECT(s, want, call) s_expect((s), API((s), #call, call), (want), #call)

bool edges_here(const scen *s, unsigned salt)
{
	uint64_t x = (s->seed ^ ((uint64_t)salt * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
	return (x >> 61) == 0; /* one state in eight */
}

void illegal_edges(scen *s, unsigned groups, bool allocated)
{
	vmmrt_runtime *rt = s->rt;
	vmmrt_group *g = groups ? s->G[0].g : NULL;
	vmmrt_schedule_step steps[2 * MAXG + 1];
	vmmrt_tensor_desc d = {.bytes = 8, .dtype = 7, .ndim = VMMRT_MAX_DIMS + 1}; /* one dimension too many */
	vmmrt_option_info info = {.size = sizeof(info)};
	vmmrt_driver_stats ds = {.size = sizeof(ds)};
	vmmrt_devptr a = 0;
	memset(steps, 0, sizeof(steps)); /* NULL groups */

	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_set_schedule(NULL, NULL, 0));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_set_schedule(rt, NULL, 1));
	if (allocated) {
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_offload_set_schedule(rt, NULL, 0));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_offload_set_schedule(rt, steps, 1));
	} else {
		/* one step past a forward and a backward of every group */
		EXPECT(s, VMMRT_E_MISMATCH, vmmrt_offload_set_schedule(rt, steps, 2 * (size_t)groups + 1));
		if (groups)
			EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_set_schedule(rt, steps, 1));
		if (!s->declared && !s->errored)
			s_ok(s, API(s, "vmmrt_offload_set_schedule(empty)", vmmrt_offload_set_schedule(rt, NULL, 0)),
			     "vmmrt_offload_set_schedule(empty)");
	}
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_abort(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_rediscover(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_release_retired(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_sync(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_allocate(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_stats_get(rt, NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_stats_reset(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_driver_stats_get(rt, VMMRT_DRIVER_CALLS, &ds));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_option_describe(VMMRT_OPT_COUNT_, &info));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_create(rt, "edge", NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(NULL, &d));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_save(NULL, &d, 0, NULL, &a));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_begin_capture(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_end_capture(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_forward_begin(NULL, s->compute));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_forward_end(NULL, s->compute));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_backward_begin(NULL, s->compute));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_backward_end(NULL, s->compute));
	if (g) {
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(g, NULL));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(g, &d));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_save(g, NULL, 0, NULL, &a));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_save(g, &d, 0, NULL, NULL));
	}
	if (vmmrt_group_get_state(NULL) != VMMRT_GROUP_FAILED || vmmrt_group_address(NULL) ||
	    vmmrt_group_bytes(NULL))
		t_fail(s->seed, "edges", "a NULL group has a state, an address or a size");
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The streams a framework computes on: the legacy default stream (NULL, as
 * PyTorch passes its default stream), VMMRT_STREAM_LEGACY and
 * VMMRT_STREAM_PER_THREAD are valid wherever a stream is taken, as created
 * streams are; graphs captured on a created stream replay on a default one.
 * Also the public events and asynchronous copies. Host backend by default,
 * the GPU with VMMRT_BACKEND=cuda (make gpu-suite).
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "offload-model.h"
#include "test-common.h"

static const char *const defaults[] = {"null", "legacy", "per-thread"};

static void round_trip(const char *mode, const char *replay_on)
{
	model_cfg cfg = {.mode = mode, .layers = 3, .act_bytes = 256 << 10, .fwd_ns = 200000,
			 .bwd_ns = 400000, .lookahead = 1, .replay_on = replay_on};
	model *m;
	unsigned checked;
	OK(model_create(&cfg, &m));
	OK(model_run(m, 4));
	unsigned bad = model_verify(m, &checked);
	if (bad)
		fail_msg("%s on %s: %u of %u activations wrong", mode, replay_on, bad, checked);
	assert_int_equal(checked, 12);
	assert_int_equal(model_stale_messages(m), 0);
	model_destroy(m);
}

/* Hooks and graph launches on every default stream, both strategies: the
 * bytes each backward reads are the ones its forward wrote. */
static void hooks_on_default_streams(void **state)
{
	for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
		round_trip("pingpong", defaults[i]);
		round_trip("remap", defaults[i]);
	}
}

static vmmrt_runtime *runtime(void)
{
	return test_runtime((const char *const[]){NULL});
}

/* A graph cannot be captured on the legacy stream (CUDA refuses it too) but
 * replays there; a default stream is never destroyed. */
static void capture_elsewhere_replay_on_default(void **state)
{
	vmmrt_runtime *rt = runtime();
	vmmrt_stream s;
	vmmrt_slot *slot;
	vmmrt_graph *g;
	uint64_t sum = 0;
	OK(vmmrt_stream_create(rt, &s));
	assert_int_not_equal(vmmrt_graph_begin_capture(rt, NULL), VMMRT_OK);
	assert_int_not_equal(vmmrt_graph_begin_capture(rt, VMMRT_STREAM_LEGACY), VMMRT_OK);
	assert_true(vmmrt_last_error()[0] != '\0');
	OK(vmmrt_slot_create(rt, 1 << 20, &slot));
	OK(vmmrt_slot_map(slot));
	vmmrt_devptr a = vmmrt_slot_address(slot);
	OK(vmmrt_graph_begin_capture(rt, s));
	OK(vmmrt_kernel_fill(rt, s, a, 1 << 19, 42));
	OK(vmmrt_graph_end_capture(rt, s, &g));
	for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++) {
		vmmrt_stream d = i == 0 ? NULL : i == 1 ? VMMRT_STREAM_LEGACY : VMMRT_STREAM_PER_THREAD;
		OK(vmmrt_kernel_fill(rt, d, a, 1 << 19, 1)); /* overwritten by the replay below */
		OK(vmmrt_graph_launch(rt, g, d));
		OK(vmmrt_kernel_checksum(rt, d, a, 1 << 19, a + (1 << 19)));
		OK(vmmrt_stream_synchronize(rt, d));
		OK(vmmrt_copy_to_host(rt, &sum, a + (1 << 19), sizeof(sum)));
		uint64_t *host = malloc(1 << 19);
		OK(vmmrt_copy_to_host(rt, host, a, 1 << 19));
		assert_true(vmmrt_checksum_host(host, 1 << 19) == sum);
		assert_true(host[5] == vmmrt_fill_word(42, 5));
		free(host);
		assert_int_equal(vmmrt_stream_destroy(rt, d), VMMRT_E_INVALID_ARGUMENT);
	}
	OK(vmmrt_graph_destroy(rt, g));
	OK(vmmrt_slot_destroy(slot));
	OK(vmmrt_stream_destroy(rt, s));
	OK(vmmrt_runtime_destroy(rt));
}

/* Events and asynchronous copies, the public forms of what the hooks use. */
static void events_and_async_copies(void **state)
{
	vmmrt_runtime *rt = runtime();
	vmmrt_stream s;
	vmmrt_slot *slot;
	vmmrt_event *e0, *e1, *plain;
	void *src, *dst;
	size_t n = 4 << 20;
	int done = -1;
	float ms = -1;
	OK(vmmrt_stream_create(rt, &s));
	OK(vmmrt_slot_create(rt, n, &slot));
	OK(vmmrt_slot_map(slot));
	OK(vmmrt_host_alloc(rt, n, &src));
	OK(vmmrt_host_alloc(rt, n, &dst));
	for (size_t i = 0; i < n / 8; i++)
		((uint64_t *)src)[i] = vmmrt_fill_word(7, i);
	memset(dst, 0, n);
	assert_int_equal(vmmrt_event_create(rt, 0x80, &plain), VMMRT_E_INVALID_ARGUMENT);
	OK(vmmrt_event_create(rt, 0, &plain));
	OK(vmmrt_event_query(rt, plain, &done)); /* never recorded: complete */
	assert_int_equal(done, 1);
	OK(vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &e0));
	OK(vmmrt_event_create(rt, VMMRT_EVENT_TIMING, &e1));
	OK(vmmrt_event_record(rt, e0, s));
	OK(vmmrt_copy_to_device_async(rt, vmmrt_slot_address(slot), src, n, s));
	OK(vmmrt_event_record(rt, e1, s));
	/* the default stream copies back only after the upload: a device-side wait */
	OK(vmmrt_stream_wait_event(rt, NULL, e1));
	OK(vmmrt_copy_to_host_async(rt, dst, vmmrt_slot_address(slot), n, NULL));
	OK(vmmrt_event_record(rt, plain, NULL));
	OK(vmmrt_event_synchronize(rt, plain));
	OK(vmmrt_event_query(rt, plain, &done));
	assert_int_equal(done, 1);
	assert_string_equal(vmmrt_last_error(), "");
	assert_memory_equal(src, dst, n);
	OK(vmmrt_event_elapsed_ms(rt, e0, e1, &ms));
	assert_true(ms >= 0);
	assert_int_equal(vmmrt_copy_to_host_async(rt, dst, vmmrt_slot_address(slot), 0, s), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_event_record(rt, NULL, s), VMMRT_E_INVALID_ARGUMENT);
	OK(vmmrt_event_destroy(rt, NULL));
	OK(vmmrt_event_destroy(rt, plain));
	OK(vmmrt_event_destroy(rt, e0));
	OK(vmmrt_event_destroy(rt, e1));
	OK(vmmrt_host_free(rt, src));
	OK(vmmrt_host_free(rt, dst));
	OK(vmmrt_slot_destroy(slot));
	OK(vmmrt_stream_destroy(rt, s));
	OK(vmmrt_runtime_destroy(rt));
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(hooks_on_default_streams),
		cmocka_unit_test(capture_elsewhere_replay_on_default),
		cmocka_unit_test(events_and_async_copies),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

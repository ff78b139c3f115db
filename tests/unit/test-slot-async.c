/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Stream-ordered backing of the application's slots on the host backend:
 * vmmrt_slot_map_async, vmmrt_slot_wait and vmmrt_slot_release_after. A
 * release waits for its stream and gives the memory to the driver (never a
 * pool); a map made before the release ran cancels it, bytes intact; a
 * launch thread may run steps ahead of the GPU; every refusal is named; the
 * slot's state and the statistics' slot_bytes tell the truth throughout.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <urcu/uatomic.h>

#include "runtime.h"
#include "slot.h"
#include "test-common.h"
#include "testing.h"

#define MiB (1024ull * 1024)
#define MS (1000ull * 1000)

static vmmrt_offload_stats stats(vmmrt_runtime *rt)
{
	vmmrt_offload_stats o = {.size = sizeof(o)};
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	return o;
}

/* The checksum of the slot's first n bytes, computed on the device into res. */
static uint64_t device_checksum(vmmrt_runtime *rt, vmmrt_stream st, vmmrt_devptr va, size_t n, vmmrt_slot *res)
{
	uint64_t sum = 0;
	assert_int_equal(vmmrt_kernel_checksum(rt, st, va, n, vmmrt_slot_address(res)), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, &sum, vmmrt_slot_address(res), 8), VMMRT_OK);
	return sum;
}

/* What vmmrt_kernel_fill(seed) writes over n bytes, checksummed on the host. */
static uint64_t fill_checksum(size_t n, uint64_t seed)
{
	uint64_t *buf = malloc(n);
	assert_non_null(buf);
	for (size_t i = 0; i < n / 8; i++)
		buf[i] = vmmrt_fill_word(seed, i);
	uint64_t sum = vmmrt_checksum_host(buf, n);
	free(buf);
	return sum;
}

/* Fault hook: delay every cuMemCreate (a slow worker), or fail one op. */
typedef struct hook {
	const char *fail;  /* op to fail, while fails > 0 */
	int32_t fails;
	uint64_t create_delay_us;
} hook;

static vmmrt_status hook_fn(void *ctx, const char *op, uint64_t *delay_us)
{
	hook *h = ctx;
	if (!strcmp(op, "cuMemCreate"))
		*delay_us = h->create_delay_us;
	if (h->fail && !strcmp(op, h->fail) && uatomic_add_return(&h->fails, -1) >= 0)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

/* 1. map_async returns before the worker has mapped (PENDING meanwhile);
 *    after vmmrt_slot_wait the memory is there and usable. */
static void map_async_then_wait(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	hook h = {.create_delay_us = 50000};
	vmmrt_slot *s, *res;
	vmmrt_stream st;
	const size_t n = 4 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK); /* nothing queued: at once */
	uint64_t blocking = stats(rt).launch_thread_blocking;

	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_PENDING); /* the worker is in its 50 ms create */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);            /* a map queued: nothing more */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_E_BUSY);               /* the synchronous calls wait their turn */
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(stats(rt).launch_thread_blocking, blocking + 1); /* the wait blocked, and said so */
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), n + vmmrt_slot_size(res));
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 2); /* res and s: the second map_async queued nothing */

	assert_int_equal(vmmrt_kernel_fill(rt, st, vmmrt_slot_address(s), n, 11), VMMRT_OK);
	assert_int_equal(device_checksum(rt, st, vmmrt_slot_address(s), n, res), fill_checksum(n, 11));
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK); /* mapped: nothing queued */
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* 2. The release waits for the work enqueued before it: while the stream is
 *    busy the memory stays (and is readable); then it goes to the driver. */
static void release_after_waits_for_the_stream(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream st;
	vmmrt_event *passed;
	const size_t n = 4 * MiB;
	uint64_t word = 0;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &passed), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, st, vmmrt_slot_address(s), n, 5), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK); /* written: only the next kernel holds it */
	assert_int_equal(vmmrt_kernel_busy(rt, st, 300 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, passed, st), VMMRT_OK);
	uint64_t blocking = stats(rt).launch_thread_blocking;
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(stats(rt).launch_thread_blocking, blocking); /* it returned at once */

	/* Until the stream passes the release, the memory is there. */
	int done = 0, checks = 0;
	while (vmmrt_event_query(rt, passed, &done) == VMMRT_OK && !done) {
		vmmrt_slot_state now = vmmrt_slot_get_state(s);
		size_t mapped = used(rt);
		assert_int_equal(vmmrt_event_query(rt, passed, &done), VMMRT_OK);
		if (done)
			break; /* the release may have run between the reads */
		assert_int_equal(now, VMMRT_SLOT_PENDING);
		assert_int_equal(mapped, n);
		checks++;
		test_sleep_ms(10);
	}
	assert_true(checks > 0);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), 0); /* back to the driver */
	assert_int_equal(stats(rt).slot_bytes, 0);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);

	/* And again: the same address, new memory. */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, st, vmmrt_slot_address(s), n, 6), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, &word, vmmrt_slot_address(s), 8), VMMRT_OK);
	assert_int_equal(word, vmmrt_fill_word(6, 0));
	assert_int_equal(vmmrt_event_destroy(rt, passed), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* 3. A map_async before the release ran cancels it: the bytes written
 *    before are intact once the stream has passed the release's point. */
static void map_async_cancels_a_pending_release(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s, *res;
	vmmrt_stream st;
	const size_t n = 4 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, st, vmmrt_slot_address(s), n, 9), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_busy(rt, st, 200 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	/* The gradient is needed again before the GPU got there. */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), n + vmmrt_slot_size(res));
	assert_int_equal(stats(rt).slot_bytes, n + vmmrt_slot_size(res));
	assert_int_equal(device_checksum(rt, st, vmmrt_slot_address(s), n, res), fill_checksum(n, 9));
	/* A release asked after that map does run. */
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), vmmrt_slot_size(res));
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 4. A launch thread several steps ahead of the GPU: each step maps (or
 *    keeps), writes, checksums and releases after its work on a busy
 *    stream, never synchronizing. A map_async cancels the release of the
 *    step before while the GPU is behind; once in the middle the launch
 *    thread lets the GPU catch up (watching the slot, not the stream), so a
 *    release really runs and the next step maps new memory. Every step's
 *    bytes are right, the ring of releases waits (and counts it) when the
 *    GPU is more steps behind than it holds, and nothing leaks.
 */
static void steps_ahead_of_the_gpu(void **state)
{
	enum { STEPS = 10 };
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s, *res;
	vmmrt_stream st;
	const size_t n = 2 * MiB;
	uint64_t sums[STEPS];
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, STEPS * 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	vmmrt_devptr va = vmmrt_slot_address(s);
	for (int i = 0; i < STEPS; i++) {
		assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
		assert_int_equal(vmmrt_kernel_busy(rt, st, 50 * MS), VMMRT_OK);
		assert_int_equal(vmmrt_kernel_fill(rt, st, va, n, 100 + (uint64_t)i), VMMRT_OK);
		assert_int_equal(vmmrt_kernel_checksum(rt, st, va, n, vmmrt_slot_address(res) + 8 * (vmmrt_devptr)i),
				 VMMRT_OK);
		uint64_t blocking = stats(rt).launch_thread_blocking;
		assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
		/* Step 4's release takes the ring's first record, whose release
		 * (step 0's, cancelled) still waits for step 0's work: it waits
		 * for it, and step 5's for step 1's; then the GPU catches up. */
		assert_int_equal(stats(rt).launch_thread_blocking, blocking + (i == 4 || i == 5));
		if (i == 5)
			assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED); /* the GPU caught up */
	}
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), vmmrt_slot_size(res));
	assert_int_equal(vmmrt_copy_to_host(rt, sums, vmmrt_slot_address(res), sizeof(sums)), VMMRT_OK);
	for (int i = 0; i < STEPS; i++)
		assert_int_equal(sums[i], fill_checksum(n, 100 + (uint64_t)i));
	/* res, then s before step 0 and after step 5's release: the other
	 * releases were cancelled by the next step's map. */
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 3);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK); /* fails on any leaked handle or slot */
}

/* 5. The application's slots never pool: with remap's handle reuse and a
 *    handle pool, a released slot's memory still goes back to the driver. */
static void released_memory_is_not_pooled(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"host_capacity", "64M", "mode", "remap", "handle_pool",
							       "4", "handle_reuse", "1", NULL});
	vmmrt_slot *s;
	vmmrt_stream st;
	const size_t n = 4 * MiB;
	vmmrt__slot_pool_stats ps;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
		assert_int_equal(used(rt), n);
		assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
		assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
		assert_int_equal(used(rt), 0);
		/* The synchronous unmap gives it back too. */
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
		assert_int_equal(used(rt), 0);
	}
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.pool_handles, 0);
	assert_int_equal(ps.pool_hits, 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

typedef struct hf_ctx {
	vmmrt_slot *slot;
	vmmrt_stream stream;
	vmmrt_status map_st, wait_st, release_st;
} hf_ctx;

static void inside_host_function(void *arg)
{
	hf_ctx *c = arg;
	c->map_st = vmmrt_slot_map_async(c->slot);
	c->wait_st = vmmrt_slot_wait(c->slot);
	c->release_st = vmmrt_slot_release_after(c->slot, c->stream);
}

/* 6. Every refusal named, and the slot unchanged by it. */
static void errors_are_named(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream st, cap;
	vmmrt_graph *g;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &cap), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_wait(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_release_after(NULL, st), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "slot is NULL"));

	/* Nothing to release: never mapped, or released already. */
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	char name[32];
	snprintf(name, sizeof(name), "slot %llu", (unsigned long long)s->id);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), name));
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_busy(rt, st, 100 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK); /* a map queued is enough */
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_E_BUSY); /* a release queued */
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_E_INVALID_STATE);

	/* A capturing stream: refused before anything is queued. */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_graph_begin_capture(rt, cap), VMMRT_OK);
	assert_int_equal(vmmrt_slot_release_after(s, cap), VMMRT_E_CAPTURE);
	assert_non_null(strstr(vmmrt_last_error(), name));
	assert_int_equal(vmmrt_graph_end_capture(rt, cap, &g), VMMRT_OK);
	assert_int_equal(vmmrt_graph_destroy(rt, g), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);

	/* From a host function: refused, nothing changed. */
	hf_ctx c = {.slot = s, .stream = st};
	assert_int_equal(vmmrt__drv_launch_host_func(rt, st, inside_host_function, &c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(c.map_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.wait_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.release_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);

	/* A failed release: reported by the next call on the slot, which is
	 * left mapped and may be released again. */
	hook h = {.fail = "cuMemUnmap", .fails = 1};
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_FAILED);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "earlier asynchronous request failed"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), 0);

	/* A failed map: reported by vmmrt_slot_wait; the next map_async maps. */
	h = (hook){.fail = "cuMemCreate", .fails = 1}; /* a driver error: not retried */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemCreate"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK); /* reported once */
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);

	/* Destroyed with a release waiting for its stream, and another slot
	 * with its map queued: both cancelled, nothing leaks. */
	vmmrt_slot *t;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &t), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_busy(rt, st, 300 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_PENDING);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	h = (hook){.create_delay_us = 50000};
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);
	assert_int_equal(vmmrt_slot_map_async(t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(t), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(used(rt), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, cap), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* 7. slot_bytes and slot_peak_bytes follow the maps and the releases (and
 *    only the application's slots: the offload's own are activations). */
static void statistics_follow_the_slots(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *a, *b, *own;
	vmmrt_stream st;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 4 * MiB, &b), VMMRT_OK);
	assert_int_equal(vmmrt__slot_reserve(rt, 8 * MiB, &own), VMMRT_OK);
	assert_int_equal(vmmrt__slot_map(own), VMMRT_OK);
	vmmrt_offload_stats o = stats(rt);
	assert_int_equal(o.slot_bytes, 0);
	assert_int_equal(o.slot_peak_bytes, 0);
	assert_int_equal(vmmrt_slot_map_async(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(b), VMMRT_OK);
	o = stats(rt);
	assert_int_equal(o.slot_bytes, 6 * MiB);
	assert_int_equal(o.slot_peak_bytes, 6 * MiB);
	assert_int_equal(vmmrt_slot_release_after(b, st), VMMRT_OK);
	assert_int_equal(test_settled_state(b), VMMRT_SLOT_RESERVED);
	o = stats(rt);
	assert_int_equal(o.slot_bytes, 2 * MiB);
	assert_int_equal(o.slot_peak_bytes, 6 * MiB);
	assert_int_equal(vmmrt_offload_stats_reset(rt), VMMRT_OK);
	o = stats(rt);
	assert_int_equal(o.slot_peak_bytes, 2 * MiB);
	assert_int_equal(vmmrt_slot_unmap(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(b), VMMRT_OK);
	o = stats(rt);
	assert_int_equal(o.slot_bytes, 4 * MiB);
	assert_int_equal(o.slot_peak_bytes, 4 * MiB);
	/* A caller built against the struct before these two fields gets the rest. */
	vmmrt_offload_stats old = {.size = offsetof(vmmrt_offload_stats, slot_bytes)};
	old.slot_bytes = 12345;
	assert_int_equal(vmmrt_offload_stats_get(rt, &old), VMMRT_OK);
	assert_int_equal(old.slot_bytes, 12345);
	assert_int_equal(vmmrt_slot_destroy(b), VMMRT_OK);
	assert_int_equal(stats(rt).slot_bytes, 0);
	assert_int_equal(vmmrt__slot_destroy(own), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 8. A synchronous vmmrt_slot_map starts a map generation, as map_async
 *    does: a release_after asked after it claims that generation and gives
 *    the memory back (a release asked in a generation the map did not move
 *    to would read as overtaken and leave the slot mapped), each time; a
 *    map_async after a synchronous map finds it mapped and queues nothing.
 */
static void release_after_a_synchronous_map(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream st;
	const size_t n = 2 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(used(rt), n);
		assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
		assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
		assert_int_equal(used(rt), 0);
		assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	}
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 3);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(map_async_then_wait),
		cmocka_unit_test(release_after_waits_for_the_stream),
		cmocka_unit_test(map_async_cancels_a_pending_release),
		cmocka_unit_test(steps_ahead_of_the_gpu),
		cmocka_unit_test(released_memory_is_not_pooled),
		cmocka_unit_test(errors_are_named),
		cmocka_unit_test(statistics_follow_the_slots),
		cmocka_unit_test(release_after_a_synchronous_map),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

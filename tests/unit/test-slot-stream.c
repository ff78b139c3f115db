/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The stream waits of the application's slots on the host backend:
 * vmmrt_slot_map_after (the worker maps once an event has completed) and
 * vmmrt_slot_wait_stream (a stream waits on the device for the maps queued
 * so far). The map comes only after its event, the stream's later work only
 * after the map; a map_after cancels a release not yet run, as map_async
 * does; a failed map still lets the stream go on, and says why; every
 * refusal is named. The host backend's stream threads run the wait-values
 * as the GPU would, and a kernel over an unmapped slot faults there as it
 * would on the GPU, so a wait that lets work through too early fails here.
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

/* Has the event completed? Bounded: fails the test after ~5 s. */
static void until_done(vmmrt_runtime *rt, vmmrt_event *e)
{
	int done = 0;
	for (int i = 0; i < 5000; i++) {
		assert_int_equal(vmmrt_event_query(rt, e, &done), VMMRT_OK);
		if (done)
			return;
		test_sleep_ms(1);
	}
	fail_msg("the event did not complete in 5 s: a stream waits for a map that never ends");
}

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

/* Fault hook: delay every cuMemCreate, fail one op, count the wait-values. */
typedef struct hook {
	const char *fail;
	int32_t fails;
	uint64_t create_delay_us;
	int32_t waits;
} hook;

static vmmrt_status hook_fn(void *ctx, const char *op, uint64_t *delay_us)
{
	hook *h = ctx;
	if (!strcmp(op, "cuMemCreate"))
		*delay_us = h->create_delay_us;
	if (!strcmp(op, "cuStreamWaitValue32"))
		uatomic_inc(&h->waits);
	if (h->fail && !strcmp(op, h->fail) && uatomic_add_return(&h->fails, -1) >= 0)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

/*
 * 1. The map waits for its event: while the stream the event is on is busy
 *    the slot stays unmapped (and PENDING), the launch thread having waited
 *    for nothing; then the worker maps it. It follows the event as it was
 *    at the call: recorded again behind more work, the map does not wait
 *    for that; destroyed at once, the map still waits for the work before.
 *    vmmrt_slot_wait still waits on the host for such a map.
 */
static void map_after_follows_its_event(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream a;
	vmmrt_event *e, *busy_done, *gone;
	const size_t n = 4 * MiB;
	vmmrt_offload_stats o = {.size = sizeof(o)};
	assert_int_equal(vmmrt_stream_create(rt, &a), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &busy_done), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_busy(rt, a, 300 * MS), VMMRT_OK);
	/* busy_done before e: while it has not completed, e has not either
	 * (stream order), so the map cannot have run; recorded after e, a
	 * slow machine (the sanitizer build) saw the map made between e and
	 * busy_done completing, and read MAPPED with busy_done not done. */
	assert_int_equal(vmmrt_event_record(rt, busy_done, a), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	uint64_t blocking = o.launch_thread_blocking;
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK); /* a map queued: nothing more */
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	assert_int_equal(o.launch_thread_blocking, blocking); /* returned at once */
	assert_int_equal(vmmrt_kernel_busy(rt, a, 300 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK); /* again, 300 ms later */

	int done = 0, checks = 0;
	while (vmmrt_event_query(rt, busy_done, &done) == VMMRT_OK && !done) {
		vmmrt_slot_state now = vmmrt_slot_get_state(s);
		size_t mapped = used(rt);
		assert_int_equal(vmmrt_event_query(rt, busy_done, &done), VMMRT_OK);
		if (done)
			break; /* the map may have run between the reads */
		assert_int_equal(now, VMMRT_SLOT_PENDING);
		assert_int_equal(mapped, 0);
		checks++;
		test_sleep_ms(10);
	}
	assert_true(checks > 0);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_event_query(rt, e, &done), VMMRT_OK);
	assert_false(done); /* mapped before the record made after the call completed */
	assert_int_equal(used(rt), n);
	assert_int_equal(vmmrt_stream_synchronize(rt, a), VMMRT_OK);
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 1);

	/* Released, then mapped after a busy stream again: the host wait holds
	 * until the event has completed and the map is made. What the test
	 * can know then is that the work before the event has completed:
	 * busy_done is recorded before `gone` (one recorded after it may still
	 * be ahead of the stream when the map, which follows `gone` alone, has
	 * been made). */
	assert_int_equal(vmmrt_slot_release_after(s, a), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_kernel_busy(rt, a, 100 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &gone), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, busy_done, a), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, gone, a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, gone), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, gone), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_event_query(rt, busy_done, &done), VMMRT_OK);
	assert_true(done);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), n);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, busy_done), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, a), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 2. The stream's later work runs only after the map: b waits for a map
 *    that follows a's busy work, then fills and checksums the slot (a fill
 *    over the unmapped slot would fault). The launch thread never waits;
 *    once b has passed its wait the memory is there. A slot mapped already
 *    costs the stream no wait at all.
 */
static void wait_stream_holds_the_work_after_it(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s, *res;
	vmmrt_stream a, b;
	vmmrt_event *e, *passed;
	const size_t n = 4 * MiB;
	hook h = {0};
	uint64_t sum = 0;
	assert_int_equal(vmmrt_stream_create(rt, &a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &b), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &passed), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);

	assert_int_equal(vmmrt_kernel_busy(rt, a, 300 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(uatomic_read(&h.waits), 1);
	assert_int_equal(vmmrt_event_record(rt, passed, b), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, b, vmmrt_slot_address(s), n, 21), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_checksum(rt, b, vmmrt_slot_address(s), n, vmmrt_slot_address(res)), VMMRT_OK);
	/* b is past its wait only once the memory is mapped. */
	int done = 0, checks = 0;
	for (;;) {
		assert_int_equal(vmmrt_event_query(rt, passed, &done), VMMRT_OK);
		if (done)
			break;
		checks++;
		test_sleep_ms(10);
	}
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), n + vmmrt_slot_size(res));
	assert_true(checks > 0); /* and it did wait (for a's 300 ms) */
	assert_int_equal(vmmrt_event_query(rt, e, &done), VMMRT_OK);
	assert_true(done);
	assert_int_equal(vmmrt_stream_synchronize(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, &sum, vmmrt_slot_address(res), 8), VMMRT_OK);
	assert_int_equal(sum, fill_checksum(n, 21));

	/* Mapped already: no wait-value is enqueued. */
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(uatomic_read(&h.waits), 1);
	/* Nor after a synchronous map, nor twice for the map that ended. */
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(uatomic_read(&h.waits), 1);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, passed), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 3. A map_after before a pending release ran cancels it, bytes intact,
 *    whether its own event completes before or after the release's point;
 *    one asked after the release ran maps new memory, after its event.
 */
static void map_after_cancels_a_pending_release(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s, *res;
	vmmrt_stream st, b;
	vmmrt_event *now;
	const size_t n = 4 * MiB;
	uint64_t sum = 0;
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &b), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &now), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, st, vmmrt_slot_address(s), n, 31), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK); /* written: b reads it unordered */
	assert_int_equal(vmmrt_kernel_busy(rt, st, 200 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	/* Its event (on b, idle) completes long before the release's point. */
	assert_int_equal(vmmrt_event_record(rt, now, b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, now), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_checksum(rt, b, vmmrt_slot_address(s), n, vmmrt_slot_address(res)), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, b), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), n + vmmrt_slot_size(res));
	assert_int_equal(vmmrt_copy_to_host(rt, &sum, vmmrt_slot_address(res), 8), VMMRT_OK);
	assert_int_equal(sum, fill_checksum(n, 31));
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 2); /* res and s's first: the release was cancelled */

	/* Released for real, then mapped after st's later work: new memory. */
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), vmmrt_slot_size(res));
	assert_int_equal(vmmrt_kernel_busy(rt, st, 100 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, now, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, now), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, b, vmmrt_slot_address(s), n, 32), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_checksum(rt, b, vmmrt_slot_address(s), n, vmmrt_slot_address(res)), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, &sum, vmmrt_slot_address(res), 8), VMMRT_OK);
	assert_int_equal(sum, fill_checksum(n, 32));
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_int_equal(create.count, 3);
	assert_int_equal(vmmrt_event_destroy(rt, now), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 4. A map that fails does not leave the stream waiting: the work after the
 *    wait runs (without the memory: here it does not touch the slot), the
 *    failure is the slot's error, reported once, and the next map_after
 *    maps. A failed map seen ended before wait_stream is reported by it,
 *    and nothing is enqueued.
 */
static void a_failed_map_lets_the_stream_go(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream a, b;
	vmmrt_event *e, *passed;
	const size_t n = 2 * MiB;
	hook h = {.fail = "cuMemCreate", .fails = 1}; /* a driver error: not retried */
	assert_int_equal(vmmrt_stream_create(rt, &a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &b), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &passed), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);

	assert_int_equal(vmmrt_kernel_busy(rt, a, 100 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(uatomic_read(&h.waits), 1);
	assert_int_equal(vmmrt_event_record(rt, passed, b), VMMRT_OK);
	until_done(rt, passed);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_FAILED);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemCreate"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK); /* reported once */
	assert_int_equal(used(rt), 0);

	/* Failed and ended before the wait is asked: the wait reports it. */
	h = (hook){.fail = "cuMemCreate", .fails = 1};
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_FAILED);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "earlier asynchronous request failed"));
	assert_int_equal(uatomic_read(&h.waits), 0);
	/* The wait refuses until a map is asked again, then holds for it. */
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, b, vmmrt_slot_address(s), n, 41), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, passed), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 6. A slot destroyed while a stream has its wait still ahead (the stream
 *    busy before it): the destroy waits until the stream has passed the
 *    wait before the flag goes, which the stream would otherwise read
 *    after it was freed (a fault on the host backend).
 */
static void destroy_waits_for_a_stream_behind_its_wait(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream a, b;
	vmmrt_event *e, *reached;
	int done = 0;
	assert_int_equal(vmmrt_stream_create(rt, &a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &b), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &reached), VMMRT_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
		assert_int_equal(vmmrt_kernel_busy(rt, a, 30 * MS), VMMRT_OK); /* the map is not made at once */
		assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
		assert_int_equal(vmmrt_kernel_busy(rt, b, 200 * MS), VMMRT_OK);
		/* b's work before its wait: done exactly when b has reached the
		 * wait (an event after the wait would lag the library's own one,
		 * recorded first, behind the same wait: a race, not a check) */
		assert_int_equal(vmmrt_event_record(rt, reached, b), VMMRT_OK);
		assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
		assert_int_equal(vmmrt_slot_wait_stream(s, b), VMMRT_OK);
		assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK); /* mapped; b is still busy before its wait */
		assert_int_equal(vmmrt_event_query(rt, reached, &done), VMMRT_OK);
		assert_false(done);
		assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
		assert_int_equal(vmmrt_event_query(rt, reached, &done), VMMRT_OK);
		assert_true(done); /* b got to its wait before the flag went */
	}
	assert_int_equal(vmmrt_stream_synchronize(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, reached), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

typedef struct hf_ctx {
	vmmrt_slot *slot;
	vmmrt_stream stream;
	vmmrt_event *event;
	vmmrt_status after_st, wait_st;
} hf_ctx;

static void inside_host_function(void *arg)
{
	hf_ctx *c = arg;
	c->after_st = vmmrt_slot_map_after(c->slot, c->event);
	c->wait_st = vmmrt_slot_wait_stream(c->slot, c->stream);
}

/* 5. Every refusal named, and the slot unchanged by it. */
static void errors_are_named(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s, *own;
	vmmrt_stream st, cap;
	vmmrt_event *e;
	vmmrt_graph *g;
	char name[32];
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &cap), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	snprintf(name, sizeof(name), "slot %llu", (unsigned long long)s->id);

	assert_int_equal(vmmrt_slot_map_after(NULL, e), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "slot is NULL"));
	assert_int_equal(vmmrt_slot_map_after(s, NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "event is NULL"));
	assert_int_equal(vmmrt_slot_wait_stream(NULL, st), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "slot is NULL"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);

	/* Never mapped: nothing for the stream to wait for. */
	assert_int_equal(vmmrt_slot_wait_stream(s, st), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), name));

	/* The library's own slot. */
	assert_int_equal(vmmrt__slot_reserve(rt, 2 * MiB, &own), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(own, e), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "vmmrt_slot_create"));
	assert_int_equal(vmmrt_slot_wait_stream(own, st), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_get_state(own), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt__slot_destroy(own), VMMRT_OK);

	/* Following the event refused by the driver: named, nothing queued,
	 * and the next map_after maps. */
	hook h = {.fail = "cuStreamWaitEvent", .fails = 1};
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "following the event"));
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_wait_stream(s, st), VMMRT_E_INVALID_STATE);

	/* A capturing stream: refused, nothing enqueued (the capture ends clean). */
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_graph_begin_capture(rt, cap), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, cap), VMMRT_E_CAPTURE);
	assert_non_null(strstr(vmmrt_last_error(), name));
	assert_int_equal(vmmrt_graph_end_capture(rt, cap, &g), VMMRT_OK);
	assert_int_equal(vmmrt_graph_destroy(rt, g), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_MAPPED);

	/* From a host function: refused, nothing changed. */
	hf_ctx c = {.slot = s, .stream = st, .event = e};
	assert_int_equal(vmmrt__drv_launch_host_func(rt, st, inside_host_function, &c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(c.after_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.wait_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);

	/* Released since its last map: the wait refuses. */
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(s, st), VMMRT_E_INVALID_STATE);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);

	/* Destroyed with a map waiting for its event: cancelled, nothing leaks. */
	assert_int_equal(vmmrt_kernel_busy(rt, st, 200 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_PENDING);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(used(rt), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, cap), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 7. A release follows the map asked before it, whatever streams their
 *    events are on: the map follows an event on a busy stream, the release
 *    an idle one, whose event completes first. The release still runs
 *    after the map and releases it: the slot ends unbacked, its memory
 *    given back, and the next map and release go as usual. A release that
 *    ran first would find nothing mapped and do nothing, and the map would
 *    land behind it: the slot mapped, with no release to come, and the
 *    next release_after refused.
 */
static void release_after_follows_the_map_asked_before(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream busy, idle;
	vmmrt_event *e;
	const size_t n = 2 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &busy), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &idle), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	for (int round = 0; round < 2; round++) {
		assert_int_equal(vmmrt_kernel_busy(rt, busy, 200 * MS), VMMRT_OK);
		assert_int_equal(vmmrt_event_record(rt, e, busy), VMMRT_OK);
		assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
		assert_int_equal(vmmrt_slot_release_after(s, idle), VMMRT_OK);
		assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_PENDING);
		assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
		assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
		assert_int_equal(used(rt), 0);
		assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	}
	/* And mapped again, then released after the idle stream: as usual. */
	assert_int_equal(vmmrt_slot_map_async(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(used(rt), n);
	assert_int_equal(vmmrt_slot_release_after(s, idle), VMMRT_OK);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_stream_synchronize(rt, busy), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, busy), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, idle), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 8. After a synchronous vmmrt_slot_unmap the slot has nothing a stream
 *    could wait for or a release could release: both refused with
 *    INVALID_STATE and named, nothing enqueued, the slot unchanged.
 */
static void refused_after_a_synchronous_unmap(void **state)
{
	vmmrt_runtime *rt = test_slot_runtime();
	vmmrt_slot *s;
	vmmrt_stream st;
	vmmrt_event *e;
	char name[32];
	hook h = {0};
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	snprintf(name, sizeof(name), "slot %llu", (unsigned long long)s->id);
	/* Mapped stream-ordered first, so that the stream waits have a flag. */
	assert_int_equal(vmmrt_event_record(rt, e, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(s, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, hook_fn, &h);
	assert_int_equal(vmmrt_slot_wait_stream(s, st), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), name));
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), name));
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(uatomic_read(&h.waits), 0);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/*
 * 9. A slot destroyed while a stream waits for another slot's map, which
 *    the same worker is yet to make (its event is on a busy stream): the
 *    destroy must not free its flag on that worker. Freeing pinned memory
 *    synchronizes the whole device (cuMemFreeHost; the host backend's free
 *    does as the GPU's), so the worker would wait for the stream, and the
 *    stream for the worker, for ever: the destroy timed out, and everything
 *    after it hung (the timeout wrapper fails the test then). Freed on the
 *    destroy's caller, it waits only until the map is made.
 */
static void destroy_frees_the_flag_off_the_worker(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"host_capacity", "64M", "driver_workers", "1",
							       "timeout_ms", "2000", NULL});
	vmmrt_slot *x, *y;
	vmmrt_stream a, b;
	vmmrt_event *e, *passed;
	int done = 0;
	assert_int_equal(vmmrt_stream_create(rt, &a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &b), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &passed), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &x), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &y), VMMRT_OK);
	assert_int_equal(x->worker, y->worker);
	assert_int_equal(vmmrt_slot_map_async(x), VMMRT_OK); /* x has a flag */
	assert_int_equal(vmmrt_slot_wait(x), VMMRT_OK);

	assert_int_equal(vmmrt_kernel_busy(rt, a, 300 * MS), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(y, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(y, b), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, passed, b), VMMRT_OK);
	assert_int_equal(vmmrt_event_query(rt, passed, &done), VMMRT_OK);
	assert_false(done); /* b waits for y's map, 300 ms away */
	assert_int_equal(vmmrt_slot_destroy(x), VMMRT_OK);
	assert_int_equal(vmmrt_event_query(rt, passed, &done), VMMRT_OK);
	if (test_on_host())
		assert_true(done); /* the free waited for the device, as cuMemFreeHost does */
	assert_int_equal(vmmrt_slot_get_state(y), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_destroy(y), VMMRT_OK);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_event_destroy(rt, passed), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, a), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, b), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(map_after_follows_its_event),
		cmocka_unit_test(wait_stream_holds_the_work_after_it),
		cmocka_unit_test(map_after_cancels_a_pending_release),
		cmocka_unit_test(a_failed_map_lets_the_stream_go),
		cmocka_unit_test(errors_are_named),
		cmocka_unit_test(destroy_waits_for_a_stream_behind_its_wait),
		cmocka_unit_test(release_after_follows_the_map_asked_before),
		cmocka_unit_test(refused_after_a_synchronous_unmap),
		cmocka_unit_test(destroy_frees_the_flag_off_the_worker),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

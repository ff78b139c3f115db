/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Physical pages mapped at several fixed addresses (vmmrt_pages,
 * vmmrt_slot_map_pages): slots bound to the same bytes see each other's
 * writes, offsets pick the bytes, every refusal is named, an unbound slot
 * maps memory of its own again, the memory outlives the pages' destroy
 * until the last slot lets it go, the driver calls are counted, and
 * nothing leaks whatever the order of the destroys. vmmrt_slot_map_pages_table
 * the same, granule by granule: a table's repeats alias, its refusals are
 * named and change nothing, a table bind is unbound and bound again, rolled
 * back, or cancelled, and its copy of the table never leaks.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <urcu/uatomic.h>

#include "pages.h"
#include "runtime.h"
#include "slot.h"
#include "test-common.h"
#include "testing.h"

#define MiB (1024ull * 1024)

/* checked_threads: every VMM call the pages make must be a worker's. */
static vmmrt_runtime *make_rt(void)
{
	return test_runtime((const char *const[]){"host_capacity", "64M", "checked_threads", "1", "oom_retries", "1",
						  "oom_backoff_us", "10", NULL});
}

/* A pinned buffer of n bytes: word i is seed * 1000003 + i. */
static uint64_t *pattern(vmmrt_runtime *rt, size_t n, uint64_t seed)
{
	uint64_t *h;
	assert_int_equal(vmmrt_host_alloc(rt, n, (void **)&h), VMMRT_OK);
	for (size_t i = 0; i < n / 8; i++)
		h[i] = seed * 1000003u + i;
	return h;
}

static void put(vmmrt_runtime *rt, vmmrt_devptr va, size_t n, uint64_t seed)
{
	uint64_t *h = pattern(rt, n, seed);
	assert_int_equal(vmmrt_copy_to_device(rt, va, h, n), VMMRT_OK);
	assert_int_equal(vmmrt_host_free(rt, h), VMMRT_OK);
}

/* Whether [va, va + n) holds put's pattern of seed. */
static bool holds(vmmrt_runtime *rt, vmmrt_devptr va, size_t n, uint64_t seed)
{
	uint64_t *want = pattern(rt, n, seed), *got;
	assert_int_equal(vmmrt_host_alloc(rt, n, (void **)&got), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, got, va, n), VMMRT_OK);
	bool same = memcmp(want, got, n) == 0;
	assert_int_equal(vmmrt_host_free(rt, want), VMMRT_OK);
	assert_int_equal(vmmrt_host_free(rt, got), VMMRT_OK);
	return same;
}

static uint64_t calls(vmmrt_runtime *rt, unsigned c)
{
	vmmrt_driver_stats s = {.size = sizeof(s)};
	assert_int_equal(vmmrt_driver_stats_get(rt, c, &s), VMMRT_OK);
	return s.count;
}
enum { CREATE, MAP, SET_ACCESS, UNMAP, RELEASE };

static void two_slots_see_each_others_writes(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *a, *b;
	const size_t n = 4 * MiB;
	assert_int_equal(vmmrt_pages_create(rt, 3 * MiB, &p), VMMRT_OK);
	assert_int_equal(vmmrt_pages_size(p), n); /* rounded to the 2 MiB granularity */
	assert_int_equal(vmmrt_slot_create(rt, n, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(a), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_get_state(b), VMMRT_SLOT_MAPPED);
	assert_int_not_equal(vmmrt_slot_address(a), vmmrt_slot_address(b));
	if (test_on_host())
		assert_int_equal(used(rt), n); /* one memory behind both addresses */
	vmmrt_offload_stats o = {.size = sizeof(o)};
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	assert_int_equal(o.slot_bytes, n); /* the pages' bytes, once */
	put(rt, vmmrt_slot_address(a), n, 1);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 1));
	put(rt, vmmrt_slot_address(b), n, 2);
	assert_true(holds(rt, vmmrt_slot_address(a), n, 2));
	assert_int_equal(vmmrt_slot_destroy(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(b), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_pages), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	if (test_on_host())
		assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	assert_int_equal(o.slot_bytes, 0);
	assert_int_equal(o.slot_peak_bytes, n);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A slot at offset k sees the pages' bytes from k on: those written at k
 * through a slot over the whole pages. */
static void offsets_pick_the_bytes(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *whole, *hi, *lo;
	assert_int_equal(vmmrt_pages_create(rt, 6 * MiB, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 6 * MiB, &whole), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &hi), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &lo), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(whole, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(hi, p, 4 * MiB), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(lo, p, 0), VMMRT_OK);
	vmmrt_devptr w = vmmrt_slot_address(whole);
	put(rt, w, 2 * MiB, 10);
	put(rt, w + 2 * MiB, 2 * MiB, 11);
	put(rt, w + 4 * MiB, 2 * MiB, 12);
	assert_true(holds(rt, vmmrt_slot_address(hi), 2 * MiB, 12));
	assert_true(holds(rt, vmmrt_slot_address(lo), 2 * MiB, 10));
	put(rt, vmmrt_slot_address(hi), 2 * MiB, 13);
	assert_true(holds(rt, w + 4 * MiB, 2 * MiB, 13));
	assert_true(holds(rt, w + 2 * MiB, 2 * MiB, 11)); /* the bytes below the offset untouched */
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK); /* destroys the slots, then the pages */
}

/* A stream that waits until *gate is 1: work queued behind it waits too. */
typedef struct gate {
	uint32_t *word;
	vmmrt_devptr dev;
} gate;

static gate gate_close(vmmrt_runtime *rt, vmmrt_stream s)
{
	gate g;
	assert_int_equal(vmmrt_host_alloc(rt, 64, (void **)&g.word), VMMRT_OK);
	uatomic_set(g.word, 0);
	assert_int_equal(vmmrt__drv_host_devptr(rt, g.word, &g.dev), VMMRT_OK);
	assert_int_equal(vmmrt__drv_stream_wait_value32(rt, s, g.dev, 1), VMMRT_OK);
	return g;
}

static void gate_open(vmmrt_runtime *rt, vmmrt_stream s, gate g)
{
	uatomic_set(g.word, 1);
	assert_int_equal(vmmrt_stream_synchronize(rt, s), VMMRT_OK);
	assert_int_equal(vmmrt_host_free(rt, g.word), VMMRT_OK);
}

static void every_refusal_is_named(void **state)
{
	vmmrt_runtime *rt = make_rt(), *other = make_rt();
	vmmrt_pages *p, *q;
	vmmrt_slot *s, *big, *lib;
	vmmrt_stream st;
	/* creation */
	assert_int_equal(vmmrt_pages_create(NULL, MiB, &p), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_pages_create(rt, MiB, NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_pages_create(rt, 0, &p), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_pages_create(rt, SIZE_MAX, &p), VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "overflow"));
	if (test_on_host()) {
		assert_int_equal(vmmrt_pages_create(rt, 128 * MiB, &p), VMMRT_E_OUT_OF_MEMORY);
		assert_int_equal(uatomic_read(&rt->live_pages), 0);
		assert_int_equal(uatomic_read(&rt->live_handles), 0);
	}
	assert_int_equal(vmmrt_pages_destroy(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_pages_size(NULL), 0);

	assert_int_equal(vmmrt_pages_create(rt, 4 * MiB, &p), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(other, 4 * MiB, &q), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 6 * MiB, &big), VMMRT_OK);
	/* arguments */
	assert_int_equal(vmmrt_slot_map_pages(NULL, p, 0), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_map_pages(s, NULL, 0), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_map_pages(s, q, 0), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "different runtimes"));
	assert_int_equal(vmmrt_slot_map_pages(s, p, MiB), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "granularity"));
	assert_int_equal(vmmrt_slot_map_pages(s, p, 4 * MiB), VMMRT_E_INVALID_SIZE); /* starts at the end */
	assert_non_null(strstr(vmmrt_last_error(), "past the end"));
	assert_int_equal(vmmrt_slot_map_pages(s, p, 6 * MiB), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_map_pages(s, p, SIZE_MAX - 2 * MiB + 1), VMMRT_E_INVALID_SIZE); /* aligned, huge */
	assert_int_equal(vmmrt_slot_map_pages(big, p, 0), VMMRT_E_INVALID_SIZE); /* longer than the pages */
	/* a slot of the library's own (an offload group's) */
	assert_int_equal(vmmrt__slot_reserve(rt, 2 * MiB, &lib), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(lib, p, 0), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "belongs to the library"));
	assert_int_equal(vmmrt__slot_destroy(lib), VMMRT_OK);
	/* none of the refusals mapped anything */
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(calls(rt, MAP), 0);

	/* states: mapped with its own memory, already bound */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "already mapped"));
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 2 * MiB), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	/* a release still waiting for its stream */
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	gate g = gate_close(rt, st);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "queued"));
	gate_open(rt, st, g);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);

	assert_int_equal(vmmrt_pages_destroy(q), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(other), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* Unbound, a slot maps memory of its own again (a tensor that outlived its
 * planned life): the pages keep theirs, and the two are different bytes. */
static void unbind_then_own_memory(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *a, *b;
	vmmrt_stream st;
	const size_t n = 2 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(rt, n, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	put(rt, vmmrt_slot_address(b), n, 5);
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_unmap(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(a), VMMRT_SLOT_RESERVED);
	assert_int_equal(calls(rt, UNMAP), 1);
	assert_int_equal(calls(rt, RELEASE), 0); /* the memory is the pages' */
	if (test_on_host())
		assert_int_equal(used(rt), n);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 5));
	/* its own memory, synchronously */
	assert_int_equal(vmmrt_slot_map(a), VMMRT_OK);
	assert_int_equal(calls(rt, CREATE), 1);
	if (test_on_host())
		assert_int_equal(used(rt), 2 * n);
	put(rt, vmmrt_slot_address(a), n, 6);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 5));
	/* and stream-ordered: released to the driver, mapped again */
	assert_int_equal(vmmrt_slot_release_after(a, st), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(test_settled_state(a), VMMRT_SLOT_RESERVED);
	assert_int_equal(calls(rt, RELEASE), 1);
	assert_int_equal(vmmrt_slot_map_async(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(a), VMMRT_SLOT_MAPPED);
	assert_int_equal(calls(rt, CREATE), 2);
	assert_int_equal(vmmrt_slot_unmap(a), VMMRT_OK);
	assert_int_equal(calls(rt, RELEASE), 2);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 5));
	/* bound again */
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_true(holds(rt, vmmrt_slot_address(a), n, 5));
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(b), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The stream-ordered calls on a bound slot: map_async and map_after queue
 * nothing (it is mapped), wait_stream enqueues nothing, release_after is
 * refused; the slot stays bound. */
static void stream_calls_on_a_bound_slot(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *a, *b;
	vmmrt_stream st;
	vmmrt_event *e;
	const size_t n = 2 * MiB;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_event_create(rt, 0, &e), VMMRT_OK);
	assert_int_equal(vmmrt_event_record(rt, e, st), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(rt, n, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_map_async(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_after(a, e), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_wait_stream(a, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(a), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_release_after(a, st), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "vmmrt_slot_unmap unbinds it"));
	assert_int_equal(vmmrt_slot_map(a), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	for (unsigned c = CREATE; c <= RELEASE; c++)
		assert_int_equal(calls(rt, c), 0);
	put(rt, vmmrt_slot_address(a), n, 7);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 7));
	assert_int_equal(vmmrt_event_destroy(rt, e), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* Pages destroyed while slots are bound: the handle is released at once
 * (live_handles), the memory stays, readable, until the last unbind. */
static void memory_stays_until_the_last_unbind(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *a, *b;
	const size_t n = 4 * MiB;
	assert_int_equal(vmmrt_pages_create(rt, n, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	put(rt, vmmrt_slot_address(a), n, 8);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_pages), 0);
	assert_int_equal(used(rt), n);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 8));
	assert_int_equal(vmmrt_slot_unmap(a), VMMRT_OK);
	assert_int_equal(used(rt), n);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 8));
	assert_int_equal(vmmrt_slot_destroy(b), VMMRT_OK); /* the last one: the memory goes */
	assert_int_equal(used(rt), 0);
	/* a, unbound, still maps memory of its own */
	assert_int_equal(vmmrt_slot_map(a), VMMRT_OK);
	assert_int_equal(used(rt), n);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A slot destroyed while bound: the pages and the other slots go on. */
static void slot_destroyed_while_bound(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *a, *b;
	const size_t n = 2 * MiB;
	assert_int_equal(vmmrt_pages_create(rt, n, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	put(rt, vmmrt_slot_address(a), n, 9);
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_destroy(a), VMMRT_OK);
	assert_int_equal(calls(rt, UNMAP), 1);
	assert_int_equal(calls(rt, RELEASE), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 1);
	if (test_on_host())
		assert_int_equal(used(rt), n);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 9));
	assert_int_equal(vmmrt_slot_unmap(b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	assert_true(holds(rt, vmmrt_slot_address(b), n, 9));
	assert_int_equal(vmmrt_slot_destroy(b), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(calls(rt, RELEASE), 1);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	if (test_on_host())
		assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* Exactly the calls a plan pays once: create per pages, map and set access
 * per bind, unmap per unbind, release per pages. */
static void driver_calls_are_counted(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *s[3];
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_pages_create(rt, 4 * MiB, &p), VMMRT_OK);
	/* a handle per granule: cuMemMap maps whole handles only */
	assert_int_equal(calls(rt, CREATE), 2);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s[i]), VMMRT_OK);
		assert_int_equal(vmmrt_slot_map_pages(s[i], p, (size_t)(i % 2) * 2 * MiB), VMMRT_OK);
	}
	assert_int_equal(calls(rt, MAP), 3);
	assert_int_equal(calls(rt, SET_ACCESS), 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(vmmrt_slot_unmap(s[i]), VMMRT_OK);
	assert_int_equal(calls(rt, UNMAP), 3);
	assert_int_equal(calls(rt, RELEASE), 0);
	/* a slot over two granules maps (and unmaps) them one by one */
	vmmrt_slot *wide;
	assert_int_equal(vmmrt_slot_create(rt, 4 * MiB, &wide), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(wide, p, 0), VMMRT_OK);
	assert_int_equal(calls(rt, MAP), 5);
	assert_int_equal(calls(rt, SET_ACCESS), 5);
	assert_int_equal(vmmrt_slot_unmap(wide), VMMRT_OK);
	assert_int_equal(calls(rt, UNMAP), 5);
	assert_int_equal(vmmrt_slot_destroy(wide), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(calls(rt, CREATE), 2);
	assert_int_equal(calls(rt, RELEASE), 2);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The runtime's destroy with pages and bound slots left: destroyed, no leak
 * reported (it returns VMMRT_E_BUSY when a handle or slot is left). */
static void runtime_destroy_takes_what_is_left(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p, *unused;
	vmmrt_slot *a, *b;
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &p), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &unused), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(a, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(b, p, 0), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_pages), 2);
	assert_int_equal(uatomic_read(&rt->live_handles), 2);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A bind whose set-access fails is rolled back: the slot is not bound, and
 * its unmap later releases its own memory, not the pages'. */
typedef struct fault_plan {
	const char *op;
	int fail_at, seen;
} fault_plan;

static vmmrt_status fault_hook(void *ctx, const char *op, uint64_t *delay_us)
{
	fault_plan *f = ctx;
	(void)delay_us;
	if (f->op && !strcmp(op, f->op) && ++f->seen == f->fail_at)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

static void failed_bind_is_rolled_back(void **state)
{
	vmmrt_runtime *rt = make_rt();
	fault_plan f = {.op = "cuMemSetAccess", .fail_at = 1};
	vmmrt_pages *p;
	vmmrt_slot *s;
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, fault_hook, &f);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemSetAccess"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK); /* reported once, by the call */
	/* not bound: its own memory, released at its unmap */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 2);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 1);
	/* a release that fails keeps the pages, which a second destroy releases */
	f = (fault_plan){.op = "cuMemRelease", .fail_at = 1};
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_E_DRIVER);
	assert_int_equal(uatomic_read(&rt->live_pages), 1);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_OK); /* still usable */
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A driver call that outlasts the runtime's timeout: the waits give up
 * (the worker sleeps ten times the timeout inside the call, so the wait
 * always ends first), and what the workers finish later is the runtime's
 * destroy's to release and free: nothing leaks. */
typedef struct stall_plan {
	const char *op;
	uint64_t us;
} stall_plan;

static vmmrt_status stall_hook(void *ctx, const char *op, uint64_t *delay_us)
{
	stall_plan *sp = ctx;
	if (sp->op && !strcmp(op, sp->op)) {
		*delay_us = sp->us;
		sp->op = NULL; /* once */
	}
	return VMMRT_OK;
}

static void timed_out_pages_are_the_runtimes_to_finish(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"host_capacity", "64M", "timeout_ms", "40", NULL});
	stall_plan sp = {.op = "cuMemCreate", .us = 400000};
	vmmrt_pages *p = NULL, *q;
	vmmrt__drv_set_fault_hook(rt, stall_hook, &sp);
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &p), VMMRT_E_TIMEOUT);
	assert_null(p);
	assert_int_equal(uatomic_read(&rt->live_pages), 1); /* listed: its release is queued behind */
	vmmrt_pages *left = cds_list_first_entry(&rt->pages, vmmrt_pages, link);
	assert_true(left->abandoned);
	assert_int_equal(vmmrt__request_wait(&left->release_req, 10000), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0); /* what the late create made is released */
	/* a destroy that times out: the pages are not to be used again */
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &q), VMMRT_OK);
	sp = (stall_plan){.op = "cuMemRelease", .us = 400000};
	assert_int_equal(vmmrt_pages_destroy(q), VMMRT_E_TIMEOUT);
	assert_int_equal(vmmrt_pages_destroy(q), VMMRT_E_BUSY);
	assert_non_null(strstr(vmmrt_last_error(), "runtime's destroy finishes it"));
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK); /* no handle, slot or pages left */
}

/* ------------------------------------------------- vmmrt_slot_map_pages_table */

/* A slot of four granules onto pages of three, granule by granule: the
 * table {2, 0, 2, 1} (in granules). Granules 0 and 2 are the same bytes,
 * which a slot bound linearly at the pages' third granule sees too; granule
 * 1 is the pages' first, granule 3 their second. A map and a set access per
 * granule, as the linear bind; the pages' memory counted once. */
static void table_maps_granule_by_granule(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *t, *third, *whole;
	const size_t g = 2 * MiB;
	const size_t table[] = {2 * g, 0, 2 * g, g};
	assert_int_equal(vmmrt_pages_create(rt, 3 * g, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 4 * g, &t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, g, &third), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 3 * g, &whole), VMMRT_OK);
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_map_pages_table(t, p, table, 4), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(t), VMMRT_SLOT_MAPPED);
	assert_int_equal(calls(rt, MAP), 4);
	assert_int_equal(calls(rt, SET_ACCESS), 4);
	assert_int_equal(calls(rt, CREATE), 0);
	assert_int_equal(vmmrt_slot_map_pages(third, p, 2 * g), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(whole, p, 0), VMMRT_OK);
	if (test_on_host())
		assert_int_equal(used(rt), 3 * g); /* the pages alone behind all three */
	vmmrt_offload_stats o = {.size = sizeof(o)};
	assert_int_equal(vmmrt_offload_stats_get(rt, &o), VMMRT_OK);
	assert_int_equal(o.slot_bytes, 3 * g);
	vmmrt_devptr a = vmmrt_slot_address(t), w = vmmrt_slot_address(whole);
	put(rt, w, g, 30);         /* the pages' granule 0 */
	put(rt, w + g, g, 31);     /* granule 1 */
	put(rt, a, g, 32);         /* the slot's granule 0: the pages' granule 2 */
	assert_true(holds(rt, a + 2 * g, g, 32));
	assert_true(holds(rt, vmmrt_slot_address(third), g, 32));
	assert_true(holds(rt, w + 2 * g, g, 32));
	assert_true(holds(rt, a + g, g, 30));
	assert_true(holds(rt, a + 3 * g, g, 31));
	/* and back: through granule 2, seen at granule 0 */
	put(rt, a + 2 * g, g, 33);
	assert_true(holds(rt, a, g, 33));
	/* one copy across the granules' seams, as a tensor of the pool would span them */
	put(rt, a + g, 2 * g, 34);
	assert_true(holds(rt, w, g, 34));
	{
		/* the second half of seed 34's pattern went to the pages' granule 2 */
		uint64_t *want = pattern(rt, 2 * g, 34);
		uint64_t *got;
		assert_int_equal(vmmrt_host_alloc(rt, g, (void **)&got), VMMRT_OK);
		assert_int_equal(vmmrt_copy_to_host(rt, got, vmmrt_slot_address(third), g), VMMRT_OK);
		assert_memory_equal(got, want + g / 8, g);
		assert_int_equal(vmmrt_host_free(rt, want), VMMRT_OK);
		assert_int_equal(vmmrt_host_free(rt, got), VMMRT_OK);
	}
	assert_int_equal(vmmrt_slot_destroy(whole), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(third), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(t), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	if (test_on_host())
		assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* What the table bind refuses, from a host function too. */
typedef struct hf_bind {
	vmmrt_slot *s;
	vmmrt_pages *p;
	const size_t *table;
	vmmrt_status st;
} hf_bind;

static void bind_inside_host_function(void *arg)
{
	hf_bind *b = arg;
	b->st = vmmrt_slot_map_pages_table(b->s, b->p, b->table, 2);
}

/* Every refusal with its code and a message that says why; none maps
 * anything or changes the slot, which binds afterwards as asked. */
static void table_refusals_are_named(void **state)
{
	vmmrt_runtime *rt = make_rt(), *other = make_rt();
	vmmrt_pages *p, *q;
	vmmrt_slot *s, *lib;
	vmmrt_stream st;
	const size_t g = 2 * MiB;
	const size_t ok[] = {g, 0};
	assert_int_equal(vmmrt_pages_create(rt, 2 * g, &p), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(other, 2 * g, &q), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * g, &s), VMMRT_OK);
	vmmrt_driver_stats_reset(rt);
	/* arguments */
	assert_int_equal(vmmrt_slot_map_pages_table(NULL, p, ok, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_map_pages_table(s, NULL, ok, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, NULL, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "offsets is NULL"));
	assert_int_equal(vmmrt_slot_map_pages_table(s, q, ok, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "different runtimes"));
	assert_int_equal(vmmrt__slot_reserve(rt, 2 * g, &lib), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(lib, p, ok, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "belongs to the library"));
	assert_int_equal(vmmrt__slot_destroy(lib), VMMRT_OK);
	/* the count: one offset per granule */
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 1), VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "one per granule"));
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0, 0, 0}, 3), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 0), VMMRT_E_INVALID_SIZE);
	/* each offset: a multiple of the granularity, its granule inside the pages */
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0, MiB}, 2), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "offsets[1] = 1048576"));
	assert_non_null(strstr(vmmrt_last_error(), "granularity"));
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){2 * g, 0}, 2), VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "offsets[0]"));
	assert_non_null(strstr(vmmrt_last_error(), "past the end"));
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0, 7 * g}, 2), VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "offsets[1]"));
	/* aligned and huge: offset + g would wrap to a small number */
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0, SIZE_MAX - g + 1}, 2),
			 VMMRT_E_INVALID_SIZE);
	assert_non_null(strstr(vmmrt_last_error(), "offsets[1]"));
	/* from a host function: refused as every call that may reach the driver */
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	hf_bind hb = {.s = s, .p = p, .table = ok, .st = VMMRT_OK};
	assert_int_equal(vmmrt__drv_launch_host_func(rt, st, bind_inside_host_function, &hb), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(hb.st, VMMRT_E_NOT_PERMITTED);
	/* none of the refusals mapped anything */
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	assert_int_equal(calls(rt, MAP), 0);

	/* states: mapped with its own memory, already bound (linearly or by a table) */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "already mapped"));
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_map_pages(s, p, 0), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED); /* still bound by the table */
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	/* a release still waiting for its stream */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	gate gt = gate_close(rt, st);
	assert_int_equal(vmmrt_slot_release_after(s, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_E_INVALID_STATE);
	assert_non_null(strstr(vmmrt_last_error(), "queued"));
	gate_open(rt, st, gt);
	assert_int_equal(test_settled_state(s), VMMRT_SLOT_RESERVED);
	/* usable after all of it: the table as asked */
	vmmrt_slot *lin;
	assert_int_equal(vmmrt_slot_create(rt, g, &lin), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(lin, p, g), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, ok, 2), VMMRT_OK);
	put(rt, vmmrt_slot_address(s), g, 40);
	assert_true(holds(rt, vmmrt_slot_address(lin), g, 40));
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);

	assert_int_equal(vmmrt_pages_destroy(q), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(other), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* Unbound, a table-bound slot binds again by another table (and linearly,
 * and maps memory of its own); the caller's table is a copy's to change at
 * once. Destroyed bound, it leaves the pages' memory to them; nothing leaks
 * (the tables are the sanitizer build's and valgrind's to check). */
static void table_rebind_and_destroy(void **state)
{
	vmmrt_runtime *rt = make_rt();
	vmmrt_pages *p;
	vmmrt_slot *s, *w;
	const size_t g = 2 * MiB;
	size_t table[] = {0, 0, g};
	assert_int_equal(vmmrt_pages_create(rt, 2 * g, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 3 * g, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * g, &w), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages(w, p, 0), VMMRT_OK);
	vmmrt_devptr a = vmmrt_slot_address(s), b = vmmrt_slot_address(w);
	put(rt, b, g, 50);
	put(rt, b + g, g, 51);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, table, 3), VMMRT_OK);
	table[0] = table[1] = table[2] = g; /* the library kept a copy */
	assert_true(holds(rt, a, g, 50));
	assert_true(holds(rt, a + g, g, 50));
	assert_true(holds(rt, a + 2 * g, g, 51));
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(calls(rt, UNMAP), 3); /* granule by granule, as mapped */
	assert_int_equal(calls(rt, RELEASE), 0);
	assert_true(holds(rt, b, g, 50)); /* the pages' memory stays theirs */
	/* another table */
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){g, 0, g}, 3), VMMRT_OK);
	assert_true(holds(rt, a, g, 51));
	assert_true(holds(rt, a + g, g, 50));
	assert_true(holds(rt, a + 2 * g, g, 51));
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	/* its own memory, then a table again */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	put(rt, a, g, 52);
	assert_true(holds(rt, b, g, 50));
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, table, 3), VMMRT_OK);
	assert_true(holds(rt, a + g, g, 51));
	/* destroyed while bound by the table: one unmap a granule, nothing released */
	vmmrt_driver_stats_reset(rt);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(calls(rt, UNMAP), 3);
	assert_int_equal(calls(rt, RELEASE), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 2);
	assert_true(holds(rt, b + g, g, 51));
	assert_int_equal(vmmrt_slot_destroy(w), VMMRT_OK);
	assert_int_equal(vmmrt_pages_destroy(p), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(uatomic_read(&rt->live_pages), 0);
	if (test_on_host())
		assert_int_equal(used(rt), 0);
	/* a slot left bound by a table: the runtime's destroy takes it */
	assert_int_equal(vmmrt_pages_create(rt, g, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * g, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0, 0}, 2), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A table bind whose second granule's set access fails: the first is
 * unmapped again, the slot is not bound, the message names the granule. */
static void failed_table_bind_is_rolled_back(void **state)
{
	vmmrt_runtime *rt = make_rt();
	fault_plan f = {.op = "cuMemSetAccess", .fail_at = 2};
	vmmrt_pages *p;
	vmmrt_slot *s;
	const size_t g = 2 * MiB;
	assert_int_equal(vmmrt_pages_create(rt, 2 * g, &p), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 3 * g, &s), VMMRT_OK);
	vmmrt_driver_stats_reset(rt);
	vmmrt__drv_set_fault_hook(rt, fault_hook, &f);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){g, 0, g}, 3), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemSetAccess"));
	assert_non_null(strstr(vmmrt_last_error(), "chunk 2 of 3"));
	assert_non_null(strstr(vmmrt_last_error(), "by its table"));
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(calls(rt, MAP), 2);
	assert_int_equal(calls(rt, UNMAP), 2); /* both granules mapped so far */
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	/* the same call again, now that the driver lets it */
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){g, 0, g}, 3), VMMRT_OK);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 2);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A table bind queued behind a stalled driver call on the one worker: its
 * wait times out, and the slot is destroyed before the bind ran, so the bind
 * is withdrawn (cancelled, never run) and its table goes with the slot
 * (slot.h). A leak would be the sanitizer build's and valgrind's to see. */
static void cancelled_table_bind_frees_its_table(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"host_capacity", "64M", "timeout_ms", "40",
							       "driver_workers", "1", NULL});
	stall_plan sp = {.op = "cuMemCreate", .us = 400000};
	vmmrt_pages *p = NULL;
	vmmrt_slot *s, *x;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &x), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_pages_create(rt, 2 * MiB, &p), VMMRT_OK);
	vmmrt_driver_stats_reset(rt);
	vmmrt__drv_set_fault_hook(rt, stall_hook, &sp);
	/* the worker stalls in x's map for ten times the timeout */
	assert_int_equal(vmmrt_slot_map(x), VMMRT_E_TIMEOUT);
	assert_int_equal(vmmrt_slot_map_pages_table(s, p, (const size_t[]){0}, 1), VMMRT_E_TIMEOUT);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_PENDING);
	vmmrt_status st = vmmrt_slot_destroy(s); /* also queued behind the stall */
	assert_true(st == VMMRT_OK || st == VMMRT_E_TIMEOUT);
	/* x's map, then s's bind (withdrawn) and destroy, then x's unmap */
	assert_int_equal(vmmrt__request_wait(&x->map_req, 10000), VMMRT_OK);
	assert_int_equal(test_settled_state(x), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_unmap(x), VMMRT_OK);
	assert_int_equal(calls(rt, MAP), 1); /* x's alone: the bind never ran */
	assert_int_equal(uatomic_read(&rt->live_slots), 1);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(two_slots_see_each_others_writes),
		cmocka_unit_test(offsets_pick_the_bytes),
		cmocka_unit_test(every_refusal_is_named),
		cmocka_unit_test(unbind_then_own_memory),
		cmocka_unit_test(stream_calls_on_a_bound_slot),
		host_only_test(memory_stays_until_the_last_unbind), /* reads the emulation's memory use */
		cmocka_unit_test(slot_destroyed_while_bound),
		cmocka_unit_test(driver_calls_are_counted),
		cmocka_unit_test(runtime_destroy_takes_what_is_left),
		cmocka_unit_test(failed_bind_is_rolled_back),
		cmocka_unit_test(timed_out_pages_are_the_runtimes_to_finish),
		cmocka_unit_test(table_maps_granule_by_granule),
		cmocka_unit_test(table_refusals_are_named),
		cmocka_unit_test(table_rebind_and_destroy),
		cmocka_unit_test(failed_table_bind_is_rolled_back),
		cmocka_unit_test(cancelled_table_bind_frees_its_table),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

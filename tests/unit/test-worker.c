/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Driver workers: per-slot ordering across several workers, the handle pool,
 * failure publication with bounded out-of-memory retries, shutdown with
 * queued work (cancel or drain), destroy with requests in flight, and pushes
 * from host functions (the real producers).
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <urcu/uatomic.h>

#include "runtime.h"
#include "slot.h"
#include "test-common.h"
#include "testing.h"

#define MiB (1024ull * 1024)

static vmmrt_runtime *make_rt(const char *workers, const char *pool)
{
	return test_runtime((const char *const[]){"host_capacity", "256M", "driver_workers", workers, "handle_pool", pool,
						  "oom_retries", "3", "oom_backoff_us", "10", NULL});
}

typedef struct tally {
	int32_t ok, failed, cancelled;
} tally;

static void count_done(vmmrt__request *req, vmmrt_status st, void *arg)
{
	tally *t = arg;
	if (st == VMMRT_OK)
		uatomic_inc(&t->ok);
	else if (st == VMMRT_E_CANCELLED)
		uatomic_inc(&t->cancelled);
	else
		uatomic_inc(&t->failed);
}

/* Alternating MAP/RELEASE, all queued at once: any reordering within a slot
 * would map a mapped slot or unmap an unmapped one, and fail. */
static void per_slot_order_with_four_workers(void **state)
{
	enum { SLOTS = 8, ROUNDS = 40 };
	vmmrt_runtime *rt = make_rt("4", "0");
	vmmrt_slot *s[SLOTS];
	vmmrt__request *reqs = calloc(SLOTS * ROUNDS * 2, sizeof(*reqs));
	tally t = {0};
	unsigned seen[4] = {0};
	for (int i = 0; i < SLOTS; i++) {
		assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s[i]), VMMRT_OK);
		seen[s[i]->worker]++;
	}
	for (int w = 0; w < 4; w++)
		assert_true(seen[w] > 0); /* the slots really are spread over the workers */
	for (int r = 0; r < ROUNDS * 2; r++)
		for (int i = 0; i < SLOTS; i++) {
			vmmrt__request *q = &reqs[r * SLOTS + i];
			vmmrt__request_init(q, r % 2 ? &vmmrt__slot_release_ops : &vmmrt__slot_map_ops, s[i]);
			q->done = count_done;
			q->done_arg = &t;
			assert_int_equal(vmmrt__worker_push(rt->workers, s[i]->worker, q), VMMRT_OK);
		}
	for (int r = 0; r < SLOTS * ROUNDS * 2; r++)
		assert_int_equal(vmmrt__request_wait(&reqs[r], 10000), VMMRT_OK);
	assert_int_equal(t.ok, SLOTS * ROUNDS * 2);
	assert_int_equal(t.failed, 0);
	assert_int_equal(used(rt), 0);
	free(reqs);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The pool serves the library's own slots (vmmrt__slot_reserve, as the
 * strategies make them); the application's never pool (test-slot-async). */
static void pool_reuses_handles(void **state)
{
	vmmrt_runtime *rt = make_rt("1", "2");
	vmmrt_slot *s;
	vmmrt_driver_stats create = {.size = sizeof(create)};
	assert_int_equal(vmmrt__slot_reserve(rt, 4 * MiB, &s), VMMRT_OK);
	for (int i = 0; i < 10; i++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	}
	assert_int_equal(vmmrt_driver_stats_get(rt, 0, &create), VMMRT_OK);
	assert_string_equal(create.name, "cuMemCreate");
	assert_int_equal(create.count, 1); /* one cuMemCreate, nine maps from the pool */
	vmmrt__slot_pool_stats ws;
	vmmrt__slot_pools_stats(rt->workers, &ws);
	assert_int_equal(ws.pool_hits, 9);
	assert_int_equal(ws.pool_handles, 1);
	assert_int_equal(used(rt), 4 * MiB); /* pooled memory is still the driver's... */
	assert_int_equal(vmmrt__slot_pools_trim(rt->workers), VMMRT_OK);
	assert_int_equal(used(rt), 0);       /* ...until trimmed */
	vmmrt__slot_pools_stats(rt->workers, &ws);
	assert_int_equal(ws.pool_handles, 0);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static int32_t oom_left;

static vmmrt_status oom_hook(void *ctx, const char *op, uint64_t *delay_us)
{
	if (!strcmp(op, "cuMemCreate") && uatomic_read(&oom_left) > 0) {
		uatomic_dec(&oom_left);
		return VMMRT_E_OUT_OF_MEMORY;
	}
	return VMMRT_OK;
}

static void failures_are_retried_then_published(void **state)
{
	vmmrt_runtime *rt = make_rt("1", "0");
	vmmrt_slot *s;
	tally t = {0};
	vmmrt__slot_pool_stats ps;
	vmmrt__worker_stats ws;
	vmmrt__drv_set_fault_hook(rt, oom_hook, NULL);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);

	/* Two OOMs then success: the retry hides them. */
	uatomic_set(&oom_left, 2);
	assert_int_equal(vmmrt__slot_map_async(s, count_done, &t), VMMRT_OK);
	assert_int_equal(vmmrt__request_wait(&s->map_req, 10000), VMMRT_OK);
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.oom_retries, 2);
	assert_int_equal(t.ok, 1);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);

	/* More OOMs than retries: published on the request and the slot. */
	uatomic_set(&oom_left, 100);
	assert_int_equal(vmmrt__slot_map_async(s, count_done, &t), VMMRT_OK);
	assert_int_equal(vmmrt__request_wait(&s->map_req, 10000), VMMRT_E_OUT_OF_MEMORY);
	assert_int_equal(t.failed, 1);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_FAILED);
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.oom_retries, 2 + 3);
	vmmrt__workers_stats(rt->workers, &ws);
	assert_int_equal(ws.failed, 1);
	/* The next API call on the slot reports it, once. */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_E_OUT_OF_MEMORY);
	assert_non_null(strstr(vmmrt_last_error(), "earlier asynchronous request failed"));
	uatomic_set(&oom_left, 0);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 1);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A CALL request that holds its worker until released. */
typedef struct gate {
	int32_t entered, open;
} gate;

static void hold(void *arg)
{
	gate *g = arg;
	uatomic_set(&g->entered, 1);
	while (!uatomic_read(&g->open))
		usleep(100);
}

static void stall(vmmrt__workers *w, unsigned index, gate *g, vmmrt__request *req)
{
	vmmrt__request_init_call(req, hold, g);
	assert_int_equal(vmmrt__worker_push(w, index, req), VMMRT_OK);
	while (!uatomic_read(&g->entered))
		usleep(100);
}

typedef struct opener {
	gate *g;
	useconds_t after;
} opener;

static void *open_later(void *arg)
{
	opener *o = arg;
	usleep(o->after);
	uatomic_set(&o->g->open, 1);
	return NULL;
}

static void shutdown_with_queued_work(void **state)
{
	for (int drain = 0; drain < 2; drain++) {
		vmmrt_runtime *rt = make_rt("1", "0");
		vmmrt__workers *w;
		gate g = {0};
		vmmrt__request blocker, reqs[20];
		tally t = {0};
		vmmrt_slot *s;
		assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
		/* A second pool on the same runtime, so the test owns its whole life. */
		assert_int_equal(vmmrt__workers_create(rt, 1, &vmmrt__slot_worker_class, &w), VMMRT_OK);
		stall(w, 0, &g, &blocker);
		for (int i = 0; i < 20; i++) {
			vmmrt__request_init(&reqs[i], i % 2 ? &vmmrt__slot_release_ops : &vmmrt__slot_map_ops, s);
			reqs[i].done = count_done;
			reqs[i].done_arg = &t;
			assert_int_equal(vmmrt__worker_push(w, 0, &reqs[i]), VMMRT_OK);
		}
		opener o = {&g, 20000};
		pthread_t th;
		pthread_create(&th, NULL, open_later, &o);
		uint64_t cancelled = vmmrt__workers_destroy(w, drain);
		pthread_join(th, NULL);
		if (drain) {
			assert_int_equal(cancelled, 0);
			assert_int_equal(t.ok, 20);
		} else {
			assert_int_equal(cancelled, 20);
			assert_int_equal(t.cancelled, 20);
			assert_int_equal(t.ok, 0);
		}
		for (int i = 0; i < 20; i++) {
			vmmrt_status st = VMMRT_E_DRIVER;
			assert_true(vmmrt__request_poll(&reqs[i], &st));
			assert_int_equal(st, drain ? VMMRT_OK : VMMRT_E_CANCELLED);
		}
		assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
		assert_int_equal(used(rt), 0);
		assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	}
}

typedef struct destroyer {
	vmmrt_slot *s;
	vmmrt_status st;
} destroyer;

static void *destroy_thread(void *arg)
{
	destroyer *d = arg;
	d->st = vmmrt_slot_destroy(d->s);
	return NULL;
}

static void destroy_while_requests_are_queued(void **state)
{
	vmmrt_runtime *rt = make_rt("1", "0");
	gate g = {0};
	vmmrt__request blocker;
	tally t = {0};
	destroyer d = {0};
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &d.s), VMMRT_OK);
	stall(rt->workers, 0, &g, &blocker);
	assert_int_equal(vmmrt__slot_map_async(d.s, count_done, &t), VMMRT_OK);
	/* A request object sits in one queue at a time: a second push is refused. */
	assert_int_equal(vmmrt__slot_map_async(d.s, count_done, &t), VMMRT_E_BUSY);
	assert_int_equal(vmmrt_slot_get_state(d.s), VMMRT_SLOT_PENDING);
	pthread_t th;
	pthread_create(&th, NULL, destroy_thread, &d);
	usleep(20000); /* the destroy is queued behind the map */
	uatomic_set(&g.open, 1);
	pthread_join(th, NULL);
	assert_int_equal(d.st, VMMRT_OK);
	assert_int_equal(t.cancelled, 1); /* the map of a dying slot is not made */
	assert_int_equal(used(rt), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void timeout_is_bounded_and_abandons(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"timeout_ms", "30", NULL});
	gate g = {0};
	vmmrt__request blocker;
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	stall(rt->workers, 0, &g, &blocker);
	/* A stalled worker: the API returns a named error in bounded time. */
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_E_TIMEOUT);
	assert_non_null(strstr(vmmrt_last_error(), "stalled"));
	uatomic_set(&g.open, 1);
	/* The abandoned destroy still runs, and frees its own request (ASan would see a leak). */
	assert_int_equal(vmmrt__request_wait(&blocker, 10000), VMMRT_OK);
	for (int i = 0; i < 1000 && uatomic_read(&rt->live_slots); i++)
		usleep(1000);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

typedef struct hf_push {
	vmmrt__workers *w;
	vmmrt__request *req;
	vmmrt_status st;
} hf_push;

static void push_in_host_function(void *arg)
{
	hf_push *p = arg;
	p->st = vmmrt__worker_push(p->w, 0, p->req);
}

static void bump(void *arg)
{
	uatomic_inc((int32_t *)arg);
}

static void host_functions_feed_the_workers(void **state)
{
	enum { N = 200 };
	vmmrt_runtime *rt = make_rt("2", "0");
	vmmrt_stream st[2];
	vmmrt__request *reqs = calloc(N, sizeof(*reqs));
	hf_push *p = calloc(N, sizeof(*p));
	int32_t ran = 0;
	for (int k = 0; k < 2; k++)
		assert_int_equal(vmmrt_stream_create(rt, &st[k]), VMMRT_OK);
	for (int i = 0; i < N; i++) {
		vmmrt__request_init_call(&reqs[i], bump, &ran);
		p[i] = (hf_push){rt->workers, &reqs[i], VMMRT_E_BUSY};
		assert_int_equal(vmmrt__drv_launch_host_func(rt, st[i % 2], push_in_host_function, &p[i]), VMMRT_OK);
	}
	for (int k = 0; k < 2; k++)
		assert_int_equal(vmmrt_stream_synchronize(rt, st[k]), VMMRT_OK);
	for (int i = 0; i < N; i++) {
		assert_int_equal(p[i].st, VMMRT_OK);
		assert_int_equal(vmmrt__request_wait(&reqs[i], 10000), VMMRT_OK);
	}
	assert_int_equal(ran, N);
	for (int k = 0; k < 2; k++)
		assert_int_equal(vmmrt_stream_destroy(rt, st[k]), VMMRT_OK);
	free(reqs);
	free(p);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(per_slot_order_with_four_workers),
		cmocka_unit_test(pool_reuses_handles),
		cmocka_unit_test(failures_are_retried_then_published),
		cmocka_unit_test(shutdown_with_queued_work),
		cmocka_unit_test(destroy_while_requests_are_queued),
		cmocka_unit_test(timeout_is_bounded_and_abandons),
		cmocka_unit_test(host_functions_feed_the_workers),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

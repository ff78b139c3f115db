/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slots on the host backend: the address never changes, every state
 * transition is checked, failures roll back, and nothing leaks. Also the rule
 * that only driver workers make VMM calls.
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

#include "runtime.h"
#include "slot.h"
#include "test-common.h"
#include "testing.h"

#define MiB (1024ull * 1024)

static vmmrt_runtime *make_rt(const char *capacity, const char *checked)
{
	return test_runtime((const char *const[]){"host_capacity", capacity, "checked_threads", checked, "oom_retries",
						  "1", "oom_backoff_us", "10", NULL});
}

static void bad_input(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 0, &s), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_create(rt, SIZE_MAX, &s), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_create(rt, SIZE_MAX - 4096, &s), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_create(NULL, 1, &s), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_create(rt, 1, NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_map(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_unmap(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_destroy(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_error(NULL), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_address(NULL), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(NULL), VMMRT_E_INVALID_ARGUMENT);
}

static void state_machine_keeps_the_address(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 3 * MiB, &s), VMMRT_OK);
	vmmrt_devptr va = vmmrt_slot_address(s);
	assert_int_equal(vmmrt_slot_size(s), 4 * MiB); /* rounded to the 2 MiB granularity */
	assert_int_equal(va % (2 * MiB), 0);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(used(rt), 4 * MiB);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(used(rt), 0);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_E_INVALID_STATE);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_address(s), va);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	}
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A slot reserved large maps only what truncate left (an allocator lent the
 * whole range before anyone knew how much would be used); the destroy frees
 * the whole reservation (the host backend refuses a free of another size);
 * truncate is refused while anything is mapped or a request is in flight. */
static void truncate_with_nothing_mapped(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt_slot *s, *t;
	assert_int_equal(vmmrt_slot_create(rt, 48 * MiB, &s), VMMRT_OK);
	vmmrt_devptr va = vmmrt_slot_address(s);
	assert_int_equal(vmmrt_slot_truncate(NULL, MiB), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_slot_truncate(s, 0), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_slot_truncate(s, 48 * MiB + 1), VMMRT_E_INVALID_SIZE);
	/* mapped whole first (what a capture into the range needs), then cut */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(used(rt), 48 * MiB);
	assert_int_equal(vmmrt_slot_truncate(s, 3 * MiB), VMMRT_E_INVALID_STATE);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_truncate(s, 3 * MiB), VMMRT_OK);
	assert_int_equal(vmmrt_slot_size(s), 4 * MiB);
	assert_int_equal(vmmrt_slot_truncate(s, 6 * MiB), VMMRT_E_INVALID_SIZE); /* past the size it has now */
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_address(s), va);
	assert_int_equal(used(rt), 4 * MiB);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	/* a stream-ordered map in flight, then done: refused both times */
	assert_int_equal(vmmrt_slot_create(rt, 8 * MiB, &t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map_async(t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_truncate(t, 2 * MiB), VMMRT_E_INVALID_STATE); /* PENDING, or MAPPED already */
	assert_int_equal(vmmrt_slot_wait(t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_truncate(t, 2 * MiB), VMMRT_E_INVALID_STATE);
	assert_int_equal(used(rt), 8 * MiB);
	assert_int_equal(vmmrt_slot_destroy(t), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void bytes_survive_offload_and_remap(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt_slot *s, *res;
	vmmrt_stream st;
	const size_t n = 2 * MiB;
	uint64_t *host, sum = 0;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 8, &res), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(res), VMMRT_OK);
	assert_int_equal(vmmrt_host_alloc(rt, n, (void **)&host), VMMRT_OK);
	vmmrt_devptr va = vmmrt_slot_address(s);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_fill(rt, st, va, n, 7), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, host, va, n), VMMRT_OK);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_address(s), va);
	/* New physical memory: what was there is gone until the reload. */
	assert_int_equal(vmmrt_copy_to_device(rt, va, host, n), VMMRT_OK);
	assert_int_equal(vmmrt_kernel_checksum(rt, st, va, n, vmmrt_slot_address(res)), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, &sum, vmmrt_slot_address(res), 8), VMMRT_OK);
	for (size_t i = 0; i < n / 8; i++)
		host[i] = vmmrt_fill_word(7, i);
	assert_int_equal(sum, vmmrt_checksum_host(host, n));
	assert_int_equal(vmmrt_host_free(rt, host), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(res), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void out_of_memory_is_named_and_clean(void **state)
{
	vmmrt_runtime *rt = make_rt("8M", "1");
	vmmrt_slot *a, *b;
	assert_int_equal(vmmrt_slot_create(rt, 6 * MiB, &a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_create(rt, 4 * MiB, &b), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(b), VMMRT_E_OUT_OF_MEMORY);
	assert_non_null(strstr(vmmrt_last_error(), "OUT_OF_MEMORY"));
	/* The failure was reported by the call, not again; the slot is usable again. */
	assert_int_equal(vmmrt_slot_get_state(b), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_error(b), VMMRT_OK);
	vmmrt__slot_pool_stats ps;
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.oom_retries, 1);
	assert_int_equal(vmmrt_slot_unmap(a), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(b), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 1);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK); /* destroys a and b */
}

/* Fault hook: fail the n-th call of one op, and note the thread role of every VMM call. */
typedef struct fault_plan {
	const char *op;
	int fail_at;
	int seen;
	int vmm_calls;
	int vmm_off_worker;
} fault_plan;

static vmmrt_status fault_hook(void *ctx, const char *op, uint64_t *delay_us)
{
	fault_plan *p = ctx;
	if (!strcmp(op, "cuMemCreate") || !strcmp(op, "cuMemMap") || !strcmp(op, "cuMemSetAccess") ||
	    !strcmp(op, "cuMemUnmap") || !strcmp(op, "cuMemRelease")) {
		uatomic_inc(&p->vmm_calls);
		if (vmmrt__thread_role_get() != VMMRT_ROLE_WORKER)
			uatomic_inc(&p->vmm_off_worker);
	}
	if (p->op && !strcmp(op, p->op) && ++p->seen == p->fail_at)
		return VMMRT_E_DRIVER;
	return VMMRT_OK;
}

static void partial_map_is_rolled_back(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	fault_plan plan = {.op = "cuMemSetAccess", .fail_at = 1};
	vmmrt_slot *s;
	vmmrt__drv_set_fault_hook(rt, fault_hook, &plan);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemSetAccess"));
	/* Nothing mapped, nothing created is left: the map was unwound and the handle released. */
	assert_int_equal(used(rt), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK); /* second try succeeds */
	assert_int_equal(used(rt), 2 * MiB);
	/* A failed unmap keeps the slot mapped and reports it. */
	plan.op = "cuMemUnmap";
	plan.seen = 0;
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_E_DRIVER);
	assert_int_equal(vmmrt_slot_error(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_MAPPED);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void only_workers_make_vmm_calls(void **state)
{
	/* Checked mode: a VMM call from this (application) thread is refused... */
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt__bhandle h;
	assert_int_equal(vmmrt__drv_mem_create(rt, 2 * MiB, &h), VMMRT_E_NOT_PERMITTED);
	assert_int_equal(vmmrt__drv_mem_unmap(rt, 0x1000, 2 * MiB), VMMRT_E_NOT_PERMITTED);
	/* ...and everything the API did went through a worker. */
	fault_plan plan = {0};
	vmmrt_slot *s;
	vmmrt__drv_set_fault_hook(rt, fault_hook, &plan);
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	}
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	/* create+map+set access, unmap+release: 5 per cycle; a map; unmap+release at destroy */
	assert_int_equal(plan.vmm_calls, 5 * 3 + 3 + 2);
	assert_int_equal(plan.vmm_off_worker, 0);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);

	/* Unchecked (what remap-inline measures): the same call is allowed. */
	rt = make_rt("64M", "0");
	assert_int_equal(vmmrt__drv_mem_create(rt, 2 * MiB, &h), VMMRT_OK);
	assert_int_equal(vmmrt__drv_mem_release(rt, h), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

typedef struct hf_ctx {
	vmmrt_runtime *rt;
	vmmrt_slot *slot;
	vmmrt_status map_st, create_st, info_st;
} hf_ctx;

static void inside_host_function(void *arg)
{
	hf_ctx *c = arg;
	size_t f, t;
	c->map_st = vmmrt_slot_map(c->slot);
	c->info_st = vmmrt_mem_info(c->rt, &f, &t);
	vmmrt_slot *s2;
	c->create_st = vmmrt_slot_create(c->rt, MiB, &s2);
}

static void api_refuses_host_functions(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	vmmrt_stream st;
	hf_ctx c = {.rt = rt};
	assert_int_equal(vmmrt_slot_create(rt, MiB, &c.slot), VMMRT_OK);
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	assert_int_equal(vmmrt__drv_launch_host_func(rt, st, inside_host_function, &c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(c.map_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.info_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.create_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(vmmrt_slot_get_state(c.slot), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

static void destroy_with_requests_in_flight(void **state)
{
	vmmrt_runtime *rt = make_rt("64M", "1");
	for (int i = 0; i < 50; i++) {
		vmmrt_slot *s;
		assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
		assert_int_equal(vmmrt__slot_map_async(s, NULL, NULL), VMMRT_OK);
		if (i % 2)
			assert_int_equal(vmmrt__slot_release_async(s, NULL, NULL), VMMRT_OK);
		assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	}
	assert_int_equal(used(rt), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The application's slots give their memory back to the driver, whatever
 * the handle pool and remap's handle reuse keep for the library's own. */
static void unmap_gives_memory_back_with_a_pool(void **state)
{
	vmmrt_runtime *rt = test_runtime((const char *const[]){"host_capacity", "64M", "mode", "remap", "handle_pool",
							       "4", "handle_reuse", "1", NULL});
	vmmrt_slot *s, *own;
	vmmrt__slot_pool_stats ps;
	assert_int_equal(vmmrt_slot_create(rt, 4 * MiB, &s), VMMRT_OK);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(used(rt), 4 * MiB);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
		assert_int_equal(used(rt), 0);
	}
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(used(rt), 0);
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.pool_handles, 0);
	assert_int_equal(ps.pool_hits, 0);
	/* The library's own slot still pools (test-worker: pool_reuses_handles). */
	assert_int_equal(vmmrt__slot_reserve(rt, 4 * MiB, &own), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(own), VMMRT_OK);
	assert_int_equal(vmmrt_slot_unmap(own), VMMRT_OK);
	vmmrt__slot_pools_stats(rt->workers, &ps);
	assert_int_equal(ps.pool_handles, 1);
	assert_int_equal(vmmrt_slot_destroy(own), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(bad_input),
		cmocka_unit_test(state_machine_keeps_the_address),
		cmocka_unit_test(truncate_with_nothing_mapped),
		cmocka_unit_test(bytes_survive_offload_and_remap),
		host_only_test(out_of_memory_is_named_and_clean), /* needs a small capacity */
		cmocka_unit_test(partial_map_is_rolled_back),
		cmocka_unit_test(only_workers_make_vmm_calls),
		cmocka_unit_test(api_refuses_host_functions),
		cmocka_unit_test(destroy_with_requests_in_flight),
		cmocka_unit_test(unmap_gives_memory_back_with_a_pool),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

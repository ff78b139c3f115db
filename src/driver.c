/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Every driver call of the runtime passes here. Three rules are enforced in
 * one place rather than at each call site:
 *  - nothing calls the driver from inside a host function (the CUDA 13 driver
 *    returns NOT_PERMITTED there, older ones deadlock);
 *  - in checked mode, cuMemCreate/Map/SetAccess/Unmap/Release run only on a
 *    driver worker: these calls take 0.1-4 ms under copy load and contend
 *    with each other, so the launch thread must never make them;
 *  - blocking calls made by application threads are counted, so a test can
 *    prove the steady state never blocks the launch thread.
 * The VMM calls are timed into a per-type ring for the p50/p99 statistics.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The inline forms of rcu_set_pointer/rcu_dereference: built from uatomic,
 * which tsan.h turns into atomics ThreadSanitizer sees (the library's
 * out-of-line ones it cannot). */
#define _LGPL_SOURCE
#include <urcu/pointer.h>
#include <urcu/uatomic.h>

#include "api.h"
#include "clock.h"
#include "error.h"
#include "runtime.h"
#include "trace.h"
#include "tsan.h"

#define NO_NAME_X(op, door, call, params, args)
#define CALL_NAME_T(op, call, params, args, bytes) [VMMRT_CALL_##op] = call,
static const char *const call_names[VMMRT_CALL_COUNT_] = {VMMRT__BACKEND_OPS(NO_NAME_X, CALL_NAME_T)};

/* Every operation's driver call, for the wrappers written out (OWN). */
enum op_id {
#define OP_ID_X(op, door, call, params, args) OP_##op,
#define OP_ID_T(op, call, params, args, bytes) OP_##op,
	VMMRT__BACKEND_OPS(OP_ID_X, OP_ID_T)
};
#define OP_NAME_X(op, door, call, params, args) [OP_##op] = call,
#define OP_NAME_T(op, call, params, args, bytes) [OP_##op] = call,
static const char *const op_calls[] = {VMMRT__BACKEND_OPS(OP_NAME_X, OP_NAME_T)};

void vmmrt__drv_free_fault_hooks(vmmrt_runtime *rt)
{
	while (rt->fault_all) {
		struct vmmrt__fault_hook *h = rt->fault_all;
		rt->fault_all = h->next;
		free(h);
	}
	rt->fault = NULL;
}

vmmrt_status vmmrt__drv_check_caller(const char *api)
{
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s called from inside a host function", api);
	return VMMRT_OK;
}

/* Common prologue: host-function rule, then the injected fault if any. */
static vmmrt_status enter(vmmrt_runtime *rt, const char *op)
{
	vmmrt_status st = vmmrt__drv_check_caller(op);
	if (st != VMMRT_OK)
		return st;
	struct vmmrt__fault_hook *h = rcu_dereference(rt->fault);
	if (h) {
		uint64_t delay_us = 0;
		st = h->fn(h->ctx, op, &delay_us);
		if (delay_us)
			vmmrt__sleep_ns(delay_us * 1000);
		if (st != VMMRT_OK)
			return vmmrt__error(st, "%s: injected fault", op);
	}
	return VMMRT_OK;
}

/* VMM calls that only a driver worker may make (checked mode). */
static vmmrt_status enter_vmm(vmmrt_runtime *rt, vmmrt__drv_call c)
{
	if (rt->checked_threads && vmmrt__thread_role_get() != VMMRT_ROLE_WORKER &&
	    vmmrt__thread_role_get() != VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED,
				   "%s from a thread that is not a driver worker (checked_threads is on)",
				   call_names[c]);
	return enter(rt, call_names[c]);
}

static void record_call(vmmrt_runtime *rt, vmmrt__drv_call c, uint64_t t0, size_t bytes)
{
	uint64_t t1 = vmmrt__now_ns();
	vmmrt__call_ring *r = &rt->calls[c];
	uint64_t i = uatomic_add_return(&r->next, 1) - 1;
	r->us[i % VMMRT__CALL_SAMPLES] = (float)(t1 - t0) / 1000.0f;
	if (rt->trace)
		vmmrt__trace_call(rt->trace, call_names[c], t0, t1, bytes);
}

static void count_blocking(vmmrt_runtime *rt)
{
	if (vmmrt__thread_role_get() == VMMRT_ROLE_APP)
		uatomic_inc(&rt->launch_blocking);
}

/* Created and released handles are counted: what destroy reports as leaked. */
static inline void count_handles(vmmrt_runtime *rt, vmmrt__drv_call c)
{
	if (c == VMMRT_CALL_mem_create)
		uatomic_inc(&rt->live_handles);
	else if (c == VMMRT_CALL_mem_release)
		uatomic_dec(&rt->live_handles);
}

/* ------------------------------------------------ the wrappers, by door */

#define DOOR(op, door, call, params, args) DOOR_##door(op, call, params, args)

#define DOOR_RAW(op, call, params, args) \
	vmmrt_status vmmrt__drv_##op(vmmrt_runtime *rt VMMRT__LIST params) \
	{ \
		return rt->ops->op(rt->be VMMRT__LIST args); \
	}

/* enter(), then `before` (a statement), then the call. */
#define DOOR_ENTERED(op, call, params, args, before) \
	vmmrt_status vmmrt__drv_##op(vmmrt_runtime *rt VMMRT__LIST params) \
	{ \
		vmmrt_status st_ = enter(rt, call); \
		if (st_ != VMMRT_OK) \
			return st_; \
		before; \
		return rt->ops->op(rt->be VMMRT__LIST args); \
	}
#define DOOR_PLAIN(op, call, params, args) DOOR_ENTERED(op, call, params, args, (void)0)
#define DOOR_BLOCKING(op, call, params, args) DOOR_ENTERED(op, call, params, args, count_blocking(rt))

#define DOOR_OWN(op, call, params, args)
#define DOOR_NONE(op, call, params, args)

#define DOOR_T(op, call, params, args, bytes) \
	vmmrt_status vmmrt__drv_##op(vmmrt_runtime *rt VMMRT__LIST params) \
	{ \
		vmmrt_status st_ = enter_vmm(rt, VMMRT_CALL_##op); \
		if (st_ != VMMRT_OK) \
			return st_; \
		uint64_t t0_ = vmmrt__now_ns(); \
		st_ = rt->ops->op(rt->be VMMRT__LIST args); \
		record_call(rt, VMMRT_CALL_##op, t0_, bytes); \
		if (st_ == VMMRT_OK) \
			count_handles(rt, VMMRT_CALL_##op); \
		return st_; \
	}

VMMRT__BACKEND_OPS(DOOR, DOOR_T)

/* ------------------------------------------------ the wrappers written out */

vmmrt_status vmmrt__drv_va_reserve(vmmrt_runtime *rt, size_t size, vmmrt_devptr *out)
{
	vmmrt_status st = enter(rt, op_calls[OP_va_reserve]);
	if (st == VMMRT_OK)
		st = rt->ops->va_reserve(rt->be, size, rt->granularity, out);
	if (st == VMMRT_OK)
		uatomic_inc(&rt->live_reservations);
	return st;
}

vmmrt_status vmmrt__drv_va_free(vmmrt_runtime *rt, vmmrt_devptr va, size_t size)
{
	vmmrt_status st = enter(rt, op_calls[OP_va_free]);
	if (st == VMMRT_OK)
		st = rt->ops->va_free(rt->be, va, size);
	if (st == VMMRT_OK)
		uatomic_dec(&rt->live_reservations);
	return st;
}

vmmrt_status vmmrt__drv_stream_end_capture(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bgraph **out)
{
	const char *call = op_calls[OP_stream_end_capture];
	vmmrt_status st = vmmrt__drv_check_caller(call);
	if (st != VMMRT_OK)
		return st;
	if ((st = enter(rt, call)) != VMMRT_OK) {
		/* An injected failure: cuStreamEndCapture leaves capture mode even
		 * when it fails, so end it here too (and drop the graph), or the
		 * stream would stay in a state no driver leaves it in. */
		char why[512];
		vmmrt__bgraph *g = NULL;
		snprintf(why, sizeof(why), "%s", vmmrt_last_error());
		if (rt->ops->stream_end_capture(rt->be, s, &g) == VMMRT_OK && g)
			(void)rt->ops->graph_destroy(rt->be, g);
		vmmrt__error_adopt(why);
		return st;
	}
	return rt->ops->stream_end_capture(rt->be, s, out);
}

/* ------------------------------------------------ the opened device */

vmmrt_status vmmrt__drv_open(vmmrt_runtime *rt, const vmmrt__backend_ops *ops)
{
	rt->ops = ops;
	return ops->open(&rt->be_cfg, &rt->be);
}

static void touch_thread_state(void *arg)
{
	(void)arg; /* the trampoline around it sets the thread role: that is the touch */
}

vmmrt_status vmmrt__drv_setup(vmmrt_runtime *rt)
{
	vmmrt_status st;
	if ((st = rt->ops->granularity(rt->be, &rt->granularity)) != VMMRT_OK ||
	    (st = rt->ops->device_name(rt->be, rt->device_name, sizeof(rt->device_name))) != VMMRT_OK ||
	    (st = rt->ops->stream_create(rt->be, &rt->sync_stream)) != VMMRT_OK)
		return st;
	/*
	 * The library's thread-local state uses the dynamic TLS model (it is
	 * loaded with dlopen), so a thread's first access allocates the block.
	 * Do that for the driver's callback thread here, once, instead of inside
	 * the first host function of the hot path.
	 */
	st = rt->ops->launch_host_func(rt->be, rt->sync_stream, touch_thread_state, NULL);
	if (st == VMMRT_OK)
		st = rt->ops->stream_synchronize(rt->be, rt->sync_stream);
	return st;
}

void vmmrt__drv_close(vmmrt_runtime *rt)
{
	if (rt->sync_stream)
		(void)rt->ops->stream_destroy(rt->be, rt->sync_stream);
	rt->sync_stream = NULL;
	if (rt->be)
		rt->ops->close(rt->be);
	rt->be = NULL;
}

void vmmrt__drv_detach(vmmrt_runtime *rt, vmmrt__drv_detached *out)
{
	if (rt->sync_stream)
		(void)rt->ops->stream_destroy(rt->be, rt->sync_stream);
	rt->sync_stream = NULL;
	out->ops = rt->ops;
	out->be = rt->be;
	rt->be = NULL;
}

vmmrt_status vmmrt__drv_detached_mem_free(vmmrt__drv_detached *d, vmmrt_devptr p)
{
	vmmrt_status st = vmmrt__drv_check_caller(op_calls[OP_mem_free]);
	if (st != VMMRT_OK)
		return st;
	return d->ops->mem_free(d->be, p);
}

void vmmrt__drv_detached_close(vmmrt__drv_detached *d)
{
	if (d->be)
		d->ops->close(d->be);
	d->be = NULL;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

void vmmrt__drv_call_stats(vmmrt_runtime *rt, vmmrt__drv_call c, vmmrt__call_stats *out)
{
	memset(out, 0, sizeof(*out));
	if ((unsigned)c >= VMMRT_CALL_COUNT_)
		return;
	vmmrt__call_ring *r = &rt->calls[c];
	uint64_t total = uatomic_read(&r->next);
	size_t n = total < VMMRT__CALL_SAMPLES ? (size_t)total : VMMRT__CALL_SAMPLES;
	out->count = total;
	if (n == 0)
		return;
	float *tmp = malloc(n * sizeof(*tmp));
	if (!tmp)
		return;
	memcpy(tmp, r->us, n * sizeof(*tmp));
	qsort(tmp, n, sizeof(*tmp), cmp_float);
	out->p50_us = tmp[(n - 1) / 2];
	out->p99_us = tmp[(size_t)((double)(n - 1) * 0.99)];
	out->max_us = tmp[n - 1];
	free(tmp);
}

void vmmrt__drv_reset_stats(vmmrt_runtime *rt)
{
	for (int c = 0; c < VMMRT_CALL_COUNT_; c++)
		uatomic_set(&rt->calls[c].next, 0);
	uatomic_set(&rt->launch_blocking, 0);
}

uint64_t vmmrt__drv_launch_thread_blocking(vmmrt_runtime *rt)
{
	return uatomic_read(&rt->launch_blocking);
}

vmmrt_status vmmrt_driver_stats_get(vmmrt_runtime *rt, unsigned call, vmmrt_driver_stats *out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt && out, "NULL argument");
	if (call >= VMMRT_CALL_COUNT_)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "driver call %u >= %d", call, VMMRT_CALL_COUNT_);
	vmmrt__call_stats s;
	vmmrt__drv_call_stats(rt, (vmmrt__drv_call)call, &s);
	vmmrt_driver_stats full = {sizeof(full), call_names[call], s.count, s.p50_us, s.p99_us, s.max_us};
	return VMMRT__SIZED_OUT(out, full, VMMRT__DRIVER_STATS_SIZE_V1, "vmmrt_driver_stats");
}

vmmrt_status vmmrt_driver_stats_reset(vmmrt_runtime *rt)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	vmmrt__drv_reset_stats(rt);
	return VMMRT_OK;
}

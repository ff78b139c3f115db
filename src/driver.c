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
#include <time.h>

/* The inline forms of rcu_set_pointer/rcu_dereference: built from uatomic,
 * which tsan.h turns into atomics ThreadSanitizer sees (the library's
 * out-of-line ones it cannot). */
#define _LGPL_SOURCE
#include <urcu/pointer.h>
#include <urcu/uatomic.h>

#include "api.h"
#include "error.h"
#include "runtime.h"
#include "trace.h"
#include "tsan.h"

static const char *const call_names[VMMRT_CALL_COUNT_] = {
	[VMMRT_CALL_CREATE] = "cuMemCreate",
	[VMMRT_CALL_MAP] = "cuMemMap",
	[VMMRT_CALL_SET_ACCESS] = "cuMemSetAccess",
	[VMMRT_CALL_UNMAP] = "cuMemUnmap",
	[VMMRT_CALL_RELEASE] = "cuMemRelease",
};

const char *vmmrt__drv_call_name(vmmrt__drv_call c)
{
	return (unsigned)c < VMMRT_CALL_COUNT_ ? call_names[c] : "unknown";
}

uint64_t vmmrt__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

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
		if (delay_us) {
			struct timespec ts = {(time_t)(delay_us / 1000000), (long)(delay_us % 1000000) * 1000};
			while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0)
				;
		}
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
	r->us[i % VMMRT_CALL_SAMPLES] = (float)(t1 - t0) / 1000.0f;
	if (rt->trace)
		vmmrt__trace_call(rt->trace, call_names[c], t0, t1, bytes);
}

static void count_blocking(vmmrt_runtime *rt)
{
	if (vmmrt__thread_role_get() == VMMRT_ROLE_APP)
		uatomic_inc(&rt->launch_blocking);
}

#define TIMED_VMM(rt, c, bytes, call) \
	do { \
		vmmrt_status st_ = enter_vmm(rt, c); \
		if (st_ != VMMRT_OK) \
			return st_; \
		uint64_t t0_ = vmmrt__now_ns(); \
		st_ = (call); \
		record_call(rt, c, t0_, bytes); \
		return st_; \
	} while (0)

#define PLAIN(rt, name, call) \
	do { \
		vmmrt_status st_ = enter(rt, name); \
		if (st_ != VMMRT_OK) \
			return st_; \
		return (call); \
	} while (0)

vmmrt_status vmmrt__drv_va_reserve(vmmrt_runtime *rt, size_t size, vmmrt_devptr *out)
{
	vmmrt_status st = enter(rt, "cuMemAddressReserve");
	if (st == VMMRT_OK)
		st = rt->ops->va_reserve(rt->be, size, rt->granularity, out);
	if (st == VMMRT_OK)
		uatomic_inc(&rt->live_reservations);
	return st;
}

vmmrt_status vmmrt__drv_va_free(vmmrt_runtime *rt, vmmrt_devptr va, size_t size)
{
	vmmrt_status st = enter(rt, "cuMemAddressFree");
	if (st == VMMRT_OK)
		st = rt->ops->va_free(rt->be, va, size);
	if (st == VMMRT_OK)
		uatomic_dec(&rt->live_reservations);
	return st;
}

vmmrt_status vmmrt__drv_mem_create(vmmrt_runtime *rt, size_t size, vmmrt__bhandle *out)
{
	vmmrt_status st = enter_vmm(rt, VMMRT_CALL_CREATE);
	if (st != VMMRT_OK)
		return st;
	uint64_t t0 = vmmrt__now_ns();
	st = rt->ops->mem_create(rt->be, size, out);
	record_call(rt, VMMRT_CALL_CREATE, t0, size);
	if (st == VMMRT_OK)
		uatomic_inc(&rt->live_handles);
	return st;
}

vmmrt_status vmmrt__drv_mem_release(vmmrt_runtime *rt, vmmrt__bhandle h)
{
	vmmrt_status st = enter_vmm(rt, VMMRT_CALL_RELEASE);
	if (st != VMMRT_OK)
		return st;
	uint64_t t0 = vmmrt__now_ns();
	st = rt->ops->mem_release(rt->be, h);
	record_call(rt, VMMRT_CALL_RELEASE, t0, 0);
	if (st == VMMRT_OK)
		uatomic_dec(&rt->live_handles);
	return st;
}

vmmrt_status vmmrt__drv_mem_map(vmmrt_runtime *rt, vmmrt_devptr va, size_t size, vmmrt__bhandle h)
{
	TIMED_VMM(rt, VMMRT_CALL_MAP, size, rt->ops->mem_map(rt->be, va, size, h));
}

vmmrt_status vmmrt__drv_mem_unmap(vmmrt_runtime *rt, vmmrt_devptr va, size_t size)
{
	TIMED_VMM(rt, VMMRT_CALL_UNMAP, size, rt->ops->mem_unmap(rt->be, va, size));
}

vmmrt_status vmmrt__drv_mem_set_access(vmmrt_runtime *rt, vmmrt_devptr va, size_t size)
{
	TIMED_VMM(rt, VMMRT_CALL_SET_ACCESS, size, rt->ops->mem_set_access(rt->be, va, size));
}

vmmrt_status vmmrt__drv_mem_info(vmmrt_runtime *rt, size_t *free_bytes, size_t *total_bytes)
{
	PLAIN(rt, "cuMemGetInfo", rt->ops->mem_info(rt->be, free_bytes, total_bytes));
}

vmmrt_status vmmrt__drv_stream_create(vmmrt_runtime *rt, vmmrt_stream *out)
{
	PLAIN(rt, "cuStreamCreate", rt->ops->stream_create(rt->be, out));
}

vmmrt_status vmmrt__drv_stream_destroy(vmmrt_runtime *rt, vmmrt_stream s)
{
	PLAIN(rt, "cuStreamDestroy", rt->ops->stream_destroy(rt->be, s));
}

vmmrt_status vmmrt__drv_stream_synchronize(vmmrt_runtime *rt, vmmrt_stream s)
{
	vmmrt_status st = enter(rt, "cuStreamSynchronize");
	if (st != VMMRT_OK)
		return st;
	count_blocking(rt);
	return rt->ops->stream_synchronize(rt->be, s);
}

vmmrt_status vmmrt__drv_stream_wait_event(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bevent *e)
{
	PLAIN(rt, "cuStreamWaitEvent", rt->ops->stream_wait_event(rt->be, s, e));
}

vmmrt_status vmmrt__drv_stream_wait_value32(vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr addr, uint32_t v)
{
	PLAIN(rt, "cuStreamWaitValue32", rt->ops->stream_wait_value32(rt->be, s, addr, v));
}

vmmrt_status vmmrt__drv_stream_write_value32(vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr addr, uint32_t v)
{
	PLAIN(rt, "cuStreamWriteValue32", rt->ops->stream_write_value32(rt->be, s, addr, v));
}

vmmrt_status vmmrt__drv_event_create(vmmrt_runtime *rt, bool timing, vmmrt__bevent **out)
{
	PLAIN(rt, "cuEventCreate", rt->ops->event_create(rt->be, timing, out));
}

vmmrt_status vmmrt__drv_event_destroy(vmmrt_runtime *rt, vmmrt__bevent *e)
{
	PLAIN(rt, "cuEventDestroy", rt->ops->event_destroy(rt->be, e));
}

vmmrt_status vmmrt__drv_event_record(vmmrt_runtime *rt, vmmrt__bevent *e, vmmrt_stream s)
{
	PLAIN(rt, "cuEventRecord", rt->ops->event_record(rt->be, e, s));
}

vmmrt_status vmmrt__drv_event_query(vmmrt_runtime *rt, vmmrt__bevent *e, bool *done)
{
	PLAIN(rt, "cuEventQuery", rt->ops->event_query(rt->be, e, done));
}

vmmrt_status vmmrt__drv_stream_query(vmmrt_runtime *rt, vmmrt_stream s, bool *done)
{
	PLAIN(rt, "cuStreamQuery", rt->ops->stream_query(rt->be, s, done));
}

vmmrt_status vmmrt__drv_event_synchronize(vmmrt_runtime *rt, vmmrt__bevent *e)
{
	vmmrt_status st = enter(rt, "cuEventSynchronize");
	if (st != VMMRT_OK)
		return st;
	count_blocking(rt);
	return rt->ops->event_synchronize(rt->be, e);
}

vmmrt_status vmmrt__drv_event_elapsed_ms(vmmrt_runtime *rt, vmmrt__bevent *a, vmmrt__bevent *b, float *ms)
{
	PLAIN(rt, "cuEventElapsedTime", rt->ops->event_elapsed_ms(rt->be, a, b, ms));
}

vmmrt_status vmmrt__drv_launch_host_func(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__host_fn fn, void *arg)
{
	PLAIN(rt, "cuLaunchHostFunc", rt->ops->launch_host_func(rt->be, s, fn, arg));
}

vmmrt_status vmmrt__drv_memcpy_htod_async(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t n, vmmrt_stream s)
{
	PLAIN(rt, "cuMemcpyHtoDAsync", rt->ops->memcpy_htod_async(rt->be, dst, src, n, s));
}

vmmrt_status vmmrt__drv_memcpy_dtoh_async(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	PLAIN(rt, "cuMemcpyDtoHAsync", rt->ops->memcpy_dtoh_async(rt->be, dst, src, n, s));
}

vmmrt_status vmmrt__drv_memcpy_dtod_async(vmmrt_runtime *rt, vmmrt_devptr dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	PLAIN(rt, "cuMemcpyDtoDAsync", rt->ops->memcpy_dtod_async(rt->be, dst, src, n, s));
}

vmmrt_status vmmrt__drv_host_alloc(vmmrt_runtime *rt, size_t size, void **out)
{
	PLAIN(rt, "cuMemHostAlloc", rt->ops->host_alloc(rt->be, size, out));
}

vmmrt_status vmmrt__drv_host_free(vmmrt_runtime *rt, void *p)
{
	PLAIN(rt, "cuMemFreeHost", rt->ops->host_free(rt->be, p));
}

vmmrt_status vmmrt__drv_host_devptr(vmmrt_runtime *rt, void *p, vmmrt_devptr *out)
{
	PLAIN(rt, "cuMemHostGetDevicePointer", rt->ops->host_devptr(rt->be, p, out));
}

vmmrt_status vmmrt__drv_begin_capture(vmmrt_runtime *rt, vmmrt_stream s)
{
	PLAIN(rt, "cuStreamBeginCapture", rt->ops->stream_begin_capture(rt->be, s));
}

vmmrt_status vmmrt__drv_end_capture(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bgraph **out)
{
	vmmrt_status st = vmmrt__drv_check_caller("cuStreamEndCapture");
	if (st != VMMRT_OK)
		return st;
	if ((st = enter(rt, "cuStreamEndCapture")) != VMMRT_OK) {
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

vmmrt_status vmmrt__drv_stream_is_capturing(vmmrt_runtime *rt, vmmrt_stream s, bool *out)
{
	PLAIN(rt, "cuStreamIsCapturing", rt->ops->stream_is_capturing(rt->be, s, out));
}

vmmrt_status vmmrt__drv_graph_launch(vmmrt_runtime *rt, vmmrt__bgraph *g, vmmrt_stream s)
{
	PLAIN(rt, "cuGraphLaunch", rt->ops->graph_launch(rt->be, g, s));
}

vmmrt_status vmmrt__drv_graph_destroy(vmmrt_runtime *rt, vmmrt__bgraph *g)
{
	PLAIN(rt, "cuGraphExecDestroy", rt->ops->graph_destroy(rt->be, g));
}

vmmrt_status vmmrt__drv_kernel(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__kernel_id k, const vmmrt__kernel_args *a)
{
	PLAIN(rt, "cuLaunchKernel", rt->ops->kernel_launch(rt->be, s, k, a));
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
	size_t n = total < VMMRT_CALL_SAMPLES ? (size_t)total : VMMRT_CALL_SAMPLES;
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
	VMMRT_CHECK_ARG(rt && out, "NULL argument");
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
	VMMRT_CHECK_ARG(rt, "runtime is NULL");
	vmmrt__drv_reset_stats(rt);
	return VMMRT_OK;
}

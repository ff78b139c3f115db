/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The runtime's only door to the backend. Every driver operation the runtime
 * makes goes through these wrappers, which enforce the thread rules (no driver
 * call inside a host function; VMM create/map/set-access/unmap/release only on
 * a driver worker in checked mode), count blocking calls on the launch thread,
 * time the VMM calls per type for the statistics and the trace, and offer the
 * hook where faults are injected.
 */
#ifndef VMMRT_DRIVER_H
#define VMMRT_DRIVER_H

#include "backend/backend.h"

typedef struct vmmrt_runtime vmmrt_runtime;

/* The VMM call types that are timed (driver_call_us_p99 and friends). */
typedef enum vmmrt__drv_call {
	VMMRT_CALL_CREATE = 0,
	VMMRT_CALL_MAP,
	VMMRT_CALL_SET_ACCESS,
	VMMRT_CALL_UNMAP,
	VMMRT_CALL_RELEASE,
	VMMRT_CALL_COUNT_
} vmmrt__drv_call;

const char *vmmrt__drv_call_name(vmmrt__drv_call c);

/*
 * Fault injection: when a hook is set (src/testing.c, which only tests and
 * the torture link), it is consulted before each driver op; a non-OK return
 * makes the op fail with that status without calling the backend, and a
 * non-zero *delay_us sleeps first (latency spikes).
 */
typedef vmmrt_status (*vmmrt__fault_fn)(void *ctx, const char *op, uint64_t *delay_us);
struct vmmrt__fault_hook {
	vmmrt__fault_fn fn;
	void *ctx;
	struct vmmrt__fault_hook *next; /* every hook ever set, freed at destroy */
};
/* Runtime teardown, once no driver call can run: free every hook ever set. */
void vmmrt__drv_free_fault_hooks(vmmrt_runtime *rt);

/* VMM */
vmmrt_status vmmrt__drv_va_reserve(vmmrt_runtime *rt, size_t size, vmmrt_devptr *out);
vmmrt_status vmmrt__drv_va_free(vmmrt_runtime *rt, vmmrt_devptr va, size_t size);
vmmrt_status vmmrt__drv_mem_create(vmmrt_runtime *rt, size_t size, vmmrt__bhandle *out);
vmmrt_status vmmrt__drv_mem_release(vmmrt_runtime *rt, vmmrt__bhandle h);
vmmrt_status vmmrt__drv_mem_map(vmmrt_runtime *rt, vmmrt_devptr va, size_t size, vmmrt__bhandle h);
vmmrt_status vmmrt__drv_mem_unmap(vmmrt_runtime *rt, vmmrt_devptr va, size_t size);
vmmrt_status vmmrt__drv_mem_set_access(vmmrt_runtime *rt, vmmrt_devptr va, size_t size);
vmmrt_status vmmrt__drv_mem_info(vmmrt_runtime *rt, size_t *free_bytes, size_t *total_bytes);

/* streams, events, copies: async ones are fine on the launch thread */
vmmrt_status vmmrt__drv_stream_create(vmmrt_runtime *rt, vmmrt_stream *out);
vmmrt_status vmmrt__drv_stream_destroy(vmmrt_runtime *rt, vmmrt_stream s);
vmmrt_status vmmrt__drv_stream_synchronize(vmmrt_runtime *rt, vmmrt_stream s); /* blocking */
vmmrt_status vmmrt__drv_stream_wait_event(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bevent *e);
vmmrt_status vmmrt__drv_stream_wait_value32(vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr addr, uint32_t v);
vmmrt_status vmmrt__drv_stream_write_value32(vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr addr, uint32_t v);
vmmrt_status vmmrt__drv_event_create(vmmrt_runtime *rt, bool timing, vmmrt__bevent **out);
vmmrt_status vmmrt__drv_event_destroy(vmmrt_runtime *rt, vmmrt__bevent *e);
vmmrt_status vmmrt__drv_event_record(vmmrt_runtime *rt, vmmrt__bevent *e, vmmrt_stream s);
/* *done: whether the event's last record (or all of the stream's work) finished. */
vmmrt_status vmmrt__drv_event_query(vmmrt_runtime *rt, vmmrt__bevent *e, bool *done);
vmmrt_status vmmrt__drv_stream_query(vmmrt_runtime *rt, vmmrt_stream s, bool *done);
vmmrt_status vmmrt__drv_event_synchronize(vmmrt_runtime *rt, vmmrt__bevent *e); /* blocking */
vmmrt_status vmmrt__drv_event_elapsed_ms(vmmrt_runtime *rt, vmmrt__bevent *a, vmmrt__bevent *b, float *ms);
vmmrt_status vmmrt__drv_launch_host_func(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__host_fn fn, void *arg);
vmmrt_status vmmrt__drv_memcpy_htod_async(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t n, vmmrt_stream s);
vmmrt_status vmmrt__drv_memcpy_dtoh_async(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s);
vmmrt_status vmmrt__drv_memcpy_dtod_async(vmmrt_runtime *rt, vmmrt_devptr dst, vmmrt_devptr src, size_t n, vmmrt_stream s);
vmmrt_status vmmrt__drv_host_alloc(vmmrt_runtime *rt, size_t size, void **out);
vmmrt_status vmmrt__drv_host_free(vmmrt_runtime *rt, void *p);
vmmrt_status vmmrt__drv_host_devptr(vmmrt_runtime *rt, void *p, vmmrt_devptr *out);
vmmrt_status vmmrt__drv_begin_capture(vmmrt_runtime *rt, vmmrt_stream s);
vmmrt_status vmmrt__drv_end_capture(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bgraph **out);
/* *out: whether work enqueued on s now would be captured instead of run. */
vmmrt_status vmmrt__drv_stream_is_capturing(vmmrt_runtime *rt, vmmrt_stream s, bool *out);
vmmrt_status vmmrt__drv_graph_launch(vmmrt_runtime *rt, vmmrt__bgraph *g, vmmrt_stream s);
vmmrt_status vmmrt__drv_graph_destroy(vmmrt_runtime *rt, vmmrt__bgraph *g);
vmmrt_status vmmrt__drv_kernel(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__kernel_id k, const vmmrt__kernel_args *a);

/* Public entry guard: VMMRT_E_NOT_PERMITTED inside a host function. */
vmmrt_status vmmrt__drv_check_caller(const char *api);

/* Latency percentiles of one VMM call type, in microseconds (0 when no samples). */
typedef struct vmmrt__call_stats {
	uint64_t count;
	double p50_us, p99_us, max_us;
} vmmrt__call_stats;
void vmmrt__drv_call_stats(vmmrt_runtime *rt, vmmrt__drv_call c, vmmrt__call_stats *out);
void vmmrt__drv_reset_stats(vmmrt_runtime *rt);
/* Blocking calls (stream/event synchronize) made by application threads. */
uint64_t vmmrt__drv_launch_thread_blocking(vmmrt_runtime *rt);

#endif

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The runtime's only door to the backend. Every driver operation the runtime
 * makes goes through these wrappers, which enforce the thread rules (no driver
 * call inside a host function; VMM create/map/set-access/unmap/release only on
 * a driver worker in checked mode), count blocking calls on the launch thread,
 * time the VMM calls per type for the statistics and the trace, and offer the
 * hook where faults are injected.
 */
#ifndef VMMRT__DRIVER_H
#define VMMRT__DRIVER_H

#include "backend/backend.h"

typedef struct vmmrt_runtime vmmrt_runtime;

/* The VMM calls that are timed, in vmmrt_driver_stats's order: VMMRT_CALL_mem_create, ... */
typedef enum vmmrt__drv_call {
#define VMMRT__CALL_ENUM_X(op, door, call, params, args)
#define VMMRT__CALL_ENUM_T(op, call, params, args, bytes) VMMRT_CALL_##op,
	VMMRT__BACKEND_OPS(VMMRT__CALL_ENUM_X, VMMRT__CALL_ENUM_T)
#undef VMMRT__CALL_ENUM_X
#undef VMMRT__CALL_ENUM_T
	VMMRT_CALL_COUNT_
} vmmrt__drv_call;
_Static_assert(VMMRT_CALL_COUNT_ == VMMRT_DRIVER_CALLS, "the timed calls of backend-ops.h are vmmrt.h's driver calls");

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

/*
 * The opened device: open it with a backend's ops (rt->be_cfg), then read
 * what the runtime keeps of it (granularity, name), make the stream of the
 * synchronous helpers and warm the driver's callback thread; close undoes it.
 * The runtime's own calls, made before any fault hook can be set and after
 * the last: none is checked, counted or hooked.
 */
vmmrt_status vmmrt__drv_open(vmmrt_runtime *rt, const vmmrt__backend_ops *ops);
vmmrt_status vmmrt__drv_setup(vmmrt_runtime *rt);
void vmmrt__drv_close(vmmrt_runtime *rt);

/*
 * A backend taken from a runtime being destroyed by whoever still holds
 * memory it allocated (the arena's fallback segments, src/arena.c): the
 * runtime's close leaves it open, and the holder frees through it and closes
 * it after its last free. Only these two calls remain: no runtime, so no
 * fault hook; the host-function rule still holds.
 */
typedef struct vmmrt__drv_detached {
	const vmmrt__backend_ops *ops;
	vmmrt__backend *be;
} vmmrt__drv_detached;
/* The runtime's own stream goes; rt keeps no backend (vmmrt__drv_close closes nothing). */
void vmmrt__drv_detach(vmmrt_runtime *rt, vmmrt__drv_detached *out);
vmmrt_status vmmrt__drv_detached_mem_free(vmmrt__drv_detached *d, vmmrt_devptr p);
void vmmrt__drv_detached_close(vmmrt__drv_detached *d);

/* Every operation of backend-ops.h with a wrapper: vmmrt__drv_<op>(rt, its parameters). */
#define VMMRT__DRV_PROTO(op, door, call, params, args) VMMRT__DRV_PROTO_##door(op, params)
#define VMMRT__DRV_PROTO_T(op, call, params, args, bytes) VMMRT__DRV_PROTO_PLAIN(op, params)
#define VMMRT__DRV_PROTO_PLAIN(op, params) vmmrt_status vmmrt__drv_##op(vmmrt_runtime *rt VMMRT__LIST params);
#define VMMRT__DRV_PROTO_RAW VMMRT__DRV_PROTO_PLAIN
#define VMMRT__DRV_PROTO_BLOCKING VMMRT__DRV_PROTO_PLAIN
#define VMMRT__DRV_PROTO_OWN(op, params)
#define VMMRT__DRV_PROTO_NONE(op, params)
VMMRT__BACKEND_OPS(VMMRT__DRV_PROTO, VMMRT__DRV_PROTO_T)
#undef VMMRT__DRV_PROTO
#undef VMMRT__DRV_PROTO_T
#undef VMMRT__DRV_PROTO_PLAIN
#undef VMMRT__DRV_PROTO_RAW
#undef VMMRT__DRV_PROTO_BLOCKING
#undef VMMRT__DRV_PROTO_OWN
#undef VMMRT__DRV_PROTO_NONE

/* The OWN ones. A reservation is aligned to the granularity, and counted live. */
vmmrt_status vmmrt__drv_va_reserve(vmmrt_runtime *rt, size_t size, vmmrt_devptr *out);
vmmrt_status vmmrt__drv_va_free(vmmrt_runtime *rt, vmmrt_devptr va, size_t size);
/* An injected failure ends the capture too (as cuStreamEndCapture's own failures do). */
vmmrt_status vmmrt__drv_stream_end_capture(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__bgraph **out);

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

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The backend ops table: the only interface through which libvmmrt talks to a
 * driver. Two implementations: "cuda" (libcuda.so.1, loaded at run time) and
 * "host" (a GPU emulated on host memory, so everything runs without a GPU).
 *
 * Nothing outside src/backend/ includes a driver header or calls a driver.
 * The runtime never calls these ops directly either: it goes through
 * src/driver.c, which adds the thread rules, fault injection and statistics.
 *
 * Semantics follow the CUDA driver API: every op returns a vmmrt_status and
 * leaves a message with vmmrt__error() (src/error.h) on failure; async ops are ordered
 * per stream; an event wait waits for the event's most recent record at the
 * time the wait was enqueued; a host function runs on a driver thread and may
 * not call any op (those return VMMRT_E_NOT_PERMITTED).
 */
#ifndef VMMRT__BACKEND_H
#define VMMRT__BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend-ops.h"
#include "pattern.h"
#include "vmmrt.h"

typedef struct vmmrt__backend vmmrt__backend;  /* one opened device */
typedef struct vmmrt__bevent vmmrt__bevent;    /* CUevent */
typedef struct vmmrt__bgraph vmmrt__bgraph;    /* CUgraphExec (+ its CUgraph) */
typedef uint64_t vmmrt__bhandle;              /* CUmemGenericAllocationHandle */

typedef void (*vmmrt__host_fn)(void *arg);

/* NULL, VMMRT_STREAM_LEGACY and VMMRT_STREAM_PER_THREAD: the driver's default streams. */
#define VMMRT__IS_DEFAULT_STREAM(s) \
	((s) == NULL || (s) == VMMRT_STREAM_LEGACY || (s) == VMMRT_STREAM_PER_THREAD)

/* The built-in kernels. Both backends produce the same bytes. */
typedef enum vmmrt__kernel_id {
	/* dst[i] = vmmrt_fill_word(seed, i) for each 8-byte word i < bytes/8 */
	VMMRT_KERNEL_FILL = 0,
	/* *(uint64_t *)out = vmmrt_checksum_host(src, bytes) (bytes % 8 == 0) */
	VMMRT_KERNEL_CHECKSUM,
	/* occupy the device for ns nanoseconds (one block spinning on the clock) */
	VMMRT_KERNEL_BUSY,
	/*
	 * A layer-like workload: reads src (bytes), writes dst (bytes) with
	 * dst[i] = src[i] ^ vmmrt_fill_word(seed, i), and lasts at least ns.
	 * src == 0 means "no input": dst[i] = vmmrt_fill_word(seed, i).
	 */
	VMMRT_KERNEL_LAYER,
	VMMRT_KERNEL_COUNT_
} vmmrt__kernel_id;

typedef struct vmmrt__kernel_args {
	vmmrt_devptr dst;
	vmmrt_devptr src;
	vmmrt_devptr out;
	size_t bytes;
	uint64_t seed;
	uint64_t ns;
} vmmrt__kernel_args;

/* Backend-specific settings, filled from the runtime's options. */
typedef struct vmmrt__backend_config {
	int device_ordinal;
	/* host backend only */
	size_t host_capacity;     /* emulated device memory in bytes */
	size_t host_granularity;  /* emulated VMM granularity in bytes */
	bool host_latency;        /* model the H200's driver-call and copy costs */
	double host_copy_gbps;    /* modelled pinned copy bandwidth when host_latency */
} vmmrt__backend_config;

typedef struct vmmrt__backend_ops {
	const char *name;

	/* Open the device; VMMRT_E_NO_DEVICE when there is none. */
	vmmrt_status (*open)(const vmmrt__backend_config *cfg, vmmrt__backend **out);
	void (*close)(vmmrt__backend *b);

	/* Every operation on an open device, from the one list (backend-ops.h). */
#define VMMRT__OP_FIELD(op, door, call, params, args) vmmrt_status (*op)(vmmrt__backend *b VMMRT__LIST params);
#define VMMRT__OP_FIELD_T(op, call, params, args, bytes) VMMRT__OP_FIELD(op, VMM, call, params, args)
	VMMRT__BACKEND_OPS(VMMRT__OP_FIELD, VMMRT__OP_FIELD_T)
#undef VMMRT__OP_FIELD
#undef VMMRT__OP_FIELD_T
} vmmrt__backend_ops;

extern const vmmrt__backend_ops vmmrt__backend_host;
extern const vmmrt__backend_ops vmmrt__backend_cuda;

/* Host backend only, for tests: cuMemSetAccess calls that began while a D2H
 * copy ran (the H200 makes those ten times slower). */
unsigned long vmmrt__host_set_access_beside_d2h(vmmrt__backend *b);
/* Host backend only, for tests: the most device memory created at once since
 * the last reset (which restarts it from what is created now). */
size_t vmmrt__host_created_peak(vmmrt__backend *b, bool reset);

/*
 * Thread role, set by the runtime's own threads and host-function trampolines.
 * The host backend sets VMMRT_ROLE_HOST_FUNC while it runs any host function,
 * like the CUDA driver does for its callback thread.
 */
typedef enum vmmrt__thread_role {
	VMMRT_ROLE_APP = 0,   /* an application thread (the launch thread) */
	VMMRT_ROLE_WORKER,    /* a libvmmrt driver worker */
	VMMRT_ROLE_HOST_FUNC, /* inside a host function */
} vmmrt__thread_role;

vmmrt__thread_role vmmrt__thread_role_get(void);
vmmrt__thread_role vmmrt__thread_role_set(vmmrt__thread_role role); /* returns the previous one */

#endif /* VMMRT__BACKEND_H */

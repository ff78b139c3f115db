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
 * leaves a message with vmmrt__set_error() on failure; async ops are ordered
 * per stream; an event wait waits for the event's most recent record at the
 * time the wait was enqueued; a host function runs on a driver thread and may
 * not call any op (those return VMMRT_E_NOT_PERMITTED).
 */
#ifndef VMMRT_BACKEND_H
#define VMMRT_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
	vmmrt_status (*device_name)(vmmrt__backend *b, char *buf, size_t len);
	/* Make the backend's context current on the calling thread (workers call this). */
	vmmrt_status (*bind_thread)(vmmrt__backend *b);

	/* --- virtual memory management */
	vmmrt_status (*granularity)(vmmrt__backend *b, size_t *out);
	vmmrt_status (*va_reserve)(vmmrt__backend *b, size_t size, size_t align, vmmrt_devptr *out);
	vmmrt_status (*va_free)(vmmrt__backend *b, vmmrt_devptr va, size_t size);
	vmmrt_status (*mem_create)(vmmrt__backend *b, size_t size, vmmrt__bhandle *out);
	vmmrt_status (*mem_release)(vmmrt__backend *b, vmmrt__bhandle h);
	vmmrt_status (*mem_map)(vmmrt__backend *b, vmmrt_devptr va, size_t size, vmmrt__bhandle h);
	vmmrt_status (*mem_unmap)(vmmrt__backend *b, vmmrt_devptr va, size_t size);
	/* read/write access for the device (and, on the host backend, the CPU). */
	vmmrt_status (*mem_set_access)(vmmrt__backend *b, vmmrt_devptr va, size_t size);
	vmmrt_status (*mem_info)(vmmrt__backend *b, size_t *free_bytes, size_t *total_bytes);

	/* --- streams and events */
	vmmrt_status (*stream_create)(vmmrt__backend *b, vmmrt_stream *out);
	vmmrt_status (*stream_destroy)(vmmrt__backend *b, vmmrt_stream s);
	vmmrt_status (*stream_synchronize)(vmmrt__backend *b, vmmrt_stream s);
	/* *done: whether all its work has finished. Not finished is an answer, not
	 * an error: a poll on the hot path formats no message. */
	vmmrt_status (*stream_query)(vmmrt__backend *b, vmmrt_stream s, bool *done);
	vmmrt_status (*stream_wait_event)(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e);
	/* Stream memory operations on a 32-bit word (host-pinned via host_devptr, or device). */
	vmmrt_status (*stream_wait_value32)(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value);
	vmmrt_status (*stream_write_value32)(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value);
	/* timing: events that can be used with event_elapsed */
	vmmrt_status (*event_create)(vmmrt__backend *b, bool timing, vmmrt__bevent **out);
	vmmrt_status (*event_destroy)(vmmrt__backend *b, vmmrt__bevent *e);
	vmmrt_status (*event_record)(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s);
	/* *done: whether its most recent record completed (true if never recorded). */
	vmmrt_status (*event_query)(vmmrt__backend *b, vmmrt__bevent *e, bool *done);
	vmmrt_status (*event_synchronize)(vmmrt__backend *b, vmmrt__bevent *e);
	vmmrt_status (*event_elapsed_ms)(vmmrt__backend *b, vmmrt__bevent *start, vmmrt__bevent *end, float *ms);
	vmmrt_status (*launch_host_func)(vmmrt__backend *b, vmmrt_stream s, vmmrt__host_fn fn, void *arg);

	/* --- copies (host side must be pinned for the async ones to overlap) */
	vmmrt_status (*memcpy_htod_async)(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n, vmmrt_stream s);
	vmmrt_status (*memcpy_dtoh_async)(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s);
	vmmrt_status (*memcpy_dtod_async)(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n, vmmrt_stream s);

	/* --- pinned host memory, visible to the device at host_devptr() */
	vmmrt_status (*host_alloc)(vmmrt__backend *b, size_t size, void **out);
	vmmrt_status (*host_free)(vmmrt__backend *b, void *p);
	vmmrt_status (*host_devptr)(vmmrt__backend *b, void *p, vmmrt_devptr *out);

	/* --- graphs: capture a stream's work, instantiate, replay */
	vmmrt_status (*stream_begin_capture)(vmmrt__backend *b, vmmrt_stream s);
	vmmrt_status (*stream_end_capture)(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out);
	/*
	 * *out = whether s is capturing: work enqueued on it now would go into a
	 * graph instead of running (a capture the driver has invalidated counts
	 * too: it stays capturing until ended).
	 */
	vmmrt_status (*stream_is_capturing)(vmmrt__backend *b, vmmrt_stream s, bool *out);
	vmmrt_status (*graph_launch)(vmmrt__backend *b, vmmrt__bgraph *g, vmmrt_stream s);
	vmmrt_status (*graph_destroy)(vmmrt__backend *b, vmmrt__bgraph *g);

	/* --- built-in kernels */
	vmmrt_status (*kernel_launch)(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k, const vmmrt__kernel_args *args);
} vmmrt__backend_ops;

extern const vmmrt__backend_ops vmmrt__backend_host;
extern const vmmrt__backend_ops vmmrt__backend_cuda;

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

/*
 * The kernels' byte patterns, the same on every backend:
 *   fill word i  = vmmrt__mix64(seed + VMMRT_GOLDEN * (i + 1))
 *   checksum     = sum over 8-byte words w_i of vmmrt__mix64(w_i + VMMRT_CKSUM_K * (i + 1)),
 *                  modulo 2^64 (order-free, so a device reduction may add in any order;
 *                  position-dependent, so swapped words are caught)
 */
#define VMMRT_GOLDEN 0x9E3779B97F4A7C15ULL
#define VMMRT_CKSUM_K 0xD1B54A32D192ED03ULL

static inline uint64_t vmmrt__mix64(uint64_t x)
{
	/* splitmix64 finalizer: cheap, and any bit flip changes the output. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}


#endif /* VMMRT_BACKEND_H */

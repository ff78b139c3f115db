/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's shared state: a GPU emulated on host memory.
 *
 * host.c owns the device (open/close), virtual memory (reservations, memfd
 * handles, mappings), pinned host memory and the latency model; host-stream.c
 * owns streams, events, graphs, copies and kernels. Nothing else includes this.
 *
 * Lock order (outer first): obj_lock -> stream lock -> sync_lock.
 * vmm_lock is never held together with any of the others.
 */
#ifndef VMMRT_HOST_INTERNAL_H
#define VMMRT_HOST_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <urcu/list.h>

#include "backend/backend.h"

/*
 * Internal symbols carry the vmmrt_ prefix like the rest of the library but
 * are hidden, so the shared library's export regex never lets them out.
 */
#define VMMRT_HOST_HIDDEN __attribute__((visibility("hidden")))

struct vmmrt__backend {
	vmmrt__backend_config cfg;
	size_t granularity;

	/* Virtual memory: reservations, handles, mappings, accounting. */
	pthread_mutex_t vmm_lock;
	struct cds_list_head reservations;
	struct cds_list_head handles;
	struct cds_list_head mappings;
	size_t created_bytes;

	/* Registries, so that a stale or bogus object is an error, not a crash. */
	pthread_mutex_t obj_lock;
	struct cds_list_head streams;
	/* What NULL, VMMRT_STREAM_LEGACY and VMMRT_STREAM_PER_THREAD name here:
	 * one ordinary stream made with the device (this backend has no implicit
	 * synchronization between streams to emulate). Set once at open. */
	struct vmmrt_stream_s *default_stream;
	struct cds_list_head events;
	struct cds_list_head graphs;
	struct cds_list_head host_allocs;

	/*
	 * Everything a stream thread may block on (event records, 32-bit values,
	 * shutdown) is signalled through one condition variable: there are few
	 * streams, and one place to wake keeps close() simple.
	 */
	pthread_mutex_t sync_lock;
	pthread_cond_t sync_cond;   /* CLOCK_MONOTONIC */
	bool closing;               /* under sync_lock; also read with uatomic_read */

	unsigned long copies_in_flight; /* uatomic: feeds the latency model */
};

/* NOT_PERMITTED inside a host function, INVALID_ARGUMENT for a NULL backend. */
vmmrt_status vmmrt__host_enter(vmmrt__backend *b, const char *func) VMMRT_HOST_HIDDEN;

uint64_t vmmrt__host_now_ns(void) VMMRT_HOST_HIDDEN;
/* Sleep until CLOCK_MONOTONIC reaches deadline_ns, spinning the last microseconds. */
void vmmrt__host_sleep_until(uint64_t deadline_ns) VMMRT_HOST_HIDDEN;

/* host-stream.c: stop every stream thread and free streams, events and graphs. */
void vmmrt__host_streams_shutdown(vmmrt__backend *b) VMMRT_HOST_HIDDEN;

vmmrt_status vmmrt__host_stream_create(vmmrt__backend *b, vmmrt_stream *out) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_destroy(vmmrt__backend *b, vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_synchronize(vmmrt__backend *b, vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_query(vmmrt__backend *b, vmmrt_stream s, bool *done) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_wait_event(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_wait_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr,
					    uint32_t value) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_write_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr,
					     uint32_t value) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_create(vmmrt__backend *b, bool timing, vmmrt__bevent **out) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_destroy(vmmrt__backend *b, vmmrt__bevent *e) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_record(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_query(vmmrt__backend *b, vmmrt__bevent *e, bool *done) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_synchronize(vmmrt__backend *b, vmmrt__bevent *e) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_event_elapsed_ms(vmmrt__backend *b, vmmrt__bevent *start, vmmrt__bevent *end,
					 float *ms) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_launch_host_func(vmmrt__backend *b, vmmrt_stream s, vmmrt__host_fn fn,
					 void *arg) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_memcpy_htod_async(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n,
					  vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_memcpy_dtoh_async(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n,
					  vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_memcpy_dtod_async(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n,
					  vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_begin_capture(vmmrt__backend *b, vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_end_capture(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_stream_is_capturing(vmmrt__backend *b, vmmrt_stream s, bool *out) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_graph_launch(vmmrt__backend *b, vmmrt__bgraph *g, vmmrt_stream s) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_graph_destroy(vmmrt__backend *b, vmmrt__bgraph *g) VMMRT_HOST_HIDDEN;
vmmrt_status vmmrt__host_kernel_launch(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k,
				      const vmmrt__kernel_args *args) VMMRT_HOST_HIDDEN;

#endif /* VMMRT_HOST_INTERNAL_H */

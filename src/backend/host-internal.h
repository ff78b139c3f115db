/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's shared state: a GPU emulated on host memory. Its files,
 * what each holds and which calls which: src/README (layers 4 to 7).
 * Nothing else includes this.
 *
 * Lock order (outer first): obj_lock -> stream lock -> sync_lock.
 * vmm_lock is never held together with any of the others.
 */
#ifndef VMMRT__HOST_INTERNAL_H
#define VMMRT__HOST_INTERNAL_H

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
#define VMMRT__HOST_HIDDEN __attribute__((visibility("hidden")))

struct vmmrt__backend {
	vmmrt__backend_config cfg;
	size_t granularity;

	/* Virtual memory: reservations, handles, mappings, accounting. */
	pthread_mutex_t vmm_lock;
	struct cds_list_head reservations;
	struct cds_list_head handles;
	struct cds_list_head mappings;
	size_t created_bytes;
	size_t created_peak;       /* the most created_bytes since open or the last reset (tests) */

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
	struct cds_list_head plain_allocs; /* mem_alloc's device memory (counted in created_bytes) */

	/*
	 * Everything a stream thread may block on (event records, 32-bit values,
	 * shutdown) is signalled through one condition variable: there are few
	 * streams, and one place to wake keeps close() simple.
	 */
	pthread_mutex_t sync_lock;
	pthread_cond_t sync_cond;   /* CLOCK_MONOTONIC */
	bool closing;               /* under sync_lock; also read with uatomic_read */

	unsigned long copies_in_flight; /* uatomic: feeds the latency model */
	unsigned long d2h_in_flight;    /* uatomic: the D2H copies among them */
	unsigned long set_access_beside_d2h; /* uatomic: cuMemSetAccess calls begun while a D2H ran */
};

/* host-registry.c: NOT_PERMITTED inside a host function, INVALID_ARGUMENT for a NULL backend. */
vmmrt_status vmmrt__host_enter(vmmrt__backend *b, const char *func) VMMRT__HOST_HIDDEN;

/*
 * host-registry.c: the registries. A kind of object: its list in the
 * backend, how a handle finds its object, how destroy releases one.
 */
typedef struct vmmrt__host_kind {
	/* The error for a handle that is not registered, given the caller's
	 * name and the handle: "%s: unknown event %p". */
	const char *unknown;
	size_t list; /* offsetof(vmmrt__backend, the kind's list) */
	/* NULL: the handle is the object, whose list node comes first. */
	bool (*match)(const struct cds_list_head *node, const void *key);
	/* What destroy does with the object once it is off the list (no lock held). */
	void (*release)(vmmrt__backend *b, struct cds_list_head *node);
} vmmrt__host_kind;

void vmmrt__host_register(vmmrt__backend *b, const vmmrt__host_kind *k, struct cds_list_head *node) VMMRT__HOST_HIDDEN;
/* The registered object of key, or NULL. Caller holds obj_lock. */
struct cds_list_head *vmmrt__host_lookup(vmmrt__backend *b, const vmmrt__host_kind *k,
					 const void *key) VMMRT__HOST_HIDDEN;
/* A destroy op: the prologue, then find, unlink and release; k->unknown if
 * key is not registered. */
vmmrt_status vmmrt__host_destroy(vmmrt__backend *b, const vmmrt__host_kind *k, const void *key,
				 const char *func) VMMRT__HOST_HIDDEN;
/* Close: unlink and release every object of the kind, one at a time. */
void vmmrt__host_unregister_all(vmmrt__backend *b, const vmmrt__host_kind *k) VMMRT__HOST_HIDDEN;


/* ------------------------------------------------------------ streams' work */

enum vmmrt__host_op_kind {
	OP_COPY,
	OP_KERNEL,
	OP_HOST_FN,
	OP_RECORD,
	OP_WAIT_EVENT,
	OP_WAIT_VALUE,
	OP_WRITE_VALUE,
	OP_GRAPH,
};

/* One operation as enqueued or captured. Holds a reference on its event or graph. */
struct host_op {
	enum vmmrt__host_op_kind kind;
	union {
		struct {
			void *dst;
			const void *src;
			size_t n;
			bool d2h;
		} copy;
		struct {
			vmmrt__kernel_id id;
			vmmrt__kernel_args args;
		} kernel;
		struct {
			vmmrt__host_fn fn;
			void *arg;
		} host;
		vmmrt__bevent *event;
		struct {
			uint32_t *addr;
			uint32_t value;
		} value;
		vmmrt__bgraph *graph;
	} u;
};

struct host_item {
	struct host_item *next;
	struct host_op op;
	uint64_t seq;   /* record / wait: the record this item completes or waits for */
	uint64_t *seqs; /* graph launch: one per event op of the graph, fixed at enqueue */
};

struct vmmrt_stream_s {
	struct cds_list_head node;
	vmmrt__backend *b;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work_cond; /* new work, or stop */
	pthread_cond_t idle_cond; /* an item completed */
	struct host_item *head, *tail;
	uint64_t enqueued, completed;
	bool stop;
	bool capturing;
	struct host_op *cap_ops;
	size_t cap_n, cap_len;
};

struct vmmrt__bevent {
	struct cds_list_head node;
	long refs; /* uatomic: the registry, pending items, graphs */
	bool timing;
	/* under b->sync_lock */
	uint64_t record_seq; /* most recent record enqueued; 0: never recorded */
	uint64_t done_seq;   /* highest record completed */
	uint64_t done_ns;    /* CLOCK_MONOTONIC when done_seq completed */
};

struct vmmrt__bgraph {
	struct cds_list_head node;
	long refs; /* uatomic: the registry (the caller's handle) and pending launches */
	size_t n;
	struct host_op *ops;
	size_t n_event_ops;
};

/* host-exec.c: the references queued and captured work holds, and the stream thread. */
void vmmrt__host_event_put(vmmrt__bevent *e) VMMRT__HOST_HIDDEN;
void vmmrt__host_graph_put(vmmrt__bgraph *g) VMMRT__HOST_HIDDEN;
void vmmrt__host_op_release(const struct host_op *op) VMMRT__HOST_HIDDEN;
bool vmmrt__host_is_event_op(const struct host_op *op) VMMRT__HOST_HIDDEN;
void vmmrt__host_run_item(vmmrt__backend *b, const struct host_item *item) VMMRT__HOST_HIDDEN;
void vmmrt__host_item_free(struct host_item *item) VMMRT__HOST_HIDDEN;
void *vmmrt__host_stream_main(void *arg) VMMRT__HOST_HIDDEN;

/* host-stream.c: the registries of events and graphs (streams are its own). */
extern const vmmrt__host_kind vmmrt__host_events_kind VMMRT__HOST_HIDDEN;
extern const vmmrt__host_kind vmmrt__host_graphs_kind VMMRT__HOST_HIDDEN;
/* A known stream, returned locked (NULL: unknown). */
struct vmmrt_stream_s *vmmrt__host_stream_lock(vmmrt__backend *b, vmmrt_stream s) VMMRT__HOST_HIDDEN;
vmmrt_status vmmrt__host_unknown_stream(vmmrt_stream s, const char *func) VMMRT__HOST_HIDDEN;
/* A reference on a registered event, taken under obj_lock so a concurrent destroy cannot free it. */
vmmrt_status vmmrt__host_event_ref(vmmrt__backend *b, vmmrt__bevent *e, const char *func) VMMRT__HOST_HIDDEN;
/* An event's record or wait, enqueued on s (func: the op, for messages). */
vmmrt_status vmmrt__host_event_op(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e,
				  enum vmmrt__host_op_kind kind, const char *func) VMMRT__HOST_HIDDEN;
/* Enqueue op on stream s, or record it when s is capturing. Takes over the
 * reference op holds, also on failure. */
vmmrt_status vmmrt__host_submit(vmmrt__backend *b, vmmrt_stream s, const struct host_op *op,
				const char *func) VMMRT__HOST_HIDDEN;

/* host-stream.c: wait until every stream has run what was enqueued on it
 * before the call (cuCtxSynchronize; what cuMemFreeHost does first). */
vmmrt_status vmmrt__host_streams_synchronize(vmmrt__backend *b, const char *func) VMMRT__HOST_HIDDEN;
/* host-stream.c: stop every stream thread and free streams, events and graphs. */
void vmmrt__host_streams_shutdown(vmmrt__backend *b) VMMRT__HOST_HIDDEN;

/* host-vmm.c: at close, free every mapping, reservation and handle. */
void vmmrt__host_vmm_close(vmmrt__backend *b) VMMRT__HOST_HIDDEN;

/* Every operation of backend-ops.h: vmmrt__host_<op> (host.c: the device,
 * pinned memory; host-vmm.c: VMM; host-graph.c: events and graphs;
 * host-stream.c: the rest). */
#define VMMRT__OP_PREFIX vmmrt__host_
VMMRT__BACKEND_DECLS

#endif /* VMMRT__HOST_INTERNAL_H */

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * libvmmrt: fixed-address GPU activation offload for CUDA Graphs.
 *
 * A CUDA Graph records raw device addresses; CPU activation offload wants the
 * memory behind an activation gone between forward and backward. libvmmrt keeps
 * every activation at a fixed virtual address (a VMM reservation) and swaps what
 * is mapped behind it outside graph replay, either by alternating two resident
 * banks (ping-pong) or by releasing and re-creating the physical memory (remap)
 * on resident driver-worker threads.
 *
 * Conventions:
 *  - every call returns a vmmrt_status; VMMRT_OK is 0. On failure a message
 *    naming the cause is kept per thread: vmmrt_last_error().
 *  - handles are opaque; NULL handles are VMMRT_E_INVALID_ARGUMENT, never a crash.
 *  - nothing that can reach the driver may run inside a host function (a CUDA
 *    host callback): such calls fail with VMMRT_E_NOT_PERMITTED. Accessors
 *    and option calls touch no driver and are allowed anywhere.
 *  - the library never exits or aborts the process.
 *  - a call that succeeds leaves vmmrt_last_error() empty.
 *  - structs the library fills (vmmrt_runtime_info, vmmrt_driver_stats,
 *    vmmrt_offload_stats, vmmrt_option_info, vmmrt_arena_stats) start with a size the caller
 *    sets to sizeof(the struct) before the call, so they can grow without
 *    breaking programs built against an older header: the library fills what
 *    fits in that size and zeroes what it does not know. A size smaller than
 *    the first release of the struct is VMMRT_E_INVALID_SIZE.
 *
 * See vmmrt(7) for the whole picture and the option table.
 */
#ifndef VMMRT_H
#define VMMRT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t: the arena's calls are PyTorch's allocator signatures */

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The library is built with hidden visibility: what this header declares with
 * VMMRT_EXTERN is its whole ABI, and nothing else is exported.
 */
#if defined(__GNUC__)
#define VMMRT_EXTERN __attribute__((visibility("default"))) extern
#else
#define VMMRT_EXTERN extern
#endif

/* The version of this header; vmmrt_version() gives the library's. */
#define VMMRT_VERSION_MAJOR 0
#define VMMRT_VERSION_MINOR 2
#define VMMRT_VERSION_PATCH 0
#define VMMRT_VERSION_HEX ((VMMRT_VERSION_MAJOR << 16) | (VMMRT_VERSION_MINOR << 8) | VMMRT_VERSION_PATCH)

/* The library's version, as VMMRT_VERSION_HEX (0x000200 for 0.2.0) and as text ("0.2.0"). */
VMMRT_EXTERN unsigned int vmmrt_version(void);
VMMRT_EXTERN const char *vmmrt_version_string(void);

/* A device virtual address: exactly CUdeviceptr's type, so a CUdeviceptr *
 * passes for a vmmrt_devptr * without a cast, in C and in C++. */
typedef unsigned long long vmmrt_devptr;

/*
 * A backend stream. On the CUDA backend it is the CUstream itself, cast:
 * (vmmrt_stream)cuda_stream from C or C++ (a CUstream or a cudaStream_t), and
 * from PyTorch torch.cuda.current_stream().cuda_stream (an integer) passed as
 * a pointer. Every stream the driver accepts is valid wherever a stream is
 * taken: a created stream, NULL (the legacy default stream, PyTorch's default),
 * VMMRT_STREAM_LEGACY and VMMRT_STREAM_PER_THREAD (CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD). On the host backend those three name one default
 * stream that the backend creates with the device; it runs in order like any
 * other stream, without the legacy stream's implicit synchronization.
 */
typedef struct vmmrt_stream_s *vmmrt_stream;
#define VMMRT_STREAM_LEGACY ((vmmrt_stream)0x1)
#define VMMRT_STREAM_PER_THREAD ((vmmrt_stream)0x2)
/* An event on a stream (vmmrt_event_create). On the CUDA backend it is the
 * CUevent itself, cast, as for streams (PyTorch's torch.cuda.Event().cuda_event,
 * once recorded), so an application's own event can be passed to
 * vmmrt_slot_map_after. */
typedef struct vmmrt_event vmmrt_event;

typedef enum vmmrt_status {
	VMMRT_OK = 0,
	VMMRT_E_INVALID_ARGUMENT,   /* NULL handle or pointer, unknown name */
	VMMRT_E_INVALID_SIZE,       /* zero, overflowing or misaligned size */
	VMMRT_E_INVALID_STATE,      /* call not allowed in the object's state */
	VMMRT_E_INVALID_OPTION,     /* malformed or out-of-range option or VMMRT_* value */
	VMMRT_E_OUT_OF_MEMORY,      /* device memory exhausted */
	VMMRT_E_HOST_OUT_OF_MEMORY, /* host (or pinned host) allocation failed */
	VMMRT_E_NOT_PERMITTED,      /* driver call from a host function or a non-worker thread */
	VMMRT_E_NOT_SUPPORTED,      /* the device or driver lacks a needed capability */
	VMMRT_E_NO_DEVICE,          /* no driver, no device, or bad device ordinal */
	VMMRT_E_DRIVER,             /* any other driver failure; the message names it */
	VMMRT_E_TIMEOUT,            /* a bounded wait ran out */
	VMMRT_E_BUSY,               /* the object still has work in flight */
	VMMRT_E_MISMATCH,           /* capture drifted from discovery (count, order, shape) */
	VMMRT_E_CANCELLED,          /* a queued request was cancelled by destroy or shutdown */
	VMMRT_E_CORRUPTED,          /* restored bytes did not match what was saved */
	VMMRT_E_CAPTURE,            /* not allowed while a stream is capturing a graph */
	VMMRT_E_FAULT,              /* device address not mapped */
	VMMRT_STATUS_COUNT_         /* not a status: number of statuses */
} vmmrt_status;

/* Short description of a status ("device out of memory"). Never NULL. */
VMMRT_EXTERN const char *vmmrt_strerror(vmmrt_status status);
/* The enumerator's name ("VMMRT_E_OUT_OF_MEMORY"). Never NULL. */
VMMRT_EXTERN const char *vmmrt_status_name(vmmrt_status status);
/* The detailed message of the last failed call made by this thread. */
VMMRT_EXTERN const char *vmmrt_last_error(void);

/* ------------------------------------------------------------------ options */

/*
 * Options are named key/value pairs drawn from one table (see vmmrt(7)):
 * "backend", "mode", "driver_workers", ... Each has a VMMRT_* environment
 * variable (VMMRT_BACKEND, ...) that overrides the value set here when the
 * runtime is created. Values are validated when set: a malformed or
 * out-of-range value is VMMRT_E_INVALID_OPTION, never a silent default.
 */
typedef struct vmmrt_options vmmrt_options;

VMMRT_EXTERN vmmrt_status vmmrt_options_create(vmmrt_options **out);
VMMRT_EXTERN void vmmrt_options_destroy(vmmrt_options *opts);
VMMRT_EXTERN vmmrt_status vmmrt_options_set(vmmrt_options *opts, const char *name, const char *value);
VMMRT_EXTERN vmmrt_status vmmrt_options_get(const vmmrt_options *opts, const char *name, char *buf, size_t len);
/* Apply every VMMRT_* variable of the environment; runtime creation does this too. */
VMMRT_EXTERN vmmrt_status vmmrt_options_apply_env(vmmrt_options *opts);
/* Walk the option table: i-th option's name, variable, default and one-line doc. */
typedef struct vmmrt_option_info {
	size_t size;           /* set by the caller: sizeof(vmmrt_option_info) */
	const char *name;
	const char *env;
	const char *default_value;
	const char *range;
	const char *doc;
} vmmrt_option_info;
VMMRT_EXTERN vmmrt_status vmmrt_option_describe(size_t index, vmmrt_option_info *out);

/* ------------------------------------------------------------------ runtime */

typedef struct vmmrt_runtime vmmrt_runtime;

typedef enum vmmrt_mode {
	VMMRT_MODE_PINGPONG = 0, /* two resident banks, no driver calls after allocation */
	VMMRT_MODE_REMAP = 1,    /* release after D2H, create+map again before H2D */
	VMMRT_MODE_NONE = 2,     /* keep activations resident: no offload (the baseline) */
} vmmrt_mode;

typedef struct vmmrt_runtime_info {
	size_t size;           /* set by the caller: sizeof(vmmrt_runtime_info) */
	const char *backend;  /* "cuda" or "host" */
	char backend_note[192]; /* why this backend: "auto: no GPU to use, so the host backend emulates one (...)" */
	char device[96];      /* device name */
	int device_ordinal;
	size_t granularity;   /* VMM allocation granularity in bytes */
	vmmrt_mode mode;
	unsigned driver_workers;
	unsigned lookahead;
} vmmrt_runtime_info;

/* opts may be NULL for defaults; the environment is applied on a copy. */
VMMRT_EXTERN vmmrt_status vmmrt_runtime_create(const vmmrt_options *opts, vmmrt_runtime **out);
/* Drains or cancels queued work, joins the workers, frees every slot and reservation. */
VMMRT_EXTERN vmmrt_status vmmrt_runtime_destroy(vmmrt_runtime *rt);
VMMRT_EXTERN vmmrt_status vmmrt_runtime_info_get(const vmmrt_runtime *rt, vmmrt_runtime_info *out);
/* The options in force (the program's, with the environment applied as the
 * "environment" option says), copied into out (from vmmrt_options_create). */
VMMRT_EXTERN vmmrt_status vmmrt_runtime_options_get(const vmmrt_runtime *rt, vmmrt_options *out);

/*
 * Add a span to the runtime's trace (the "trace" option; VMMRT_OK and nothing
 * written when it is off): track names a row ("compute", "layer 3"), times are
 * CLOCK_MONOTONIC nanoseconds, so an application's spans line up with the
 * driver calls the runtime records.
 */
VMMRT_EXTERN vmmrt_status vmmrt_trace_span(vmmrt_runtime *rt, const char *track, const char *name, uint64_t t0_ns,
					   uint64_t t1_ns);

/* Driver-level device memory (cuMemGetInfo), in bytes. */
VMMRT_EXTERN vmmrt_status vmmrt_mem_info(vmmrt_runtime *rt, size_t *free_bytes, size_t *total_bytes);

/*
 * Latency of the driver's VMM calls as the runtime made them (all threads),
 * over the most recent 65536 calls of each type: call 0..VMMRT_DRIVER_CALLS-1
 * is cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease.
 */
#define VMMRT_DRIVER_CALLS 5
typedef struct vmmrt_driver_stats {
	size_t size;           /* set by the caller: sizeof(vmmrt_driver_stats) */
	const char *name;      /* "cuMemCreate", ... */
	uint64_t count;
	double p50_us, p99_us, max_us;
} vmmrt_driver_stats;
VMMRT_EXTERN vmmrt_status vmmrt_driver_stats_get(vmmrt_runtime *rt, unsigned call, vmmrt_driver_stats *out);
/* Forget the samples and the launch-thread blocking count (e.g. after warm-up). */
VMMRT_EXTERN vmmrt_status vmmrt_driver_stats_reset(vmmrt_runtime *rt);

/* -------------------------------------------------------------------- slots */

/* One fixed-VA range: the address never changes from create to destroy. */
typedef struct vmmrt_slot vmmrt_slot;

typedef enum vmmrt_slot_state {
	VMMRT_SLOT_RESERVED = 0, /* address reserved, nothing mapped (never mapped or released) */
	VMMRT_SLOT_MAPPED,       /* physical memory mapped and accessible */
	VMMRT_SLOT_PENDING,      /* a map or release is queued on a driver worker */
	VMMRT_SLOT_FAILED,       /* the last asynchronous request failed; see vmmrt_slot_error */
} vmmrt_slot_state;

/* Reserve a fixed VA of bytes (rounded up to the granularity); nothing mapped yet. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_create(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out);
/* Create physical memory and map it at the slot's address; waits for the worker. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_map(vmmrt_slot *slot);
/* Unmap and release the physical memory; the address stays reserved. A slot
 * bound to pages (vmmrt_slot_map_pages) is unmapped only: the memory stays the pages'. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_unmap(vmmrt_slot *slot);
/* Release everything, reservation included (a bound slot's memory stays the pages').
 * Requests still queued for the slot are cancelled (their status becomes
 * VMMRT_E_CANCELLED); the call waits for the worker. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_destroy(vmmrt_slot *slot);
/* A slot with nothing mapped maps only its first bytes (rounded up to the granularity)
 * from now on; its address and whole reservation stay (vmmrt_slot_truncate(3)). */
VMMRT_EXTERN vmmrt_status vmmrt_slot_truncate(vmmrt_slot *slot, size_t bytes);
VMMRT_EXTERN vmmrt_devptr vmmrt_slot_address(const vmmrt_slot *slot);
VMMRT_EXTERN size_t vmmrt_slot_size(const vmmrt_slot *slot);
VMMRT_EXTERN vmmrt_slot_state vmmrt_slot_get_state(const vmmrt_slot *slot);
/* The error of the last failed asynchronous request on this slot (VMMRT_OK if none); clears it. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_error(vmmrt_slot *slot);

/*
 * Stream-ordered backing (since 0.2.0), for memory that must exist only
 * while a tensor does (a gradient): none of these waits for the GPU. The
 * memory of a slot made by vmmrt_slot_create always goes back to the
 * driver when released, never into a worker's handle pool.
 */
/* Queue a map of the slot on its driver worker and return at once. Already
 * mapped (or a map queued): nothing more is queued, and a release queued by
 * vmmrt_slot_release_after that has not run yet is cancelled (the memory,
 * and its bytes, stay). */
VMMRT_EXTERN vmmrt_status vmmrt_slot_map_async(vmmrt_slot *slot);
/* Wait (bounded by the runtime's timeout option) until the maps queued for the
 * slot so far have run; their failure, if one failed. Returns at once when none is queued. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_wait(vmmrt_slot *slot);
/* Release the slot's memory once the work enqueued on stream so far has
 * completed (stream-ordered, like a caching allocator's free): returns at once;
 * the driver worker unmaps and releases the memory to the driver (never into a
 * handle pool: the point is that the memory comes back) after the GPU passes this point. A
 * vmmrt_slot_map_async made before the release ran cancels it. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_release_after(vmmrt_slot *slot, vmmrt_stream stream);
/* vmmrt_slot_map_async, but the driver worker makes the map only once the work
 * event captures now has completed (as cuStreamWaitEvent would: recording it
 * again or destroying it afterwards changes nothing); the launch thread does not
 * wait (since 0.2.0). A map already queued, or the slot mapped: nothing more is
 * queued, as for vmmrt_slot_map_async. */
VMMRT_EXTERN vmmrt_status vmmrt_slot_map_after(vmmrt_slot *slot, vmmrt_event *event);
/* Enqueue on stream a wait (a stream wait-value, no host wait) until the maps
 * queued for the slot so far have ended; nothing when they have. A map that
 * fails still ends the wait: the work after it runs without the memory, and the
 * failure is the slot's error (vmmrt_slot_error, the next call) (since 0.2.0). */
VMMRT_EXTERN vmmrt_status vmmrt_slot_wait_stream(vmmrt_slot *slot, vmmrt_stream stream);

/*
 * Physical pages mapped at several fixed addresses (since 0.2.0): memory
 * that tensors whose lives do not overlap share, with no driver call per
 * step. The caller guarantees that no two slots bound to the same bytes are
 * in use at once; the library does not check it.
 */
typedef struct vmmrt_pages vmmrt_pages;
/* Create physical memory of bytes (rounded up to the granularity) on a driver
 * worker; waits for it. Nothing maps it yet. */
VMMRT_EXTERN vmmrt_status vmmrt_pages_create(vmmrt_runtime *rt, size_t bytes, vmmrt_pages **out);
/* The caller's handle dies at once; the memory goes back to the driver once no
 * slot maps it any more (each bound slot keeps it until it is unmapped or
 * destroyed). The runtime's destroy destroys the pages left. */
VMMRT_EXTERN vmmrt_status vmmrt_pages_destroy(vmmrt_pages *pages);
/* Its size, a multiple of the granularity (0 for NULL). */
VMMRT_EXTERN size_t vmmrt_pages_size(const vmmrt_pages *pages);
/* Map the slot's whole range onto pages' bytes [offset, offset + slot size) and
 * set access; waits for the worker. The slot is then MAPPED and bound: several
 * slots may map the same bytes. vmmrt_slot_unmap unbinds it (the pages' memory
 * stays), after which it can map memory of its own again; vmmrt_slot_destroy
 * unbinds it too. On a bound slot, vmmrt_slot_map_async and vmmrt_slot_map_after
 * queue nothing (it is mapped), vmmrt_slot_wait_stream enqueues nothing, and
 * vmmrt_slot_release_after is refused (VMMRT_E_INVALID_STATE). */
VMMRT_EXTERN vmmrt_status vmmrt_slot_map_pages(vmmrt_slot *slot, vmmrt_pages *pages, size_t offset);
/* Map granule i of the slot's range (bytes [i*g, (i+1)*g), g the granularity)
 * onto the pages' bytes [offsets[i], offsets[i] + g), for i < count, and set
 * access; waits for the worker. count must be the slot's size / g; each offset a
 * multiple of g inside the pages; offsets may repeat (the caller keeps the uses
 * of granules on the same bytes apart). The table is copied. Otherwise as
 * vmmrt_slot_map_pages (since 0.2.0). */
VMMRT_EXTERN vmmrt_status vmmrt_slot_map_pages_table(vmmrt_slot *slot, vmmrt_pages *pages, const size_t *offsets,
						      size_t count);

/* ------------------------------------------------- device helpers (any backend) */

/*
 * Enough of a device API to drive the runtime without CUDA headers: the host
 * backend emulates a GPU with these, and the CUDA backend forwards them to the
 * driver. Applications with their own CUDA streams pass them cast to vmmrt_stream.
 */
VMMRT_EXTERN vmmrt_status vmmrt_stream_create(vmmrt_runtime *rt, vmmrt_stream *out);
VMMRT_EXTERN vmmrt_status vmmrt_stream_destroy(vmmrt_runtime *rt, vmmrt_stream stream);
VMMRT_EXTERN vmmrt_status vmmrt_stream_synchronize(vmmrt_runtime *rt, vmmrt_stream stream);
VMMRT_EXTERN vmmrt_status vmmrt_host_alloc(vmmrt_runtime *rt, size_t bytes, void **out);
VMMRT_EXTERN vmmrt_status vmmrt_host_free(vmmrt_runtime *rt, void *ptr);
/* Synchronous copies for setup and checks, never for the hot path. */
VMMRT_EXTERN vmmrt_status vmmrt_copy_to_device(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t bytes);
VMMRT_EXTERN vmmrt_status vmmrt_copy_to_host(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t bytes);
/* Asynchronous copies on a stream (host memory pinned with vmmrt_host_alloc to overlap). */
VMMRT_EXTERN vmmrt_status vmmrt_copy_to_device_async(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src,
						     size_t bytes, vmmrt_stream stream);
VMMRT_EXTERN vmmrt_status vmmrt_copy_to_host_async(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t bytes,
						   vmmrt_stream stream);

/* Events, as CUDA's: a record marks a point in a stream; waits and queries refer
 * to the most recent record; an event never recorded counts as complete. */
#define VMMRT_EVENT_TIMING 0x1u /* can be timed with vmmrt_event_elapsed_ms (costs a little) */
VMMRT_EXTERN vmmrt_status vmmrt_event_create(vmmrt_runtime *rt, unsigned int flags, vmmrt_event **out);
VMMRT_EXTERN vmmrt_status vmmrt_event_destroy(vmmrt_runtime *rt, vmmrt_event *event);
VMMRT_EXTERN vmmrt_status vmmrt_event_record(vmmrt_runtime *rt, vmmrt_event *event, vmmrt_stream stream);
/* *done: 1 once the most recent record has completed, else 0 (not an error). */
VMMRT_EXTERN vmmrt_status vmmrt_event_query(vmmrt_runtime *rt, vmmrt_event *event, int *done);
VMMRT_EXTERN vmmrt_status vmmrt_event_synchronize(vmmrt_runtime *rt, vmmrt_event *event);
VMMRT_EXTERN vmmrt_status vmmrt_event_elapsed_ms(vmmrt_runtime *rt, vmmrt_event *start, vmmrt_event *end, float *ms);
/* Work enqueued on stream after this call waits, on the device, for event's most recent record. */
VMMRT_EXTERN vmmrt_status vmmrt_stream_wait_event(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_event *event);
/* Built-in kernels, the same bytes on every backend. */
VMMRT_EXTERN vmmrt_status vmmrt_kernel_fill(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr dst, size_t bytes, uint64_t seed);
VMMRT_EXTERN vmmrt_status vmmrt_kernel_checksum(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr src, size_t bytes, vmmrt_devptr result);
VMMRT_EXTERN vmmrt_status vmmrt_kernel_busy(vmmrt_runtime *rt, vmmrt_stream stream, uint64_t nanoseconds);
/* A layer-like kernel: dst[i] = src[i] ^ vmmrt_fill_word(seed, i) (src 0: no input), lasting >= ns. */
VMMRT_EXTERN vmmrt_status vmmrt_kernel_layer(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr dst, vmmrt_devptr src,
				size_t bytes, uint64_t seed, uint64_t nanoseconds);
/* Host-side reference of the fill pattern and the checksum. */
VMMRT_EXTERN uint64_t vmmrt_fill_word(uint64_t seed, uint64_t index);
VMMRT_EXTERN uint64_t vmmrt_checksum_host(const void *data, size_t bytes);
/* The checksum of what vmmrt_kernel_layer(layer_seed) writes over input_seed's fill, without a buffer. */
VMMRT_EXTERN uint64_t vmmrt_layer_checksum_host(size_t bytes, uint64_t input_seed, uint64_t layer_seed);

/* Graphs: capture the work enqueued on a stream, replay it at the captured addresses. */
typedef struct vmmrt_graph vmmrt_graph;
VMMRT_EXTERN vmmrt_status vmmrt_graph_begin_capture(vmmrt_runtime *rt, vmmrt_stream stream);
VMMRT_EXTERN vmmrt_status vmmrt_graph_end_capture(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_graph **out);
VMMRT_EXTERN vmmrt_status vmmrt_graph_launch(vmmrt_runtime *rt, vmmrt_graph *graph, vmmrt_stream stream);
VMMRT_EXTERN vmmrt_status vmmrt_graph_destroy(vmmrt_runtime *rt, vmmrt_graph *graph);

/* ------------------------------------------------------------ offload groups */

/*
 * One group per runner (a layer's forward/backward graph pair): the tensors
 * its forward saves for its backward. The life cycle follows the runners:
 *
 *   vmmrt_group_create (in forward order)         discovery:  vmmrt_group_discover
 *   vmmrt_offload_allocate (all groups at once)   allocation: slots/banks, host buffers
 *   vmmrt_group_begin_capture / save / end        capture:    tensors live in the slot
 *   every iteration, around each graph launch:
 *     vmmrt_forward_begin / vmmrt_forward_end     forward offload (D2H)
 *     vmmrt_backward_begin / vmmrt_backward_end   backward restore (H2D), look-ahead
 *
 * The hooks only enqueue stream work and push requests to the driver workers:
 * the launch thread never blocks on the GPU. The first iteration records the
 * order in which forward and backward actually run; later iterations prefetch
 * along it (look-ahead) and must follow it (VMMRT_E_MISMATCH otherwise).
 */
typedef struct vmmrt_group vmmrt_group;

#define VMMRT_MAX_DIMS 8

typedef struct vmmrt_tensor_desc {
	size_t bytes;                     /* bytes the tensor occupies */
	uint32_t dtype;                   /* the framework's dtype tag, compared, not interpreted */
	uint32_t ndim;                    /* <= VMMRT_MAX_DIMS */
	int64_t shape[VMMRT_MAX_DIMS];
	int64_t stride[VMMRT_MAX_DIMS];
	size_t align;                     /* required address alignment, power of two; 0 means 256 */
} vmmrt_tensor_desc;

typedef enum vmmrt_group_state {
	VMMRT_GROUP_DISCOVERING = 0,  /* recording descriptors */
	VMMRT_GROUP_ALLOCATED,        /* slot reserved and mapped, host buffer ready */
	VMMRT_GROUP_CAPTURING,        /* between begin_capture and end_capture */
	VMMRT_GROUP_READY,            /* captured: replay hooks allowed */
	VMMRT_GROUP_FAILED,           /* an asynchronous step failed: see vmmrt_group_error */
} vmmrt_group_state;

VMMRT_EXTERN vmmrt_status vmmrt_group_create(vmmrt_runtime *rt, const char *name, vmmrt_group **out);
VMMRT_EXTERN vmmrt_status vmmrt_group_discover(vmmrt_group *g, const vmmrt_tensor_desc *desc);
/* End discovery for every group: reserve and map slots (or the two banks), pin host buffers. */
VMMRT_EXTERN vmmrt_status vmmrt_offload_allocate(vmmrt_runtime *rt);
VMMRT_EXTERN vmmrt_status vmmrt_group_begin_capture(vmmrt_group *g);
/*
 * The next saved tensor, in discovery order: checked against its descriptor,
 * then (if src is not 0) copied device-to-device into the slot on `stream`.
 * *addr receives its fixed address inside the slot: what the graphs use.
 */
VMMRT_EXTERN vmmrt_status vmmrt_group_save(vmmrt_group *g, const vmmrt_tensor_desc *desc, vmmrt_devptr src,
			      vmmrt_stream stream, vmmrt_devptr *addr);
VMMRT_EXTERN vmmrt_status vmmrt_group_end_capture(vmmrt_group *g);
VMMRT_EXTERN vmmrt_group_state vmmrt_group_get_state(const vmmrt_group *g);
/* Base address of the group's activations (its slot, or its bank) and total bytes. */
VMMRT_EXTERN vmmrt_devptr vmmrt_group_address(const vmmrt_group *g);
VMMRT_EXTERN size_t vmmrt_group_bytes(const vmmrt_group *g);
/* 1 if the schedule in force keeps the group's bytes where they are from its
 * forward to its backward (no copy either way), 0 if it copies them or the
 * schedule is not known yet (or g is NULL). */
VMMRT_EXTERN int vmmrt_group_stays(const vmmrt_group *g);
/* The first asynchronous failure of this group, with a message naming it (clears it). */
VMMRT_EXTERN vmmrt_status vmmrt_group_error(vmmrt_group *g);

/* Replay hooks, on the application's compute stream. */
VMMRT_EXTERN vmmrt_status vmmrt_forward_begin(vmmrt_group *g, vmmrt_stream compute);
VMMRT_EXTERN vmmrt_status vmmrt_forward_end(vmmrt_group *g, vmmrt_stream compute);
VMMRT_EXTERN vmmrt_status vmmrt_backward_begin(vmmrt_group *g, vmmrt_stream compute);
VMMRT_EXTERN vmmrt_status vmmrt_backward_end(vmmrt_group *g, vmmrt_stream compute);
/*
 * One use in one call: the begin hook (backward 0: vmmrt_forward_begin, 1:
 * vmmrt_backward_begin), cuGraphLaunch(graph_exec, compute) unless
 * graph_exec is 0, then the end hook, with the hooks' checks. graph_exec:
 * a CUgraphExec / cudaGraphExec_t cast to uintptr_t (any maker's: torch's
 * CUDAGraph.raw_cuda_graph_exec()); on the host backend only a vmmrt_graph
 * of its own (else VMMRT_E_NOT_SUPPORTED, nothing done).
 */
VMMRT_EXTERN vmmrt_status vmmrt_group_replay(vmmrt_group *g, int backward, uintptr_t graph_exec,
					     vmmrt_stream compute);
/*
 * vmmrt_group_replay with device-to-device copies on compute after the begin
 * hook and before the graph: a graph's static inputs filled where only the
 * begin hook makes writing them safe (a ping-pong bank whose earlier bytes
 * are still going to the host). Copies run in order; one whose dst equals
 * its src, or of 0 bytes, is skipped. Refused before the begin (nothing
 * done): copies NULL with ncopies > 0, a NULL address, overlapping ranges.
 */
typedef struct vmmrt_replay_copy {
	vmmrt_devptr dst;
	vmmrt_devptr src;
	size_t bytes;
} vmmrt_replay_copy;
VMMRT_EXTERN vmmrt_status vmmrt_group_replay_copies(vmmrt_group *g, int backward, uintptr_t graph_exec,
						    vmmrt_stream compute, const vmmrt_replay_copy *copies,
						    size_t ncopies);

/*
 * The order of one iteration, declared before vmmrt_offload_allocate
 * instead of recorded by the first iteration: the forward and the backward
 * of every group with tensors once, each forward before its backward (all
 * forwards then all backwards, 1F1B, interleaved chunks, ...). Ping-pong then
 * makes the banks the order needs (see vmmrt(7), Strategies), and the
 * look-ahead works from the first iteration on. nsteps 0 forgets one.
 */
typedef struct vmmrt_schedule_step {
	vmmrt_group *group;
	uint32_t backward;                /* 0: its forward, 1: its backward */
} vmmrt_schedule_step;
VMMRT_EXTERN vmmrt_status vmmrt_offload_set_schedule(vmmrt_runtime *rt, const vmmrt_schedule_step *steps,
						     size_t nsteps);

/*
 * Abandon the iteration under way (a step skipped for a NaN loss, an
 * out-of-memory): waits for the copies and driver requests in flight, puts
 * every group back where the next iteration's first use starts from, and
 * releases what the abandoned uses mapped. Addresses do not change: the
 * captured graphs stay valid. Host copies keep what was offloaded.
 */
VMMRT_EXTERN vmmrt_status vmmrt_offload_abort(vmmrt_runtime *rt);

/*
 * Discover g again (a new shape), between iterations: its descriptors are
 * forgotten and it is discovered, allocated (vmmrt_offload_allocate again)
 * and captured anew, at new addresses; the other groups keep theirs. Its old
 * memory and address stay (graphs may still read them) until
 * vmmrt_offload_release_retired.
 */
VMMRT_EXTERN vmmrt_status vmmrt_group_rediscover(vmmrt_group *g);
/* Free the memory of re-discovered groups' old allocations: the application's
 * graphs over those addresses must no longer run. */
VMMRT_EXTERN vmmrt_status vmmrt_offload_release_retired(vmmrt_runtime *rt);

/* Wait (bounded by the timeout option) until every offload copy and request has finished. */
VMMRT_EXTERN vmmrt_status vmmrt_offload_sync(vmmrt_runtime *rt);

typedef struct vmmrt_offload_stats {
	size_t size;           /* set by the caller: sizeof(vmmrt_offload_stats) */
	uint64_t iterations;             /* backward passes completed (hook calls) */
	uint64_t bytes_offloaded;        /* D2H bytes enqueued */
	uint64_t bytes_restored;         /* H2D bytes enqueued */
	uint64_t activation_bytes;       /* device bytes mapped for activations now */
	uint64_t activation_peak_bytes;  /* the most mapped at once since allocation or the last reset */
	uint64_t maps, releases;         /* worker requests completed (remap) */
	uint64_t launch_thread_blocking; /* blocking calls made by application threads */
	uint64_t bank_conflicts;         /* ping-pong: consecutive backward runners on one bank */
	/* Copy times of the last iteration whose copies all finished, from device
	 * events (read after vmmrt_offload_sync): bytes / ms is the bandwidth. */
	double last_d2h_ms, last_h2d_ms;
	uint64_t last_d2h_bytes, last_h2d_bytes;
	uint32_t groups;
	vmmrt_mode mode;
	uint32_t lookahead;
	uint32_t schedule_recorded;      /* 1 once the first iteration fixed the order */
	/* since 0.2.0 */
	uint32_t schedule_declared;      /* 1 if vmmrt_offload_set_schedule gave the order */
	uint32_t lookahead_in_force;     /* the look-ahead the schedule and the banks allow (0 until known) */
	uint32_t banks;                  /* ping-pong: banks held now */
	uint32_t budget_groups;          /* remap: the most groups mapped at once; none: every group */
	uint64_t bound_bytes;            /* the device memory of activations the schedule is held to */
	uint64_t aborts;                 /* vmmrt_offload_abort calls that abandoned the pipeline's state */
	uint32_t retired_groups;         /* re-discovered groups' old memory, kept until released */
	uint64_t slot_bytes;             /* device bytes mapped now on slots made with vmmrt_slot_create,
					  * their own, and of vmmrt_pages from create to destroy (a slot
					  * bound to pages adds nothing) */
	uint64_t slot_peak_bytes;        /* the most at once since creation or the last reset */
} vmmrt_offload_stats;
VMMRT_EXTERN vmmrt_status vmmrt_offload_stats_get(vmmrt_runtime *rt, vmmrt_offload_stats *out);
/* Restart the counters, and the peak from the memory mapped now (after warm-up, say). */
VMMRT_EXTERN vmmrt_status vmmrt_offload_stats_reset(vmmrt_runtime *rt);

/* -------------------------------------------------------------------- arena */

/*
 * An allocator over device address ranges the caller lends (the memory plan's
 * bytes that are free at the optimizer step), for PyTorch's
 * torch.cuda.memory.CUDAPluggableAllocator(<libvmmrt.so>, "vmmrt_arena_malloc",
 * "vmmrt_arena_free") in a torch.cuda.MemPool. One arena per CUDA device
 * ordinal (0..63). Each lend replaces the ranges and starts a generation;
 * segments of an earlier one stay valid until freed and their bytes never
 * return to the ranges (nor are they served again). What does not fit falls
 * back to plain device memory (cuMemAlloc). vmmrt_arena_lend(3).
 */
VMMRT_EXTERN vmmrt_status vmmrt_arena_lend(vmmrt_runtime *rt, int device, const vmmrt_devptr *addrs,
					   const size_t *sizes, size_t n, uint64_t *generation);
/* PyTorch's pluggable allocator's signatures (stream: a cudaStream_t, unused). */
VMMRT_EXTERN void *vmmrt_arena_malloc(ssize_t size, int device, void *stream);
VMMRT_EXTERN void vmmrt_arena_free(void *ptr, ssize_t size, int device, void *stream);
/* Drop the ranges and the runtime, restart the counters (tests, teardown). */
VMMRT_EXTERN vmmrt_status vmmrt_arena_reset(int device);

typedef struct vmmrt_arena_stats {
	size_t size;                /* set by the caller: sizeof(vmmrt_arena_stats) */
	uint64_t generation;        /* lends so far (0: never lent) */
	uint64_t lent_bytes;        /* the current lend's ranges, in all */
	uint64_t used_bytes;        /* the current generation's segments outstanding */
	uint64_t peak_used_bytes;   /* the most used_bytes since the last lend or reset */
	uint64_t segments;          /* outstanding segments served from lent ranges (all generations) */
	uint64_t old_segments;      /* those of them from an earlier generation */
	uint64_t fallback_segments; /* outstanding segments of plain device memory */
	uint64_t fallback_bytes;    /* their bytes */
	uint64_t fallback_total;    /* plain segments ever allocated (since the last reset) */
	uint64_t allocs, frees;     /* successful calls (since the last reset) */
	uint64_t bad_frees;         /* frees of a pointer the arena never gave out */
	uint64_t errors;            /* mallocs that returned NULL */
} vmmrt_arena_stats;
VMMRT_EXTERN vmmrt_status vmmrt_arena_stats_get(int device, vmmrt_arena_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* VMMRT_H */

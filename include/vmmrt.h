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
 *  - no call may be made from inside a host function (a CUDA host callback):
 *    such calls fail with VMMRT_E_NOT_PERMITTED.
 *  - the library never exits or aborts the process.
 *
 * See vmmrt(7) for the whole picture and the option table.
 */
#ifndef VMMRT_H
#define VMMRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VMMRT_VERSION_MAJOR 0
#define VMMRT_VERSION_MINOR 1
#define VMMRT_VERSION_PATCH 0

/* A device virtual address (CUdeviceptr on the CUDA backend). */
typedef uint64_t vmmrt_devptr;

/* A backend stream (a CUstream on the CUDA backend, cast). */
typedef struct vmmrt_stream_s *vmmrt_stream;

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
const char *vmmrt_strerror(vmmrt_status status);
/* The enumerator's name ("VMMRT_E_OUT_OF_MEMORY"). Never NULL. */
const char *vmmrt_status_name(vmmrt_status status);
/* The detailed message of the last failed call made by this thread. */
const char *vmmrt_last_error(void);

/* ------------------------------------------------------------------ options */

/*
 * Options are named key/value pairs drawn from one table (see vmmrt(7)):
 * "backend", "mode", "driver_workers", ... Each has a VMMRT_* environment
 * variable (VMMRT_BACKEND, ...) that overrides the value set here when the
 * runtime is created. Values are validated when set: a malformed or
 * out-of-range value is VMMRT_E_INVALID_OPTION, never a silent default.
 */
typedef struct vmmrt_options vmmrt_options;

vmmrt_status vmmrt_options_create(vmmrt_options **out);
void vmmrt_options_destroy(vmmrt_options *opts);
vmmrt_status vmmrt_options_set(vmmrt_options *opts, const char *name, const char *value);
vmmrt_status vmmrt_options_get(const vmmrt_options *opts, const char *name, char *buf, size_t len);
/* Apply every VMMRT_* variable of the environment; runtime creation does this too. */
vmmrt_status vmmrt_options_apply_env(vmmrt_options *opts);
/* Walk the option table: i-th option's name, variable, default and one-line doc. */
typedef struct vmmrt_option_info {
	const char *name;
	const char *env;
	const char *default_value;
	const char *range;
	const char *doc;
} vmmrt_option_info;
vmmrt_status vmmrt_option_describe(size_t index, vmmrt_option_info *out);

/* ------------------------------------------------------------------ runtime */

typedef struct vmmrt_runtime vmmrt_runtime;

typedef enum vmmrt_mode {
	VMMRT_MODE_PINGPONG = 0, /* two resident banks, no driver calls after allocation */
	VMMRT_MODE_REMAP = 1,    /* release after D2H, create+map again before H2D */
	VMMRT_MODE_NONE = 2,     /* keep activations resident: no offload (the baseline) */
} vmmrt_mode;

typedef struct vmmrt_runtime_info {
	const char *backend;  /* "cuda" or "host" */
	char device[96];      /* device name */
	int device_ordinal;
	size_t granularity;   /* VMM allocation granularity in bytes */
	vmmrt_mode mode;
	unsigned driver_workers;
	unsigned lookahead;
} vmmrt_runtime_info;

/* opts may be NULL for defaults; the environment is applied on a copy. */
vmmrt_status vmmrt_runtime_create(const vmmrt_options *opts, vmmrt_runtime **out);
/* Drains or cancels queued work, joins the workers, frees every slot and reservation. */
vmmrt_status vmmrt_runtime_destroy(vmmrt_runtime *rt);
vmmrt_status vmmrt_runtime_info_get(const vmmrt_runtime *rt, vmmrt_runtime_info *out);

/* Driver-level device memory (cuMemGetInfo), in bytes. */
vmmrt_status vmmrt_mem_info(vmmrt_runtime *rt, size_t *free_bytes, size_t *total_bytes);

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
vmmrt_status vmmrt_slot_create(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out);
/* Create physical memory and map it at the slot's address; waits for the worker. */
vmmrt_status vmmrt_slot_map(vmmrt_slot *slot);
/* Unmap and release the physical memory; the address stays reserved. */
vmmrt_status vmmrt_slot_unmap(vmmrt_slot *slot);
/* Release everything, reservation included. Fails with VMMRT_E_BUSY while a request is queued. */
vmmrt_status vmmrt_slot_destroy(vmmrt_slot *slot);
vmmrt_devptr vmmrt_slot_address(const vmmrt_slot *slot);
size_t vmmrt_slot_size(const vmmrt_slot *slot);
vmmrt_slot_state vmmrt_slot_get_state(const vmmrt_slot *slot);
/* The error of the last failed asynchronous request on this slot (VMMRT_OK if none); clears it. */
vmmrt_status vmmrt_slot_error(vmmrt_slot *slot);

/* ------------------------------------------------- device helpers (any backend) */

/*
 * Enough of a device API to drive the runtime without CUDA headers: the host
 * backend emulates a GPU with these, and the CUDA backend forwards them to the
 * driver. Applications with their own CUDA streams pass them cast to vmmrt_stream.
 */
vmmrt_status vmmrt_stream_create(vmmrt_runtime *rt, vmmrt_stream *out);
vmmrt_status vmmrt_stream_destroy(vmmrt_runtime *rt, vmmrt_stream stream);
vmmrt_status vmmrt_stream_synchronize(vmmrt_runtime *rt, vmmrt_stream stream);
vmmrt_status vmmrt_host_alloc(vmmrt_runtime *rt, size_t bytes, void **out);
vmmrt_status vmmrt_host_free(vmmrt_runtime *rt, void *ptr);
/* Synchronous copies for setup and checks, never for the hot path. */
vmmrt_status vmmrt_copy_to_device(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t bytes);
vmmrt_status vmmrt_copy_to_host(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t bytes);
/* Built-in kernels, the same bytes on every backend. */
vmmrt_status vmmrt_kernel_fill(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr dst, size_t bytes, uint64_t seed);
vmmrt_status vmmrt_kernel_checksum(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr src, size_t bytes, vmmrt_devptr result);
vmmrt_status vmmrt_kernel_busy(vmmrt_runtime *rt, vmmrt_stream stream, uint64_t nanoseconds);
/* Host-side reference of the fill pattern and the checksum. */
uint64_t vmmrt_fill_word(uint64_t seed, uint64_t index);
uint64_t vmmrt_checksum_host(const void *data, size_t bytes);

/* Graphs: capture the work enqueued on a stream, replay it at the captured addresses. */
typedef struct vmmrt_graph vmmrt_graph;
vmmrt_status vmmrt_graph_begin_capture(vmmrt_runtime *rt, vmmrt_stream stream);
vmmrt_status vmmrt_graph_end_capture(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_graph **out);
vmmrt_status vmmrt_graph_launch(vmmrt_runtime *rt, vmmrt_graph *graph, vmmrt_stream stream);
vmmrt_status vmmrt_graph_destroy(vmmrt_runtime *rt, vmmrt_graph *graph);

#ifdef __cplusplus
}
#endif
#endif /* VMMRT_H */

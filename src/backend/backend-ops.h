/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The one list of backend operations. From it come the ops table
 * (backend.h), each backend's table and declarations (host-internal.h,
 * host.c, cuda-internal.h, cuda.c), the runtime's wrappers around them (driver.h,
 * driver.c) and the names the wrappers report and fault hooks see. Adding an
 * operation is one line here, then its implementation in each backend (the
 * build fails until both have it).
 *
 * X(op, door, call, params, args)
 *   op      the table's field (vmmrt__backend_ops.op), the host backend's
 *           vmmrt__host_<op>, the CUDA backend's vmmrt__cuda_<op>, and the wrapper
 *           vmmrt__drv_<op>
 *   door    what driver.c does around the call (its DOOR_* macros):
 *             RAW       nothing: the device's fixed properties, read at
 *                       creation, and a worker binding its thread at start
 *             PLAIN     the host-function rule, then the fault hook
 *             BLOCKING  PLAIN, and counted as a blocking call when an
 *                       application thread makes it
 *             OWN       written out in driver.c: it keeps a count or
 *                       undoes a half-done capture
 *             NONE      no wrapper: the backends have it, the runtime does
 *                       not use it (the backends' own tests do)
 *   call    the CUDA driver entry point the operation stands for: the name
 *           the fault hook and the trace see
 *   params  the parameters after the backend, each with a leading comma
 *   args    the same names, for the call
 *
 * T(op, call, params, args, bytes): the VMM calls a driver worker makes
 * (only there, in checked mode), timed per call for vmmrt_driver_stats and
 * the trace, in the order of vmmrt_driver_stats's call index; bytes is what
 * the trace records.
 */
#ifndef VMMRT__BACKEND_OPS_H
#define VMMRT__BACKEND_OPS_H

/* Expand a parenthesized parameter or argument list: VMMRT__LIST (, a, b) is , a, b */
#define VMMRT__LIST(...) __VA_ARGS__
#define VMMRT__PASTE(a, b) VMMRT__PASTE_(a, b)
#define VMMRT__PASTE_(a, b) a##b

#define VMMRT__BACKEND_OPS(X, T) \
	/* the device */ \
	X(device_name, RAW, "cuDeviceGetName", (, char *buf, size_t len), (, buf, len)) \
	X(granularity, RAW, "cuMemGetAllocationGranularity", (, size_t *out), (, out)) \
	/* make the backend's context current on the calling thread (a worker, at start) */ \
	X(bind_thread, RAW, "cuCtxSetCurrent", (), ()) \
	\
	/* virtual memory management */ \
	X(va_reserve, OWN, "cuMemAddressReserve", (, size_t size, size_t align, vmmrt_devptr *out), \
	  (, size, align, out)) \
	X(va_free, OWN, "cuMemAddressFree", (, vmmrt_devptr va, size_t size), (, va, size)) \
	T(mem_create, "cuMemCreate", (, size_t size, vmmrt__bhandle *out), (, size, out), size) \
	/* h's bytes [offset, offset + size) at [va, va + size); one handle may be \
	 * mapped at several addresses at once (vmmrt_pages) */ \
	T(mem_map, "cuMemMap", (, vmmrt_devptr va, size_t size, vmmrt__bhandle h, size_t offset), \
	  (, va, size, h, offset), size) \
	/* read/write access for the device (and, on the host backend, the CPU) */ \
	T(mem_set_access, "cuMemSetAccess", (, vmmrt_devptr va, size_t size), (, va, size), size) \
	T(mem_unmap, "cuMemUnmap", (, vmmrt_devptr va, size_t size), (, va, size), size) \
	T(mem_release, "cuMemRelease", (, vmmrt__bhandle h), (, h), 0) \
	X(mem_info, PLAIN, "cuMemGetInfo", (, size_t *free_bytes, size_t *total_bytes), (, free_bytes, total_bytes)) \
	/* plain device memory, outside any reservation: the arena's fallback \
	 * (src/arena.c), so that an allocator it serves never sees an out-of-memory \
	 * the arena caused */ \
	X(mem_alloc, PLAIN, "cuMemAlloc", (, size_t size, vmmrt_devptr *out), (, size, out)) \
	X(mem_free, PLAIN, "cuMemFree", (, vmmrt_devptr p), (, p)) \
	\
	/* streams and events */ \
	X(stream_create, PLAIN, "cuStreamCreate", (, vmmrt_stream *out), (, out)) \
	X(stream_destroy, PLAIN, "cuStreamDestroy", (, vmmrt_stream s), (, s)) \
	X(stream_synchronize, BLOCKING, "cuStreamSynchronize", (, vmmrt_stream s), (, s)) \
	/* *done: whether all its work has finished. Not finished is an answer, \
	 * not an error: a poll on the hot path formats no message. */ \
	X(stream_query, PLAIN, "cuStreamQuery", (, vmmrt_stream s, bool *done), (, s, done)) \
	X(stream_wait_event, PLAIN, "cuStreamWaitEvent", (, vmmrt_stream s, vmmrt__bevent *e), (, s, e)) \
	/* stream memory operations on a 32-bit word (host-pinned via host_devptr, or device) */ \
	X(stream_wait_value32, PLAIN, "cuStreamWaitValue32", (, vmmrt_stream s, vmmrt_devptr addr, uint32_t value), \
	  (, s, addr, value)) \
	X(stream_write_value32, NONE, "cuStreamWriteValue32", (, vmmrt_stream s, vmmrt_devptr addr, uint32_t value), \
	  (, s, addr, value)) \
	/* timing: events that can be used with event_elapsed_ms */ \
	X(event_create, PLAIN, "cuEventCreate", (, bool timing, vmmrt__bevent **out), (, timing, out)) \
	X(event_destroy, PLAIN, "cuEventDestroy", (, vmmrt__bevent *e), (, e)) \
	X(event_record, PLAIN, "cuEventRecord", (, vmmrt__bevent *e, vmmrt_stream s), (, e, s)) \
	/* *done: whether its most recent record completed (true if never recorded) */ \
	X(event_query, PLAIN, "cuEventQuery", (, vmmrt__bevent *e, bool *done), (, e, done)) \
	X(event_synchronize, BLOCKING, "cuEventSynchronize", (, vmmrt__bevent *e), (, e)) \
	X(event_elapsed_ms, PLAIN, "cuEventElapsedTime", (, vmmrt__bevent *start, vmmrt__bevent *end, float *ms), \
	  (, start, end, ms)) \
	X(launch_host_func, PLAIN, "cuLaunchHostFunc", (, vmmrt_stream s, vmmrt__host_fn fn, void *arg), \
	  (, s, fn, arg)) \
	\
	/* copies (host side must be pinned for the async ones to overlap) */ \
	X(memcpy_htod_async, PLAIN, "cuMemcpyHtoDAsync", (, vmmrt_devptr dst, const void *src, size_t n, vmmrt_stream s), \
	  (, dst, src, n, s)) \
	X(memcpy_dtoh_async, PLAIN, "cuMemcpyDtoHAsync", (, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s), \
	  (, dst, src, n, s)) \
	X(memcpy_dtod_async, PLAIN, "cuMemcpyDtoDAsync", \
	  (, vmmrt_devptr dst, vmmrt_devptr src, size_t n, vmmrt_stream s), (, dst, src, n, s)) \
	\
	/* pinned host memory, visible to the device at host_devptr() */ \
	X(host_alloc, PLAIN, "cuMemHostAlloc", (, size_t size, void **out), (, size, out)) \
	X(host_free, PLAIN, "cuMemFreeHost", (, void *p), (, p)) \
	X(host_devptr, PLAIN, "cuMemHostGetDevicePointer", (, void *p, vmmrt_devptr *out), (, p, out)) \
	\
	/* graphs: capture a stream's work, instantiate, replay */ \
	X(stream_begin_capture, PLAIN, "cuStreamBeginCapture", (, vmmrt_stream s), (, s)) \
	X(stream_end_capture, OWN, "cuStreamEndCapture", (, vmmrt_stream s, vmmrt__bgraph **out), (, s, out)) \
	/* *out = whether s is capturing: work enqueued on it now would go into a \
	 * graph instead of running (a capture the driver has invalidated counts \
	 * too: it stays capturing until ended). */ \
	X(stream_is_capturing, PLAIN, "cuStreamIsCapturing", (, vmmrt_stream s, bool *out), (, s, out)) \
	X(graph_launch, PLAIN, "cuGraphLaunch", (, vmmrt__bgraph *g, vmmrt_stream s), (, g, s)) \
	X(graph_destroy, PLAIN, "cuGraphExecDestroy", (, vmmrt__bgraph *g), (, g)) \
	/* an executable graph given by its handle (vmmrt_group_replay): on CUDA a \
	 * CUgraphExec made by anyone (torch's raw_cuda_graph_exec), on the host \
	 * backend one of its own graphs. exec_check refuses, before any hook \
	 * work, a handle the backend can tell is not one (CUDA: only 0); a \
	 * fault on cuGraphLaunch may hit it, as a bad handle would. */ \
	X(exec_check, PLAIN, "cuGraphLaunch", (, uintptr_t exec), (, exec)) \
	X(exec_launch, PLAIN, "cuGraphLaunch", (, uintptr_t exec, vmmrt_stream s), (, exec, s)) \
	/* the handle exec_launch takes for one of the backend's own graphs (tests) */ \
	X(graph_exec, NONE, "cuGraphInstantiate", (, vmmrt__bgraph *g, uintptr_t *out), (, g, out)) \
	\
	/* the built-in kernels */ \
	X(kernel_launch, PLAIN, "cuLaunchKernel", (, vmmrt_stream s, vmmrt__kernel_id k, const vmmrt__kernel_args *args), \
	  (, s, k, args))

/*
 * A backend's side of the list. With VMMRT__OP_PREFIX defined as the prefix
 * of its functions (vmmrt__host_): VMMRT__BACKEND_DECLS declares them all,
 * VMMRT__BACKEND_TABLE(name, open, close) is its table, filled with them,
 * so a backend that lacks one does not build.
 */
#define VMMRT__OP_DECL(op, door, call, params, args) \
	vmmrt_status VMMRT__PASTE(VMMRT__OP_PREFIX, op)(vmmrt__backend * b VMMRT__LIST params);
#define VMMRT__OP_DECL_T(op, call, params, args, bytes) VMMRT__OP_DECL(op, VMM, call, params, args)
#define VMMRT__BACKEND_DECLS VMMRT__BACKEND_OPS(VMMRT__OP_DECL, VMMRT__OP_DECL_T)
#define VMMRT__OP_ENTRY(op, door, call, params, args) .op = VMMRT__PASTE(VMMRT__OP_PREFIX, op),
#define VMMRT__OP_ENTRY_T(op, call, params, args, bytes) VMMRT__OP_ENTRY(op, VMM, call, params, args)
#define VMMRT__BACKEND_ENTRIES VMMRT__BACKEND_OPS(VMMRT__OP_ENTRY, VMMRT__OP_ENTRY_T)
#define VMMRT__BACKEND_TABLE(name_, open_, close_) {.name = name_, .open = open_, .close = close_, VMMRT__BACKEND_ENTRIES}

#endif

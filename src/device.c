/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The public device helpers: streams, pinned memory, synchronous copies,
 * built-in kernels and graphs, forwarded to the backend through driver.c so
 * the same program runs on the host backend and on a GPU.
 */
#include "config.h"

#include "api.h"
#include "error.h"
#include "runtime.h"

vmmrt_status vmmrt_stream_create(vmmrt_runtime *rt, vmmrt_stream *out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	return vmmrt__drv_stream_create(rt, out);
}

vmmrt_status vmmrt_stream_destroy(vmmrt_runtime *rt, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	if (VMMRT__IS_DEFAULT_STREAM(stream))
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
				    "%s: %p is a default stream (NULL, VMMRT_STREAM_LEGACY or VMMRT_STREAM_PER_THREAD), "
				    "which is never destroyed", __func__, (void *)stream);
	return vmmrt__drv_stream_destroy(rt, stream);
}

vmmrt_status vmmrt_stream_synchronize(vmmrt_runtime *rt, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	return vmmrt__drv_stream_synchronize(rt, stream);
}

vmmrt_status vmmrt_host_alloc(vmmrt_runtime *rt, size_t bytes, void **out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	if (bytes == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "host allocation of 0 bytes");
	return vmmrt__drv_host_alloc(rt, bytes, out);
}

vmmrt_status vmmrt_host_free(vmmrt_runtime *rt, void *ptr)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	if (!ptr)
		return VMMRT_OK;
	return vmmrt__drv_host_free(rt, ptr);
}

/* One shared stream for the synchronous helpers: they are for setup and checks. */
static vmmrt_status sync_copy(vmmrt_runtime *rt, vmmrt_devptr dev, void *host, size_t bytes, bool to_device)
{
	if (bytes == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "copy of 0 bytes");
	VMMRT__CHECK_ARG(dev && host, "NULL address");
	pthread_mutex_lock(&rt->sync_lock);
	vmmrt_status st = to_device ? vmmrt__drv_memcpy_htod_async(rt, dev, host, bytes, rt->sync_stream)
				    : vmmrt__drv_memcpy_dtoh_async(rt, host, dev, bytes, rt->sync_stream);
	vmmrt_status st2 = vmmrt__drv_stream_synchronize(rt, rt->sync_stream);
	pthread_mutex_unlock(&rt->sync_lock);
	return st != VMMRT_OK ? st : st2;
}

vmmrt_status vmmrt_copy_to_device(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t bytes)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	return sync_copy(rt, dst, (void *)src, bytes, true);
}

vmmrt_status vmmrt_copy_to_host(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t bytes)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	return sync_copy(rt, src, dst, bytes, false);
}

static vmmrt_status kernel(vmmrt_runtime *rt, vmmrt_stream s, vmmrt__kernel_id k, const vmmrt__kernel_args *a)
{
	if ((k == VMMRT_KERNEL_FILL || k == VMMRT_KERNEL_CHECKSUM) && (a->bytes == 0 || a->bytes % 8))
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "kernel over %zu bytes: need a non-zero multiple of 8",
				   a->bytes);
	return vmmrt__drv_kernel_launch(rt, s, k, a);
}

vmmrt_status vmmrt_kernel_fill(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr dst, size_t bytes, uint64_t seed)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(dst, "dst is 0");
	return kernel(rt, stream, VMMRT_KERNEL_FILL, &(vmmrt__kernel_args){.dst = dst, .bytes = bytes, .seed = seed});
}

vmmrt_status vmmrt_kernel_checksum(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr src, size_t bytes,
				   vmmrt_devptr result)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(src && result, "address is 0");
	return kernel(rt, stream, VMMRT_KERNEL_CHECKSUM,
		      &(vmmrt__kernel_args){.src = src, .out = result, .bytes = bytes});
}

vmmrt_status vmmrt_kernel_busy(vmmrt_runtime *rt, vmmrt_stream stream, uint64_t nanoseconds)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	return kernel(rt, stream, VMMRT_KERNEL_BUSY, &(vmmrt__kernel_args){.ns = nanoseconds});
}

vmmrt_status vmmrt_kernel_layer(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_devptr dst, vmmrt_devptr src,
				size_t bytes, uint64_t seed, uint64_t nanoseconds)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(dst, "dst is 0");
	if (bytes == 0 || bytes % 8)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "layer kernel over %zu bytes: need a non-zero multiple of 8",
				   bytes);
	return kernel(rt, stream, VMMRT_KERNEL_LAYER,
		      &(vmmrt__kernel_args){.dst = dst, .src = src, .bytes = bytes, .seed = seed, .ns = nanoseconds});
}

vmmrt_status vmmrt_graph_begin_capture(vmmrt_runtime *rt, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	return vmmrt__drv_stream_begin_capture(rt, stream);
}

vmmrt_status vmmrt_graph_end_capture(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_graph **out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	return vmmrt__drv_stream_end_capture(rt, stream, (vmmrt__bgraph **)out);
}

vmmrt_status vmmrt_graph_launch(vmmrt_runtime *rt, vmmrt_graph *graph, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(graph, "graph is NULL");
	return vmmrt__drv_graph_launch(rt, (vmmrt__bgraph *)graph, stream);
}

vmmrt_status vmmrt_graph_destroy(vmmrt_runtime *rt, vmmrt_graph *graph)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(graph, "graph is NULL");
	return vmmrt__drv_graph_destroy(rt, (vmmrt__bgraph *)graph);
}

static vmmrt_status async_copy(vmmrt_runtime *rt, vmmrt_devptr dev, void *host, size_t bytes, vmmrt_stream s,
			       bool to_device)
{
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(dev && host, "NULL address");
	if (bytes == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "copy of 0 bytes");
	return to_device ? vmmrt__drv_memcpy_htod_async(rt, dev, host, bytes, s)
			 : vmmrt__drv_memcpy_dtoh_async(rt, host, dev, bytes, s);
}

vmmrt_status vmmrt_copy_to_device_async(vmmrt_runtime *rt, vmmrt_devptr dst, const void *src, size_t bytes,
					vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	return async_copy(rt, dst, (void *)src, bytes, stream, true);
}

vmmrt_status vmmrt_copy_to_host_async(vmmrt_runtime *rt, void *dst, vmmrt_devptr src, size_t bytes,
				      vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	return async_copy(rt, src, dst, bytes, stream, false);
}

/* A public event is the backend's event itself, as a public graph is. */
#define EVENT(e) ((vmmrt__bevent *)(e))

vmmrt_status vmmrt_event_create(vmmrt_runtime *rt, unsigned int flags, vmmrt_event **out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	if (flags & ~VMMRT_EVENT_TIMING)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown flags 0x%x (only VMMRT_EVENT_TIMING)",
				    __func__, flags & ~VMMRT_EVENT_TIMING);
	vmmrt__bevent *e = NULL;
	vmmrt_status st = vmmrt__drv_event_create(rt, (flags & VMMRT_EVENT_TIMING) != 0, &e);
	*out = st == VMMRT_OK ? (vmmrt_event *)e : NULL;
	return st;
}

vmmrt_status vmmrt_event_destroy(vmmrt_runtime *rt, vmmrt_event *event)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	if (!event)
		return VMMRT_OK;
	return vmmrt__drv_event_destroy(rt, EVENT(event));
}

vmmrt_status vmmrt_event_record(vmmrt_runtime *rt, vmmrt_event *event, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(event, "event is NULL");
	return vmmrt__drv_event_record(rt, EVENT(event), stream);
}

vmmrt_status vmmrt_event_query(vmmrt_runtime *rt, vmmrt_event *event, int *done)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(event && done, "NULL argument");
	bool d = false;
	vmmrt_status st = vmmrt__drv_event_query(rt, EVENT(event), &d);
	*done = st == VMMRT_OK && d;
	return st;
}

vmmrt_status vmmrt_event_synchronize(vmmrt_runtime *rt, vmmrt_event *event)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(event, "event is NULL");
	return vmmrt__drv_event_synchronize(rt, EVENT(event));
}

vmmrt_status vmmrt_event_elapsed_ms(vmmrt_runtime *rt, vmmrt_event *start, vmmrt_event *end, float *ms)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(start && end && ms, "NULL argument");
	return vmmrt__drv_event_elapsed_ms(rt, EVENT(start), EVENT(end), ms);
}

vmmrt_status vmmrt_stream_wait_event(vmmrt_runtime *rt, vmmrt_stream stream, vmmrt_event *event)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(event, "event is NULL");
	return vmmrt__drv_stream_wait_event(rt, stream, EVENT(event));
}

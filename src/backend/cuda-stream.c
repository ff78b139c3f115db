/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The CUDA backend's streams, events, copies, graphs and built-in kernels.
 * The kernels (src/kernels/vmmrt_kernels.cu) are compiled by nvcc at build
 * time into a fatbin embedded in the library (cuda.mk) and loaded once per
 * open with cuModuleLoadData.
 */
#include "config.h"

#include "backend/cuda-internal.h"

#ifdef VMMRT__CUDA_IMPL

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------ streams and events */

vmmrt_status vmmrt__cuda_stream_create(vmmrt__backend *b, vmmrt_stream *out)
{
	CUstream s = NULL;

	ROLE_CHECK("cuStreamCreate");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuStreamCreate", vmmrt__cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate(non-blocking)");
	*out = (vmmrt_stream)s;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_destroy(vmmrt__backend *b, vmmrt_stream s)
{
	ROLE_CHECK("cuStreamDestroy");
	VMMRT__CHECK_ARG(s != NULL, "NULL stream");
	CU_CALL(b, "cuStreamDestroy", vmmrt__cu.StreamDestroy(CU_STREAM(s)), "cuStreamDestroy(%p)", (void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_synchronize(vmmrt__backend *b, vmmrt_stream s)
{
	CU_CALL(b, "cuStreamSynchronize", vmmrt__cu.StreamSynchronize(CU_STREAM(s)), "cuStreamSynchronize(%p)", (void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_query(vmmrt__backend *b, vmmrt_stream s, bool *done)
{
	VMMRT__CHECK_ARG(done != NULL, "NULL result");
	CU_QUERY(b, "cuStreamQuery", vmmrt__cu.StreamQuery(CU_STREAM(s)), done, "cuStreamQuery(%p)", (void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_wait_event(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e)
{
	ROLE_CHECK("cuStreamWaitEvent");
	VMMRT__CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuStreamWaitEvent", vmmrt__cu.StreamWaitEvent(CU_STREAM(s), CU_EVENT(e), CU_EVENT_WAIT_DEFAULT),
		"cuStreamWaitEvent(%p, %p)", (void *)s, (void *)e);
	return VMMRT_OK;
}

/* cuStreamWaitValue32 (>= value) or cuStreamWriteValue32: one signature, the same checks. */
static vmmrt_status value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value, bool wait)
{
	const char *op = wait ? "cuStreamWaitValue32" : "cuStreamWriteValue32";
	PFN_cuStreamWaitValue32_v11070 fn = wait ? vmmrt__cu.StreamWaitValue32 : vmmrt__cu.StreamWriteValue32;

	ROLE_CHECK(op);
	VMMRT__CHECK_ARG(addr != 0 && addr % 4 == 0, "address 0 or not 4-byte aligned");
	CU_CALL(b, op,
		fn(CU_STREAM(s), (CUdeviceptr)addr, value, wait ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WRITE_VALUE_DEFAULT),
		"%s(%p, 0x%llx, %s%u)", op, (void *)s, (unsigned long long)addr, wait ? ">= " : "", value);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_wait_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	return value32(b, s, addr, value, true);
}

vmmrt_status vmmrt__cuda_stream_write_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	return value32(b, s, addr, value, false);
}

vmmrt_status vmmrt__cuda_event_create(vmmrt__backend *b, bool timing, vmmrt__bevent **out)
{
	CUevent e = NULL;

	ROLE_CHECK("cuEventCreate");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuEventCreate", vmmrt__cu.EventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
		"cuEventCreate(%s)", timing ? "timing" : "disable timing");
	*out = (vmmrt__bevent *)e;
	return VMMRT_OK;
}

/* An op that is one cu<Name>(event) call. */
#define CU_EVENT_CALL(b, e, Name) \
	do { \
		ROLE_CHECK("cu" #Name); \
		VMMRT__CHECK_ARG(e != NULL, "NULL event"); \
		CU_CALL(b, "cu" #Name, vmmrt__cu.Name(CU_EVENT(e)), "cu" #Name "(%p)", (void *)e); \
		return VMMRT_OK; \
	} while (0)

vmmrt_status vmmrt__cuda_event_destroy(vmmrt__backend *b, vmmrt__bevent *e)
{
	CU_EVENT_CALL(b, e, EventDestroy);
}

vmmrt_status vmmrt__cuda_event_record(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s)
{
	ROLE_CHECK("cuEventRecord");
	VMMRT__CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuEventRecord", vmmrt__cu.EventRecord(CU_EVENT(e), CU_STREAM(s)), "cuEventRecord(%p, %p)", (void *)e,
		(void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_event_query(vmmrt__backend *b, vmmrt__bevent *e, bool *done)
{
	ROLE_CHECK("cuEventQuery");
	VMMRT__CHECK_ARG(e != NULL && done != NULL, "NULL event or result");
	CU_QUERY(b, "cuEventQuery", vmmrt__cu.EventQuery(CU_EVENT(e)), done, "cuEventQuery(%p)", (void *)e);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_event_synchronize(vmmrt__backend *b, vmmrt__bevent *e)
{
	CU_EVENT_CALL(b, e, EventSynchronize);
}

vmmrt_status vmmrt__cuda_event_elapsed_ms(vmmrt__backend *b, vmmrt__bevent *start, vmmrt__bevent *end, float *ms)
{
	float v = 0.0f;

	ROLE_CHECK("cuEventElapsedTime");
	VMMRT__CHECK_ARG(start != NULL && end != NULL, "NULL event");
	VMMRT__CHECK_ARG(ms != NULL, "NULL output");
	CU_CALL(b, "cuEventElapsedTime", vmmrt__cu.EventElapsedTime(&v, CU_EVENT(start), CU_EVENT(end)),
		"cuEventElapsedTime(%p, %p)", (void *)start, (void *)end);
	*ms = v;
	return VMMRT_OK;
}

/* ------------------------------------------------------------ copies and pinned memory */

vmmrt_status vmmrt__cuda_memcpy_htod_async(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n,
					   vmmrt_stream s)
{
	ROLE_CHECK("cuMemcpyHtoDAsync");
	VMMRT__CHECK_ARG(src != NULL || n == 0, "NULL source");
	CU_CALL(b, "cuMemcpyHtoDAsync", vmmrt__cu.MemcpyHtoDAsync((CUdeviceptr)dst, src, n, CU_STREAM(s)),
		"cuMemcpyHtoDAsync(0x%llx, %p, %zu)", (unsigned long long)dst, src, n);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_memcpy_dtoh_async(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	ROLE_CHECK("cuMemcpyDtoHAsync");
	VMMRT__CHECK_ARG(dst != NULL || n == 0, "NULL destination");
	CU_CALL(b, "cuMemcpyDtoHAsync", vmmrt__cu.MemcpyDtoHAsync(dst, (CUdeviceptr)src, n, CU_STREAM(s)),
		"cuMemcpyDtoHAsync(%p, 0x%llx, %zu)", dst, (unsigned long long)src, n);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_memcpy_dtod_async(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n,
					   vmmrt_stream s)
{
	CU_CALL(b, "cuMemcpyDtoDAsync", vmmrt__cu.MemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, CU_STREAM(s)),
		"cuMemcpyDtoDAsync(0x%llx, 0x%llx, %zu)", (unsigned long long)dst, (unsigned long long)src, n);
	return VMMRT_OK;
}

/* ------------------------------------------------------------ graphs */

/*
 * CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: the runtime's driver workers keep
 * making VMM calls (cuMemCreate, cuMemMap, cuMemRelease, ...) while the
 * application thread captures; in GLOBAL mode any thread's "potentially
 * unsafe" call during a capture fails and invalidates the capture. THREAD_LOCAL
 * ignores other threads but still refuses unsafe calls made by the capturing
 * thread itself (VMMRT_E_CAPTURE), which RELAXED would let through silently
 * though they would not be part of the graph. It also requires
 * stream_end_capture on the thread that began the capture.
 */
vmmrt_status vmmrt__cuda_stream_begin_capture(vmmrt__backend *b, vmmrt_stream s)
{
	ROLE_CHECK("cuStreamBeginCapture");
	VMMRT__CHECK_ARG(s != NULL, "NULL stream (the legacy stream cannot capture)");
	CU_CALL(b, "cuStreamBeginCapture", vmmrt__cu.StreamBeginCapture(CU_STREAM(s), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
		"cuStreamBeginCapture(%p, thread-local)", (void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_stream_end_capture(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	cuuint64_t id = 0;
	struct vmmrt__bgraph *g;
	struct hostfn_rec *recs;
	CUgraph graph = NULL;
	CUgraphExec exec = NULL;
	CUresult r;
	int pushed, have_id;

	ROLE_CHECK("cuStreamEndCapture");
	VMMRT__CHECK_ARG(s != NULL, "NULL stream");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	*out = NULL;
	OP_ENTER(b, "cuStreamEndCapture", pushed);

	/* the capture's id, to find the records of its host nodes */
	r = vmmrt__cu.StreamGetCaptureInfo(CU_STREAM(s), &cs, &id, NULL, NULL, NULL, NULL);
	/* the id is valid only for an active capture; the records of an
	 * invalidated one (never run) stay on the list until close */
	have_id = r == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE;

	r = vmmrt__cu.StreamEndCapture(CU_STREAM(s), &graph);
	recs = have_id ? vmmrt__cuda_capture_recs_take(b, id) : NULL;
	if (r != CUDA_SUCCESS) {
		vmmrt__cuda_ctx_leave(pushed);
		if (graph != NULL)
			vmmrt__cu.GraphDestroy(graph);
		vmmrt__cuda_hostfn_free_list(recs);
		return vmmrt__cuda_error(r, "cuStreamEndCapture(%p)", (void *)s);
	}
	r = vmmrt__cu.GraphInstantiateWithFlags(&exec, graph, 0);
	if (r != CUDA_SUCCESS) {
		vmmrt__cu.GraphDestroy(graph);
		vmmrt__cuda_ctx_leave(pushed);
		vmmrt__cuda_hostfn_free_list(recs);
		return vmmrt__cuda_error(r, "cuGraphInstantiate(%p)", (void *)s);
	}
	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		vmmrt__cu.GraphExecDestroy(exec);
		vmmrt__cu.GraphDestroy(graph);
		vmmrt__cuda_ctx_leave(pushed);
		vmmrt__cuda_hostfn_free_list(recs);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuStreamEndCapture: no memory for the graph");
	}
	vmmrt__cuda_ctx_leave(pushed);
	g->graph = graph;
	g->exec = exec;
	g->recs = recs;
	pthread_mutex_lock(&b->lock);
	g->next = b->graphs;
	if (b->graphs != NULL)
		b->graphs->prev = g;
	b->graphs = g;
	pthread_mutex_unlock(&b->lock);
	*out = g;
	return VMMRT_OK;
}

/*
 * An invalidated capture counts as capturing: the stream stays in capture mode
 * until cuStreamEndCapture, and work enqueued meanwhile does not run either.
 */
vmmrt_status vmmrt__cuda_stream_is_capturing(vmmrt__backend *b, vmmrt_stream s, bool *out)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;

	ROLE_CHECK("cuStreamIsCapturing");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuStreamIsCapturing", vmmrt__cu.StreamIsCapturing(CU_STREAM(s), &cs), "cuStreamIsCapturing(%p)",
		(void *)s);
	*out = cs == CU_STREAM_CAPTURE_STATUS_ACTIVE || cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_graph_launch(vmmrt__backend *b, vmmrt__bgraph *g, vmmrt_stream s)
{
	ROLE_CHECK("cuGraphLaunch");
	VMMRT__CHECK_ARG(g != NULL, "NULL graph");
	CU_CALL(b, "cuGraphLaunch", vmmrt__cu.GraphLaunch(g->exec, CU_STREAM(s)), "cuGraphLaunch(%p, %p)", (void *)g,
		(void *)s);
	return VMMRT_OK;
}

/* The driver checks a CUgraphExec when it is launched: here, only that there is one. */
vmmrt_status vmmrt__cuda_exec_check(vmmrt__backend *b, uintptr_t exec)
{
	(void)b;
	VMMRT__CHECK_ARG(exec != 0, "NULL executable graph");
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_exec_launch(vmmrt__backend *b, uintptr_t exec, vmmrt_stream s)
{
	ROLE_CHECK("cuGraphLaunch");
	VMMRT__CHECK_ARG(exec != 0, "NULL executable graph");
	CU_CALL(b, "cuGraphLaunch", vmmrt__cu.GraphLaunch((CUgraphExec)exec, CU_STREAM(s)), "cuGraphLaunch(%p, %p)",
		(void *)exec, (void *)s);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_graph_exec(vmmrt__backend *b, vmmrt__bgraph *g, uintptr_t *out)
{
	(void)b;
	VMMRT__CHECK_ARG(g != NULL && out != NULL, "NULL graph or output");
	*out = (uintptr_t)g->exec;
	return VMMRT_OK;
}

void vmmrt__cuda_graphs_free(vmmrt__backend *b)
{
	struct vmmrt__bgraph *g;

	pthread_mutex_lock(&b->lock);
	while ((g = b->graphs) != NULL) {
		b->graphs = g->next;
		vmmrt__cu.GraphExecDestroy(g->exec);
		vmmrt__cu.GraphDestroy(g->graph);
		vmmrt__cuda_hostfn_free_list(g->recs);
		free(g);
	}
	pthread_mutex_unlock(&b->lock);
}

vmmrt_status vmmrt__cuda_graph_destroy(vmmrt__backend *b, vmmrt__bgraph *g)
{
	CUresult r1, r2;
	int pushed;

	ROLE_CHECK("cuGraphExecDestroy");
	VMMRT__CHECK_ARG(g != NULL, "NULL graph");
	OP_ENTER(b, "cuGraphExecDestroy", pushed);
	r1 = vmmrt__cu.GraphExecDestroy(g->exec);
	r2 = vmmrt__cu.GraphDestroy(g->graph);
	vmmrt__cuda_ctx_leave(pushed);

	pthread_mutex_lock(&b->lock);
	if (g->prev != NULL)
		g->prev->next = g->next;
	else
		b->graphs = g->next;
	if (g->next != NULL)
		g->next->prev = g->prev;
	/* a replay may still be running: its host nodes' records go at close */
	vmmrt__cuda_retire_recs(b, g->recs);
	pthread_mutex_unlock(&b->lock);
	free(g);

	if (r1 != CUDA_SUCCESS)
		return vmmrt__cuda_error(r1, "cuGraphExecDestroy");
	if (r2 != CUDA_SUCCESS)
		return vmmrt__cuda_error(r2, "cuGraphDestroy");
	return VMMRT_OK;
}

/* ------------------------------------------------------------ kernels */

#ifdef HAVE_NVCC_KERNELS
extern const unsigned char vmmrt__kernels_fatbin[] __attribute__((visibility("hidden")));
extern const size_t vmmrt__kernels_fatbin_size __attribute__((visibility("hidden")));

static const char *const kernel_names[CK_COUNT_] = {
	[CK_FILL] = "vmmrt__k_fill",
	[CK_ZERO64] = "vmmrt__k_zero64",
	[CK_CHECKSUM] = "vmmrt__k_checksum",
	[CK_BUSY] = "vmmrt__k_busy",
	[CK_LAYER] = "vmmrt__k_layer",
};

/*
 * Load the embedded fatbin (sm_90 code + compute_90 PTX) in b's context. A
 * failure (say, a GPU the fatbin has no code for) leaves the backend usable
 * without kernels: kernel_launch then reports why.
 */
void vmmrt__cuda_load_kernels(vmmrt__backend *b)
{
	CUresult r;

	if (vmmrt__kernels_fatbin_size == 0) {
		snprintf(b->kernel_error, sizeof(b->kernel_error), "the embedded kernel fatbin is empty");
		return;
	}
	r = vmmrt__cu.ModuleLoadData(&b->module, vmmrt__kernels_fatbin);
	if (r != CUDA_SUCCESS) {
		b->module = NULL;
		snprintf(b->kernel_error, sizeof(b->kernel_error), "cuModuleLoadData(%zu bytes): %s (%s)",
			 vmmrt__kernels_fatbin_size, vmmrt__cuda_error_name(r), vmmrt__cuda_error_text(r));
		return;
	}
	for (int k = 0; k < CK_COUNT_; k++) {
		const char *call = "cuModuleGetFunction";

		r = vmmrt__cu.ModuleGetFunction(&b->fn[k], b->module, kernel_names[k]);
#if CUDA_VERSION >= 12040
		/* with lazy loading (the default) this loads the code now rather
		 * than at the first launch, which may be on the hot path or in a
		 * capture */
		if (r == CUDA_SUCCESS && vmmrt__cu.FuncLoad != NULL) {
			call = "cuFuncLoad";
			r = vmmrt__cu.FuncLoad(b->fn[k]);
		}
#endif
		if (r != CUDA_SUCCESS) {
			snprintf(b->kernel_error, sizeof(b->kernel_error), "%s(%s): %s (%s)", call, kernel_names[k],
				 vmmrt__cuda_error_name(r), vmmrt__cuda_error_text(r));
			vmmrt__cu.ModuleUnload(b->module);
			b->module = NULL;
			return;
		}
	}
}
#endif

#ifdef HAVE_NVCC_KERNELS
static unsigned grid_for(const vmmrt__backend *b, uint64_t nwords)
{
	uint64_t blocks = (nwords + CUDA_KERNEL_THREADS - 1) / CUDA_KERNEL_THREADS;

	if (blocks < 1)
		blocks = 1;
	if (blocks > b->max_grid)
		blocks = b->max_grid;
	return (unsigned)blocks;
}

static CUresult launch(vmmrt__backend *b, CUstream s, enum cuda_kernel k, unsigned grid, unsigned block,
		       void **params)
{
	return vmmrt__cu.LaunchKernel(b->fn[k], grid, 1, 1, block, 1, 1, 0, s, params, NULL);
}

static vmmrt_status kernel_args_check(vmmrt__kernel_id k, const vmmrt__kernel_args *a)
{
	switch (k) {
	case VMMRT_KERNEL_FILL:
		if (a->bytes >= 8 && (a->dst == 0 || a->dst % 8 != 0))
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "kernel fill: dst 0x%llx is 0 or not 8-byte aligned",
					   (unsigned long long)a->dst);
		return VMMRT_OK;
	case VMMRT_KERNEL_CHECKSUM:
		if (a->bytes % 8 != 0)
			return vmmrt__error(VMMRT_E_INVALID_SIZE, "kernel checksum: %zu bytes is not a multiple of 8",
					   a->bytes);
		if (a->bytes > 0 && (a->src == 0 || a->src % 8 != 0))
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
					   "kernel checksum: src 0x%llx is 0 or not 8-byte aligned",
					   (unsigned long long)a->src);
		if (a->out == 0 || a->out % 8 != 0)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
					   "kernel checksum: out 0x%llx is 0 or not 8-byte aligned",
					   (unsigned long long)a->out);
		return VMMRT_OK;
	case VMMRT_KERNEL_BUSY:
		return VMMRT_OK;
	case VMMRT_KERNEL_LAYER:
		if (a->bytes >= 8 && (a->dst == 0 || a->dst % 8 != 0))
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "kernel layer: dst 0x%llx is 0 or not 8-byte aligned",
					   (unsigned long long)a->dst);
		if (a->src % 8 != 0)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "kernel layer: src 0x%llx is not 8-byte aligned",
					   (unsigned long long)a->src);
		return VMMRT_OK;
	default:
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "kernel_launch: unknown kernel %d", (int)k);
	}
}
#endif

vmmrt_status vmmrt__cuda_kernel_launch(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k,
				       const vmmrt__kernel_args *args)
{
	ROLE_CHECK("cuLaunchKernel");
	VMMRT__CHECK_ARG(b != NULL, "NULL backend");
	VMMRT__CHECK_ARG(args != NULL, "NULL kernel arguments");
#ifndef HAVE_NVCC_KERNELS
	(void)s;
	(void)k;
	return vmmrt__error(VMMRT_E_NOT_SUPPORTED, "%s", b->kernel_error);
#else
	{
		vmmrt_status st = kernel_args_check(k, args);
		unsigned long long dst = args->dst, src = args->src, out = args->out;
		unsigned long long nwords = args->bytes / 8, seed = args->seed, ns = args->ns;
		CUstream cs = CU_STREAM(s);
		const char *what = "";
		CUresult r = CUDA_SUCCESS;
		int pushed;

		if (st != VMMRT_OK)
			return st;
		if (b->module == NULL)
			return vmmrt__error(VMMRT_E_NOT_SUPPORTED, "kernels unavailable: %s", b->kernel_error);
		OP_ENTER(b, "cuLaunchKernel", pushed);
		switch (k) {
		case VMMRT_KERNEL_FILL: {
			void *params[] = {&dst, &nwords, &seed};

			what = "vmmrt__k_fill";
			if (nwords > 0)
				r = launch(b, cs, CK_FILL, grid_for(b, nwords), CUDA_KERNEL_THREADS, params);
			break;
		}
		case VMMRT_KERNEL_CHECKSUM: {
			void *zero_params[] = {&out};
			void *params[] = {&src, &nwords, &out};

			/* *out = 0 then += per block, in stream order */
			what = "vmmrt__k_zero64";
			r = launch(b, cs, CK_ZERO64, 1, 1, zero_params);
			if (r == CUDA_SUCCESS && nwords > 0) {
				what = "vmmrt__k_checksum";
				r = launch(b, cs, CK_CHECKSUM, grid_for(b, nwords), CUDA_KERNEL_THREADS, params);
			}
			break;
		}
		case VMMRT_KERNEL_BUSY: {
			void *params[] = {&ns};

			what = "vmmrt__k_busy";
			r = launch(b, cs, CK_BUSY, 1, 1, params);
			break;
		}
		case VMMRT_KERNEL_LAYER: {
			void *params[] = {&dst, &src, &nwords, &seed, &ns};

			what = "vmmrt__k_layer";
			r = launch(b, cs, CK_LAYER, grid_for(b, nwords), CUDA_KERNEL_THREADS, params);
			break;
		}
		default:
			break;
		}
		vmmrt__cuda_ctx_leave(pushed);
		if (r != CUDA_SUCCESS)
			return vmmrt__cuda_error(r, "cuLaunchKernel(%s, %zu bytes)", what, args->bytes);
		return VMMRT_OK;
	}
#endif
}

#endif /* VMMRT__CUDA_IMPL */

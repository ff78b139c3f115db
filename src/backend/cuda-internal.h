/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The CUDA backend's shared parts. Its files, what each holds and which
 * calls which: src/README (layers 4 to 7). What they share is here: the entry-point table, the error helpers, the
 * per-device state and the prologue of every op (the context switch).
 */
#ifndef VMMRT__CUDA_INTERNAL_H
#define VMMRT__CUDA_INTERNAL_H

#include "backend/backend.h"
#include "error.h"

#ifdef HAVE_CUDA_H
#include <cuda.h>
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12000
#define VMMRT__CUDA_IMPL 1
#endif
#endif

#ifdef VMMRT__CUDA_IMPL

#include <pthread.h>

#include <cudaTypedefs.h>

/* ------------------------------------------------------------ driver table */

/*
 * X(name, version): the entry point cu<name>, its ABI as of CUDA <version>
 * (the PFN_cu<name>_v<version> typedef of cudaTypedefs.h, so the compiler
 * checks every call against the ABI we ask the driver for).
 */
#if CUDA_VERSION >= 12080
#define VMMRT__CU_EVENT_ELAPSED_VERSION 12080 /* cuEventElapsedTime_v2 */
#else
#define VMMRT__CU_EVENT_ELAPSED_VERSION 2000
#endif

/* The oldest driver (cuDriverGetVersion's number) that has every required entry point. */
#define VMMRT__CU_MIN_DRIVER 12030

#define VMMRT__CU_REQUIRED(X) \
	X(Init, 2000) \
	X(DriverGetVersion, 2020) \
	X(GetErrorName, 6000) \
	X(GetErrorString, 6000) \
	X(DeviceGetCount, 2000) \
	X(DeviceGet, 2000) \
	X(DeviceGetAttribute, 2000) \
	X(DeviceGetName, 2000) \
	X(DevicePrimaryCtxRetain, 7000) \
	X(DevicePrimaryCtxRelease, 11000) \
	X(CtxGetCurrent, 4000) \
	X(CtxSetCurrent, 4000) \
	X(CtxPushCurrent, 4000) \
	X(CtxPopCurrent, 4000) \
	X(MemGetAllocationGranularity, 10020) \
	X(MemAddressReserve, 10020) \
	X(MemAddressFree, 10020) \
	X(MemCreate, 10020) \
	X(MemRelease, 10020) \
	X(MemMap, 10020) \
	X(MemUnmap, 10020) \
	X(MemSetAccess, 10020) \
	X(MemGetInfo, 3020) \
	X(MemAlloc, 3020) \
	X(MemFree, 3020) \
	X(StreamCreate, 2000) \
	X(StreamDestroy, 4000) \
	X(StreamSynchronize, 2000) \
	X(StreamQuery, 2000) \
	X(StreamWaitEvent, 3020) \
	X(StreamWaitValue32, 11070) \
	X(StreamWriteValue32, 11070) \
	X(StreamBeginCapture, 10010) \
	X(StreamEndCapture, 10000) \
	X(StreamGetCaptureInfo, 12030) \
	X(StreamIsCapturing, 10000) \
	X(EventCreate, 2000) \
	X(EventDestroy, 4000) \
	X(EventRecord, 2000) \
	X(EventQuery, 2000) \
	X(EventSynchronize, 2000) \
	X(EventElapsedTime, VMMRT__CU_EVENT_ELAPSED_VERSION) \
	X(LaunchHostFunc, 10000) \
	X(MemcpyHtoDAsync, 3020) \
	X(MemcpyDtoHAsync, 3020) \
	X(MemcpyDtoDAsync, 3020) \
	X(MemHostAlloc, 2020) \
	X(MemFreeHost, 2000) \
	X(MemHostGetDevicePointer, 3020) \
	X(GraphInstantiateWithFlags, 11040) \
	X(GraphLaunch, 10000) \
	X(GraphDestroy, 10000) \
	X(GraphExecDestroy, 10000) \
	X(ModuleLoadData, 2000) \
	X(ModuleUnload, 2000) \
	X(ModuleGetFunction, 2000) \
	X(LaunchKernel, 4000)

/* Used when present: cuFuncLoad forces a lazily loaded kernel in at open. */
#if CUDA_VERSION >= 12040
#define VMMRT__CU_OPTIONAL(X) X(FuncLoad, 12040)
#else
#define VMMRT__CU_OPTIONAL(X)
#endif

/* Indirections so that a version given as a macro is expanded before pasting. */
#define CU_FIELD(name, version) CU_FIELD_(name, version)
#define CU_FIELD_(name, version) PFN_cu##name##_v##version name;

struct vmmrt__cu_api {
	VMMRT__CU_REQUIRED(CU_FIELD)
	VMMRT__CU_OPTIONAL(CU_FIELD)
};

/* The driver's entry points, filled once per process (cuda-loader.c). */
extern struct vmmrt__cu_api vmmrt__cu;


/* ------------------------------------------------------------ cuda-loader.c */

/* Load libcuda.so.1 and its entry points once per process (pthread_once);
 * VMMRT_OK, or why there is no usable driver (with its message). */
vmmrt_status vmmrt__cuda_load(void);
/* The driver's name and text of a CUresult ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory"). */
const char *vmmrt__cuda_error_name(CUresult r);
const char *vmmrt__cuda_error_text(CUresult r);
/* Report a failed driver call: "<call>: <CUDA_ERROR_NAME> (<description>)". */
vmmrt_status vmmrt__cuda_error(CUresult r, const char *fmt, ...) VMMRT__PRINTF(2, 3);
/* VMMRT_E_NOT_PERMITTED: no driver call may be made from inside a host function. */
vmmrt_status vmmrt__cuda_refuse_host_func(const char *op);

#define ROLE_CHECK(op) \
	do { \
		if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) \
			return vmmrt__cuda_refuse_host_func(op); \
	} while (0)


/* ------------------------------------------------------------ the backend */

struct hostfn_rec;  /* cuda-hostfn.c */
struct hostfn_pool;

enum cuda_kernel {
	CK_FILL,
	CK_ZERO64,
	CK_CHECKSUM,
	CK_BUSY,
	CK_LAYER,
	CK_COUNT_
};

#define CUDA_KERNEL_THREADS 256 /* VMMRT__KERNEL_THREADS in vmmrt_kernels.cu */

struct vmmrt__bgraph {
	CUgraph graph;
	CUgraphExec exec;
	struct hostfn_rec *recs; /* records of the graph's host nodes (cuda-hostfn.c) */
	struct vmmrt__bgraph *prev, *next;
};

struct vmmrt__backend {
	int ordinal;
	CUdevice dev;
	CUcontext ctx;
	int ctx_retained;
	size_t granularity;
	CUmemAllocationProp prop; /* the one given to cuMemCreate and the granularity query */
	CUmemAccessDesc access;
	char name[128];
	unsigned max_grid;

	CUmodule module;
	CUfunction fn[CK_COUNT_];
	char kernel_error[256]; /* why there are no kernels, when module is NULL */

	struct hostfn_pool *pool;

	pthread_mutex_t lock;             /* protects the three lists below */
	struct hostfn_rec *capture_recs;  /* host nodes of captures not yet ended */
	struct hostfn_rec *retired_recs;  /* host nodes of destroyed graphs */
	struct vmmrt__bgraph *graphs;      /* live graphs */
};

/*
 * Make b's context current for one op. The common case (the worker's or the
 * opening thread's context is b's) costs one cuCtxGetCurrent; otherwise b's is
 * pushed and leave() pops it, restoring the caller's context.
 */
static inline vmmrt_status vmmrt__cuda_ctx_enter(vmmrt__backend *b, const char *op, int *pushed)
{
	CUcontext cur = NULL;
	CUresult r;

	*pushed = 0;
	r = vmmrt__cu.CtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuCtxGetCurrent (for %s)", op);
	if (cur == b->ctx)
		return VMMRT_OK;
	r = vmmrt__cu.CtxPushCurrent(b->ctx);
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuCtxPushCurrent (for %s)", op);
	*pushed = 1;
	return VMMRT_OK;
}

static inline void vmmrt__cuda_ctx_leave(int pushed)
{
	CUcontext popped;

	if (pushed)
		vmmrt__cu.CtxPopCurrent(&popped);
}

/* Role check, backend check, context: the prologue of every op. */
#define OP_ENTER(b, op, pushed) \
	do { \
		vmmrt_status st_enter_; \
		ROLE_CHECK(op); \
		if ((b) == NULL) \
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL backend", op); \
		st_enter_ = vmmrt__cuda_ctx_enter((b), op, &(pushed)); \
		if (st_enter_ != VMMRT_OK) \
			return st_enter_; \
	} while (0)

/* One driver call inside an op: enter, call, leave, report a result other
 * than success and `also` (then, with the result in r_, run `then`). */
#define CU_CALL_ACCEPT(b, op, call, also, then, ...) \
	do { \
		int pushed_; \
		CUresult r_; \
		OP_ENTER(b, op, pushed_); \
		r_ = (call); \
		vmmrt__cuda_ctx_leave(pushed_); \
		if (r_ != CUDA_SUCCESS && r_ != (also)) \
			return vmmrt__cuda_error(r_, __VA_ARGS__); \
		then; \
	} while (0)
#define CU_CALL(b, op, call, ...) CU_CALL_ACCEPT(b, op, call, CUDA_SUCCESS, (void)0, __VA_ARGS__)
/* A query: CUDA_ERROR_NOT_READY is the answer "not yet", not a failure. */
#define CU_QUERY(b, op, call, done, ...) \
	CU_CALL_ACCEPT(b, op, call, CUDA_ERROR_NOT_READY, *(done) = r_ == CUDA_SUCCESS, __VA_ARGS__)

#define CU_STREAM(s) ((CUstream)(s))
#define CU_EVENT(e) ((CUevent)(e))

/* ------------------------------------------------------------ cuda-hostfn.c */

/* The per-device pool of records for host functions outside a capture. */
struct hostfn_pool *vmmrt__cuda_hostfn_pool_create(void);
/* Free it once no record is with the driver (or leak it after a bounded wait). */
void vmmrt__cuda_hostfn_pool_destroy(struct hostfn_pool *pool);
void vmmrt__cuda_hostfn_free_list(struct hostfn_rec *r);
/* Detach the records of capture sequence id from b's list of captures not ended. */
struct hostfn_rec *vmmrt__cuda_capture_recs_take(vmmrt__backend *b, cuuint64_t id);
/* A destroyed graph's records, kept until close (a replay may still run them); b->lock held. */
void vmmrt__cuda_retire_recs(vmmrt__backend *b, struct hostfn_rec *recs);
/* At close, once the pool is destroyed and the graphs freed: the records of
 * captures never ended and of destroyed graphs. */
void vmmrt__cuda_hostfn_records_free(vmmrt__backend *b);

/* ------------------------------------------------------------ cuda-stream.c */

/* At close, b's context current and the host-function pool destroyed (the
 * GPU work its functions follow may read graph records): the graphs the
 * caller did not destroy, with their records. */
void vmmrt__cuda_graphs_free(vmmrt__backend *b);

#ifdef HAVE_NVCC_KERNELS
/* Load the embedded kernels in b's context (at open); a failure leaves b without them, and says why. */
void vmmrt__cuda_load_kernels(vmmrt__backend *b);
#endif

/* ------------------------------------------------------------ the ops */

/* Every operation of backend-ops.h: vmmrt__cuda_<op>. */
#define VMMRT__OP_PREFIX vmmrt__cuda_
VMMRT__BACKEND_DECLS

#endif /* VMMRT__CUDA_IMPL */
#endif /* VMMRT__CUDA_INTERNAL_H */

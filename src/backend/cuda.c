/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The CUDA backend: the ops table of backend.h on the CUDA driver API.
 *
 * libcuda.so.1 is dlopen()ed at run time, never linked, so one build runs with
 * and without a GPU. Only cuGetProcAddress_v2 comes from dlsym(); every other
 * entry point is asked of it with an explicit CUDA version per symbol: the
 * version in which the ABI that cuda.h declares today first appeared (plain
 * dlsym would return the oldest ABI: cuMemGetInfo with 32-bit sizes). That
 * function table is process-wide and filled once (pthread_once); everything
 * per device (context, module, host-function records) lives in the
 * vmmrt__backend, so several backends (runtimes, devices) coexist in a process.
 *
 * Rules kept by every op:
 *  - from inside a host function (thread role VMMRT_ROLE_HOST_FUNC) it fails
 *    with VMMRT_E_NOT_PERMITTED before touching the driver: a driver call there
 *    is refused by recent drivers and deadlocks older ones;
 *  - it runs in the backend's primary context: if another context (or none) is
 *    current on the calling thread, the op pushes the backend's and pops it
 *    after, so the caller's context is left as it was. bind_thread() makes it
 *    current for good, which keeps the workers on the cheap path (one
 *    cuCtxGetCurrent per op);
 *  - a failed driver call becomes a vmmrt status with a message naming the call,
 *    its main argument and the driver's error name:
 *    "cuMemCreate(268435456): CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
 *
 * The built-in kernels (src/kernels/vmmrt_kernels.cu) are compiled by nvcc at
 * build time into a fatbin embedded in the library (cuda.mk) and loaded once
 * per open with cuModuleLoadData.
 */
#include "config.h"

#include "backend/backend.h"
#include "error.h"

#ifdef HAVE_CUDA_H
#include <cuda.h>
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12000
#define VMMRT_CUDA_IMPL 1
#endif
#endif

#ifdef VMMRT_CUDA_IMPL

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cudaTypedefs.h>
#include <urcu/compiler.h>
#include <urcu/lfstack.h>

/* ------------------------------------------------------------ driver table */

/*
 * X(name, version): the entry point cu<name>, its ABI as of CUDA <version>
 * (the PFN_cu<name>_v<version> typedef of cudaTypedefs.h, so the compiler
 * checks every call against the ABI we ask the driver for).
 */
#if CUDA_VERSION >= 12080
#define VMMRT_CU_EVENT_ELAPSED_VERSION 12080 /* cuEventElapsedTime_v2 */
#else
#define VMMRT_CU_EVENT_ELAPSED_VERSION 2000
#endif

/* The oldest driver (cuDriverGetVersion's number) that has every required entry point. */
#define VMMRT_CU_MIN_DRIVER 12030

#define VMMRT_CU_REQUIRED(X) \
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
	X(EventElapsedTime, VMMRT_CU_EVENT_ELAPSED_VERSION) \
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
#define VMMRT_CU_OPTIONAL(X) X(FuncLoad, 12040)
#else
#define VMMRT_CU_OPTIONAL(X)
#endif

/* Indirections so that a version given as a macro is expanded before pasting. */
#define CU_FIELD(name, version) CU_FIELD_(name, version)
#define CU_FIELD_(name, version) PFN_cu##name##_v##version name;

static struct cu_api {
	VMMRT_CU_REQUIRED(CU_FIELD)
	VMMRT_CU_OPTIONAL(CU_FIELD)
} cu;

struct cu_symbol {
	const char *name;
	int version;
	size_t offset;
	int optional;
};

#define CU_SYM_REQUIRED(name, version) {"cu" #name, version, offsetof(struct cu_api, name), 0},
#define CU_SYM_OPTIONAL(name, version) {"cu" #name, version, offsetof(struct cu_api, name), 1},

static const struct cu_symbol cu_symbols[] = {
	VMMRT_CU_REQUIRED(CU_SYM_REQUIRED)
	VMMRT_CU_OPTIONAL(CU_SYM_OPTIONAL)
};

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static vmmrt_status cu_load_status = VMMRT_E_NO_DEVICE;
static char cu_load_message[384];
static int cu_driver_version;

/* Kept with the process: libcuda is never unloaded once cuInit has run. */
static void *cu_library;

static void cu_load_fail(vmmrt_status status, const char *fmt, ...) VMMRT_PRINTF(2, 3);

static void cu_load_fail(vmmrt_status status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cu_load_message, sizeof(cu_load_message), fmt, ap);
	va_end(ap);
	cu_load_status = status;
}

static const char *cu_error_name(CUresult r)
{
	const char *s = NULL;

	if (cu.GetErrorName != NULL && cu.GetErrorName(r, &s) == CUDA_SUCCESS && s != NULL)
		return s;
	return "CUDA_ERROR_UNRECOGNIZED";
}

static const char *cu_error_text(CUresult r)
{
	const char *s = NULL;

	if (cu.GetErrorString != NULL && cu.GetErrorString(r, &s) == CUDA_SUCCESS && s != NULL)
		return s;
	return "no description";
}

/*
 * Where the ABI we ask for is newer than the driver, cuGetProcAddress fails
 * (CUDA_ERROR_INVALID_VALUE). For these symbols the older ABI has the same C
 * signature, so an older driver is asked for that one instead.
 */
static int cu_same_signature_since(const char *name)
{
	if (strcmp(name, "cuEventElapsedTime") == 0)
		return 2000;
	return 0;
}

static void cu_load_once(void)
{
	PFN_cuGetProcAddress_v12000 get_proc;
	PFN_cuDriverGetVersion_v2020 get_version = NULL;
	CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *lib;
	void *sym;
	CUresult r;

	/* dlerror() is only meaningful right after the failing call */
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (lib == NULL) {
		const char *why = dlerror();
		cu_load_fail(VMMRT_E_NO_DEVICE, "libcuda.so.1 not found: %s", why != NULL ? why : "unknown reason");
		return;
	}
	sym = dlsym(lib, "cuGetProcAddress_v2");
	if (sym == NULL) {
		cu_load_fail(VMMRT_E_NOT_SUPPORTED,
			     "libcuda.so.1 has no cuGetProcAddress_v2: the driver is older than CUDA 12.0");
		dlclose(lib);
		return;
	}
	memcpy(&get_proc, &sym, sizeof(get_proc));

	/*
	 * 12.0 brings cuGetProcAddress_v2 and stream memory operations "v2",
	 * available on every device without the NVreg_EnableStreamMemOPs module
	 * option that the v1 ones needed (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1
	 * describes v1 only and is deprecated; 32-bit wait/write v2 have no attribute).
	 */
	sym = NULL;
	r = get_proc("cuDriverGetVersion", &sym, 2020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
	if (r == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && sym != NULL)
		memcpy(&get_version, &sym, sizeof(get_version));
	if (get_version == NULL || get_version(&cu_driver_version) != CUDA_SUCCESS) {
		cu_load_fail(VMMRT_E_NOT_SUPPORTED, "libcuda.so.1: cuDriverGetVersion unavailable or failing");
		dlclose(lib);
		return;
	}
	/* The newest entry point required above (cuStreamGetCaptureInfo v3,
	 * which tells a capturing stream apart) is 12.3's: one minimum, stated
	 * the same in README and vmmrt(7). */
	if (cu_driver_version < VMMRT_CU_MIN_DRIVER) {
		cu_load_fail(VMMRT_E_NOT_SUPPORTED, "the CUDA driver supports CUDA %d.%d; libvmmrt needs %d.%d or later",
			     cu_driver_version / 1000, cu_driver_version % 1000 / 10, VMMRT_CU_MIN_DRIVER / 1000,
			     VMMRT_CU_MIN_DRIVER % 1000 / 10);
		dlclose(lib);
		return;
	}

	for (size_t i = 0; i < sizeof(cu_symbols) / sizeof(cu_symbols[0]); i++) {
		const struct cu_symbol *s = &cu_symbols[i];
		int version = s->version;
		void *fn = NULL;

		if (version > cu_driver_version && cu_same_signature_since(s->name) != 0)
			version = cu_same_signature_since(s->name);
		found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		if (version <= cu_driver_version) {
			/* LEGACY_STREAM: the default-stream flavour of cuda.h without
			 * CUDA_API_PER_THREAD_DEFAULT_STREAM (not the _ptsz entry points). */
			r = get_proc(s->name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
			if (r != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS)
				fn = NULL;
		}
		if (fn == NULL && !s->optional) {
			if (version > cu_driver_version)
				cu_load_fail(VMMRT_E_NOT_SUPPORTED,
					     "the CUDA driver supports CUDA %d.%d; libvmmrt needs %d.%d for %s",
					     cu_driver_version / 1000, cu_driver_version % 1000 / 10, version / 1000,
					     version % 1000 / 10, s->name);
			else
				cu_load_fail(VMMRT_E_NOT_SUPPORTED,
					     "the CUDA driver has no %s with the ABI of CUDA %d.%d (%s)", s->name,
					     version / 1000, version % 1000 / 10,
					     found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT ? "version not sufficient"
					     : found == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND ? "symbol not found"
											      : "cuGetProcAddress failed");
			memset(&cu, 0, sizeof(cu));
			dlclose(lib);
			return;
		}
		memcpy((char *)&cu + s->offset, &fn, sizeof(fn));
	}

	/* from here on libcuda stays loaded: it may have started threads */
	cu_library = lib;
	r = cu.Init(0);
	if (r != CUDA_SUCCESS) {
		cu_load_fail(VMMRT_E_NO_DEVICE, "cuInit: %s (%s)", cu_error_name(r), cu_error_text(r));
		return;
	}
	cu_load_status = VMMRT_OK;
}

/* ------------------------------------------------------------ errors */

static vmmrt_status cu_status(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return VMMRT_OK;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return VMMRT_E_OUT_OF_MEMORY;
	case CUDA_ERROR_NOT_PERMITTED:
		return VMMRT_E_NOT_PERMITTED;
	case CUDA_ERROR_NOT_READY:
		return VMMRT_E_BUSY;
	case CUDA_ERROR_INVALID_VALUE:
		return VMMRT_E_INVALID_ARGUMENT;
	case CUDA_ERROR_NOT_SUPPORTED:
		return VMMRT_E_NOT_SUPPORTED;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_STUB_LIBRARY:
	case CUDA_ERROR_DEVICE_UNAVAILABLE:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return VMMRT_E_NO_DEVICE;
	case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
	case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
	case CUDA_ERROR_STREAM_CAPTURE_MERGE:
	case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
	case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
	case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
	case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
	case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
	case CUDA_ERROR_CAPTURED_EVENT:
		return VMMRT_E_CAPTURE;
	case CUDA_ERROR_ILLEGAL_ADDRESS:
		return VMMRT_E_FAULT;
	default:
		return VMMRT_E_DRIVER;
	}
}

/* Report a failed driver call: "<call>: <CUDA_ERROR_NAME> (<description>)". */
static vmmrt_status cu_error(CUresult r, const char *fmt, ...) VMMRT_PRINTF(2, 3);

static vmmrt_status cu_error(CUresult r, const char *fmt, ...)
{
	char call[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(call, sizeof(call), fmt, ap);
	va_end(ap);
	return vmmrt__error(cu_status(r), "%s: %s (%s)", call, cu_error_name(r), cu_error_text(r));
}

static vmmrt_status refuse_host_func(const char *op)
{
	return vmmrt__error(VMMRT_E_NOT_PERMITTED,
			   "%s: no driver call may be made from inside a host function", op);
}

#define ROLE_CHECK(op) \
	do { \
		if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) \
			return refuse_host_func(op); \
	} while (0)

/* ------------------------------------------------------------ host-function records */

/*
 * cuLaunchHostFunc passes one pointer; we need (fn, arg) and the trampoline
 * that marks the thread as a host function. Records come from a per-backend
 * pool: popped on the launch thread (cds_lfs_pop_blocking: a mutex among
 * poppers only, against ABA), pushed back by the trampoline with the
 * lock-free, allocation-free cds_lfs_push. An empty pool means malloc on the
 * launch thread; such records join the pool after use.
 *
 * A host function captured into a graph runs at every replay, so its record
 * must outlive the graph: it is allocated apart, never recycled, kept on the
 * backend's list under the capture's id and handed to the graph at end of
 * capture; graph_destroy retires it (freed at close, since a replay may still
 * be running when the graph is destroyed).
 */
#define HOSTFN_POOL_RECORDS 256

/*
 * liburcu's atomics are inline assembly, invisible to ThreadSanitizer: tell it
 * that a push hands the record over to the next pop.
 */
#if defined(__SANITIZE_THREAD__)
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define HOSTFN_HANDOVER_RELEASE(p) __tsan_release(p)
#define HOSTFN_HANDOVER_ACQUIRE(p) __tsan_acquire(p)
#else
#define HOSTFN_HANDOVER_RELEASE(p) ((void)(p))
#define HOSTFN_HANDOVER_ACQUIRE(p) ((void)(p))
#endif
#define HOSTFN_CLOSE_WAIT_MS 5000

struct hostfn_pool;

struct hostfn_rec {
	struct cds_lfs_node node;  /* in pool->free while unused */
	vmmrt__host_fn fn;
	void *arg;
	struct hostfn_pool *pool;  /* NULL: owned by a graph, never recycled */
	int single;                /* malloc()ed alone, else part of pool->block */
	cuuint64_t capture_id;     /* graph records: the capture sequence */
	struct hostfn_rec *next;   /* graph records: list link */
};

struct hostfn_pool {
	struct cds_lfs_stack free;
	struct hostfn_rec *block;
	unsigned long inflight; /* records given to the driver, not yet back (__atomic) */
};

static void CUDA_CB hostfn_trampoline(void *user)
{
	struct hostfn_rec *r = user;
	struct hostfn_pool *pool = r->pool;
	vmmrt__host_fn fn = r->fn;
	void *arg = r->arg;
	vmmrt__thread_role prev = vmmrt__thread_role_set(VMMRT_ROLE_HOST_FUNC);

	fn(arg);
	vmmrt__thread_role_set(prev);
	if (pool != NULL) {
		HOSTFN_HANDOVER_RELEASE(r);
		cds_lfs_push(&pool->free, &r->node);
		/* the last access to the pool: close() may free it once this is 0 */
		__atomic_sub_fetch(&pool->inflight, 1, __ATOMIC_RELEASE);
	}
}

static struct hostfn_pool *hostfn_pool_create(void)
{
	struct hostfn_pool *pool = calloc(1, sizeof(*pool));

	if (pool == NULL)
		return NULL;
	pool->block = calloc(HOSTFN_POOL_RECORDS, sizeof(*pool->block));
	if (pool->block == NULL) {
		free(pool);
		return NULL;
	}
	cds_lfs_init(&pool->free);
	for (size_t i = 0; i < HOSTFN_POOL_RECORDS; i++) {
		cds_lfs_node_init(&pool->block[i].node);
		cds_lfs_push(&pool->free, &pool->block[i].node);
	}
	return pool;
}

static struct hostfn_rec *hostfn_get(struct hostfn_pool *pool)
{
	struct cds_lfs_node *n = cds_lfs_pop_blocking(&pool->free);
	struct hostfn_rec *r;

	if (n != NULL) {
		r = caa_container_of(n, struct hostfn_rec, node);
		HOSTFN_HANDOVER_ACQUIRE(r);
		return r;
	}
	r = calloc(1, sizeof(*r));
	if (r != NULL) {
		cds_lfs_node_init(&r->node);
		r->single = 1;
	}
	return r;
}

static void hostfn_free_list(struct hostfn_rec *r)
{
	while (r != NULL) {
		struct hostfn_rec *next = r->next;

		free(r);
		r = next;
	}
}

/*
 * Free the pool once no record is with the driver. A host function that never
 * runs (a stream blocked forever) would make us wait for ever: after a bounded
 * wait the pool is leaked instead, so that a late trampoline cannot touch freed
 * memory.
 */
static void hostfn_pool_destroy(struct hostfn_pool *pool)
{
	struct cds_lfs_node *n;

	if (pool == NULL)
		return;
	for (int ms = 0; __atomic_load_n(&pool->inflight, __ATOMIC_ACQUIRE) != 0; ms++) {
		struct timespec ts = {0, 1000000};

		if (ms >= HOSTFN_CLOSE_WAIT_MS)
			return;
		nanosleep(&ts, NULL);
	}
	while ((n = cds_lfs_pop_blocking(&pool->free)) != NULL) {
		struct hostfn_rec *r = caa_container_of(n, struct hostfn_rec, node);

		HOSTFN_HANDOVER_ACQUIRE(r);
		if (r->single)
			free(r);
	}
	cds_lfs_destroy(&pool->free);
	free(pool->block);
	free(pool);
}

/* ------------------------------------------------------------ the backend */

enum cuda_kernel {
	CK_FILL,
	CK_ZERO64,
	CK_CHECKSUM,
	CK_BUSY,
	CK_LAYER,
	CK_COUNT_
};

#define CUDA_KERNEL_THREADS 256 /* VMMRT_KERNEL_THREADS in vmmrt_kernels.cu */

struct vmmrt__bgraph {
	CUgraph graph;
	CUgraphExec exec;
	struct hostfn_rec *recs; /* records of the graph's host nodes */
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
static vmmrt_status ctx_enter(vmmrt__backend *b, const char *op, int *pushed)
{
	CUcontext cur = NULL;
	CUresult r;

	*pushed = 0;
	r = cu.CtxGetCurrent(&cur);
	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuCtxGetCurrent (for %s)", op);
	if (cur == b->ctx)
		return VMMRT_OK;
	r = cu.CtxPushCurrent(b->ctx);
	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuCtxPushCurrent (for %s)", op);
	*pushed = 1;
	return VMMRT_OK;
}

static void ctx_leave(int pushed)
{
	CUcontext popped;

	if (pushed)
		cu.CtxPopCurrent(&popped);
}

/* Role check, backend check, context: the prologue of every op. */
#define OP_ENTER(b, op, pushed) \
	do { \
		vmmrt_status st_enter_; \
		ROLE_CHECK(op); \
		if ((b) == NULL) \
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL backend", op); \
		st_enter_ = ctx_enter((b), op, &(pushed)); \
		if (st_enter_ != VMMRT_OK) \
			return st_enter_; \
	} while (0)

/* One driver call inside an op: enter, call, leave, report. */
#define CU_CALL(b, op, call, ...) \
	do { \
		int pushed_; \
		CUresult r_; \
		OP_ENTER(b, op, pushed_); \
		r_ = (call); \
		ctx_leave(pushed_); \
		if (r_ != CUDA_SUCCESS) \
			return cu_error(r_, __VA_ARGS__); \
	} while (0)

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
static void load_kernels(vmmrt__backend *b)
{
	CUresult r;

	if (vmmrt__kernels_fatbin_size == 0) {
		snprintf(b->kernel_error, sizeof(b->kernel_error), "the embedded kernel fatbin is empty");
		return;
	}
	r = cu.ModuleLoadData(&b->module, vmmrt__kernels_fatbin);
	if (r != CUDA_SUCCESS) {
		b->module = NULL;
		snprintf(b->kernel_error, sizeof(b->kernel_error), "cuModuleLoadData(%zu bytes): %s (%s)",
			 vmmrt__kernels_fatbin_size, cu_error_name(r), cu_error_text(r));
		return;
	}
	for (int k = 0; k < CK_COUNT_; k++) {
		const char *call = "cuModuleGetFunction";

		r = cu.ModuleGetFunction(&b->fn[k], b->module, kernel_names[k]);
#if CUDA_VERSION >= 12040
		/* with lazy loading (the default) this loads the code now rather
		 * than at the first launch, which may be on the hot path or in a
		 * capture */
		if (r == CUDA_SUCCESS && cu.FuncLoad != NULL) {
			call = "cuFuncLoad";
			r = cu.FuncLoad(b->fn[k]);
		}
#endif
		if (r != CUDA_SUCCESS) {
			snprintf(b->kernel_error, sizeof(b->kernel_error), "%s(%s): %s (%s)", call, kernel_names[k],
				 cu_error_name(r), cu_error_text(r));
			cu.ModuleUnload(b->module);
			b->module = NULL;
			return;
		}
	}
}
#endif

/* Release what open() or later ops left; b's context may be gone already. */
static void backend_free(vmmrt__backend *b)
{
	struct vmmrt__bgraph *g;
	int pushed = 0;

	if (b->ctx_retained && ctx_enter(b, "close", &pushed) != VMMRT_OK)
		pushed = 0;

	/* first wait for the pooled host functions: the GPU work they follow
	 * is what may still read the graph records below */
	hostfn_pool_destroy(b->pool);
	b->pool = NULL;

	pthread_mutex_lock(&b->lock);
	while ((g = b->graphs) != NULL) {
		b->graphs = g->next;
		cu.GraphExecDestroy(g->exec);
		cu.GraphDestroy(g->graph);
		hostfn_free_list(g->recs);
		free(g);
	}
	hostfn_free_list(b->capture_recs);
	hostfn_free_list(b->retired_recs);
	b->capture_recs = b->retired_recs = NULL;
	pthread_mutex_unlock(&b->lock);

	if (b->module != NULL)
		cu.ModuleUnload(b->module);
	ctx_leave(pushed);
	if (b->ctx_retained)
		cu.DevicePrimaryCtxRelease(b->dev);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

static vmmrt_status device_attribute(vmmrt__backend *b, CUdevice_attribute attr, const char *attr_name, int *out)
{
	CUresult r = cu.DeviceGetAttribute(out, attr, b->dev);

	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuDeviceGetAttribute(%s, device %d)", attr_name, b->ordinal);
	return VMMRT_OK;
}

static vmmrt_status cuda_open(const vmmrt__backend_config *cfg, vmmrt__backend **out)
{
	vmmrt__backend *b;
	vmmrt_status st;
	CUresult r;
	CUcontext prev_ctx = NULL;
	int count = 0, value = 0, ctx_switched = 0;

	ROLE_CHECK("open");
	VMMRT_CHECK_ARG(cfg != NULL, "NULL config");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	*out = NULL;

	pthread_once(&cu_once, cu_load_once);
	if (cu_load_status != VMMRT_OK)
		return vmmrt__error(cu_load_status, "%s", cu_load_message);

	r = cu.DeviceGetCount(&count);
	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuDeviceGetCount");
	if (cfg->device_ordinal < 0 || cfg->device_ordinal >= count)
		return vmmrt__error(VMMRT_E_NO_DEVICE, "CUDA device %d requested, %d device(s) present",
				   cfg->device_ordinal, count);

	b = calloc(1, sizeof(*b));
	if (b == NULL)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "open: no memory for the backend");
	if (pthread_mutex_init(&b->lock, NULL) != 0) {
		free(b);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "open: pthread_mutex_init failed");
	}
	b->ordinal = cfg->device_ordinal;
#ifndef HAVE_NVCC_KERNELS
	snprintf(b->kernel_error, sizeof(b->kernel_error), "kernels not built: nvcc was not found at configure time");
#endif

	r = cu.DeviceGet(&b->dev, b->ordinal);
	if (r != CUDA_SUCCESS) {
		st = cu_error(r, "cuDeviceGet(%d)", b->ordinal);
		goto fail;
	}
	r = cu.DeviceGetName(b->name, (int)sizeof(b->name), b->dev);
	if (r != CUDA_SUCCESS) {
		st = cu_error(r, "cuDeviceGetName(device %d)", b->ordinal);
		goto fail;
	}

	st = device_attribute(b, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
			      "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", &value);
	if (st != VMMRT_OK)
		goto fail;
	if (!value) {
		st = vmmrt__error(VMMRT_E_NOT_SUPPORTED,
				 "device %d (%s) lacks virtual memory management "
				 "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)",
				 b->ordinal, b->name);
		goto fail;
	}
	/* host_alloc's DEVICEMAP and the wait-value flags in pinned host memory */
	st = device_attribute(b, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, "CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",
			      &value);
	if (st != VMMRT_OK)
		goto fail;
	if (!value) {
		st = vmmrt__error(VMMRT_E_NOT_SUPPORTED,
				 "device %d (%s) cannot map pinned host memory (CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY is 0)",
				 b->ordinal, b->name);
		goto fail;
	}
	st = device_attribute(b, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
			      &value);
	if (st != VMMRT_OK)
		goto fail;
	/* one wave of 256-thread blocks at 8 blocks per SM (the kernels use few registers) */
	b->max_grid = value > 0 ? (unsigned)value * 8u : 1u;
	if (b->max_grid > 65535u)
		b->max_grid = 65535u;

	r = cu.DevicePrimaryCtxRetain(&b->ctx, b->dev);
	if (r != CUDA_SUCCESS) {
		st = cu_error(r, "cuDevicePrimaryCtxRetain(device %d)", b->ordinal);
		goto fail;
	}
	b->ctx_retained = 1;
	r = cu.CtxGetCurrent(&prev_ctx);
	if (r == CUDA_SUCCESS)
		r = cu.CtxSetCurrent(b->ctx);
	if (r != CUDA_SUCCESS) {
		st = cu_error(r, "cuCtxSetCurrent(primary context of device %d)", b->ordinal);
		goto fail;
	}
	ctx_switched = 1;

	b->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	b->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	b->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	b->prop.location.id = b->ordinal;
	b->access.location = b->prop.location;
	b->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = cu.MemGetAllocationGranularity(&b->granularity, &b->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS) {
		st = cu_error(r, "cuMemGetAllocationGranularity(device %d, recommended)", b->ordinal);
		goto fail;
	}
	if (b->granularity == 0) {
		st = vmmrt__error(VMMRT_E_DRIVER, "cuMemGetAllocationGranularity(device %d): granularity 0", b->ordinal);
		goto fail;
	}

	b->pool = hostfn_pool_create();
	if (b->pool == NULL) {
		st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "open: no memory for the host-function records");
		goto fail;
	}

#ifdef HAVE_NVCC_KERNELS
	load_kernels(b);
#endif
	*out = b;
	return VMMRT_OK;

fail:
	backend_free(b);
	if (ctx_switched)
		cu.CtxSetCurrent(prev_ctx); /* leave the caller's context as it was */
	return st;
}

static void cuda_close(vmmrt__backend *b)
{
	if (b == NULL)
		return;
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) {
		/* nothing can be released without the driver: leave it open */
		refuse_host_func("close");
		return;
	}
	backend_free(b);
}

static vmmrt_status cuda_device_name(vmmrt__backend *b, char *buf, size_t len)
{
	ROLE_CHECK("device_name");
	VMMRT_CHECK_ARG(b != NULL, "NULL backend");
	VMMRT_CHECK_ARG(buf != NULL && len > 0, "NULL or empty buffer");
	snprintf(buf, len, "%s", b->name);
	return VMMRT_OK;
}

static vmmrt_status cuda_bind_thread(vmmrt__backend *b)
{
	CUresult r;

	ROLE_CHECK("bind_thread");
	VMMRT_CHECK_ARG(b != NULL, "NULL backend");
	r = cu.CtxSetCurrent(b->ctx);
	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuCtxSetCurrent(primary context of device %d)", b->ordinal);
	return VMMRT_OK;
}

/* ------------------------------------------------------------ virtual memory */

static vmmrt_status check_size(vmmrt__backend *b, const char *op, size_t size)
{
	if (size == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size 0", op);
	if (size % b->granularity != 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zu is not a multiple of the granularity %zu", op,
				   size, b->granularity);
	return VMMRT_OK;
}

#define CHECK_SIZE(b, op, size) \
	do { \
		vmmrt_status st_size_; \
		ROLE_CHECK(op); \
		VMMRT_CHECK_ARG((b) != NULL, "NULL backend"); \
		st_size_ = check_size((b), op, (size)); \
		if (st_size_ != VMMRT_OK) \
			return st_size_; \
	} while (0)

static vmmrt_status cuda_granularity(vmmrt__backend *b, size_t *out)
{
	ROLE_CHECK("granularity");
	VMMRT_CHECK_ARG(b != NULL, "NULL backend");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	*out = b->granularity;
	return VMMRT_OK;
}

static vmmrt_status cuda_va_reserve(vmmrt__backend *b, size_t size, size_t align, vmmrt_devptr *out)
{
	CUdeviceptr va = 0;

	CHECK_SIZE(b, "cuMemAddressReserve", size);
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemAddressReserve", cu.MemAddressReserve(&va, size, align, 0, 0),
		"cuMemAddressReserve(%zu, align %zu)", size, align);
	*out = (vmmrt_devptr)va;
	return VMMRT_OK;
}

static vmmrt_status cuda_va_free(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemAddressFree", size);
	CU_CALL(b, "cuMemAddressFree", cu.MemAddressFree((CUdeviceptr)va, size), "cuMemAddressFree(0x%llx, %zu)",
		(unsigned long long)va, size);
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_create(vmmrt__backend *b, size_t size, vmmrt__bhandle *out)
{
	CUmemGenericAllocationHandle h = 0;

	CHECK_SIZE(b, "cuMemCreate", size);
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemCreate", cu.MemCreate(&h, size, &b->prop, 0), "cuMemCreate(%zu)", size);
	*out = (vmmrt__bhandle)h;
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_release(vmmrt__backend *b, vmmrt__bhandle h)
{
	CU_CALL(b, "cuMemRelease", cu.MemRelease((CUmemGenericAllocationHandle)h), "cuMemRelease(0x%llx)",
		(unsigned long long)h);
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_map(vmmrt__backend *b, vmmrt_devptr va, size_t size, vmmrt__bhandle h)
{
	CHECK_SIZE(b, "cuMemMap", size);
	CU_CALL(b, "cuMemMap", cu.MemMap((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)h, 0),
		"cuMemMap(0x%llx, %zu)", (unsigned long long)va, size);
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_unmap(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemUnmap", size);
	CU_CALL(b, "cuMemUnmap", cu.MemUnmap((CUdeviceptr)va, size), "cuMemUnmap(0x%llx, %zu)",
		(unsigned long long)va, size);
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_set_access(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemSetAccess", size);
	CU_CALL(b, "cuMemSetAccess", cu.MemSetAccess((CUdeviceptr)va, size, &b->access, 1),
		"cuMemSetAccess(0x%llx, %zu, read-write)", (unsigned long long)va, size);
	return VMMRT_OK;
}

static vmmrt_status cuda_mem_info(vmmrt__backend *b, size_t *free_bytes, size_t *total_bytes)
{
	size_t f = 0, t = 0;

	ROLE_CHECK("cuMemGetInfo");
	VMMRT_CHECK_ARG(free_bytes != NULL || total_bytes != NULL, "NULL outputs");
	CU_CALL(b, "cuMemGetInfo", cu.MemGetInfo(&f, &t), "cuMemGetInfo");
	if (free_bytes != NULL)
		*free_bytes = f;
	if (total_bytes != NULL)
		*total_bytes = t;
	return VMMRT_OK;
}

/* ------------------------------------------------------------ streams and events */

#define CU_STREAM(s) ((CUstream)(s))
#define CU_EVENT(e) ((CUevent)(e))

static vmmrt_status cuda_stream_create(vmmrt__backend *b, vmmrt_stream *out)
{
	CUstream s = NULL;

	ROLE_CHECK("cuStreamCreate");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuStreamCreate", cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate(non-blocking)");
	*out = (vmmrt_stream)s;
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_destroy(vmmrt__backend *b, vmmrt_stream s)
{
	ROLE_CHECK("cuStreamDestroy");
	VMMRT_CHECK_ARG(s != NULL, "NULL stream");
	CU_CALL(b, "cuStreamDestroy", cu.StreamDestroy(CU_STREAM(s)), "cuStreamDestroy(%p)", (void *)s);
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_synchronize(vmmrt__backend *b, vmmrt_stream s)
{
	CU_CALL(b, "cuStreamSynchronize", cu.StreamSynchronize(CU_STREAM(s)), "cuStreamSynchronize(%p)", (void *)s);
	return VMMRT_OK;
}

/* A query: CUDA_ERROR_NOT_READY is the answer "not yet", not a failure. */
#define CU_QUERY(b, op, call, done, ...) \
	do { \
		int pushed_; \
		CUresult r_; \
		OP_ENTER(b, op, pushed_); \
		r_ = (call); \
		ctx_leave(pushed_); \
		if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) \
			return cu_error(r_, __VA_ARGS__); \
		*(done) = r_ == CUDA_SUCCESS; \
	} while (0)

static vmmrt_status cuda_stream_query(vmmrt__backend *b, vmmrt_stream s, bool *done)
{
	VMMRT_CHECK_ARG(done != NULL, "NULL result");
	CU_QUERY(b, "cuStreamQuery", cu.StreamQuery(CU_STREAM(s)), done, "cuStreamQuery(%p)", (void *)s);
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_wait_event(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e)
{
	ROLE_CHECK("cuStreamWaitEvent");
	VMMRT_CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuStreamWaitEvent", cu.StreamWaitEvent(CU_STREAM(s), CU_EVENT(e), CU_EVENT_WAIT_DEFAULT),
		"cuStreamWaitEvent(%p, %p)", (void *)s, (void *)e);
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_wait_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	ROLE_CHECK("cuStreamWaitValue32");
	VMMRT_CHECK_ARG(addr != 0 && addr % 4 == 0, "address 0 or not 4-byte aligned");
	CU_CALL(b, "cuStreamWaitValue32",
		cu.StreamWaitValue32(CU_STREAM(s), (CUdeviceptr)addr, value, CU_STREAM_WAIT_VALUE_GEQ),
		"cuStreamWaitValue32(%p, 0x%llx, >= %u)", (void *)s, (unsigned long long)addr, value);
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_write_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	ROLE_CHECK("cuStreamWriteValue32");
	VMMRT_CHECK_ARG(addr != 0 && addr % 4 == 0, "address 0 or not 4-byte aligned");
	CU_CALL(b, "cuStreamWriteValue32",
		cu.StreamWriteValue32(CU_STREAM(s), (CUdeviceptr)addr, value, CU_STREAM_WRITE_VALUE_DEFAULT),
		"cuStreamWriteValue32(%p, 0x%llx, %u)", (void *)s, (unsigned long long)addr, value);
	return VMMRT_OK;
}

static vmmrt_status cuda_event_create(vmmrt__backend *b, bool timing, vmmrt__bevent **out)
{
	CUevent e = NULL;

	ROLE_CHECK("cuEventCreate");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuEventCreate", cu.EventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
		"cuEventCreate(%s)", timing ? "timing" : "disable timing");
	*out = (vmmrt__bevent *)e;
	return VMMRT_OK;
}

static vmmrt_status cuda_event_destroy(vmmrt__backend *b, vmmrt__bevent *e)
{
	ROLE_CHECK("cuEventDestroy");
	VMMRT_CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuEventDestroy", cu.EventDestroy(CU_EVENT(e)), "cuEventDestroy(%p)", (void *)e);
	return VMMRT_OK;
}

static vmmrt_status cuda_event_record(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s)
{
	ROLE_CHECK("cuEventRecord");
	VMMRT_CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuEventRecord", cu.EventRecord(CU_EVENT(e), CU_STREAM(s)), "cuEventRecord(%p, %p)", (void *)e,
		(void *)s);
	return VMMRT_OK;
}

static vmmrt_status cuda_event_query(vmmrt__backend *b, vmmrt__bevent *e, bool *done)
{
	ROLE_CHECK("cuEventQuery");
	VMMRT_CHECK_ARG(e != NULL && done != NULL, "NULL event or result");
	CU_QUERY(b, "cuEventQuery", cu.EventQuery(CU_EVENT(e)), done, "cuEventQuery(%p)", (void *)e);
	return VMMRT_OK;
}

static vmmrt_status cuda_event_synchronize(vmmrt__backend *b, vmmrt__bevent *e)
{
	ROLE_CHECK("cuEventSynchronize");
	VMMRT_CHECK_ARG(e != NULL, "NULL event");
	CU_CALL(b, "cuEventSynchronize", cu.EventSynchronize(CU_EVENT(e)), "cuEventSynchronize(%p)", (void *)e);
	return VMMRT_OK;
}

static vmmrt_status cuda_event_elapsed_ms(vmmrt__backend *b, vmmrt__bevent *start, vmmrt__bevent *end, float *ms)
{
	float v = 0.0f;

	ROLE_CHECK("cuEventElapsedTime");
	VMMRT_CHECK_ARG(start != NULL && end != NULL, "NULL event");
	VMMRT_CHECK_ARG(ms != NULL, "NULL output");
	CU_CALL(b, "cuEventElapsedTime", cu.EventElapsedTime(&v, CU_EVENT(start), CU_EVENT(end)),
		"cuEventElapsedTime(%p, %p)", (void *)start, (void *)end);
	*ms = v;
	return VMMRT_OK;
}

/* Keep a graph host node's record until its capture ends (under b->lock). */
static void capture_recs_add(vmmrt__backend *b, struct hostfn_rec *r)
{
	pthread_mutex_lock(&b->lock);
	r->next = b->capture_recs;
	b->capture_recs = r;
	pthread_mutex_unlock(&b->lock);
}

/* Detach the records of capture sequence id from the pending list. */
static struct hostfn_rec *capture_recs_take(vmmrt__backend *b, cuuint64_t id)
{
	struct hostfn_rec *taken = NULL, **pp;

	pthread_mutex_lock(&b->lock);
	pp = &b->capture_recs;
	while (*pp != NULL) {
		struct hostfn_rec *r = *pp;

		if (r->capture_id == id) {
			*pp = r->next;
			r->next = taken;
			taken = r;
		} else {
			pp = &r->next;
		}
	}
	pthread_mutex_unlock(&b->lock);
	return taken;
}

static vmmrt_status cuda_launch_host_func(vmmrt__backend *b, vmmrt_stream s, vmmrt__host_fn fn, void *arg)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	cuuint64_t id = 0;
	struct hostfn_rec *r;
	CUresult res;
	int pushed;

	ROLE_CHECK("cuLaunchHostFunc");
	VMMRT_CHECK_ARG(fn != NULL, "NULL host function");
	OP_ENTER(b, "cuLaunchHostFunc", pushed);

	res = cu.StreamGetCaptureInfo(CU_STREAM(s), &cs, &id, NULL, NULL, NULL, NULL);
	if (res != CUDA_SUCCESS) {
		ctx_leave(pushed);
		return cu_error(res, "cuStreamGetCaptureInfo(%p)", (void *)s);
	}
	if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
		/* a graph node: replayed any number of times, never recycled */
		r = calloc(1, sizeof(*r));
		if (r != NULL) {
			r->capture_id = id;
			r->single = 1;
		}
	} else {
		r = hostfn_get(b->pool);
		if (r != NULL)
			r->pool = b->pool;
	}
	if (r == NULL) {
		ctx_leave(pushed);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuLaunchHostFunc: no memory for a host-function record");
	}
	r->fn = fn;
	r->arg = arg;

	if (r->pool != NULL)
		__atomic_add_fetch(&r->pool->inflight, 1, __ATOMIC_RELAXED);
	res = cu.LaunchHostFunc(CU_STREAM(s), hostfn_trampoline, r);
	ctx_leave(pushed);
	if (res != CUDA_SUCCESS) {
		if (r->pool != NULL) {
			struct hostfn_pool *pool = r->pool;

			cds_lfs_push(&pool->free, &r->node);
			__atomic_sub_fetch(&pool->inflight, 1, __ATOMIC_RELEASE);
		} else {
			free(r);
		}
		return cu_error(res, "cuLaunchHostFunc(%p)", (void *)s);
	}
	if (r->pool == NULL)
		capture_recs_add(b, r);
	return VMMRT_OK;
}

/* ------------------------------------------------------------ copies and pinned memory */

static vmmrt_status cuda_memcpy_htod_async(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n,
					   vmmrt_stream s)
{
	ROLE_CHECK("cuMemcpyHtoDAsync");
	VMMRT_CHECK_ARG(src != NULL || n == 0, "NULL source");
	CU_CALL(b, "cuMemcpyHtoDAsync", cu.MemcpyHtoDAsync((CUdeviceptr)dst, src, n, CU_STREAM(s)),
		"cuMemcpyHtoDAsync(0x%llx, %p, %zu)", (unsigned long long)dst, src, n);
	return VMMRT_OK;
}

static vmmrt_status cuda_memcpy_dtoh_async(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	ROLE_CHECK("cuMemcpyDtoHAsync");
	VMMRT_CHECK_ARG(dst != NULL || n == 0, "NULL destination");
	CU_CALL(b, "cuMemcpyDtoHAsync", cu.MemcpyDtoHAsync(dst, (CUdeviceptr)src, n, CU_STREAM(s)),
		"cuMemcpyDtoHAsync(%p, 0x%llx, %zu)", dst, (unsigned long long)src, n);
	return VMMRT_OK;
}

static vmmrt_status cuda_memcpy_dtod_async(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n,
					   vmmrt_stream s)
{
	CU_CALL(b, "cuMemcpyDtoDAsync", cu.MemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, CU_STREAM(s)),
		"cuMemcpyDtoDAsync(0x%llx, 0x%llx, %zu)", (unsigned long long)dst, (unsigned long long)src, n);
	return VMMRT_OK;
}

static vmmrt_status cuda_host_alloc(vmmrt__backend *b, size_t size, void **out)
{
	void *p = NULL;
	CUresult r;
	int pushed;

	ROLE_CHECK("cuMemHostAlloc");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	if (size == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "cuMemHostAlloc: size 0");
	OP_ENTER(b, "cuMemHostAlloc", pushed);
	r = cu.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
	ctx_leave(pushed);
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuMemHostAlloc(%zu, portable|devicemap): %s (%s)",
				   size, cu_error_name(r), cu_error_text(r));
	if (r != CUDA_SUCCESS)
		return cu_error(r, "cuMemHostAlloc(%zu, portable|devicemap)", size);
	*out = p;
	return VMMRT_OK;
}

static vmmrt_status cuda_host_free(vmmrt__backend *b, void *p)
{
	ROLE_CHECK("cuMemFreeHost");
	VMMRT_CHECK_ARG(p != NULL, "NULL pointer");
	CU_CALL(b, "cuMemFreeHost", cu.MemFreeHost(p), "cuMemFreeHost(%p)", p);
	return VMMRT_OK;
}

static vmmrt_status cuda_host_devptr(vmmrt__backend *b, void *p, vmmrt_devptr *out)
{
	CUdeviceptr d = 0;

	ROLE_CHECK("cuMemHostGetDevicePointer");
	VMMRT_CHECK_ARG(p != NULL, "NULL pointer");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemHostGetDevicePointer", cu.MemHostGetDevicePointer(&d, p, 0), "cuMemHostGetDevicePointer(%p)",
		p);
	*out = (vmmrt_devptr)d;
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
static vmmrt_status cuda_stream_begin_capture(vmmrt__backend *b, vmmrt_stream s)
{
	ROLE_CHECK("cuStreamBeginCapture");
	VMMRT_CHECK_ARG(s != NULL, "NULL stream (the legacy stream cannot capture)");
	CU_CALL(b, "cuStreamBeginCapture", cu.StreamBeginCapture(CU_STREAM(s), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
		"cuStreamBeginCapture(%p, thread-local)", (void *)s);
	return VMMRT_OK;
}

static vmmrt_status cuda_stream_end_capture(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out)
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
	VMMRT_CHECK_ARG(s != NULL, "NULL stream");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	*out = NULL;
	OP_ENTER(b, "cuStreamEndCapture", pushed);

	/* the capture's id, to find the records of its host nodes */
	r = cu.StreamGetCaptureInfo(CU_STREAM(s), &cs, &id, NULL, NULL, NULL, NULL);
	/* the id is valid only for an active capture; the records of an
	 * invalidated one (never run) stay on the list until close */
	have_id = r == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_ACTIVE;

	r = cu.StreamEndCapture(CU_STREAM(s), &graph);
	recs = have_id ? capture_recs_take(b, id) : NULL;
	if (r != CUDA_SUCCESS) {
		ctx_leave(pushed);
		if (graph != NULL)
			cu.GraphDestroy(graph);
		hostfn_free_list(recs);
		return cu_error(r, "cuStreamEndCapture(%p)", (void *)s);
	}
	r = cu.GraphInstantiateWithFlags(&exec, graph, 0);
	if (r != CUDA_SUCCESS) {
		cu.GraphDestroy(graph);
		ctx_leave(pushed);
		hostfn_free_list(recs);
		return cu_error(r, "cuGraphInstantiate(%p)", (void *)s);
	}
	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		cu.GraphExecDestroy(exec);
		cu.GraphDestroy(graph);
		ctx_leave(pushed);
		hostfn_free_list(recs);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuStreamEndCapture: no memory for the graph");
	}
	ctx_leave(pushed);
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
static vmmrt_status cuda_stream_is_capturing(vmmrt__backend *b, vmmrt_stream s, bool *out)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;

	ROLE_CHECK("cuStreamIsCapturing");
	VMMRT_CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuStreamIsCapturing", cu.StreamIsCapturing(CU_STREAM(s), &cs), "cuStreamIsCapturing(%p)",
		(void *)s);
	*out = cs == CU_STREAM_CAPTURE_STATUS_ACTIVE || cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
	return VMMRT_OK;
}

static vmmrt_status cuda_graph_launch(vmmrt__backend *b, vmmrt__bgraph *g, vmmrt_stream s)
{
	ROLE_CHECK("cuGraphLaunch");
	VMMRT_CHECK_ARG(g != NULL, "NULL graph");
	CU_CALL(b, "cuGraphLaunch", cu.GraphLaunch(g->exec, CU_STREAM(s)), "cuGraphLaunch(%p, %p)", (void *)g,
		(void *)s);
	return VMMRT_OK;
}

static vmmrt_status cuda_graph_destroy(vmmrt__backend *b, vmmrt__bgraph *g)
{
	CUresult r1, r2;
	struct hostfn_rec *last;
	int pushed;

	ROLE_CHECK("cuGraphExecDestroy");
	VMMRT_CHECK_ARG(g != NULL, "NULL graph");
	OP_ENTER(b, "cuGraphExecDestroy", pushed);
	r1 = cu.GraphExecDestroy(g->exec);
	r2 = cu.GraphDestroy(g->graph);
	ctx_leave(pushed);

	pthread_mutex_lock(&b->lock);
	if (g->prev != NULL)
		g->prev->next = g->next;
	else
		b->graphs = g->next;
	if (g->next != NULL)
		g->next->prev = g->prev;
	/* a replay may still be running: its host nodes' records go at close */
	if (g->recs != NULL) {
		for (last = g->recs; last->next != NULL; last = last->next)
			;
		last->next = b->retired_recs;
		b->retired_recs = g->recs;
	}
	pthread_mutex_unlock(&b->lock);
	free(g);

	if (r1 != CUDA_SUCCESS)
		return cu_error(r1, "cuGraphExecDestroy");
	if (r2 != CUDA_SUCCESS)
		return cu_error(r2, "cuGraphDestroy");
	return VMMRT_OK;
}

/* ------------------------------------------------------------ kernels */

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
	return cu.LaunchKernel(b->fn[k], grid, 1, 1, block, 1, 1, 0, s, params, NULL);
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

static vmmrt_status cuda_kernel_launch(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k,
				       const vmmrt__kernel_args *args)
{
	ROLE_CHECK("cuLaunchKernel");
	VMMRT_CHECK_ARG(b != NULL, "NULL backend");
	VMMRT_CHECK_ARG(args != NULL, "NULL kernel arguments");
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
		ctx_leave(pushed);
		if (r != CUDA_SUCCESS)
			return cu_error(r, "cuLaunchKernel(%s, %zu bytes)", what, args->bytes);
		return VMMRT_OK;
	}
#endif
}

const vmmrt__backend_ops vmmrt__backend_cuda = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.device_name = cuda_device_name,
	.bind_thread = cuda_bind_thread,
	.granularity = cuda_granularity,
	.va_reserve = cuda_va_reserve,
	.va_free = cuda_va_free,
	.mem_create = cuda_mem_create,
	.mem_release = cuda_mem_release,
	.mem_map = cuda_mem_map,
	.mem_unmap = cuda_mem_unmap,
	.mem_set_access = cuda_mem_set_access,
	.mem_info = cuda_mem_info,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.stream_synchronize = cuda_stream_synchronize,
	.stream_query = cuda_stream_query,
	.stream_wait_event = cuda_stream_wait_event,
	.stream_wait_value32 = cuda_stream_wait_value32,
	.stream_write_value32 = cuda_stream_write_value32,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_query = cuda_event_query,
	.event_synchronize = cuda_event_synchronize,
	.event_elapsed_ms = cuda_event_elapsed_ms,
	.launch_host_func = cuda_launch_host_func,
	.memcpy_htod_async = cuda_memcpy_htod_async,
	.memcpy_dtoh_async = cuda_memcpy_dtoh_async,
	.memcpy_dtod_async = cuda_memcpy_dtod_async,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.host_devptr = cuda_host_devptr,
	.stream_begin_capture = cuda_stream_begin_capture,
	.stream_end_capture = cuda_stream_end_capture,
	.stream_is_capturing = cuda_stream_is_capturing,
	.graph_launch = cuda_graph_launch,
	.graph_destroy = cuda_graph_destroy,
	.kernel_launch = cuda_kernel_launch,
};

#else /* !VMMRT_CUDA_IMPL */

/*
 * No CUDA 12+ headers at build time: the backend exists but cannot open, so
 * the other ops are never reached and stay NULL.
 */
static vmmrt_status cuda_open(const vmmrt__backend_config *cfg, vmmrt__backend **out)
{
	if (out != NULL)
		*out = NULL;
#ifdef HAVE_CUDA_H
	return vmmrt__error(VMMRT_E_NOT_SUPPORTED,
			   "built with CUDA headers older than 12.0 (configure --with-cuda=DIR for CUDA 12 or later)");
#else
	return vmmrt__error(VMMRT_E_NOT_SUPPORTED, "built without CUDA headers (configure --with-cuda)");
#endif
}

static void cuda_close(vmmrt__backend *b)
{
}

const vmmrt__backend_ops vmmrt__backend_cuda = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
};

#endif /* VMMRT_CUDA_IMPL */

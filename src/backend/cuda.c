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
 * This file: open and close, virtual memory, pinned host memory and the ops
 * table; the others are named in cuda-internal.h.
 */
#include "config.h"

#include "backend/cuda-internal.h"

#ifdef VMMRT__CUDA_IMPL

#include <stdio.h>
#include <stdlib.h>

/* Release what open() or later ops left; b's context may be gone already. */
static void backend_free(vmmrt__backend *b)
{
	int pushed = 0;

	if (b->ctx_retained && vmmrt__cuda_ctx_enter(b, "close", &pushed) != VMMRT_OK)
		pushed = 0;

	/* first wait for the pooled host functions: the GPU work they follow
	 * is what may still read the graph records below */
	vmmrt__cuda_hostfn_pool_destroy(b->pool);
	b->pool = NULL;

	vmmrt__cuda_graphs_free(b);
	vmmrt__cuda_hostfn_records_free(b);

	if (b->module != NULL)
		vmmrt__cu.ModuleUnload(b->module);
	vmmrt__cuda_ctx_leave(pushed);
	if (b->ctx_retained)
		vmmrt__cu.DevicePrimaryCtxRelease(b->dev);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

static vmmrt_status device_attribute(vmmrt__backend *b, CUdevice_attribute attr, const char *attr_name, int *out)
{
	CUresult r = vmmrt__cu.DeviceGetAttribute(out, attr, b->dev);

	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuDeviceGetAttribute(%s, device %d)", attr_name, b->ordinal);
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
	VMMRT__CHECK_ARG(cfg != NULL, "NULL config");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	*out = NULL;

	st = vmmrt__cuda_load();
	if (st != VMMRT_OK)
		return st;

	r = vmmrt__cu.DeviceGetCount(&count);
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuDeviceGetCount");
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

	r = vmmrt__cu.DeviceGet(&b->dev, b->ordinal);
	if (r != CUDA_SUCCESS) {
		st = vmmrt__cuda_error(r, "cuDeviceGet(%d)", b->ordinal);
		goto fail;
	}
	r = vmmrt__cu.DeviceGetName(b->name, (int)sizeof(b->name), b->dev);
	if (r != CUDA_SUCCESS) {
		st = vmmrt__cuda_error(r, "cuDeviceGetName(device %d)", b->ordinal);
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

	r = vmmrt__cu.DevicePrimaryCtxRetain(&b->ctx, b->dev);
	if (r != CUDA_SUCCESS) {
		st = vmmrt__cuda_error(r, "cuDevicePrimaryCtxRetain(device %d)", b->ordinal);
		goto fail;
	}
	b->ctx_retained = 1;
	r = vmmrt__cu.CtxGetCurrent(&prev_ctx);
	if (r == CUDA_SUCCESS)
		r = vmmrt__cu.CtxSetCurrent(b->ctx);
	if (r != CUDA_SUCCESS) {
		st = vmmrt__cuda_error(r, "cuCtxSetCurrent(primary context of device %d)", b->ordinal);
		goto fail;
	}
	ctx_switched = 1;

	b->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	b->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
	b->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	b->prop.location.id = b->ordinal;
	b->access.location = b->prop.location;
	b->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = vmmrt__cu.MemGetAllocationGranularity(&b->granularity, &b->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS) {
		st = vmmrt__cuda_error(r, "cuMemGetAllocationGranularity(device %d, recommended)", b->ordinal);
		goto fail;
	}
	if (b->granularity == 0) {
		st = vmmrt__error(VMMRT_E_DRIVER, "cuMemGetAllocationGranularity(device %d): granularity 0", b->ordinal);
		goto fail;
	}

	b->pool = vmmrt__cuda_hostfn_pool_create();
	if (b->pool == NULL) {
		st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "open: no memory for the host-function records");
		goto fail;
	}

#ifdef HAVE_NVCC_KERNELS
	vmmrt__cuda_load_kernels(b);
#endif
	*out = b;
	return VMMRT_OK;

fail:
	backend_free(b);
	if (ctx_switched)
		vmmrt__cu.CtxSetCurrent(prev_ctx); /* leave the caller's context as it was */
	return st;
}

static void cuda_close(vmmrt__backend *b)
{
	if (b == NULL)
		return;
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) {
		/* nothing can be released without the driver: leave it open */
		vmmrt__cuda_refuse_host_func("close");
		return;
	}
	backend_free(b);
}

vmmrt_status vmmrt__cuda_device_name(vmmrt__backend *b, char *buf, size_t len)
{
	ROLE_CHECK("device_name");
	VMMRT__CHECK_ARG(b != NULL, "NULL backend");
	VMMRT__CHECK_ARG(buf != NULL && len > 0, "NULL or empty buffer");
	snprintf(buf, len, "%s", b->name);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_bind_thread(vmmrt__backend *b)
{
	CUresult r;

	ROLE_CHECK("bind_thread");
	VMMRT__CHECK_ARG(b != NULL, "NULL backend");
	r = vmmrt__cu.CtxSetCurrent(b->ctx);
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuCtxSetCurrent(primary context of device %d)", b->ordinal);
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
		VMMRT__CHECK_ARG((b) != NULL, "NULL backend"); \
		st_size_ = check_size((b), op, (size)); \
		if (st_size_ != VMMRT_OK) \
			return st_size_; \
	} while (0)

vmmrt_status vmmrt__cuda_granularity(vmmrt__backend *b, size_t *out)
{
	ROLE_CHECK("granularity");
	VMMRT__CHECK_ARG(b != NULL, "NULL backend");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	*out = b->granularity;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_va_reserve(vmmrt__backend *b, size_t size, size_t align, vmmrt_devptr *out)
{
	CUdeviceptr va = 0;

	CHECK_SIZE(b, "cuMemAddressReserve", size);
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemAddressReserve", vmmrt__cu.MemAddressReserve(&va, size, align, 0, 0),
		"cuMemAddressReserve(%zu, align %zu)", size, align);
	*out = (vmmrt_devptr)va;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_va_free(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemAddressFree", size);
	CU_CALL(b, "cuMemAddressFree", vmmrt__cu.MemAddressFree((CUdeviceptr)va, size), "cuMemAddressFree(0x%llx, %zu)",
		(unsigned long long)va, size);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_create(vmmrt__backend *b, size_t size, vmmrt__bhandle *out)
{
	CUmemGenericAllocationHandle h = 0;

	CHECK_SIZE(b, "cuMemCreate", size);
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemCreate", vmmrt__cu.MemCreate(&h, size, &b->prop, 0), "cuMemCreate(%zu)", size);
	*out = (vmmrt__bhandle)h;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_release(vmmrt__backend *b, vmmrt__bhandle h)
{
	CU_CALL(b, "cuMemRelease", vmmrt__cu.MemRelease((CUmemGenericAllocationHandle)h), "cuMemRelease(0x%llx)",
		(unsigned long long)h);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_map(vmmrt__backend *b, vmmrt_devptr va, size_t size, vmmrt__bhandle h, size_t offset)
{
	CHECK_SIZE(b, "cuMemMap", size);
	CU_CALL(b, "cuMemMap", vmmrt__cu.MemMap((CUdeviceptr)va, size, offset, (CUmemGenericAllocationHandle)h, 0),
		"cuMemMap(0x%llx, %zu, offset %zu)", (unsigned long long)va, size, offset);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_unmap(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemUnmap", size);
	CU_CALL(b, "cuMemUnmap", vmmrt__cu.MemUnmap((CUdeviceptr)va, size), "cuMemUnmap(0x%llx, %zu)",
		(unsigned long long)va, size);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_set_access(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	CHECK_SIZE(b, "cuMemSetAccess", size);
	CU_CALL(b, "cuMemSetAccess", vmmrt__cu.MemSetAccess((CUdeviceptr)va, size, &b->access, 1),
		"cuMemSetAccess(0x%llx, %zu, read-write)", (unsigned long long)va, size);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_info(vmmrt__backend *b, size_t *free_bytes, size_t *total_bytes)
{
	size_t f = 0, t = 0;

	ROLE_CHECK("cuMemGetInfo");
	VMMRT__CHECK_ARG(free_bytes != NULL || total_bytes != NULL, "NULL outputs");
	CU_CALL(b, "cuMemGetInfo", vmmrt__cu.MemGetInfo(&f, &t), "cuMemGetInfo");
	if (free_bytes != NULL)
		*free_bytes = f;
	if (total_bytes != NULL)
		*total_bytes = t;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_alloc(vmmrt__backend *b, size_t size, vmmrt_devptr *out)
{
	CUdeviceptr d = 0;
	CUresult r;
	int pushed;

	ROLE_CHECK("cuMemAlloc");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	if (size == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "cuMemAlloc: size 0");
	OP_ENTER(b, "cuMemAlloc", pushed);
	r = vmmrt__cu.MemAlloc(&d, size);
	vmmrt__cuda_ctx_leave(pushed);
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuMemAlloc(%zu)", size);
	*out = (vmmrt_devptr)d;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_mem_free(vmmrt__backend *b, vmmrt_devptr p)
{
	ROLE_CHECK("cuMemFree");
	VMMRT__CHECK_ARG(p != 0, "NULL pointer");
	CU_CALL(b, "cuMemFree", vmmrt__cu.MemFree((CUdeviceptr)p), "cuMemFree(0x%llx)", (unsigned long long)p);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_host_alloc(vmmrt__backend *b, size_t size, void **out)
{
	void *p = NULL;
	CUresult r;
	int pushed;

	ROLE_CHECK("cuMemHostAlloc");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	if (size == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "cuMemHostAlloc: size 0");
	OP_ENTER(b, "cuMemHostAlloc", pushed);
	r = vmmrt__cu.MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
	vmmrt__cuda_ctx_leave(pushed);
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuMemHostAlloc(%zu, portable|devicemap): %s (%s)",
				   size, vmmrt__cuda_error_name(r), vmmrt__cuda_error_text(r));
	if (r != CUDA_SUCCESS)
		return vmmrt__cuda_error(r, "cuMemHostAlloc(%zu, portable|devicemap)", size);
	*out = p;
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_host_free(vmmrt__backend *b, void *p)
{
	ROLE_CHECK("cuMemFreeHost");
	VMMRT__CHECK_ARG(p != NULL, "NULL pointer");
	CU_CALL(b, "cuMemFreeHost", vmmrt__cu.MemFreeHost(p), "cuMemFreeHost(%p)", p);
	return VMMRT_OK;
}

vmmrt_status vmmrt__cuda_host_devptr(vmmrt__backend *b, void *p, vmmrt_devptr *out)
{
	CUdeviceptr d = 0;

	ROLE_CHECK("cuMemHostGetDevicePointer");
	VMMRT__CHECK_ARG(p != NULL, "NULL pointer");
	VMMRT__CHECK_ARG(out != NULL, "NULL output");
	CU_CALL(b, "cuMemHostGetDevicePointer", vmmrt__cu.MemHostGetDevicePointer(&d, p, 0), "cuMemHostGetDevicePointer(%p)",
		p);
	*out = (vmmrt_devptr)d;
	return VMMRT_OK;
}

const vmmrt__backend_ops vmmrt__backend_cuda = VMMRT__BACKEND_TABLE("cuda", cuda_open, cuda_close);

#else /* !VMMRT__CUDA_IMPL */

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

#endif /* VMMRT__CUDA_IMPL */

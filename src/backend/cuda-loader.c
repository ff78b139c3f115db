/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The CUDA backend's driver: libcuda.so.1 is dlopen()ed at run time, never
 * linked, so one build runs with and without a GPU. Only cuGetProcAddress_v2
 * comes from dlsym(); every other entry point is asked of it with an explicit
 * CUDA version per symbol: the version in which the ABI that cuda.h declares
 * today first appeared (plain dlsym would return the oldest ABI: cuMemGetInfo
 * with 32-bit sizes). That function table is process-wide and filled once
 * (pthread_once); everything per device lives in the vmmrt__backend.
 *
 * Also here: a failed driver call as a vmmrt status and a message naming the
 * call, its main argument and the driver's error name:
 * "cuMemCreate(268435456): CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
 */
#include "config.h"

#include "backend/cuda-internal.h"

#ifdef VMMRT__CUDA_IMPL

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct vmmrt__cu_api vmmrt__cu;

struct cu_symbol {
	const char *name;
	int version;
	size_t offset;
	int optional;
};

#define CU_SYM_REQUIRED(name, version) {"cu" #name, version, offsetof(struct vmmrt__cu_api, name), 0},
#define CU_SYM_OPTIONAL(name, version) {"cu" #name, version, offsetof(struct vmmrt__cu_api, name), 1},

static const struct cu_symbol cu_symbols[] = {
	VMMRT__CU_REQUIRED(CU_SYM_REQUIRED)
	VMMRT__CU_OPTIONAL(CU_SYM_OPTIONAL)
};

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static vmmrt_status cu_load_status = VMMRT_E_NO_DEVICE;
static char cu_load_message[384];
static int cu_driver_version;

/* Kept with the process: libcuda is never unloaded once cuInit has run. */
static void *cu_library;

static void cu_load_fail(vmmrt_status status, const char *fmt, ...) VMMRT__PRINTF(2, 3);

static void cu_load_fail(vmmrt_status status, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cu_load_message, sizeof(cu_load_message), fmt, ap);
	va_end(ap);
	cu_load_status = status;
}

const char *vmmrt__cuda_error_name(CUresult r)
{
	const char *s = NULL;

	if (vmmrt__cu.GetErrorName != NULL && vmmrt__cu.GetErrorName(r, &s) == CUDA_SUCCESS && s != NULL)
		return s;
	return "CUDA_ERROR_UNRECOGNIZED";
}

const char *vmmrt__cuda_error_text(CUresult r)
{
	const char *s = NULL;

	if (vmmrt__cu.GetErrorString != NULL && vmmrt__cu.GetErrorString(r, &s) == CUDA_SUCCESS && s != NULL)
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
	if (cu_driver_version < VMMRT__CU_MIN_DRIVER) {
		cu_load_fail(VMMRT_E_NOT_SUPPORTED, "the CUDA driver supports CUDA %d.%d; libvmmrt needs %d.%d or later",
			     cu_driver_version / 1000, cu_driver_version % 1000 / 10, VMMRT__CU_MIN_DRIVER / 1000,
			     VMMRT__CU_MIN_DRIVER % 1000 / 10);
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
			memset(&vmmrt__cu, 0, sizeof(vmmrt__cu));
			dlclose(lib);
			return;
		}
		memcpy((char *)&vmmrt__cu + s->offset, &fn, sizeof(fn));
	}

	/* from here on libcuda stays loaded: it may have started threads */
	cu_library = lib;
	r = vmmrt__cu.Init(0);
	if (r != CUDA_SUCCESS) {
		cu_load_fail(VMMRT_E_NO_DEVICE, "cuInit: %s (%s)", vmmrt__cuda_error_name(r), vmmrt__cuda_error_text(r));
		return;
	}
	cu_load_status = VMMRT_OK;
}

vmmrt_status vmmrt__cuda_load(void)
{
	pthread_once(&cu_once, cu_load_once);
	if (cu_load_status != VMMRT_OK)
		return vmmrt__error(cu_load_status, "%s", cu_load_message);
	return VMMRT_OK;
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

vmmrt_status vmmrt__cuda_error(CUresult r, const char *fmt, ...)
{
	char call[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(call, sizeof(call), fmt, ap);
	va_end(ap);
	return vmmrt__error(cu_status(r), "%s: %s (%s)", call, vmmrt__cuda_error_name(r), vmmrt__cuda_error_text(r));
}

vmmrt_status vmmrt__cuda_refuse_host_func(const char *op)
{
	return vmmrt__error(VMMRT_E_NOT_PERMITTED,
			   "%s: no driver call may be made from inside a host function", op);
}

#endif /* VMMRT__CUDA_IMPL */

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend: a GPU emulated on host memory, so that the whole library
 * runs and is tested without a GPU (it is the default where there is none, and
 * what CI runs).
 *
 * Device pointers are host addresses. A VA reservation is a PROT_NONE mapping;
 * physical memory is a memfd; mapping it is an mmap(MAP_FIXED|MAP_SHARED) of
 * the memfd over the reservation, and unmapping puts PROT_NONE anonymous
 * memory back, so touching an unmapped slot faults exactly like on a GPU and
 * the bytes of a released handle are really gone.
 *
 * This file: open/close, pinned host memory and the ops table; virtual
 * memory and its latency model are host-vmm.c's (src/README: the others).
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <urcu/compiler.h>

#include "backend/host-internal.h"
#include "error.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define HOST_DEFAULT_CAPACITY (16 * GiB)
#define HOST_DEFAULT_GRANULARITY (2 * MiB)
#define HOST_DEFAULT_COPY_GBPS 55.0

struct host_alloc {
	struct cds_list_head node;
	void *p;
	size_t size;
};

/* Pinned allocations are registered by their address, and unmapped at free. */
static bool alloc_is(const struct cds_list_head *node, const void *p)
{
	return caa_container_of(node, struct host_alloc, node)->p == p;
}

static void alloc_release(vmmrt__backend *b, struct cds_list_head *node)
{
	struct host_alloc *a = caa_container_of(node, struct host_alloc, node);

	munmap(a->p, a->size);
	free(a);
}

static const vmmrt__host_kind pinned = {
	.unknown = "%s: %p is not a pinned allocation",
	.list = offsetof(vmmrt__backend, host_allocs),
	.match = alloc_is,
	.release = alloc_release,
};

/* Plain device memory (cuMemAlloc's): host memory the emulated device's
 * copies and kernels reach like any mapped slot, counted against the
 * emulated capacity so that it runs out as a GPU does. */
static void plain_release(vmmrt__backend *b, struct cds_list_head *node)
{
	struct host_alloc *a = caa_container_of(node, struct host_alloc, node);

	pthread_mutex_lock(&b->vmm_lock);
	b->created_bytes -= a->size;
	pthread_mutex_unlock(&b->vmm_lock);
	munmap(a->p, a->size);
	free(a);
}

static const vmmrt__host_kind plain = {
	.unknown = "%s: %p is not a device allocation",
	.list = offsetof(vmmrt__backend, plain_allocs),
	.match = alloc_is,
	.release = plain_release,
};

/* ------------------------------------------------------------ open and close */

static void host_close(vmmrt__backend *b);

static vmmrt_status host_open(const vmmrt__backend_config *cfg, vmmrt__backend **out)
{
	long page = sysconf(_SC_PAGESIZE);
	pthread_condattr_t ca;
	vmmrt__backend *b;

	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: driver call from inside a host function", __func__);
	VMMRT__CHECK_ARG(cfg, "NULL config");
	VMMRT__CHECK_ARG(out, "NULL output");
	*out = NULL;
	if (cfg->device_ordinal != 0)
		return vmmrt__error(VMMRT_E_NO_DEVICE, "%s: the host backend has one device (ordinal 0), not %d",
				   __func__, cfg->device_ordinal);

	b = calloc(1, sizeof(*b));
	if (!b)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: backend", __func__);
	b->cfg = *cfg;
	if (b->cfg.host_capacity == 0)
		b->cfg.host_capacity = HOST_DEFAULT_CAPACITY;
	if (b->cfg.host_granularity == 0)
		b->cfg.host_granularity = HOST_DEFAULT_GRANULARITY;
	if (!(b->cfg.host_copy_gbps > 0))
		b->cfg.host_copy_gbps = HOST_DEFAULT_COPY_GBPS;
	b->granularity = b->cfg.host_granularity;
	if (page <= 0 || (b->granularity & (b->granularity - 1)) || b->granularity % (size_t)page) {
		size_t g = b->granularity;

		free(b);
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
				   "%s: granularity %zu is not a power of two multiple of the page size", __func__, g);
	}

	CDS_INIT_LIST_HEAD(&b->reservations);
	CDS_INIT_LIST_HEAD(&b->handles);
	CDS_INIT_LIST_HEAD(&b->mappings);
	CDS_INIT_LIST_HEAD(&b->streams);
	CDS_INIT_LIST_HEAD(&b->events);
	CDS_INIT_LIST_HEAD(&b->graphs);
	CDS_INIT_LIST_HEAD(&b->host_allocs);
	CDS_INIT_LIST_HEAD(&b->plain_allocs);
	pthread_mutex_init(&b->vmm_lock, NULL);
	pthread_mutex_init(&b->obj_lock, NULL);
	pthread_mutex_init(&b->sync_lock, NULL);
	/* timed value polls must not jump with the wall clock */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->sync_cond, &ca);
	pthread_condattr_destroy(&ca);
	vmmrt_stream def;
	vmmrt_status st = vmmrt__host_stream_create(b, &def);
	if (st != VMMRT_OK) {
		host_close(b);
		return st;
	}
	b->default_stream = def;
	*out = b;
	return VMMRT_OK;
}

/*
 * Close stops and frees everything still open: streams (their pending work is
 * discarded, blocked waits are abandoned), events, graphs, mappings, handles,
 * reservations and pinned memory. It cannot work from inside a host function
 * (it would join the calling thread), so there it does nothing.
 */
static void host_close(vmmrt__backend *b)
{
	if (!b)
		return;
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) {
		vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: called from inside a host function; nothing closed",
			    __func__);
		return;
	}
	vmmrt__host_streams_shutdown(b);

	vmmrt__host_vmm_close(b);
	vmmrt__host_unregister_all(b, &pinned);
	vmmrt__host_unregister_all(b, &plain);
	pthread_cond_destroy(&b->sync_cond);
	pthread_mutex_destroy(&b->sync_lock);
	pthread_mutex_destroy(&b->obj_lock);
	pthread_mutex_destroy(&b->vmm_lock);
	free(b);
}

vmmrt_status vmmrt__host_device_name(vmmrt__backend *b, char *buf, size_t len)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(buf && len > 0, "NULL or empty buffer");
	/* like cuDeviceGetName, a short buffer gets a truncated name */
	snprintf(buf, len, "host-emulated (%g GiB)", (double)b->cfg.host_capacity / (double)GiB);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_bind_thread(vmmrt__backend *b)
{
	/* no context to make current: every thread sees the same address space */
	return vmmrt__host_enter(b, __func__);
}

vmmrt_status vmmrt__host_granularity(vmmrt__backend *b, size_t *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
	*out = b->granularity;
	return VMMRT_OK;
}

/* --------------------------------------------------------- pinned host memory */

/*
 * Page-rounded anonymous memory registered as kind's: pinned host memory,
 * and plain device memory, which is counted against the emulated capacity
 * (what cuMemAlloc takes from the device) and fails as out of device memory.
 */
static vmmrt_status host_region(vmmrt__backend *b, const vmmrt__host_kind *kind, size_t size, bool device,
				const char *fn, void **out)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	vmmrt_status oom = device ? VMMRT_E_OUT_OF_MEMORY : VMMRT_E_HOST_OUT_OF_MEMORY;
	struct host_alloc *a;
	void *p;

	if (size == 0 || size > SIZE_MAX - page)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zu", fn, size);
	size = (size + page - 1) / page * page;
	a = malloc(sizeof(*a));
	if (!a)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: allocation record", fn);
	if (device) {
		pthread_mutex_lock(&b->vmm_lock);
		if (size > b->cfg.host_capacity - b->created_bytes) {
			size_t left = b->cfg.host_capacity - b->created_bytes;

			pthread_mutex_unlock(&b->vmm_lock);
			free(a);
			return vmmrt__error(VMMRT_E_OUT_OF_MEMORY, "%s: %zu bytes requested, %zu of %zu free", fn, size,
					   left, b->cfg.host_capacity);
		}
		b->created_bytes += size;
		if (b->created_bytes > b->created_peak)
			b->created_peak = b->created_bytes;
		pthread_mutex_unlock(&b->vmm_lock);
	}
	/* mmap: page-aligned, and a large buffer goes back to the system at free */
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		int err = errno;

		if (device) {
			pthread_mutex_lock(&b->vmm_lock);
			b->created_bytes -= size;
			pthread_mutex_unlock(&b->vmm_lock);
		}
		free(a);
		return vmmrt__error(oom, "%s: %zu bytes: %s", fn, size, strerror(err));
	}
	a->p = p;
	a->size = size;
	vmmrt__host_register(b, kind, &a->node);
	*out = p;
	return VMMRT_OK;
}

/* As the CUDA frees, which wait for the device's work first: no stream may
 * still read or write the memory when it goes. A pointer that is not one
 * of kind's allocations is refused at once, unsynchronized. */
static vmmrt_status host_region_free(vmmrt__backend *b, const vmmrt__host_kind *kind, void *p, const char *fn)
{
	vmmrt_status st;

	pthread_mutex_lock(&b->obj_lock);
	bool known = vmmrt__host_lookup(b, kind, p) != NULL;
	pthread_mutex_unlock(&b->obj_lock);
	if (!known)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, kind->unknown, fn, p);
	if ((st = vmmrt__host_streams_synchronize(b, fn)) != VMMRT_OK)
		return st;
	return vmmrt__host_destroy(b, kind, p, fn);
}

vmmrt_status vmmrt__host_host_alloc(vmmrt__backend *b, size_t size, void **out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
	return host_region(b, &pinned, size, false, __func__, out);
}

/*
 * As cuMemFreeHost, which synchronizes the context first: no stream may
 * still read the memory (a wait-value on a flag in it, a copy) when it is
 * unmapped. So a stream left waiting for ever on a flag, anywhere, makes
 * the free wait for ever, here as on a GPU: what a hang there looks like.
 */
vmmrt_status vmmrt__host_host_free(vmmrt__backend *b, void *p)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	return host_region_free(b, &pinned, p, __func__);
}

vmmrt_status vmmrt__host_host_devptr(vmmrt__backend *b, void *p, vmmrt_devptr *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_alloc *a;
	bool inside = false;

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
	/* like cuMemHostGetDevicePointer: any address inside a pinned allocation */
	pthread_mutex_lock(&b->obj_lock);
	cds_list_for_each_entry(a, &b->host_allocs, node) {
		if ((uintptr_t)p >= (uintptr_t)a->p && (uintptr_t)p - (uintptr_t)a->p < a->size) {
			inside = true;
			break;
		}
	}
	pthread_mutex_unlock(&b->obj_lock);
	if (!inside)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: %p is not inside a pinned allocation", __func__, p);
	*out = (vmmrt_devptr)(uintptr_t)p;
	return VMMRT_OK;
}

/* ------------------------------------------------------ plain device memory */

vmmrt_status vmmrt__host_mem_alloc(vmmrt__backend *b, size_t size, vmmrt_devptr *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	void *p;

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
	if ((st = host_region(b, &plain, size, true, __func__, &p)) != VMMRT_OK)
		return st;
	*out = (vmmrt_devptr)(uintptr_t)p;
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_mem_free(vmmrt__backend *b, vmmrt_devptr p)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	return host_region_free(b, &plain, (void *)(uintptr_t)p, __func__);
}

/* ----------------------------------------------------------------- ops table */

const vmmrt__backend_ops vmmrt__backend_host = VMMRT__BACKEND_TABLE("host", host_open, host_close);

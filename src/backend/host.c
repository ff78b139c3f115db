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
 * This file: open/close, virtual memory, pinned host memory, the latency model
 * and the ops table. Streams, events, graphs, copies and kernels are in
 * host-stream.c.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <urcu/arch.h>
#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "error.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define HOST_DEFAULT_CAPACITY (16 * GiB)
#define HOST_DEFAULT_GRANULARITY (2 * MiB)
#define HOST_DEFAULT_COPY_GBPS 55.0

struct host_reservation {
	struct cds_list_head node;
	uintptr_t va;
	size_t size;
};

/* The physical memory behind a vmmrt__bhandle. */
struct host_mem {
	struct cds_list_head node;
	int fd;
	size_t size;
	unsigned maps;  /* live mappings; the memory outlives its release until 0 */
	bool released;  /* the handle is dead for the caller even while mapped */
};

struct host_mapping {
	struct cds_list_head node;
	uintptr_t va;
	size_t size;
	struct host_mem *mem;
};

struct host_alloc {
	struct cds_list_head node;
	void *p;
	size_t size;
};

/* ------------------------------------------------------------ shared helpers */

vmmrt_status vmmrt__host_enter(vmmrt__backend *b, const char *func)
{
	/* The CUDA 13 driver answers CUDA_ERROR_NOT_PERMITTED here; older ones deadlock. */
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: driver call from inside a host function", func);
	if (!b)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL backend", func);
	return VMMRT_OK;
}

uint64_t vmmrt__host_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void vmmrt__host_sleep_until(uint64_t deadline_ns)
{
	uint64_t now = vmmrt__host_now_ns();
	int slack;
	uint64_t margin;

	if (now >= deadline_ns)
		return;
	/*
	 * A sleep ends up to the thread's timer slack (50 us by default) late, so
	 * sleep to that much before the deadline and spin the rest: a BUSY kernel
	 * or a modelled 25 us driver call should last what it says, not 75 us.
	 * Stream threads set their slack to 1 ns and so barely spin.
	 */
	slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	margin = (slack > 0 ? (uint64_t)slack : 50000) + 5000;
	if (deadline_ns - now > margin) {
		uint64_t wake = deadline_ns - margin;
		struct timespec ts = {
			.tv_sec = (time_t)(wake / 1000000000ULL),
			.tv_nsec = (long)(wake % 1000000000ULL),
		};
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	while (vmmrt__host_now_ns() < deadline_ns)
		caa_cpu_relax();
}

/* ------------------------------------------------------------- latency model */

enum host_call { CALL_CREATE, CALL_MAP, CALL_SET_ACCESS, CALL_UNMAP, CALL_RELEASE, CALL_COUNT_ };

/* Median microseconds on an idle H200 (shared/gpu/README.md), one handle per size. */
static const struct {
	size_t bytes;
	double us[CALL_COUNT_];
} latency_table[] = {
	{2 * MiB, {11, 1.0, 25, 17, 11}},
	{256 * MiB, {12, 0.7, 41, 23, 94}},
	{1 * GiB, {18, 0.9, 65, 31, 309}},
	{4 * GiB, {42, 1.4, 147, 57, 1182}},
};
#define LATENCY_POINTS (sizeof(latency_table) / sizeof(latency_table[0]))

/*
 * Slow-down per copy in flight: cost = idle cost * (1 + k * copies).
 * The README has cuMemRelease(256 MiB) at 94 us idle and 0.9 ms with two 1 GiB
 * copies in flight (k ~ 4.3), cuMemCreate(256 MiB) at 4.0 ms in the same
 * situation (k ~ 166, a single sample), and whole create+map+set-access cycles
 * under copy load at p50 72 us / max 293 us (k ~ 0.3 to 4). One k for every
 * call keeps the model simple; k = 4 reproduces the release figure and the
 * cycle tail, which is what makes a driver call on the launch path hurt.
 */
#define LATENCY_K_PER_COPY 4.0

static double latency_us(enum host_call c, size_t bytes)
{
	size_t i;

	/* piecewise linear in size; clamp below the first point, extend the last slope */
	if (bytes <= latency_table[0].bytes)
		return latency_table[0].us[c];
	for (i = 1; i < LATENCY_POINTS - 1 && bytes > latency_table[i].bytes; i++)
		;
	{
		double x0 = (double)latency_table[i - 1].bytes, x1 = (double)latency_table[i].bytes;
		double y0 = latency_table[i - 1].us[c], y1 = latency_table[i].us[c];
		double y = y0 + (y1 - y0) * ((double)bytes - x0) / (x1 - x0);

		return y > 0 ? y : 0;
	}
}

/* Make a driver VMM call that started at start_ns last as long as on the H200. */
static void model_latency(vmmrt__backend *b, enum host_call c, size_t bytes, uint64_t start_ns)
{
	double factor, us;

	if (!b->cfg.host_latency)
		return;
	factor = 1.0 + LATENCY_K_PER_COPY * (double)uatomic_read(&b->copies_in_flight);
	us = latency_us(c, bytes) * factor;
	vmmrt__host_sleep_until(start_ns + (uint64_t)(us * 1000.0));
}

/* ------------------------------------------------------------ open and close */

static void host_close(vmmrt__backend *b);

static vmmrt_status host_open(const vmmrt__backend_config *cfg, vmmrt__backend **out)
{
	long page = sysconf(_SC_PAGESIZE);
	pthread_condattr_t ca;
	vmmrt__backend *b;

	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC)
		return vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: driver call from inside a host function", __func__);
	VMMRT_CHECK_ARG(cfg, "NULL config");
	VMMRT_CHECK_ARG(out, "NULL output");
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
	struct host_mapping *m, *mn;
	struct host_reservation *r, *rn;
	struct host_mem *h, *hn;
	struct host_alloc *a, *an;

	if (!b)
		return;
	if (vmmrt__thread_role_get() == VMMRT_ROLE_HOST_FUNC) {
		vmmrt__error(VMMRT_E_NOT_PERMITTED, "%s: called from inside a host function; nothing closed",
			    __func__);
		return;
	}
	vmmrt__host_streams_shutdown(b);

	/* mappings lie inside reservations: unmapping the reservations removes them */
	cds_list_for_each_entry_safe(m, mn, &b->mappings, node) {
		cds_list_del(&m->node);
		free(m);
	}
	cds_list_for_each_entry_safe(r, rn, &b->reservations, node) {
		munmap((void *)r->va, r->size);
		cds_list_del(&r->node);
		free(r);
	}
	cds_list_for_each_entry_safe(h, hn, &b->handles, node) {
		close(h->fd);
		cds_list_del(&h->node);
		free(h);
	}
	cds_list_for_each_entry_safe(a, an, &b->host_allocs, node) {
		munmap(a->p, a->size);
		cds_list_del(&a->node);
		free(a);
	}
	pthread_cond_destroy(&b->sync_cond);
	pthread_mutex_destroy(&b->sync_lock);
	pthread_mutex_destroy(&b->obj_lock);
	pthread_mutex_destroy(&b->vmm_lock);
	free(b);
}

static vmmrt_status host_device_name(vmmrt__backend *b, char *buf, size_t len)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(buf && len > 0, "NULL or empty buffer");
	/* like cuDeviceGetName, a short buffer gets a truncated name */
	snprintf(buf, len, "host-emulated (%g GiB)", (double)b->cfg.host_capacity / (double)GiB);
	return VMMRT_OK;
}

static vmmrt_status host_bind_thread(vmmrt__backend *b)
{
	/* no context to make current: every thread sees the same address space */
	return vmmrt__host_enter(b, __func__);
}

static vmmrt_status host_granularity(vmmrt__backend *b, size_t *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(out, "NULL output");
	*out = b->granularity;
	return VMMRT_OK;
}

/* ------------------------------------------------------------ virtual memory */

static vmmrt_status check_size(vmmrt__backend *b, size_t size, const char *func)
{
	if (size == 0 || size % b->granularity)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zu is not a non-zero multiple of the granularity %zu",
				   func, size, b->granularity);
	return VMMRT_OK;
}

static vmmrt_status errno_status(int err, const char *func, const char *what)
{
	if (err == ENOMEM || err == EMFILE || err == ENFILE || err == EAGAIN)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: %s: %s", func, what, strerror(err));
	return vmmrt__error(VMMRT_E_DRIVER, "%s: %s: %s", func, what, strerror(err));
}

/* Put PROT_NONE anonymous memory over [va, va+size): the "unmapped" state of a reservation. */
static int reset_range(uintptr_t va, size_t size)
{
	void *p = mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);

	return p == MAP_FAILED ? errno : 0;
}

static vmmrt_status host_va_reserve(vmmrt__backend *b, size_t size, size_t align, vmmrt_devptr *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_reservation *r;
	uintptr_t raw, start;
	size_t span;
	void *p;

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(out, "NULL output");
	if ((st = check_size(b, size, __func__)) != VMMRT_OK)
		return st;
	if (align & (align - 1))
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: alignment %zu is not a power of two", __func__, align);
	if (align < b->granularity)
		align = b->granularity;
	if (size > SIZE_MAX - align)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zu overflows with alignment %zu", __func__, size, align);

	r = malloc(sizeof(*r));
	if (!r)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: reservation record", __func__);
	/* mmap only promises page alignment: over-reserve, then trim both ends */
	span = size + align;
	p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		int err = errno;

		free(r);
		return errno_status(err, __func__, "mmap of the reservation");
	}
	raw = (uintptr_t)p;
	start = (raw + align - 1) & ~(uintptr_t)(align - 1);
	if (start > raw)
		munmap((void *)raw, start - raw);
	if (raw + span > start + size)
		munmap((void *)(start + size), raw + span - (start + size));

	r->va = start;
	r->size = size;
	pthread_mutex_lock(&b->vmm_lock);
	cds_list_add_tail(&r->node, &b->reservations);
	pthread_mutex_unlock(&b->vmm_lock);
	*out = (vmmrt_devptr)start;
	return VMMRT_OK;
}

static bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
	return a < b + bn && b < a + an;
}

static vmmrt_status host_va_free(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_reservation *r, *found = NULL;
	struct host_mapping *m;

	if (st != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->vmm_lock);
	cds_list_for_each_entry(r, &b->reservations, node) {
		if (r->va == va && r->size == size) {
			found = r;
			break;
		}
	}
	if (!found) {
		st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: no reservation of %zu bytes at 0x%llx", __func__,
				 size, (unsigned long long)va);
		goto out;
	}
	cds_list_for_each_entry(m, &b->mappings, node) {
		if (overlaps(m->va, m->size, found->va, found->size)) {
			st = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: 0x%llx is still mapped inside the reservation",
					 __func__, (unsigned long long)m->va);
			goto out;
		}
	}
	munmap((void *)found->va, found->size);
	cds_list_del(&found->node);
	free(found);
out:
	pthread_mutex_unlock(&b->vmm_lock);
	return st;
}

/* A live (not released) handle, or NULL. Caller holds vmm_lock. */
static struct host_mem *mem_lookup(vmmrt__backend *b, vmmrt__bhandle h)
{
	struct host_mem *m;

	cds_list_for_each_entry(m, &b->handles, node) {
		if ((vmmrt__bhandle)(uintptr_t)m == h)
			return m->released ? NULL : m;
	}
	return NULL;
}

/* The memory goes (and the accounting drops) once released and unmapped. */
static void mem_put_if_dead(vmmrt__backend *b, struct host_mem *m)
{
	if (!m->released || m->maps > 0)
		return;
	close(m->fd);
	b->created_bytes -= m->size;
	cds_list_del(&m->node);
	free(m);
}

static int host_memfd(void)
{
#ifdef HAVE_MEMFD_CREATE
	return memfd_create("vmmrt-host", MFD_CLOEXEC);
#elif defined(SYS_memfd_create)
	return (int)syscall(SYS_memfd_create, "vmmrt-host", 1U /* MFD_CLOEXEC */);
#else
	errno = ENOSYS;
	return -1;
#endif
}

static vmmrt_status host_mem_create(vmmrt__backend *b, size_t size, vmmrt__bhandle *out)
{
	uint64_t t0 = vmmrt__host_now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mem *m;
	int fd;

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(out, "NULL output");
	if ((st = check_size(b, size, __func__)) != VMMRT_OK)
		return st;
	m = calloc(1, sizeof(*m));
	if (!m)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: handle record", __func__);

	pthread_mutex_lock(&b->vmm_lock);
	if (size > b->cfg.host_capacity - b->created_bytes) {
		st = vmmrt__error(VMMRT_E_OUT_OF_MEMORY, "%s: %zu bytes requested, %zu of %zu free", __func__, size,
				 b->cfg.host_capacity - b->created_bytes, b->cfg.host_capacity);
		goto fail;
	}
	fd = host_memfd();
	if (fd < 0) {
		st = errno_status(errno, __func__, "memfd_create");
		goto fail;
	}
	/* a sparse file: pages are only allocated where the emulated device writes */
	if (ftruncate(fd, (off_t)size) != 0) {
		st = errno_status(errno, __func__, "ftruncate of the memfd");
		close(fd);
		goto fail;
	}
	m->fd = fd;
	m->size = size;
	b->created_bytes += size;
	cds_list_add_tail(&m->node, &b->handles);
	*out = (vmmrt__bhandle)(uintptr_t)m;
	/* the driver's cost is paid inside its lock: VMM calls serialise on the H200 too */
	model_latency(b, CALL_CREATE, size, t0);
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
fail:
	pthread_mutex_unlock(&b->vmm_lock);
	free(m);
	return st;
}

static vmmrt_status host_mem_release(vmmrt__backend *b, vmmrt__bhandle h)
{
	uint64_t t0 = vmmrt__host_now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mem *m;
	size_t size;

	if (st != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->vmm_lock);
	m = mem_lookup(b, h);
	if (!m) {
		pthread_mutex_unlock(&b->vmm_lock);
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown or already released handle 0x%llx",
				   __func__, (unsigned long long)h);
	}
	/* CUDA semantics: allowed while mapped; the memory goes with the last unmap */
	size = m->size;
	m->released = true;
	mem_put_if_dead(b, m);
	model_latency(b, CALL_RELEASE, size, t0);
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
}

/* The reservation holding all of [va, va+size), or NULL. Caller holds vmm_lock. */
static struct host_reservation *reservation_of(vmmrt__backend *b, uintptr_t va, size_t size)
{
	struct host_reservation *r;

	cds_list_for_each_entry(r, &b->reservations, node) {
		if (va >= r->va && size <= r->size && va - r->va <= r->size - size)
			return r;
	}
	return NULL;
}

static vmmrt_status check_range(vmmrt__backend *b, vmmrt_devptr va, size_t size, const char *func)
{
	vmmrt_status st = check_size(b, size, func);

	if (st != VMMRT_OK)
		return st;
	if (va % b->granularity)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: address 0x%llx is not aligned to the granularity %zu",
				   func, (unsigned long long)va, b->granularity);
	if (va > UINTPTR_MAX - size)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: range at 0x%llx wraps around", func,
				   (unsigned long long)va);
	return VMMRT_OK;
}

static vmmrt_status host_mem_map(vmmrt__backend *b, vmmrt_devptr va, size_t size, vmmrt__bhandle h)
{
	uint64_t t0 = vmmrt__host_now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mapping *map, *m;
	struct host_mem *mem;
	void *p;

	if (st != VMMRT_OK)
		return st;
	if ((st = check_range(b, va, size, __func__)) != VMMRT_OK)
		return st;
	map = malloc(sizeof(*map));
	if (!map)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: mapping record", __func__);

	pthread_mutex_lock(&b->vmm_lock);
	mem = mem_lookup(b, h);
	if (!mem) {
		st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown or released handle 0x%llx", __func__,
				 (unsigned long long)h);
		goto fail;
	}
	if (size > mem->size) {
		st = vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: %zu bytes exceed the handle's %zu", __func__, size,
				 mem->size);
		goto fail;
	}
	if (!reservation_of(b, (uintptr_t)va, size)) {
		st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: [0x%llx, +%zu) is not inside one reservation",
				 __func__, (unsigned long long)va, size);
		goto fail;
	}
	cds_list_for_each_entry(m, &b->mappings, node) {
		if (overlaps(m->va, m->size, (uintptr_t)va, size)) {
			st = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: [0x%llx, +%zu) overlaps the mapping at 0x%llx",
					 __func__, (unsigned long long)va, size, (unsigned long long)m->va);
			goto fail;
		}
	}
	/* no access until set_access, as with cuMemMap */
	p = mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, mem->fd, 0);
	if (p == MAP_FAILED) {
		int err = errno;

		/* a failed MAP_FIXED may have punched a hole: keep the range reserved */
		reset_range((uintptr_t)va, size);
		st = errno_status(err, __func__, "mmap of the memfd");
		goto fail;
	}
	map->va = (uintptr_t)va;
	map->size = size;
	map->mem = mem;
	mem->maps++;
	cds_list_add_tail(&map->node, &b->mappings);
	model_latency(b, CALL_MAP, size, t0);
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
fail:
	pthread_mutex_unlock(&b->vmm_lock);
	free(map);
	return st;
}

static vmmrt_status host_mem_unmap(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	uint64_t t0 = vmmrt__host_now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mapping *m, *mn;
	size_t covered = 0;
	int err;

	if (st != VMMRT_OK)
		return st;
	if ((st = check_range(b, va, size, __func__)) != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->vmm_lock);
	/* like cuMemUnmap: whole mappings only, and every byte of the range mapped */
	cds_list_for_each_entry(m, &b->mappings, node) {
		if (!overlaps(m->va, m->size, (uintptr_t)va, size))
			continue;
		if (m->va < va || m->va + m->size > va + size) {
			st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
					 "%s: [0x%llx, +%zu) cuts through the mapping [0x%llx, +%zu)", __func__,
					 (unsigned long long)va, size, (unsigned long long)m->va, m->size);
			goto out;
		}
		covered += m->size;
	}
	if (covered != size) {
		st = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: [0x%llx, +%zu) is %s mapped", __func__,
				 (unsigned long long)va, size, covered ? "only partly" : "not");
		goto out;
	}
	/* so that touching the slot faults from now on, as on a GPU */
	err = reset_range((uintptr_t)va, size);
	if (err) {
		st = errno_status(err, __func__, "mmap of PROT_NONE over the mapping");
		goto out;
	}
	cds_list_for_each_entry_safe(m, mn, &b->mappings, node) {
		if (!overlaps(m->va, m->size, (uintptr_t)va, size))
			continue;
		cds_list_del(&m->node);
		m->mem->maps--;
		mem_put_if_dead(b, m->mem);
		free(m);
	}
	model_latency(b, CALL_UNMAP, size, t0);
out:
	pthread_mutex_unlock(&b->vmm_lock);
	return st;
}

static vmmrt_status host_mem_set_access(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	uint64_t t0 = vmmrt__host_now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mapping *m;
	size_t covered = 0;

	if (st != VMMRT_OK)
		return st;
	if ((st = check_range(b, va, size, __func__)) != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->vmm_lock);
	cds_list_for_each_entry(m, &b->mappings, node) {
		uintptr_t lo, hi;

		if (!overlaps(m->va, m->size, (uintptr_t)va, size))
			continue;
		lo = m->va > va ? m->va : (uintptr_t)va;
		hi = m->va + m->size < va + size ? m->va + m->size : (uintptr_t)(va + size);
		covered += hi - lo;
	}
	if (covered != size) {
		st = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: [0x%llx, +%zu) is %s mapped", __func__,
				 (unsigned long long)va, size, covered ? "only partly" : "not");
		goto out;
	}
	if (mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE) != 0) {
		st = errno_status(errno, __func__, "mprotect");
		goto out;
	}
	model_latency(b, CALL_SET_ACCESS, size, t0);
out:
	pthread_mutex_unlock(&b->vmm_lock);
	return st;
}

static vmmrt_status host_mem_info(vmmrt__backend *b, size_t *free_bytes, size_t *total_bytes)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(free_bytes && total_bytes, "NULL output");
	pthread_mutex_lock(&b->vmm_lock);
	*free_bytes = b->cfg.host_capacity - b->created_bytes;
	*total_bytes = b->cfg.host_capacity;
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
}

/* --------------------------------------------------------- pinned host memory */

static vmmrt_status host_host_alloc(vmmrt__backend *b, size_t size, void **out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct host_alloc *a;
	void *p;

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(out, "NULL output");
	if (size == 0 || size > SIZE_MAX - page)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zu", __func__, size);
	size = (size + page - 1) / page * page;
	a = malloc(sizeof(*a));
	if (!a)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: allocation record", __func__);
	/* mmap: page-aligned, and a large staging buffer goes back to the system at free */
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		free(a);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: %zu bytes: %s", __func__, size, strerror(errno));
	}
	a->p = p;
	a->size = size;
	pthread_mutex_lock(&b->obj_lock);
	cds_list_add_tail(&a->node, &b->host_allocs);
	pthread_mutex_unlock(&b->obj_lock);
	*out = p;
	return VMMRT_OK;
}

static vmmrt_status host_host_free(vmmrt__backend *b, void *p)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_alloc *a, *found = NULL;

	if (st != VMMRT_OK)
		return st;
	pthread_mutex_lock(&b->obj_lock);
	cds_list_for_each_entry(a, &b->host_allocs, node) {
		if (a->p == p) {
			found = a;
			cds_list_del(&a->node);
			break;
		}
	}
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: %p is not a pinned allocation", __func__, p);
	munmap(found->p, found->size);
	free(found);
	return VMMRT_OK;
}

static vmmrt_status host_host_devptr(vmmrt__backend *b, void *p, vmmrt_devptr *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_alloc *a;
	bool inside = false;

	if (st != VMMRT_OK)
		return st;
	VMMRT_CHECK_ARG(out, "NULL output");
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

/* ----------------------------------------------------------------- ops table */

const vmmrt__backend_ops vmmrt__backend_host = {
	.name = "host",
	.open = host_open,
	.close = host_close,
	.device_name = host_device_name,
	.bind_thread = host_bind_thread,

	.granularity = host_granularity,
	.va_reserve = host_va_reserve,
	.va_free = host_va_free,
	.mem_create = host_mem_create,
	.mem_release = host_mem_release,
	.mem_map = host_mem_map,
	.mem_unmap = host_mem_unmap,
	.mem_set_access = host_mem_set_access,
	.mem_info = host_mem_info,

	.stream_create = vmmrt__host_stream_create,
	.stream_destroy = vmmrt__host_stream_destroy,
	.stream_synchronize = vmmrt__host_stream_synchronize,
	.stream_query = vmmrt__host_stream_query,
	.stream_wait_event = vmmrt__host_stream_wait_event,
	.stream_wait_value32 = vmmrt__host_stream_wait_value32,
	.stream_write_value32 = vmmrt__host_stream_write_value32,
	.event_create = vmmrt__host_event_create,
	.event_destroy = vmmrt__host_event_destroy,
	.event_record = vmmrt__host_event_record,
	.event_query = vmmrt__host_event_query,
	.event_synchronize = vmmrt__host_event_synchronize,
	.event_elapsed_ms = vmmrt__host_event_elapsed_ms,
	.launch_host_func = vmmrt__host_launch_host_func,

	.memcpy_htod_async = vmmrt__host_memcpy_htod_async,
	.memcpy_dtoh_async = vmmrt__host_memcpy_dtoh_async,
	.memcpy_dtod_async = vmmrt__host_memcpy_dtod_async,

	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
	.host_devptr = host_host_devptr,

	.stream_begin_capture = vmmrt__host_begin_capture,
	.stream_end_capture = vmmrt__host_end_capture,
	.stream_is_capturing = vmmrt__host_stream_is_capturing,
	.graph_launch = vmmrt__host_graph_launch,
	.graph_destroy = vmmrt__host_graph_destroy,

	.kernel_launch = vmmrt__host_kernel_launch,
};

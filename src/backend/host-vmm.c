/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's virtual memory: VA reservations (PROT_NONE mappings),
 * physical memory (memfd handles), mappings (mmap MAP_FIXED|MAP_SHARED of the
 * memfd over the reservation; unmapping puts PROT_NONE anonymous memory
 * back), their accounting, and the latency model that makes each driver VMM
 * call last as long as on the H200.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "clock.h"
#include "error.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

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

/* ------------------------------------------------------------- latency model */

enum host_call { CALL_CREATE, CALL_MAP, CALL_SET_ACCESS, CALL_UNMAP, CALL_RELEASE, CALL_COUNT_ };

/* Median microseconds on an idle H200, one handle per size (measured for this
 * model on the project's H200, outside this tree). */
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
 * The same measurements have cuMemRelease(256 MiB) at 94 us idle and 0.9 ms with two 1 GiB
 * copies in flight (k ~ 4.3), cuMemCreate(256 MiB) at 4.0 ms in the same
 * situation (k ~ 166, a single sample), and whole create+map+set-access cycles
 * under copy load at p50 72 us / max 293 us (k ~ 0.3 to 4). One k for every
 * call keeps the model simple; k = 4 reproduces the release figure and the
 * cycle tail, which is what makes a driver call on the launch path hurt.
 */
#define LATENCY_K_PER_COPY 4.0
/*
 * cuMemSetAccess of 180 MiB on the H200 (scratch measurement, 2026-12-01):
 * 81 us idle, 157 us beside a 1 GiB H2D, 915 us beside a D2H (whether one
 * copy or 8 MiB pieces), 93 us beside kernels: the one call a D2H in flight
 * slows tenfold. Remap's maps are kept off running D2H copies for this
 * (d2h_yield).
 */
#define SET_ACCESS_K_PER_D2H 10.0

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
	if (c == CALL_SET_ACCESS)
		factor += SET_ACCESS_K_PER_D2H * (double)uatomic_read(&b->d2h_in_flight);
	us = latency_us(c, bytes) * factor;
	vmmrt__sleep_until(start_ns + (uint64_t)(us * 1000.0));
}

/*
 * The end of a VMM op that adds a record under vmm_lock: on success, add it
 * to its list and pay the driver's cost inside the lock (VMM calls
 * serialise on the H200 too); on failure, drop the record.
 */
static vmmrt_status vmm_commit(vmmrt__backend *b, struct cds_list_head *node, struct cds_list_head *list,
			       enum host_call c, size_t size, uint64_t t0)
{
	cds_list_add_tail(node, list);
	model_latency(b, c, size, t0);
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
}

static vmmrt_status vmm_abort(vmmrt__backend *b, void *record, vmmrt_status st)
{
	pthread_mutex_unlock(&b->vmm_lock);
	free(record);
	return st;
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

vmmrt_status vmmrt__host_va_reserve(vmmrt__backend *b, size_t size, size_t align, vmmrt_devptr *out)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_reservation *r;
	uintptr_t raw, start;
	size_t span;
	void *p;

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
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

vmmrt_status vmmrt__host_va_free(vmmrt__backend *b, vmmrt_devptr va, size_t size)
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

vmmrt_status vmmrt__host_mem_create(vmmrt__backend *b, size_t size, vmmrt__bhandle *out)
{
	uint64_t t0 = vmmrt__now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);
	struct host_mem *m;
	int fd;

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(out, "NULL output");
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
	if (b->created_bytes > b->created_peak)
		b->created_peak = b->created_bytes;
	*out = (vmmrt__bhandle)(uintptr_t)m;
	return vmm_commit(b, &m->node, &b->handles, CALL_CREATE, size, t0);
fail:
	return vmm_abort(b, m, st);
}

vmmrt_status vmmrt__host_mem_release(vmmrt__backend *b, vmmrt__bhandle h)
{
	uint64_t t0 = vmmrt__now_ns();
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

vmmrt_status vmmrt__host_mem_map(vmmrt__backend *b, vmmrt_devptr va, size_t size, vmmrt__bhandle h, size_t offset)
{
	uint64_t t0 = vmmrt__now_ns();
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
	/* cuMemMap's rules for the offset: aligned, and the range inside the handle */
	if (offset % b->granularity) {
		st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: offset %zu is not a multiple of the granularity %zu",
				 __func__, offset, b->granularity);
		goto fail;
	}
	if (offset > mem->size || size > mem->size - offset) {
		st = vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: %zu bytes at offset %zu exceed the handle's %zu", __func__,
				 size, offset, mem->size);
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
	p = mmap((void *)(uintptr_t)va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, mem->fd, (off_t)offset);
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
	return vmm_commit(b, &map->node, &b->mappings, CALL_MAP, size, t0);
fail:
	return vmm_abort(b, map, st);
}

vmmrt_status vmmrt__host_mem_unmap(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	uint64_t t0 = vmmrt__now_ns();
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

vmmrt_status vmmrt__host_mem_set_access(vmmrt__backend *b, vmmrt_devptr va, size_t size)
{
	uint64_t t0 = vmmrt__now_ns();
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st == VMMRT_OK && uatomic_read(&b->d2h_in_flight))
		uatomic_inc(&b->set_access_beside_d2h);
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

unsigned long vmmrt__host_set_access_beside_d2h(vmmrt__backend *b)
{
	return uatomic_read(&b->set_access_beside_d2h);
}

size_t vmmrt__host_created_peak(vmmrt__backend *b, bool reset)
{
	pthread_mutex_lock(&b->vmm_lock);
	size_t peak = b->created_peak;
	if (reset)
		b->created_peak = b->created_bytes;
	pthread_mutex_unlock(&b->vmm_lock);
	return peak;
}

vmmrt_status vmmrt__host_mem_info(vmmrt__backend *b, size_t *free_bytes, size_t *total_bytes)
{
	vmmrt_status st = vmmrt__host_enter(b, __func__);

	if (st != VMMRT_OK)
		return st;
	VMMRT__CHECK_ARG(free_bytes && total_bytes, "NULL output");
	pthread_mutex_lock(&b->vmm_lock);
	*free_bytes = b->cfg.host_capacity - b->created_bytes;
	*total_bytes = b->cfg.host_capacity;
	pthread_mutex_unlock(&b->vmm_lock);
	return VMMRT_OK;
}

/* At close, once no stream runs: every mapping, reservation and handle. */
void vmmrt__host_vmm_close(vmmrt__backend *b)
{
	struct host_mapping *m, *mn;
	struct host_reservation *r, *rn;
	struct host_mem *h, *hn;

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
}

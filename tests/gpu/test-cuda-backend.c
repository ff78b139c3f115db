/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * GPU tests of the CUDA backend, driven through its ops table directly (no
 * runtime): VMM round trips, one handle at several addresses (and granule by
 * granule, as a table maps pages), a graph replayed across a remap at the same
 * address, cuMemGetInfo deltas, the host-function rules, the kernels against
 * their host references, events, stream memory operations, capture rules,
 * and two backends on one device from two threads.
 *
 * Without a usable device the program skips before running the group: exit 77
 * (automake's SKIP), or, under CMOCKA_MESSAGE_OUTPUT=TAP (how `make check`
 * runs it, through tap-driver.sh, which reads exit 77 as an error), a
 * "1..0 # SKIP <why>" plan and exit 0.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend-check.h"
#include "backend/backend.h"
#include "error.h"

#ifdef HAVE_CUDA_H
#include <cuda.h>
#if defined(CUDA_VERSION) && CUDA_VERSION >= 12000
#include <cudaTypedefs.h>
#define TEST_RAW_DRIVER 1
#endif
#endif

static const vmmrt__backend_ops *ops = &vmmrt__backend_cuda;
static vmmrt__backend *B; /* opened by main() on device 0 */
static vmmrt_stream S;   /* a stream of B */
static size_t G;         /* B's granularity */

#define MiB ((size_t)1 << 20)

#define EXPECT(status, call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != (status)) \
			fail_msg("%s -> %s, expected %s: %s", #call, vmmrt_status_name(st_), \
				 vmmrt_status_name(status), vmmrt_last_error()); \
	} while (0)

/* A query's answer (finished or not); an error fails the test. */
static bool qd;
#define ev_done(b, e) test_event_done(ops, (b), (e))
#define st_done(b, s) test_stream_done(ops, (b), (s))

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ helpers (any thread) */

/* A mapped, accessible VMM buffer. */
struct dbuf {
	vmmrt_devptr va;
	vmmrt__bhandle h;
	size_t size;
};

static vmmrt_status dbuf_create(vmmrt__backend *b, size_t size, struct dbuf *d)
{
	vmmrt_status st;

	memset(d, 0, sizeof(*d));
	d->size = size;
	st = ops->va_reserve(b, size, 0, &d->va);
	if (st != VMMRT_OK)
		return st;
	st = ops->mem_create(b, size, &d->h);
	if (st != VMMRT_OK)
		goto free_va;
	st = ops->mem_map(b, d->va, size, d->h, 0);
	if (st != VMMRT_OK)
		goto release;
	st = ops->mem_set_access(b, d->va, size);
	if (st != VMMRT_OK)
		goto unmap;
	return VMMRT_OK;
unmap:
	ops->mem_unmap(b, d->va, size);
release:
	ops->mem_release(b, d->h);
free_va:
	ops->va_free(b, d->va, size);
	return st;
}

static vmmrt_status dbuf_destroy(vmmrt__backend *b, struct dbuf *d)
{
	vmmrt_status st = ops->mem_unmap(b, d->va, d->size);

	if (st == VMMRT_OK)
		st = ops->mem_release(b, d->h);
	if (st == VMMRT_OK)
		st = ops->va_free(b, d->va, d->size);
	return st;
}

static vmmrt_status to_host(vmmrt__backend *b, vmmrt_stream s, void *dst, vmmrt_devptr src, size_t n)
{
	vmmrt_status st = ops->memcpy_dtoh_async(b, dst, src, n, s);

	return st != VMMRT_OK ? st : ops->stream_synchronize(b, s);
}

static vmmrt_status to_device(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr dst, const void *src, size_t n)
{
	vmmrt_status st = ops->memcpy_htod_async(b, dst, src, n, s);

	return st != VMMRT_OK ? st : ops->stream_synchronize(b, s);
}

static vmmrt_status kernel(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k, vmmrt_devptr dst, vmmrt_devptr src,
			   vmmrt_devptr out, size_t bytes, uint64_t seed, uint64_t ns)
{
	vmmrt__kernel_args a = {.dst = dst, .src = src, .out = out, .bytes = bytes, .seed = seed, .ns = ns};

	return ops->kernel_launch(b, s, k, &a);
}

static void fill_host(void *p, size_t bytes, uint64_t seed)
{
	uint64_t *w = p;

	for (size_t i = 0; i < bytes / 8; i++)
		w[i] = vmmrt_fill_word(seed, i);
}

/* ------------------------------------------------------------ raw driver (test only) */

#ifdef TEST_RAW_DRIVER
static void *raw_proc(const char *name, int version)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	PFN_cuGetProcAddress_v12000 gpa;
	CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *sym, *fn = NULL;

	if (lib == NULL)
		return NULL;
	sym = dlsym(lib, "cuGetProcAddress_v2");
	if (sym != NULL) {
		memcpy(&gpa, &sym, sizeof(gpa));
		if (gpa(name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q) != CUDA_SUCCESS ||
		    q != CU_GET_PROC_ADDRESS_SUCCESS)
			fn = NULL;
	}
	dlclose(lib); /* drops the NOLOAD reference only: the backend keeps it loaded */
	return fn;
}

#define RAW(var, name, version) \
	do { \
		void *p_ = raw_proc(#name, version); \
		assert_non_null(p_); \
		memcpy(&(var), &p_, sizeof(var)); \
	} while (0)
#endif

/* ------------------------------------------------------------ tests */

static void test_open_and_arguments(void **state)
{
	vmmrt__backend_config cfg = {.device_ordinal = 999};
	vmmrt__backend *other = (vmmrt__backend *)&cfg;
	char name[96];
	size_t free_b = 0, total_b = 0;
	vmmrt__bhandle h;
	vmmrt_devptr va;

	OK(ops->device_name(B, name, sizeof(name)));
	assert_true(strlen(name) > 0);
	print_message("device: %s, granularity %zu\n", name, G);
	assert_true(G >= 4096 && (G & (G - 1)) == 0);
	OK(ops->bind_thread(B));
	OK(ops->mem_info(B, &free_b, &total_b));
	assert_true(total_b > 0 && free_b <= total_b);

	EXPECT(VMMRT_E_NO_DEVICE, ops->open(&cfg, &other));
	assert_null(other);
	assert_non_null(strstr(vmmrt_last_error(), "999"));

	EXPECT(VMMRT_E_INVALID_SIZE, ops->mem_create(B, G + 1, &h));
	EXPECT(VMMRT_E_INVALID_SIZE, ops->mem_create(B, 0, &h));
	EXPECT(VMMRT_E_INVALID_SIZE, ops->va_reserve(B, G / 2, 0, &va));
	EXPECT(VMMRT_E_INVALID_ARGUMENT, ops->mem_create(B, G, NULL));
	EXPECT(VMMRT_E_INVALID_ARGUMENT, ops->mem_create(NULL, G, &h));
	EXPECT(VMMRT_E_INVALID_ARGUMENT, ops->event_query(B, NULL, &qd));
	EXPECT(VMMRT_E_INVALID_ARGUMENT, ops->launch_host_func(B, S, NULL, NULL));
}

/* A driver error keeps the call, its size and the driver's error name. */
static void test_out_of_memory_message(void **state)
{
	size_t total_b = 0, huge;
	vmmrt__bhandle h = 0;
	vmmrt_status st;

	OK(ops->mem_info(B, NULL, &total_b));
	/* more than the whole device: cannot fit */
	huge = (total_b + G - 1) / G * G + G;
	st = ops->mem_create(B, huge, &h);
	print_message("%s\n", vmmrt_last_error());
	if (st == VMMRT_OK)
		ops->mem_release(B, h);
	assert_int_equal(st, VMMRT_E_OUT_OF_MEMORY);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemCreate("));
	assert_non_null(strstr(vmmrt_last_error(), "CUDA_ERROR_OUT_OF_MEMORY"));
}

/* reserve, create, map, set access, bytes there and back, unmap, release, free */
static void test_vmm_roundtrip(void **state)
{
	const size_t size = 2 * G;
	struct dbuf d;
	unsigned char *in, *out;

	OK(ops->host_alloc(B, size, (void **)&in));
	OK(ops->host_alloc(B, size, (void **)&out));
	OK(ops->va_reserve(B, size, 0, &d.va));
	assert_int_equal(d.va % G, 0);
	OK(ops->mem_create(B, size, &d.h));
	OK(ops->mem_map(B, d.va, size, d.h, 0));
	OK(ops->mem_set_access(B, d.va, size));
	d.size = size;

	fill_host(in, size, 1234);
	memset(out, 0, size);
	OK(ops->memcpy_htod_async(B, d.va, in, size, S));
	OK(ops->memcpy_dtoh_async(B, out, d.va, size, S));
	OK(ops->stream_synchronize(B, S));
	assert_memory_equal(in, out, size);

	/* device to device, within the mapping */
	OK(ops->memcpy_dtod_async(B, d.va + G, d.va, G, S));
	OK(to_host(B, S, out, d.va + G, G));
	assert_memory_equal(in, out, G);

	OK(ops->mem_unmap(B, d.va, size));
	OK(ops->mem_release(B, d.h));
	OK(ops->va_free(B, d.va, size));
	OK(ops->host_free(B, in));
	OK(ops->host_free(B, out));
}

/* One handle at two addresses, each mapping all of it (what
 * vmmrt_slot_map_pages does, chunk by chunk): each sees the other's writes,
 * and the memory outlives its release until the last unmap. A part of a
 * handle, from an offset, is refused by the driver (CUDA_ERROR_NOT_SUPPORTED
 * on the H200's, 2026-12-02): why pages are one handle per granule. */
static void test_map_at_offset(void **state)
{
	vmmrt_devptr a, b, c;
	vmmrt__bhandle h, big;
	unsigned char *in, *out;

	OK(ops->host_alloc(B, G, (void **)&in));
	OK(ops->host_alloc(B, G, (void **)&out));
	OK(ops->va_reserve(B, G, 0, &a));
	OK(ops->va_reserve(B, G, 0, &b));
	OK(ops->va_reserve(B, G, 0, &c));
	OK(ops->mem_create(B, G, &h));
	OK(ops->mem_map(B, a, G, h, 0));
	OK(ops->mem_set_access(B, a, G));
	OK(ops->mem_map(B, b, G, h, 0));
	OK(ops->mem_set_access(B, b, G));

	fill_host(in, G, 4321);
	OK(to_device(B, S, a, in, G));
	memset(out, 0, G);
	OK(to_host(B, S, out, b, G));
	assert_memory_equal(in, out, G);
	fill_host(in, G, 99);
	OK(to_device(B, S, b, in, G));
	OK(to_host(B, S, out, a, G));
	assert_memory_equal(in, out, G);

	OK(ops->mem_create(B, 2 * G, &big));
	vmmrt_status st = ops->mem_map(B, c, G, big, G);
	if (st == VMMRT_OK) /* a driver that allows it: fine, the library does not need it */
		OK(ops->mem_unmap(B, c, G));
	else
		assert_int_equal(st, VMMRT_E_NOT_SUPPORTED);
	OK(ops->mem_release(B, big));

	/* released while both are mapped: the memory stays until the last unmap */
	OK(ops->mem_release(B, h));
	OK(to_host(B, S, out, b, G));
	assert_memory_equal(in, out, G);
	OK(ops->mem_unmap(B, a, G));
	OK(ops->mem_unmap(B, b, G));
	OK(ops->va_free(B, a, G));
	OK(ops->va_free(B, b, G));
	OK(ops->va_free(B, c, G));
	OK(ops->host_free(B, in));
	OK(ops->host_free(B, out));
}

/*
 * What vmmrt_slot_map_pages_table does: one reservation of three granules
 * mapping two handles granule by granule, {h1, h0, h1}, so that one handle
 * is mapped twice inside the same reservation (the pool's granules coloured
 * onto the same pages), and h0 at a second reservation too. Writes through
 * granule 0 are read at granule 2, those through the other reservation at
 * granule 1, and one copy spanning the seam of two handles lands in both.
 * Each granule is unmapped alone, as it was mapped.
 */
static void test_map_table(void **state)
{
	vmmrt_devptr t, o;
	vmmrt__bhandle h0, h1;
	unsigned char *in, *out;
	const vmmrt__bhandle *table[3] = {&h1, &h0, &h1};

	OK(ops->host_alloc(B, 2 * G, (void **)&in));
	OK(ops->host_alloc(B, 2 * G, (void **)&out));
	OK(ops->va_reserve(B, 3 * G, 0, &t));
	OK(ops->va_reserve(B, G, 0, &o));
	OK(ops->mem_create(B, G, &h0));
	OK(ops->mem_create(B, G, &h1));
	for (size_t i = 0; i < 3; i++) {
		OK(ops->mem_map(B, t + i * G, G, *table[i], 0));
		OK(ops->mem_set_access(B, t + i * G, G));
	}
	OK(ops->mem_map(B, o, G, h0, 0));
	OK(ops->mem_set_access(B, o, G));

	fill_host(in, G, 555);
	OK(to_device(B, S, t, in, G));
	memset(out, 0, G);
	OK(to_host(B, S, out, t + 2 * G, G));
	assert_memory_equal(in, out, G);
	fill_host(in, G, 556);
	OK(to_device(B, S, o, in, G));
	OK(to_host(B, S, out, t + G, G));
	assert_memory_equal(in, out, G);
	/* across the seam of h0 (granule 1) and h1 (granule 2) */
	fill_host(in, 2 * G, 557);
	OK(to_device(B, S, t + G, in, 2 * G));
	OK(to_host(B, S, out, o, G));
	assert_memory_equal(in, out, G);
	OK(to_host(B, S, out, t, G));
	assert_memory_equal(in + G, out, G);

	/* released while mapped: the memory stays until the last unmap */
	OK(ops->mem_release(B, h0));
	OK(ops->mem_release(B, h1));
	OK(to_host(B, S, out, t, 2 * G));
	assert_memory_equal(in + G, out, G);
	assert_memory_equal(in, out + G, G);
	for (size_t i = 0; i < 3; i++)
		OK(ops->mem_unmap(B, t + i * G, G));
	OK(ops->mem_unmap(B, o, G));
	OK(ops->va_free(B, t, 3 * G));
	OK(ops->va_free(B, o, G));
	OK(ops->host_free(B, in));
	OK(ops->host_free(B, out));
}

/*
 * A graph captured on a slot's address replays correctly after unmap,
 * release, a new cuMemCreate mapped at the same address and an H2D of the
 * saved bytes; without the H2D it reads the new backing's bytes.
 */
static void test_graph_replay_after_remap(void **state)
{
	const size_t size = 4 * G;
	struct dbuf slot, out;
	uint64_t *saved, *other, *sum;
	uint64_t want_saved, want_other;
	vmmrt__bgraph *g = NULL;
	vmmrt_devptr va;

	OK(dbuf_create(B, size, &slot));
	OK(dbuf_create(B, G, &out));
	va = slot.va;
	OK(ops->host_alloc(B, size, (void **)&saved));
	OK(ops->host_alloc(B, size, (void **)&other));
	OK(ops->host_alloc(B, 8, (void **)&sum));

	OK(kernel(B, S, VMMRT_KERNEL_FILL, va, 0, 0, size, 111, 0));
	OK(to_host(B, S, saved, va, size));
	want_saved = vmmrt_checksum_host(saved, size);
	fill_host(other, size, 222);
	want_other = vmmrt_checksum_host(other, size);
	assert_true(want_saved != want_other);

	OK(ops->stream_begin_capture(B, S));
	OK(kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, va, out.va, size, 0, 0));
	OK(ops->stream_end_capture(B, S, &g));
	assert_non_null(g);

	OK(ops->graph_launch(B, g, S));
	OK(to_host(B, S, sum, out.va, 8));
	assert_true(*sum == want_saved);

	/* remap: new physical memory at the same address, other bytes in it */
	OK(ops->mem_unmap(B, va, size));
	OK(ops->mem_release(B, slot.h));
	OK(ops->mem_create(B, size, &slot.h));
	OK(ops->mem_map(B, va, size, slot.h, 0));
	OK(ops->mem_set_access(B, va, size));
	OK(kernel(B, S, VMMRT_KERNEL_FILL, va, 0, 0, size, 222, 0));
	OK(ops->graph_launch(B, g, S));
	OK(to_host(B, S, sum, out.va, 8));
	assert_true(*sum == want_other);

	/* restore the saved bytes: the same graph sees them again */
	OK(to_device(B, S, va, saved, size));
	OK(ops->graph_launch(B, g, S));
	OK(to_host(B, S, sum, out.va, 8));
	assert_true(*sum == want_saved);
	assert_true(slot.va == va);

	OK(ops->graph_destroy(B, g));
	OK(dbuf_destroy(B, &slot));
	OK(dbuf_destroy(B, &out));
	OK(ops->host_free(B, saved));
	OK(ops->host_free(B, other));
	OK(ops->host_free(B, sum));
}

/* cuMemGetInfo sees cuMemCreate and cuMemRelease at once (as a delta). */
static void test_mem_info_delta(void **state)
{
	const size_t size = (256 * MiB + G - 1) / G * G;
	const size_t enough = size / 10 * 9;
	size_t free0, free1, free2;
	vmmrt__bhandle h;

	OK(ops->stream_synchronize(B, S));
	OK(ops->mem_info(B, &free0, NULL));
	OK(ops->mem_create(B, size, &h));
	OK(ops->mem_info(B, &free1, NULL));
	OK(ops->mem_release(B, h));
	OK(ops->mem_info(B, &free2, NULL));
	print_message("free: %zu MiB, after create %zu MiB, after release %zu MiB\n", free0 / MiB, free1 / MiB,
		      free2 / MiB);
	assert_true(free1 < free0 && free0 - free1 >= enough);
	assert_true(free2 > free1 && free2 - free1 >= enough);
}

struct hf_probe {
	size_t size;
	vmmrt__thread_role role;
	vmmrt_status st_create, st_sync, st_launch, st_info;
	int raw_done;
	int raw_result;
	uint64_t raw_handle;
	vmmrt__thread_role role_after; /* seen by a raw host function after ours */
};

#ifdef TEST_RAW_DRIVER
static PFN_cuMemCreate_v10020 raw_mem_create;
static PFN_cuMemRelease_v10020 raw_mem_release;
static PFN_cuLaunchHostFunc_v10000 raw_launch_host_func;

static void CUDA_CB raw_role_probe(void *arg)
{
	struct hf_probe *p = arg;

	p->role_after = vmmrt__thread_role_get();
}
#endif

static void noop_fn(void *arg)
{
}

static void hf_probe_fn(void *arg)
{
	struct hf_probe *p = arg;
	vmmrt__bhandle h = 0;
	size_t f;

	p->role = vmmrt__thread_role_get();
	p->st_create = ops->mem_create(B, p->size, &h);
	p->st_sync = ops->stream_synchronize(B, S); /* would deadlock if it reached the driver */
	p->st_launch = ops->launch_host_func(B, S, noop_fn, NULL);
	p->st_info = ops->mem_info(B, &f, NULL);
#ifdef TEST_RAW_DRIVER
	{
		CUmemAllocationProp prop;
		CUmemGenericAllocationHandle rh = 0;

		memset(&prop, 0, sizeof(prop));
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = 0;
		p->raw_result = (int)raw_mem_create(&rh, p->size, &prop, 0);
		p->raw_handle = rh;
		p->raw_done = 1;
	}
#endif
}

/* Inside a host function every op is refused by us, and the driver refuses too. */
static void test_host_func_refused(void **state)
{
	struct hf_probe p;

	memset(&p, 0, sizeof(p));
	p.size = G;
	p.role_after = VMMRT_ROLE_WORKER;
#ifdef TEST_RAW_DRIVER
	RAW(raw_mem_create, cuMemCreate, 10020);
	RAW(raw_mem_release, cuMemRelease, 10020);
	RAW(raw_launch_host_func, cuLaunchHostFunc, 10000);
#endif
	OK(ops->launch_host_func(B, S, hf_probe_fn, &p));
#ifdef TEST_RAW_DRIVER
	/* not through our trampoline: sees the role the trampoline restored */
	assert_int_equal(raw_launch_host_func((CUstream)S, raw_role_probe, &p), CUDA_SUCCESS);
#endif
	OK(ops->stream_synchronize(B, S));

	assert_int_equal(p.role, VMMRT_ROLE_HOST_FUNC);
	assert_int_equal(p.st_create, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(p.st_sync, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(p.st_launch, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(p.st_info, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(vmmrt__thread_role_get(), VMMRT_ROLE_APP);
#ifdef TEST_RAW_DRIVER
	assert_int_equal(p.role_after, VMMRT_ROLE_APP);
	assert_true(p.raw_done);
	if (p.raw_result == CUDA_SUCCESS)
		raw_mem_release((CUmemGenericAllocationHandle)p.raw_handle);
	print_message("raw cuMemCreate inside a host function: CUresult %d\n", p.raw_result);
	assert_int_equal(p.raw_result, CUDA_ERROR_NOT_PERMITTED);
#else
	print_message("raw driver check skipped: built without CUDA headers\n");
#endif
}

static void count_fn(void *arg)
{
	__atomic_add_fetch((int *)arg, 1, __ATOMIC_RELAXED);
}

/* More host functions than the record pool holds, and host nodes in a graph. */
static void test_host_func_pool_and_graph(void **state)
{
	int count = 0, in_graph = 0;
	vmmrt__bgraph *g = NULL;

	for (int i = 0; i < 1000; i++)
		OK(ops->launch_host_func(B, S, count_fn, &count));
	OK(ops->stream_synchronize(B, S));
	assert_int_equal(__atomic_load_n(&count, __ATOMIC_RELAXED), 1000);

	OK(ops->stream_begin_capture(B, S));
	OK(ops->launch_host_func(B, S, count_fn, &in_graph));
	OK(kernel(B, S, VMMRT_KERNEL_BUSY, 0, 0, 0, 0, 0, 10000));
	OK(ops->launch_host_func(B, S, count_fn, &in_graph));
	OK(ops->stream_end_capture(B, S, &g));
	assert_int_equal(__atomic_load_n(&in_graph, __ATOMIC_RELAXED), 0);
	for (int i = 0; i < 3; i++)
		OK(ops->graph_launch(B, g, S));
	/* pooled records keep working while the graph holds its own */
	for (int i = 0; i < 300; i++)
		OK(ops->launch_host_func(B, S, count_fn, &count));
	OK(ops->graph_launch(B, g, S));
	OK(ops->stream_synchronize(B, S));
	assert_int_equal(__atomic_load_n(&in_graph, __ATOMIC_RELAXED), 8);
	assert_int_equal(__atomic_load_n(&count, __ATOMIC_RELAXED), 1300);
	OK(ops->graph_destroy(B, g));
}

/* FILL, CHECKSUM and LAYER produce the bytes of the host references. */
static void test_kernels_match_host(void **state)
{
	const size_t size = 4 * G;
	static const size_t words[] = {1, 2, 31, 32, 33, 255, 256, 257, 1000, 4097, 65537};
	struct dbuf a, c, out;
	unsigned char *h, *h2;
	uint64_t *w, *w2, *sum;
	size_t fill_bytes = size - 13, nbad = 0;

	OK(dbuf_create(B, size, &a));
	OK(dbuf_create(B, size, &c));
	OK(dbuf_create(B, G, &out));
	OK(ops->host_alloc(B, size, (void **)&h));
	OK(ops->host_alloc(B, size, (void **)&h2));
	OK(ops->host_alloc(B, 8, (void **)&sum));
	w = (uint64_t *)h;
	w2 = (uint64_t *)h2;

	/* FILL: whole words only, the tail is left alone */
	memset(h, 0xAB, size);
	OK(to_device(B, S, a.va, h, size));
	OK(kernel(B, S, VMMRT_KERNEL_FILL, a.va, 0, 0, fill_bytes, 42, 0));
	OK(to_host(B, S, h, a.va, size));
	for (size_t i = 0; i < fill_bytes / 8; i++)
		nbad += w[i] != vmmrt_fill_word(42, i);
	assert_int_equal(nbad, 0);
	for (size_t i = fill_bytes / 8 * 8; i < size; i++)
		assert_int_equal(h[i], 0xAB);

	/* CHECKSUM: the whole buffer and prefixes of many lengths */
	OK(kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, a.va, out.va, size, 0, 0));
	OK(to_host(B, S, sum, out.va, 8));
	assert_true(*sum == vmmrt_checksum_host(h, size));
	for (size_t k = 0; k < sizeof(words) / sizeof(words[0]); k++) {
		OK(kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, a.va, out.va, words[k] * 8, 0, 0));
		OK(to_host(B, S, sum, out.va, 8));
		if (*sum != vmmrt_checksum_host(h, words[k] * 8))
			fail_msg("checksum of %zu words differs", words[k]);
	}
	OK(kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, a.va, out.va, 0, 0, 0));
	OK(to_host(B, S, sum, out.va, 8));
	assert_true(*sum == 0);
	EXPECT(VMMRT_E_INVALID_SIZE, kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, a.va, out.va, 12, 0, 0));

	/* LAYER with an input: dst = src ^ fill */
	OK(kernel(B, S, VMMRT_KERNEL_FILL, a.va, 0, 0, size, 43, 0));
	OK(kernel(B, S, VMMRT_KERNEL_LAYER, c.va, a.va, 0, size, 9, 0));
	OK(to_host(B, S, h2, c.va, size));
	nbad = 0;
	for (size_t i = 0; i < size / 8; i++)
		nbad += w2[i] != (vmmrt_fill_word(43, i) ^ vmmrt_fill_word(9, i));
	assert_int_equal(nbad, 0);

	/* LAYER without an input: dst = fill */
	OK(kernel(B, S, VMMRT_KERNEL_LAYER, c.va, 0, 0, size, 11, 0));
	OK(to_host(B, S, h2, c.va, size));
	nbad = 0;
	for (size_t i = 0; i < size / 8; i++)
		nbad += w2[i] != vmmrt_fill_word(11, i);
	assert_int_equal(nbad, 0);

	OK(dbuf_destroy(B, &a));
	OK(dbuf_destroy(B, &c));
	OK(dbuf_destroy(B, &out));
	OK(ops->host_free(B, h));
	OK(ops->host_free(B, h2));
	OK(ops->host_free(B, sum));
}

/* Timing events around BUSY and LAYER: they last (at least) what was asked. */
static void test_event_timing(void **state)
{
	vmmrt__bevent *e0, *e1, *plain;
	struct dbuf d;
	float ms = 0;

	OK(ops->event_create(B, true, &e0));
	OK(ops->event_create(B, true, &e1));
	OK(ops->event_create(B, false, &plain));
	assert_true(ev_done(B, plain)); /* never recorded: complete */

	OK(ops->event_record(B, e0, S));
	OK(kernel(B, S, VMMRT_KERNEL_BUSY, 0, 0, 0, 0, 0, 5000000));
	OK(ops->event_record(B, e1, S));
	OK(ops->event_synchronize(B, e1));
	assert_true(ev_done(B, e1));
	OK(ops->event_elapsed_ms(B, e0, e1, &ms));
	print_message("BUSY 5 ms: %.3f ms\n", ms);
	assert_true(ms >= 4.9f && ms < 100.0f);

	OK(dbuf_create(B, 2 * G, &d));
	OK(ops->event_record(B, e0, S));
	OK(kernel(B, S, VMMRT_KERNEL_LAYER, d.va, 0, 0, d.size, 5, 3000000));
	OK(ops->event_record(B, e1, S));
	OK(ops->stream_synchronize(B, S));
	OK(ops->event_elapsed_ms(B, e0, e1, &ms));
	print_message("LAYER 3 ms: %.3f ms\n", ms);
	assert_true(ms >= 2.9f && ms < 100.0f);
	OK(dbuf_destroy(B, &d));

	/* a pending event is BUSY, not an error */
	OK(kernel(B, S, VMMRT_KERNEL_BUSY, 0, 0, 0, 0, 0, 200000000));
	OK(ops->event_record(B, plain, S));
	assert_false(ev_done(B, plain));
	assert_false(st_done(B, S));
	OK(ops->event_synchronize(B, plain));
	assert_true(st_done(B, S));

	OK(ops->event_destroy(B, e0));
	OK(ops->event_destroy(B, e1));
	OK(ops->event_destroy(B, plain));
}

/* cuStreamWaitValue32 / cuStreamWriteValue32 on pinned host memory, also in a graph. */
static void test_wait_write_value32(void **state)
{
	volatile uint32_t *flag;
	vmmrt_devptr dflag;
	vmmrt_stream s2;
	vmmrt__bevent *e;
	vmmrt__bgraph *g = NULL;
	void *p;

	OK(ops->host_alloc(B, 4096, &p));
	memset(p, 0, 4096);
	flag = p;
	OK(ops->host_devptr(B, p, &dflag));
	OK(ops->stream_create(B, &s2));
	OK(ops->event_create(B, false, &e));

	OK(ops->stream_wait_value32(B, s2, dflag, 1));
	OK(ops->stream_write_value32(B, s2, dflag + 4, 7));
	OK(ops->event_record(B, e, s2));
	sleep_ms(20);
	assert_false(ev_done(B, e));
	assert_false(st_done(B, s2));
	assert_int_equal(flag[1], 0);
	__atomic_store_n(&flag[0], 1, __ATOMIC_SEQ_CST);
	OK(ops->event_synchronize(B, e));
	assert_int_equal(flag[1], 7);

	/* GEQ: an already larger value passes; the device writes a flag another stream waits for */
	flag[0] = 5;
	OK(ops->stream_wait_value32(B, s2, dflag, 3));
	OK(ops->stream_write_value32(B, S, dflag + 8, 1));
	OK(ops->stream_wait_value32(B, s2, dflag + 8, 1));
	OK(ops->stream_write_value32(B, s2, dflag + 4, 8));
	OK(ops->stream_synchronize(B, s2));
	assert_int_equal(flag[1], 8);
	OK(ops->stream_synchronize(B, S));

	/* captured: the replay waits for the host */
	flag[0] = 1;
	OK(ops->stream_begin_capture(B, s2));
	OK(ops->stream_wait_value32(B, s2, dflag, 2));
	OK(ops->stream_write_value32(B, s2, dflag + 4, 9));
	OK(ops->stream_end_capture(B, s2, &g));
	OK(ops->graph_launch(B, g, s2));
	sleep_ms(10);
	assert_int_equal(flag[1], 8);
	assert_false(st_done(B, s2));
	__atomic_store_n(&flag[0], 2, __ATOMIC_SEQ_CST);
	OK(ops->stream_synchronize(B, s2));
	assert_int_equal(flag[1], 9);

	OK(ops->graph_destroy(B, g));
	OK(ops->event_destroy(B, e));
	OK(ops->stream_destroy(B, s2));
	OK(ops->host_free(B, p));
}

struct vmm_worker {
	size_t size;
	vmmrt_status st;
	char msg[256];
};

static void *vmm_worker_main(void *arg)
{
	struct vmm_worker *w = arg;
	vmmrt__bhandle h;

	vmmrt__thread_role_set(VMMRT_ROLE_WORKER);
	w->st = ops->bind_thread(B);
	for (int i = 0; i < 4 && w->st == VMMRT_OK; i++) {
		w->st = ops->mem_create(B, w->size, &h);
		if (w->st == VMMRT_OK)
			w->st = ops->mem_release(B, h);
	}
	snprintf(w->msg, sizeof(w->msg), "%s", vmmrt_last_error());
	return NULL;
}

/*
 * Capture rules: a worker thread's VMM calls during the application's capture
 * do not break it (thread-local mode); an unsafe call on the capturing stream
 * is VMMRT_E_CAPTURE and invalidates the capture, and the stream recovers.
 */
static void test_capture_rules(void **state)
{
	struct vmm_worker w = {.size = 8 * G};
	struct dbuf d, out;
	vmmrt__bgraph *g = NULL;
	uint64_t *h, *sum;
	pthread_t t;
	bool cap = true;

	OK(dbuf_create(B, G, &d));
	OK(dbuf_create(B, G, &out));
	OK(ops->host_alloc(B, G, (void **)&h));
	OK(ops->host_alloc(B, 8, (void **)&sum));

	OK(ops->stream_is_capturing(B, S, &cap));
	assert_false(cap);
	OK(ops->stream_begin_capture(B, S));
	OK(ops->stream_is_capturing(B, S, &cap));
	assert_true(cap);
	OK(kernel(B, S, VMMRT_KERNEL_FILL, d.va, 0, 0, G, 77, 0));
	assert_int_equal(pthread_create(&t, NULL, vmm_worker_main, &w), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	if (w.st != VMMRT_OK)
		fail_msg("worker during capture: %s", w.msg);
	OK(kernel(B, S, VMMRT_KERNEL_CHECKSUM, 0, d.va, out.va, G, 0, 0));
	OK(ops->stream_end_capture(B, S, &g));
	OK(ops->stream_is_capturing(B, S, &cap));
	assert_false(cap);
	OK(ops->graph_launch(B, g, S));
	OK(to_host(B, S, sum, out.va, 8));
	fill_host(h, G, 77);
	assert_true(*sum == vmmrt_checksum_host(h, G));
	OK(ops->graph_destroy(B, g));

	g = NULL;
	OK(ops->stream_begin_capture(B, S));
	OK(kernel(B, S, VMMRT_KERNEL_BUSY, 0, 0, 0, 0, 0, 1000));
	EXPECT(VMMRT_E_CAPTURE, ops->stream_synchronize(B, S));
	print_message("%s\n", vmmrt_last_error());
	/* invalidated, but still capturing until ended: nothing enqueued runs */
	OK(ops->stream_is_capturing(B, S, &cap));
	assert_true(cap);
	EXPECT(VMMRT_E_CAPTURE, ops->stream_end_capture(B, S, &g));
	print_message("%s\n", vmmrt_last_error());
	assert_null(g);
	OK(ops->stream_is_capturing(B, S, &cap));
	assert_false(cap);
	OK(kernel(B, S, VMMRT_KERNEL_FILL, d.va, 0, 0, G, 78, 0));
	OK(ops->stream_synchronize(B, S));

	OK(dbuf_destroy(B, &d));
	OK(dbuf_destroy(B, &out));
	OK(ops->host_free(B, h));
	OK(ops->host_free(B, sum));
}

/* ------------------------------------------------------------ threads and backends */

struct thread_job {
	int id;
	vmmrt_status st;
	char msg[512];
	int current_after_null; /* 1 when the thread's context was NULL after the ops */
};

#define JOB_CHECK(job, call) \
	do { \
		vmmrt_status st_ = (call); \
		if (st_ != VMMRT_OK) { \
			(job)->st = st_; \
			snprintf((job)->msg, sizeof((job)->msg), "%s: %s", #call, vmmrt_last_error()); \
			goto done; \
		} \
	} while (0)

/* A backend of its own on device 0: fills, checksums (also through a graph), compares. */
static void *two_backends_main(void *arg)
{
	struct thread_job *job = arg;
	vmmrt__backend_config cfg = {.device_ordinal = 0};
	vmmrt__backend *b = NULL;
	vmmrt_stream s = NULL;
	vmmrt__bgraph *g = NULL;
	struct dbuf d = {0}, out = {0};
	int have_d = 0, have_out = 0;
	uint64_t *h = NULL, *sum = NULL;
	size_t gran = 0, size;

	JOB_CHECK(job, ops->open(&cfg, &b));
	JOB_CHECK(job, ops->bind_thread(b));
	JOB_CHECK(job, ops->granularity(b, &gran));
	size = 4 * gran;
	JOB_CHECK(job, ops->stream_create(b, &s));
	JOB_CHECK(job, dbuf_create(b, size, &d));
	have_d = 1;
	JOB_CHECK(job, dbuf_create(b, gran, &out));
	have_out = 1;
	JOB_CHECK(job, ops->host_alloc(b, size, (void **)&h));
	JOB_CHECK(job, ops->host_alloc(b, 8, (void **)&sum));
	for (int i = 0; i < 10; i++) {
		uint64_t seed = (uint64_t)job->id * 1000 + (uint64_t)i;

		JOB_CHECK(job, kernel(b, s, VMMRT_KERNEL_FILL, d.va, 0, 0, size, seed, 0));
		JOB_CHECK(job, kernel(b, s, VMMRT_KERNEL_CHECKSUM, 0, d.va, out.va, size, 0, 0));
		JOB_CHECK(job, to_host(b, s, sum, out.va, 8));
		fill_host(h, size, seed);
		if (*sum != vmmrt_checksum_host(h, size)) {
			job->st = VMMRT_E_CORRUPTED;
			snprintf(job->msg, sizeof(job->msg), "thread %d iteration %d: checksum differs", job->id, i);
			goto done;
		}
	}
	JOB_CHECK(job, ops->stream_begin_capture(b, s));
	JOB_CHECK(job, kernel(b, s, VMMRT_KERNEL_LAYER, d.va, 0, 0, size, (uint64_t)job->id, 100000));
	JOB_CHECK(job, kernel(b, s, VMMRT_KERNEL_CHECKSUM, 0, d.va, out.va, size, 0, 0));
	JOB_CHECK(job, ops->stream_end_capture(b, s, &g));
	for (int i = 0; i < 5; i++)
		JOB_CHECK(job, ops->graph_launch(b, g, s));
	JOB_CHECK(job, to_host(b, s, sum, out.va, 8));
	fill_host(h, size, (uint64_t)job->id);
	if (*sum != vmmrt_checksum_host(h, size)) {
		job->st = VMMRT_E_CORRUPTED;
		snprintf(job->msg, sizeof(job->msg), "thread %d: graph checksum differs", job->id);
	}
done:
	if (g != NULL)
		ops->graph_destroy(b, g);
	if (have_d)
		dbuf_destroy(b, &d);
	if (have_out)
		dbuf_destroy(b, &out);
	if (h != NULL)
		ops->host_free(b, h);
	if (sum != NULL)
		ops->host_free(b, sum);
	if (s != NULL)
		ops->stream_destroy(b, s);
	if (b != NULL)
		ops->close(b);
	return NULL;
}

static void test_two_backends_two_threads(void **state)
{
	struct thread_job jobs[2] = {{.id = 1}, {.id = 2}};
	pthread_t t[2];
	size_t f;

	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&t[i], NULL, two_backends_main, &jobs[i]), 0);
	for (int i = 0; i < 2; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	for (int i = 0; i < 2; i++)
		if (jobs[i].st != VMMRT_OK)
			fail_msg("thread %d: %s", jobs[i].id, jobs[i].msg);
	/* closing those backends left B's (shared primary) context alive */
	OK(kernel(B, S, VMMRT_KERNEL_BUSY, 0, 0, 0, 0, 0, 1000));
	OK(ops->stream_synchronize(B, S));
	OK(ops->mem_info(B, &f, NULL));
}

#ifdef TEST_RAW_DRIVER
static PFN_cuCtxGetCurrent_v4000 raw_ctx_get_current;
#endif

/* A thread that never called bind_thread: ops push and pop B's context. */
static void *unbound_main(void *arg)
{
	struct thread_job *job = arg;
	vmmrt_stream s = NULL;
	struct dbuf d = {0};
	int have_d = 0;
	size_t f;

	JOB_CHECK(job, ops->mem_info(B, &f, NULL));
	JOB_CHECK(job, ops->stream_create(B, &s));
	JOB_CHECK(job, dbuf_create(B, G, &d));
	have_d = 1;
	JOB_CHECK(job, kernel(B, s, VMMRT_KERNEL_FILL, d.va, 0, 0, G, 3, 0));
	JOB_CHECK(job, ops->stream_synchronize(B, s));
#ifdef TEST_RAW_DRIVER
	{
		CUcontext cur = (CUcontext)&cur;

		if (raw_ctx_get_current(&cur) == CUDA_SUCCESS && cur == NULL)
			job->current_after_null = 1;
	}
#else
	job->current_after_null = 1;
#endif
done:
	if (have_d)
		dbuf_destroy(B, &d);
	if (s != NULL)
		ops->stream_destroy(B, s);
	return NULL;
}

static void test_ops_without_bind_thread(void **state)
{
	struct thread_job job = {.id = 3};
	pthread_t t;

#ifdef TEST_RAW_DRIVER
	RAW(raw_ctx_get_current, cuCtxGetCurrent, 4000);
#endif
	assert_int_equal(pthread_create(&t, NULL, unbound_main, &job), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	if (job.st != VMMRT_OK)
		fail_msg("%s", job.msg);
	assert_true(job.current_after_null);
}

/* ------------------------------------------------------------ main */

static int skip_all(const char *why)
{
	const char *mode = getenv("CMOCKA_MESSAGE_OUTPUT");

	fprintf(stderr, "test-cuda-backend: skipped: %s\n", why);
	if (mode != NULL && strcasecmp(mode, "tap") == 0) {
		printf("1..0 # SKIP %s\n", why);
		return 0;
	}
	return 77;
}

/*
 * The tests; those that need the built-in kernels are left out of the group
 * when the library was built without nvcc (rather than skipped: cmocka 1.1.5
 * reports a skipped test as "not ok ... # SKIP", which tap-driver counts as a
 * failure).
 */
static const struct {
	struct CMUnitTest test;
	int needs_kernels;
} all_tests[] = {
	{cmocka_unit_test(test_open_and_arguments), 0},
	{cmocka_unit_test(test_out_of_memory_message), 0},
	{cmocka_unit_test(test_vmm_roundtrip), 0},
	{cmocka_unit_test(test_map_at_offset), 0},
	{cmocka_unit_test(test_map_table), 0},
	{cmocka_unit_test(test_graph_replay_after_remap), 1},
	{cmocka_unit_test(test_mem_info_delta), 0},
	{cmocka_unit_test(test_host_func_refused), 0},
	{cmocka_unit_test(test_host_func_pool_and_graph), 1},
	{cmocka_unit_test(test_kernels_match_host), 1},
	{cmocka_unit_test(test_event_timing), 1},
	{cmocka_unit_test(test_wait_write_value32), 0},
	{cmocka_unit_test(test_capture_rules), 1},
	{cmocka_unit_test(test_two_backends_two_threads), 1},
	{cmocka_unit_test(test_ops_without_bind_thread), 1},
};

#define N_ALL_TESTS (sizeof(all_tests) / sizeof(all_tests[0]))

int main(void)
{
	vmmrt__backend_config cfg;
	vmmrt_status st;
	size_t n = 0;
	int have_kernels, rc;

	memset(&cfg, 0, sizeof(cfg));
	cfg.device_ordinal = 0;
	st = ops->open(&cfg, &B);
	if (st == VMMRT_E_NO_DEVICE || st == VMMRT_E_NOT_SUPPORTED)
		return skip_all(vmmrt_last_error());
	if (st != VMMRT_OK) {
		fprintf(stderr, "test-cuda-backend: open: %s\n", vmmrt_last_error());
		return 1;
	}
	st = ops->granularity(B, &G);
	if (st == VMMRT_OK)
		st = ops->stream_create(B, &S);
	if (st != VMMRT_OK) {
		fprintf(stderr, "test-cuda-backend: setup: %s\n", vmmrt_last_error());
		ops->close(B);
		return 1;
	}

	{
		vmmrt__kernel_args a = {.ns = 0};

		st = ops->kernel_launch(B, S, VMMRT_KERNEL_BUSY, &a);
		have_kernels = st == VMMRT_OK;
		if (st == VMMRT_OK)
			st = ops->stream_synchronize(B, S);
		else
			fprintf(stderr, "test-cuda-backend: no kernels: %s\n", vmmrt_last_error());
		if (st != VMMRT_E_NOT_SUPPORTED && st != VMMRT_OK) {
			fprintf(stderr, "test-cuda-backend: kernel probe: %s\n", vmmrt_last_error());
			ops->close(B);
			return 1;
		}
	}

	for (size_t i = 0; i < N_ALL_TESTS; i++)
		n += have_kernels || !all_tests[i].needs_kernels;
	{
		struct CMUnitTest tests[n]; /* the group: a VLA, so sizeof counts the tests kept */
		size_t j = 0;

		for (size_t i = 0; i < N_ALL_TESTS; i++)
			if (have_kernels || !all_tests[i].needs_kernels)
				tests[j++] = all_tests[i].test;
		if (n < N_ALL_TESTS)
			fprintf(stderr, "test-cuda-backend: %zu tests that need the kernels left out\n", N_ALL_TESTS - n);
		rc = cmocka_run_group_tests(tests, NULL, NULL);
	}

	ops->stream_synchronize(B, S);
	ops->stream_destroy(B, S);
	ops->close(B);
	return rc;
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The arena (vmmrt_arena_*), called as PyTorch's pluggable allocator calls
 * it: best fit across the lent ranges at 512-byte aligned starts, sizes
 * rounded to 512, holes that coalesce, the fallback to plain device memory
 * when nothing fits (usable, freed through the driver), generations (an old
 * segment's bytes never come back nor are served twice), every refusal named
 * with nothing changed, unknown frees counted, four threads never holding
 * overlapping segments, and fallback segments that outlive their runtime.
 */
#include "config.h"

#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "driver.h"
#include "test-common.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1 << 20)
#define DEV 0

/* What a failed test left outstanding (the arena is the process's): each
 * test counts from there, so that one failure does not fail the rest. */
static vmmrt_arena_stats left;

static vmmrt_arena_stats stats(void)
{
	vmmrt_arena_stats s = {.size = sizeof(s)};
	assert_int_equal(vmmrt_arena_stats_get(DEV, &s), VMMRT_OK);
	s.segments -= left.segments;
	s.old_segments -= left.old_segments;
	s.fallback_segments -= left.fallback_segments;
	s.fallback_bytes -= left.fallback_bytes;
	return s;
}

static void arena_reset(void)
{
	assert_int_equal(vmmrt_arena_reset(DEV), VMMRT_OK);
	left = (vmmrt_arena_stats){.size = sizeof(left)};
	assert_int_equal(vmmrt_arena_stats_get(DEV, &left), VMMRT_OK);
}

/* A runtime, with the arena as no earlier test left it. */
static vmmrt_runtime *setup(void)
{
	arena_reset();
	return test_slot_runtime();
}

static vmmrt_slot *mapped_slot(vmmrt_runtime *rt, size_t n)
{
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, n, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	return s;
}

static uint64_t lend1(vmmrt_runtime *rt, vmmrt_devptr addr, size_t size)
{
	uint64_t gen = 0;
	assert_int_equal(vmmrt_arena_lend(rt, DEV, &addr, &size, 1, &gen), VMMRT_OK);
	return gen;
}

static uintptr_t amalloc(ssize_t n)
{
	return (uintptr_t)vmmrt_arena_malloc(n, DEV, NULL);
}

static void afree(uintptr_t p)
{
	vmmrt_arena_free((void *)p, 0, DEV, NULL);
}

/* Two mapped slots of 2 MiB, by address. */
static void two_slots(vmmrt_runtime *rt, uintptr_t *lo, uintptr_t *hi)
{
	uintptr_t a = (uintptr_t)vmmrt_slot_address(mapped_slot(rt, 2 * MiB));
	uintptr_t b = (uintptr_t)vmmrt_slot_address(mapped_slot(rt, 2 * MiB));
	*lo = a < b ? a : b;
	*hi = a < b ? b : a;
}

static void teardown(vmmrt_runtime *rt)
{
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	arena_reset();
}

static void best_fit_across_ranges_aligned(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	uintptr_t lo, hi;
	two_slots(rt, &lo, &hi);
	/* Given high first. The low range starts off alignment: its first
	 * 512-aligned byte is lo + 512, and 588 bytes fit, the least left over. */
	vmmrt_devptr addrs[2] = {hi, lo + 100};
	size_t sizes[2] = {2 * MiB, 1000};
	uint64_t gen = 0;
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 2, &gen), VMMRT_OK);
	assert_int_equal(gen, stats().generation);
	assert_int_equal(stats().lent_bytes, 2 * MiB + 1000);
	uintptr_t a = amalloc(512);
	assert_int_equal(a, lo + 512);
	uintptr_t b = amalloc(1024); /* 76 bytes left in the low range: the high one */
	assert_int_equal(b, hi);
	uintptr_t c = amalloc(100);
	assert_int_equal(c, hi + 1024);
	assert_int_equal(a % 512, 0);
	assert_int_equal(stats().segments, 3);
	assert_int_equal(stats().fallback_total, 0);
	afree(a);
	afree(b);
	afree(c);
	assert_int_equal(stats().segments, 0);
	assert_int_equal(stats().used_bytes, 0);
	teardown(rt);
}

/* A small segment goes where the least is left over, not to the lowest
 * piece: the large one that comes next still fits (first fit by address
 * put the small one in the large range and sent the large one to the
 * driver). */
static void small_segments_leave_the_large_range_whole(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	uintptr_t lo, hi;
	two_slots(rt, &lo, &hi);
	vmmrt_devptr addrs[2] = {lo, hi};
	size_t sizes[2] = {2 * MiB, 64 * KiB};
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 2, NULL), VMMRT_OK);
	uintptr_t small = amalloc(64 * KiB);
	assert_int_equal(small, hi);
	uintptr_t large = amalloc(2 * MiB);
	assert_int_equal(large, lo);
	assert_int_equal(stats().fallback_total, 0);
	/* both whole again: the small range still fits a small one best */
	afree(small);
	afree(large);
	assert_int_equal(amalloc(64 * KiB), hi);
	afree(hi);
	/* pieces that leave as much: the lowest address */
	vmmrt_devptr same[2] = {hi, lo};
	size_t both[2] = {64 * KiB, 64 * KiB};
	assert_int_equal(vmmrt_arena_lend(rt, DEV, same, both, 2, NULL), VMMRT_OK);
	assert_int_equal(amalloc(64 * KiB), lo);
	afree(lo);
	assert_int_equal(stats().segments, 0);
	teardown(rt);
}

static void sizes_round_to_512(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	lend1(rt, base, 2 * MiB);
	uintptr_t a = amalloc(1), b = amalloc(513), c = amalloc(512);
	assert_int_equal(a, base);
	assert_int_equal(b, base + 512);
	assert_int_equal(c, base + 1536);
	assert_int_equal(stats().used_bytes, 2048);
	assert_int_equal(stats().peak_used_bytes, 2048);
	afree(b);
	assert_int_equal(stats().used_bytes, 1024);
	assert_int_equal(stats().peak_used_bytes, 2048);
	afree(a);
	afree(c);
	teardown(rt);
}

static void holes_coalesce(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	lend1(rt, base, 12 * KiB);
	uintptr_t a = amalloc(4 * KiB), b = amalloc(4 * KiB), c = amalloc(4 * KiB);
	assert_int_equal(a, base);
	assert_int_equal(b, base + 4 * KiB);
	assert_int_equal(c, base + 8 * KiB);
	afree(b);
	afree(a);
	/* one hole of A+B, not two of 4 KiB */
	uintptr_t ab = amalloc(8 * KiB);
	assert_int_equal(ab, base);
	assert_int_equal(stats().fallback_total, 0);
	afree(c); /* after the hole's segment: C merges with the free tail only */
	afree(ab);
	uintptr_t all = amalloc(12 * KiB);
	assert_int_equal(all, base);
	assert_int_equal(stats().fallback_total, 0);
	afree(all);
	/* two ranges that touch stay two: a segment never spans what the
	 * caller lent as separate ranges */
	vmmrt_devptr addrs[2] = {base, base + 4 * KiB};
	size_t sizes[2] = {4 * KiB, 4 * KiB};
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 2, NULL), VMMRT_OK);
	uintptr_t two = amalloc(8 * KiB);
	assert_true(two < base || two >= base + 8 * KiB);
	uintptr_t p = amalloc(4 * KiB), q = amalloc(4 * KiB);
	afree(p);
	afree(q);
	uintptr_t again = amalloc(8 * KiB); /* freed pieces do not merge across either */
	assert_true(again < base || again >= base + 8 * KiB);
	afree(two);
	afree(again);
	teardown(rt);
}

static void full_arena_falls_back(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	lend1(rt, base, 4 * KiB);
	size_t before = used(rt);
	uintptr_t f = amalloc(64 * KiB);
	assert_true(f != 0);
	assert_true(f + 64 * KiB <= base || f >= base + 4 * KiB);
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.fallback_segments, 1);
	assert_int_equal(s.fallback_bytes, 64 * KiB);
	assert_int_equal(s.fallback_total, 1);
	assert_int_equal(s.segments, 0);
	assert_int_equal(s.used_bytes, 0);
	if (test_on_host())
		assert_true(used(rt) >= before + 64 * KiB);
	/* usable: a round trip through the backend's copies */
	uint64_t *h, *g;
	assert_int_equal(vmmrt_host_alloc(rt, 64 * KiB, (void **)&h), VMMRT_OK);
	assert_int_equal(vmmrt_host_alloc(rt, 64 * KiB, (void **)&g), VMMRT_OK);
	for (size_t i = 0; i < 64 * KiB / 8; i++)
		h[i] = 0x9e3779b97f4a7c15ull * (i + 1);
	assert_int_equal(vmmrt_copy_to_device(rt, f, h, 64 * KiB), VMMRT_OK);
	assert_int_equal(vmmrt_copy_to_host(rt, g, f, 64 * KiB), VMMRT_OK);
	assert_memory_equal(h, g, 64 * KiB);
	assert_int_equal(vmmrt_host_free(rt, h), VMMRT_OK);
	assert_int_equal(vmmrt_host_free(rt, g), VMMRT_OK);
	afree(f);
	s = stats();
	assert_int_equal(s.fallback_segments, 0);
	assert_int_equal(s.fallback_bytes, 0);
	assert_int_equal(s.fallback_total, 1);
	assert_int_equal(s.frees, 1);
	if (test_on_host())
		assert_int_equal(used(rt), before); /* the driver took it back */
	teardown(rt);
}

static void relend_keeps_old_segments_out(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	uint64_t g1 = lend1(rt, base, 16 * KiB);
	uintptr_t a = amalloc(4 * KiB), b = amalloc(4 * KiB);
	assert_int_equal(a, base);
	assert_int_equal(b, base + 4 * KiB);
	uint64_t g2 = lend1(rt, base, 16 * KiB);
	assert_true(g2 > g1);
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.generation, g2);
	assert_int_equal(s.segments, 2);
	assert_int_equal(s.old_segments, 2);
	assert_int_equal(s.used_bytes, 0);
	/* the old segments' bytes are not served again while the pool holds them */
	uintptr_t c = amalloc(4 * KiB);
	assert_int_equal(c, base + 8 * KiB);
	afree(a);
	s = stats();
	assert_int_equal(s.old_segments, 1);
	assert_int_equal(s.segments, 2);
	assert_int_equal(s.frees, 1);
	/* nor when it frees them: they belong to the old generation */
	uintptr_t d = amalloc(4 * KiB);
	assert_int_equal(d, base + 12 * KiB);
	uintptr_t e = amalloc(4 * KiB);
	assert_true(e != 0 && e != a && e != b);
	assert_int_equal(stats().fallback_segments, 1);
	afree(b);
	afree(c);
	afree(d);
	afree(e);
	s = stats();
	assert_int_equal(s.segments, 0);
	assert_int_equal(s.old_segments, 0);
	assert_int_equal(s.fallback_segments, 0);
	assert_int_equal(s.bad_frees, 0);
	/* the next lend serves them again */
	lend1(rt, base, 16 * KiB);
	uintptr_t all = amalloc(16 * KiB);
	assert_int_equal(all, base);
	afree(all);
	teardown(rt);
}

static void refusals_change_nothing(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	uint64_t g = lend1(rt, base, 8 * KiB);
	uint64_t out = 12345;
	vmmrt_devptr addrs[2] = {base + 64 * KiB, base + 68 * KiB};
	size_t sizes[2] = {8 * KiB, 8 * KiB};
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 2, &out), VMMRT_E_INVALID_ARGUMENT);
	assert_non_null(strstr(vmmrt_last_error(), "overlap"));
	addrs[0] = 0;
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 1, &out), VMMRT_E_INVALID_ARGUMENT);
	addrs[0] = base + 64 * KiB;
	sizes[0] = 0;
	assert_int_equal(vmmrt_arena_lend(rt, DEV, addrs, sizes, 1, &out), VMMRT_E_INVALID_SIZE);
	sizes[0] = 8 * KiB;
	assert_int_equal(vmmrt_arena_lend(NULL, DEV, addrs, sizes, 1, &out), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_arena_lend(rt, DEV, NULL, sizes, 1, &out), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_arena_lend(rt, 64, addrs, sizes, 1, &out), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_arena_lend(rt, 1, addrs, sizes, 1, &out), VMMRT_E_INVALID_ARGUMENT); /* not rt's */
	assert_int_equal(out, 12345);
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.generation, g);
	assert_int_equal(s.lent_bytes, 8 * KiB);
	assert_int_equal(amalloc(8 * KiB), base); /* still the first lend's range */
	afree(base);
	vmmrt_arena_stats small = {.size = sizeof(size_t)};
	assert_int_equal(vmmrt_arena_stats_get(DEV, &small), VMMRT_E_INVALID_SIZE);
	assert_int_equal(vmmrt_arena_stats_get(-1, &s), VMMRT_E_INVALID_ARGUMENT);
	assert_int_equal(vmmrt_arena_reset(64), VMMRT_E_INVALID_ARGUMENT);
	teardown(rt);
}

struct hf_ctx {
	vmmrt_runtime *rt;
	vmmrt_devptr addr;
	vmmrt_status lend_st, reset_st, stats_st;
	uintptr_t fits, falls_back;
};

static void inside_host_function(void *arg)
{
	struct hf_ctx *c = arg;
	size_t n = 4 * KiB;
	vmmrt_arena_stats s = {.size = sizeof(s)};
	c->lend_st = vmmrt_arena_lend(c->rt, DEV, &c->addr, &n, 1, NULL);
	c->reset_st = vmmrt_arena_reset(DEV);
	c->stats_st = vmmrt_arena_stats_get(DEV, &s);
	c->fits = amalloc(512);              /* the lent bytes: no driver call */
	c->falls_back = amalloc(64 * KiB);   /* cuMemAlloc: not from here */
	afree(c->fits);
}

/* A host function may not lend or reset (the library's rule for any call
 * that may reach the driver), nor fall back; the lent bytes it may use. */
static void host_functions_are_refused(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	uint64_t g = lend1(rt, base, 4 * KiB);
	vmmrt_stream st;
	assert_int_equal(vmmrt_stream_create(rt, &st), VMMRT_OK);
	struct hf_ctx c = {.rt = rt, .addr = base + 64 * KiB};
	assert_int_equal(vmmrt__drv_launch_host_func(rt, st, inside_host_function, &c), VMMRT_OK);
	assert_int_equal(vmmrt_stream_synchronize(rt, st), VMMRT_OK);
	assert_int_equal(c.lend_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.reset_st, VMMRT_E_NOT_PERMITTED);
	assert_int_equal(c.stats_st, VMMRT_OK);
	assert_int_equal(c.fits, base);
	assert_int_equal(c.falls_back, 0);
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.generation, g);
	assert_int_equal(s.lent_bytes, 4 * KiB);
	assert_int_equal(s.errors, 1);
	assert_int_equal(s.segments + s.fallback_segments, 0);
	assert_int_equal(vmmrt_stream_destroy(rt, st), VMMRT_OK);
	teardown(rt);
}

static void bad_sizes_are_errors(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	lend1(rt, vmmrt_slot_address(x), 2 * MiB);
	assert_null(vmmrt_arena_malloc(0, DEV, NULL));
	assert_null(vmmrt_arena_malloc(-4096, DEV, NULL));
	assert_non_null(strstr(vmmrt_last_error(), "size"));
	assert_null(vmmrt_arena_malloc(512, 64, NULL));
	assert_null(vmmrt_arena_malloc(512, -1, NULL));
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.errors, 2);
	assert_int_equal(s.allocs, 0);
	assert_int_equal(s.segments + s.fallback_segments, 0);
	teardown(rt);
}

static void no_runtime_no_fallback(void **state)
{
	(void)state;
	arena_reset();
	assert_null(vmmrt_arena_malloc(4096, DEV, NULL));
	assert_non_null(strstr(vmmrt_last_error(), "no runtime"));
	assert_int_equal(stats().errors, 1);
	/* n == 0 lends nothing: everything falls back */
	vmmrt_runtime *rt = setup();
	uint64_t gen = 0;
	assert_int_equal(vmmrt_arena_lend(rt, DEV, NULL, NULL, 0, &gen), VMMRT_OK);
	uintptr_t f = amalloc(4096);
	assert_true(f != 0);
	assert_int_equal(stats().fallback_segments, 1);
	afree(f);
	teardown(rt);
}

static void unknown_frees_are_counted(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	lend1(rt, base, 2 * MiB);
	uintptr_t a = amalloc(4096);
	afree(a + 512); /* inside a segment, not one */
	afree(0x1000);
	vmmrt_arena_free(NULL, 0, DEV, NULL);
	vmmrt_arena_free((void *)a, 4096, 64, NULL); /* no such device: ignored */
	assert_int_equal(stats().bad_frees, 3);
	assert_int_equal(stats().segments, 1);
	afree(a);
	afree(a); /* twice */
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.bad_frees, 4);
	assert_int_equal(s.frees, 1);
	assert_int_equal(s.segments, 0);
	assert_int_equal(amalloc(2 * MiB), base); /* the bad frees gave nothing back twice */
	afree(base);
	teardown(rt);
}

/* ------------------------------------------------------------ 4 threads */

#define UNITS 512 /* 256 KiB of 512-byte units */
struct shared {
	uintptr_t base;
	pthread_mutex_t lock;
	unsigned char owner[UNITS]; /* 0: free, else thread id + 1 */
	unsigned overlaps, nulls, unknown;
	pthread_barrier_t start; /* all four begin together, so their calls interleave */
};

struct worker_arg {
	struct shared *sh;
	unsigned id;
};

/* Mark (or clear) a segment's units; a unit already marked is an overlap. */
static void mark(struct shared *sh, uintptr_t p, size_t n, unsigned id, bool on)
{
	if (p < sh->base || p >= sh->base + UNITS * 512)
		return; /* a fallback segment */
	pthread_mutex_lock(&sh->lock);
	for (size_t u = (p - sh->base) / 512; u < (p - sh->base + n + 511) / 512 && u < UNITS; u++) {
		if (on && sh->owner[u])
			sh->overlaps++;
		if (!on && sh->owner[u] != id + 1)
			sh->unknown++;
		sh->owner[u] = on ? (unsigned char)(id + 1) : 0;
	}
	pthread_mutex_unlock(&sh->lock);
}

static void *hammer(void *arg)
{
	struct worker_arg *w = arg;
	uintptr_t live[8] = {0};
	size_t sizes[8] = {0};
	unsigned seed = 0x1234u + w->id;
	pthread_barrier_wait(&w->sh->start);
	for (int i = 0; i < 100000; i++) {
		unsigned k = (unsigned)rand_r(&seed) % 8;
		if (live[k]) {
			mark(w->sh, live[k], sizes[k], w->id, false);
			afree(live[k]);
			live[k] = 0;
		} else {
			sizes[k] = 1 + (size_t)rand_r(&seed) % (32 * KiB);
			live[k] = amalloc((ssize_t)sizes[k]);
			if (!live[k]) {
				pthread_mutex_lock(&w->sh->lock);
				w->sh->nulls++;
				pthread_mutex_unlock(&w->sh->lock);
				continue;
			}
			mark(w->sh, live[k], sizes[k], w->id, true);
		}
	}
	for (int k = 0; k < 8; k++)
		if (live[k]) {
			mark(w->sh, live[k], sizes[k], w->id, false);
			afree(live[k]);
		}
	return NULL;
}

static void four_threads_never_overlap(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	struct shared *sh = calloc(1, sizeof(*sh));
	assert_non_null(sh);
	sh->base = (uintptr_t)vmmrt_slot_address(x);
	pthread_mutex_init(&sh->lock, NULL);
	pthread_barrier_init(&sh->start, NULL, 4);
	/* 256 KiB for 4 x 8 segments of up to 32 KiB: it fills, and some fall back */
	lend1(rt, sh->base, UNITS * 512);
	pthread_t t[4];
	struct worker_arg args[4];
	for (unsigned i = 0; i < 4; i++) {
		args[i] = (struct worker_arg){sh, i};
		assert_int_equal(pthread_create(&t[i], NULL, hammer, &args[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(sh->overlaps, 0);
	assert_int_equal(sh->unknown, 0);
	assert_int_equal(sh->nulls, 0);
	vmmrt_arena_stats s = stats();
	assert_int_equal(s.segments, 0);
	assert_int_equal(s.fallback_segments, 0);
	assert_int_equal(s.used_bytes, 0);
	assert_int_equal(s.allocs, s.frees);
	assert_int_equal(s.bad_frees, 0);
	assert_int_equal(s.errors, 0);
	/* every hole merged back into the one range */
	uintptr_t all = amalloc(UNITS * 512);
	assert_int_equal(all, sh->base);
	afree(all);
	pthread_mutex_destroy(&sh->lock);
	pthread_barrier_destroy(&sh->start);
	free(sh);
	teardown(rt);
}

/* ------------------------------------------------------------ destroy */

/* The process's threads: an open host backend has its stream threads. */
static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	struct dirent *e;
	assert_non_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void fallback_outlives_its_runtime(void **state)
{
	(void)state;
	/* a runtime made and destroyed first: the threads that stay with the
	 * process (liburcu's) are there before the count */
	assert_int_equal(vmmrt_runtime_destroy(setup()), VMMRT_OK);
	int before = threads();
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	uintptr_t base = (uintptr_t)vmmrt_slot_address(x);
	lend1(rt, base, 8 * KiB);
	uintptr_t s = amalloc(4 * KiB);
	uintptr_t f = amalloc(256 * KiB), f2 = amalloc(512);
	assert_int_equal(s, base);
	assert_int_equal(stats().fallback_segments, 1);
	assert_true(f != 0 && f2 == base + 4 * KiB);
	uintptr_t f3 = amalloc(8 * KiB);
	assert_int_equal(stats().fallback_segments, 2);
	assert_int_equal(vmmrt_slot_destroy(x), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	vmmrt_arena_stats st = stats();
	assert_int_equal(st.lent_bytes, 0);
	assert_int_equal(st.segments, 2);
	assert_int_equal(st.old_segments, 2);
	assert_int_equal(st.fallback_segments, 2);
	/* no runtime to fall back to: NULL, and said */
	assert_null(vmmrt_arena_malloc(512, DEV, NULL));
	assert_int_equal(stats().errors, 1);
	if (test_on_host()) /* the fallback memory is still there (host pointers) */
		memset((void *)f, 0x5a, 256 * KiB);
	afree(f);
	afree(s);
	afree(f2);
	if (test_on_host())
		memset((void *)f3, 0xa5, 8 * KiB);
	if (test_on_host())
		assert_true(threads() > before); /* the backend is open: its streams run */
	afree(f3); /* the last one: the arena closes the backend */
	if (test_on_host())
		assert_int_equal(threads(), before);
	st = stats();
	assert_int_equal(st.segments + st.fallback_segments, 0);
	assert_int_equal(st.bad_frees, 0);
	assert_int_equal(st.errors, 1);
	arena_reset();
}

/* A runtime that lent and is gone, then a new one lends: only the new one's
 * ranges, and its own fallback. */
static void a_new_runtime_takes_over(void **state)
{
	(void)state;
	vmmrt_runtime *rt = setup();
	vmmrt_slot *x = mapped_slot(rt, 2 * MiB);
	lend1(rt, vmmrt_slot_address(x), 4 * KiB);
	uintptr_t f = amalloc(64 * KiB); /* rt's fallback, outstanding over the next lend */
	assert_true(f != 0);
	vmmrt_runtime *rt2 = test_slot_runtime();
	vmmrt_slot *y = mapped_slot(rt2, 2 * MiB);
	uintptr_t base2 = (uintptr_t)vmmrt_slot_address(y);
	lend1(rt2, base2, 4 * KiB);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK); /* not the lender now */
	assert_int_equal(stats().lent_bytes, 4 * KiB);
	assert_int_equal(amalloc(4 * KiB), base2);
	uintptr_t f2 = amalloc(64 * KiB);
	assert_true(f2 != 0);
	assert_int_equal(stats().fallback_segments, 2);
	afree(f);
	afree(f2);
	afree(base2);
	assert_int_equal(stats().fallback_segments, 0);
	teardown(rt2);
}

int main(void)
{
	struct CMUnitTest tests[] = {
		cmocka_unit_test(best_fit_across_ranges_aligned),
		cmocka_unit_test(small_segments_leave_the_large_range_whole),
		cmocka_unit_test(sizes_round_to_512),
		cmocka_unit_test(holes_coalesce),
		cmocka_unit_test(full_arena_falls_back),
		cmocka_unit_test(relend_keeps_old_segments_out),
		cmocka_unit_test(refusals_change_nothing),
		cmocka_unit_test(bad_sizes_are_errors),
		cmocka_unit_test(host_functions_are_refused),
		cmocka_unit_test(no_runtime_no_fallback),
		cmocka_unit_test(unknown_frees_are_counted),
		cmocka_unit_test(four_threads_never_overlap),
		cmocka_unit_test(fallback_outlives_its_runtime),
		cmocka_unit_test(a_new_runtime_takes_over),
	};
	return test_run(tests, sizeof(tests) / sizeof(tests[0]));
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The arena: an allocator over device address ranges the caller lends, for
 * PyTorch's CUDAPluggableAllocator in a MemPool. The memory plan keeps pages
 * mapped at slot addresses for the whole step; at the optimizer step most of
 * them hold nothing live, and the caching allocator cannot see them. Lent
 * here, they serve the pool's segments (foreach AdamW's temporaries) instead
 * of new memory.
 *
 * PyTorch calls malloc and free from any thread with no context argument, so
 * the state is a static table, one arena per device ordinal, each under one
 * mutex: the pool asks for whole segments and caches them, so these calls are
 * rare (never a hot path). It frees a segment only at empty_cache or when the
 * pool dies, possibly after the ranges were lent again: every segment records
 * the generation (lend) it came from, and only the current generation's
 * bytes return to the free ranges. A lend carves the bytes of every segment
 * still outstanding out of its ranges, so a cached old segment is never
 * served twice.
 *
 * A malloc that does not fit falls back to plain device memory through the
 * runtime of the last lend (cuMemAlloc), so that PyTorch never sees an
 * out-of-memory because of the arena. That memory belongs to the runtime's
 * backend (on the CUDA backend its primary context, which the backend's close
 * releases; on the host backend the emulated device): when the runtime is
 * destroyed with fallback segments outstanding, the arena takes the backend
 * over (vmmrt__drv_detach) and closes it after the last of them is freed, so
 * they stay valid. libcuda itself is never unloaded (src/backend/cuda-loader.c
 * keeps it for the process) and libvmmrt is linked -z nodelete.
 */
#include "config.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/list.h>

#include "api.h"
#include "arena.h"
#include "driver.h"
#include "error.h"
#include "runtime.h"

#define ARENA_DEVICES 64
#define ARENA_ALIGN ((uintptr_t)512)

/* A runtime whose backend allocated fallback segments. */
struct arena_owner {
	struct cds_list_head node;
	vmmrt_runtime *rt;         /* NULL once destroyed: then drv holds its backend */
	vmmrt__drv_detached drv;
	size_t segments;           /* its fallback segments outstanding */
};

/* A free piece of the current generation's ranges; range: which lent range
 * it lies in (pieces of two ranges never merge, even when they touch). */
struct arena_free {
	struct cds_list_head node; /* by address */
	uintptr_t start, end;
	size_t range;
};

/* A segment handed out. */
struct arena_seg {
	struct cds_list_head node;
	uintptr_t ptr;
	size_t size;
	uint64_t generation;
	size_t range;
	struct arena_owner *owner; /* fallback: whose backend allocated it; NULL: lent bytes */
};

struct arena {
	pthread_mutex_t lock;
	vmmrt_runtime *rt;         /* the last lend's, NULL before, after reset or its destroy */
	struct arena_owner *owner; /* rt's record, made at the first fallback */
	uint64_t generation;
	bool serving;              /* the generation's ranges are in force */
	struct cds_list_head free;
	struct cds_list_head segs;
	struct cds_list_head owners;
	uint64_t lent_bytes, used_bytes, peak_used_bytes;
	uint64_t fallback_total, allocs, frees, bad_frees, errors;
};

static struct arena arenas[ARENA_DEVICES];
static pthread_once_t arenas_once = PTHREAD_ONCE_INIT;

static void arenas_init(void)
{
	for (int i = 0; i < ARENA_DEVICES; i++) {
		pthread_mutex_init(&arenas[i].lock, NULL);
		CDS_INIT_LIST_HEAD(&arenas[i].free);
		CDS_INIT_LIST_HEAD(&arenas[i].segs);
		CDS_INIT_LIST_HEAD(&arenas[i].owners);
	}
}

static struct arena *arena_of(int device, const char *func)
{
	if (device < 0 || device >= ARENA_DEVICES) {
		vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: device %d is not an ordinal 0..%d", func, device,
			     ARENA_DEVICES - 1);
		return NULL;
	}
	pthread_once(&arenas_once, arenas_init);
	return &arenas[device];
}

static void free_list_clear(struct cds_list_head *list)
{
	struct arena_free *f, *fn;
	cds_list_for_each_entry_safe(f, fn, list, node) {
		cds_list_del(&f->node);
		free(f);
	}
}

/* The ranges stop serving: what is outstanding becomes an earlier generation's. */
static void stop_serving(struct arena *a)
{
	free_list_clear(&a->free);
	a->serving = false;
	a->lent_bytes = 0;
	a->used_bytes = 0;
	a->generation++;
}

/* Free an owner with nothing outstanding that no lend names any more. */
static void owner_put(struct arena *a, struct arena_owner *o)
{
	if (o->segments || o == a->owner)
		return;
	if (!o->rt)
		vmmrt__drv_detached_close(&o->drv);
	cds_list_del(&o->node);
	free(o);
}

/* ------------------------------------------------------------------ lend */

struct lent {
	uintptr_t start, end;
	size_t index;
};

static int cmp_lent(const void *x, const void *y)
{
	const struct lent *p = x, *q = y;
	return (p->start > q->start) - (p->start < q->start);
}

/* Remove [s, e) from the sorted list (pieces keep their range). */
static vmmrt_status carve(struct cds_list_head *list, uintptr_t s, uintptr_t e)
{
	struct arena_free *f, *fn;
	cds_list_for_each_entry_safe(f, fn, list, node) {
		if (f->end <= s || f->start >= e)
			continue;
		if (f->start < s && f->end > e) {
			struct arena_free *right = malloc(sizeof(*right));
			if (!right)
				return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "vmmrt_arena_lend: free range record");
			*right = (struct arena_free){.start = e, .end = f->end, .range = f->range};
			f->end = s;
			cds_list_add(&right->node, &f->node);
			return VMMRT_OK;
		}
		if (f->start < s) {
			f->end = s;
		} else if (f->end > e) {
			f->start = e;
		} else {
			cds_list_del(&f->node);
			free(f);
		}
	}
	return VMMRT_OK;
}

/* The free list of a lend: its ranges by address, less the outstanding segments. */
static vmmrt_status build_free(struct lent *r, size_t n, struct cds_list_head *segs, struct cds_list_head *out)
{
	for (size_t i = 0; i < n; i++) {
		struct arena_free *f = malloc(sizeof(*f));
		if (!f)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "vmmrt_arena_lend: free range record");
		*f = (struct arena_free){.start = r[i].start, .end = r[i].end, .range = i};
		cds_list_add_tail(&f->node, out);
	}
	struct arena_seg *g;
	cds_list_for_each_entry(g, segs, node) {
		vmmrt_status st;
		if (!g->owner && (st = carve(out, g->ptr, g->ptr + g->size)) != VMMRT_OK)
			return st;
	}
	return VMMRT_OK;
}

vmmrt_status vmmrt_arena_lend(vmmrt_runtime *rt, int device, const vmmrt_devptr *addrs, const size_t *sizes, size_t n,
			      uint64_t *generation)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(n == 0 || (addrs && sizes), "addrs or sizes is NULL");
	struct arena *a = arena_of(device, __func__);
	if (!a)
		return VMMRT_E_INVALID_ARGUMENT;
	if (device != rt->be_cfg.device_ordinal)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT,
				    "%s: device %d is not the runtime's (%d): its fallback memory would be on another "
				    "device", __func__, device, rt->be_cfg.device_ordinal);
	if (n > SIZE_MAX / sizeof(struct lent))
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: %zu ranges", __func__, n);
	struct lent *r = calloc(n ? n : 1, sizeof(*r));
	if (!r)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: %zu ranges", __func__, n);
	vmmrt_status st = VMMRT_OK;
	uint64_t total = 0;
	for (size_t i = 0; i < n && st == VMMRT_OK; i++) {
		if (addrs[i] == 0)
			st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: range %zu has address 0", __func__, i);
		else if (sizes[i] == 0 || sizes[i] > UINTPTR_MAX - (uintptr_t)addrs[i])
			st = vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: range %zu (0x%llx) has size %zu", __func__, i,
					  (unsigned long long)addrs[i], sizes[i]);
		r[i] = (struct lent){.start = (uintptr_t)addrs[i], .end = (uintptr_t)addrs[i] + sizes[i], .index = i};
		total += sizes[i];
	}
	if (st == VMMRT_OK)
		qsort(r, n, sizeof(*r), cmp_lent);
	for (size_t i = 1; i < n && st == VMMRT_OK; i++)
		if (r[i].start < r[i - 1].end)
			st = vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: ranges %zu and %zu overlap", __func__,
					  r[i - 1].index, r[i].index);
	if (st != VMMRT_OK) {
		free(r);
		return st;
	}

	CDS_LIST_HEAD(fresh);
	pthread_mutex_lock(&a->lock);
	st = build_free(r, n, &a->segs, &fresh);
	free(r);
	if (st != VMMRT_OK) {
		pthread_mutex_unlock(&a->lock);
		free_list_clear(&fresh);
		return st;
	}
	stop_serving(a);
	cds_list_splice(&fresh, &a->free);
	a->serving = true;
	a->lent_bytes = total;
	a->peak_used_bytes = 0;
	if (a->rt != rt) {
		struct arena_owner *old = a->owner;
		a->rt = rt;
		a->owner = NULL;
		if (old)
			owner_put(a, old);
	}
	if (generation)
		*generation = a->generation;
	pthread_mutex_unlock(&a->lock);
	return VMMRT_OK;
}

/* ------------------------------------------------------------ malloc, free */

/*
 * Best fit at a 512-byte aligned start (the piece that leaves the least
 * behind; the lowest address among equals); the piece is split around the
 * segment. First fit by address fills the lowest piece first whatever the
 * size, so small segments take bytes a large one needed later, and the
 * large one falls back to the driver: on the H200, 8 recomputed Llama-3-8B
 * layers' foreach AdamW step left 256 of 2162 lent MiB unused while 1456
 * MiB came from the driver.
 */
static bool take(struct arena *a, size_t size, uintptr_t *ptr, size_t *range)
{
	struct arena_free *f, *best = NULL;
	uintptr_t bs = 0;
	size_t left = SIZE_MAX;
	cds_list_for_each_entry(f, &a->free, node) {
		uintptr_t s = (f->start + ARENA_ALIGN - 1) & ~(ARENA_ALIGN - 1);
		if (s < f->start || s >= f->end || f->end - s < size)
			continue;
		if (f->end - s - size < left) {
			best = f;
			bs = s;
			left = f->end - s - size;
			if (!left)
				break;
		}
	}
	if (!best)
		return false;
	f = best;
	uintptr_t s = bs, e = s + size;
	*ptr = s;
	*range = f->range;
	if (s > f->start && e < f->end) {
		struct arena_free *right = malloc(sizeof(*right));
		if (!right)
			return false;
		*right = (struct arena_free){.start = e, .end = f->end, .range = f->range};
		cds_list_add(&right->node, &f->node);
		f->end = s;
	} else if (s > f->start) {
		f->end = s;
	} else if (e < f->end) {
		f->start = e;
	} else {
		cds_list_del(&f->node);
		free(f);
	}
	return true;
}

/* rt's record: one per runtime, whose destroy takes its backend once. */
static struct arena_owner *current_owner(struct arena *a)
{
	struct arena_owner *o;
	if (!a->owner) {
		cds_list_for_each_entry(o, &a->owners, node)
			if (o->rt == a->rt)
				return a->owner = o;
	}
	if (!a->owner) {
		o = calloc(1, sizeof(*o));
		if (!o)
			return NULL;
		o->rt = a->rt;
		cds_list_add(&o->node, &a->owners);
		a->owner = o;
	}
	return a->owner;
}

void *vmmrt_arena_malloc(ssize_t size, int device, void *stream)
{
	(void)stream; /* the pool orders its own use of a segment; a segment is memory, not work */
	vmmrt__error_clear();
	struct arena *a = arena_of(device, __func__);
	if (!a)
		return NULL;
	pthread_mutex_lock(&a->lock);
	void *out = NULL;
	if (size <= 0 || (size_t)size > SIZE_MAX - ARENA_ALIGN) {
		vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: size %zd", __func__, size);
		a->errors++;
		goto done;
	}
	size_t bytes = ((size_t)size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
	struct arena_seg *g = calloc(1, sizeof(*g));
	if (!g) {
		vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: segment record", __func__);
		a->errors++;
		goto done;
	}
	g->size = bytes;
	g->generation = a->generation;
	if (a->serving && take(a, bytes, &g->ptr, &g->range)) {
		a->used_bytes += bytes;
		if (a->used_bytes > a->peak_used_bytes)
			a->peak_used_bytes = a->used_bytes;
	} else {
		vmmrt_devptr p = 0;
		struct arena_owner *o = NULL;
		vmmrt_status st;
		if (!a->rt)
			st = vmmrt__error(VMMRT_E_INVALID_STATE,
					  "%s: %zu bytes do not fit device %d's arena, and no runtime is lent to it "
					  "to fall back to (none yet, or reset, or destroyed)", __func__, bytes, device);
		else if (!(o = current_owner(a)))
			st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: owner record", __func__);
		else
			st = vmmrt__drv_mem_alloc(a->rt, bytes, &p);
		if (st != VMMRT_OK) {
			free(g);
			a->errors++;
			goto done;
		}
		g->ptr = (uintptr_t)p;
		g->owner = o;
		o->segments++;
		a->fallback_total++;
	}
	cds_list_add_tail(&g->node, &a->segs);
	a->allocs++;
	out = (void *)g->ptr;
done:
	pthread_mutex_unlock(&a->lock);
	return out;
}

/* Back into the sorted free list, merged with the pieces of its range it touches. */
static void give_back(struct arena *a, struct arena_seg *g)
{
	uintptr_t s = g->ptr, e = g->ptr + g->size;
	struct arena_free *f, *prev = NULL, *next = NULL;
	cds_list_for_each_entry(f, &a->free, node) {
		if (f->start >= e) {
			next = f;
			break;
		}
		prev = f;
	}
	bool join_prev = prev && prev->end == s && prev->range == g->range;
	bool join_next = next && next->start == e && next->range == g->range;
	if (join_prev && join_next) {
		prev->end = next->end;
		cds_list_del(&next->node);
		free(next);
	} else if (join_prev) {
		prev->end = e;
	} else if (join_next) {
		next->start = s;
	} else {
		struct arena_free *n = malloc(sizeof(*n));
		if (!n) {
			/* The bytes stay unserved until the next lend: a lost range, not a fault. */
			a->errors++;
			return;
		}
		*n = (struct arena_free){.start = s, .end = e, .range = g->range};
		cds_list_add(&n->node, prev ? &prev->node : &a->free);
	}
}

void vmmrt_arena_free(void *ptr, ssize_t size, int device, void *stream)
{
	(void)size;   /* the segment's own record says how big it is */
	(void)stream;
	vmmrt__error_clear();
	struct arena *a = arena_of(device, __func__);
	if (!a)
		return;
	pthread_mutex_lock(&a->lock);
	struct arena_seg *g, *found = NULL;
	cds_list_for_each_entry(g, &a->segs, node) {
		if (g->ptr == (uintptr_t)ptr) {
			found = g;
			break;
		}
	}
	if (!found) {
		a->bad_frees++;
		vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: %p is not a segment of device %d's arena", __func__, ptr,
			     device);
		pthread_mutex_unlock(&a->lock);
		return;
	}
	cds_list_del(&found->node);
	if (found->owner) {
		struct arena_owner *o = found->owner;
		vmmrt_status st = o->rt ? vmmrt__drv_mem_free(o->rt, (vmmrt_devptr)found->ptr)
					: vmmrt__drv_detached_mem_free(&o->drv, (vmmrt_devptr)found->ptr);
		if (st != VMMRT_OK)
			a->errors++; /* the message stays with this thread */
		o->segments--;
		owner_put(a, o);
	} else if (a->serving && found->generation == a->generation) {
		a->used_bytes -= found->size;
		give_back(a, found);
	}
	a->frees++;
	free(found);
	pthread_mutex_unlock(&a->lock);
}

/* -------------------------------------------------- reset, stats, destroy */

vmmrt_status vmmrt_arena_reset(int device)
{
	VMMRT__API_ENTER();
	struct arena *a = arena_of(device, __func__);
	if (!a)
		return VMMRT_E_INVALID_ARGUMENT;
	pthread_mutex_lock(&a->lock);
	stop_serving(a);
	struct arena_owner *o = a->owner;
	a->rt = NULL;
	a->owner = NULL;
	if (o)
		owner_put(a, o);
	a->peak_used_bytes = 0;
	a->fallback_total = a->allocs = a->frees = a->bad_frees = a->errors = 0;
	pthread_mutex_unlock(&a->lock);
	return VMMRT_OK;
}

vmmrt_status vmmrt_arena_stats_get(int device, vmmrt_arena_stats *out)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(out, "out is NULL");
	struct arena *a = arena_of(device, __func__);
	if (!a)
		return VMMRT_E_INVALID_ARGUMENT;
	vmmrt_arena_stats s = {.size = sizeof(s)};
	pthread_mutex_lock(&a->lock);
	struct arena_seg *g;
	cds_list_for_each_entry(g, &a->segs, node) {
		if (g->owner) {
			s.fallback_segments++;
			s.fallback_bytes += g->size;
		} else {
			s.segments++;
			if (!a->serving || g->generation != a->generation)
				s.old_segments++;
		}
	}
	s.generation = a->generation;
	s.lent_bytes = a->lent_bytes;
	s.used_bytes = a->used_bytes;
	s.peak_used_bytes = a->peak_used_bytes;
	s.fallback_total = a->fallback_total;
	s.allocs = a->allocs;
	s.frees = a->frees;
	s.bad_frees = a->bad_frees;
	s.errors = a->errors;
	pthread_mutex_unlock(&a->lock);
	return VMMRT__SIZED_OUT(out, s, VMMRT__ARENA_STATS_SIZE_V1, "vmmrt_arena_stats");
}

void vmmrt__arena_runtime_gone(vmmrt_runtime *rt)
{
	int device = rt->be_cfg.device_ordinal;
	if (device < 0 || device >= ARENA_DEVICES)
		return;
	pthread_once(&arenas_once, arenas_init);
	struct arena *a = &arenas[device];
	pthread_mutex_lock(&a->lock);
	if (a->rt == rt) {
		stop_serving(a);
		a->rt = NULL;
		a->owner = NULL;
	}
	struct arena_owner *o, *on;
	cds_list_for_each_entry_safe(o, on, &a->owners, node) {
		if (o->rt != rt)
			continue;
		if (o->segments) {
			vmmrt__drv_detach(rt, &o->drv);
			o->rt = NULL;
		} else {
			owner_put(a, o);
		}
	}
	pthread_mutex_unlock(&a->lock);
}

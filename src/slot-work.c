/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * What a driver worker does to a slot: the requests map, ensure (map unless
 * mapped), release and destroy, and each worker's handle pool. worker.c
 * runs a request by its ops (vmmrt__request_ops) and knows nothing of slots;
 * this file is the slots' side of it. Everything here runs on the slot's
 * worker, the only thread that maps or unmaps it (attach/detach also on the
 * launch thread in driver_inline mode, where there is no worker).
 *
 * The pool (handle_pool option): released handles kept per worker for the
 * next map of the same size instead of cuMemRelease. A handle whose
 * cuMemRelease failed is stashed and released again when the worker is next
 * idle, at trim and at stop. The pool is for the library's own slots (remap
 * reuses its handles within its budget): the application's slots
 * (vmmrt_slot_create) neither take from it nor give to it, since an
 * application releases a slot so that the driver has the memory again.
 *
 * A bound slot (vmmrt_slot_map_pages) maps memory it does not own: a
 * vmmrt_pages' handle, which other slots may map too. Whatever unmaps it
 * (unmap, release, destroy) leaves the handle to the pages (put_back).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>
#include <urcu/urcu-bp.h>

#include "array.h"
#include "error.h"
#include "pages.h"
#include "slot.h"
#include "tsan.h"

typedef struct pooled_handle {
	size_t size;
	vmmrt__bhandle h;
} pooled_handle;

/* One worker's pool: its vmmrt__worker_class local state. */
typedef struct slot_pool {
	vmmrt_runtime *rt;
	unsigned cap;
	/* released handles kept for reuse */
	pooled_handle *handles;
	unsigned nhandles, room;
	/* handles whose cuMemRelease failed, released again later */
	vmmrt__bhandle *stash;
	unsigned nstash, capstash;
	vmmrt__slot_pool_stats stats; /* updated with uatomic by the worker, read by anyone */
} slot_pool;

/* ------------------------------------------------------------ the slot */

/* The application's slots' device memory (slot_bytes) and its peak, as the
 * statistics report them: only this worker maps and unmaps the slot. A bound
 * slot's memory is its pages', counted once, by the pages. */
static void account(vmmrt_slot *s, int64_t delta)
{
	if (!s->app || s->bound)
		return;
	vmmrt__app_bytes_add(s->rt, delta);
}

/* h, the slot's own memory, at the slot's address. */
static vmmrt_status attach_at(vmmrt_slot *s, vmmrt__bhandle h)
{
	vmmrt_runtime *rt = s->rt;

	if (s->mapped)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu at 0x%llx is already mapped",
				   (unsigned long long)s->id, (unsigned long long)s->va);
	vmmrt_status st = vmmrt__drv_mem_map(rt, s->va, s->size, h, 0);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: map", (unsigned long long)s->id);
	st = vmmrt__drv_mem_set_access(rt, s->va, s->size);
	if (st != VMMRT_OK) {
		/* Roll the partial map back so the slot is exactly as before; a
		 * refused unmap is tried once more, as a destroy does, or the
		 * memory would stay mapped behind a slot that says it is not. */
		char why[512];
		snprintf(why, sizeof(why), "%s", vmmrt_last_error());
		if (vmmrt__drv_mem_unmap(rt, s->va, s->size) != VMMRT_OK)
			(void)vmmrt__drv_mem_unmap(rt, s->va, s->size);
		vmmrt__error_adopt(why);
		return vmmrt__error_wrap(st, "slot %llu: set access (map rolled back)", (unsigned long long)s->id);
	}
	s->mapped = true;
	if (s->budgeted)
		uatomic_inc(&s->rt->budgeted_handles);
	s->handle = h;
	account(s, (int64_t)s->size);
	return VMMRT_OK;
}

vmmrt_status vmmrt__slot_attach(vmmrt_slot *s, vmmrt__bhandle h)
{
	return attach_at(s, h);
}

/* A bound slot's chunks in [0, upto), unmapped one by one, as they were
 * mapped (an unmap may not cover more than one mapping on every driver). */
static vmmrt_status unmap_chunks(vmmrt_slot *s, size_t upto)
{
	vmmrt_status first = VMMRT_OK;
	for (size_t off = 0; off < upto; off += s->bind_chunk) {
		vmmrt_status st = vmmrt__drv_mem_unmap(s->rt, s->va + off, s->bind_chunk);
		if (st != VMMRT_OK && first == VMMRT_OK)
			first = st;
	}
	return first;
}

/* A bound slot's chunks, each a whole handle of the pages at its place in the
 * slot (cuMemMap maps a handle from offset 0 only), each given access; on a
 * failure the chunks mapped so far are unmapped again. Chunk i is the pages'
 * chunk bind_table[i] / c, or, with no table, the i-th from bind_offset on:
 * one loop for both binds, so that the linear one is a table too. */
static vmmrt_status attach_pages(vmmrt_slot *s)
{
	vmmrt_runtime *rt = s->rt;
	const vmmrt_pages *p = s->bind_pages;
	const size_t *table = s->bind_table;
	size_t c = p->chunk, first = s->bind_offset / c, n = s->size / c, i = 0, done = 0;
	vmmrt_status st = VMMRT_OK;

	if (s->mapped)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu at 0x%llx is already mapped",
				   (unsigned long long)s->id, (unsigned long long)s->va);
	for (; i < n; i++, done += c) {
		vmmrt__bhandle h = p->handles[table ? table[i] / c : first + i];
		if ((st = vmmrt__drv_mem_map(rt, s->va + done, c, h, 0)) != VMMRT_OK)
			break;
		if ((st = vmmrt__drv_mem_set_access(rt, s->va + done, c)) != VMMRT_OK) {
			done += c; /* mapped: rolled back with the others */
			break;
		}
	}
	if (st != VMMRT_OK) {
		/* i: the chunk that failed; done: the bytes mapped up to it */
		char why[512];
		snprintf(why, sizeof(why), "%s", vmmrt_last_error());
		s->bind_chunk = c;
		(void)unmap_chunks(s, done);
		vmmrt__error_adopt(why);
		if (table)
			return vmmrt__error_wrap(st, "slot %llu: map of pages %llu by its table (chunk %zu of %zu, the "
						 "pages' offset %zu; rolled back)", (unsigned long long)s->id,
						 (unsigned long long)p->id, i + 1, n, table[i]);
		return vmmrt__error_wrap(st, "slot %llu: map of pages %llu at offset %zu (chunk %zu of %zu; rolled back)",
					 (unsigned long long)s->id, (unsigned long long)p->id, s->bind_offset, i + 1, n);
	}
	s->bind_chunk = c;
	s->mapped = true;
	s->handle = 0;
	return VMMRT_OK;
}

vmmrt_status vmmrt__slot_detach(vmmrt_slot *s, vmmrt__bhandle *h)
{
	if (!s->mapped)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu at 0x%llx is not mapped",
				   (unsigned long long)s->id, (unsigned long long)s->va);
	vmmrt_status st = s->bound ? unmap_chunks(s, s->size) : vmmrt__drv_mem_unmap(s->rt, s->va, s->size);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: unmap", (unsigned long long)s->id);
	s->mapped = false;
	*h = s->handle;
	s->handle = 0;
	if (s->budgeted)
		uatomic_dec(&s->rt->budgeted_handles);
	account(s, -(int64_t)s->size);
	return VMMRT_OK;
}

/* DESTROY: unmap what is mapped (the handle back to the caller) and free the VA. */
static vmmrt_status teardown(vmmrt_slot *s, vmmrt__bhandle *handle_out, bool *had_handle)
{
	*had_handle = false;
	if (s->mapped) {
		vmmrt_status st = vmmrt__slot_detach(s, handle_out);
		if (st != VMMRT_OK)
			return st;
		*had_handle = true;
	}
	return vmmrt__drv_va_free(s->rt, s->va, s->reserved);
}

static void free_slot_rcu(struct rcu_head *head)
{
	vmmrt_slot *s = caa_container_of(head, vmmrt_slot, rcu);
	VMMRT__TSAN_ACQUIRE(s); /* after the grace period: pairs with retire */
	free(s->bind_table); /* a bind cancelled before it ran (slot.h); NULL otherwise */
	free(s);
}

/* Unlink the slot and free it after an RCU grace period. */
static void retire(vmmrt_slot *s)
{
	vmmrt_runtime *rt = s->rt;

	pthread_mutex_lock(&rt->slots_lock);
	cds_list_del_rcu(&s->link);
	pthread_mutex_unlock(&rt->slots_lock);
	uatomic_dec(&rt->live_slots);
	/* Readers walking rt->slots may still hold s: free after a grace period. */
	VMMRT__TSAN_RELEASE(s); /* call_rcu hands the slot to liburcu's thread */
	urcu_bp_call_rcu(&s->rcu, free_slot_rcu);
}

/* Record a failure on the slot so the next API call reports it. */
static void publish_error(vmmrt_slot *s, vmmrt_status st)
{
	snprintf(s->errmsg, sizeof(s->errmsg), "%s", vmmrt_last_error());
	uatomic_set(&s->error, (int32_t)st);
	vmmrt__slot_set_state(s, VMMRT_SLOT_FAILED);
}

/* ------------------------------------------------------------ the pool */

static unsigned pool_cap(const slot_pool *p)
{
	int64_t reuse = uatomic_read(&p->rt->reuse_cap);
	return reuse > (int64_t)p->cap ? (unsigned)reuse : p->cap;
}

/* Room for what the pool may hold now (the reuse cap moves with the budget). */
static bool pool_make_room(slot_pool *p)
{
	return vmmrt__array_reserve(&p->handles, &p->room, pool_cap(p), sizeof(*p->handles));
}

/*
 * The slot is unmapped by then: a failed cuMemRelease must not undo that or
 * fail the request (a retry would find nothing to unmap). The handle is kept
 * and released again at the worker's next idle moment, at trim and at stop;
 * what still fails then stays counted in live_handles, which destroy reports.
 */
/*
 * Keep h? Under handle_pool, while the pool has room. Under reuse, only if
 * the kept ones and those mapped on the budget's slots stay below remap's
 * budget with it: they never exceed it, even while the backings allocation
 * made for capture (outside the budget) are being released.
 */
static bool pool_may_keep(slot_pool *p)
{
	if (p->nhandles < p->cap)
		return pool_make_room(p);
	int64_t reuse = uatomic_read(&p->rt->reuse_cap);
	return reuse > 0 && uatomic_read(&p->rt->budgeted_handles) + p->nhandles < reuse && pool_make_room(p);
}

/* h, unmapped from s: to the pool if s may use it and it has room, else to the driver. */
static vmmrt_status release_handle(slot_pool *p, const vmmrt_slot *s, vmmrt__bhandle h)
{
	size_t size = s->size;
	if (!s->app && pool_may_keep(p)) {
		p->handles[p->nhandles++] = (pooled_handle){size, h};
		uatomic_inc(&p->stats.pool_handles);
		return VMMRT_OK;
	}
	vmmrt_status st = vmmrt__drv_mem_release(p->rt, h);
	if (st == VMMRT_OK)
		return VMMRT_OK;
	if (!vmmrt__array_reserve(&p->stash, &p->capstash, p->nstash + 1, sizeof(*p->stash)))
		return st;
	p->stash[p->nstash++] = h;
	return VMMRT_OK;
}

/* h, just unmapped from s: the pages' if s was bound (s is unbound now),
 * else the slot's own memory, to release_handle. */
static vmmrt_status put_back(slot_pool *p, vmmrt_slot *s, vmmrt__bhandle h)
{
	if (s->bound) {
		s->bound = false;
		return VMMRT_OK;
	}
	return release_handle(p, s, h);
}

static void release_stash(slot_pool *p)
{
	unsigned kept = 0;
	for (unsigned i = 0; i < p->nstash; i++)
		if (vmmrt__drv_mem_release(p->rt, p->stash[i]) != VMMRT_OK)
			p->stash[kept++] = p->stash[i];
	p->nstash = kept;
}

static vmmrt_status trim_pool(slot_pool *p)
{
	vmmrt_status first = VMMRT_OK;
	release_stash(p);
	while (p->nhandles) {
		pooled_handle *ph = &p->handles[--p->nhandles];
		vmmrt_status st = vmmrt__drv_mem_release(p->rt, ph->h);
		uatomic_dec(&p->stats.pool_handles);
		if (st != VMMRT_OK && first == VMMRT_OK)
			first = st;
	}
	return first;
}

static bool take_pooled(slot_pool *p, size_t size, vmmrt__bhandle *h)
{
	for (unsigned i = p->nhandles; i-- > 0;) {
		if (p->handles[i].size == size) {
			*h = p->handles[i].h;
			p->handles[i] = p->handles[--p->nhandles];
			uatomic_dec(&p->stats.pool_handles);
			uatomic_inc(&p->stats.pool_hits);
			return true;
		}
	}
	return false;
}

/* cuMemCreate with bounded, doubling back-off on out-of-memory: memory that a
 * release in flight on the GPU is about to return may be there shortly. */
static vmmrt_status create_handle(slot_pool *p, const vmmrt_slot *s, vmmrt__bhandle *h)
{
	vmmrt_runtime *rt = p->rt;
	size_t size = s->size;
	uint64_t retries = vmmrt__opt_u(&rt->opts, VMMRT_OPT_OOM_RETRIES);
	uint64_t backoff = vmmrt__opt_u(&rt->opts, VMMRT_OPT_OOM_BACKOFF_US);

	/* The application's slots stay out of the pool both ways (see the top of
	 * the file); an out-of-memory below still empties it, for them too. */
	if (!s->app && take_pooled(p, size, h))
		return VMMRT_OK;
	/* Reuse within remap's budget: the pool's handles and the mapped ones
	 * together are never more than the budget, so a map its pool cannot
	 * serve gives them back before it makes a new one. */
	if (!s->app && p->nhandles && uatomic_read(&p->rt->reuse_cap) > 0)
		(void)trim_pool(p);
	for (uint64_t attempt = 0;; attempt++) {
		vmmrt_status st = vmmrt__drv_mem_create(rt, size, h);
		if (st != VMMRT_OK && st == VMMRT_E_OUT_OF_MEMORY && p->nhandles) {
			/* Pooled handles of other sizes are memory we can give back now. */
			(void)trim_pool(p);
			st = vmmrt__drv_mem_create(rt, size, h);
		}
		if (st != VMMRT_E_OUT_OF_MEMORY || attempt >= retries)
			return st;
		uatomic_inc(&p->stats.oom_retries);
		uint64_t us = backoff << (attempt < 20 ? attempt : 20);
		vmmrt__sleep_ns(us * 1000);
	}
}

/* The worker class of the runtime's workers: one pool each. */
static vmmrt_status pool_init(void *local, vmmrt_runtime *rt)
{
	slot_pool *p = local;
	p->rt = rt;
	p->cap = (unsigned)vmmrt__opt_u(&rt->opts, VMMRT_OPT_HANDLE_POOL);
	if (p->cap && !pool_make_room(p))
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "handle pool of %u", p->cap);
	return VMMRT_OK;
}

static void pool_idle(void *local)
{
	slot_pool *p = local;
	if (p->nstash)
		release_stash(p);
}

static void pool_stop(void *local)
{
	(void)trim_pool(local);
}

static void pool_fini(void *local)
{
	slot_pool *p = local;
	free(p->handles);
	free(p->stash);
}

const vmmrt__worker_class vmmrt__slot_worker_class = {
	.local_size = sizeof(slot_pool),
	.init = pool_init,
	.idle = pool_idle,
	.stop = pool_stop,
	.fini = pool_fini,
};

static void trim_call(void *arg)
{
	(void)trim_pool(arg);
}

vmmrt_status vmmrt__slot_pools_trim(vmmrt__workers *w)
{
	unsigned n = vmmrt__workers_count(w);
	vmmrt__request *reqs = calloc(n, sizeof(*reqs));
	vmmrt_status first = VMMRT_OK;
	if (!reqs)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "trim");
	for (unsigned i = 0; i < n; i++) {
		vmmrt__request_init_call(&reqs[i], trim_call, vmmrt__workers_local(w, i));
		vmmrt_status st = vmmrt__worker_push(w, i, &reqs[i]);
		if (st != VMMRT_OK && first == VMMRT_OK)
			first = st;
	}
	for (unsigned i = 0; i < n; i++) {
		vmmrt_status st = vmmrt__request_wait(&reqs[i], UINT64_MAX);
		if (st != VMMRT_OK && first == VMMRT_OK)
			first = st;
	}
	free(reqs);
	return first;
}

void vmmrt__slot_pools_stats(vmmrt__workers *w, vmmrt__slot_pool_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < vmmrt__workers_count(w); i++) {
		const vmmrt__slot_pool_stats *s = &((slot_pool *)vmmrt__workers_local(w, i))->stats;
		out->oom_retries += uatomic_read(&s->oom_retries);
		out->pool_hits += uatomic_read(&s->pool_hits);
		out->pool_handles += uatomic_read(&s->pool_handles);
	}
}

/* ------------------------------------------------------------ the requests */

static vmmrt_status map_slot(vmmrt__request *req, vmmrt__worker *wk, bool ensure)
{
	vmmrt_slot *s = req->owner;
	slot_pool *p = vmmrt__worker_local(wk);
	vmmrt__bhandle h;
	if (s->mapped && ensure)
		return VMMRT_OK;
	if (s->mapped)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu is already mapped", (unsigned long long)s->id);
	vmmrt_status st = create_handle(p, s, &h);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: create %zu bytes", (unsigned long long)s->id, s->size);
	st = vmmrt__slot_attach(s, h);
	if (st != VMMRT_OK) {
		vmmrt_status st2 = release_handle(p, s, h);
		(void)st2;
	}
	return st;
}

static vmmrt_status run_map(vmmrt__request *req, vmmrt__worker *wk)
{
	return map_slot(req, wk, false);
}

static vmmrt_status run_ensure(vmmrt__request *req, vmmrt__worker *wk)
{
	return map_slot(req, wk, true);
}

static vmmrt_status run_release(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt_slot *s = req->owner;
	vmmrt__bhandle h;
	vmmrt_status st = vmmrt__slot_detach(s, &h);
	if (st != VMMRT_OK)
		return st;
	return put_back(vmmrt__worker_local(wk), s, h);
}

/* vmmrt_slot_map_pages and vmmrt_slot_map_pages_table: the pages' memory, not
 * a handle of the slot's own. The table is the request's (slot.h): read by
 * the map alone, so freed here once it ran, whatever its outcome; the caller
 * may not touch it while the request is in flight, and sets the next one
 * only before its next bind's push. */
static vmmrt_status run_bind(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt_slot *s = req->owner;
	vmmrt_status st;
	(void)wk;
	if (s->mapped)
		st = vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu is already mapped", (unsigned long long)s->id);
	else if ((st = attach_pages(s)) == VMMRT_OK)
		s->bound = true; /* what unmaps it leaves the bytes to the pages */
	free(s->bind_table);
	s->bind_table = NULL;
	return st;
}

/*
 * A stream-ordered release, once the GPU has passed its event: only if no
 * vmmrt_slot_map_async came since it was asked (the claim of slot.h's
 * `backing`), and then to the driver, whatever the pool.
 */
static vmmrt_status run_arelease(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt__slot_release *r = caa_container_of(req, vmmrt__slot_release, req);
	vmmrt_slot *s = req->owner;
	uint64_t asked = r->gen * VMMRT__SLOT_GENERATION;
	vmmrt__bhandle h;

	if (uatomic_cmpxchg(&s->backing, asked, asked | VMMRT__SLOT_UNBACKED) != asked)
		return VMMRT_OK; /* overtaken by a later map: the memory, and its bytes, stay */
	if (!s->mapped)
		return VMMRT_OK; /* the map that was to back it failed, and said so */
	vmmrt_status st = vmmrt__slot_detach(s, &h);
	if (st != VMMRT_OK) {
		/* Still mapped: undo the claim (unless a map came meanwhile), so a
		 * release asked again in this generation can claim it. */
		uatomic_cmpxchg(&s->backing, asked | VMMRT__SLOT_UNBACKED, asked);
		return st;
	}
	return put_back(vmmrt__worker_local(wk), s, h);
}

/* The stream-ordered requests end here, however they end (run, failed,
 * cancelled, or their event's query failed, which skips settle). */
void vmmrt__slot_async_done(vmmrt__request *req, vmmrt_status st, void *arg)
{
	vmmrt_slot *s = req->owner;
	(void)arg;
	if (st == VMMRT_OK || st == VMMRT_E_CANCELLED) {
		vmmrt__slot_set_state(s, s->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
	} else {
		/* A map that failed leaves the slot without memory: the next
		 * map_async must queue one (set before the failure is seen). */
		if (req->ops == &vmmrt__slot_amap_ops && !s->mapped)
			uatomic_or(&s->backing, VMMRT__SLOT_UNBACKED);
		publish_error(s, st);
	}
	/* A map that ended, however: the streams waiting for it go on (slot.h),
	 * after the failure is published, which vmmrt_slot_wait_stream reads
	 * after the flag. */
	if (req->ops == &vmmrt__slot_amap_ops && s->flag) {
		cmm_smp_wmb();
		uatomic_set(s->flag, uatomic_read(&s->map_seq));
	}
	/* Last, with a barrier: whoever reads queued at 0 then reads this state. */
	(void)uatomic_add_return(&s->queued, -1);
}

static vmmrt_status run_destroy(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt_slot *s = req->owner;
	/* Requests parked for admission or an event must not outlive their slot. */
	vmmrt__worker_cancel_owned(wk, s);
	vmmrt__bhandle h;
	bool had;
	vmmrt_status st, rel = VMMRT_OK;
	/* A refused unmap or VA free leaves the slot whole: try once more here,
	 * where it also helps a destroy whose waiter timed out and left. */
	for (int attempt = 0;; attempt++) {
		st = teardown(s, &h, &had);
		if (had) {
			vmmrt_status st2 = put_back(vmmrt__worker_local(wk), s, h);
			if (rel == VMMRT_OK)
				rel = st2;
		}
		if (st == VMMRT_OK || attempt == 1)
			break;
	}
	if (st == VMMRT_OK)
		st = rel;
	if (st != VMMRT_OK) {
		/* Keep the slot alive and reported: nothing may leak silently. */
		uatomic_set(&s->dying, false);
		publish_error(s, st);
		return st;
	}
	/* The stream waits' flag, events and stream are the caller's to free
	 * (slot.c: vmmrt__slot_destroy), not this worker's: freeing the flag
	 * synchronizes the device, whose streams may wait for a map that only
	 * this worker can make. */
	retire(s);
	return VMMRT_OK;
}

/* A map or release of a slot being destroyed is not made. */
static bool slot_dying(const vmmrt__request *req)
{
	const vmmrt_slot *s = req->owner;
	return uatomic_read(&s->dying);
}

/* A failed map was rolled back, a failed release left the slot mapped. */
static bool map_unchanged(const vmmrt__request *req)
{
	const vmmrt_slot *s = req->owner;
	return !s->mapped;
}

static bool release_unchanged(const vmmrt__request *req)
{
	const vmmrt_slot *s = req->owner;
	return s->mapped;
}

/* The slot's state once its map or release ended: a failure is kept for the
 * next API call on the slot to report. */
static void settle(vmmrt__request *req, vmmrt_status st)
{
	vmmrt_slot *s = req->owner;
	if (st == VMMRT_OK || st == VMMRT_E_CANCELLED)
		vmmrt__slot_set_state(s, s->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
	else
		publish_error(s, st);
}

/* A map or release: withdrawn when its slot dies, settled into the slot's state. */
#define SLOT_REQUEST(name_, run_, unchanged_) \
	{.name = name_, .run = run_, .withdrawn = slot_dying, .unchanged = unchanged_, .settle = settle}

const vmmrt__request_ops vmmrt__slot_map_ops = SLOT_REQUEST("map", run_map, map_unchanged);
const vmmrt__request_ops vmmrt__slot_ensure_ops = SLOT_REQUEST("map", run_ensure, map_unchanged);
const vmmrt__request_ops vmmrt__slot_release_ops = SLOT_REQUEST("release", run_release, release_unchanged);
const vmmrt__request_ops vmmrt__slot_bind_ops = SLOT_REQUEST("bind", run_bind, map_unchanged);

/* A stream-ordered release starts once the map asked before it ended
 * (slot.h): the flag holds the map_seq of the last map that ended, stored
 * by vmmrt__slot_async_done on this worker. No flag: no map was ever asked. */
static bool arelease_ready(const vmmrt__request *req)
{
	const vmmrt__slot_release *r = caa_container_of(req, vmmrt__slot_release, req);
	const vmmrt_slot *s = req->owner;
	return !s->flag || (int32_t)(uatomic_read(s->flag) - r->map_seq) >= 0;
}

/* The stream-ordered ones settle in their done callback, vmmrt__slot_async_done. */
const vmmrt__request_ops vmmrt__slot_amap_ops = {.name = "map", .run = run_ensure, .withdrawn = slot_dying};
const vmmrt__request_ops vmmrt__slot_arelease_ops = {
	.name = "release", .run = run_arelease, .withdrawn = slot_dying, .ready = arelease_ready};

/* Never cancelled: it runs even when its worker stops without draining. */
const vmmrt__request_ops vmmrt__slot_destroy_ops = {
	.name = "destroy",
	.run = run_destroy,
	.uncancellable = true,
};

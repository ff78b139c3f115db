/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The CUDA backend's host functions (cuLaunchHostFunc): the records that
 * carry (fn, arg) to the trampoline, which marks the driver's callback thread
 * as inside a host function while fn runs, and the records of host nodes
 * captured into graphs.
 */
#include "config.h"

#include "backend/cuda-internal.h"

#ifdef VMMRT__CUDA_IMPL

#include <stdlib.h>

#include <urcu/compiler.h>
#include <urcu/lfstack.h>

#include "clock.h"

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

struct hostfn_pool *vmmrt__cuda_hostfn_pool_create(void)
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

void vmmrt__cuda_hostfn_free_list(struct hostfn_rec *r)
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
void vmmrt__cuda_hostfn_pool_destroy(struct hostfn_pool *pool)
{
	struct cds_lfs_node *n;

	if (pool == NULL)
		return;
	for (int ms = 0; __atomic_load_n(&pool->inflight, __ATOMIC_ACQUIRE) != 0; ms++) {
		if (ms >= HOSTFN_CLOSE_WAIT_MS)
			return;
		vmmrt__sleep_ns(1000000);
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

/* Keep a graph host node's record until its capture ends (under b->lock). */
static void capture_recs_add(vmmrt__backend *b, struct hostfn_rec *r)
{
	pthread_mutex_lock(&b->lock);
	r->next = b->capture_recs;
	b->capture_recs = r;
	pthread_mutex_unlock(&b->lock);
}

/* Detach the records of capture sequence id from the pending list. */
struct hostfn_rec *vmmrt__cuda_capture_recs_take(vmmrt__backend *b, cuuint64_t id)
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

void vmmrt__cuda_retire_recs(vmmrt__backend *b, struct hostfn_rec *recs)
{
	struct hostfn_rec *last;

	if (recs == NULL)
		return;
	for (last = recs; last->next != NULL; last = last->next)
		;
	last->next = b->retired_recs;
	b->retired_recs = recs;
}

void vmmrt__cuda_hostfn_records_free(vmmrt__backend *b)
{
	pthread_mutex_lock(&b->lock);
	vmmrt__cuda_hostfn_free_list(b->capture_recs);
	vmmrt__cuda_hostfn_free_list(b->retired_recs);
	b->capture_recs = b->retired_recs = NULL;
	pthread_mutex_unlock(&b->lock);
}

vmmrt_status vmmrt__cuda_launch_host_func(vmmrt__backend *b, vmmrt_stream s, vmmrt__host_fn fn, void *arg)
{
	CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
	cuuint64_t id = 0;
	struct hostfn_rec *r;
	CUresult res;
	int pushed;

	ROLE_CHECK("cuLaunchHostFunc");
	VMMRT__CHECK_ARG(fn != NULL, "NULL host function");
	OP_ENTER(b, "cuLaunchHostFunc", pushed);

	res = vmmrt__cu.StreamGetCaptureInfo(CU_STREAM(s), &cs, &id, NULL, NULL, NULL, NULL);
	if (res != CUDA_SUCCESS) {
		vmmrt__cuda_ctx_leave(pushed);
		return vmmrt__cuda_error(res, "cuStreamGetCaptureInfo(%p)", (void *)s);
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
		vmmrt__cuda_ctx_leave(pushed);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "cuLaunchHostFunc: no memory for a host-function record");
	}
	r->fn = fn;
	r->arg = arg;

	if (r->pool != NULL)
		__atomic_add_fetch(&r->pool->inflight, 1, __ATOMIC_RELAXED);
	res = vmmrt__cu.LaunchHostFunc(CU_STREAM(s), hostfn_trampoline, r);
	vmmrt__cuda_ctx_leave(pushed);
	if (res != CUDA_SUCCESS) {
		if (r->pool != NULL) {
			struct hostfn_pool *pool = r->pool;

			cds_lfs_push(&pool->free, &r->node);
			__atomic_sub_fetch(&pool->inflight, 1, __ATOMIC_RELEASE);
		} else {
			free(r);
		}
		return vmmrt__cuda_error(res, "cuLaunchHostFunc(%p)", (void *)s);
	}
	if (r->pool == NULL)
		capture_recs_add(b, r);
	return VMMRT_OK;
}

#endif /* VMMRT__CUDA_IMPL */

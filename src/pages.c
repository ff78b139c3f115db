/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Physical pages mapped at several fixed addresses (pages.h). Create and
 * destroy are a push to a driver worker and a bounded wait, as the
 * synchronous slot calls are: every cuMemCreate and cuMemRelease stays on
 * the workers. The release does not wait for the slots bound to the pages:
 * the driver frees the memory with the last unmap.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "error.h"
#include "pages.h"

/* The live handles given back; the first failure is returned, the handles it
 * could not release stay listed (counted in live_handles). */
static vmmrt_status release_chunks(vmmrt_pages *p)
{
	vmmrt_status first = VMMRT_OK;
	for (size_t i = 0; i < p->nchunks; i++) {
		if (!p->handles[i])
			continue;
		vmmrt_status st = vmmrt__drv_mem_release(p->rt, p->handles[i]);
		if (st == VMMRT_OK)
			p->handles[i] = 0;
		else if (first == VMMRT_OK)
			first = st;
	}
	return first;
}

static vmmrt_status run_create(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt_pages *p = req->owner;
	(void)wk;
	for (size_t i = 0; i < p->nchunks; i++) {
		vmmrt_status st = vmmrt__drv_mem_create(p->rt, p->chunk, &p->handles[i]);
		if (st != VMMRT_OK) {
			char why[512];
			snprintf(why, sizeof(why), "%s", vmmrt_last_error());
			p->handles[i] = 0;
			(void)release_chunks(p); /* what this create made: none of it is the caller's */
			vmmrt__error_adopt(why);
			return vmmrt__error_wrap(st, "pages %llu: create %zu bytes (chunk %zu of %zu)", (unsigned long long)p->id,
						 p->size, i + 1, p->nchunks);
		}
	}
	p->created = true;
	vmmrt__app_bytes_add(p->rt, (int64_t)p->size);
	return VMMRT_OK;
}

/* Also after a create that timed out: it queues behind it on the same
 * worker, and releases what that create made, if anything. */
static vmmrt_status run_release(vmmrt__request *req, vmmrt__worker *wk)
{
	vmmrt_pages *p = req->owner;
	(void)wk;
	if (!p->created)
		return VMMRT_OK;
	vmmrt_status st = release_chunks(p);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "pages %llu: release", (unsigned long long)p->id);
	p->created = false;
	vmmrt__app_bytes_add(p->rt, -(int64_t)p->size);
	return VMMRT_OK;
}

static const vmmrt__request_ops create_ops = {.name = "pages create", .run = run_create};
/* Never cancelled: it runs even when its worker stops without draining. */
static const vmmrt__request_ops release_ops = {.name = "pages release", .run = run_release, .uncancellable = true};

static void unlink_pages(vmmrt_pages *p)
{
	vmmrt_runtime *rt = p->rt;
	pthread_mutex_lock(&rt->slots_lock);
	cds_list_del(&p->link);
	pthread_mutex_unlock(&rt->slots_lock);
	uatomic_dec(&rt->live_pages);
}

vmmrt_status vmmrt_pages_create(vmmrt_runtime *rt, size_t bytes, vmmrt_pages **out)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	size_t g = rt->granularity;
	if (bytes == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: pages of 0 bytes", __func__);
	if (bytes > SIZE_MAX - (g - 1))
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: %zu bytes overflow when rounded to the granularity %zu",
				    __func__, bytes, g);
	vmmrt_pages *p = calloc(1, sizeof(*p));
	if (!p)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: %zu bytes", __func__, sizeof(*p));
	p->rt = rt;
	p->size = (bytes + g - 1) / g * g;
	p->chunk = g;
	p->nchunks = p->size / g;
	p->handles = calloc(p->nchunks, sizeof(*p->handles));
	if (!p->handles) {
		free(p);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: %zu handles", __func__, (bytes + g - 1) / g);
	}
	p->id = uatomic_add_return(&rt->next_pages_id, 1);
	p->worker = vmmrt__workers_route(rt->workers, p->id);
	vmmrt__request_init(&p->create_req, &create_ops, p);
	vmmrt__request_init(&p->release_req, &release_ops, p);
	/* Listed before the push: a create that times out is the runtime's to finish. */
	pthread_mutex_lock(&rt->slots_lock);
	cds_list_add(&p->link, &rt->pages);
	pthread_mutex_unlock(&rt->slots_lock);
	uatomic_inc(&rt->live_pages);

	vmmrt_status st = vmmrt__worker_push(rt->workers, p->worker, &p->create_req);
	if (st == VMMRT_OK)
		st = vmmrt__request_wait(&p->create_req, rt->timeout_ms);
	if (st == VMMRT_E_TIMEOUT) {
		/* It may still create: a release queued behind it gives that back. */
		if (vmmrt__worker_push(rt->workers, p->worker, &p->release_req) == VMMRT_OK)
			p->abandoned = true;
		return vmmrt__error_wrap(st, "%s: %zu bytes: the driver worker did not answer (the runtime's destroy "
					 "releases what it makes)", __func__, p->size);
	}
	if (st != VMMRT_OK) {
		unlink_pages(p);
		free(p->handles);
		free(p);
		return st;
	}
	*out = p;
	return VMMRT_OK;
}

static vmmrt_status destroy_pages(vmmrt_pages *p)
{
	vmmrt_runtime *rt = p->rt;
	if (p->abandoned)
		return vmmrt__error(VMMRT_E_BUSY, "pages %llu: an earlier destroy's wait timed out; the runtime's "
				    "destroy finishes it", (unsigned long long)p->id);
	vmmrt_status st = vmmrt__worker_push(rt->workers, p->worker, &p->release_req);
	if (st != VMMRT_OK)
		return st;
	st = vmmrt__request_wait(&p->release_req, rt->timeout_ms);
	if (st == VMMRT_E_TIMEOUT) {
		p->abandoned = true;
		return vmmrt__error_wrap(st, "pages %llu: release", (unsigned long long)p->id);
	}
	if (st != VMMRT_OK)
		return st; /* still live: the caller may destroy it again */
	unlink_pages(p);
	free(p->handles);
	free(p);
	return VMMRT_OK;
}

vmmrt_status vmmrt_pages_destroy(vmmrt_pages *p)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(p, "pages is NULL");
	return destroy_pages(p);
}

size_t vmmrt_pages_size(const vmmrt_pages *p)
{
	return p ? p->size : 0;
}

void vmmrt__pages_destroy_leftover(vmmrt_runtime *rt)
{
	for (;;) {
		/* One at a time: a destroy unlinks its pages, under the lock. */
		vmmrt_pages *p = NULL, *it;
		pthread_mutex_lock(&rt->slots_lock);
		cds_list_for_each_entry(it, &rt->pages, link)
			if (!it->abandoned) {
				p = it;
				break;
			}
		pthread_mutex_unlock(&rt->slots_lock);
		if (!p)
			break;
		if (destroy_pages(p) != VMMRT_OK)
			p->abandoned = true; /* its release failed: counted in live_handles, freed at the end */
	}
}

void vmmrt__pages_free_leftover(vmmrt_runtime *rt)
{
	vmmrt_pages *p, *next;
	/* The workers are gone: no request of these runs any more. */
	cds_list_for_each_entry_safe(p, next, &rt->pages, link) {
		cds_list_del(&p->link);
		uatomic_dec(&rt->live_pages);
		free(p->handles);
		free(p);
	}
}

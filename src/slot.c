/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slots. The reservation is made on the caller's thread (it is not
 * one of the slow, contended VMM calls); everything that maps or unmaps
 * physical memory runs on the slot's driver worker (slot-work.c), which is
 * why the public map/unmap/destroy are a push followed by a bounded wait.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "error.h"
#include "slot.h"

vmmrt_status vmmrt__slot_reserve(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out)
{
	size_t g = rt->granularity;

	if (bytes == 0)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "slot of 0 bytes");
	if (bytes > SIZE_MAX - (g - 1))
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "slot of %zu bytes overflows when rounded to %zu", bytes, g);
	size_t size = (bytes + g - 1) / g * g;

	vmmrt_slot *s = calloc(1, sizeof(*s));
	if (!s)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "slot: %zu bytes", sizeof(*s));
	vmmrt_status st = vmmrt__drv_va_reserve(rt, size, &s->va);
	if (st != VMMRT_OK) {
		free(s);
		return vmmrt__error_wrap(st, "slot of %zu bytes: reserve", size);
	}
	s->rt = rt;
	s->size = size;
	s->id = uatomic_add_return(&rt->next_slot_id, 1);
	s->worker = vmmrt__workers_route(rt->workers, s->id);
	vmmrt__request_init(&s->map_req, &vmmrt__slot_map_ops, s);
	vmmrt__request_init(&s->release_req, &vmmrt__slot_release_ops, s);
	vmmrt__slot_set_state(s, VMMRT_SLOT_RESERVED);

	pthread_mutex_lock(&rt->slots_lock);
	cds_list_add_rcu(&s->link, &rt->slots);
	pthread_mutex_unlock(&rt->slots_lock);
	uatomic_inc(&rt->live_slots);
	*out = s;
	return VMMRT_OK;
}

static vmmrt_status push(vmmrt_slot *s, vmmrt__request *req, vmmrt__req_done_fn done, void *arg)
{
	req->done = done;
	req->done_arg = arg;
	return vmmrt__worker_push(s->rt->workers, s->worker, req);
}

/* PENDING is set before the push: the worker may finish (and set the new
 * state) before the push even returns. */
static vmmrt_status push_pending(vmmrt_slot *s, vmmrt__request *req, vmmrt__req_done_fn done, void *arg)
{
	int32_t old = uatomic_xchg(&s->state, VMMRT_SLOT_PENDING);
	vmmrt_status st = push(s, req, done, arg);
	if (st != VMMRT_OK)
		uatomic_cmpxchg(&s->state, VMMRT_SLOT_PENDING, old);
	return st;
}

vmmrt_status vmmrt__slot_map_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg)
{
	return push_pending(s, &s->map_req, done, arg);
}

vmmrt_status vmmrt__slot_release_async(vmmrt_slot *s, vmmrt__req_done_fn done, void *arg)
{
	return push_pending(s, &s->release_req, done, arg);
}

/* ------------------------------------------------------------- public API */

vmmrt_status vmmrt_slot_create(vmmrt_runtime *rt, size_t bytes, vmmrt_slot **out)
{
	VMMRT__API_ENTER();
	VMMRT_CHECK_ARG(rt, "runtime is NULL");
	VMMRT_CHECK_ARG(out, "out is NULL");
	vmmrt_status st = vmmrt__slot_reserve(rt, bytes, out);
	if (st == VMMRT_OK)
		(*out)->app = true; /* before its first request: its worker reads it */
	return st;
}

/* A failure published by an earlier asynchronous request is reported first. */
static vmmrt_status pending_error(vmmrt_slot *s)
{
	int32_t e = uatomic_xchg(&s->error, VMMRT_OK);
	if (e != VMMRT_OK) {
		vmmrt__slot_set_state(s, s->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
		return vmmrt__error((vmmrt_status)e, "slot %llu: an earlier asynchronous request failed: %s",
				   (unsigned long long)s->id, s->errmsg);
	}
	return VMMRT_OK;
}

/* A synchronous call reports its request's failure itself: not again later. */
static vmmrt_status settle(vmmrt_slot *s, vmmrt_status st)
{
	if (st != VMMRT_OK && st != VMMRT_E_TIMEOUT && uatomic_xchg(&s->error, VMMRT_OK) != VMMRT_OK)
		vmmrt__slot_set_state(s, s->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
	return st;
}

vmmrt_status vmmrt__slot_map(vmmrt_slot *s)
{
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	switch ((vmmrt_slot_state)uatomic_read(&s->state)) {
	case VMMRT_SLOT_MAPPED:
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu is already mapped", (unsigned long long)s->id);
	case VMMRT_SLOT_PENDING:
		return vmmrt__error(VMMRT_E_BUSY, "slot %llu has a request in flight", (unsigned long long)s->id);
	default:
		break;
	}
	st = vmmrt__slot_map_async(s, NULL, NULL);
	if (st != VMMRT_OK)
		return st;
	return settle(s, vmmrt__request_wait(&s->map_req, s->rt->timeout_ms));
}

vmmrt_status vmmrt_slot_unmap(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT_CHECK_ARG(s, "slot is NULL");
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	switch ((vmmrt_slot_state)uatomic_read(&s->state)) {
	case VMMRT_SLOT_RESERVED:
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu is not mapped", (unsigned long long)s->id);
	case VMMRT_SLOT_PENDING:
		return vmmrt__error(VMMRT_E_BUSY, "slot %llu has a request in flight", (unsigned long long)s->id);
	default:
		break;
	}
	st = vmmrt__slot_release_async(s, NULL, NULL);
	if (st != VMMRT_OK)
		return st;
	return settle(s, vmmrt__request_wait(&s->release_req, s->rt->timeout_ms));
}

vmmrt_status vmmrt__slot_destroy(vmmrt_slot *s)
{
	/*
	 * The DESTROY request is not part of the slot: the worker frees the
	 * slot, and must be free to do so the moment it is done. It queues
	 * behind this slot's earlier requests on the same worker, which are
	 * cancelled (dying is set) before the teardown. If the wait times out
	 * the request is abandoned to the worker, which frees it.
	 */
	vmmrt__request *req = malloc(sizeof(*req));
	if (!req)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "slot destroy request");
	vmmrt__request_init(req, &vmmrt__slot_destroy_ops, s);
	uatomic_set(&s->dying, true);
	/* Once pushed, the slot may be freed at any moment: read what we need first. */
	uint64_t timeout_ms = s->rt->timeout_ms;
	vmmrt_status st = vmmrt__worker_push(s->rt->workers, s->worker, req);
	if (st != VMMRT_OK) {
		uatomic_set(&s->dying, false);
		free(req);
		return st;
	}
	return vmmrt__request_wait_owned(req, timeout_ms);
}

/* The public calls: their prologue, then what the library's own code calls
 * directly (a prologue clears the message a caller inside may still return). */
vmmrt_status vmmrt_slot_map(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT_CHECK_ARG(s, "slot is NULL");
	return vmmrt__slot_map(s);
}

vmmrt_status vmmrt_slot_destroy(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT_CHECK_ARG(s, "slot is NULL");
	return vmmrt__slot_destroy(s);
}

vmmrt_devptr vmmrt_slot_address(const vmmrt_slot *s)
{
	return s ? s->va : 0;
}

size_t vmmrt_slot_size(const vmmrt_slot *s)
{
	return s ? s->size : 0;
}

vmmrt_slot_state vmmrt_slot_get_state(const vmmrt_slot *s)
{
	return s ? (vmmrt_slot_state)uatomic_read(&s->state) : VMMRT_SLOT_FAILED;
}

vmmrt_status vmmrt_slot_error(vmmrt_slot *s)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT_CHECK_ARG(s, "slot is NULL");
	return pending_error(s);
}

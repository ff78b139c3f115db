/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Fixed-VA slots. The reservation is made on the caller's thread (it is not
 * one of the slow, contended VMM calls); everything that maps or unmaps
 * physical memory runs on the slot's driver worker (slot-work.c), which is
 * why the public map/unmap/destroy are a push followed by a bounded wait.
 * The stream-ordered calls (map_async, release_after) are a push alone: the
 * launch thread that makes them never waits for the GPU (slot.h says how a
 * release overtaken by a later map is told apart).
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "api.h"
#include "error.h"
#include "pages.h"
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
	s->size = s->reserved = size;
	s->id = uatomic_add_return(&rt->next_slot_id, 1);
	s->worker = vmmrt__workers_route(rt->workers, s->id);
	vmmrt__request_init(&s->map_req, &vmmrt__slot_map_ops, s);
	vmmrt__request_init(&s->release_req, &vmmrt__slot_release_ops, s);
	vmmrt__request_init(&s->bind_req, &vmmrt__slot_bind_ops, s);
	vmmrt__request_init(&s->amap_req, &vmmrt__slot_amap_ops, s);
	s->amap_req.done = vmmrt__slot_async_done;
	s->backing = VMMRT__SLOT_UNBACKED;
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
	VMMRT__CHECK_ARG(rt, "runtime is NULL");
	VMMRT__CHECK_ARG(out, "out is NULL");
	vmmrt_status st = vmmrt__slot_reserve(rt, bytes, out);
	if (st == VMMRT_OK)
		(*out)->app = true; /* before its first request: its worker reads it */
	return st;
}

/* After a failure is reported: what the caller may ask next follows what
 * the worker left (a failed map left nothing mapped, a failed release the
 * memory where it was). */
static void resync(vmmrt_slot *s)
{
	vmmrt__slot_set_state(s, s->mapped ? VMMRT_SLOT_MAPPED : VMMRT_SLOT_RESERVED);
	s->wanted = s->mapped;
}

/* A failure published by an earlier asynchronous request is reported first. */
static vmmrt_status pending_error(vmmrt_slot *s)
{
	int32_t e = uatomic_xchg(&s->error, VMMRT_OK);
	if (e != VMMRT_OK) {
		resync(s);
		return vmmrt__error((vmmrt_status)e, "slot %llu: an earlier asynchronous request failed: %s",
				   (unsigned long long)s->id, s->errmsg);
	}
	return VMMRT_OK;
}

/* A synchronous call reports its request's failure itself: not again later. */
static vmmrt_status settle(vmmrt_slot *s, vmmrt_status st)
{
	if (st != VMMRT_OK && st != VMMRT_E_TIMEOUT && uatomic_xchg(&s->error, VMMRT_OK) != VMMRT_OK)
		resync(s);
	return st;
}

/* The next map generation, UNBACKED cleared: releases asked before it are
 * no-ops from now on (slot.h). Returns the word it replaced. */
static uint64_t next_generation(vmmrt_slot *s)
{
	for (uint64_t old = uatomic_read(&s->backing);;) {
		uint64_t seen = uatomic_cmpxchg(&s->backing, old, (old & ~VMMRT__SLOT_UNBACKED) + VMMRT__SLOT_GENERATION);
		if (seen == old)
			return old;
		old = seen;
	}
}

vmmrt_status vmmrt__slot_map(vmmrt_slot *s)
{
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	switch (vmmrt_slot_get_state(s)) {
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
	st = settle(s, vmmrt__request_wait(&s->map_req, s->rt->timeout_ms));
	if (st == VMMRT_OK) {
		/* Nothing else is queued (PENDING is refused above): mapped now. */
		(void)next_generation(s);
		s->wanted = true;
	}
	return st;
}

vmmrt_status vmmrt_slot_unmap(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	switch (vmmrt_slot_get_state(s)) {
	case VMMRT_SLOT_RESERVED:
		return vmmrt__error(VMMRT_E_INVALID_STATE, "slot %llu is not mapped", (unsigned long long)s->id);
	case VMMRT_SLOT_PENDING:
		return vmmrt__error(VMMRT_E_BUSY, "slot %llu has a request in flight", (unsigned long long)s->id);
	default:
		break;
	}
	/* Unbacked from now on, as far as a later map_async is concerned; set
	 * back only when the unmap failed and left the memory (a timed-out one
	 * may still unmap: it stays set, which costs at most an extra map). */
	uint64_t before = uatomic_read(&s->backing);
	uatomic_or(&s->backing, VMMRT__SLOT_UNBACKED);
	s->wanted = false;
	st = vmmrt__slot_release_async(s, NULL, NULL);
	if (st == VMMRT_OK)
		st = settle(s, vmmrt__request_wait(&s->release_req, s->rt->timeout_ms));
	if (st != VMMRT_OK && st != VMMRT_E_TIMEOUT && s->mapped) {
		uatomic_set(&s->backing, before);
		s->wanted = true;
	}
	return st;
}

/* What the stream-ordered calls made for a slot, on its caller's thread:
 * the stream waits' flag, the events behind those waits, the stream and
 * event its maps follow, the ring of releases. */
typedef struct stream_state {
	uint32_t *flag;
	bool keep_flag;
	vmmrt__bevent *waited[VMMRT__SLOT_WAITS];
	vmmrt_stream order_stream;
	vmmrt__bevent *order_event;
	vmmrt__slot_release *releases;
} stream_state;

static stream_state stream_state_of(const vmmrt_slot *s)
{
	stream_state k = {s->flag, s->keep_flag, {0}, s->order_stream, s->order_event, s->releases};
	memcpy(k.waited, s->waited, sizeof(k.waited));
	return k;
}

/*
 * Freed once the slot's destroy ran (its map and releases were cancelled
 * or ended, the flag published), on the caller's thread, never on the
 * driver worker: freeing the flag (cuMemFreeHost) synchronizes the whole
 * device, and a stream anywhere may be waiting for a map that only that
 * worker can make, which would then wait for ever (a deadlock, fault-free,
 * found by vmmrt-torture on the host backend, whose pinned free now
 * synchronizes as the GPU's does). The streams that waited on the flag read
 * it until they pass their wait: their events are synchronized first.
 */
static void free_stream_state(vmmrt_runtime *rt, stream_state *k)
{
	for (unsigned i = 0; i < VMMRT__SLOT_WAITS; i++)
		if (k->waited[i]) {
			(void)vmmrt__drv_event_synchronize(rt, k->waited[i]);
			(void)vmmrt__drv_event_destroy(rt, k->waited[i]);
		}
	if (k->flag && !k->keep_flag)
		(void)vmmrt__drv_host_free(rt, k->flag);
	if (k->order_event)
		(void)vmmrt__drv_event_destroy(rt, k->order_event);
	if (k->order_stream)
		(void)vmmrt__drv_stream_destroy(rt, k->order_stream);
	if (!k->releases)
		return;
	for (unsigned i = 0; i < VMMRT__SLOT_RELEASES; i++)
		if (k->releases[i].event)
			(void)vmmrt__drv_event_destroy(rt, k->releases[i].event);
	free(k->releases);
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
	vmmrt_runtime *rt = s->rt;
	uint64_t timeout_ms = rt->timeout_ms;
	stream_state kept = stream_state_of(s);
	vmmrt_status st = vmmrt__worker_push(rt->workers, s->worker, req);
	if (st != VMMRT_OK) {
		uatomic_set(&s->dying, false);
		free(req);
		return st;
	}
	/* A failed destroy keeps the slot, and all of it; one that timed out
	 * may yet free the slot: what it kept is left to the runtime's end
	 * (the backend's close frees pinned memory, events and streams). */
	if ((st = vmmrt__request_wait_owned(req, timeout_ms)) == VMMRT_OK)
		free_stream_state(rt, &kept);
	return st;
}

/* The public calls: their prologue, then what the library's own code calls
 * directly (a prologue clears the message a caller inside may still return). */
vmmrt_status vmmrt_slot_map(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	return vmmrt__slot_map(s);
}

vmmrt_status vmmrt_slot_destroy(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	return vmmrt__slot_destroy(s);
}

/* ------------------------------------------------- stream-ordered backing */

/* What the stream-ordered calls check first. */
static vmmrt_status async_entry(vmmrt_slot *s)
{
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	/* Only the synchronous calls store PENDING: one whose wait timed out
	 * still has its request on the worker. */
	if (uatomic_read(&s->state) == VMMRT_SLOT_PENDING)
		return vmmrt__error(VMMRT_E_BUSY, "slot %llu has a vmmrt_slot_map or vmmrt_slot_unmap in flight (its wait "
				    "timed out)", (unsigned long long)s->id);
	return VMMRT_OK;
}

/*
 * One of the slot's stream-ordered requests still queued or running: wait
 * for it, bounded by the timeout option. The caller's thread blocks on the
 * GPU or the worker, so the wait counts as a blocking call of the launch
 * thread. Its own failure, if any, is the slot's pending error.
 */
static vmmrt_status wait_in_flight(vmmrt_slot *s, vmmrt__request *req, const char *what)
{
	if (vmmrt__request_poll(req, NULL))
		return VMMRT_OK;
	uatomic_inc(&s->rt->launch_blocking);
	vmmrt_status st = vmmrt__request_wait(req, s->rt->timeout_ms);
	if (st == VMMRT_E_TIMEOUT)
		return vmmrt__error_wrap(st, "slot %llu: %s", (unsigned long long)s->id, what);
	vmmrt__error_clear(); /* its failure is reported through the slot's error */
	return VMMRT_OK;
}

/* Queue a stream-ordered request: the slot reads PENDING until it ends
 * (vmmrt__slot_async_done), counted before the worker can see it. */
static vmmrt_status push_async(vmmrt_slot *s, vmmrt__request *req)
{
	uatomic_inc(&s->queued);
	vmmrt_status st = vmmrt__worker_push(s->rt->workers, s->worker, req);
	if (st != VMMRT_OK)
		(void)uatomic_add_return(&s->queued, -1);
	return st;
}

/* The stream waits' flag, before the first stream-ordered map is pushed
 * (slot.h): a stream may wait for any map pushed from then on. */
static vmmrt_status make_flag(vmmrt_slot *s)
{
	vmmrt_runtime *rt = s->rt;
	uint32_t *flag;
	vmmrt_status st = vmmrt__drv_host_alloc(rt, 64, (void **)&flag);
	if (st != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: the stream waits' flag", (unsigned long long)s->id);
	if ((st = vmmrt__drv_host_devptr(rt, flag, &s->flag_dev)) != VMMRT_OK) {
		(void)vmmrt__drv_host_free(rt, flag);
		return vmmrt__error_wrap(st, "slot %llu: the stream waits' flag", (unsigned long long)s->id);
	}
	*flag = uatomic_read(&s->map_seq);
	s->flag = flag; /* the worker reads it only in a map's done, pushed after */
	return VMMRT_OK;
}

/* Only the application's slots: the library's own (remap's groups) have
 * their maps and releases planned by the strategy, and no stream waits'
 * flag of their own. */
static vmmrt_status app_slot(const vmmrt_slot *s, const char *func)
{
	if (!s->app)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: slot %llu belongs to the library (an offload group's); "
				    "only a slot made by vmmrt_slot_create can be mapped stream-ordered", func,
				    (unsigned long long)s->id);
	return VMMRT_OK;
}

/* The map to push follows `event` as recorded now (cuStreamWaitEvent's
 * rule), not as the worker would find it when it polls: the application
 * may record it again or destroy it at once. A stream of the slot's own
 * (made on first use), not one shared, so that no slot's map waits for
 * another's event. */
static vmmrt_status follow(vmmrt_slot *s, vmmrt__bevent *event)
{
	vmmrt_runtime *rt = s->rt;
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st;
	if (!s->order_stream && (st = vmmrt__drv_stream_create(rt, &s->order_stream)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: the stream its maps follow their events on", id);
	if (!s->order_event && (st = vmmrt__drv_event_create(rt, false, &s->order_event)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: the event its map waits for", id);
	if ((st = vmmrt__drv_stream_wait_event(rt, s->order_stream, event)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: following the event (is it an event of this device?)", id);
	if ((st = vmmrt__drv_event_record(rt, s->order_event, s->order_stream)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "slot %llu: recording the event its map waits for", id);
	s->amap_req.after = s->order_event;
	return VMMRT_OK;
}

/* vmmrt_slot_map_async (after NULL) and vmmrt_slot_map_after. */
static vmmrt_status map_stream_ordered(vmmrt_slot *s, vmmrt__bevent *after)
{
	vmmrt_status st = async_entry(s);
	if (st != VMMRT_OK)
		return st;
	if (!s->flag && (st = make_flag(s)) != VMMRT_OK)
		return st;
	/* UNBACKED while its map still runs: that map failed and is ending.
	 * Wait for it and report it before this call cancels anything. */
	if ((uatomic_read(&s->backing) & VMMRT__SLOT_UNBACKED) && !vmmrt__request_poll(&s->amap_req, NULL) &&
	    ((st = wait_in_flight(s, &s->amap_req, "its failed map did not end")) != VMMRT_OK ||
	     (st = pending_error(s)) != VMMRT_OK))
		return st;
	/* From here on, the releases asked before are no-ops (slot.h). */
	uint64_t old = next_generation(s);
	if (old & VMMRT__SLOT_UNBACKED) {
		/* Idle, unless a map failed since the check above. */
		st = wait_in_flight(s, &s->amap_req, "its failed map did not end");
		if (st == VMMRT_OK) { /* the last map ended: the request, its event are free */
			s->amap_req.after = NULL;
			if (after)
				st = follow(s, after);
		}
		if (st == VMMRT_OK) {
			uatomic_set(&s->map_seq, s->map_seq + 1);
			if ((st = push_async(s, &s->amap_req)) != VMMRT_OK)
				uatomic_set(&s->map_seq, s->map_seq - 1); /* nothing will publish it */
		}
		if (st != VMMRT_OK) {
			uatomic_or(&s->backing, VMMRT__SLOT_UNBACKED); /* nothing queued to back it */
			return st;
		}
	}
	/* Else mapped, or the map that backs it is queued (as it was asked):
	 * nothing to add. */
	s->wanted = true;
	return VMMRT_OK;
}

vmmrt_status vmmrt_slot_map_async(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	return map_stream_ordered(s, NULL);
}

vmmrt_status vmmrt_slot_map_after(vmmrt_slot *s, vmmrt_event *event)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	VMMRT__CHECK_ARG(event, "event is NULL (record one on the stream the map is to follow)");
	vmmrt_status st = app_slot(s, __func__);
	if (st != VMMRT_OK)
		return st;
	return map_stream_ordered(s, (vmmrt__bevent *)event);
}

vmmrt_status vmmrt_slot_wait_stream(vmmrt_slot *s, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	vmmrt_runtime *rt = s->rt;
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st = app_slot(s, __func__);
	if (st != VMMRT_OK)
		return st;
	/* The flag first, then the failure: a map publishes its failure before
	 * its flag, so a map seen ended here has reported how. */
	uint32_t seq = s->map_seq;
	bool ended = !s->flag || (int32_t)(uatomic_read(s->flag) - seq) >= 0;
	cmm_smp_rmb();
	if ((st = async_entry(s)) != VMMRT_OK)
		return st;
	if (!s->wanted)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu is neither mapped nor has a map queued (never "
				    "mapped, or released since its last map): the stream would wait for nothing and "
				    "then use memory that is not there", __func__, id);
	/* As a release's event would: a wait captured into a graph would wait
	 * at every replay for a map of this moment, or for none. */
	bool capturing = false;
	if ((st = vmmrt__drv_stream_is_capturing(rt, stream, &capturing)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: asking whether the stream is capturing", __func__, id);
	if (capturing)
		return vmmrt__error(VMMRT_E_CAPTURE, "%s: slot %llu: the stream is capturing a graph (map the slot "
				    "and vmmrt_slot_wait for it before the capture)", __func__, id);
	if (ended)
		return VMMRT_OK; /* mapped already: nothing for the GPU to wait for */
	vmmrt__bevent **passed = &s->waited[s->next_wait % VMMRT__SLOT_WAITS];
	bool done = true;
	if (!*passed && (st = vmmrt__drv_event_create(rt, false, passed)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: the event behind the stream's wait", __func__, id);
	/* The ring's oldest, written over: if its stream has not passed that
	 * wait yet, the destroy cannot know when it will, and leaves the flag
	 * to the backend's close. */
	if (vmmrt__drv_event_query(rt, *passed, &done) != VMMRT_OK || !done)
		s->keep_flag = true;
	if ((st = vmmrt__drv_stream_wait_value32(rt, stream, s->flag_dev, seq)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: the stream's wait for the map", __func__, id);
	/* Behind the wait, so that the slot's destroy knows when the stream no
	 * longer reads the flag. */
	if ((st = vmmrt__drv_event_record(rt, *passed, stream)) != VMMRT_OK) {
		s->keep_flag = true;
		return vmmrt__error_wrap(st, "%s: slot %llu: recording the event behind the stream's wait (enqueued)",
					 __func__, id);
	}
	s->next_wait++;
	return VMMRT_OK;
}

vmmrt_status vmmrt_slot_wait(vmmrt_slot *s)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	/* One map request per slot, and a later map_async queues only after the
	 * earlier one ended: waiting for it is waiting for all so far. */
	vmmrt_status st = wait_in_flight(s, &s->amap_req, "its map did not end");
	return st != VMMRT_OK ? st : pending_error(s);
}

static vmmrt_status make_releases(vmmrt_slot *s)
{
	vmmrt__slot_release *r = calloc(VMMRT__SLOT_RELEASES, sizeof(*r));
	if (!r)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "slot %llu: %u release records",
				    (unsigned long long)s->id, VMMRT__SLOT_RELEASES);
	for (unsigned i = 0; i < VMMRT__SLOT_RELEASES; i++) {
		vmmrt__request_init(&r[i].req, &vmmrt__slot_arelease_ops, s);
		r[i].req.done = vmmrt__slot_async_done;
	}
	s->releases = r; /* its requests reach the worker only when pushed, after this */
	return VMMRT_OK;
}

vmmrt_status vmmrt_slot_release_after(vmmrt_slot *s, vmmrt_stream stream)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	vmmrt_runtime *rt = s->rt;
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st = async_entry(s);
	if (st != VMMRT_OK)
		return st;
	/* Its memory is the pages', shared with other slots: a release would
	 * have to give back what is not the slot's. Unbinding goes through
	 * vmmrt_slot_unmap, synchronous as the bind was. */
	if (s->bound)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu is mapped onto pages (vmmrt_slot_map_pages): "
				    "vmmrt_slot_unmap unbinds it", __func__, id);
	if (!s->wanted)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu is neither mapped nor has a map queued (never "
				    "mapped, or released since its last map): nothing to release", __func__, id);
	/*
	 * The release waits for an event recorded on the stream; recorded into
	 * a graph being captured, it would never happen on the stream, the
	 * event would read as complete, and the memory would go before the work
	 * that uses it has run.
	 */
	bool capturing = false;
	if ((st = vmmrt__drv_stream_is_capturing(rt, stream, &capturing)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: asking whether the stream is capturing", __func__, id);
	if (capturing)
		return vmmrt__error(VMMRT_E_CAPTURE, "%s: slot %llu: the stream is capturing a graph", __func__, id);
	if (!s->releases && (st = make_releases(s)) != VMMRT_OK)
		return st;
	vmmrt__slot_release *r = &s->releases[s->next_release % VMMRT__SLOT_RELEASES];
	if ((st = wait_in_flight(s, &r->req, "the oldest of its releases still waits for its stream")) != VMMRT_OK ||
	    (st = pending_error(s)) != VMMRT_OK)
		return st;
	if (!r->event && (st = vmmrt__drv_event_create(rt, false, &r->event)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: the release's event", __func__, id);
	if ((st = vmmrt__drv_event_record(rt, r->event, stream)) != VMMRT_OK)
		return vmmrt__error_wrap(st, "%s: slot %llu: recording the release's event", __func__, id);
	r->gen = uatomic_read(&s->backing) / VMMRT__SLOT_GENERATION;
	r->map_seq = s->map_seq; /* after the map asked last, whatever its event (slot.h) */
	r->req.after = r->event;
	if ((st = push_async(s, &r->req)) != VMMRT_OK)
		return st;
	s->next_release++;
	s->wanted = false;
	return VMMRT_OK;
}

vmmrt_devptr vmmrt_slot_address(const vmmrt_slot *s)
{
	return s ? s->va : 0;
}

size_t vmmrt_slot_size(const vmmrt_slot *s)
{
	return s ? s->size : 0;
}

/* PENDING while a stream-ordered request is queued or running; a failure
 * waiting to be reported comes first. The count is read before the state,
 * which its last decrement follows: at 0, the state read is the latest. */
vmmrt_slot_state vmmrt_slot_get_state(const vmmrt_slot *s)
{
	if (!s)
		return VMMRT_SLOT_FAILED;
	int32_t queued = uatomic_read(&s->queued);
	cmm_smp_rmb();
	vmmrt_slot_state st = (vmmrt_slot_state)uatomic_read(&s->state);
	return queued > 0 && st != VMMRT_SLOT_FAILED ? VMMRT_SLOT_PENDING : st;
}

vmmrt_status vmmrt_slot_error(vmmrt_slot *s)
{
	VMMRT__API_ENTER_ANYWHERE();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	return pending_error(s);
}

/*
 * A slot reserved larger than it turns out to need (an allocator lent its
 * whole range before anyone knew how much of it would be used) maps only
 * its first bytes from now on. Only with nothing mapped and no request in
 * flight (RESERVED): the worker reads size when it maps, unmaps and counts,
 * and nothing mapped may outlive the size it was mapped with. The
 * reservation stays whole until the destroy.
 */
vmmrt_status vmmrt_slot_truncate(vmmrt_slot *s, size_t bytes)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st = app_slot(s, __func__);
	if (st == VMMRT_OK)
		st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	if (vmmrt_slot_get_state(s) != VMMRT_SLOT_RESERVED)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu is mapped or has a request in flight: only a "
				    "slot with nothing mapped can be truncated", __func__, id);
	if (bytes == 0 || bytes > s->size)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: slot %llu: %zu bytes (from 1 to its %zu)", __func__, id,
				    bytes, s->size);
	size_t g = s->rt->granularity;
	s->size = (bytes + g - 1) / g * g;
	return VMMRT_OK;
}

/* --------------------------------------------------------- bound to pages */

/* What both binds refuse first: a slot of the library's own, pages of
 * another runtime. */
static vmmrt_status bind_args(vmmrt_slot *s, const vmmrt_pages *p, const char *func)
{
	vmmrt_status st = app_slot(s, func);
	if (st != VMMRT_OK)
		return st;
	if (p->rt != s->rt)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: slot %llu and pages %llu belong to different runtimes",
				    func, (unsigned long long)s->id, (unsigned long long)p->id);
	return VMMRT_OK;
}

/*
 * Both binds, once their arguments are checked: the slot's own state, then
 * the request. offsets (count of them), when not NULL, is the caller's table,
 * copied only here, after every refusal, so that a refused call has nothing
 * to free; the copy is the bind request's from its push on (slot.h), freed
 * here only when the push itself failed.
 */
static vmmrt_status bind(vmmrt_slot *s, vmmrt_pages *p, size_t offset, const size_t *offsets, size_t count,
			 const char *func)
{
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st = pending_error(s);
	if (st != VMMRT_OK)
		return st;
	switch (vmmrt_slot_get_state(s)) {
	case VMMRT_SLOT_MAPPED:
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu is already mapped (vmmrt_slot_unmap it first)",
				    func, id);
	case VMMRT_SLOT_PENDING:
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: slot %llu has a map or release queued (vmmrt_slot_wait "
				    "for its maps; a release waits for its stream)", func, id);
	default:
		break;
	}
	size_t *table = NULL;
	if (offsets) {
		if (!(table = calloc(count, sizeof(*table))))
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: slot %llu: a table of %zu offsets", func, id,
					    count);
		memcpy(table, offsets, count * sizeof(*table));
	}
	s->bind_pages = p;
	s->bind_offset = offset;
	s->bind_table = table;
	if ((st = push_pending(s, &s->bind_req, NULL, NULL)) != VMMRT_OK) {
		s->bind_table = NULL; /* never reached the worker: still ours */
		free(table);
		return st;
	}
	st = settle(s, vmmrt__request_wait(&s->bind_req, s->rt->timeout_ms));
	if (st == VMMRT_OK) {
		/* Mapped, as after vmmrt_slot_map: a map_async finds it so. */
		(void)next_generation(s);
		s->wanted = true;
	}
	return st;
}

vmmrt_status vmmrt_slot_map_pages(vmmrt_slot *s, vmmrt_pages *p, size_t offset)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	VMMRT__CHECK_ARG(p, "pages is NULL");
	unsigned long long id = (unsigned long long)s->id;
	vmmrt_status st = bind_args(s, p, __func__);
	if (st != VMMRT_OK)
		return st;
	if (offset % s->rt->granularity)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: slot %llu: offset %zu is not a multiple of the "
				    "granularity %zu", __func__, id, offset, s->rt->granularity);
	if (offset > p->size || s->size > p->size - offset)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: slot %llu: its %zu bytes at offset %zu go past the end of "
				    "pages %llu (%zu bytes)", __func__, id, s->size, offset, (unsigned long long)p->id,
				    p->size);
	return bind(s, p, offset, NULL, 0, __func__);
}

/*
 * Granule by granule: the graphs' pool (a slot whose addresses PyTorch's
 * caching allocator hands out) has granules whose lives, recorded during
 * capture, do not overlap, and the Python side colours them onto fewer
 * pages; so a granule may go anywhere in the pages, and several granules
 * (of this slot or others) onto the same bytes. Each granule is a whole
 * handle of the pages either way (pages.h), which is why any permutation,
 * repeats included, costs the driver what the linear bind does.
 */
vmmrt_status vmmrt_slot_map_pages_table(vmmrt_slot *s, vmmrt_pages *p, const size_t *offsets, size_t count)
{
	VMMRT__API_ENTER();
	VMMRT__CHECK_ARG(s, "slot is NULL");
	VMMRT__CHECK_ARG(p, "pages is NULL");
	VMMRT__CHECK_ARG(offsets, "offsets is NULL");
	unsigned long long id = (unsigned long long)s->id;
	size_t g = s->rt->granularity;
	vmmrt_status st = bind_args(s, p, __func__);
	if (st != VMMRT_OK)
		return st;
	if (count != s->size / g)
		return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: slot %llu: %zu offsets for its %zu granules (%zu bytes, "
				    "granularity %zu): one per granule", __func__, id, count, s->size / g, s->size, g);
	for (size_t i = 0; i < count; i++) {
		if (offsets[i] % g)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: slot %llu: offsets[%zu] = %zu is not a "
					    "multiple of the granularity %zu", __func__, id, i, offsets[i], g);
		/* p->size is a non-zero multiple of g: no wrap either way */
		if (offsets[i] > p->size - g)
			return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: slot %llu: offsets[%zu] = %zu: its granule goes past "
					    "the end of pages %llu (%zu bytes)", __func__, id, i, offsets[i],
					    (unsigned long long)p->id, p->size);
	}
	return bind(s, p, 0, offsets, count, __func__);
}

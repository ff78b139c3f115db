/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Resident driver workers: see worker.h for the contract.
 *
 * Queue: a wfcqueue per worker. Producers (host functions, the launch thread)
 * call cds_wfcq_enqueue, which is wait-free and tells whether the queue was
 * empty; the single consumer uses the unlocked __cds_wfcq_dequeue_nonblocking,
 * so no lock is ever shared with a host function. (An MPSC ck_ring would make
 * a preempted producer stall every other one: its enqueue spins until earlier
 * producers commit, and on a 2-core machine 4 producers and a consumer hit a
 * 15 s timeout in 8 runs of 12, where wfcqueue did the same work in 0.02 s.)
 *
 * Sleep: a ck_ec32 event count. The worker reads the count, looks at the
 * queue, and sleeps only if the count is unchanged; a producer enqueues first
 * and then increments, which makes a futex syscall only when the worker has
 * flagged itself as sleeping. No wake-up can be lost between the two.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>
#include <urcu/urcu-bp.h>

#include "clock.h"
#include "ec.h"
#include "error.h"
#include "driver.h"
#include "options.h"
#include "runtime.h"
#include "trace.h"
#include "tsan.h"
#include "worker.h"

typedef struct vmmrt__worker {
	struct cds_wfcq_head head;
	struct cds_wfcq_tail tail;
	struct ck_ec32 ec;
	pthread_t thread;
	bool started;
	unsigned index;
	vmmrt__trace *trace; /* the runtime's at creation */
	vmmrt__workers *set; /* the workers it is one of */

	/* worker-owned: requests waiting for admission, in arrival order */
	struct cds_list_head parked;
	/* worker-owned: requests waiting for their `after` event or to be
	 * ready (vmmrt__request_ops), any order */
	struct cds_list_head waiting;

	/* worker-owned: the class's local state */
	void *local;

	vmmrt__worker_stats stats; /* updated with uatomic by the worker, read by anyone */
} __attribute__((aligned(64))) worker;

struct vmmrt__workers {
	vmmrt_runtime *rt;
	const vmmrt__worker_class *cls; /* NULL: no local state */
	unsigned n;
	int32_t stopping;  /* uatomic: pushes are refused once set */
	int32_t drain;     /* uatomic: run (1) or cancel (0) what is queued at stop */
	worker w[];
};

void vmmrt__request_init(vmmrt__request *req, const vmmrt__request_ops *ops, void *owner)
{
	memset(req, 0, sizeof(*req));
	cds_wfcq_node_init(&req->node);
	req->ops = ops;
	req->owner = owner;
	req->state = VMMRT_REQ_IDLE;
	req->status = VMMRT_OK;
}

static vmmrt_status run_call(vmmrt__request *req, worker *wk)
{
	if (req->fn)
		req->fn(req->arg);
	return VMMRT_OK;
}

static const vmmrt__request_ops call_ops = {
	.name = "call",
	.run = run_call,
};

void vmmrt__request_init_call(vmmrt__request *req, void (*fn)(void *arg), void *arg)
{
	vmmrt__request_init(req, &call_ops, NULL);
	req->fn = fn;
	req->arg = arg;
}

void *vmmrt__worker_local(vmmrt__worker *wk)
{
	return wk->local;
}

void *vmmrt__workers_local(vmmrt__workers *w, unsigned index)
{
	return index < w->n ? w->w[index].local : NULL;
}

unsigned vmmrt__workers_count(const vmmrt__workers *w)
{
	return w->n;
}

unsigned vmmrt__workers_route(const vmmrt__workers *w, uint64_t slot_id)
{
	return (unsigned)(slot_id % w->n);
}

vmmrt_status vmmrt__worker_push(vmmrt__workers *w, unsigned index, vmmrt__request *req)
{
	if (!w || !req || index >= w->n)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "worker push: bad worker or request");
	if (uatomic_read(&w->stopping))
		return vmmrt__error(VMMRT_E_CANCELLED, "worker push: the runtime is shutting down");
	/* Claim the request: a request object sits in at most one queue. */
	int32_t old = uatomic_read(&req->state);
	if (old == VMMRT_REQ_QUEUED || old == VMMRT_REQ_RUNNING ||
	    uatomic_cmpxchg(&req->state, old, VMMRT_REQ_QUEUED) != old)
		return vmmrt__error(VMMRT_E_BUSY, "request already queued or running");
	worker *wk = &w->w[index];
	req->admitted = false;
	req->after_failed = false;
	req->attempts = 0;
	req->retry_at = 0;
	req->enqueue_ns = vmmrt__now_ns();
	cds_wfcq_node_init(&req->node);
	VMMRT__TSAN_RELEASE(req); /* the queue (liburcu-cds) hands req to the worker */
	cds_wfcq_enqueue(&wk->head, &wk->tail, &req->node);
	ck_ec32_inc(&wk->ec, &vmmrt__ec_mp);
	return VMMRT_OK;
}

static vmmrt_status wait_done(vmmrt__request *req, uint64_t timeout_ms, bool abandon_on_timeout)
{
	struct timespec ts;
	const struct timespec *deadline = vmmrt__deadline(&ts, timeout_ms);

	for (;;) {
		int32_t s = uatomic_read(&req->state);
		if (s == VMMRT_REQ_DONE || s == VMMRT_REQ_IDLE) {
			cmm_smp_rmb();
			vmmrt_status st = (vmmrt_status)uatomic_read(&req->status);
			if (st != VMMRT_OK)
				vmmrt__error_adopt(req->message);
			return st;
		}
		if (vmmrt__deadline_passed(deadline)) {
			if (abandon_on_timeout && uatomic_cmpxchg(&req->state, s, VMMRT_REQ_ABANDONED) != s)
				continue; /* it finished meanwhile */
			return vmmrt__error(VMMRT_E_TIMEOUT, "request still %s after %llu ms (worker stalled?)",
					    s == VMMRT_REQ_QUEUED ? "queued" : "running", (unsigned long long)timeout_ms);
		}
		vmmrt__futex_wait(&req->state, s, deadline);
	}
}

vmmrt_status vmmrt__request_wait(vmmrt__request *req, uint64_t timeout_ms)
{
	if (!req)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "request is NULL");
	vmmrt_status st = vmmrt__drv_check_caller("vmmrt__request_wait");
	if (st != VMMRT_OK)
		return st;
	return wait_done(req, timeout_ms, false);
}

vmmrt_status vmmrt__request_wait_owned(vmmrt__request *req, uint64_t timeout_ms)
{
	vmmrt_status st = wait_done(req, timeout_ms, true);
	if (st == VMMRT_E_TIMEOUT)
		return st; /* abandoned: the worker frees it */
	free(req);
	return st;
}

bool vmmrt__request_poll(const vmmrt__request *req, vmmrt_status *status)
{
	int32_t s = uatomic_read(&req->state);
	if (s == VMMRT_REQ_QUEUED || s == VMMRT_REQ_RUNNING)
		return false;
	if (status)
		*status = (vmmrt_status)uatomic_read(&req->status);
	return true;
}

/* ----------------------------------------------------------- worker side */

static void finish(worker *wk, vmmrt__request *req, vmmrt_status st)
{
	if (st != VMMRT_OK)
		snprintf(req->message, sizeof(req->message), "%s",
			 st == VMMRT_E_CANCELLED ? "VMMRT_E_CANCELLED: request cancelled (slot destroyed or runtime stopping)"
						 : vmmrt_last_error());
	uatomic_set(&req->status, (int32_t)st);
	if (st != VMMRT_OK && st != VMMRT_E_CANCELLED)
		uatomic_inc(&wk->stats.failed);
	if (req->done)
		req->done(req, st, req->done_arg);
	/* Publishing DONE hands the request back: touch it no more after this. */
	int32_t prev = uatomic_xchg(&req->state, VMMRT_REQ_DONE);
	if (prev == VMMRT_REQ_ABANDONED)
		free(req);
	else
		vmmrt__futex_wake_all(&req->state);
}

static void run(worker *wk, vmmrt__request *req, bool cancel);

void vmmrt__worker_cancel_owned(worker *wk, const void *owner)
{
	vmmrt__request *req, *tmp;
	cds_list_for_each_entry_safe(req, tmp, &wk->parked, wait_node) {
		if (req->owner == owner) {
			cds_list_del(&req->wait_node);
			run(wk, req, true);
		}
	}
	cds_list_for_each_entry_safe(req, tmp, &wk->waiting, wait_node) {
		if (req->owner == owner) {
			cds_list_del(&req->wait_node);
			run(wk, req, true);
		}
	}
}

static void run(worker *wk, vmmrt__request *req, bool cancel)
{
	vmmrt_status st = VMMRT_OK;
	const vmmrt__request_ops *ops = req->ops;

	uatomic_cmpxchg(&req->state, VMMRT_REQ_QUEUED, VMMRT_REQ_RUNNING);
	req->start_ns = vmmrt__now_ns();
	urcu_bp_read_lock();
	if (cancel && !ops->uncancellable) {
		st = VMMRT_E_CANCELLED;
		uatomic_inc(&wk->stats.cancelled);
	} else if (ops->withdrawn && ops->withdrawn(req)) {
		st = VMMRT_E_CANCELLED;
	} else {
		st = ops->run(req, wk); /* a destroy may have freed the owner: no more of it below */
		uatomic_inc(&wk->stats.processed);
	}
	if (st != VMMRT_OK && st != VMMRT_E_CANCELLED && req->persist && !cancel && ops->unchanged &&
	    ops->unchanged(req) && !uatomic_read(&wk->set->stopping)) {
		/* Nothing changed (a failed map was rolled back, a failed release left
		 * the slot mapped): try again later, first in line, since nothing
		 * behind it in schedule order may pass it. */
		uint64_t backoff_us = vmmrt__opt_u(&wk->set->rt->opts, VMMRT_OPT_OOM_BACKOFF_US);
		backoff_us <<= req->attempts < 7 ? req->attempts : 7;
		if (backoff_us > 100000 || backoff_us == 0)
			backoff_us = backoff_us ? 100000 : 1000;
		req->attempts++;
		req->retry_at = vmmrt__now_ns() + backoff_us * 1000;
		if (req->retrying)
			req->retrying(req, st, req->done_arg);
		cds_list_add(&req->wait_node, &wk->parked);
		urcu_bp_read_unlock();
		return;
	}
	if (ops->settle)
		ops->settle(req, st);
	urcu_bp_read_unlock();
	finish(wk, req, st);
}

static vmmrt__request *dequeue(worker *wk)
{
	for (;;) {
		struct cds_wfcq_node *node = __cds_wfcq_dequeue_nonblocking(&wk->head, &wk->tail);
		if (node == CDS_WFCQ_WOULDBLOCK) {
			caa_cpu_relax(); /* a producer is between its two enqueue steps */
			continue;
		}
		if (!node)
			return NULL;
		vmmrt__request *req = caa_container_of(node, vmmrt__request, node);
		VMMRT__TSAN_ACQUIRE(req); /* pairs with the release in vmmrt__worker_push */
		return req;
	}
}

/* Start parked requests whose admission now passes, oldest first; stop at the
 * first that still may not start, so requests are admitted in arrival order. */
static bool admit(vmmrt__request *req)
{
	if (!req->admitted && req->admit && !req->admit(req, req->done_arg))
		return false;
	req->admitted = true;
	return true;
}

static void run_parked(worker *wk)
{
	while (!cds_list_empty(&wk->parked)) {
		vmmrt__request *req = cds_list_first_entry(&wk->parked, vmmrt__request, wait_node);
		if (req->retry_at && vmmrt__now_ns() < req->retry_at)
			return;
		if (!admit(req))
			return;
		cds_list_del(&req->wait_node);
		run(wk, req, false);
	}
}

/* The deadline of the first parked request's retry, if it is waiting for one. */
static const struct timespec *retry_deadline(worker *wk, struct timespec *ts)
{
	if (cds_list_empty(&wk->parked))
		return NULL;
	vmmrt__request *req = cds_list_first_entry(&wk->parked, vmmrt__request, wait_node);
	if (!req->retry_at)
		return NULL;
	*ts = vmmrt__timespec(req->retry_at);
	return ts;
}

/*
 * Has req's `after` event completed? A query that fails (not merely "not
 * yet") says nothing about the work the event follows, so it must not start
 * the request: a release would pull memory from under a graph that may still
 * run, and admission would count it as done, letting a later map of the slot
 * pass a release still in flight. A persistent request reports the failure
 * once (its `retrying`) and keeps polling; any other ends with the error, the
 * memory left as it is.
 */
static bool after_done(worker *wk, vmmrt__request *req, vmmrt_status *failed)
{
	bool done = false;
	vmmrt_status st = vmmrt__drv_event_query(wk->set->rt, req->after, &done);
	*failed = VMMRT_OK;
	if (st == VMMRT_OK)
		return done;
	if (!req->persist) {
		*failed = st;
		return true;
	}
	if (!req->after_failed && req->retrying)
		req->retrying(req, st, req->done_arg);
	req->after_failed = true;
	return false;
}

/*
 * May req start? Its `after` event has completed (forgotten then: it is
 * not asked again), or its query failed (*failed: it ends with that), and
 * its ops say it is ready.
 */
static bool may_start(worker *wk, vmmrt__request *req, vmmrt_status *failed)
{
	*failed = VMMRT_OK;
	if (req->after) {
		if (!after_done(wk, req, failed))
			return false;
		req->after = NULL;
		if (*failed != VMMRT_OK)
			return true;
	}
	return !req->ops->ready || req->ops->ready(req);
}

static void take(worker *wk, vmmrt__request *req);

static void run_waiting(worker *wk)
{
	vmmrt__request *req, *tmp;
	cds_list_for_each_entry_safe(req, tmp, &wk->waiting, wait_node) {
		vmmrt_status failed;
		if (!may_start(wk, req, &failed))
			continue;
		cds_list_del(&req->wait_node);
		if (failed != VMMRT_OK) {
			uatomic_cmpxchg(&req->state, VMMRT_REQ_QUEUED, VMMRT_REQ_RUNNING);
			finish(wk, req, failed);
			continue;
		}
		take(wk, req);
	}
}

static const struct timespec *next_deadline(worker *wk, struct timespec *ts)
{
	const struct timespec *retry = retry_deadline(wk, ts);
	if (cds_list_empty(&wk->waiting))
		return retry;
	uint64_t poll = vmmrt__now_ns() + VMMRT__WORKER_POLL_US * 1000ull;
	if (retry && (uint64_t)retry->tv_sec * 1000000000ull + (uint64_t)retry->tv_nsec < poll)
		return retry;
	*ts = vmmrt__timespec(poll);
	return ts;
}

static void take(worker *wk, vmmrt__request *req)
{
	vmmrt_status failed;
	if (!may_start(wk, req, &failed)) {
		cds_list_add_tail(&req->wait_node, &wk->waiting);
		return;
	}
	if (failed != VMMRT_OK) {
		uatomic_cmpxchg(&req->state, VMMRT_REQ_QUEUED, VMMRT_REQ_RUNNING);
		finish(wk, req, failed);
		return;
	}
	if (req->admit && (!cds_list_empty(&wk->parked) || !admit(req))) {
		cds_list_add_tail(&req->wait_node, &wk->parked);
		return;
	}
	run(wk, req, false);
}

void vmmrt__workers_kick(vmmrt__workers *w)
{
	for (unsigned i = 0; i < w->n; i++)
		ck_ec32_inc(&w->w[i].ec, &vmmrt__ec_mp);
}

static void *worker_main(void *arg)
{
	worker *wk = arg;
	vmmrt_runtime *rt = wk->set->rt;
	char name[32];

	vmmrt__thread_role_set(VMMRT_ROLE_WORKER);
	urcu_bp_register_thread();
	snprintf(name, sizeof(name), "vmmrt-drv-%u", wk->index);
	pthread_setname_np(pthread_self(), name);
	/* The trace the runtime was created with, read before this thread
	 * started: one attached later (vmmrt-bench) names the workers itself. */
	if (wk->trace)
		vmmrt__trace_thread_name(wk->trace, name);
	(void)vmmrt__drv_bind_thread(rt);

	for (;;) {
		uint32_t seen = ck_ec32_value(&wk->ec);
		/* Checked before each request, so a cancelling stop cancels what is queued. */
		if (uatomic_read(&wk->set->stopping))
			break;
		run_waiting(wk);
		run_parked(wk);
		vmmrt__request *req = dequeue(wk);
		if (req) {
			take(wk, req);
			continue;
		}
		if (wk->set->cls && wk->set->cls->idle)
			wk->set->cls->idle(wk->local);
		uatomic_inc(&wk->stats.wakeups);
		struct timespec ts;
		ck_ec32_wait(&wk->ec, &vmmrt__ec_mp, seen, next_deadline(wk, &ts));
	}
	/* Stopping: what is still queued is run or cancelled, never dropped. */
	bool drain = uatomic_read(&wk->set->drain);
	struct cds_list_head *lists[] = {&wk->waiting, &wk->parked};
	for (unsigned k = 0; k < 2; k++) {
		while (!cds_list_empty(lists[k])) {
			/* They wait for work that will never come now: cancel them. */
			vmmrt__request *req = cds_list_first_entry(lists[k], vmmrt__request, wait_node);
			cds_list_del(&req->wait_node);
			run(wk, req, true);
		}
	}
	for (vmmrt__request *req; (req = dequeue(wk));) {
		/* One whose event has not come may not run now: what it follows is
		 * still in flight (a release would pull memory from under a graph). */
		vmmrt_status failed;
		bool ready = may_start(wk, req, &failed) && failed == VMMRT_OK;
		run(wk, req, !drain || !ready);
	}
	if (wk->set->cls && wk->set->cls->stop)
		wk->set->cls->stop(wk->local);
	urcu_bp_unregister_thread();
	return NULL;
}

vmmrt_status vmmrt__workers_create(vmmrt_runtime *rt, unsigned n, const vmmrt__worker_class *cls,
				   vmmrt__workers **out)
{
	if (n == 0)
		return vmmrt__error(VMMRT_E_INVALID_OPTION, "driver_workers must be at least 1");
	vmmrt__workers *w = calloc(1, sizeof(*w) + n * sizeof(worker));
	if (!w)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "driver workers");
	w->rt = rt;
	w->cls = cls;
	w->n = n;
	for (unsigned i = 0; i < n; i++) {
		worker *wk = &w->w[i];
		cds_wfcq_init(&wk->head, &wk->tail);
		CDS_INIT_LIST_HEAD(&wk->parked);
		CDS_INIT_LIST_HEAD(&wk->waiting);
		ck_ec32_init(&wk->ec, 0);
		wk->index = i;
		wk->set = w;
		wk->trace = rt->trace;
		if (!cls)
			continue;
		vmmrt_status st = VMMRT_OK;
		if (!(wk->local = calloc(1, cls->local_size)))
			st = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "driver worker %u: %zu bytes of state", i,
					  cls->local_size);
		else if (cls->init)
			st = cls->init(wk->local, rt);
		if (st != VMMRT_OK) {
			vmmrt__workers_destroy(w, false);
			return st;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		int e = pthread_create(&w->w[i].thread, NULL, worker_main, &w->w[i]);
		if (e != 0) {
			vmmrt__workers_destroy(w, false);
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "driver worker %u: pthread_create: %s", i,
					   strerror(e));
		}
		w->w[i].started = true;
	}
	*out = w;
	return VMMRT_OK;
}

uint64_t vmmrt__workers_destroy(vmmrt__workers *w, bool drain)
{
	if (!w)
		return 0;
	uatomic_set(&w->drain, drain);
	uatomic_set(&w->stopping, 1);
	for (unsigned i = 0; i < w->n; i++)
		ck_ec32_inc(&w->w[i].ec, &vmmrt__ec_mp);
	uint64_t cancelled = 0;
	for (unsigned i = 0; i < w->n; i++) {
		worker *wk = &w->w[i];
		if (wk->started)
			pthread_join(wk->thread, NULL);
		cancelled += uatomic_read(&wk->stats.cancelled);
		if (wk->local && w->cls->fini)
			w->cls->fini(wk->local);
		free(wk->local);
		cds_wfcq_destroy(&wk->head, &wk->tail);
	}
	free(w);
	return cancelled;
}

void vmmrt__workers_stats(const vmmrt__workers *w, vmmrt__worker_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < w->n; i++) {
		const vmmrt__worker_stats *s = &w->w[i].stats;
		out->processed += uatomic_read(&s->processed);
		out->cancelled += uatomic_read(&s->cancelled);
		out->failed += uatomic_read(&s->failed);
		out->wakeups += uatomic_read(&s->wakeups);
	}
}

/* For vmmrt__offload_dump: what each worker holds back (read without locks). */
void vmmrt__workers_dump(vmmrt__workers *w, int fd)
{
	for (unsigned i = 0; i < w->n; i++) {
		worker *wk = &w->w[i];
		vmmrt__request *req;
		unsigned parked = 0, waiting = 0;
		cds_list_for_each_entry(req, &wk->parked, wait_node)
			parked++;
		cds_list_for_each_entry(req, &wk->waiting, wait_node)
			waiting++;
		dprintf(fd, "    worker %u: queue %s, %u parked, %u waiting for an event, processed %llu, failed %llu", i,
			cds_wfcq_empty(&wk->head, &wk->tail) ? "empty" : "not empty", parked, waiting,
			(unsigned long long)uatomic_read(&wk->stats.processed),
			(unsigned long long)uatomic_read(&wk->stats.failed));
		if (parked) {
			req = cds_list_first_entry(&wk->parked, vmmrt__request, wait_node);
			dprintf(fd, "; first parked: %s, admitted %d, attempts %u, retry %s",
				req->ops->name, req->admitted, req->attempts,
				req->retry_at ? "pending" : "none");
		}
		dprintf(fd, "\n");
	}
}

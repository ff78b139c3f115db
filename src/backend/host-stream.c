/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's streams, copies and kernels, and the registries of
 * streams, events and graphs.
 *
 * A stream is a thread (host-exec.c) that runs its work items in FIFO order.
 * Enqueueing never blocks on the work: it appends an item and wakes the
 * thread, so the launch thread behaves as with a GPU. Events and graphs are
 * host-graph.c's; their work goes through vmmrt__host_submit like the rest.
 */
#include "config.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "error.h"

/* ------------------------------------------------------------ registries */

static void stream_stop_free(struct vmmrt_stream_s *st);

static void stream_release(vmmrt__backend *b, struct cds_list_head *node)
{
	stream_stop_free((struct vmmrt_stream_s *)node);
}

static void event_release(vmmrt__backend *b, struct cds_list_head *node)
{
	/* like cuEventDestroy: pending records and waits keep it alive until they ran */
	vmmrt__host_event_put((vmmrt__bevent *)node);
}

static void graph_release(vmmrt__backend *b, struct cds_list_head *node)
{
	/* like cuGraphExecDestroy: a launch in flight finishes first */
	vmmrt__host_graph_put((vmmrt__bgraph *)node);
}

/* A handle is the object: each kind's list node comes first. */
_Static_assert(offsetof(struct vmmrt_stream_s, node) == 0, "a stream is its list node");
_Static_assert(offsetof(struct vmmrt__bevent, node) == 0, "an event is its list node");
_Static_assert(offsetof(struct vmmrt__bgraph, node) == 0, "a graph is its list node");

/* NULL, VMMRT_STREAM_LEGACY and VMMRT_STREAM_PER_THREAD name the default stream. */
static bool stream_is(const struct cds_list_head *node, const void *s)
{
	const struct vmmrt_stream_s *st = (const struct vmmrt_stream_s *)node;
	return VMMRT__IS_DEFAULT_STREAM((vmmrt_stream)s) ? st == st->b->default_stream : st == s;
}

static const vmmrt__host_kind streams = {
	.unknown = "%s: unknown stream %p",
	.list = offsetof(vmmrt__backend, streams),
	.match = stream_is,
	.release = stream_release,
};
const vmmrt__host_kind vmmrt__host_events_kind = {
	.unknown = "%s: unknown event %p",
	.list = offsetof(vmmrt__backend, events),
	.release = event_release,
};
const vmmrt__host_kind vmmrt__host_graphs_kind = {
	.unknown = "%s: unknown graph %p",
	.list = offsetof(vmmrt__backend, graphs),
	.release = graph_release,
};

/* Callers hold obj_lock. */
static struct vmmrt_stream_s *stream_find(vmmrt__backend *b, vmmrt_stream s)
{
	return (struct vmmrt_stream_s *)vmmrt__host_lookup(b, &streams, s);
}

/* A reference on a registered event, taken under obj_lock so a concurrent destroy cannot free it. */
vmmrt_status vmmrt__host_event_ref(vmmrt__backend *b, vmmrt__bevent *e, const char *func)
{
	vmmrt__bevent *found;

	pthread_mutex_lock(&b->obj_lock);
	found = (vmmrt__bevent *)vmmrt__host_lookup(b, &vmmrt__host_events_kind, e);
	if (found)
		uatomic_inc(&found->refs);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown event %p", func, (void *)e);
	return VMMRT_OK;
}

/* Look a stream up and return it locked. */
struct vmmrt_stream_s *vmmrt__host_stream_lock(vmmrt__backend *b, vmmrt_stream s)
{
	struct vmmrt_stream_s *st;

	pthread_mutex_lock(&b->obj_lock);
	st = stream_find(b, s);
	if (st)
		pthread_mutex_lock(&st->lock);
	pthread_mutex_unlock(&b->obj_lock);
	return st;
}

vmmrt_status vmmrt__host_unknown_stream(vmmrt_stream s, const char *func)
{
	return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown stream %p", func, (void *)s);
}

/* The prologue of synchronize and query: a known stream, locked, that is not
 * capturing (CUDA refuses both on a capturing stream too). */
static vmmrt_status lock_idle_stream(vmmrt__backend *b, vmmrt_stream s, const char *func,
				     struct vmmrt_stream_s **out)
{
	vmmrt_status status = vmmrt__host_enter(b, func);
	if (status != VMMRT_OK)
		return status;
	struct vmmrt_stream_s *st = vmmrt__host_stream_lock(b, s);
	if (!st)
		return vmmrt__host_unknown_stream(s, func);
	if (st->capturing) {
		pthread_mutex_unlock(&st->lock);
		return vmmrt__error(VMMRT_E_CAPTURE, "%s: the stream is capturing a graph", func);
	}
	*out = st;
	return VMMRT_OK;
}

/* -------------------------------------------------------------- enqueueing */

static vmmrt_status capture_append(struct vmmrt_stream_s *st, const struct host_op *op, const char *func)
{
	if (st->cap_n == st->cap_len) {
		size_t len = st->cap_len ? st->cap_len * 2 : 16;
		struct host_op *ops = realloc(st->cap_ops, len * sizeof(*ops));

		if (!ops)
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: capture list", func);
		st->cap_ops = ops;
		st->cap_len = len;
	}
	st->cap_ops[st->cap_n++] = *op;
	return VMMRT_OK;
}

/* Event ops become "enqueued" here: a record is now the most recent one. */
static void assign_seqs(vmmrt__backend *b, struct host_item *item)
{
	const vmmrt__bgraph *g;
	size_t j = 0;

	pthread_mutex_lock(&b->sync_lock);
	switch (item->op.kind) {
	case OP_RECORD:
		item->seq = ++item->op.u.event->record_seq;
		break;
	case OP_WAIT_EVENT:
		item->seq = item->op.u.event->record_seq;
		break;
	case OP_GRAPH:
		g = item->op.u.graph;
		for (size_t i = 0; i < g->n; i++) {
			if (g->ops[i].kind == OP_RECORD)
				item->seqs[j++] = ++g->ops[i].u.event->record_seq;
			else if (g->ops[i].kind == OP_WAIT_EVENT)
				item->seqs[j++] = g->ops[i].u.event->record_seq;
		}
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&b->sync_lock);
}

/*
 * Enqueue op on stream s, or record it when s is capturing. Takes over the
 * reference op holds, also on failure.
 */
vmmrt_status vmmrt__host_submit(vmmrt__backend *b, vmmrt_stream s, const struct host_op *op, const char *func)
{
	size_t nseq = op->kind == OP_GRAPH ? op->u.graph->n_event_ops : 0;
	struct host_item *item = calloc(1, sizeof(*item));
	struct vmmrt_stream_s *st;
	vmmrt_status status;

	if (!item || (nseq && !(item->seqs = calloc(nseq, sizeof(uint64_t))))) {
		status = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: work item", func);
		goto fail;
	}
	st = vmmrt__host_stream_lock(b, s);
	if (!st) {
		status = vmmrt__host_unknown_stream(s, func);
		goto fail;
	}
	if (st->capturing) {
		if (op->kind == OP_GRAPH)
			status = vmmrt__error(VMMRT_E_NOT_SUPPORTED,
					     "%s: graph launch inside a capture (the host backend captures one level)",
					     func);
		else
			status = capture_append(st, op, func);
		pthread_mutex_unlock(&st->lock);
		if (status != VMMRT_OK)
			goto fail;
		free(item->seqs);
		free(item);
		return VMMRT_OK;
	}
	item->op = *op;
	assign_seqs(b, item);
	if (st->tail)
		st->tail->next = item;
	else
		st->head = item;
	st->tail = item;
	st->enqueued++;
	pthread_cond_signal(&st->work_cond);
	pthread_mutex_unlock(&st->lock);
	return VMMRT_OK;
fail:
	if (item) {
		free(item->seqs);
		free(item);
	}
	vmmrt__host_op_release(op);
	return status;
}

/* ------------------------------------------------------------------ streams */

vmmrt_status vmmrt__host_stream_create(vmmrt__backend *b, vmmrt_stream *out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;
	sigset_t all, old;
	int rc;

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(out, "NULL output");
	st = calloc(1, sizeof(*st));
	if (!st)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: stream", __func__);
	st->b = b;
	pthread_mutex_init(&st->lock, NULL);
	pthread_cond_init(&st->work_cond, NULL);
	pthread_cond_init(&st->idle_cond, NULL);

	/*
	 * Like a driver thread, take no asynchronous signal meant for the
	 * application; faults stay deliverable so bad stream work kills the process.
	 */
	sigfillset(&all);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&st->thread, NULL, vmmrt__host_stream_main, st);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&st->idle_cond);
		pthread_cond_destroy(&st->work_cond);
		pthread_mutex_destroy(&st->lock);
		free(st);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: pthread_create: %s", __func__, strerror(rc));
	}
	vmmrt__host_register(b, &streams, &st->node);
	*out = st;
	return VMMRT_OK;
}

/* The stream is out of the registry: let it drain, join it and free it. */
static void stream_stop_free(struct vmmrt_stream_s *st)
{
	pthread_mutex_lock(&st->lock);
	st->stop = true;
	pthread_cond_signal(&st->work_cond);
	pthread_mutex_unlock(&st->lock);
	pthread_join(st->thread, NULL);

	/* an unfinished capture is lost, as when a capturing CUDA stream is destroyed */
	for (size_t i = 0; i < st->cap_n; i++)
		vmmrt__host_op_release(&st->cap_ops[i]);
	free(st->cap_ops);
	pthread_cond_destroy(&st->idle_cond);
	pthread_cond_destroy(&st->work_cond);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

vmmrt_status vmmrt__host_stream_destroy(vmmrt__backend *b, vmmrt_stream s)
{
	return vmmrt__host_destroy(b, &streams, s, __func__);
}

vmmrt_status vmmrt__host_stream_synchronize(vmmrt__backend *b, vmmrt_stream s)
{
	struct vmmrt_stream_s *st;
	uint64_t target;
	vmmrt_status status = lock_idle_stream(b, s, __func__, &st);

	if (status != VMMRT_OK)
		return status;
	/* what was enqueued before the call, not what other threads add meanwhile */
	target = st->enqueued;
	while (st->completed < target)
		pthread_cond_wait(&st->idle_cond, &st->lock);
	pthread_mutex_unlock(&st->lock);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_stream_query(vmmrt__backend *b, vmmrt_stream s, bool *done)
{
	struct vmmrt_stream_s *st;
	VMMRT__CHECK_ARG(done, "NULL result");
	vmmrt_status status = lock_idle_stream(b, s, __func__, &st);

	if (status != VMMRT_OK)
		return status;
	*done = st->enqueued == st->completed;
	pthread_mutex_unlock(&st->lock);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_op(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e,
				  enum vmmrt__host_op_kind kind, const char *func)
{
	vmmrt_status status = vmmrt__host_enter(b, func);
	struct host_op op = {.kind = kind};

	if (status != VMMRT_OK)
		return status;
	if ((status = vmmrt__host_event_ref(b, e, func)) != VMMRT_OK)
		return status;
	op.u.event = e;
	return vmmrt__host_submit(b, s, &op, func);
}

vmmrt_status vmmrt__host_stream_wait_event(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e)
{
	return vmmrt__host_event_op(b, s, e, OP_WAIT_EVENT, __func__);
}

static vmmrt_status value_op(vmmrt__backend *b, vmmrt_stream s, enum vmmrt__host_op_kind kind, vmmrt_devptr addr,
			     uint32_t value, const char *func)
{
	vmmrt_status status = vmmrt__host_enter(b, func);
	struct host_op op = {.kind = kind};

	if (status != VMMRT_OK)
		return status;
	if (addr == 0 || addr % 4)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: address 0x%llx is NULL or not 4-byte aligned", func,
				   (unsigned long long)addr);
	op.u.value.addr = (uint32_t *)(uintptr_t)addr;
	op.u.value.value = value;
	return vmmrt__host_submit(b, s, &op, func);
}

vmmrt_status vmmrt__host_stream_wait_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	return value_op(b, s, OP_WAIT_VALUE, addr, value, __func__);
}

vmmrt_status vmmrt__host_stream_write_value32(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr addr, uint32_t value)
{
	return value_op(b, s, OP_WRITE_VALUE, addr, value, __func__);
}

vmmrt_status vmmrt__host_launch_host_func(vmmrt__backend *b, vmmrt_stream s, vmmrt__host_fn fn, void *arg)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_HOST_FN};

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(fn, "NULL function");
	op.u.host.fn = fn;
	op.u.host.arg = arg;
	return vmmrt__host_submit(b, s, &op, __func__);
}

/* ------------------------------------------------------------------- copies */

static vmmrt_status copy_op(vmmrt__backend *b, vmmrt_stream s, void *dst, const void *src, size_t n, bool d2h,
			    const char *func)
{
	vmmrt_status status = vmmrt__host_enter(b, func);
	struct host_op op = {.kind = OP_COPY};

	if (status != VMMRT_OK)
		return status;
	if (n && (!dst || !src))
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL %s", func, dst ? "source" : "destination");
	op.u.copy.dst = dst;
	op.u.copy.src = src;
	op.u.copy.n = n;
	op.u.copy.d2h = d2h;
	return vmmrt__host_submit(b, s, &op, func);
}

vmmrt_status vmmrt__host_memcpy_htod_async(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n,
					  vmmrt_stream s)
{
	return copy_op(b, s, (void *)(uintptr_t)dst, src, n, false, __func__);
}

vmmrt_status vmmrt__host_memcpy_dtoh_async(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	return copy_op(b, s, dst, (const void *)(uintptr_t)src, n, true, __func__);
}

vmmrt_status vmmrt__host_memcpy_dtod_async(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n,
					  vmmrt_stream s)
{
	return copy_op(b, s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, false, __func__);
}

/* ------------------------------------------------------------------ kernels */

vmmrt_status vmmrt__host_kernel_launch(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k,
				      const vmmrt__kernel_args *args)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_KERNEL};

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(args, "NULL arguments");
	if ((unsigned)k >= VMMRT_KERNEL_COUNT_)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown kernel %d", __func__, (int)k);
	if (k != VMMRT_KERNEL_BUSY) {
		if (args->bytes % 8)
			return vmmrt__error(VMMRT_E_INVALID_SIZE, "%s: %zu bytes is not a multiple of 8", __func__,
					   args->bytes);
		if (k == VMMRT_KERNEL_CHECKSUM && (!args->out || (args->bytes && !args->src)))
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: checksum needs src and out", __func__);
		if (k != VMMRT_KERNEL_CHECKSUM && args->bytes && !args->dst)
			return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: NULL destination", __func__);
	}
	op.u.kernel.id = k;
	op.u.kernel.args = *args;
	return vmmrt__host_submit(b, s, &op, __func__);
}

/*
 * Every stream, up to what was enqueued before the call. The streams are
 * listed first, with their targets, under obj_lock, then waited for one at
 * a time without it (a stream thread never takes it; an API call from
 * another thread must not wait behind this one); a stream destroyed
 * meanwhile is not found again and needs no waiting (its thread is gone).
 */
vmmrt_status vmmrt__host_streams_synchronize(vmmrt__backend *b, const char *func)
{
	struct target {
		struct vmmrt_stream_s *st;
		uint64_t enqueued;
	} *t = NULL;
	size_t n = 0, cap = 0;
	struct vmmrt_stream_s *st;
	vmmrt_status status = vmmrt__host_enter(b, func);

	if (status != VMMRT_OK)
		return status;
	for (;;) {
		size_t count = 0;
		pthread_mutex_lock(&b->obj_lock);
		cds_list_for_each_entry(st, &b->streams, node)
			count++;
		if (count <= cap) {
			cds_list_for_each_entry(st, &b->streams, node) {
				pthread_mutex_lock(&st->lock);
				t[n++] = (struct target){st, st->enqueued};
				pthread_mutex_unlock(&st->lock);
			}
			pthread_mutex_unlock(&b->obj_lock);
			break;
		}
		pthread_mutex_unlock(&b->obj_lock);
		free(t);
		cap = count + 4;
		if (!(t = malloc(cap * sizeof(*t))))
			return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: synchronizing %zu streams", func, count);
	}
	for (size_t i = 0; i < n; i++) {
		if (!(st = vmmrt__host_stream_lock(b, t[i].st)))
			continue;
		while (st->completed < t[i].enqueued && !uatomic_read(&b->closing))
			pthread_cond_wait(&st->idle_cond, &st->lock);
		pthread_mutex_unlock(&st->lock);
	}
	free(t);
	return VMMRT_OK;
}

/* ------------------------------------------------------------------ closing */

void vmmrt__host_streams_shutdown(vmmrt__backend *b)
{
	/* abandon blocked waits and pending work: nothing may outlive close */
	pthread_mutex_lock(&b->sync_lock);
	uatomic_set(&b->closing, true);
	pthread_cond_broadcast(&b->sync_cond);
	pthread_mutex_unlock(&b->sync_lock);

	vmmrt__host_unregister_all(b, &streams);
	/* graphs hold event references: drop them first */
	vmmrt__host_unregister_all(b, &vmmrt__host_graphs_kind);
	vmmrt__host_unregister_all(b, &vmmrt__host_events_kind);
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's streams, events, graphs, copies and kernels.
 *
 * A stream is a thread that runs its work items in FIFO order. Enqueueing never
 * blocks on the work: it appends an item and wakes the thread, so the launch
 * thread behaves as with a GPU. A fault in stream work (a copy from an unmapped
 * slot) is a real SIGSEGV, as a GPU fault is fatal to a CUDA context.
 *
 * Events follow CUDA: a record gets a sequence number when it is enqueued and
 * becomes "the most recent record"; a wait takes the sequence number current
 * when it is enqueued; query and synchronize refer to the most recent record;
 * an event never recorded is complete. Records of one event on several streams
 * at once are assumed to complete in the order they were enqueued (the event
 * counts as complete up to the highest finished record).
 *
 * Graphs: only single-stream capture is supported (no fork/join through events
 * recorded in the capture, no graph launch inside a capture). A graph is the
 * list of captured operations; a launch is one work item that runs them in
 * order on the stream thread, at the captured addresses. Event records and
 * waits inside a graph take their sequence numbers when the launch is enqueued,
 * as if each had been enqueued on its own at that moment.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include <urcu/arch.h>
#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "error.h"

enum op_kind {
	OP_COPY,
	OP_KERNEL,
	OP_HOST_FN,
	OP_RECORD,
	OP_WAIT_EVENT,
	OP_WAIT_VALUE,
	OP_WRITE_VALUE,
	OP_GRAPH,
};

/* One operation as enqueued or captured. Holds a reference on its event or graph. */
struct host_op {
	enum op_kind kind;
	union {
		struct {
			void *dst;
			const void *src;
			size_t n;
		} copy;
		struct {
			vmmrt__kernel_id id;
			vmmrt__kernel_args args;
		} kernel;
		struct {
			vmmrt__host_fn fn;
			void *arg;
		} host;
		vmmrt__bevent *event;
		struct {
			uint32_t *addr;
			uint32_t value;
		} value;
		vmmrt__bgraph *graph;
	} u;
};

struct host_item {
	struct host_item *next;
	struct host_op op;
	uint64_t seq;   /* record / wait: the record this item completes or waits for */
	uint64_t *seqs; /* graph launch: one per event op of the graph, fixed at enqueue */
};

struct vmmrt_stream_s {
	struct cds_list_head node;
	vmmrt__backend *b;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t work_cond; /* new work, or stop */
	pthread_cond_t idle_cond; /* an item completed */
	struct host_item *head, *tail;
	uint64_t enqueued, completed;
	bool stop;
	bool capturing;
	struct host_op *cap_ops;
	size_t cap_n, cap_len;
};

struct vmmrt__bevent {
	struct cds_list_head node;
	long refs; /* uatomic: the registry, pending items, graphs */
	bool timing;
	/* under b->sync_lock */
	uint64_t record_seq; /* most recent record enqueued; 0: never recorded */
	uint64_t done_seq;   /* highest record completed */
	uint64_t done_ns;    /* CLOCK_MONOTONIC when done_seq completed */
};

struct vmmrt__bgraph {
	struct cds_list_head node;
	long refs; /* uatomic: the registry (the caller's handle) and pending launches */
	size_t n;
	struct host_op *ops;
	size_t n_event_ops;
};

/* ------------------------------------------------------------------ objects */

static void event_put(vmmrt__bevent *e)
{
	if (uatomic_add_return(&e->refs, -1) == 0)
		free(e);
}

static void op_release(const struct host_op *op);

static void graph_put(vmmrt__bgraph *g)
{
	if (uatomic_add_return(&g->refs, -1) != 0)
		return;
	for (size_t i = 0; i < g->n; i++)
		op_release(&g->ops[i]);
	free(g->ops);
	free(g);
}

static void op_release(const struct host_op *op)
{
	if (op->kind == OP_RECORD || op->kind == OP_WAIT_EVENT)
		event_put(op->u.event);
	else if (op->kind == OP_GRAPH)
		graph_put(op->u.graph);
}

static bool is_event_op(const struct host_op *op)
{
	return op->kind == OP_RECORD || op->kind == OP_WAIT_EVENT;
}

/* The registries make a stale or bogus handle an error instead of a crash. Callers hold obj_lock. */
static struct vmmrt_stream_s *stream_find(vmmrt__backend *b, vmmrt_stream s)
{
	struct vmmrt_stream_s *st;

	if (VMMRT__IS_DEFAULT_STREAM(s))
		s = b->default_stream;
	cds_list_for_each_entry(st, &b->streams, node) {
		if (st == s)
			return st;
	}
	return NULL;
}

static vmmrt__bevent *event_find(vmmrt__backend *b, vmmrt__bevent *e)
{
	vmmrt__bevent *it;

	cds_list_for_each_entry(it, &b->events, node) {
		if (it == e)
			return it;
	}
	return NULL;
}

static vmmrt__bgraph *graph_find(vmmrt__backend *b, vmmrt__bgraph *g)
{
	vmmrt__bgraph *it;

	cds_list_for_each_entry(it, &b->graphs, node) {
		if (it == g)
			return it;
	}
	return NULL;
}

/* A reference on a registered event, taken under obj_lock so a concurrent destroy cannot free it. */
static vmmrt_status event_ref(vmmrt__backend *b, vmmrt__bevent *e, const char *func)
{
	vmmrt__bevent *found;

	pthread_mutex_lock(&b->obj_lock);
	found = event_find(b, e);
	if (found)
		uatomic_inc(&found->refs);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown event %p", func, (void *)e);
	return VMMRT_OK;
}

/* Look a stream up and return it locked. */
static struct vmmrt_stream_s *stream_lock(vmmrt__backend *b, vmmrt_stream s)
{
	struct vmmrt_stream_s *st;

	pthread_mutex_lock(&b->obj_lock);
	st = stream_find(b, s);
	if (st)
		pthread_mutex_lock(&st->lock);
	pthread_mutex_unlock(&b->obj_lock);
	return st;
}

static vmmrt_status unknown_stream(vmmrt_stream s, const char *func)
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
	struct vmmrt_stream_s *st = stream_lock(b, s);
	if (!st)
		return unknown_stream(s, func);
	if (st->capturing) {
		pthread_mutex_unlock(&st->lock);
		return vmmrt__error(VMMRT_E_CAPTURE, "%s: the stream is capturing a graph", func);
	}
	*out = st;
	return VMMRT_OK;
}

/* ----------------------------------------------------------- running work */

static void run_copy(vmmrt__backend *b, const struct host_op *op)
{
	uint64_t t0 = vmmrt__host_now_ns();

	if (op->u.copy.n == 0)
		return;
	uatomic_inc(&b->copies_in_flight);
	if (!b->cfg.host_latency) {
		memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
	} else {
		/*
		 * Paced in chunks over the modelled duration (bytes / (GB/s) is
		 * nanoseconds), as a DMA engine streams them: a kernel that
		 * overwrites the source mid-copy is seen in the copy, so a missing
		 * fence corrupts data here exactly as it would on a GPU. Copies on
		 * different streams overlap like copy engines.
		 */
		const size_t chunk = 256 * 1024;
		const size_t n = op->u.copy.n;
		char *dst = op->u.copy.dst;
		const char *src = op->u.copy.src;
		for (size_t at = 0; at < n; at += chunk) {
			size_t len = n - at < chunk ? n - at : chunk;
			memmove(dst + at, src + at, len);
			vmmrt__host_sleep_until(t0 + (uint64_t)((double)(at + len) / b->cfg.host_copy_gbps));
		}
	}
	uatomic_dec(&b->copies_in_flight);
}

static void run_kernel(const struct host_op *op)
{
	const vmmrt__kernel_args *a = &op->u.kernel.args;
	uint64_t t0 = vmmrt__host_now_ns();
	unsigned char *dst = (unsigned char *)(uintptr_t)a->dst;
	const unsigned char *src = (const unsigned char *)(uintptr_t)a->src;
	size_t words = a->bytes / 8;

	/* memcpy per word: device pointers need not be 8-byte aligned */
	switch (op->u.kernel.id) {
	case VMMRT_KERNEL_FILL:
		for (size_t i = 0; i < words; i++) {
			uint64_t w = vmmrt_fill_word(a->seed, i);
			memcpy(dst + i * 8, &w, 8);
		}
		break;
	case VMMRT_KERNEL_CHECKSUM: {
		uint64_t sum = vmmrt_checksum_host(src, a->bytes);
		memcpy((void *)(uintptr_t)a->out, &sum, 8);
		break;
	}
	case VMMRT_KERNEL_LAYER:
		for (size_t i = 0; i < words; i++) {
			uint64_t w = 0;

			if (src)
				memcpy(&w, src + i * 8, 8);
			w ^= vmmrt_fill_word(a->seed, i);
			memcpy(dst + i * 8, &w, 8);
		}
		vmmrt__host_sleep_until(t0 + a->ns);
		break;
	case VMMRT_KERNEL_BUSY:
		vmmrt__host_sleep_until(t0 + a->ns);
		break;
	default:
		break; /* rejected at launch */
	}
}

/* CU_STREAM_WAIT_VALUE_GEQ is a cyclic comparison: (int32_t)(*addr - value) >= 0. */
static bool value_reached(const uint32_t *addr, uint32_t value)
{
	uint32_t v = uatomic_read(addr);

	return (int32_t)(v - value) >= 0;
}

static void run_wait_value(vmmrt__backend *b, const struct host_op *op)
{
	uint32_t *addr = op->u.value.addr;
	uint32_t value = op->u.value.value;
	uint64_t poll_ns = 2000;

	for (int i = 0; i < 256; i++) {
		if (value_reached(addr, value))
			goto done;
		caa_cpu_relax();
	}
	/*
	 * A stream's write_value32 broadcasts sync_cond, but a CPU store wakes
	 * nobody, so poll with a backoff capped at 100 us (a CPU write releases a
	 * waiting H200 stream in about 64 us, so this is no slower than the GPU).
	 */
	pthread_mutex_lock(&b->sync_lock);
	while (!value_reached(addr, value) && !b->closing) {
		uint64_t deadline = vmmrt__host_now_ns() + poll_ns;
		struct timespec ts = {
			.tv_sec = (time_t)(deadline / 1000000000ULL),
			.tv_nsec = (long)(deadline % 1000000000ULL),
		};

		pthread_cond_timedwait(&b->sync_cond, &b->sync_lock, &ts);
		if (poll_ns < 100000)
			poll_ns *= 2;
	}
	pthread_mutex_unlock(&b->sync_lock);
done:
	/* the work after the wait must see what the writer wrote before the value */
	cmm_smp_mb();
}

static void run_write_value(vmmrt__backend *b, const struct host_op *op)
{
	/* everything the stream did before is visible before the value, like a GPU fence */
	cmm_smp_mb();
	uatomic_set(op->u.value.addr, op->u.value.value);
	pthread_mutex_lock(&b->sync_lock);
	pthread_cond_broadcast(&b->sync_cond);
	pthread_mutex_unlock(&b->sync_lock);
}

static void run_record(vmmrt__backend *b, vmmrt__bevent *e, uint64_t seq)
{
	uint64_t now = vmmrt__host_now_ns();

	pthread_mutex_lock(&b->sync_lock);
	if (seq > e->done_seq) {
		e->done_seq = seq;
		e->done_ns = now;
	}
	pthread_cond_broadcast(&b->sync_cond);
	pthread_mutex_unlock(&b->sync_lock);
}

static void run_wait_event(vmmrt__backend *b, vmmrt__bevent *e, uint64_t seq)
{
	pthread_mutex_lock(&b->sync_lock);
	while (e->done_seq < seq && !b->closing)
		pthread_cond_wait(&b->sync_cond, &b->sync_lock);
	pthread_mutex_unlock(&b->sync_lock);
}

static void run_op(vmmrt__backend *b, const struct host_op *op, uint64_t seq)
{
	vmmrt__thread_role prev;

	switch (op->kind) {
	case OP_COPY:
		run_copy(b, op);
		break;
	case OP_KERNEL:
		run_kernel(op);
		break;
	case OP_HOST_FN:
		/* the driver's callback thread: any driver call from here is refused */
		prev = vmmrt__thread_role_set(VMMRT_ROLE_HOST_FUNC);
		op->u.host.fn(op->u.host.arg);
		vmmrt__thread_role_set(prev);
		break;
	case OP_RECORD:
		run_record(b, op->u.event, seq);
		break;
	case OP_WAIT_EVENT:
		run_wait_event(b, op->u.event, seq);
		break;
	case OP_WAIT_VALUE:
		run_wait_value(b, op);
		break;
	case OP_WRITE_VALUE:
		run_write_value(b, op);
		break;
	case OP_GRAPH:
		break; /* run_item expands graphs */
	}
}

static void run_item(vmmrt__backend *b, const struct host_item *item)
{
	const vmmrt__bgraph *g;
	size_t j = 0;

	if (item->op.kind != OP_GRAPH) {
		run_op(b, &item->op, item->seq);
		return;
	}
	g = item->op.u.graph;
	for (size_t i = 0; i < g->n && !uatomic_read(&b->closing); i++)
		run_op(b, &g->ops[i], is_event_op(&g->ops[i]) ? item->seqs[j++] : 0);
}

static void item_free(struct host_item *item)
{
	op_release(&item->op);
	free(item->seqs);
	free(item);
}

static void *stream_main(void *arg)
{
	struct vmmrt_stream_s *st = arg;
	vmmrt__backend *b = st->b;
	struct host_item *item;

	/* precise BUSY kernels and copy times without spinning through the default 50 us slack */
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	/* named, so a stack dump or top tells the emulated GPU streams apart */
	pthread_setname_np(pthread_self(), "vmmrt-stream");
	pthread_mutex_lock(&st->lock);
	for (;;) {
		while (!st->head && !st->stop)
			pthread_cond_wait(&st->work_cond, &st->lock);
		item = st->head;
		if (!item)
			break; /* stopped and drained */
		st->head = item->next;
		if (!st->head)
			st->tail = NULL;
		pthread_mutex_unlock(&st->lock);

		/* at close, pending work is discarded rather than run against freed memory */
		if (!uatomic_read(&b->closing))
			run_item(b, item);
		item_free(item);

		pthread_mutex_lock(&st->lock);
		st->completed++;
		pthread_cond_broadcast(&st->idle_cond);
	}
	pthread_mutex_unlock(&st->lock);
	return NULL;
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
static vmmrt_status submit(vmmrt__backend *b, vmmrt_stream s, const struct host_op *op, const char *func)
{
	size_t nseq = op->kind == OP_GRAPH ? op->u.graph->n_event_ops : 0;
	struct host_item *item = calloc(1, sizeof(*item));
	struct vmmrt_stream_s *st;
	vmmrt_status status;

	if (!item || (nseq && !(item->seqs = calloc(nseq, sizeof(uint64_t))))) {
		status = vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: work item", func);
		goto fail;
	}
	st = stream_lock(b, s);
	if (!st) {
		status = unknown_stream(s, func);
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
	op_release(op);
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
	VMMRT_CHECK_ARG(out, "NULL output");
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
	rc = pthread_create(&st->thread, NULL, stream_main, st);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&st->idle_cond);
		pthread_cond_destroy(&st->work_cond);
		pthread_mutex_destroy(&st->lock);
		free(st);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: pthread_create: %s", __func__, strerror(rc));
	}
	pthread_mutex_lock(&b->obj_lock);
	cds_list_add_tail(&st->node, &b->streams);
	pthread_mutex_unlock(&b->obj_lock);
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
		op_release(&st->cap_ops[i]);
	free(st->cap_ops);
	pthread_cond_destroy(&st->idle_cond);
	pthread_cond_destroy(&st->work_cond);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

vmmrt_status vmmrt__host_stream_destroy(vmmrt__backend *b, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;

	if (status != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->obj_lock);
	st = stream_find(b, s);
	if (st)
		cds_list_del(&st->node);
	pthread_mutex_unlock(&b->obj_lock);
	if (!st)
		return unknown_stream(s, __func__);
	stream_stop_free(st);
	return VMMRT_OK;
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
	VMMRT_CHECK_ARG(done, "NULL result");
	vmmrt_status status = lock_idle_stream(b, s, __func__, &st);

	if (status != VMMRT_OK)
		return status;
	*done = st->enqueued == st->completed;
	pthread_mutex_unlock(&st->lock);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_stream_wait_event(vmmrt__backend *b, vmmrt_stream s, vmmrt__bevent *e)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_WAIT_EVENT};

	if (status != VMMRT_OK)
		return status;
	if ((status = event_ref(b, e, __func__)) != VMMRT_OK)
		return status;
	op.u.event = e;
	return submit(b, s, &op, __func__);
}

static vmmrt_status value_op(vmmrt__backend *b, vmmrt_stream s, enum op_kind kind, vmmrt_devptr addr,
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
	return submit(b, s, &op, func);
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
	VMMRT_CHECK_ARG(fn, "NULL function");
	op.u.host.fn = fn;
	op.u.host.arg = arg;
	return submit(b, s, &op, __func__);
}

/* ------------------------------------------------------------------- events */

vmmrt_status vmmrt__host_event_create(vmmrt__backend *b, bool timing, vmmrt__bevent **out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *e;

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(out, "NULL output");
	e = calloc(1, sizeof(*e));
	if (!e)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: event", __func__);
	e->refs = 1;
	e->timing = timing;
	pthread_mutex_lock(&b->obj_lock);
	cds_list_add_tail(&e->node, &b->events);
	pthread_mutex_unlock(&b->obj_lock);
	*out = e;
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_destroy(vmmrt__backend *b, vmmrt__bevent *e)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *found;

	if (status != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->obj_lock);
	found = event_find(b, e);
	if (found)
		cds_list_del(&found->node);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown event %p", __func__, (void *)e);
	/* like cuEventDestroy: pending records and waits keep it alive until they ran */
	event_put(found);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_record(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_RECORD};

	if (status != VMMRT_OK)
		return status;
	if ((status = event_ref(b, e, __func__)) != VMMRT_OK)
		return status;
	op.u.event = e;
	return submit(b, s, &op, __func__);
}

vmmrt_status vmmrt__host_event_query(vmmrt__backend *b, vmmrt__bevent *e, bool *out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *found;
	bool done = false;

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(out, "NULL result");
	pthread_mutex_lock(&b->obj_lock);
	found = event_find(b, e);
	if (found) {
		pthread_mutex_lock(&b->sync_lock);
		done = found->done_seq >= found->record_seq;
		pthread_mutex_unlock(&b->sync_lock);
	}
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown event %p", __func__, (void *)e);
	*out = done;
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_synchronize(vmmrt__backend *b, vmmrt__bevent *e)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	bool done;

	if (status != VMMRT_OK)
		return status;
	if ((status = event_ref(b, e, __func__)) != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->sync_lock);
	{
		uint64_t target = e->record_seq;

		while (e->done_seq < target && !b->closing)
			pthread_cond_wait(&b->sync_cond, &b->sync_lock);
		done = e->done_seq >= target;
	}
	pthread_mutex_unlock(&b->sync_lock);
	event_put(e);
	if (!done)
		return vmmrt__error(VMMRT_E_CANCELLED, "%s: the backend is closing", __func__);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_elapsed_ms(vmmrt__backend *b, vmmrt__bevent *start, vmmrt__bevent *end, float *ms)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *s0, *s1;

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(ms, "NULL output");
	pthread_mutex_lock(&b->obj_lock);
	s0 = event_find(b, start);
	s1 = event_find(b, end);
	if (!s0 || !s1) {
		pthread_mutex_unlock(&b->obj_lock);
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown event %p", __func__,
				   (void *)(s0 ? end : start));
	}
	pthread_mutex_lock(&b->sync_lock);
	if (!s0->timing || !s1->timing)
		status = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: event created without timing", __func__);
	else if (s0->record_seq == 0 || s1->record_seq == 0)
		status = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: event never recorded", __func__);
	else if (s0->done_seq < s0->record_seq || s1->done_seq < s1->record_seq)
		status = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: event not complete", __func__);
	else
		*ms = (float)((double)(int64_t)(s1->done_ns - s0->done_ns) / 1e6);
	pthread_mutex_unlock(&b->sync_lock);
	pthread_mutex_unlock(&b->obj_lock);
	return status;
}

/* ------------------------------------------------------------------- copies */

static vmmrt_status copy_op(vmmrt__backend *b, vmmrt_stream s, void *dst, const void *src, size_t n,
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
	return submit(b, s, &op, func);
}

vmmrt_status vmmrt__host_memcpy_htod_async(vmmrt__backend *b, vmmrt_devptr dst, const void *src, size_t n,
					  vmmrt_stream s)
{
	return copy_op(b, s, (void *)(uintptr_t)dst, src, n, __func__);
}

vmmrt_status vmmrt__host_memcpy_dtoh_async(vmmrt__backend *b, void *dst, vmmrt_devptr src, size_t n, vmmrt_stream s)
{
	return copy_op(b, s, dst, (const void *)(uintptr_t)src, n, __func__);
}

vmmrt_status vmmrt__host_memcpy_dtod_async(vmmrt__backend *b, vmmrt_devptr dst, vmmrt_devptr src, size_t n,
					  vmmrt_stream s)
{
	return copy_op(b, s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, __func__);
}

/* ------------------------------------------------------------------ kernels */

vmmrt_status vmmrt__host_kernel_launch(vmmrt__backend *b, vmmrt_stream s, vmmrt__kernel_id k,
				      const vmmrt__kernel_args *args)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_KERNEL};

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(args, "NULL arguments");
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
	return submit(b, s, &op, __func__);
}

/* ------------------------------------------------------------------- graphs */

vmmrt_status vmmrt__host_begin_capture(vmmrt__backend *b, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;

	if (status != VMMRT_OK)
		return status;
	/* as CUDA: the legacy default stream cannot capture (the per-thread one can) */
	if (s == NULL || s == VMMRT_STREAM_LEGACY)
		return vmmrt__error(VMMRT_E_NOT_SUPPORTED, "%s: the legacy default stream cannot capture a graph",
				    __func__);
	st = stream_lock(b, s);
	if (!st)
		return unknown_stream(s, __func__);
	if (st->capturing)
		status = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: the stream is already capturing", __func__);
	else
		st->capturing = true;
	pthread_mutex_unlock(&st->lock);
	return status;
}

vmmrt_status vmmrt__host_end_capture(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;
	vmmrt__bgraph *g;

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(out, "NULL output");
	g = calloc(1, sizeof(*g));
	if (!g)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: graph", __func__);
	st = stream_lock(b, s);
	if (!st) {
		free(g);
		return unknown_stream(s, __func__);
	}
	if (!st->capturing) {
		pthread_mutex_unlock(&st->lock);
		free(g);
		return vmmrt__error(VMMRT_E_INVALID_STATE, "%s: the stream is not capturing", __func__);
	}
	/* the graph takes the captured ops and the references they hold */
	g->ops = st->cap_ops;
	g->n = st->cap_n;
	st->cap_ops = NULL;
	st->cap_n = st->cap_len = 0;
	st->capturing = false;
	pthread_mutex_unlock(&st->lock);

	for (size_t i = 0; i < g->n; i++)
		g->n_event_ops += is_event_op(&g->ops[i]);
	g->refs = 1;
	pthread_mutex_lock(&b->obj_lock);
	cds_list_add_tail(&g->node, &b->graphs);
	pthread_mutex_unlock(&b->obj_lock);
	*out = g;
	return VMMRT_OK;
}

/* This backend never invalidates a capture (it refuses what CUDA would
 * invalidate it for), so capturing is the one flag begin/end_capture set. */
vmmrt_status vmmrt__host_stream_is_capturing(vmmrt__backend *b, vmmrt_stream s, bool *out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;

	if (status != VMMRT_OK)
		return status;
	VMMRT_CHECK_ARG(out, "NULL output");
	st = stream_lock(b, s);
	if (!st)
		return unknown_stream(s, __func__);
	*out = st->capturing;
	pthread_mutex_unlock(&st->lock);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_graph_launch(vmmrt__backend *b, vmmrt__bgraph *g, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct host_op op = {.kind = OP_GRAPH};
	vmmrt__bgraph *found;

	if (status != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->obj_lock);
	found = graph_find(b, g);
	if (found)
		uatomic_inc(&found->refs);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown graph %p", __func__, (void *)g);
	op.u.graph = found;
	return submit(b, s, &op, __func__);
}

vmmrt_status vmmrt__host_graph_destroy(vmmrt__backend *b, vmmrt__bgraph *g)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bgraph *found;

	if (status != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->obj_lock);
	found = graph_find(b, g);
	if (found)
		cds_list_del(&found->node);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown graph %p", __func__, (void *)g);
	/* like cuGraphExecDestroy: a launch in flight finishes first */
	graph_put(found);
	return VMMRT_OK;
}

/* ------------------------------------------------------------------ closing */

void vmmrt__host_streams_shutdown(vmmrt__backend *b)
{
	struct vmmrt_stream_s *st;
	vmmrt__bgraph *g, *gn;
	vmmrt__bevent *e, *en;

	/* abandon blocked waits and pending work: nothing may outlive close */
	pthread_mutex_lock(&b->sync_lock);
	uatomic_set(&b->closing, true);
	pthread_cond_broadcast(&b->sync_cond);
	pthread_mutex_unlock(&b->sync_lock);

	for (;;) {
		pthread_mutex_lock(&b->obj_lock);
		if (cds_list_empty(&b->streams)) {
			pthread_mutex_unlock(&b->obj_lock);
			break;
		}
		st = cds_list_first_entry(&b->streams, struct vmmrt_stream_s, node);
		cds_list_del(&st->node);
		pthread_mutex_unlock(&b->obj_lock);
		stream_stop_free(st);
	}
	/* graphs hold event references: drop them first */
	pthread_mutex_lock(&b->obj_lock);
	cds_list_for_each_entry_safe(g, gn, &b->graphs, node) {
		cds_list_del(&g->node);
		graph_put(g);
	}
	cds_list_for_each_entry_safe(e, en, &b->events, node) {
		cds_list_del(&e->node);
		event_put(e);
	}
	pthread_mutex_unlock(&b->obj_lock);
}

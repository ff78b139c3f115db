/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's emulated device at work: what a stream thread runs.
 * Items run in FIFO order; a copy is paced as a DMA engine would stream it
 * (latency model), a kernel computes the same bytes as the CUDA kernels, a
 * host function runs with the thread marked as inside one, and records and
 * waits move the events' sequence numbers (host-graph.c says how). A fault
 * in stream work (a copy from an unmapped slot) is a real SIGSEGV, as a GPU
 * fault is fatal to a CUDA context. Also here: the references that queued
 * and captured work holds on events and graphs.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include <urcu/arch.h>
#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "clock.h"

/* ----------------------------------------------------------- references */

void vmmrt__host_event_put(vmmrt__bevent *e)
{
	if (uatomic_add_return(&e->refs, -1) == 0)
		free(e);
}

void vmmrt__host_graph_put(vmmrt__bgraph *g)
{
	if (uatomic_add_return(&g->refs, -1) != 0)
		return;
	for (size_t i = 0; i < g->n; i++)
		vmmrt__host_op_release(&g->ops[i]);
	free(g->ops);
	free(g);
}

void vmmrt__host_op_release(const struct host_op *op)
{
	if (op->kind == OP_RECORD || op->kind == OP_WAIT_EVENT)
		vmmrt__host_event_put(op->u.event);
	else if (op->kind == OP_GRAPH)
		vmmrt__host_graph_put(op->u.graph);
}

bool vmmrt__host_is_event_op(const struct host_op *op)
{
	return op->kind == OP_RECORD || op->kind == OP_WAIT_EVENT;
}

/* ----------------------------------------------------------- running work */

static void run_copy(vmmrt__backend *b, const struct host_op *op)
{
	uint64_t t0 = vmmrt__now_ns();

	if (op->u.copy.n == 0)
		return;
	uatomic_inc(&b->copies_in_flight);
	if (op->u.copy.d2h)
		uatomic_inc(&b->d2h_in_flight);
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
			vmmrt__sleep_until(t0 + (uint64_t)((double)(at + len) / b->cfg.host_copy_gbps));
		}
	}
	if (op->u.copy.d2h)
		uatomic_dec(&b->d2h_in_flight);
	uatomic_dec(&b->copies_in_flight);
}

static void run_kernel(const struct host_op *op)
{
	const vmmrt__kernel_args *a = &op->u.kernel.args;
	uint64_t t0 = vmmrt__now_ns();
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
		vmmrt__sleep_until(t0 + a->ns);
		break;
	case VMMRT_KERNEL_BUSY:
		vmmrt__sleep_until(t0 + a->ns);
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
		struct timespec ts = vmmrt__timespec(vmmrt__now_ns() + poll_ns);

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
	uint64_t now = vmmrt__now_ns();

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
		break; /* vmmrt__host_run_item expands graphs */
	}
}

void vmmrt__host_run_item(vmmrt__backend *b, const struct host_item *item)
{
	const vmmrt__bgraph *g;
	size_t j = 0;

	if (item->op.kind != OP_GRAPH) {
		run_op(b, &item->op, item->seq);
		return;
	}
	g = item->op.u.graph;
	for (size_t i = 0; i < g->n && !uatomic_read(&b->closing); i++)
		run_op(b, &g->ops[i], vmmrt__host_is_event_op(&g->ops[i]) ? item->seqs[j++] : 0);
}

void vmmrt__host_item_free(struct host_item *item)
{
	vmmrt__host_op_release(&item->op);
	free(item->seqs);
	free(item);
}

void *vmmrt__host_stream_main(void *arg)
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
			vmmrt__host_run_item(b, item);
		vmmrt__host_item_free(item);

		pthread_mutex_lock(&st->lock);
		st->completed++;
		pthread_cond_broadcast(&st->idle_cond);
	}
	pthread_mutex_unlock(&st->lock);
	return NULL;
}

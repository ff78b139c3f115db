/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend's events and graphs.
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

#include <stdint.h>
#include <stdlib.h>

#include <urcu/uatomic.h>

#include "backend/host-internal.h"
#include "error.h"

/* ------------------------------------------------------------------- events */

vmmrt_status vmmrt__host_event_create(vmmrt__backend *b, bool timing, vmmrt__bevent **out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *e;

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(out, "NULL output");
	e = calloc(1, sizeof(*e));
	if (!e)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: event", __func__);
	e->refs = 1;
	e->timing = timing;
	vmmrt__host_register(b, &vmmrt__host_events_kind, &e->node);
	*out = e;
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_event_destroy(vmmrt__backend *b, vmmrt__bevent *e)
{
	return vmmrt__host_destroy(b, &vmmrt__host_events_kind, e, __func__);
}

vmmrt_status vmmrt__host_event_record(vmmrt__backend *b, vmmrt__bevent *e, vmmrt_stream s)
{
	return vmmrt__host_event_op(b, s, e, OP_RECORD, __func__);
}

vmmrt_status vmmrt__host_event_query(vmmrt__backend *b, vmmrt__bevent *e, bool *out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	vmmrt__bevent *found;
	bool done = false;

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(out, "NULL result");
	pthread_mutex_lock(&b->obj_lock);
	found = (vmmrt__bevent *)vmmrt__host_lookup(b, &vmmrt__host_events_kind, e);
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
	if ((status = vmmrt__host_event_ref(b, e, __func__)) != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->sync_lock);
	{
		uint64_t target = e->record_seq;

		while (e->done_seq < target && !b->closing)
			pthread_cond_wait(&b->sync_cond, &b->sync_lock);
		done = e->done_seq >= target;
	}
	pthread_mutex_unlock(&b->sync_lock);
	vmmrt__host_event_put(e);
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
	VMMRT__CHECK_ARG(ms, "NULL output");
	pthread_mutex_lock(&b->obj_lock);
	s0 = (vmmrt__bevent *)vmmrt__host_lookup(b, &vmmrt__host_events_kind, start);
	s1 = (vmmrt__bevent *)vmmrt__host_lookup(b, &vmmrt__host_events_kind, end);
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

/* ------------------------------------------------------------------- graphs */

vmmrt_status vmmrt__host_stream_begin_capture(vmmrt__backend *b, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;

	if (status != VMMRT_OK)
		return status;
	/* as CUDA: the legacy default stream cannot capture (the per-thread one can) */
	if (s == NULL || s == VMMRT_STREAM_LEGACY)
		return vmmrt__error(VMMRT_E_NOT_SUPPORTED, "%s: the legacy default stream cannot capture a graph",
				    __func__);
	st = vmmrt__host_stream_lock(b, s);
	if (!st)
		return vmmrt__host_unknown_stream(s, __func__);
	if (st->capturing)
		status = vmmrt__error(VMMRT_E_INVALID_STATE, "%s: the stream is already capturing", __func__);
	else
		st->capturing = true;
	pthread_mutex_unlock(&st->lock);
	return status;
}

vmmrt_status vmmrt__host_stream_end_capture(vmmrt__backend *b, vmmrt_stream s, vmmrt__bgraph **out)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	struct vmmrt_stream_s *st;
	vmmrt__bgraph *g;

	if (status != VMMRT_OK)
		return status;
	VMMRT__CHECK_ARG(out, "NULL output");
	g = calloc(1, sizeof(*g));
	if (!g)
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "%s: graph", __func__);
	st = vmmrt__host_stream_lock(b, s);
	if (!st) {
		free(g);
		return vmmrt__host_unknown_stream(s, __func__);
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
		g->n_event_ops += vmmrt__host_is_event_op(&g->ops[i]);
	g->refs = 1;
	vmmrt__host_register(b, &vmmrt__host_graphs_kind, &g->node);
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
	VMMRT__CHECK_ARG(out, "NULL output");
	st = vmmrt__host_stream_lock(b, s);
	if (!st)
		return vmmrt__host_unknown_stream(s, __func__);
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
	found = (vmmrt__bgraph *)vmmrt__host_lookup(b, &vmmrt__host_graphs_kind, g);
	if (found)
		uatomic_inc(&found->refs);
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "%s: unknown graph %p", __func__, (void *)g);
	op.u.graph = found;
	return vmmrt__host_submit(b, s, &op, __func__);
}

/*
 * The host backend runs no CUDA graph: the only executable graphs it knows
 * are its own (vmmrt_graph_end_capture's), which a test passes by handle.
 */
vmmrt_status vmmrt__host_exec_check(vmmrt__backend *b, uintptr_t exec)
{
	vmmrt_status status = vmmrt__host_enter(b, __func__);
	bool found;

	if (status != VMMRT_OK)
		return status;
	pthread_mutex_lock(&b->obj_lock);
	found = exec != 0 && vmmrt__host_lookup(b, &vmmrt__host_graphs_kind, (void *)exec) != NULL;
	pthread_mutex_unlock(&b->obj_lock);
	if (!found)
		return vmmrt__error(VMMRT_E_NOT_SUPPORTED,
				    "%s: %p is not a graph of this backend (the host backend launches only the "
				    "graphs vmmrt_graph_end_capture made, no CUDA graph)",
				    __func__, (void *)exec);
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_exec_launch(vmmrt__backend *b, uintptr_t exec, vmmrt_stream s)
{
	vmmrt_status status = vmmrt__host_exec_check(b, exec);

	if (status != VMMRT_OK)
		return status;
	return vmmrt__host_graph_launch(b, (vmmrt__bgraph *)exec, s);
}

/* A host graph is its own executable graph. */
vmmrt_status vmmrt__host_graph_exec(vmmrt__backend *b, vmmrt__bgraph *g, uintptr_t *out)
{
	(void)b;
	VMMRT__CHECK_ARG(g != NULL && out != NULL, "NULL graph or output");
	*out = (uintptr_t)g;
	return VMMRT_OK;
}

vmmrt_status vmmrt__host_graph_destroy(vmmrt__backend *b, vmmrt__bgraph *g)
{
	return vmmrt__host_destroy(b, &vmmrt__host_graphs_kind, g, __func__);
}

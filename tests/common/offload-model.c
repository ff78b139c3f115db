/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "offload-model.h"
#include "runtime.h"
#include "testing.h"

#define MAX_ITERS 64

#define MAX_OLD 4

struct model {
	unsigned stale_messages; /* successful hooks that left a message */
	model_cfg cfg;
	vmmrt_runtime *rt;
	vmmrt_stream compute; /* where the graphs are captured */
	vmmrt_stream run;     /* where they are replayed, with the hooks */
	unsigned ng, mb;      /* groups: layers x microbatches */
	vmmrt_group **g;
	vmmrt_graph **fwd, **bwd;
	vmmrt_slot **input, *results;  /* input activation source per microbatch; 8-byte result per group */
	uint64_t *host_results;        /* pinned: [iteration][group] */
	unsigned *use_group;           /* the schedule: 2 ng uses */
	bool *use_bwd;
	unsigned iters;
	bool void_iter[MAX_ITERS];     /* abandoned by an abort: not verified */
	size_t iter_bytes[MAX_ITERS];  /* the activation size it ran with */
	size_t bytes;                  /* the activation size now */
	/* before the last re-discoveries: graphs, their activations, inputs */
	vmmrt_graph **old_bwd[MAX_OLD], **old_fwd[MAX_OLD];
	vmmrt_devptr *old_act[MAX_OLD];
	vmmrt_slot **old_input[MAX_OLD];
	unsigned nold;
	size_t base_used;
	unsigned reported;             /* asynchronous failures the hooks reported */
};

/*
 * A hook reports an earlier asynchronous failure of its group (a map that ran
 * out of memory, say) instead of doing its work; the caller notes it and
 * calls the hook again, as an application would.
 */
#define HOOK(m, x) \
	do { \
		st = (x); \
		if (st == VMMRT_E_OUT_OF_MEMORY) { \
			(m)->reported++; \
			st = (x); \
		} \
		if (st != VMMRT_OK) { \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, vmmrt_last_error()); \
			goto fail; \
		} \
		/* a hook that succeeds leaves no message (a poll is no error) */ \
		if (vmmrt_last_error()[0]) { \
			fprintf(stderr, "%s:%d: %s succeeded but left: %s\n", __FILE__, __LINE__, #x, \
				vmmrt_last_error()); \
			(m)->stale_messages++; \
		} \
	} while (0)

static vmmrt_status opt(vmmrt_options *o, const char *k, const char *v)
{
	vmmrt_status st = vmmrt_options_set(o, k, v);
	if (st != VMMRT_OK)
		fprintf(stderr, "option %s=%s: %s\n", k, v, vmmrt_last_error());
	return st;
}

#define TRY(x) \
	do { \
		st = (x); \
		if (st != VMMRT_OK) { \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, vmmrt_last_error()); \
			goto fail; \
		} \
	} while (0)

/* The order of one iteration (synth_order: afab, 1F1B or interleaved). */
static vmmrt_status make_schedule(model *m)
{
	const model_cfg *c = &m->cfg;
	m->use_group = calloc(2 * m->ng, sizeof(*m->use_group));
	m->use_bwd = calloc(2 * m->ng, sizeof(*m->use_bwd));
	if (!m->use_group || !m->use_bwd)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	synth_order_cfg o = {.schedule = c->schedule, .layers = c->layers, .microbatches = m->mb,
			     .inflight = c->inflight, .chunks = c->chunks, .bwd_order = c->bwd_order};
	return synth_order(&o, m->use_group, m->use_bwd);
}

static vmmrt_status declare(model *m)
{
	vmmrt_status st = synth_declare(m->rt, m->g, m->use_group, m->use_bwd, 2 * m->ng);
	if (st != VMMRT_OK)
		fprintf(stderr, "model: set schedule: %s\n", vmmrt_last_error());
	return st;
}

static vmmrt_tensor_desc act_desc(size_t bytes)
{
	return (vmmrt_tensor_desc){.bytes = bytes, .dtype = 7, .ndim = 1, .shape = {(int64_t)(bytes / 8)},
				   .stride = {1}};
}

/* Inputs, then every group's capture: the graphs only ever see the slot addresses. */
static vmmrt_status capture(model *m)
{
	vmmrt_status st;
	size_t bytes = m->bytes;
	for (unsigned j = 0; j < m->mb; j++) {
		TRY(vmmrt_slot_create(m->rt, bytes, &m->input[j]));
		TRY(vmmrt_slot_map(m->input[j]));
	}
	for (unsigned i = 0; i < m->ng; i++) {
		vmmrt_devptr a;
		vmmrt_tensor_desc d = act_desc(bytes);
		vmmrt_devptr in = vmmrt_slot_address(m->input[i / m->cfg.layers]);
		TRY(vmmrt_group_begin_capture(m->g[i]));
		TRY(vmmrt_group_save(m->g[i], &d, 0, NULL, &a));
		TRY(vmmrt_group_end_capture(m->g[i]));
		/* the synthetic layer (synth.h), its result to a fixed address */
		synth_tensor t = {.act = a, .bytes = bytes, .pattern = 1000 + i,
				  .bwd_sum = vmmrt_slot_address(m->results) + 8 * i};
		synth_layer l = {.input = in, .fwd_ns = m->cfg.fwd_ns, .bwd_ns = m->cfg.bwd_ns, .n = 1, .t = &t};
		TRY(vmmrt_graph_begin_capture(m->rt, m->compute));
		TRY(synth_forward(m->rt, m->compute, &l));
		TRY(vmmrt_graph_end_capture(m->rt, m->compute, &m->fwd[i]));
		TRY(vmmrt_graph_begin_capture(m->rt, m->compute));
		TRY(synth_backward(m->rt, m->compute, &l));
		TRY(vmmrt_graph_end_capture(m->rt, m->compute, &m->bwd[i]));
	}
	return VMMRT_OK;
fail:
	return st;
}

vmmrt_status model_create(const model_cfg *cfg, model **out)
{
	vmmrt_status st;
	vmmrt_options *o = NULL;
	char buf[32];
	model *m = calloc(1, sizeof(*m));
	m->cfg = *cfg;
	m->mb = cfg->microbatches ? cfg->microbatches : 1;
	m->ng = cfg->layers * m->mb;
	m->bytes = cfg->act_bytes;
	unsigned n = m->ng;
	m->g = calloc(n, sizeof(*m->g));
	m->fwd = calloc(n, sizeof(*m->fwd));
	m->bwd = calloc(n, sizeof(*m->bwd));
	m->input = calloc(m->mb, sizeof(*m->input));
	TRY(make_schedule(m));

	TRY(vmmrt_options_create(&o));
	TRY(opt(o, "backend", "host"));
	TRY(opt(o, "mode", cfg->mode));
	snprintf(buf, sizeof(buf), "%u", cfg->lookahead);
	TRY(opt(o, "lookahead", buf));
	snprintf(buf, sizeof(buf), "%u", cfg->workers ? cfg->workers : 1);
	TRY(opt(o, "driver_workers", buf));
	TRY(opt(o, "host_capacity", cfg->capacity ? cfg->capacity : "1G"));
	TRY(opt(o, "host_latency", cfg->latency ? "1" : "0"));
	for (const char *const *kv = cfg->options; kv && kv[0]; kv += 2)
		TRY(opt(o, kv[0], kv[1]));
	TRY(opt(o, "driver_inline", cfg->driver_inline ? "1" : "0"));
	snprintf(buf, sizeof(buf), "%d", cfg->device);
	TRY(opt(o, "device", buf));
	if (cfg->copy_gbps > 0) {
		snprintf(buf, sizeof(buf), "%g", cfg->copy_gbps);
		TRY(opt(o, "host_copy_gbps", buf));
	}
	if (cfg->max_banks) {
		snprintf(buf, sizeof(buf), "%u", cfg->max_banks);
		TRY(opt(o, "max_banks", buf));
	}
	if (cfg->timeout_ms) {
		snprintf(buf, sizeof(buf), "%u", cfg->timeout_ms);
		TRY(opt(o, "timeout_ms", buf));
	}
	TRY(vmmrt_runtime_create(o, &m->rt));
	if (cfg->plant)
		vmmrt__offload_test_plant(m->rt, cfg->plant);
	TRY(vmmrt_stream_create(m->rt, &m->compute));
	m->run = m->compute;
	if (cfg->replay_on) {
		if (!strcmp(cfg->replay_on, "null"))
			m->run = NULL;
		else if (!strcmp(cfg->replay_on, "legacy"))
			m->run = VMMRT_STREAM_LEGACY;
		else if (!strcmp(cfg->replay_on, "per-thread"))
			m->run = VMMRT_STREAM_PER_THREAD;
		else {
			st = VMMRT_E_INVALID_ARGUMENT;
			goto fail;
		}
	}
	{
		size_t f, t;
		TRY(vmmrt_mem_info(m->rt, &f, &t));
		m->base_used = t - f;
	}

	/* Discovery and allocation. */
	for (unsigned i = 0; i < n; i++) {
		char name[24];
		if (m->mb > 1)
			snprintf(name, sizeof(name), "L%u.m%u", i % cfg->layers, i / cfg->layers);
		else
			snprintf(name, sizeof(name), "L%u", i);
		TRY(vmmrt_group_create(m->rt, name, &m->g[i]));
		vmmrt_tensor_desc d = act_desc(cfg->act_bytes);
		TRY(vmmrt_group_discover(m->g[i], &d));
	}
	if (cfg->declare)
		TRY(declare(m));
	TRY(vmmrt_offload_allocate(m->rt));
	TRY(vmmrt_slot_create(m->rt, 8 * n, &m->results));
	TRY(vmmrt_slot_map(m->results));
	TRY(vmmrt_host_alloc(m->rt, sizeof(uint64_t) * n * MAX_ITERS, (void **)&m->host_results));
	memset(m->host_results, 0, sizeof(uint64_t) * n * MAX_ITERS);
	TRY(capture(m));
	vmmrt_options_destroy(o);
	*out = m;
	return VMMRT_OK;
fail:
	vmmrt_options_destroy(o);
	model_destroy(m);
	return st;
}

/* Use k of the schedule: hooks around its graph (begin only, with begin_only). */
static vmmrt_status run_use(model *m, unsigned iter, unsigned k, bool begin_only)
{
	vmmrt_status st;
	unsigned i = m->use_group[k];
	if (m->cfg.one_call && !begin_only) {
		bool b = m->use_bwd[k];
		HOOK(m, vmmrt_group_replay(m->g[i], b, vmmrt__test_graph_exec(m->rt, b ? m->bwd[i] : m->fwd[i]), m->run));
		if (!b)
			return VMMRT_OK;
		goto result;
	}
	if (!m->use_bwd[k]) {
		HOOK(m, vmmrt_forward_begin(m->g[i], m->run));
		TRY(vmmrt_graph_launch(m->rt, m->fwd[i], m->run));
		if (!begin_only)
			HOOK(m, vmmrt_forward_end(m->g[i], m->run));
		return VMMRT_OK;
	}
	HOOK(m, vmmrt_backward_begin(m->g[i], m->run));
	TRY(vmmrt_graph_launch(m->rt, m->bwd[i], m->run));
	if (begin_only)
		return VMMRT_OK;
	HOOK(m, vmmrt_backward_end(m->g[i], m->run));
result:
	/* async, so the launch thread never waits for the GPU */
	TRY(vmmrt__drv_memcpy_dtoh_async(m->rt, &m->host_results[iter * m->ng + i],
					vmmrt_slot_address(m->results) + 8 * i, 8, m->run));
	return VMMRT_OK;
fail:
	return st;
}

static vmmrt_status start_iteration(model *m, unsigned *iter)
{
	vmmrt_status st;
	*iter = m->iters;
	if (*iter >= MAX_ITERS)
		return VMMRT_E_INVALID_ARGUMENT;
	m->iter_bytes[*iter] = m->bytes;
	for (unsigned j = 0; j < m->mb; j++)
		TRY(vmmrt_kernel_fill(m->rt, m->run, vmmrt_slot_address(m->input[j]), m->bytes,
				      (uint64_t)*iter * m->mb + j + 1));
	return VMMRT_OK;
fail:
	return st;
}

vmmrt_status model_run(model *m, unsigned count)
{
	vmmrt_status st;
	for (unsigned it = 0; it < count; it++) {
		unsigned iter;
		if ((st = start_iteration(m, &iter)) != VMMRT_OK)
			return st;
		for (unsigned k = 0; k < 2 * m->ng; k++)
			if ((st = run_use(m, iter, k, false)) != VMMRT_OK)
				return st;
		m->iters++;
	}
	return VMMRT_OK;
}

vmmrt_status model_run_part(model *m, unsigned uses, bool begin_next)
{
	unsigned iter;
	vmmrt_status st = start_iteration(m, &iter);
	if (st != VMMRT_OK)
		return st;
	m->void_iter[iter] = true;
	m->iters++;
	for (unsigned k = 0; k < uses && k < 2 * m->ng; k++)
		if ((st = run_use(m, iter, k, false)) != VMMRT_OK)
			return st;
	if (begin_next && uses < 2 * m->ng)
		st = run_use(m, iter, uses, true);
	return st;
}

vmmrt_status model_abort(model *m)
{
	vmmrt_status st = vmmrt_offload_abort(m->rt);
	if (st != VMMRT_OK)
		fprintf(stderr, "model: abort: %s\n", vmmrt_last_error());
	return st;
}

vmmrt_status model_rediscover(model *m, size_t bytes)
{
	vmmrt_status st;
	if (m->nold == MAX_OLD)
		return VMMRT_E_INVALID_ARGUMENT;
	unsigned o = m->nold++;
	m->old_fwd[o] = m->fwd;
	m->old_bwd[o] = m->bwd;
	m->old_input[o] = m->input;
	m->old_act[o] = calloc(m->ng, sizeof(*m->old_act[o]));
	m->fwd = calloc(m->ng, sizeof(*m->fwd));
	m->bwd = calloc(m->ng, sizeof(*m->bwd));
	m->input = calloc(m->mb, sizeof(*m->input));
	for (unsigned i = 0; i < m->ng; i++) {
		m->old_act[o][i] = vmmrt_group_address(m->g[i]);
		TRY(vmmrt_group_rediscover(m->g[i]));
		vmmrt_tensor_desc d = act_desc(bytes);
		TRY(vmmrt_group_discover(m->g[i], &d));
	}
	if (m->cfg.declare)
		TRY(declare(m));
	TRY(vmmrt_offload_allocate(m->rt));
	m->bytes = bytes;
	TRY(capture(m));
	return VMMRT_OK;
fail:
	return st;
}

vmmrt_graph *model_old_graph(model *m, unsigned i, vmmrt_devptr *act)
{
	if (!m->nold || i >= m->ng)
		return NULL;
	*act = m->old_act[m->nold - 1][i];
	return m->old_bwd[m->nold - 1][i];
}

static void free_graphs(model *m, vmmrt_graph **fwd, vmmrt_graph **bwd, vmmrt_slot **input)
{
	for (unsigned i = 0; i < m->ng; i++) {
		if (fwd && fwd[i])
			vmmrt_graph_destroy(m->rt, fwd[i]);
		if (bwd && bwd[i])
			vmmrt_graph_destroy(m->rt, bwd[i]);
	}
	for (unsigned j = 0; input && j < m->mb; j++)
		if (input[j])
			vmmrt_slot_destroy(input[j]);
	free(fwd);
	free(bwd);
	free(input);
}

vmmrt_status model_release_old(model *m)
{
	vmmrt_status st = vmmrt_stream_synchronize(m->rt, m->run);
	for (unsigned o = 0; o < m->nold; o++) {
		free_graphs(m, m->old_fwd[o], m->old_bwd[o], m->old_input[o]);
		free(m->old_act[o]);
	}
	m->nold = 0;
	if (st == VMMRT_OK)
		st = vmmrt_offload_release_retired(m->rt);
	return st;
}

unsigned model_verify(model *m, unsigned *checked)
{
	unsigned bad = 0;
	size_t most = 0;
	for (unsigned it = 0; it < m->iters; it++)
		most = m->iter_bytes[it] > most ? m->iter_bytes[it] : most;
	uint64_t *act = malloc(most ? most : 8);
	vmmrt_status sst = vmmrt_offload_sync(m->rt);
	if (sst == VMMRT_E_OUT_OF_MEMORY) { /* reported, like the hooks do: note it, sync again */
		m->reported++;
		sst = vmmrt_offload_sync(m->rt);
	}
	if (sst != VMMRT_OK || vmmrt_stream_synchronize(m->rt, m->run) != VMMRT_OK) {
		fprintf(stderr, "verify: sync failed: %s\n", vmmrt_last_error());
		bad++;
	}
	*checked = 0;
	for (unsigned it = 0; it < m->iters; it++) {
		if (m->void_iter[it])
			continue;
		size_t words = m->iter_bytes[it] / 8;
		for (unsigned i = 0; i < m->ng; i++) {
			uint64_t seed = (uint64_t)it * m->mb + i / m->cfg.layers + 1;
			for (size_t w = 0; w < words; w++)
				act[w] = vmmrt_fill_word(seed, w) ^ vmmrt_fill_word(1000 + i, w);
			uint64_t want = vmmrt_checksum_host(act, m->iter_bytes[it]);
			(*checked)++;
			if (m->host_results[it * m->ng + i] != want)
				bad++;
		}
	}
	free(act);
	return bad;
}

vmmrt_runtime *model_runtime(model *m)
{
	return m->rt;
}

unsigned model_stale_messages(model *m)
{
	return m->stale_messages;
}

unsigned model_reported(model *m)
{
	return m->reported;
}

size_t model_base_used(model *m)
{
	return m->base_used;
}

vmmrt_group *model_group(model *m, unsigned layer)
{
	return m->g[layer];
}

unsigned model_groups(model *m)
{
	return m->ng;
}

unsigned model_uses(model *m, const unsigned **group, const bool **bwd)
{
	*group = m->use_group;
	*bwd = m->use_bwd;
	return 2 * m->ng;
}

void model_destroy(model *m)
{
	if (!m)
		return;
	if (m->rt) {
		if (m->compute)
			(void)vmmrt_stream_synchronize(m->rt, m->compute);
		if (m->run != m->compute)
			(void)vmmrt_stream_synchronize(m->rt, m->run);
		free_graphs(m, m->fwd, m->bwd, m->input);
		m->fwd = m->bwd = NULL;
		m->input = NULL;
		for (unsigned o = 0; o < m->nold; o++) {
			free_graphs(m, m->old_fwd[o], m->old_bwd[o], m->old_input[o]);
			free(m->old_act[o]);
		}
		if (m->host_results)
			vmmrt_host_free(m->rt, m->host_results);
		if (m->compute)
			vmmrt_stream_destroy(m->rt, m->compute);
		if (vmmrt_runtime_destroy(m->rt) != VMMRT_OK)
			fprintf(stderr, "model: runtime destroy: %s\n", vmmrt_last_error());
	}
	free(m->g);
	free(m->fwd);
	free(m->bwd);
	free(m->input);
	free(m->use_group);
	free(m->use_bwd);
	free(m);
}

void *model_job_run(void *arg)
{
	model_job *j = arg;
	model *m;
	j->st = model_create(&j->cfg, &m);
	if (j->st != VMMRT_OK)
		return NULL;
	j->st = model_run(m, j->iterations);
	j->bad = model_verify(m, &j->checked);
	model_destroy(m);
	return NULL;
}

unsigned model_jobs_run(model_job *jobs, unsigned n)
{
	pthread_t t[16];
	unsigned failed = 0;
	if (n > 16)
		return n;
	for (unsigned i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, model_job_run, &jobs[i]) != 0)
			return n;
	for (unsigned i = 0; i < n; i++) {
		model_job *j = &jobs[i];
		pthread_join(t[i], NULL);
		unsigned groups = j->cfg.layers * (j->cfg.microbatches ? j->cfg.microbatches : 1);
		if (j->st != VMMRT_OK || j->bad || j->checked != j->iterations * groups) {
			fprintf(stderr, "model job %u (%s): %s, %u of %u activations corrupted\n", i, j->cfg.mode,
				vmmrt_status_name(j->st), j->bad, j->checked);
			failed++;
		}
	}
	return failed;
}

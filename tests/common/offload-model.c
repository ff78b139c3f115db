/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload-model.h"
#include "runtime.h"

#define MAX_ITERS 64

struct model {
	unsigned stale_messages; /* successful hooks that left a message */
	model_cfg cfg;
	vmmrt_runtime *rt;
	vmmrt_stream compute; /* where the graphs are captured */
	vmmrt_stream run;     /* where they are replayed, with the hooks */
	vmmrt_group **g;
	vmmrt_graph **fwd, **bwd;
	vmmrt_slot *input, *results;   /* input activation source; 8-byte result per layer */
	uint64_t *host_results;        /* pinned: [iteration][layer] */
	unsigned iters;
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

vmmrt_status model_create(const model_cfg *cfg, model **out)
{
	vmmrt_status st;
	vmmrt_options *o = NULL;
	char buf[32];
	model *m = calloc(1, sizeof(*m));
	m->cfg = *cfg;
	unsigned n = cfg->layers;
	m->g = calloc(n, sizeof(*m->g));
	m->fwd = calloc(n, sizeof(*m->fwd));
	m->bwd = calloc(n, sizeof(*m->bwd));

	TRY(vmmrt_options_create(&o));
	TRY(opt(o, "backend", "host"));
	TRY(opt(o, "mode", cfg->mode));
	snprintf(buf, sizeof(buf), "%u", cfg->lookahead);
	TRY(opt(o, "lookahead", buf));
	snprintf(buf, sizeof(buf), "%u", cfg->workers ? cfg->workers : 1);
	TRY(opt(o, "driver_workers", buf));
	TRY(opt(o, "host_capacity", cfg->capacity ? cfg->capacity : "1G"));
	TRY(opt(o, "host_latency", cfg->latency ? "1" : "0"));
	TRY(opt(o, "driver_inline", cfg->driver_inline ? "1" : "0"));
	snprintf(buf, sizeof(buf), "%d", cfg->device);
	TRY(opt(o, "device", buf));
	if (cfg->copy_gbps > 0) {
		snprintf(buf, sizeof(buf), "%g", cfg->copy_gbps);
		TRY(opt(o, "host_copy_gbps", buf));
	}
	TRY(vmmrt_runtime_create(o, &m->rt));
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
		char name[16];
		snprintf(name, sizeof(name), "L%u", i);
		TRY(vmmrt_group_create(m->rt, name, &m->g[i]));
		vmmrt_tensor_desc d = {.bytes = cfg->act_bytes, .dtype = 7, .ndim = 1,
				       .shape = {(int64_t)(cfg->act_bytes / 8)}, .stride = {1}};
		TRY(vmmrt_group_discover(m->g[i], &d));
	}
	TRY(vmmrt_offload_allocate(m->rt));

	/* Capture: the graphs only ever see the slot addresses. */
	TRY(vmmrt_slot_create(m->rt, cfg->act_bytes, &m->input));
	TRY(vmmrt_slot_map(m->input));
	TRY(vmmrt_slot_create(m->rt, 8 * n, &m->results));
	TRY(vmmrt_slot_map(m->results));
	TRY(vmmrt_host_alloc(m->rt, sizeof(uint64_t) * n * MAX_ITERS, (void **)&m->host_results));
	memset(m->host_results, 0, sizeof(uint64_t) * n * MAX_ITERS);
	for (unsigned i = 0; i < n; i++) {
		vmmrt_devptr a;
		vmmrt_tensor_desc d = {.bytes = cfg->act_bytes, .dtype = 7, .ndim = 1,
				       .shape = {(int64_t)(cfg->act_bytes / 8)}, .stride = {1}};
		TRY(vmmrt_group_begin_capture(m->g[i]));
		TRY(vmmrt_group_save(m->g[i], &d, 0, NULL, &a));
		TRY(vmmrt_group_end_capture(m->g[i]));
		/* forward: act = input ^ pattern(layer), lasting fwd_ns */
		TRY(vmmrt_graph_begin_capture(m->rt, m->compute));
		TRY(vmmrt_kernel_layer(m->rt, m->compute, a, vmmrt_slot_address(m->input), cfg->act_bytes,
				       1000 + i, cfg->fwd_ns));
		TRY(vmmrt_graph_end_capture(m->rt, m->compute, &m->fwd[i]));
		/* backward: compute first, then read the activation (so an early
		 * overwrite by a restore would be seen), result to a fixed address */
		TRY(vmmrt_graph_begin_capture(m->rt, m->compute));
		TRY(vmmrt_kernel_busy(m->rt, m->compute, cfg->bwd_ns));
		TRY(vmmrt_kernel_checksum(m->rt, m->compute, a, cfg->act_bytes,
					  vmmrt_slot_address(m->results) + 8 * i));
		TRY(vmmrt_graph_end_capture(m->rt, m->compute, &m->bwd[i]));
	}
	vmmrt_options_destroy(o);
	*out = m;
	return VMMRT_OK;
fail:
	vmmrt_options_destroy(o);
	model_destroy(m);
	return st;
}

vmmrt_status model_run(model *m, unsigned count)
{
	vmmrt_status st;
	unsigned n = m->cfg.layers;
	for (unsigned it = 0; it < count; it++) {
		unsigned iter = m->iters;
		if (iter >= MAX_ITERS)
			return VMMRT_E_INVALID_ARGUMENT;
		TRY(vmmrt_kernel_fill(m->rt, m->run, vmmrt_slot_address(m->input), m->cfg.act_bytes, iter + 1));
		for (unsigned i = 0; i < n; i++) {
			HOOK(m, vmmrt_forward_begin(m->g[i], m->run));
			TRY(vmmrt_graph_launch(m->rt, m->fwd[i], m->run));
			HOOK(m, vmmrt_forward_end(m->g[i], m->run));
		}
		for (unsigned k = 0; k < n; k++) {
			unsigned i = m->cfg.bwd_order ? m->cfg.bwd_order[k] : n - 1 - k;
			HOOK(m, vmmrt_backward_begin(m->g[i], m->run));
			TRY(vmmrt_graph_launch(m->rt, m->bwd[i], m->run));
			HOOK(m, vmmrt_backward_end(m->g[i], m->run));
			/* async, so the launch thread never waits for the GPU */
			TRY(vmmrt__drv_memcpy_dtoh_async(m->rt, &m->host_results[iter * n + i],
							vmmrt_slot_address(m->results) + 8 * i, 8, m->run));
		}
		m->iters++;
	}
	return VMMRT_OK;
fail:
	return st;
}

unsigned model_verify(model *m, unsigned *checked)
{
	unsigned n = m->cfg.layers, bad = 0;
	size_t words = m->cfg.act_bytes / 8;
	uint64_t *act = malloc(m->cfg.act_bytes);
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
		for (unsigned i = 0; i < n; i++) {
			for (size_t w = 0; w < words; w++)
				act[w] = vmmrt_fill_word(it + 1, w) ^ vmmrt_fill_word(1000 + i, w);
			uint64_t want = vmmrt_checksum_host(act, m->cfg.act_bytes);
			(*checked)++;
			if (m->host_results[it * n + i] != want)
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

void model_destroy(model *m)
{
	if (!m)
		return;
	if (m->rt) {
		if (m->compute)
			(void)vmmrt_stream_synchronize(m->rt, m->compute);
		if (m->run != m->compute)
			(void)vmmrt_stream_synchronize(m->rt, m->run);
		for (unsigned i = 0; i < m->cfg.layers; i++) {
			if (m->fwd[i])
				vmmrt_graph_destroy(m->rt, m->fwd[i]);
			if (m->bwd[i])
				vmmrt_graph_destroy(m->rt, m->bwd[i]);
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
		if (j->st != VMMRT_OK || j->bad || j->checked != j->iterations * j->cfg.layers) {
			fprintf(stderr, "model job %u (%s): %s, %u of %u activations corrupted\n", i, j->cfg.mode,
				vmmrt_status_name(j->st), j->bad, j->checked);
			failed++;
		}
	}
	return failed;
}

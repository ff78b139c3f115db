/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* The synthetic model's order and layers (synth.h). */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "model/synth.h"

typedef struct order {
	unsigned *group;
	bool *bwd;
	unsigned k;
} order;

static void add_use(order *o, unsigned g, bool b)
{
	o->group[o->k] = g;
	o->bwd[o->k] = b;
	o->k++;
}

/* A unit's layers: its chunk's, ascending for the forward, descending for the backward. */
static void add_unit(order *o, unsigned layers, unsigned per, unsigned chunk, unsigned mb, bool b)
{
	for (unsigned j = 0; j < per; j++) {
		unsigned l = chunk * per + (b ? per - 1 - j : j);
		add_use(o, mb * layers + l, b);
	}
}

/*
 * 1F1B and interleaved are one rule over units (a chunk of one microbatch):
 * units in Megatron's order (blocks of `inflight` microbatches through chunk
 * 0, then chunk 1, ...; backwards from the last chunk), warm-up forwards
 * until chunks x inflight units are in flight, then one backward and one
 * forward, then the remaining backwards.
 */
vmmrt_status synth_order(const synth_order_cfg *c, unsigned *group, bool *bwd)
{
	unsigned L = c->layers, M = c->microbatches ? c->microbatches : 1, ng = L * M;
	order o = {group, bwd, 0};
	if (!c->schedule || !strcmp(c->schedule, "afab")) {
		for (unsigned j = 0; j < ng; j++)
			add_use(&o, c->fwd_order ? c->fwd_order[j] : j, false);
		for (unsigned j = 0; j < ng; j++)
			add_use(&o, c->bwd_order ? c->bwd_order[j] : ng - 1 - j, true);
		return VMMRT_OK;
	}
	bool inter = !strcmp(c->schedule, "interleaved");
	if (!inter && strcmp(c->schedule, "1f1b"))
		return VMMRT_E_INVALID_ARGUMENT;
	unsigned v = inter && c->chunks ? c->chunks : 1, p = c->inflight ? c->inflight : 1;
	if (L % v || (inter && M % p))
		return VMMRT_E_INVALID_ARGUMENT;
	unsigned units = M * v, warm = v * p < units ? v * p : units;
#define UNIT_MB(i) (((i) / (p * v)) * p + (i) % p)
#define UNIT_CHUNK(i, back) ((back) ? v - 1 - ((i) / p) % v : ((i) / p) % v)
	if (!inter) { /* plain 1F1B: a unit is a microbatch, in order */
		for (unsigned i = 0; i < warm; i++)
			add_unit(&o, L, L, 0, i, false);
		for (unsigned i = 0; i < units; i++) {
			add_unit(&o, L, L, 0, i, true);
			if (warm + i < units)
				add_unit(&o, L, L, 0, warm + i, false);
		}
		return VMMRT_OK;
	}
	for (unsigned i = 0; i < warm; i++)
		add_unit(&o, L, L / v, UNIT_CHUNK(i, false), UNIT_MB(i), false);
	for (unsigned i = 0; i < units; i++) {
		add_unit(&o, L, L / v, UNIT_CHUNK(i, true), UNIT_MB(i), true);
		if (warm + i < units)
			add_unit(&o, L, L / v, UNIT_CHUNK(warm + i, false), UNIT_MB(warm + i), false);
	}
#undef UNIT_MB
#undef UNIT_CHUNK
	return VMMRT_OK;
}

vmmrt_status synth_declare(vmmrt_runtime *rt, vmmrt_group *const *groups, const unsigned *group, const bool *bwd,
			   unsigned n)
{
	vmmrt_schedule_step *steps = calloc(n ? n : 1, sizeof(*steps));
	if (!steps)
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	unsigned kept = 0;
	for (unsigned k = 0; k < n; k++)
		if (groups[group[k]])
			steps[kept++] = (vmmrt_schedule_step){groups[group[k]], bwd[k]};
	vmmrt_status st = vmmrt_offload_set_schedule(rt, steps, kept);
	free(steps);
	return st;
}

static vmmrt_status direct_layer(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr dst, vmmrt_devptr src,
				 size_t bytes, uint64_t pattern, uint64_t ns)
{
	(void)ctx;
	return vmmrt_kernel_layer(rt, s, dst, src, bytes, pattern, ns);
}

static vmmrt_status direct_checksum(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr src, size_t bytes,
				    vmmrt_devptr result)
{
	(void)ctx;
	return vmmrt_kernel_checksum(rt, s, src, bytes, result);
}

static vmmrt_status direct_busy(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, uint64_t ns)
{
	(void)ctx;
	return vmmrt_kernel_busy(rt, s, ns);
}

const synth_ops synth_direct = {direct_layer, direct_checksum, direct_busy};

vmmrt_status synth_forward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l)
{
	const synth_ops *o = l->ops ? l->ops : &synth_direct;
	vmmrt_status st = VMMRT_OK;
	for (unsigned k = 0; k < l->n && st == VMMRT_OK; k++) {
		const synth_tensor *t = &l->t[k];
		st = o->layer(l->ctx, rt, s, t->act, l->input, t->bytes, t->pattern, l->fwd_ns / l->n);
		if (st == VMMRT_OK && t->fwd_sum)
			st = o->checksum(l->ctx, rt, s, t->act, t->bytes, t->fwd_sum);
	}
	return st;
}

vmmrt_status synth_backward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l)
{
	const synth_ops *o = l->ops ? l->ops : &synth_direct;
	vmmrt_status st = l->bwd_ns ? o->busy(l->ctx, rt, s, l->bwd_ns) : VMMRT_OK;
	for (unsigned k = 0; k < l->n && st == VMMRT_OK; k++)
		st = o->checksum(l->ctx, rt, s, l->t[k].act, l->t[k].bytes, l->t[k].bwd_sum);
	return st;
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A scenario's captures: each group's tensors saved (drifted saves refused),
 * and its graphs, the synthetic model's layer (tools/model/synth.h) with every
 * library call accounted for. */
#include "config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "driver.h"
#include "model/synth.h"
#include "offload.h"
#include "runtime.h"
#include "worker.h"

#include "scenario.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

/* A descriptor that differs from discovery in one field. */
static void drift(trng *r, vmmrt_tensor_desc *d)
{
	switch (rnd(r) % 6) {
	case 0: d->bytes += 8; break;
	case 1: d->dtype ^= 1; break;
	case 2: d->ndim = d->ndim % VMMRT_MAX_DIMS + 1; break;
	case 3: d->shape[0]++; break;
	case 4: d->stride[0]++; break;
	default: d->align = (d->align ? d->align : 256) * 2; break;
	}
}

/* begin / save each tensor (with drifted saves refused) / end; addresses checked. */
bool s_capture_group(scen *s, grp *g, bool again)
{
	vmmrt_devptr a;
	trng *r = &s->r;
	if (!s_ok(s, API(s, "vmmrt_group_begin_capture", vmmrt_group_begin_capture(g->g)), "vmmrt_group_begin_capture"))
		return false;
	if (g->nt && chance(r, 0.2)) {
		/* Hooks on a capturing group are refused. */
		s_expect(s, API(s, "vmmrt_forward_begin", vmmrt_forward_begin(g->g, s->compute)), VMMRT_E_INVALID_STATE,
			 "vmmrt_forward_begin on a capturing group");
	}
	for (unsigned k = 0; k < g->nt && !s->errored; k++) {
		tens *t = &g->t[k];
		if (chance(r, 0.15)) {
			vmmrt_tensor_desc d = t->d;
			drift(r, &d);
			s_expect(s, API(s, "vmmrt_group_save", vmmrt_group_save(g->g, &d, 0, NULL, &a)), VMMRT_E_MISMATCH,
				 "vmmrt_group_save with a drifted descriptor");
		}
		if (k + 1 == g->nt && chance(r, 0.1)) {
			/* Ending before the last save: refused, and the group needs a new capture. */
			s_expect(s, API(s, "vmmrt_group_end_capture", vmmrt_group_end_capture(g->g)), VMMRT_E_MISMATCH,
				 "vmmrt_group_end_capture with a tensor missing");
			if (s->errored)
				return false;
			return s_capture_group(s, g, again);
		}
		/* A copy source on the first capture, sometimes: a device-to-device copy into the slot. */
		bool copy = !again && chance(r, 0.3) && t->d.bytes <= s->input_bytes;
		vmmrt_status st = API(s, "vmmrt_group_save",
				      vmmrt_group_save(g->g, &t->d, copy ? vmmrt_slot_address(s->input) : 0,
						       copy ? s->compute : NULL, &a));
		if (!s_ok(s, st, "vmmrt_group_save"))
			return false;
		size_t al = t->d.align ? t->d.align : 256;
		if (a < g->base || a + t->d.bytes > g->base + g->bytes || a % al)
			t_fail(s->seed, "address",
			       "group %s tensor %u: address 0x%llx is outside [0x%llx, +%zu) or not aligned to %zu",
			       g->name, k, (unsigned long long)a, (unsigned long long)g->base, g->bytes, al);
		if (again && a != t->addr)
			t_fail(s->seed, "moved", "group %s tensor %u: captured again at 0x%llx, was 0x%llx", g->name, k,
			       (unsigned long long)a, (unsigned long long)t->addr);
		t->addr = a;
	}
	if (s->errored)
		return false;
	if (g->nt && chance(r, 0.1))
		s_expect(s, API(s, "vmmrt_group_save", vmmrt_group_save(g->g, &g->t[0].d, 0, NULL, &a)), VMMRT_E_MISMATCH,
			 "vmmrt_group_save past the last tensor");
	if (!s_ok(s, API(s, "vmmrt_group_end_capture", vmmrt_group_end_capture(g->g)), "vmmrt_group_end_capture"))
		return false;
	/* FAILED is legal: a map or release of an earlier iteration, retrying
	 * on a worker under an injected fault, reported meanwhile. The group's
	 * error must then name it (s_ok checks that, and that a fault explains it). */
	vmmrt_group_state gs = vmmrt_group_get_state(g->g);
	if (gs == VMMRT_GROUP_FAILED && !s->errored &&
	    s_ok(s, API(s, "vmmrt_group_error", vmmrt_group_error(g->g)), "vmmrt_group_error"))
		t_fail(s->seed, "state", "group %s: FAILED after capture, but vmmrt_group_error says nothing", g->name);
	else if (gs != VMMRT_GROUP_READY && gs != VMMRT_GROUP_FAILED && !s->errored)
		t_fail(s->seed, "state", "group %s: state %d after capture", g->name, (int)gs);
	return true;
}

/* A graph capture that failed half-way leaves the stream capturing: end it quietly. */
static void abandon_capture(scen *s)
{
	vmmrt_graph *gr = NULL;
	s_quiet(s, true);
	if (API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(s->rt, s->compute, &gr)) == VMMRT_OK)
		(void)API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(s->rt, gr));
	s_quiet(s, false);
}

/* The layer's library calls, each accounted for as any other of the
 * scenario's (s_ok: a failure must be named and explained). */
static vmmrt_status op_layer(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, vmmrt_devptr dst, vmmrt_devptr src,
			     size_t bytes, uint64_t pattern, uint64_t ns)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_layer", vmmrt_kernel_layer(rt, st, dst, src, bytes, pattern, ns));
	(void)s_ok(s, r, "vmmrt_kernel_layer");
	return r;
}

static vmmrt_status op_checksum(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, vmmrt_devptr src, size_t bytes,
				vmmrt_devptr result)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_checksum", vmmrt_kernel_checksum(rt, st, src, bytes, result));
	(void)s_ok(s, r, "vmmrt_kernel_checksum");
	return r;
}

static vmmrt_status op_busy(void *ctx, vmmrt_runtime *rt, vmmrt_stream st, uint64_t ns)
{
	scen *s = ctx;
	vmmrt_status r = API(s, "vmmrt_kernel_busy", vmmrt_kernel_busy(rt, st, ns));
	(void)s_ok(s, r, "vmmrt_kernel_busy");
	return r;
}

static const synth_ops scenario_ops = {op_layer, op_checksum, op_busy};

/* The group as the synthetic model's layer (synth.h): a tensor each, every
 * backward's checksum to the tensor's word of the result slot. */
static synth_layer as_layer(scen *s, const grp *g, synth_tensor *t)
{
	for (unsigned k = 0; k < g->nt; k++)
		t[k] = (synth_tensor){.act = g->t[k].addr, .bytes = g->t[k].d.bytes, .pattern = g->t[k].seed,
				      .bwd_sum = vmmrt_slot_address(s->results) + 8 * g->t[k].rix};
	return (synth_layer){.input = vmmrt_slot_address(s->input), .fwd_ns = s->fwd_ns, .bwd_ns = s->bwd_ns,
			     .n = g->nt, .t = t, .ops = &scenario_ops, .ctx = s};
}

/* One graph of the layer: its forward's or its backward's. */
static bool capture_graph(scen *s, const synth_layer *l, bool bwd, vmmrt_graph **out)
{
	vmmrt_runtime *rt = s->rt;
	if (!s_ok(s, API(s, "vmmrt_graph_begin_capture", vmmrt_graph_begin_capture(rt, s->compute)),
		  "vmmrt_graph_begin_capture"))
		return false;
	if ((bwd ? synth_backward : synth_forward)(rt, s->compute, l) != VMMRT_OK) {
		abandon_capture(s);
		return false;
	}
	if (!s_ok(s, API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(rt, s->compute, out)),
		  "vmmrt_graph_end_capture")) {
		*out = NULL;
		abandon_capture(s);
		return false;
	}
	return true;
}

bool s_capture_graphs(scen *s, grp *g)
{
	synth_tensor t[MAXT];
	if (!g->nt)
		return true;
	synth_layer l = as_layer(s, g, t);
	return capture_graph(s, &l, false, &g->fwd) && capture_graph(s, &l, true, &g->bwd);
}

bool s_capture(scen *s)
{
	for (unsigned i = 0; i < s->ng; i++)
		if (!s_capture_group(s, &s->G[i], false) || !s_capture_graphs(s, &s->G[i]))
			return false;
	s->captured = true;
	return true;
}


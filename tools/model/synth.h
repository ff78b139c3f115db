/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The synthetic model that the offload tests (tests/common/offload-model.c),
 * vmmrt-bench (tools/bench/modes.c) and vmmrt-torture
 * (tools/torture/scenario.c) run, in one place: the order of an iteration's
 * uses, its declaration to the library, and what a layer's graphs do.
 *
 * A group per (layer, microbatch): group m * layers + l is layer l of
 * microbatch m. Forward of a layer: act = input ^ pattern, lasting fwd_ns
 * (then, if asked, a checksum of act); backward: busy for bwd_ns first, so
 * that a restore landing late or overwriting early is seen, then a checksum
 * of the activation it reads. The host knows every checksum
 * (vmmrt_layer_checksum_host). Public API only: the bench links libvmmrt.so.
 */
#ifndef VMMRT__TOOLS_SYNTH_H
#define VMMRT__TOOLS_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "vmmrt.h"

typedef struct synth_order_cfg {
	/* NULL or "afab": every forward, then every backward; "1f1b":
	 * `inflight` microbatches' forwards, then one backward and one
	 * forward, then the last backwards; "interleaved": the layers in
	 * `chunks` model chunks, microbatches in blocks of `inflight`
	 * (Megatron's interleaved order on one stage). */
	const char *schedule;
	unsigned layers, microbatches; /* microbatches 0: 1 */
	unsigned inflight, chunks;     /* 0: 1 */
	/* afab: the forwards' and the backwards' order of the groups (NULL:
	 * ascending, and its reverse) */
	const unsigned *fwd_order, *bwd_order;
} synth_order_cfg;

/* The 2 x layers x microbatches uses of an iteration: use k is group[k], its
 * backward if bwd[k]. VMMRT_E_INVALID_ARGUMENT for a schedule it does not
 * know, or layers and microbatches it cannot split into chunks and blocks. */
vmmrt_status synth_order(const synth_order_cfg *c, unsigned *group, bool *bwd);

/* vmmrt_offload_set_schedule of the n uses, groups[group[k]] each; a NULL
 * group (one with no tensors) is left out. */
vmmrt_status synth_declare(vmmrt_runtime *rt, vmmrt_group *const *groups, const unsigned *group, const bool *bwd,
			   unsigned n);

typedef struct synth_layer {
	vmmrt_devptr act, input; /* the activation, and what it is derived from */
	size_t bytes;
	uint64_t pattern;        /* 1000 + the layer's index, by convention */
	uint64_t fwd_ns, bwd_ns;
	vmmrt_devptr fwd_sum;    /* 0: no checksum after the forward */
	vmmrt_devptr bwd_sum;
} synth_layer;

/* Enqueue the layer's forward (backward) on s: launched, or captured when s
 * is capturing. The first failure is returned, the rest not enqueued. */
vmmrt_status synth_forward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l);
vmmrt_status synth_backward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l);

#endif

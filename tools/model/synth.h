/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The synthetic model that the offload tests (tests/common/offload-model.c),
 * vmmrt-bench (tools/bench/modes.c) and vmmrt-torture
 * (tools/torture/capture.c) run, in one place: the order of an iteration's
 * uses, its declaration to the library, and what a layer's graphs do.
 *
 * A group per (layer, microbatch): group m * layers + l is layer l of
 * microbatch m. Forward of a layer: act = input ^ pattern, lasting fwd_ns
 * (then, if asked, a checksum of act); backward: busy for bwd_ns first (if
 * not 0), so that a restore landing late or overwriting early is seen, then
 * a checksum of the activation it reads. The host knows every checksum
 * (vmmrt_layer_checksum_host). A layer may hold several activations (the
 * torture's groups do). Public API only: the bench links libvmmrt.so.
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

/*
 * Every library call a layer's graphs are made of goes through these, so
 * that a caller can account for each one: vmmrt-torture marks its progress,
 * counts it and checks a failure against the faults it injected. A call that
 * fails ends the layer's forward (backward): its status is returned, nothing
 * after it enqueued. synth_direct calls the library and nothing else.
 */
typedef struct synth_ops {
	vmmrt_status (*layer)(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr dst, vmmrt_devptr src,
			      size_t bytes, uint64_t pattern, uint64_t ns);
	vmmrt_status (*checksum)(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, vmmrt_devptr src, size_t bytes,
				 vmmrt_devptr result);
	vmmrt_status (*busy)(void *ctx, vmmrt_runtime *rt, vmmrt_stream s, uint64_t ns);
} synth_ops;

extern const synth_ops synth_direct;

/* One activation of a layer. */
typedef struct synth_tensor {
	vmmrt_devptr act;
	size_t bytes;
	uint64_t pattern;        /* 1000 + the layer's index, by convention */
	vmmrt_devptr fwd_sum;    /* 0: no checksum after its forward */
	vmmrt_devptr bwd_sum;
} synth_tensor;

/* A layer: its n activations, all derived from one input. */
typedef struct synth_layer {
	vmmrt_devptr input;
	uint64_t fwd_ns;         /* the forward's time, split evenly over the tensors */
	uint64_t bwd_ns;         /* the backward's, before its checksums (0: no busy kernel) */
	unsigned n;
	const synth_tensor *t;
	const synth_ops *ops;    /* NULL: synth_direct */
	void *ctx;               /* the ops' first argument */
} synth_layer;

/* Enqueue the layer's forward (each tensor in turn: act = input ^ pattern,
 * then its fwd_sum) or backward (busy, then each tensor's bwd_sum) on s:
 * launched, or captured when s is capturing. */
vmmrt_status synth_forward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l);
vmmrt_status synth_backward(vmmrt_runtime *rt, vmmrt_stream s, const synth_layer *l);

#endif

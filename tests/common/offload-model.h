/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A synthetic model for the offload tests: n layers, each with one group
 * whose forward graph writes an activation derived from the iteration's input
 * and whose backward graph checks it. Every restored activation is verified
 * against a checksum computed on the host, per iteration and per layer.
 */
#ifndef VMMRT__TEST_OFFLOAD_MODEL_H
#define VMMRT__TEST_OFFLOAD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "vmmrt.h"

typedef struct model_cfg {
	const char *mode;           /* pingpong | remap | none */
	unsigned layers;
	size_t act_bytes;           /* per layer, multiple of 8 */
	uint64_t fwd_ns, bwd_ns;    /* compute time per graph */
	unsigned lookahead;
	unsigned workers;
	const unsigned *bwd_order;  /* NULL: reverse of forward */
	bool latency;               /* host backend latency model */
	double copy_gbps;           /* with latency */
	const char *capacity;       /* host backend capacity, default "1G" */
	bool driver_inline;         /* remap: VMM calls on the launch thread */
	int device;                 /* device ordinal (0 by default) */
	/* NULL: everything on the stream the graphs were captured on; else
	 * replay, hooks and copies on a default stream: "null" (the legacy
	 * stream as PyTorch passes it), "legacy" or "per-thread". */
	const char *replay_on;
	/* Pipeline schedules: a group per (layer, microbatch), as Megatron's
	 * per-microbatch graphs; group m * layers + l is layer l of microbatch
	 * m. schedule NULL or "afab": every forward, then every backward in
	 * reverse (or bwd_order); "1f1b": `inflight` microbatches in flight,
	 * then one backward, one forward; "interleaved": the layers in `chunks`
	 * model chunks, microbatches in blocks of `inflight` (Megatron's
	 * interleaved order on one stage). */
	unsigned microbatches;      /* 0: 1 */
	const char *schedule;
	unsigned inflight;          /* 0: 1 */
	unsigned chunks;            /* 0: 1 */
	bool declare;               /* vmmrt_offload_set_schedule before allocation */
	unsigned max_banks;         /* 0: the default */
	int plant;                  /* VMMRT__DROP_* | VMMRT__PLANT_* set before allocation */
	unsigned timeout_ms;        /* 0: the default */
	const char *const *options; /* NULL, or more runtime options: name, value, ..., NULL */
	bool one_call;              /* each use one vmmrt_group_replay, not begin, launch, end */
} model_cfg;

typedef struct model model;

vmmrt_status model_create(const model_cfg *cfg, model **out);
/* Run iterations [first, first+count): fills input, forward, backward. No host sync. */
vmmrt_status model_run(model *m, unsigned count);
/* Synchronize and verify every layer of every iteration run so far;
 * returns the number of corrupted activations. */
unsigned model_verify(model *m, unsigned *checked);
vmmrt_runtime *model_runtime(model *m);
/* Hooks that returned VMMRT_OK yet left a message in vmmrt_last_error(). */
unsigned model_stale_messages(model *m);
/* Asynchronous failures the hooks reported (and the model called them again). */
unsigned model_reported(model *m);
/* Device memory in use right after the runtime was created, before allocation. */
size_t model_base_used(model *m);
/* Group i (layer i when there is one microbatch), and how many there are. */
vmmrt_group *model_group(model *m, unsigned layer);
unsigned model_groups(model *m);
/* The schedule the model runs: use k is group uses[k] (its backward if bwd[k]). */
unsigned model_uses(model *m, const unsigned **group, const bool **bwd);
/*
 * Part of an iteration, which an abort then abandons: the first `uses` uses
 * whole, then (begin_next) the begin hook and the graph of the next one. The
 * iteration is not verified. Returns the first failure, if any.
 */
vmmrt_status model_run_part(model *m, unsigned uses, bool begin_next);
/* vmmrt_offload_abort, with the message on stderr if it fails. */
vmmrt_status model_abort(model *m);
/*
 * A new shape: every group re-discovered with activations of `bytes`,
 * allocated again (the schedule declared again if cfg.declare), and
 * captured again; the old graphs are kept (model_old_graph) and still
 * replayable until model_release_old. Iterations run so far verify with
 * the bytes they ran with.
 */
vmmrt_status model_rediscover(model *m, size_t bytes);
/* An old backward graph of group i (NULL if none), and its result address. */
vmmrt_graph *model_old_graph(model *m, unsigned i, vmmrt_devptr *act);
vmmrt_status model_release_old(model *m);
void model_destroy(model *m);

/* A whole model run as a thread's job: create, run, verify, destroy. */
typedef struct model_job {
	model_cfg cfg;
	unsigned iterations;
	unsigned bad, checked;
	vmmrt_status st;
} model_job;
void *model_job_run(void *job);
/* Run the jobs at once, a thread each; how many failed (an error, a corrupted
 * activation, or fewer checked than iterations x layers). Messages on stderr. */
unsigned model_jobs_run(model_job *jobs, unsigned n);

#endif

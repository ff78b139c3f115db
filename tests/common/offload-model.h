/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A synthetic model for the offload tests: n layers, each with one group
 * whose forward graph writes an activation derived from the iteration's input
 * and whose backward graph checks it. Every restored activation is verified
 * against a checksum computed on the host, per iteration and per layer.
 */
#ifndef VMMRT_TEST_OFFLOAD_MODEL_H
#define VMMRT_TEST_OFFLOAD_MODEL_H

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
vmmrt_group *model_group(model *m, unsigned layer);
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

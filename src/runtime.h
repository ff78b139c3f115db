/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The runtime object: one opened backend device, its options, its driver
 * workers and the bookkeeping every other concept hangs off. Data only
 * (runtime.c makes and destroys it): every layer from driver.c up reads it.
 */
#ifndef VMMRT__RUNTIME_H
#define VMMRT__RUNTIME_H

#include <pthread.h>
#include <stdbool.h>

#include <urcu/rculist.h>

#include "backend/backend.h"
#include "driver.h"
#include "options.h"

typedef struct vmmrt__workers vmmrt__workers;

/* Timing samples for one VMM call type: a ring of the most recent ones. */
#define VMMRT__CALL_SAMPLES 65536
typedef struct vmmrt__call_ring {
	uint64_t next;                      /* uatomic */
	float us[VMMRT__CALL_SAMPLES];
} vmmrt__call_ring;

struct vmmrt_runtime {
	vmmrt_options opts;
	const vmmrt__backend_ops *ops;
	vmmrt__backend *be;
	vmmrt__backend_config be_cfg;
	char device_name[96];
	char note[192];          /* why this backend was chosen */
	size_t granularity;
	vmmrt_mode mode;
	unsigned lookahead;
	unsigned max_banks;      /* ping-pong, with a declared schedule */
	bool checked_threads;
	bool driver_inline;      /* remap: VMM calls on the launch thread (comparison only) */
	/* uatomic: handles the workers' pools may keep beyond handle_pool: remap's
	 * budget while handle_reuse holds (slot-work.c reads it, the strategy sets it) */
	int64_t reuse_cap;
	int64_t budgeted_handles; /* uatomic: handles mapped on slots remap's budget covers */
	/* uatomic, kept by the workers: device memory mapped now on the
	 * application's slots (vmmrt_slot_create), and the most at once since
	 * creation or vmmrt_offload_stats_reset */
	int64_t slot_bytes, slot_peak_bytes;
	uint64_t timeout_ms;

	vmmrt__workers *workers;

	/* The synchronous helpers (copy_to_device, ...) share one stream. */
	pthread_mutex_t sync_lock;
	vmmrt_stream sync_stream;

	/*
	 * Every live slot, for destroy and statistics. Writers (create on an
	 * application thread, the final unlink on the slot's worker) hold
	 * slots_lock; readers walk it in an RCU read-side section, and a slot is
	 * freed only after a grace period, so a reader never sees freed memory.
	 */
	pthread_mutex_t slots_lock;
	struct cds_list_head slots;
	/* Every live vmmrt_pages (pages.h), for destroy; under slots_lock too. */
	struct cds_list_head pages;

	/* Live object counts (uatomic): what destroy reports as leaked. */
	uint64_t next_slot_id;
	int64_t live_slots;
	uint64_t next_pages_id;
	int64_t live_pages;
	int64_t live_handles;
	int64_t live_reservations;

	/* driver.c */
	/* The fault hook as one (fn, ctx) pair, read atomically by every driver
	 * call; every pair ever set stays until destroy (a call in flight may
	 * still hold the one just replaced). */
	struct vmmrt__fault_hook *fault;     /* uatomic */
	struct vmmrt__fault_hook *fault_all; /* owner list, setter only */
	uint64_t launch_blocking;           /* uatomic */
	vmmrt__call_ring *calls;             /* [VMMRT_CALL_COUNT_] */

	struct vmmrt__trace *trace;          /* NULL when tracing is off */
	struct vmmrt__offload *offload;      /* groups and schedule, NULL until used */
};

#endif

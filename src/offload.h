/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The runtime's offload state (offload.c makes it with the runtime): its
 * groups, the recorded schedule, the copy streams, statistics, and the
 * strategy's part (strategy-pingpong.h, strategy-remap.h), which only the
 * strategy reads. Everything here runs on the launch thread unless it says
 * otherwise.
 */
#ifndef VMMRT__OFFLOAD_H
#define VMMRT__OFFLOAD_H

#include "group.h"
#include "runtime.h"
#include "schedule.h"
#include "slot.h"
#include "strategy-pingpong.h"
#include "strategy-remap.h"
#include "strategy.h"

/*
 * Planted bugs, to prove the tests can see what they guard against: drop a
 * ping-pong fence (corruption), or (remap) queue the release after a forward
 * from the launch thread at once instead of from the D2H stream once the copy
 * is done, so the memory may go before the D2H has read it. Only the testing
 * build (VMMRT__TESTING, libvmmrt-testing.la: src/testing.h) has the code
 * that reads them; libvmmrt.so has none.
 */
enum {
	VMMRT__DROP_FORWARD_FENCE = 1,
	VMMRT__DROP_BACKWARD_FENCE = 2,
	VMMRT__PLANT_EARLY_RELEASE = 4,
	/* ping-pong: alternate the banks in creation order whatever the
	 * declared schedule says (the assignment the schedule was to replace) */
	VMMRT__PLANT_NAIVE_BANKS = 8,
	/* abort drains, but skips putting the strategy's state back */
	VMMRT__PLANT_ABORT_NO_RESET = 16,
};
/* Is bug planted in off? Constant false outside the testing build, so the
 * branch it guards is not compiled into libvmmrt.so. */
#ifdef VMMRT__TESTING
#define VMMRT__PLANTED(off, bug) (((off)->planted & (bug)) != 0)
#else
#define VMMRT__PLANTED(off, bug) false
#endif

struct vmmrt__offload {
	vmmrt_runtime *rt;
	const vmmrt__strategy_ops *ops;
	vmmrt_stream d2h, h2d;
	vmmrt_group **groups;
	unsigned ngroups, cap;
	bool allocated;
	vmmrt__schedule sched;
	unsigned lookahead_in_force; /* the look-ahead in force (the option, as the strategy and schedule allow) */
	/* A schedule declared for the next allocation (vmmrt_offload_set_schedule). */
	vmmrt__use *declared;
	unsigned ndeclared;
	/* Groups re-discovered since the last allocation: hooks wait for it. */
	bool needs_allocate;
	/* What re-discovered groups had, kept (their graphs may still read it)
	 * until vmmrt_offload_release_retired: copies of the groups as they were. */
	vmmrt_group **retired;
	unsigned nretired, retired_cap;
	uint64_t aborts;
	int planted;                  /* VMMRT__DROP_* | VMMRT__PLANT_* (src/testing.c; read only #ifdef VMMRT__TESTING) */

	/* the strategy's part */
	union {
		vmmrt__pingpong pingpong;
		vmmrt__remap remap;
	};

	/* statistics (uatomic where workers or host functions write) */
	uint64_t bytes_offloaded, bytes_restored;
	int64_t activation_bytes, activation_peak;
	uint64_t maps, releases, bank_conflicts;
	uint64_t iterations;          /* last backward hooks ended */
	/* Teardown found a stream still waiting on a flag: those words are not
	 * freed (a stream polls them), and destroy reports it. */
	bool stuck;
	/* A hook failed after it had enqueued part of its work: the pipeline no
	 * longer matches the schedule, so every later hook refuses (launch
	 * thread). What is enqueued still drains; the message says what failed. */
	bool broken;
	char broken_why[256];
};

/* offload.c: made with the runtime (its strategy is the runtime's mode),
 * destroyed with it once the workers can still run what teardown needs. */
vmmrt_status vmmrt__offload_create(vmmrt_runtime *rt);
vmmrt_status vmmrt__offload_destroy(vmmrt_runtime *rt);

/* offload-dump.c: the pipeline's state, for a hang report (racy reads). */
void vmmrt__offload_dump(vmmrt_runtime *rt, int fd);

#endif

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A snapshot of a runtime's offload pipeline, for diagnosing a hang: what
 * each remap group's GPU waits are waiting for (its flag against the maps
 * requested), the releases it owes, and the admission state. vmmrt-torture's
 * watchdog prints it next to the threads' stacks; the GPU machine has no
 * debugger. It reads without locks what other threads write: a hung
 * pipeline is quiescent, and a torn value in a diagnostic costs nothing.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>

#include <urcu/uatomic.h>

#include "offload.h"
#include "tsan.h"
#include "worker.h"

static void dump(vmmrt_runtime *rt, int fd);

void vmmrt__offload_dump(vmmrt_runtime *rt, int fd)
{
	VMMRT_TSAN_IGNORE_READS_BEGIN();
	dump(rt, fd);
	VMMRT_TSAN_IGNORE_READS_END();
}

static void dump(vmmrt_runtime *rt, int fd)
{
	vmmrt__offload *off = rt ? rt->offload : NULL;
	if (!off) {
		dprintf(fd, "  runtime %p: no offload\n", (void *)rt);
		return;
	}
	dprintf(fd,
		"  runtime %p: %s, lookahead %u, %u groups, allocated %d, broken %d%s%s, stuck %d; schedule use %" PRIu64
		" requested %" PRIu64 "; tickets admitted %" PRIu64 " of %" PRIu64 "; resident %" PRId64 " of %" PRId64 "\n",
		(void *)rt, off->ops->name, rt->lookahead, off->ngroups, off->allocated, off->broken,
		off->broken ? ": " : "", off->broken ? off->broken_why : "", off->stuck, off->sched.use,
		off->sched.requested, (uint64_t)uatomic_read(&off->admit_ticket), off->next_ticket,
		(int64_t)uatomic_read(&off->resident), off->budget);
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		dprintf(fd, "    group '%s': %u tensors, open %d, restore_use %" PRIu64, g->name, g->ndesc, g->open,
			g->restore_use);
		if (g->slot)
			dprintf(fd, ", slot mapped %d on worker %u", (int)g->slot->mapped, g->slot->worker);
		if (g->flag)
			dprintf(fd,
				", flag %u (maps: last %u, fwd %u, bwd %u), maps requested %" PRIu64
				", releases planned %" PRIu64 " done %" PRIu64,
				uatomic_read(g->flag), g->map_seq, g->map_seq_of[0], g->map_seq_of[1], g->maps_requested,
				g->releases_planned, (uint64_t)uatomic_read(&g->releases_done));
		if (g->flag && uatomic_read(&g->owed_index) != VMMRT_NOT_OWED)
			dprintf(fd, ", owes release %" PRIu64, (uint64_t)uatomic_read(&g->owed_index));
		dprintf(fd, "\n");
	}
	if (rt->workers)
		vmmrt__workers_dump(rt->workers, fd);
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * A snapshot of a runtime's offload pipeline, for diagnosing a hang: the
 * schedule, each group, what its strategy says of it (dump ops: remap's
 * flags against the maps requested, the releases owed, admission;
 * ping-pong's banks), and each worker's queue. vmmrt-torture's
 * watchdog prints it next to the threads' stacks; the GPU machine has no
 * debugger. It reads without locks what other threads write: a hung
 * pipeline is quiescent, and a torn value in a diagnostic costs nothing.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>

#include "offload.h"
#include "tsan.h"
#include "worker.h"

static void dump(vmmrt_runtime *rt, int fd);

void vmmrt__offload_dump(vmmrt_runtime *rt, int fd)
{
	VMMRT__TSAN_IGNORE_READS_BEGIN();
	dump(rt, fd);
	VMMRT__TSAN_IGNORE_READS_END();
}

static void dump(vmmrt_runtime *rt, int fd)
{
	vmmrt__offload *off = rt ? rt->offload : NULL;
	if (!off) {
		dprintf(fd, "  runtime %p: no offload\n", (void *)rt);
		return;
	}
	dprintf(fd,
		"  runtime %p: %s, lookahead %u (in force %u), %u groups (%u retired), allocated %d, broken %d%s%s, "
		"stuck %d; schedule %s, use %" PRIu64 " requested %" PRIu64,
		(void *)rt, off->ops->name, rt->lookahead, off->lookahead_in_force, off->ngroups, off->nretired,
		off->allocated, off->broken,
		off->broken ? ": " : "", off->broken ? off->broken_why : "", off->stuck,
		off->sched.declared ? "declared" : off->sched.recorded ? "recorded" : "recording", off->sched.use,
		off->sched.requested);
	if (off->ops->dump)
		off->ops->dump(off, fd);
	dprintf(fd, "\n");
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *g = off->groups[i];
		dprintf(fd, "    group '%s': %u tensors, open %d, restore_use %" PRIu64, g->name, g->ndesc, g->begun,
			g->restore_use);
		if (g->slot)
			dprintf(fd, ", slot mapped %d on worker %u", (int)g->slot->mapped, g->slot->worker);
		if (off->ops->dump_group)
			off->ops->dump_group(off, g, fd);
		dprintf(fd, "\n");
	}
	if (rt->workers)
		vmmrt__workers_dump(rt->workers, fd);
}

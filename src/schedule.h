/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The schedule (schedule.c): the recorded order of the runners' graphs and
 * the cursor through it. A "use" is one graph of one group in the
 * iteration's sequence F(fwd[0]) .. F(fwd[n-1]) B(bwd[0]) .. B(bwd[n-1]);
 * uses are numbered across iterations (use k is position k mod 2n of
 * iteration k / 2n). Launch thread only.
 */
#ifndef VMMRT_SCHEDULE_H
#define VMMRT_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "vmmrt.h"

typedef struct vmmrt__schedule {
	unsigned n;
	unsigned *fwd, *bwd;          /* group indexes in the order they ran */
	unsigned nfwd, nbwd;          /* recorded so far (first iteration) */
	bool recorded;
	uint64_t iteration;
	uint64_t use;                 /* the current use number */
	uint64_t requested;           /* uses < requested have been prefetched */
	bool in_backward;
} vmmrt__schedule;

vmmrt_status vmmrt__schedule_init(vmmrt__schedule *s, unsigned n);
void vmmrt__schedule_free(vmmrt__schedule *s);
/* Check/record that g's forward (backward) runs now; sets s->use. */
vmmrt_status vmmrt__schedule_enter(vmmrt__schedule *s, vmmrt_group *g, bool backward);
/* The group and kind of use number k (only once recorded). */
unsigned vmmrt__schedule_group_of(const vmmrt__schedule *s, uint64_t use, bool *backward);
/* Uses to prefetch now: [*from, *to). Empty until the order is recorded. */
void vmmrt__schedule_window(vmmrt__schedule *s, unsigned lookahead, uint64_t *from, uint64_t *to);

#endif

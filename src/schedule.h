/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The schedule (schedule.c): the recorded order of the runners' graphs and
 * the cursor through it. A "use" is one graph of one group; an iteration is
 * 2n uses, the forward and the backward of each of its n groups once, in any
 * order in which each group's forward comes before its backward (all
 * forwards then all backwards, 1F1B, interleaved chunks). Uses are numbered
 * across iterations: use k is position k mod 2n of iteration k / 2n. Launch
 * thread only.
 */
#ifndef VMMRT__SCHEDULE_H
#define VMMRT__SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "vmmrt.h"

#define VMMRT__NO_POS UINT32_MAX

typedef struct vmmrt__schedule {
	unsigned n;                   /* groups in the schedule */
	unsigned ngroups;             /* size of pos_f and pos_b: every group of the runtime */
	unsigned *grp;                /* [2n] the group index at each position */
	bool *bwd;                    /* [2n] whether that use is its backward */
	uint32_t *pos_f, *pos_b;      /* [ngroups] each group's positions, VMMRT__NO_POS if none */
	unsigned nrec;                /* positions recorded so far (first iteration) */
	bool recorded;                /* the order is known: recorded, or declared */
	bool declared;                /* given before allocation (vmmrt_offload_set_schedule) */
	uint64_t iteration;
	uint64_t next;                /* the number of the next use */
	uint64_t use;                 /* the current use number (once next > 0) */
	uint64_t requested;           /* uses < requested have been prefetched */
	bool in_backward;
} vmmrt__schedule;

/* One use of a declared schedule: group index and kind. */
typedef struct vmmrt__use {
	unsigned group;
	bool backward;
} vmmrt__use;

/* n groups in the schedule, out of ngroups in the runtime. */
vmmrt_status vmmrt__schedule_init(vmmrt__schedule *s, unsigned n, unsigned ngroups);
void vmmrt__schedule_free(vmmrt__schedule *s);
/* Check a declared order of nuses uses (names: every group's name, for
 * messages) and make it the schedule: each of the n groups once forward and
 * once backward, the forward first. */
vmmrt_status vmmrt__schedule_declare(vmmrt__schedule *s, const vmmrt__use *uses, unsigned nuses,
				     const char *const *names);
/* Check/record that g's forward (backward) runs now; sets s->use. */
vmmrt_status vmmrt__schedule_enter(vmmrt__schedule *s, vmmrt_group *g, bool backward);
/* The group and kind of use number k (only once recorded). */
unsigned vmmrt__schedule_group_of(const vmmrt__schedule *s, uint64_t use, bool *backward);
/* Uses to prefetch now: [*from, *to). Empty until the order is recorded. */
void vmmrt__schedule_window(vmmrt__schedule *s, unsigned lookahead, uint64_t *from, uint64_t *to);
/* Is an iteration under way (a use of it begun, the last not yet reached)? */
bool vmmrt__schedule_mid_iteration(const vmmrt__schedule *s);
/* Abandon the iteration under way: the next use is the first of the next
 * iteration (or, while recording, the recording starts again). */
void vmmrt__schedule_restart(vmmrt__schedule *s);

/*
 * What a recorded schedule asks of device memory under a look-ahead (the
 * restore of a backward, or remap's map of any use, starts lookahead uses
 * ahead): a group whose backward comes within lookahead uses of its forward
 * stays on the device in between (no copies: vmmrt__schedule_resident); otherwise it
 * holds memory during its forward and from its restore to its backward's end.
 */
bool vmmrt__schedule_resident(const vmmrt__schedule *s, unsigned group, unsigned lookahead);
/*
 * Ping-pong: give each group in `pick` (ngroups flags; NULL: every group of
 * the schedule) a bank (bank[group], from 0) so that no two groups of one
 * bank hold it at once: a forward only at its own use (its D2H is fenced on
 * the GPU), a restore from lookahead uses before its backward to the backward's end,
 * a resident group from its forward to its backward. Returns the banks used
 * (greedy, in order of first use; 1 at lookahead 0, where no holds overlap).
 */
/* Would groups a and b, on one bank, hold it at once (the rule above)? */
bool vmmrt__schedule_clash(const vmmrt__schedule *s, unsigned lookahead, unsigned a, unsigned b);
unsigned vmmrt__schedule_banks(const vmmrt__schedule *s, unsigned lookahead, const bool *pick, unsigned *bank);
/*
 * Ping-pong, once banks are given (bank[group]; pick as above): may group g
 * stay in its bank from its forward to its backward, with no copy either
 * way? Yes when no other group of its bank holds it in between (the rule
 * above): the tail of "all forwards, then all backwards", and the one
 * before it with two banks, whose bank the tail does not take. Their copies
 * were the two only ones with no compute to hide behind, at the turn from
 * forward to backward.
 */
bool vmmrt__schedule_stays(const vmmrt__schedule *s, unsigned lookahead, const bool *pick, const unsigned *bank,
			   unsigned g);
/*
 * Remap: the most groups mapped at once, if every map starts lookahead uses ahead
 * of its use and every release follows its use (a resident group stays
 * mapped from its forward's map to its backward's end). At least 1.
 */
unsigned vmmrt__schedule_peak_mapped(const vmmrt__schedule *s, unsigned lookahead);

#endif

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Ping-pong's part of the offload state (strategy-pingpong.c owns it): the
 * banks, one fixed VA each, which the groups share. Two alternate in
 * creation order when the schedule is not known at allocation; a schedule
 * declared before it gives as many as it needs (vmmrt__schedule_banks).
 * Types only: the offload state and each group embed them (offload.h,
 * group.h).
 */
#ifndef VMMRT__STRATEGY_PINGPONG_H
#define VMMRT__STRATEGY_PINGPONG_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct vmmrt__bank {
	vmmrt_slot *slot;             /* NULL once released (its index stays: groups name banks by index) */
	vmmrt__bevent *free_ev;       /* recorded when the last user of the bank let go of it */
	vmmrt_group *user;            /* last group to use it (forward or backward) */
	bool user_done;               /* its free_ev has been recorded */
	vmmrt_group *pending;         /* a restore waiting for user_done */
	uint64_t pending_use;
	unsigned groups;              /* groups, and retired copies of groups, whose address is in it */
} vmmrt__bank;

/* Per offload state. */
typedef struct vmmrt__pingpong {
	vmmrt__bank *bank;
	unsigned nbanks, cap;
	unsigned banks_lookahead;     /* the look-ahead the declared schedule's banks were made for */
	bool planned;                 /* banks_lookahead comes from a declared schedule */
} vmmrt__pingpong;

/* Per group. */
typedef struct vmmrt__pingpong_group {
	unsigned bank;                /* the bank it uses */
	bool has_bank;
} vmmrt__pingpong_group;

#endif

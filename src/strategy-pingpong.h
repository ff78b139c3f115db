/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Ping-pong's part of the offload state (strategy-pingpong.c owns it): two
 * banks, one fixed VA each, shared by all groups alternately. Types only:
 * the offload state and each group embed them (offload.h, group.h).
 */
#ifndef VMMRT_STRATEGY_PINGPONG_H
#define VMMRT_STRATEGY_PINGPONG_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct vmmrt__bank {
	vmmrt_slot *slot;
	vmmrt__bevent *free_ev;       /* recorded when the last user of the bank let go of it */
	vmmrt_group *user;            /* last group to use it (forward or backward) */
	bool user_done;               /* its free_ev has been recorded */
	vmmrt_group *pending;         /* a restore waiting for user_done */
	uint64_t pending_use;
} vmmrt__bank;

/* Per offload state. */
typedef struct vmmrt__pingpong {
	vmmrt__bank bank[2];
} vmmrt__pingpong;

/* Per group. */
typedef struct vmmrt__pingpong_group {
	unsigned bank;                /* the bank it uses, alternating in forward order */
} vmmrt__pingpong_group;

#endif

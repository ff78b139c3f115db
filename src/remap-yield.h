/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: the D2H stream's yield to the maps due (remap-yield.c, below strategy-remap.c). */
#ifndef VMMRT__REMAP_YIELD_H
#define VMMRT__REMAP_YIELD_H

#include "offload.h"

/* The most maps due that the yield reasons about: with more, it waits for none. */
#define VMMRT__YIELD_MAX 32

/*
 * The maps g's D2H would wait for, in ticket order, at most max, into out:
 * the decision alone (no driver call), so a CPU test can drive it with
 * made-up groups. Returns how many.
 */
unsigned vmmrt__remap_yield_due(const vmmrt__offload *off, const vmmrt_group *g, vmmrt__remap_req **out,
				 unsigned max);
/* Before g's D2H (option d2h_yield): make the D2H stream wait for the maps due. */
vmmrt_status vmmrt__remap_yield_d2h(vmmrt__offload *off, vmmrt_group *g);

#endif

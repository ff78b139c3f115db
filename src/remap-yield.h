/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: the D2H stream's yield to the maps due (remap-yield.c, below strategy-remap.c). */
#ifndef VMMRT__REMAP_YIELD_H
#define VMMRT__REMAP_YIELD_H

#include "offload.h"

/* Before g's D2H (option d2h_yield): make the D2H stream wait for the maps due. */
vmmrt_status vmmrt__remap_yield_d2h(vmmrt__offload *off, vmmrt_group *g);

#endif

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: when a stream may wait for a map (remap-pending.c, below strategy-remap.c). */
#ifndef VMMRT__REMAP_PENDING_H
#define VMMRT__REMAP_PENDING_H

#include "offload.h"

/* A map requested (in ticket order); the restore of a backward one goes on
 * the H2D stream once the map is assured. */
vmmrt_status vmmrt__remap_pending_add(vmmrt__offload *off, const vmmrt__pending_map *p);
/* Take what is assured now, and what uses up to `now` need in any case. */
vmmrt_status vmmrt__remap_pending_flush(vmmrt__offload *off, uint64_t now);

#endif

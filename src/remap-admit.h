/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: its requests and their admission (remap-admit.c, below strategy-remap.c). */
#ifndef VMMRT__REMAP_ADMIT_H
#define VMMRT__REMAP_ADMIT_H

#include "offload.h"

/* Set up g's rings of requests (once, when its slot is made). */
void vmmrt__remap_requests_init(vmmrt_group *g);
/* Queue the map of g's next use of kind (VMMRT__USE_FORWARD, VMMRT__USE_BACKWARD), with its
 * ticket; inline (driver_inline), make it now. */
vmmrt_status vmmrt__remap_request_map(vmmrt__offload *off, vmmrt_group *g, int kind, uint64_t use);
/* Wait until req, still in flight from an earlier iteration, came back. */
vmmrt_status vmmrt__remap_reclaim(vmmrt__offload *off, vmmrt__request *req);
/* Enqueue on s a host function that pushes r to its slot's worker. */
vmmrt_status vmmrt__remap_push_after(vmmrt__offload *off, vmmrt_stream s, vmmrt__remap_req *r);
/* driver_inline: release r's memory on the launch thread, now. */
vmmrt_status vmmrt__remap_inline_release(vmmrt__offload *off, vmmrt__remap_req *r);
/* A failed hook could not hand off g's release `index`: count it in its turn. */
void vmmrt__remap_owe_release(vmmrt__offload *off, vmmrt_group *g, uint64_t index);
/* Let the streams waiting for g's map seq (or an earlier one) run. */
void vmmrt__remap_publish_flag(vmmrt_group *g, uint32_t seq);

#endif

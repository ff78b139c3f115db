/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: teardown and abort (remap-teardown.c, below strategy-remap.c): the
 * strategy's quiesce, unblock, reset, free_group and destroy ops. */
#ifndef VMMRT__REMAP_TEARDOWN_H
#define VMMRT__REMAP_TEARDOWN_H

#include "offload.h"

void vmmrt__remap_quiesce(vmmrt__offload *off);
void vmmrt__remap_unblock(vmmrt__offload *off);
vmmrt_status vmmrt__remap_reset(vmmrt__offload *off);
void vmmrt__remap_free_group(vmmrt__offload *off, vmmrt_group *g);
void vmmrt__remap_destroy(vmmrt__offload *off);

#endif

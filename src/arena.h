/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The arena (src/arena.c): what the runtime tells it. The public calls are
 * vmmrt.h's vmmrt_arena_*.
 */
#ifndef VMMRT__ARENA_H
#define VMMRT__ARENA_H

#include "vmmrt.h"

/*
 * At runtime destroy, once the workers are gone and before the backend is
 * closed: the arena of rt's device stops serving rt's ranges and forgets rt
 * (later mallocs return NULL until the next lend); if plain segments rt's
 * backend allocated are still outstanding, the arena takes the backend
 * (vmmrt__drv_detach) and closes it after their last free.
 */
void vmmrt__arena_runtime_gone(vmmrt_runtime *rt);

#endif

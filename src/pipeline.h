/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The steps every strategy's pipeline is made of (pipeline.c): a group's two
 * copies, bracketed by timing events or replayed as captured graphs; a
 * stream wait that costs nothing when the event already completed; the
 * accounting of activation memory; the tail rule. Launch thread, unless a
 * function says otherwise.
 */
#ifndef VMMRT__PIPELINE_H
#define VMMRT__PIPELINE_H

#include "offload.h"

/* Activation bytes mapped now, and the peak (any thread). */
void vmmrt__offload_account(vmmrt__offload *off, int64_t delta_bytes);
/* Whether the schedule in force keeps g where it is from its forward to its
 * backward (its rule, or the strategy's: g->stays), once known. */
bool vmmrt__offload_stays(const vmmrt__offload *off, const vmmrt_group *g);
/*
 * Does use `use` of g (its forward, or its backward) keep g's activations on
 * the device from its forward to its backward: no D2H, no restore, no
 * release in between? So for a group whose backward comes within the
 * look-ahead in force of its forward (vmmrt__schedule_resident; the tail of
 * "all forwards, then all backwards" is one: its backward is next). Decided
 * by use number, not by the moment of the call: from the second iteration on
 * when the first one recorded the order (its forward ran under it), from the
 * first when it was declared, so the forward and the backward (and a
 * prefetch made before either) always agree.
 */
bool vmmrt__offload_resident(const vmmrt__offload *off, const vmmrt_group *g, uint64_t use, bool backward);
/*
 * Make `s` wait for e, unless e has already completed: a dependency that is
 * already satisfied costs the compute stream a gap for nothing (about 0.5 us
 * of the 1.8 us between two graphs on the H200), a query costs the launch
 * thread a non-blocking driver call.
 */
vmmrt_status vmmrt__offload_wait(vmmrt__offload *off, vmmrt_stream s, vmmrt__bevent *e);
/* Enqueue a copy bracketed by the group's timing events. */
vmmrt_status vmmrt__offload_d2h(vmmrt__offload *off, vmmrt_group *g);
vmmrt_status vmmrt__offload_h2d(vmmrt__offload *off, vmmrt_group *g);
/* Capture g's two copies as graphs (the slot must be mapped now). */
vmmrt_status vmmrt__offload_capture_copies(vmmrt__offload *off, vmmrt_group *g);
void vmmrt__offload_free_copies(vmmrt__offload *off, vmmrt_group *g);
/* The device bytes of the k largest groups' own slots (remap, none). */
uint64_t vmmrt__offload_largest(const vmmrt__offload *off, unsigned k);
/* Bounded wait for a stream (VMMRT_E_TIMEOUT after timeout_ms), without
 * cuStreamSynchronize's unbounded block. */
vmmrt_status vmmrt__offload_drain_stream(vmmrt_runtime *rt, vmmrt_stream s, const char *name);
/* Wait until every worker has run what was queued on it before the call. */
vmmrt_status vmmrt__offload_worker_barrier(vmmrt_runtime *rt);
/* Destroy a slot of the offload state (a bank, a group's slot), once more if
 * the first teardown failed, so its memory is not held until runtime destroy. */
void vmmrt__offload_destroy_slot(vmmrt_slot *s);

#endif

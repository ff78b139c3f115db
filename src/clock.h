/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The library's one clock: CLOCK_MONOTONIC, in nanoseconds, and the
 * deadlines and sleeps measured on it. Every timestamp (trace events, driver
 * call latencies, request hand-offs, retry times), every bounded wait and
 * every sleep of the library and its backends comes from here, so they all
 * line up and none jumps with the wall clock.
 */
#ifndef VMMRT__CLOCK_H
#define VMMRT__CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC now, in nanoseconds. */
uint64_t vmmrt__now_ns(void);
/* The same instant as a timespec (for futex, ck_ec and condition-variable deadlines). */
struct timespec vmmrt__timespec(uint64_t ns);

/* Absolute deadline timeout_ms from now in *ts, or NULL for UINT64_MAX (no deadline). */
const struct timespec *vmmrt__deadline(struct timespec *ts, uint64_t timeout_ms);
/* Has the deadline passed? (NULL: never.) */
bool vmmrt__deadline_passed(const struct timespec *deadline);

/* Sleep for ns nanoseconds, the whole of it through signals. */
void vmmrt__sleep_ns(uint64_t ns);
/* Sleep until CLOCK_MONOTONIC reaches deadline_ns, spinning the last
 * microseconds, so that a short wait lasts what it says (timer slack). */
void vmmrt__sleep_until(uint64_t deadline_ns);

#endif

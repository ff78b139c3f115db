/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Sleeping and waking: ConcurrencyKit event counts (ck_ec) for the workers,
 * plain futex waits for request completion. ck_ec ships no OS glue, so this
 * file supplies it (FUTEX_WAIT_BITSET with an absolute CLOCK_MONOTONIC
 * deadline), using liburcu's futex wrappers.
 */
#ifndef VMMRT__EC_H
#define VMMRT__EC_H

#include <stdint.h>
#include <time.h>

#include <ck_ec.h>

/* Many producers (host functions of several streams, application threads). */
extern const struct ck_ec_mode vmmrt__ec_mp;

/* Sleep while *addr == expected, until the deadline (NULL: forever). Returns
 * early on wake-ups and signals: callers loop on their condition. */
void vmmrt__futex_wait(int32_t *addr, int32_t expected, const struct timespec *deadline);
void vmmrt__futex_wake_all(int32_t *addr);

#endif

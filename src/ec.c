/* SPDX-License-Identifier: LGPL-2.1-or-later */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <urcu/futex.h>

#include "clock.h"
#include "ec.h"

static long futex_bitset_wait(const void *addr, uint32_t expected, const struct timespec *deadline)
{
	/* FUTEX_WAIT_BITSET takes an absolute timeout, FUTEX_WAIT a relative one.
	 * Not FUTEX_PRIVATE_FLAG: the wake side is liburcu's futex_async, which
	 * makes shared-futex calls, and the two kinds never match each other. */
	return syscall(SYS_futex, addr, FUTEX_WAIT_BITSET, expected, deadline, NULL,
		       FUTEX_BITSET_MATCH_ANY);
}

static int ec_gettime(const struct ck_ec_ops *ops, struct timespec *out)
{
	*out = vmmrt__timespec(vmmrt__now_ns());
	return 0;
}

static void ec_wait32(const struct ck_ec_wait_state *st, const uint32_t *addr, uint32_t expected,
		      const struct timespec *deadline)
{
	(void)futex_bitset_wait(addr, expected, deadline);
}

static void ec_wait64(const struct ck_ec_wait_state *st, const uint64_t *addr, uint64_t expected,
		      const struct timespec *deadline)
{
	/* x86-64: the futex word is the low half, as ck_ec64 expects. */
	(void)futex_bitset_wait(addr, (uint32_t)expected, deadline);
}

static void ec_wake32(const struct ck_ec_ops *ops, const uint32_t *addr)
{
	(void)futex_async((int32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void ec_wake64(const struct ck_ec_ops *ops, const uint64_t *addr)
{
	(void)futex_async((int32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static const struct ck_ec_ops ec_ops = {
	.gettime = ec_gettime,
	.wait32 = ec_wait32,
	.wait64 = ec_wait64,
	.wake32 = ec_wake32,
	.wake64 = ec_wake64,
	/* A worker spins briefly before sleeping: hand-offs arrive in bursts. */
	.busy_loop_iter = 200,
};

const struct ck_ec_mode vmmrt__ec_mp = {
	.ops = &ec_ops,
	.single_producer = false,
};

void vmmrt__futex_wait(int32_t *addr, int32_t expected, const struct timespec *deadline)
{
	(void)futex_bitset_wait(addr, (uint32_t)expected, deadline);
}

void vmmrt__futex_wake_all(int32_t *addr)
{
	(void)futex_async(addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

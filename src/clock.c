/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* CLOCK_MONOTONIC: timestamps, deadlines and sleeps (src/clock.h). */
#include "config.h"

#include <errno.h>
#include <sys/prctl.h>

#include <urcu/arch.h>

#include "clock.h"

#define NS_PER_S 1000000000ull

uint64_t vmmrt__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

struct timespec vmmrt__timespec(uint64_t ns)
{
	return (struct timespec){.tv_sec = (time_t)(ns / NS_PER_S), .tv_nsec = (long)(ns % NS_PER_S)};
}

const struct timespec *vmmrt__deadline(struct timespec *ts, uint64_t timeout_ms)
{
	if (timeout_ms == UINT64_MAX)
		return NULL;
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += (time_t)(timeout_ms / 1000);
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return ts;
}

bool vmmrt__deadline_passed(const struct timespec *deadline)
{
	struct timespec now;
	if (!deadline)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > deadline->tv_sec || (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

void vmmrt__sleep_ns(uint64_t ns)
{
	struct timespec ts = vmmrt__timespec(ns);
	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
		;
}

void vmmrt__sleep_until(uint64_t deadline_ns)
{
	uint64_t now = vmmrt__now_ns();
	int slack;
	uint64_t margin;

	if (now >= deadline_ns)
		return;
	/*
	 * A sleep ends up to the thread's timer slack (50 us by default) late, so
	 * sleep to that much before the deadline and spin the rest: a BUSY kernel
	 * or a modelled 25 us driver call should last what it says, not 75 us.
	 * The host backend's stream threads set their slack to 1 ns and so
	 * barely spin.
	 */
	slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	margin = (slack > 0 ? (uint64_t)slack : 50000) + 5000;
	if (deadline_ns - now > margin) {
		struct timespec ts = vmmrt__timespec(deadline_ns - margin);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	while (vmmrt__now_ns() < deadline_ns)
		caa_cpu_relax();
}

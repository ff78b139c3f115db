/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The fault hook of one runtime (vmmrt__drv_set_fault_hook): consulted before
 * every driver operation the library makes, on whatever thread makes it. It
 * makes an operation fail with the status the real driver would give (device
 * out of memory on create and reserve, host out of memory on pinned
 * allocations, a driver error elsewhere), adds latency spikes, and once in a
 * while stalls a driver worker inside a VMM call for longer than the
 * runtime's timeout.
 *
 * Faults are failures, never lies: an operation that fails did nothing, and
 * nothing here makes an operation "succeed" without doing its work. Operations
 * that free something (release, unmap of a reservation, destroy, free) never
 * fail: a failed free can only leak, which is not the library's to avoid.
 * Every decision comes from (scenario seed, call number), so a replay of the
 * same scenario sees mostly the same faults (threads may reorder the calls).
 */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "torture.h"

typedef struct opclass {
	const char *op;
	vmmrt_status st;   /* what a failure returns; VMMRT_OK: never fails */
	bool vmm;          /* a VMM call made by a driver worker: where a stall goes */
} opclass;

static const opclass ops[] = {
	{"cuMemCreate", VMMRT_E_OUT_OF_MEMORY, true},
	{"cuMemMap", VMMRT_E_DRIVER, true},
	{"cuMemSetAccess", VMMRT_E_DRIVER, true},
	{"cuMemUnmap", VMMRT_E_DRIVER, true},
	{"cuMemRelease", VMMRT_OK, true},
	{"cuMemAddressReserve", VMMRT_E_OUT_OF_MEMORY, false},
	{"cuMemAddressFree", VMMRT_OK, false},
	{"cuMemcpyHtoDAsync", VMMRT_E_DRIVER, false},
	{"cuMemcpyDtoHAsync", VMMRT_E_DRIVER, false},
	{"cuMemcpyDtoDAsync", VMMRT_E_DRIVER, false},
	{"cuMemHostAlloc", VMMRT_E_HOST_OUT_OF_MEMORY, false},
	{"cuMemFreeHost", VMMRT_OK, false},
	{"cuMemHostGetDevicePointer", VMMRT_E_DRIVER, false},
	{"cuStreamCreate", VMMRT_E_DRIVER, false},
	{"cuStreamDestroy", VMMRT_OK, false},
	{"cuStreamSynchronize", VMMRT_E_DRIVER, false},
	{"cuStreamWaitEvent", VMMRT_E_DRIVER, false},
	{"cuStreamWaitValue32", VMMRT_E_DRIVER, false},
	{"cuStreamWriteValue32", VMMRT_E_DRIVER, false},
	{"cuEventCreate", VMMRT_E_DRIVER, false},
	{"cuEventDestroy", VMMRT_OK, false},
	{"cuEventRecord", VMMRT_E_DRIVER, false},
	{"cuEventQuery", VMMRT_E_DRIVER, false},
	{"cuEventSynchronize", VMMRT_E_DRIVER, false},
	{"cuEventElapsedTime", VMMRT_OK, false},
	{"cuLaunchHostFunc", VMMRT_E_DRIVER, false},
	{"cuStreamBeginCapture", VMMRT_E_DRIVER, false},
	{"cuStreamEndCapture", VMMRT_E_DRIVER, false},
	{"cuStreamIsCapturing", VMMRT_E_DRIVER, false},
	{"cuGraphLaunch", VMMRT_E_DRIVER, false},
	{"cuGraphExecDestroy", VMMRT_OK, false},
	{"cuLaunchKernel", VMMRT_E_DRIVER, false},
	{"cuMemGetInfo", VMMRT_OK, false},
};

#define NOPS (sizeof(ops) / sizeof(ops[0]))
static bool enabled[NOPS]; /* --fault-ops: which operations may fail */

static const opclass *classify(const char *op, size_t *index)
{
	for (size_t i = 0; i < NOPS; i++)
		if (strcmp(op, ops[i].op) == 0) {
			*index = i;
			return &ops[i];
		}
	return NULL; /* an operation added to the library later: never fails */
}

bool t_fault_ops(const char *list)
{
	char buf[1024], *save = NULL;
	bool any_plus = false;
	if (strlen(list) >= sizeof(buf))
		return false;
	for (size_t i = 0; i < NOPS; i++)
		enabled[i] = ops[i].st != VMMRT_OK;
	if (!strcmp(list, "all"))
		return true;
	if (!strcmp(list, "none")) {
		for (size_t i = 0; i < NOPS; i++)
			enabled[i] = false;
		return true;
	}
	strcpy(buf, list);
	for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		bool minus = tok[0] == '-';
		const char *name = minus || tok[0] == '+' ? tok + 1 : tok;
		size_t i;
		if (!classify(name, &i) || ops[i].st == VMMRT_OK)
			return false; /* unknown, or an operation that never fails (a free) */
		if (!minus && !any_plus) {
			/* The first operation named without '-': only those named fail. */
			for (size_t k = 0; k < NOPS; k++)
				enabled[k] = false;
			any_plus = true;
		}
		enabled[i] = !minus;
	}
	return true;
}

void t_fault_ops_print(char *out, size_t len)
{
	size_t at = 0;
	out[0] = '\0';
	for (size_t i = 0; i < NOPS && at < len; i++)
		if (ops[i].st != VMMRT_OK && !enabled[i]) {
			int n = snprintf(out + at, len - at, "%s-%s", at ? "," : "", ops[i].op);
			if (n > 0)
				at += (size_t)n;
		}
}

/* A stall that never ends: the worker never returns, so the runtime's
 * teardown, which joins it, hangs and the watchdog reports it. */
void t_selftest_hang(const char *op)
{
	t_note(1, "  selftest: a driver worker blocks for ever in %s", op);
	for (;;) {
		struct timespec ts = {1, 0};
		nanosleep(&ts, NULL);
	}
}

vmmrt_status t_fault_hook(void *ctx, const char *op, uint64_t *delay_us)
{
	fault_ctx *f = ctx;
	atomic_fetch_add_explicit(&T.driver_ops, 1, memory_order_relaxed);
	uint64_t n = atomic_fetch_add_explicit(&f->counter, 1, memory_order_relaxed);
	uint64_t r1 = vmmrt__mix64(f->seed ^ (n * 0x9E3779B97F4A7C15ULL));
	uint64_t r2 = vmmrt__mix64(r1 + 0x632BE59BD9B4E019ULL);
	double u1 = (double)(r1 >> 11) * 0x1p-53, u2 = (double)(r2 >> 11) * 0x1p-53;
	size_t ci = 0;
	const opclass *c = classify(op, &ci);

	if (cfg.selftest_hang && c && c->vmm && vmmrt__thread_role_get() == VMMRT_ROLE_WORKER) {
		atomic_fetch_add(&f->stalls, 1); /* the errors that follow have their cause */
		atomic_fetch_add_explicit(&T.stalls, 1, memory_order_relaxed);
		t_selftest_hang(op);
	}

	/* Latency spikes anywhere, up to max_delay_us. */
	if (f->max_delay_us && u2 < f->delay_rate) {
		*delay_us = 1 + (r2 >> 8) % f->max_delay_us;
		atomic_fetch_add(&f->delays, 1);
		atomic_fetch_add_explicit(&T.delays, 1, memory_order_relaxed);
	}
	/* Slow creates in teardown (the scenarios that end with copies in flight). */
	if (atomic_load(&f->teardown) && atomic_load(&f->teardown_create_us) && strcmp(op, "cuMemCreate") == 0)
		*delay_us = atomic_load(&f->teardown_create_us);
	/* A stalled worker: a VMM call on a driver worker that takes longer than the timeout. */
	if (c && c->vmm && f->stall_us && vmmrt__thread_role_get() == VMMRT_ROLE_WORKER &&
	    !atomic_load(&f->teardown) && u2 < f->stall_rate && atomic_load(&f->stall_left) > 0 &&
	    atomic_fetch_sub(&f->stall_left, 1) > 0) {
		*delay_us = f->stall_us;
		t_note(3, "  fault: %s stalls for %llu ms on a driver worker", op, (unsigned long long)(f->stall_us / 1000));
		atomic_fetch_add(&f->stalls, 1);
		atomic_fetch_add_explicit(&T.stalls, 1, memory_order_relaxed);
	}
	if (!c || c->st == VMMRT_OK || !enabled[ci] || !atomic_load(&f->armed) || atomic_load(&f->teardown))
		return VMMRT_OK;
	/* Out of memory that lasts: more creates fail in a row than the worker retries. */
	if (c->st == VMMRT_E_OUT_OF_MEMORY && strcmp(op, "cuMemCreate") == 0) {
		int left = atomic_load(&f->oom_burst);
		while (left > 0 && !atomic_compare_exchange_weak(&f->oom_burst, &left, left - 1))
			;
		if (left > 0)
			goto inject;
	}
	if (u1 >= f->rate)
		return VMMRT_OK;
	if (strcmp(op, "cuMemCreate") == 0 && (r1 & 3) == 0)
		atomic_store(&f->oom_burst, (int)f->oom_retries + 1);
inject:
	t_note(3, "  fault: %s fails (%s) on %s", op, vmmrt_status_name(c->st),
	       vmmrt__thread_role_get() == VMMRT_ROLE_WORKER ? "a driver worker" : "the calling thread");
	atomic_fetch_add(&f->injected, 1);
	atomic_fetch_add_explicit(&T.faults, 1, memory_order_relaxed);
	return c->st;
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-torture: random legal and illegal API sequences on many runtimes at
 * once, with faults injected at the backend boundary, checked against the
 * library's invariants (see vmmrt-torture(1)).
 *
 * main.c      options, torture threads, watchdog, progress, SUMMARY, crashes
 * faults.c    the fault hook (vmmrt__drv_set_fault_hook) of one runtime
 * scenario.c  one runtime from creation to destruction: its phases and
 *             iterations
 * settings.c  its configuration, from its seed, and its runtime
 * capture.c   its captures: the synthetic model's layers (tools/model/synth.h)
 * verify.c    its results and the invariants of a quiet point
 * teardown.c  its end, and the leaks it must not have
 * illegal.c   the illegal calls and the named error each must return
 * stacks.c    every thread's stack, for the reports of a hang or a crash
 */
#ifndef VMMRT__TORTURE_H
#define VMMRT__TORTURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vmmrt.h"
#include "backend/backend.h" /* vmmrt__mix64: the seeds' mixer too */
#include "testing.h"

/* ------------------------------------------------------------------ config */

enum { STRAT_PINGPONG = 1, STRAT_REMAP = 2, STRAT_BOTH = 3 };
enum { PLANT_NONE = 0, PLANT_FORWARD_FENCE, PLANT_BACKWARD_FENCE, PLANT_EARLY_RELEASE };

typedef struct range_u {
	uint64_t lo, hi;
} range_u;

typedef struct tcfg {
	double duration_s;
	unsigned threads;
	uint64_t seed;
	int strategy;               /* STRAT_* mask */
	range_u groups;             /* groups per runtime */
	range_u tensors;            /* tensors per group */
	range_u tensor_bytes;       /* bytes per tensor */
	range_u workers;            /* driver workers */
	range_u iterations;         /* per runtime */
	range_u lookahead;          /* the runtimes' lookahead */
	double fault_rate;          /* failure probability per eligible driver op */
	double delay_rate;          /* latency-spike probability per driver op */
	unsigned max_delay_ms;      /* latency spikes up to this */
	unsigned stall_ms;          /* a stalled worker: one VMM call that long (0: never) */
	unsigned timeout_ms;        /* the runtimes' timeout_ms option */
	unsigned watchdog_s;        /* no progress for this long: the run fails */
	double progress_s;          /* a progress line this often (0: none) */
	const char *backend;        /* host, cuda, auto */
	int plant;                  /* PLANT_* */
	bool keep_going;            /* go on after the first failure */
	bool have_replay;
	uint64_t replay;            /* run this one scenario seed */
	int verbose;
	bool selftest_hang;         /* --selftest-hang: workers block for ever (tests the hang report) */
} tcfg;

extern tcfg cfg;

/* ------------------------------------------------------------------ totals */

/* Process-wide counters (C11 atomics, relaxed). */
typedef struct totals {
	_Atomic uint64_t scenarios, iterations, operations, driver_ops;
	_Atomic uint64_t faults, delays, stalls;       /* injected */
	_Atomic uint64_t named_errors;                 /* errors traced to an injected fault */
	_Atomic uint64_t absorbed;                     /* scenarios whose faults all ended in a retry */
	_Atomic uint64_t illegal_checked;              /* illegal calls answered with their named error */
	_Atomic uint64_t hostfn_checked;               /* calls from a host function refused */
	_Atomic uint64_t bytes_verified, activations_verified;
	_Atomic uint64_t excused;                      /* results not computed after a reported error */
	_Atomic uint64_t corrupted, corrupted_bytes;
	_Atomic uint64_t leaked;
	_Atomic uint64_t unexpected;                   /* wrong status, error without a cause, lost result */
	_Atomic uint64_t hangs, crashes;
	_Atomic uint64_t shutdowns_mid_run, destroys_in_flight;
	_Atomic uint64_t schedules_interleaved, schedules_declared; /* scenarios of each */
	_Atomic uint64_t aborts, recoveries, rediscoveries;  /* aborts: all; recoveries: after a failed hook */
	_Atomic uint64_t slot_cycles;                  /* stream-ordered slot cycles verified (slots.c) */
	_Atomic uint64_t page_cycles;                  /* cycles through slots sharing pages verified (pages.c) */
} totals;

extern totals T;

/* One torture thread, as the watchdog and the crash handler see it. */
typedef struct tthread {
	unsigned id;
	_Atomic int tid;                /* its kernel thread id (the stacks put it first) */
	_Atomic uint64_t heartbeat_ns;  /* last time an API call returned */
	_Atomic uint64_t scenario;      /* seed of the scenario under way (0: none) */
	_Atomic(const char *) step;     /* what it is doing */
	_Atomic int busy;               /* inside an API call */
	char lasterr[240];              /* the scenario's first named error (for crash reports) */
	/* Its runtime while the scenario uses it (not during create or destroy):
	 * a hang report prints its pipeline state. */
	_Atomic(vmmrt_runtime *) rt;
} tthread;

/* ------------------------------------------------------------------ helpers */

uint64_t t_now_ns(void);

typedef struct trng {
	uint64_t s;
} trng;

static inline uint64_t rnd(trng *r)
{
	r->s += 0x9E3779B97F4A7C15ULL;
	return vmmrt__mix64(r->s);
}
static inline uint64_t rnd_in(trng *r, uint64_t lo, uint64_t hi) /* inclusive */
{
	return hi <= lo ? lo : lo + rnd(r) % (hi - lo + 1);
}
static inline double rnd01(trng *r)
{
	return (double)(rnd(r) >> 11) * 0x1p-53;
}
static inline bool chance(trng *r, double p)
{
	return rnd01(r) < p;
}

/* A failure: counted, printed with the scenario seed, and (unless
 * --keep-going) the end of the run. */
void t_fail(uint64_t scenario, const char *kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void t_note(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool t_stopping(void);

/* Slot ranges the crash handler names (a fault inside one is a read of an unmapped slot). */
void t_range_add(uint64_t lo, uint64_t size, uint64_t scenario);
void t_range_del(uint64_t lo);
/* The scenario this torture thread runs now (for the crash report). */
void t_set_scenario(uint64_t seed);

/* ------------------------------------------------------------------ stacks */

/* write() all of p to fd, through EINTR and short writes (async-signal-safe). */
void t_write_all(int fd, const char *p, size_t n);
/* Before any thread starts: loads the unwinder, installs the dump signal's handler. */
void t_stacks_init(void);
/* Names the calling thread in the dumps' headers ("torture thread", 3); num < 0: no number. */
void t_stacks_label(const char *what, int num);
/* Prints the stack of every thread of the process to fd: first_tid's first
 * (if > 0), the caller's from self_uc's instruction on when it is a crash
 * handler's ucontext (else NULL). Async-signal-safe but for dladdr(). */
void t_stacks_dump(int fd, const char *why, int first_tid, void *self_uc);
/* First thing in the crash handler: a fault while this thread unwinds itself
 * for a dump returns into the dump (which reports it) instead. */
void t_stacks_fault_escape(void);
int t_gettid(void);

/* ------------------------------------------------------------------ faults */

typedef struct fault_ctx {
	uint64_t seed;
	double rate, delay_rate;
	uint64_t max_delay_us, stall_us;
	double stall_rate;
	unsigned oom_retries;
	bool cuda;
	_Atomic uint64_t counter;
	_Atomic int teardown;     /* no failures (latency only) */
	_Atomic uint64_t teardown_create_us; /* in teardown, every cuMemCreate this slow (0: none) */
	_Atomic int armed;        /* failures allowed at all */
	_Atomic int stall_left;   /* stalls still to inject */
	_Atomic int oom_burst;    /* creates still to fail in a row */
	_Atomic uint64_t injected, delays, stalls;
} fault_ctx;

vmmrt_status t_fault_hook(void *ctx, const char *op, uint64_t *delay_us);
/* --selftest-hang: where a driver worker blocks for ever (named in the test's stacks). */
void t_selftest_hang(const char *op) __attribute__((noreturn, noinline));
/* --fault-ops: "all", or a comma list of operations; a leading '-' excludes one
 * from the set, a name without it makes the set just the names given. */
bool t_fault_ops(const char *list);
void t_fault_ops_print(char *out, size_t len); /* the excluded ones, as -a,-b */
/* Failures or stalls injected so far: an error now has a cause. */
static inline uint64_t fault_causes(fault_ctx *f)
{
	return atomic_load(&f->injected) + atomic_load(&f->stalls);
}

/* ---------------------------------------------------------------- scenario */

void scenario_run(tthread *th, uint64_t seed);

#endif

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * vmmrt-torture: the driver. Parses the options, starts the torture threads
 * (each runs scenario after scenario, one runtime at a time), watches them
 * (a thread that makes no progress for --watchdog seconds fails the run),
 * prints progress lines and, at the end, one SUMMARY line. A crash (a read of
 * an unmapped slot faults on the host backend) also ends in the SUMMARY line.
 * A hang and a crash print the stack of every thread first (stacks.c).
 * Exit status: 0 when every invariant held, 1 when one did not, 2 on a usage
 * error.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "offload.h"
#include "torture.h"

tcfg cfg = {
	.duration_s = 60,
	.threads = 2,
	.strategy = STRAT_BOTH,
	.groups = {1, 6},
	.tensors = {1, 3},
	.tensor_bytes = {8 << 10, 256 << 10},
	.workers = {1, 3},
	.iterations = {2, 16},
	.lookahead = {0, 2},
	.fault_rate = 0.002,
	.delay_rate = 0.01,
	.max_delay_ms = 50,
	.stall_ms = 3000,
	.timeout_ms = 2000,
	.watchdog_s = 60,
	.progress_s = 5,
	.backend = "host",
};

totals T;

static tthread *threads;
static _Atomic int stop_flag;
static _Atomic uint64_t failures;
static uint64_t start_ns;
static const char *prog = "vmmrt-torture";
static char replay_args[512];

uint64_t t_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool t_stopping(void)
{
	return atomic_load_explicit(&stop_flag, memory_order_relaxed) != 0;
}

/* ------------------------------------------------------ signal-safe output */

typedef struct obuf {
	char b[2048];
	size_t n;
} obuf;

static void o_str(obuf *o, const char *s)
{
	while (*s && o->n < sizeof(o->b) - 1)
		o->b[o->n++] = *s++;
}

static void o_u64(obuf *o, uint64_t v)
{
	char tmp[24];
	int i = 0;
	do
		tmp[i++] = (char)('0' + v % 10);
	while ((v /= 10) && i < 23);
	while (i > 0 && o->n < sizeof(o->b) - 1)
		o->b[o->n++] = tmp[--i];
}

static void o_hex(obuf *o, uint64_t v)
{
	o_str(o, "0x");
	for (int sh = 60; sh >= 0; sh -= 4)
		if (o->n < sizeof(o->b) - 1)
			o->b[o->n++] = "0123456789abcdef"[(v >> sh) & 15];
}

static void o_kv(obuf *o, const char *k, _Atomic uint64_t *v)
{
	o_str(o, " ");
	o_str(o, k);
	o_str(o, "=");
	o_u64(o, atomic_load_explicit(v, memory_order_relaxed));
}

static void o_write(obuf *o)
{
	t_write_all(STDOUT_FILENO, o->b, o->n);
	o->n = 0;
}

static bool passed(void)
{
	return atomic_load(&failures) == 0;
}

/* The one line a run ends with; also from the crash handler, so no stdio. */
static void summary(void)
{
	obuf o = {.n = 0};
	uint64_t ms = (t_now_ns() - start_ns) / 1000000;
	o_str(&o, "SUMMARY result=");
	o_str(&o, passed() ? "PASS" : "FAIL");
	o_str(&o, " seed=");
	o_hex(&o, cfg.seed);
	o_str(&o, " duration_s=");
	o_u64(&o, ms / 1000);
	o_str(&o, ".");
	o_u64(&o, ms / 100 % 10);
	o_str(&o, " threads=");
	o_u64(&o, cfg.threads);
	o_kv(&o, "scenarios", &T.scenarios);
	o_kv(&o, "iterations", &T.iterations);
	o_kv(&o, "operations", &T.operations);
	o_kv(&o, "driver_ops", &T.driver_ops);
	o_kv(&o, "faults_injected", &T.faults);
	o_kv(&o, "latency_spikes", &T.delays);
	o_kv(&o, "stalls", &T.stalls);
	o_kv(&o, "named_errors", &T.named_errors);
	o_kv(&o, "retried_ok", &T.absorbed);
	o_kv(&o, "illegal_refused", &T.illegal_checked);
	o_kv(&o, "hostfn_refused", &T.hostfn_checked);
	o_kv(&o, "mid_run_shutdowns", &T.shutdowns_mid_run);
	o_kv(&o, "destroys_in_flight", &T.destroys_in_flight);
	o_kv(&o, "interleaved_schedules", &T.schedules_interleaved);
	o_kv(&o, "declared_schedules", &T.schedules_declared);
	o_kv(&o, "aborts", &T.aborts);
	o_kv(&o, "recoveries", &T.recoveries);
	o_kv(&o, "rediscoveries", &T.rediscoveries);
	o_kv(&o, "slot_cycles", &T.slot_cycles);
	o_kv(&o, "page_cycles", &T.page_cycles);
	o_kv(&o, "activations_verified", &T.activations_verified);
	o_kv(&o, "bytes_verified", &T.bytes_verified);
	o_kv(&o, "excused", &T.excused);
	o_kv(&o, "corrupted", &T.corrupted);
	o_kv(&o, "corrupted_bytes", &T.corrupted_bytes);
	o_kv(&o, "leaked", &T.leaked);
	o_kv(&o, "unexpected", &T.unexpected);
	o_kv(&o, "hangs", &T.hangs);
	o_kv(&o, "crashes", &T.crashes);
	o_str(&o, "\n");
	o_write(&o);
}

/* -------------------------------------------------------------- reporting */

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

void t_note(int level, const char *fmt, ...)
{
	if (cfg.verbose < level)
		return;
	va_list ap;
	pthread_mutex_lock(&out_lock);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
}

void t_fail(uint64_t scenario, const char *kind, const char *fmt, ...)
{
	va_list ap;
	if (strcmp(kind, "corrupted") && strcmp(kind, "leak") && strcmp(kind, "hang"))
		atomic_fetch_add(&T.unexpected, 1);
	if (!strcmp(kind, "hang"))
		atomic_fetch_add(&T.hangs, 1);
	uint64_t n = atomic_fetch_add(&failures, 1);
	if (!cfg.keep_going)
		atomic_store(&stop_flag, 1);
	if (n >= 50)
		return; /* enough said */
	pthread_mutex_lock(&out_lock);
	fprintf(stdout, "FAIL %s: scenario 0x%016" PRIx64 ": ", kind, scenario);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fprintf(stdout, "\n  replay: %s%s --replay=0x%016" PRIx64 "\n", prog, replay_args, scenario);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
}

/* ------------------------------------------------------- crashes and ranges */

#define NRANGES 4096
static struct {
	_Atomic uint64_t lo, hi, scenario;
} ranges[NRANGES];

void t_range_add(uint64_t lo, uint64_t size, uint64_t scenario)
{
	for (unsigned i = 0; i < NRANGES; i++) {
		uint64_t z = 0;
		if (atomic_compare_exchange_strong(&ranges[i].lo, &z, lo)) {
			atomic_store(&ranges[i].scenario, scenario);
			atomic_store(&ranges[i].hi, lo + size);
			return;
		}
	}
}

void t_range_del(uint64_t lo)
{
	for (unsigned i = 0; i < NRANGES; i++)
		if (atomic_load(&ranges[i].lo) == lo && atomic_load(&ranges[i].hi)) {
			atomic_store(&ranges[i].hi, 0);
			atomic_store(&ranges[i].lo, 0);
			return;
		}
}

/* The scenario a torture thread is running (library threads have none). */
static __thread uint64_t cur_scenario;

void t_set_scenario(uint64_t seed)
{
	cur_scenario = seed;
}

static _Atomic int crashing;

static void on_crash(int sig, siginfo_t *si, void *uc)
{
	obuf o = {.n = 0};
	/* A fault while this thread unwinds itself for a dump: back into the dump. */
	t_stacks_fault_escape();
	/* One report: other threads that fault meanwhile wait for its _exit. */
	if (atomic_exchange(&crashing, 1))
		for (;;)
			pause();
	uint64_t addr = (uint64_t)(uintptr_t)si->si_addr;
	atomic_fetch_add(&T.crashes, 1);
	atomic_fetch_add(&failures, 1);
	o_str(&o, "FAIL crash: signal ");
	o_u64(&o, (uint64_t)sig);
	o_str(&o, sig == SIGSEGV ? " (SIGSEGV)" : sig == SIGBUS ? " (SIGBUS)" : sig == SIGABRT ? " (SIGABRT)" : "");
	if (sig == SIGSEGV || sig == SIGBUS) {
		o_str(&o, " at address ");
		o_hex(&o, addr);
		for (unsigned i = 0; i < NRANGES; i++) {
			uint64_t lo = atomic_load(&ranges[i].lo), hi = atomic_load(&ranges[i].hi);
			if (lo && addr >= lo && addr < hi) {
				o_str(&o, ": inside a slot of scenario ");
				o_hex(&o, atomic_load(&ranges[i].scenario));
				o_str(&o, " that was not mapped (a read or write of an unmapped slot)");
				break;
			}
		}
	}
	char tname[20] = "";
	prctl(PR_GET_NAME, tname, 0, 0, 0);
	tname[sizeof(tname) - 1] = '\0';
	o_str(&o, " in thread '");
	o_str(&o, tname);
	o_str(&o, "'");
	if (cur_scenario) {
		o_str(&o, " of scenario ");
		o_hex(&o, cur_scenario);
	}
	o_str(&o, "\n  scenarios under way:");
	for (unsigned t = 0; threads && t < cfg.threads; t++) {
		uint64_t sc = atomic_load(&threads[t].scenario);
		if (!sc)
			continue;
		o_str(&o, " ");
		o_hex(&o, sc);
		o_str(&o, " (");
		const char *step = atomic_load(&threads[t].step);
		o_str(&o, step ? step : "?");
		o_str(&o, ")");
		if (threads[t].lasterr[0]) {
			o_str(&o, " after: ");
			o_str(&o, threads[t].lasterr);
		}
	}
	o_str(&o, "\n  replay: ");
	o_str(&o, prog);
	o_str(&o, replay_args);
	o_str(&o, " --replay=<scenario>\n");
	o_write(&o);
	t_stacks_dump(STDOUT_FILENO, "crash", t_gettid(), uc);
	summary();
	/* Not _exit(): sanitizers intercept it and would report the threads this
	 * crash left unjoined on top of the crash. */
	syscall(SYS_exit_group, 1);
	_exit(1);
}

static void install_crash_handlers(void)
{
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_crash;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
		sigaction(sigs[i], &sa, NULL);
}

/* ----------------------------------------------------------------- threads */

static void *torture_main(void *arg)
{
	tthread *th = arg;
	atomic_store(&th->tid, t_gettid());
	t_stacks_label("torture thread", (int)th->id);
	if (cfg.have_replay) {
		scenario_run(th, cfg.replay);
		return NULL;
	}
	for (uint64_t k = 0; !t_stopping(); k++) {
		uint64_t seed = vmmrt__mix64(cfg.seed ^ vmmrt__mix64(((uint64_t)th->id << 40) + k + 1));
		scenario_run(th, seed ? seed : 1);
	}
	return NULL;
}

static _Atomic int watchdog_stop;

static void *watchdog_main(void *arg)
{
	t_stacks_label("the watchdog", -1);
	while (!atomic_load(&watchdog_stop)) {
		struct timespec ts = {0, 200000000};
		nanosleep(&ts, NULL);
		uint64_t now = t_now_ns();
		for (unsigned t = 0; t < cfg.threads; t++) {
			uint64_t hb = atomic_load(&threads[t].heartbeat_ns);
			if (hb && now > hb && now - hb > (uint64_t)cfg.watchdog_s * 1000000000ull) {
				const char *step = atomic_load(&threads[t].step);
				atomic_fetch_add(&T.hangs, 1);
				atomic_fetch_add(&failures, 1);
				pthread_mutex_lock(&out_lock);
				fprintf(stdout,
					"FAIL hang: scenario 0x%016" PRIx64 ": thread %u made no progress for %u s (%s %s)\n"
					"  replay: %s%s --replay=0x%016" PRIx64 "\n",
					atomic_load(&threads[t].scenario), t, cfg.watchdog_s,
					atomic_load(&threads[t].busy) ? "inside" : "after", step ? step : "?", prog,
					replay_args, atomic_load(&threads[t].scenario));
				fflush(stdout);
				/* What each runtime's pipeline waits for, then where it,
				 * and every other thread, is stuck. */
				fprintf(stdout, "PIPELINES of the runtimes in use\n");
				fflush(stdout);
				for (unsigned u = 0; u < cfg.threads; u++) {
					vmmrt_runtime *rt = atomic_load(&threads[u].rt);
					dprintf(STDOUT_FILENO, "  thread %u:\n", u);
					if (rt)
						vmmrt__offload_dump(rt, STDOUT_FILENO);
				}
				t_stacks_dump(STDOUT_FILENO, "hang", atomic_load(&threads[t].tid), NULL);
				pthread_mutex_unlock(&out_lock);
				summary();
				_exit(1);
			}
		}
	}
	return NULL;
}

/* ----------------------------------------------------------------- options */

static void usage(FILE *out)
{
	fprintf(out,
		"usage: %s [OPTION]...\n"
		"Drive many libvmmrt runtimes through random legal and illegal API sequences,\n"
		"with faults injected at the driver boundary, and check the library's invariants.\n"
		"\n"
		"  -d, --duration=TIME      run this long (s, m or h suffix; default 60s)\n"
		"  -t, --threads=N          torture threads, one runtime each at a time (default 2)\n"
		"  -s, --seed=N             seed of the whole run (default: from the clock, printed)\n"
		"      --replay=SEED        run the one scenario of this seed (as printed by a failure)\n"
		"      --strategy=S         pingpong, remap or both (default both)\n"
		"      --groups=MIN[-MAX]   offload groups per runtime (default 1-6, at most 8)\n"
		"      --tensors=MIN[-MAX]  tensors per group (default 1-3, at most 4)\n"
		"      --tensor-bytes=MIN[-MAX]  bytes per tensor, K and M suffixes (default 8K-256K)\n"
		"      --workers=MIN[-MAX]  driver workers per runtime (default 1-3)\n"
		"      --iterations=MIN[-MAX]  iterations per runtime (default 2-16, at most 64)\n"
		"      --lookahead=MIN[-MAX]  the runtimes' look-ahead (default 0-2)\n"
		"  -f, --fault-rate=P       probability that a driver operation fails (default 0.002)\n"
		"      --fault-ops=LIST     which operations may fail: all (default), none, OP,... (only those), or\n"
		"                           -OP,... (all but those); OP is a driver call, e.g. cuMemMap\n"
		"      --delay-rate=P       probability of a latency spike per operation (default 0.01)\n"
		"      --max-delay=MS       latency spikes up to this (default 50)\n"
		"      --stall=MS           a stalled driver worker holds one call this long (default 3000; 0: never)\n"
		"      --timeout=MS         the runtimes' timeout_ms (default 2000)\n"
		"      --watchdog=S         fail when a thread makes no progress this long (default 60)\n"
		"      --progress=S         a progress line this often (default 5; 0: none)\n"
		"  -b, --backend=B          host, cuda or auto (default host)\n"
		"      --plant=BUG          forward-fence, backward-fence or early-release: run with a\n"
		"                           planted bug (the run must then fail)\n"
		"  -k, --keep-going         do not stop at the first failure\n"
		"  -v, --verbose            more output (twice: every scenario and named error;\n"
		"                           three times: every injected fault)\n"
		"  -q, --quiet              no progress lines\n"
		"  -h, --help               this text\n"
		"  -V, --version            the version\n"
		"\n"
		"Exit status: 0 when every invariant held, 1 when one did not, 2 on a usage error.\n",
		prog);
}

static bool parse_u64(const char *s, uint64_t *out, bool sizes)
{
	char *end;
	errno = 0;
	if (!s || !*s || *s == '-')
		return false;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno)
		return false;
	if (sizes && (*end == 'k' || *end == 'K'))
		v <<= 10, end++;
	else if (sizes && (*end == 'm' || *end == 'M'))
		v <<= 20, end++;
	if (*end)
		return false;
	*out = v;
	return true;
}

static bool parse_range(const char *s, range_u *r, bool sizes, uint64_t min, uint64_t max)
{
	char a[64];
	const char *dash = strchr(s, '-');
	if (strlen(s) >= sizeof(a))
		return false;
	if (!dash) {
		if (!parse_u64(s, &r->lo, sizes))
			return false;
		r->hi = r->lo;
	} else {
		memcpy(a, s, (size_t)(dash - s));
		a[dash - s] = '\0';
		if (!parse_u64(a, &r->lo, sizes) || !parse_u64(dash + 1, &r->hi, sizes))
			return false;
	}
	return r->lo >= min && r->hi <= max && r->lo <= r->hi;
}

static bool parse_double(const char *s, double *out, double min, double max)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static bool parse_duration(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !isfinite(v) || v <= 0)
		return false;
	if (!strcmp(end, "m"))
		v *= 60;
	else if (!strcmp(end, "h"))
		v *= 3600;
	else if (*end && strcmp(end, "s"))
		return false;
	*out = v;
	return true;
}

static void bad(const char *opt, const char *val)
{
	fprintf(stderr, "%s: invalid value '%s' for --%s (see --help)\n", prog, val ? val : "", opt);
	exit(2);
}

/* An unsigned value in [min, max], or a usage error. */
static unsigned opt_uint(const char *opt, const char *val, uint64_t min, uint64_t max)
{
	uint64_t u;
	if (!parse_u64(val, &u, false) || u < min || u > max)
		bad(opt, val);
	return (unsigned)u;
}

/* The index of val in names (n of them), or a usage error. */
static int opt_choice(const char *opt, const char *val, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (!strcmp(val, names[i]))
			return i;
	bad(opt, val);
	return -1;
}

static void parse_args(int argc, char **argv)
{
	enum {
		O_REPLAY = 256, O_STRATEGY, O_GROUPS, O_TENSORS, O_TBYTES, O_WORKERS, O_ITERS, O_DELAYRATE, O_MAXDELAY,
		O_STALL, O_TIMEOUT, O_WATCHDOG, O_PROGRESS, O_PLANT, O_FAULTOPS, O_LOOKAHEAD, O_SELFTEST_HANG,
	};
	static const struct option lo[] = {
		{"duration", required_argument, NULL, 'd'},
		{"threads", required_argument, NULL, 't'},
		{"seed", required_argument, NULL, 's'},
		{"replay", required_argument, NULL, O_REPLAY},
		{"strategy", required_argument, NULL, O_STRATEGY},
		{"groups", required_argument, NULL, O_GROUPS},
		{"tensors", required_argument, NULL, O_TENSORS},
		{"tensor-bytes", required_argument, NULL, O_TBYTES},
		{"workers", required_argument, NULL, O_WORKERS},
		{"iterations", required_argument, NULL, O_ITERS},
		{"lookahead", required_argument, NULL, O_LOOKAHEAD},
		{"fault-rate", required_argument, NULL, 'f'},
		{"fault-ops", required_argument, NULL, O_FAULTOPS},
		{"delay-rate", required_argument, NULL, O_DELAYRATE},
		{"max-delay", required_argument, NULL, O_MAXDELAY},
		{"stall", required_argument, NULL, O_STALL},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"watchdog", required_argument, NULL, O_WATCHDOG},
		{"progress", required_argument, NULL, O_PROGRESS},
		{"backend", required_argument, NULL, 'b'},
		{"plant", required_argument, NULL, O_PLANT},
		/* Not in --help: for the test of the hang report (tests/torture/hang.sh). */
		{"selftest-hang", no_argument, NULL, O_SELFTEST_HANG},
		{"keep-going", no_argument, NULL, 'k'},
		{"verbose", no_argument, NULL, 'v'},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	bool have_seed = false;
	uint64_t u;
	(void)t_fault_ops("all");
	size_t at = 0;
	int c;

	while ((c = getopt_long(argc, argv, "d:t:s:f:b:kvqhV", lo, NULL)) != -1) {
		const char *name = NULL;
		for (const struct option *p = lo; p->name; p++)
			if (p->val == c)
				name = p->name;
		switch (c) {
		case 'd': if (!parse_duration(optarg, &cfg.duration_s)) bad(name, optarg); break;
		case 't':
			if (!parse_u64(optarg, &u, false) || u < 1 || u > 64)
				bad(name, optarg);
			cfg.threads = (unsigned)u;
			break;
		case 's':
			if (!parse_u64(optarg, &cfg.seed, false))
				bad(name, optarg);
			have_seed = true;
			break;
		case O_REPLAY:
			if (!parse_u64(optarg, &cfg.replay, false) || !cfg.replay)
				bad(name, optarg);
			cfg.have_replay = true;
			break;
		case O_STRATEGY: {
			static const char *const names[] = {"pingpong", "remap", "both"};
			static const int values[] = {STRAT_PINGPONG, STRAT_REMAP, STRAT_BOTH};
			cfg.strategy = values[opt_choice(name, optarg, names, 3)];
			break;
		}
		case O_GROUPS: if (!parse_range(optarg, &cfg.groups, false, 1, 8)) bad(name, optarg); break;
		case O_TENSORS: if (!parse_range(optarg, &cfg.tensors, false, 1, 4)) bad(name, optarg); break;
		case O_TBYTES: if (!parse_range(optarg, &cfg.tensor_bytes, true, 8, 64 << 20)) bad(name, optarg); break;
		case O_WORKERS: if (!parse_range(optarg, &cfg.workers, false, 1, 64)) bad(name, optarg); break;
		case O_LOOKAHEAD: if (!parse_range(optarg, &cfg.lookahead, false, 0, 16)) bad(name, optarg); break;
		case O_ITERS: if (!parse_range(optarg, &cfg.iterations, false, 1, 64)) bad(name, optarg); break;
		case 'f': if (!parse_double(optarg, &cfg.fault_rate, 0, 1)) bad(name, optarg); break;
		case O_FAULTOPS: if (!t_fault_ops(optarg)) bad(name, optarg); break;
		case O_DELAYRATE: if (!parse_double(optarg, &cfg.delay_rate, 0, 1)) bad(name, optarg); break;
		case O_MAXDELAY: cfg.max_delay_ms = opt_uint(name, optarg, 0, 10000); break;
		case O_STALL: cfg.stall_ms = opt_uint(name, optarg, 0, 600000); break;
		case O_TIMEOUT: cfg.timeout_ms = opt_uint(name, optarg, 1, 86400000); break;
		case O_WATCHDOG: cfg.watchdog_s = opt_uint(name, optarg, 1, 86400); break;
		case O_PROGRESS: if (!parse_double(optarg, &cfg.progress_s, 0, 86400)) bad(name, optarg); break;
		case 'b':
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
				bad(name, optarg);
			cfg.backend = optarg;
			break;
		case O_PLANT: {
			/* in the order of the PLANT_ values */
			static const char *const names[] = {"none", "forward-fence", "backward-fence", "early-release"};
			cfg.plant = opt_choice(name, optarg, names, 4);
			break;
		}
		case O_SELFTEST_HANG: cfg.selftest_hang = true; break;
		case 'k': cfg.keep_going = true; break;
		case 'v': cfg.verbose++; break;
		case 'q': cfg.progress_s = 0; break;
		case 'h': usage(stdout); exit(0);
		case 'V': printf("vmmrt-torture (libvmmrt) %s\n", PACKAGE_VERSION); exit(0);
		default: usage(stderr); exit(2);
		}
		/* Everything but the run's length, threads and seed goes into the replay line. */
		if (c != 'd' && c != 't' && c != 's' && c != O_REPLAY && c != 'k' && c != 'q' && c != 'v' && name &&
		    at < sizeof(replay_args) - 1) {
			int n = snprintf(replay_args + at, sizeof(replay_args) - at, " --%s%s%s", name, optarg ? "=" : "",
					 optarg ? optarg : "");
			if (n > 0)
				at += (size_t)n;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, argv[optind]);
		exit(2);
	}
	if (!have_seed)
		cfg.seed = vmmrt__mix64(t_now_ns() ^ ((uint64_t)getpid() << 32));
	if (cfg.have_replay)
		cfg.threads = 1;
}

/* ---------------------------------------------------------------- the run */

int main(int argc, char **argv)
{
	pthread_t *tids, wd;
	extern char **environ;

	prog = argv[0] && strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : "vmmrt-torture";
	parse_args(argc, argv);
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* The scenarios choose every option: VMMRT_* variables would override them. */
	for (char **e = environ; e && *e;) {
		if (!strncmp(*e, "VMMRT_", 6)) {
			char name[128];
			size_t n = strcspn(*e, "=");
			snprintf(name, sizeof(name), "%.*s", (int)n, *e);
			fprintf(stdout, "note: ignoring %s (the torture chooses every option)\n", name);
			unsetenv(name);
			continue;
		}
		e++;
	}
	start_ns = t_now_ns();
	static const char *plants[] = {"none", "forward-fence", "backward-fence", "early-release"};
	printf("vmmrt-torture: seed=0x%016" PRIx64 " duration=%gs threads=%u strategy=%s backend=%s groups=%llu-%llu "
	       "tensors=%llu-%llu tensor-bytes=%llu-%llu workers=%llu-%llu fault-rate=%g delay-rate=%g max-delay=%ums "
	       "stall=%ums timeout=%ums plant=%s%s\n",
	       cfg.seed, cfg.duration_s, cfg.threads,
	       cfg.strategy == STRAT_BOTH ? "both" : cfg.strategy == STRAT_REMAP ? "remap" : "pingpong", cfg.backend,
	       (unsigned long long)cfg.groups.lo, (unsigned long long)cfg.groups.hi,
	       (unsigned long long)cfg.tensors.lo, (unsigned long long)cfg.tensors.hi,
	       (unsigned long long)cfg.tensor_bytes.lo, (unsigned long long)cfg.tensor_bytes.hi,
	       (unsigned long long)cfg.workers.lo, (unsigned long long)cfg.workers.hi, cfg.fault_rate, cfg.delay_rate,
	       cfg.max_delay_ms, cfg.stall_ms, cfg.timeout_ms, plants[cfg.plant],
	       cfg.have_replay ? " (replaying one scenario)" : "");
	printf("  replay the run: %s%s --seed=0x%016" PRIx64 " --threads=%u --duration=%gs\n", prog, replay_args,
	       cfg.seed, cfg.threads, cfg.duration_s);

	threads = calloc(cfg.threads, sizeof(*threads));
	tids = calloc(cfg.threads, sizeof(*tids));
	if (!threads || !tids) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 2;
	}
	t_stacks_init();
	t_stacks_label("main", -1);
	install_crash_handlers();
	for (unsigned t = 0; t < cfg.threads; t++) {
		threads[t].id = t;
		atomic_store(&threads[t].heartbeat_ns, t_now_ns());
	}
	if (pthread_create(&wd, NULL, watchdog_main, NULL) != 0) {
		fprintf(stderr, "%s: cannot start the watchdog\n", prog);
		return 2;
	}
	for (unsigned t = 0; t < cfg.threads; t++)
		if (pthread_create(&tids[t], NULL, torture_main, &threads[t]) != 0) {
			fprintf(stderr, "%s: cannot start thread %u\n", prog, t);
			return 2;
		}

	uint64_t end = start_ns + (uint64_t)(cfg.duration_s * 1e9);
	uint64_t next = start_ns + (uint64_t)(cfg.progress_s * 1e9);
	unsigned done = 0;
	while (!cfg.have_replay || done == 0) {
		struct timespec ts = {0, 50000000};
		nanosleep(&ts, NULL);
		uint64_t now = t_now_ns();
		if (cfg.progress_s > 0 && now >= next) {
			next += (uint64_t)(cfg.progress_s * 1e9);
			pthread_mutex_lock(&out_lock);
			printf("progress t=%.0fs scenarios=%llu iterations=%llu operations=%llu faults=%llu stalls=%llu "
			       "named_errors=%llu verified=%.1fMiB corrupted=%llu leaked=%llu unexpected=%llu\n",
			       (double)(now - start_ns) / 1e9, (unsigned long long)atomic_load(&T.scenarios),
			       (unsigned long long)atomic_load(&T.iterations), (unsigned long long)atomic_load(&T.operations),
			       (unsigned long long)atomic_load(&T.faults), (unsigned long long)atomic_load(&T.stalls),
			       (unsigned long long)atomic_load(&T.named_errors),
			       (double)atomic_load(&T.bytes_verified) / (1 << 20),
			       (unsigned long long)atomic_load(&T.corrupted), (unsigned long long)atomic_load(&T.leaked),
			       (unsigned long long)atomic_load(&T.unexpected));
			fflush(stdout);
			pthread_mutex_unlock(&out_lock);
		}
		if (cfg.have_replay) {
			if (atomic_load(&T.scenarios) >= 1)
				break;
			continue;
		}
		if (now >= end || t_stopping())
			break;
	}
	atomic_store(&stop_flag, 1);
	for (unsigned t = 0; t < cfg.threads; t++)
		pthread_join(tids[t], NULL);
	if (atomic_load(&T.scenarios) == 0 && passed()) {
		printf("FAIL setup: no scenario completed\n");
		atomic_fetch_add(&failures, 1);
	}
	atomic_store(&watchdog_stop, 1);
	pthread_join(wd, NULL);
	summary();
	free(tids);
	free(threads);
	threads = NULL;
	return passed() ? 0 : 1;
}

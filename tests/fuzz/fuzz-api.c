/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * libFuzzer target: the input bytes are a program of libvmmrt API calls on the
 * host backend (`make fuzz` builds it with clang, ASan and UBSan; `make check`
 * replays the seed corpus and the regression inputs through a gcc build).
 *
 * The first bytes choose the runtime (mode, look-ahead, workers, handle pool,
 * emulated device memory, out-of-memory retries); each following byte picks
 * an operation, and the bytes after it its arguments. Operations cover the
 * whole public API, plus driver failures injected through the fault hook at a
 * call count the input chooses, calls made from inside a host function, one
 * legal iteration at once (so the steady state is reached), and destroying the
 * runtime with work in flight. Operation 27 with the group byte's top bit set
 * is an edge (edge_step): every public call with its zero, NULL and
 * one-past-the-end arguments in whatever state the program reached, a
 * schedule declared from the input's bytes (empty and NULL ones included),
 * an abort, a group discovered again, retired memory released, a slot mapped
 * asynchronously and released after its stream.
 *
 * The program never does what an application must not: it only touches its
 * own slots while they are mapped, and drains its stream (with a bound) before
 * unmapping them. So a crash, a sanitizer report or a leak is the library's.
 * Checked on every call: the status is one of the enumeration, and a failure
 * comes with a message that names it. At the end: vmmrt_runtime_destroy
 * succeeds (its leak check: handles, reservations and slots all returned).
 */
#include "config.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vmmrt.h"
#include "driver.h"
#include "runtime.h"
#include "testing.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NG 4
#define NT 4
#define NS 4

/* What a host function calls with: taken when it is launched, since the
 * fuzzer's own state changes while the stream runs (a data race otherwise). */
typedef struct hostfn_args {
	vmmrt_runtime *rt;
	vmmrt_group *g0;
	vmmrt_stream s;
	vmmrt_slot *slot0;
} hostfn_args;

#define NHOSTFN 256 /* host functions launched per runtime, at most */

typedef struct fz {
	const uint8_t *p;
	size_t n, at;
	vmmrt_runtime *rt;
	vmmrt_stream s;
	vmmrt_group *g[NG];
	vmmrt_tensor_desc d[NG][NT];
	unsigned nd[NG], ng;
	vmmrt_slot *slot[NS];
	bool mapped[NS];
	vmmrt_graph *graph[2];
	void *host[2];
	bool allocated;
	/* one each per host function launched: they may run after the fuzzer moved on */
	hostfn_args hostfn[NHOSTFN];
	unsigned nhostfn;
	/* fault injection */
	_Atomic int fail_op;        /* index into fail_ops, -1: none */
	_Atomic int fail_skip;      /* calls of it to let through first */
	_Atomic int fail_left;      /* failures still to inject */
	_Atomic int injected;
} fz;

static const char *const fail_ops[] = {
	"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve", "cuMemHostAlloc",
	"cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuStreamWaitEvent", "cuStreamWaitValue32", "cuEventRecord",
	"cuLaunchHostFunc", "cuGraphLaunch", "cuStreamCreate", "cuEventCreate", "cuStreamBeginCapture",
	"cuStreamEndCapture", "cuLaunchKernel", "cuEventQuery",
};
#define NFAIL (int)(sizeof(fail_ops) / sizeof(fail_ops[0]))

/*
 * FUZZ_FAIL_OPS=op,op,...: only these operations may be made to fail (by
 * default all of fail_ops), to steer a run away from a known bug.
 */
static int allowed_op(uint8_t b)
{
	static int n = -1, list[NFAIL];
	if (n < 0) {
		const char *env = getenv("FUZZ_FAIL_OPS");
		n = 0;
		for (int i = 0; i < NFAIL; i++) {
			const char *at = env ? strstr(env, fail_ops[i]) : NULL;
			size_t len = strlen(fail_ops[i]);
			if (!env || (at && (at[len] == ',' || at[len] == '\0')))
				list[n++] = i;
		}
	}
	return n ? list[b % n] : -1;
}

static vmmrt_status fail_status(const char *op)
{
	if (!strcmp(op, "cuMemCreate") || !strcmp(op, "cuMemAddressReserve"))
		return VMMRT_E_OUT_OF_MEMORY;
	if (!strcmp(op, "cuMemHostAlloc"))
		return VMMRT_E_HOST_OUT_OF_MEMORY;
	return VMMRT_E_DRIVER;
}

static int trace = -1; /* FUZZ_TRACE=1: print every call, driver call and status */

static vmmrt_status hook(void *ctx, const char *op, uint64_t *delay_us)
{
	fz *f = ctx;
	int i = atomic_load(&f->fail_op);
	(void)delay_us;
	if (trace > 0)
		fprintf(stderr, "  driver: %s%s\n", op, i >= 0 && !strcmp(op, fail_ops[i]) ? " (armed)" : "");
	if (i < 0 || strcmp(op, fail_ops[i]) != 0)
		return VMMRT_OK;
	if (atomic_fetch_sub(&f->fail_skip, 1) > 0)
		return VMMRT_OK;
	if (atomic_fetch_sub(&f->fail_left, 1) <= 0)
		return VMMRT_OK;
	atomic_fetch_add(&f->injected, 1);
	return fail_status(op);
}

static uint8_t u8(fz *f)
{
	return f->at < f->n ? f->p[f->at++] : 0;
}

static uint32_t u16(fz *f)
{
	uint32_t lo = u8(f);
	return lo | (uint32_t)u8(f) << 8;
}

/* Every status is one of the enumeration; a failure names itself. */

static vmmrt_status chk(vmmrt_status st, const char *what)
{
	if (trace < 0)
		trace = getenv("FUZZ_TRACE") != NULL;
	if (trace)
		fprintf(stderr, "%s -> %s%s%s\n", what, vmmrt_status_name(st), st ? ": " : "", st ? vmmrt_last_error() : "");
	if ((unsigned)st >= VMMRT_STATUS_COUNT_) {
		fprintf(stderr, "fuzz: %s returned %d, not a vmmrt_status\n", what, (int)st);
		abort();
	}
	if (st != VMMRT_OK) {
		const char *m = vmmrt_last_error();
		if (!m || !strstr(m, vmmrt_status_name(st))) {
			fprintf(stderr, "fuzz: %s returned %s with the message \"%s\"\n", what, vmmrt_status_name(st),
				m ? m : "(null)");
			abort();
		}
	}
	return st;
}
#define C(call) chk((call), #call)

/* Bounded wait for our stream (a library wait on it may never be satisfied
 * after a failure, and the public synchronize has no bound). */
static bool drain(fz *f)
{
	for (int i = 0; i < 2000; i++) {
		bool done = false;
		vmmrt_status st = f->rt->ops->stream_query(f->rt->be, f->s, &done);
		if (st != VMMRT_OK)
			return false;
		if (done)
			return true;
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
	return false;
}

static void desc_from(fz *f, vmmrt_tensor_desc *d)
{
	static const size_t aligns[] = {0, 8, 256, 4096, 3, 1u << 22, 1, 64};
	memset(d, 0, sizeof(*d));
	uint8_t b = u8(f);
	d->bytes = (size_t)(u16(f) % 4096) * 8 * (b & 0x80 ? 64 : 1);
	if (b == 0xff)
		d->bytes = SIZE_MAX - 7;
	d->dtype = u8(f) % 4;
	d->ndim = (b >> 3) % 10; /* 9: invalid */
	for (unsigned k = 0; k < d->ndim && k < VMMRT_MAX_DIMS; k++) {
		d->shape[k] = u8(f) % 5;
		d->stride[k] = 1;
	}
	d->align = aligns[b & 7];
}

static bool make_runtime(fz *f)
{
	static const char *modes[] = {"pingpong", "remap", "none"};
	static const char *caps[] = {"1G", "4M", "16M", "64M"};
	char buf[16];
	vmmrt_options *o;
	uint8_t a = u8(f), b = u8(f);
	if (C(vmmrt_options_create(&o)))
		return false;
	C(vmmrt_options_set(o, "backend", "host"));
	/* a: mode (bits 0-1), look-ahead (2-3), workers (4), handle pool (5-6) */
	C(vmmrt_options_set(o, "mode", modes[(a & 3) % 3]));
	snprintf(buf, sizeof(buf), "%u", ((a >> 2) & 3) % 3);
	C(vmmrt_options_set(o, "lookahead", buf));
	snprintf(buf, sizeof(buf), "%u", 1 + ((a >> 4) & 1));
	C(vmmrt_options_set(o, "driver_workers", buf));
	snprintf(buf, sizeof(buf), "%u", ((a >> 5) & 3) % 3);
	C(vmmrt_options_set(o, "handle_pool", buf));
	/* b: emulated device memory (bits 0-1), out-of-memory retries (2-3) */
	C(vmmrt_options_set(o, "host_capacity", caps[b & 3]));
	C(vmmrt_options_set(o, "host_granularity", "64K"));
	snprintf(buf, sizeof(buf), "%u", ((b >> 2) & 3) % 3);
	C(vmmrt_options_set(o, "oom_retries", buf));
	C(vmmrt_options_set(o, "oom_backoff_us", "10"));
	C(vmmrt_options_set(o, "timeout_ms", "300"));
	vmmrt_status st = C(vmmrt_runtime_create(o, &f->rt));
	vmmrt_options_destroy(o);
	if (st != VMMRT_OK) {
		f->rt = NULL;
		return false;
	}
	if (C(vmmrt_stream_create(f->rt, &f->s))) {
		vmmrt_runtime_destroy(f->rt);
		f->rt = NULL;
		return false;
	}
	vmmrt__drv_set_fault_hook(f->rt, hook, f);
	return true;
}

static void destroy_runtime(fz *f)
{
	if (!f->rt)
		return;
	atomic_store(&f->fail_op, -1); /* a failed free can only leak: none at the end */
	bool idle = drain(f);
	vmmrt_status st = C(vmmrt_runtime_destroy(f->rt));
	/* Its leak check: every handle, reservation and slot returned. A stream
	 * that never drained (after an injected failure) may hold them. */
	if (st != VMMRT_OK && idle && atomic_load(&f->injected) == 0) {
		fprintf(stderr, "fuzz: vmmrt_runtime_destroy: %s\n", vmmrt_last_error());
		abort();
	}
	f->rt = NULL;
	f->s = NULL;
	f->ng = 0;
	memset(f->nd, 0, sizeof(f->nd));
	memset(f->slot, 0, sizeof(f->slot));
	memset(f->mapped, 0, sizeof(f->mapped));
	memset(f->graph, 0, sizeof(f->graph));
	memset(f->host, 0, sizeof(f->host));
	f->nhostfn = 0; /* the streams are gone: no host function runs now */
	f->allocated = false;
}

/* Called from inside a host function: all of these must be refused. */
static void from_host_fn(void *arg)
{
	hostfn_args *f = arg;
	vmmrt_slot *x = NULL;
	vmmrt_stream s2 = NULL;
	size_t a, b;
	vmmrt_status st[] = {
		vmmrt_slot_create(f->rt, 4096, &x),
		vmmrt_stream_create(f->rt, &s2),
		vmmrt_offload_sync(f->rt),
		vmmrt_offload_allocate(f->rt),
		vmmrt_mem_info(f->rt, &a, &b),
		vmmrt_runtime_destroy(f->rt),
		f->g0 ? vmmrt_forward_begin(f->g0, f->s) : VMMRT_E_NOT_PERMITTED,
		f->slot0 ? vmmrt_slot_unmap(f->slot0) : VMMRT_E_NOT_PERMITTED,
	};
	for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++)
		if (st[i] != VMMRT_E_NOT_PERMITTED) {
			fprintf(stderr, "fuzz: call %zu from a host function returned %s\n", i, vmmrt_status_name(st[i]));
			abort();
		}
	if (x || s2)
		abort();
}

/* One legal iteration over the groups: forwards in order, backwards reversed. */
static void iteration(fz *f)
{
	for (unsigned i = 0; i < f->ng; i++)
		if (C(vmmrt_forward_begin(f->g[i], f->s)) || C(vmmrt_forward_end(f->g[i], f->s)))
			return;
	for (unsigned i = f->ng; i-- > 0;)
		if (C(vmmrt_backward_begin(f->g[i], f->s)) || C(vmmrt_backward_end(f->g[i], f->s)))
			return;
}

/*
 * Every public call with its zero, NULL and one-past-the-end arguments, in
 * whatever state the program is in: each must come back with a named error
 * (chk) or succeed where the value is documented as valid (an empty
 * schedule, a zero-size copy), and never crash. None of them may change
 * what the program relies on: the calls that could (an empty schedule
 * forgets a declared one) are made only before allocation, where that is
 * their documented meaning.
 */
static void all_edges(fz *f)
{
	vmmrt_runtime *rt = f->rt;
	vmmrt_group *g = f->ng ? f->g[0] : NULL;
	vmmrt_options *o = NULL;
	char buf[8];
	size_t a, b;
	void *p = NULL;
	vmmrt_slot *x = NULL;
	vmmrt_stream s2 = NULL;
	vmmrt_event *ev = NULL;
	vmmrt_graph *gr = NULL;
	vmmrt_group *g2 = NULL;
	vmmrt_devptr addr;
	int done;
	float ms;
	vmmrt_tensor_desc d = {.bytes = 0, .dtype = 0, .ndim = VMMRT_MAX_DIMS + 1};
	vmmrt_option_info info = {.size = sizeof(info)};
	vmmrt_runtime_info ri = {.size = 0};
	vmmrt_offload_stats os = {.size = 0};
	vmmrt_driver_stats ds = {.size = sizeof(ds)};
	vmmrt_schedule_step st[2 * NG + 1] = {{NULL, 0}};

	(void)vmmrt_strerror(VMMRT_STATUS_COUNT_);
	(void)vmmrt_status_name(VMMRT_STATUS_COUNT_);
	(void)vmmrt_strerror((vmmrt_status)-1);
	(void)vmmrt_version_string();
	C(vmmrt_options_create(NULL));
	vmmrt_options_destroy(NULL);
	if (!C(vmmrt_options_create(&o))) {
		C(vmmrt_options_set(o, NULL, "1"));
		C(vmmrt_options_set(o, "", ""));
		C(vmmrt_options_set(o, "lookahead", ""));
		C(vmmrt_options_set(o, "lookahead", "17")); /* one past its range */
		C(vmmrt_options_set(o, "host_capacity", "0"));
		C(vmmrt_options_get(o, NULL, buf, sizeof(buf)));
		C(vmmrt_options_get(o, "mode", NULL, 0));
		C(vmmrt_options_get(o, "mode", buf, 1));
		C(vmmrt_runtime_options_get(rt, NULL));
		C(vmmrt_runtime_options_get(NULL, o));
		C(vmmrt_runtime_options_get(rt, o));
		C(vmmrt_runtime_create(o, NULL));
		vmmrt_options_destroy(o);
	}
	C(vmmrt_options_apply_env(NULL));
	C(vmmrt_option_describe(VMMRT_OPT_COUNT_, &info)); /* one past the table */
	C(vmmrt_option_describe(0, NULL));
	C(vmmrt_runtime_info_get(NULL, &ri));
	C(vmmrt_runtime_info_get(rt, NULL));
	C(vmmrt_runtime_info_get(rt, &ri));
	C(vmmrt_runtime_destroy(NULL));
	C(vmmrt_trace_span(NULL, "t", "n", 0, 0));
	C(vmmrt_trace_span(rt, NULL, NULL, 1, 0));
	C(vmmrt_mem_info(NULL, &a, &b));
	C(vmmrt_mem_info(rt, NULL, NULL));
	C(vmmrt_driver_stats_get(rt, VMMRT_DRIVER_CALLS, &ds)); /* one past the calls */
	C(vmmrt_driver_stats_get(rt, 0, NULL));
	C(vmmrt_driver_stats_reset(NULL));
	/* slots */
	C(vmmrt_slot_create(rt, 0, &x));
	C(vmmrt_slot_create(rt, SIZE_MAX, &x));
	C(vmmrt_slot_create(rt, 1, NULL));
	C(vmmrt_slot_create(NULL, 1, &x));
	C(vmmrt_slot_map(NULL));
	C(vmmrt_slot_unmap(NULL));
	C(vmmrt_slot_destroy(NULL));
	C(vmmrt_slot_error(NULL));
	C(vmmrt_slot_map_async(NULL));
	C(vmmrt_slot_wait(NULL));
	C(vmmrt_slot_release_after(NULL, f->s));
	(void)vmmrt_slot_address(NULL);
	(void)vmmrt_slot_size(NULL);
	(void)vmmrt_slot_get_state(NULL);
	/* streams, host memory, copies, events, kernels, graphs */
	C(vmmrt_stream_create(rt, NULL));
	C(vmmrt_stream_create(NULL, &s2));
	C(vmmrt_stream_destroy(rt, NULL));
	C(vmmrt_stream_destroy(NULL, f->s));
	C(vmmrt_stream_synchronize(NULL, f->s));
	C(vmmrt_host_alloc(rt, 0, &p));
	C(vmmrt_host_alloc(rt, 1, NULL));
	C(vmmrt_host_alloc(NULL, 1, &p));
	C(vmmrt_host_free(NULL, p));
	C(vmmrt_copy_to_device(rt, 0, NULL, 0));
	C(vmmrt_copy_to_host(rt, NULL, 0, 0));
	C(vmmrt_copy_to_host(NULL, buf, 0, 8));
	C(vmmrt_copy_to_device_async(rt, 0, NULL, 0, f->s));
	C(vmmrt_copy_to_host_async(rt, NULL, 0, 0, f->s));
	C(vmmrt_event_create(rt, 0, NULL));
	C(vmmrt_event_create(NULL, 0, &ev));
	if (!C(vmmrt_event_create(rt, ~VMMRT_EVENT_TIMING, &ev))) /* unknown flags */
		C(vmmrt_event_destroy(rt, ev));
	C(vmmrt_event_destroy(rt, NULL));
	C(vmmrt_event_record(rt, NULL, f->s));
	C(vmmrt_event_query(rt, NULL, &done));
	C(vmmrt_event_synchronize(rt, NULL));
	C(vmmrt_event_elapsed_ms(rt, NULL, NULL, &ms));
	C(vmmrt_event_elapsed_ms(rt, NULL, NULL, NULL));
	C(vmmrt_stream_wait_event(rt, f->s, NULL));
	C(vmmrt_kernel_fill(rt, f->s, 0, 0, 0));
	C(vmmrt_kernel_checksum(rt, f->s, 0, 0, 0));
	C(vmmrt_kernel_busy(NULL, f->s, 0));
	C(vmmrt_kernel_layer(rt, f->s, 0, 0, 0, 0, 0));
	C(vmmrt_graph_begin_capture(NULL, f->s));
	C(vmmrt_graph_end_capture(rt, f->s, NULL));
	C(vmmrt_graph_launch(rt, NULL, f->s));
	C(vmmrt_graph_destroy(rt, NULL));
	(void)gr;
	(void)vmmrt_checksum_host(NULL, 0);
	(void)vmmrt_layer_checksum_host(0, 0, 0);
	/* groups and the offload */
	C(vmmrt_group_create(NULL, "g", &g2));
	C(vmmrt_group_create(rt, "g", NULL));
	C(vmmrt_group_discover(g, NULL));
	C(vmmrt_group_discover(g, &d)); /* ndim one past VMMRT_MAX_DIMS */
	C(vmmrt_group_save(g, NULL, 0, NULL, &addr));
	C(vmmrt_group_save(g, &d, 0, NULL, NULL));
	C(vmmrt_group_save(NULL, &d, 0, NULL, &addr));
	C(vmmrt_group_begin_capture(NULL));
	C(vmmrt_group_end_capture(NULL));
	C(vmmrt_group_error(NULL));
	(void)vmmrt_group_get_state(NULL);
	(void)vmmrt_group_address(NULL);
	(void)vmmrt_group_bytes(NULL);
	C(vmmrt_forward_end(NULL, f->s));
	C(vmmrt_backward_begin(NULL, f->s));
	C(vmmrt_backward_end(NULL, f->s));
	C(vmmrt_group_replay(NULL, 0, 0, f->s));
	if (g) {
		C(vmmrt_group_replay(g, 2, 0, f->s));           /* neither forward nor backward */
		C(vmmrt_group_replay(g, 0, (uintptr_t)f, f->s)); /* not a graph of the host backend's */
	}
	C(vmmrt_offload_allocate(NULL));
	C(vmmrt_offload_set_schedule(NULL, NULL, 0));
	C(vmmrt_offload_set_schedule(rt, NULL, 1));
	C(vmmrt_offload_set_schedule(rt, st, 1));                      /* a NULL group */
	C(vmmrt_offload_set_schedule(rt, st, 2 * (size_t)f->ng + 1)); /* one step past every use */
	C(vmmrt_offload_set_schedule(rt, st, SIZE_MAX));
	if (g) {
		vmmrt_schedule_step two[2] = {{g, 2}, {g, 1}}; /* backward one past 1 */
		C(vmmrt_offload_set_schedule(rt, two, 2));
		two[0].backward = 1; /* its backward before its forward */
		two[1].backward = 0;
		C(vmmrt_offload_set_schedule(rt, two, 2));
	}
	/* Empty: before allocation valid (a declared order is forgotten, and the
	 * first iteration records one: its documented meaning), refused after. */
	C(vmmrt_offload_set_schedule(rt, NULL, 0));
	C(vmmrt_offload_abort(NULL));
	C(vmmrt_group_rediscover(NULL));
	C(vmmrt_offload_release_retired(NULL));
	C(vmmrt_offload_sync(NULL));
	C(vmmrt_offload_stats_get(rt, NULL));
	C(vmmrt_offload_stats_get(rt, &os));
	C(vmmrt_offload_stats_get(NULL, &os));
	C(vmmrt_offload_stats_reset(NULL));
}

/* A schedule from the input: n steps of (group byte, backward byte), each
 * group index possibly one past the groups (a NULL group), each backward
 * possibly 2; or the legal order of every forward then every backward. */
static void schedule_from(fz *f)
{
	vmmrt_schedule_step st[2 * NG + 1];
	uint8_t n = u8(f);
	if (n & 0x80) {
		unsigned k = 0;
		for (unsigned i = 0; i < f->ng; i++)
			st[k++] = (vmmrt_schedule_step){f->g[i], 0};
		for (unsigned i = f->ng; i-- > 0;)
			st[k++] = (vmmrt_schedule_step){f->g[i], 1};
		C(vmmrt_offload_set_schedule(f->rt, st, k));
		return;
	}
	n %= 2 * NG + 2;
	for (unsigned k = 0; k < n && k < 2 * NG + 1; k++) {
		uint8_t gb = u8(f), b = u8(f);
		unsigned gi = f->ng ? gb % (f->ng + 1) : 0;
		st[k] = (vmmrt_schedule_step){gi < f->ng ? f->g[gi] : NULL, b % 3};
	}
	C(vmmrt_offload_set_schedule(f->rt, n ? st : NULL, n < 2 * NG + 1 ? n : 2 * NG + 1));
}

static void edge_step(fz *f, unsigned what, vmmrt_group *g, unsigned si)
{
	vmmrt_slot *sl = f->slot[si];
	switch (what % 6) {
	case 0:
		all_edges(f);
		break;
	case 1:
		schedule_from(f);
		break;
	case 2:
		C(vmmrt_offload_abort(f->rt)); /* addresses stay, and what the fuzzer knows of them */
		break;
	case 3:
		if (g && !C(vmmrt_group_rediscover(g))) {
			for (unsigned i = 0; i < f->ng; i++)
				if (f->g[i] == g)
					f->nd[i] = 0; /* discovered anew */
			f->allocated = false;
		}
		break;
	case 4:
		C(vmmrt_offload_release_retired(f->rt));
		break;
	case 5:
		/* A slot mapped asynchronously, then released after the stream's work. */
		if (!sl)
			break;
		if (!f->mapped[si]) {
			if (!C(vmmrt_slot_map_async(sl)) && !C(vmmrt_slot_wait(sl)))
				f->mapped[si] = true;
		} else if (!C(vmmrt_slot_release_after(sl, f->s))) {
			f->mapped[si] = false; /* no more of our work on it from here */
		}
		break;
	}
}

static void step(fz *f)
{
	uint8_t op = u8(f), gb = u8(f);
	unsigned gi = f->ng ? gb % f->ng : 0;
	vmmrt_group *g = f->ng ? f->g[gi] : NULL;
	unsigned si = u8(f) % NS;
	vmmrt_slot *sl = f->slot[si];
	vmmrt_tensor_desc d;
	vmmrt_devptr addr;

	switch (op % 28) {
	case 0:
		if (f->ng < NG && !C(vmmrt_group_create(f->rt, (u8(f) & 1) ? "g" : NULL, &f->g[f->ng])))
			f->ng++;
		break;
	case 1:
		if (!g)
			break;
		desc_from(f, &d);
		if (!C(vmmrt_group_discover(g, &d)) && f->nd[gi] < NT)
			f->d[gi][f->nd[gi]++] = d;
		break;
	case 2:
		if (!C(vmmrt_offload_allocate(f->rt)))
			f->allocated = true;
		break;
	case 3:
		if (g)
			C(vmmrt_group_begin_capture(g));
		break;
	case 4: {
		if (!g)
			break;
		uint8_t k = u8(f);
		if (f->nd[gi] && (k & 0x80) == 0)
			d = f->d[gi][k % f->nd[gi]];
		else
			desc_from(f, &d);
		if (k & 0x40)
			d.dtype ^= 1; /* drifted */
		C(vmmrt_group_save(g, &d, 0, NULL, (k & 0x20) ? NULL : &addr));
		break;
	}
	case 5:
		if (g)
			C(vmmrt_group_end_capture(g));
		break;
	case 6:
		if (g)
			C(vmmrt_forward_begin(g, (u8(f) & 7) ? f->s : NULL));
		break;
	case 7:
		if (g)
			C(vmmrt_forward_end(g, f->s));
		break;
	case 8:
		if (g)
			C(vmmrt_backward_begin(g, f->s));
		break;
	case 9:
		if (g)
			C(vmmrt_backward_end(g, f->s));
		break;
	case 10:
		C(vmmrt_offload_sync(f->rt));
		break;
	case 11:
		if (!sl && !C(vmmrt_slot_create(f->rt, (size_t)u16(f) * 64, &f->slot[si])))
			f->mapped[si] = false;
		break;
	case 12:
		if (sl && !C(vmmrt_slot_map(sl)))
			f->mapped[si] = true;
		break;
	case 13:
		/* Only once our own work on it is done (an application rule). */
		if (sl && drain(f) && !C(vmmrt_slot_unmap(sl)))
			f->mapped[si] = false;
		break;
	case 14:
		if (sl && drain(f)) {
			if (C(vmmrt_slot_destroy(sl)) == VMMRT_OK) {
				f->slot[si] = NULL;
				f->mapped[si] = false;
			}
		}
		break;
	case 15:
		if (sl && f->mapped[si] && vmmrt_slot_get_state(sl) == VMMRT_SLOT_MAPPED) {
			size_t bytes = ((size_t)u16(f) * 8) % (vmmrt_slot_size(sl) + 8);
			C(vmmrt_kernel_fill(f->rt, f->s, vmmrt_slot_address(sl), bytes, u8(f)));
		}
		break;
	case 16:
		/* The copy runs on the runtime's own stream: our kernels on the slot first. */
		if (sl && f->mapped[si] && vmmrt_slot_get_state(sl) == VMMRT_SLOT_MAPPED && drain(f)) {
			uint64_t w[8] = {0};
			if (u8(f) & 1)
				C(vmmrt_copy_to_host(f->rt, w, vmmrt_slot_address(sl), sizeof(w)));
			else
				C(vmmrt_copy_to_device(f->rt, vmmrt_slot_address(sl), w, sizeof(w)));
		}
		break;
	case 17: {
		vmmrt_offload_stats os = {.size = sizeof(os)};
		vmmrt_driver_stats ds = {.size = sizeof(ds)};
		vmmrt_runtime_info ri = {.size = sizeof(ri)};
		size_t a, b;
		C(vmmrt_offload_stats_get(f->rt, &os));
		if (u8(f) & 1)
			C(vmmrt_offload_stats_reset(f->rt));
		C(vmmrt_driver_stats_get(f->rt, u8(f) % 7, &ds));
		C(vmmrt_runtime_info_get(f->rt, &ri));
		C(vmmrt_mem_info(f->rt, &a, &b));
		break;
	}
	case 18:
		if (g) {
			C(vmmrt_group_error(g));
			(void)vmmrt_group_get_state(g);
			(void)vmmrt_group_address(g);
			(void)vmmrt_group_bytes(g);
		}
		if (sl)
			C(vmmrt_slot_error(sl));
		break;
	case 19: {
		vmmrt_options *o;
		char name[24], value[24];
		size_t nl = u8(f) % sizeof(name), vl = u8(f) % sizeof(value);
		for (size_t i = 0; i < nl; i++)
			name[i] = (char)(u8(f) % 95 + 32);
		name[nl] = '\0';
		for (size_t i = 0; i < vl; i++)
			value[i] = (char)(u8(f) % 95 + 32);
		value[vl] = '\0';
		vmmrt_option_info info = {.size = sizeof(info)};
		if (C(vmmrt_option_describe(u8(f) % 24, &info)) == VMMRT_OK && (nl & 1))
			snprintf(name, sizeof(name), "%s", info.name);
		if (!C(vmmrt_options_create(&o))) {
			char out[300];
			C(vmmrt_options_set(o, name, value));
			C(vmmrt_options_get(o, name, out, (u8(f) % 2) ? sizeof(out) : 3));
			vmmrt_options_destroy(o);
		}
		break;
	}
	case 20: {
		unsigned k = u8(f) % 2;
		if (f->graph[k]) {
			if (u8(f) & 1)
				C(vmmrt_graph_launch(f->rt, f->graph[k], f->s));
			else if (!C(vmmrt_graph_destroy(f->rt, f->graph[k])))
				f->graph[k] = NULL;
		} else if (!C(vmmrt_graph_begin_capture(f->rt, f->s))) {
			C(vmmrt_kernel_busy(f->rt, f->s, u8(f) * 100));
			if (C(vmmrt_graph_end_capture(f->rt, f->s, &f->graph[k])))
				f->graph[k] = NULL;
		}
		break;
	}
	case 21: {
		unsigned k = u8(f) % 2;
		if (f->host[k]) {
			if (!C(vmmrt_host_free(f->rt, f->host[k])))
				f->host[k] = NULL;
		} else if (C(vmmrt_host_alloc(f->rt, (size_t)u16(f) + (u8(f) & 1 ? 0 : 1), &f->host[k]))) {
			f->host[k] = NULL;
		}
		break;
	}
	case 22:
		/* Destroy with whatever is in flight, and start over. */
		destroy_runtime(f);
		make_runtime(f);
		break;
	case 23: {
		uint8_t b = u8(f), c = u8(f);
		int k = allowed_op(b);
		if (k < 0)
			break;
		atomic_store(&f->fail_skip, c % 16);        /* let this many calls of it through */
		atomic_store(&f->fail_left, 1 + (c >> 4) % 8); /* then fail this many */
		atomic_store(&f->fail_op, k);
		break;
	}
	case 24: {
		if (f->nhostfn == NHOSTFN)
			break;
		hostfn_args *a = &f->hostfn[f->nhostfn];
		*a = (hostfn_args){f->rt, f->ng ? f->g[0] : NULL, f->s, f->slot[0]};
		if (!C(vmmrt__drv_launch_host_func(f->rt, f->s, from_host_fn, a)))
			f->nhostfn++;
		break;
	}
	case 25: {
		unsigned n = 1 + u8(f) % 3;
		for (unsigned i = 0; i < n; i++)
			iteration(f);
		break;
	}
	case 26:
		/* Capture every group with its discovered tensors. */
		for (unsigned i = 0; i < f->ng; i++) {
			if (C(vmmrt_group_begin_capture(f->g[i])))
				continue;
			for (unsigned k = 0; k < f->nd[i]; k++)
				C(vmmrt_group_save(f->g[i], &f->d[i][k], 0, NULL, &addr));
			C(vmmrt_group_end_capture(f->g[i]));
		}
		break;
	case 27:
		if (gb & 0x80) {
			edge_step(f, u8(f), g, si);
			break;
		}
		/* NULL handles: named errors, never a crash. */
		C(vmmrt_slot_map(NULL));
		C(vmmrt_forward_begin(NULL, f->s));
		C(vmmrt_group_discover(NULL, &d));
		C(vmmrt_offload_sync(NULL));
		C(vmmrt_stream_synchronize(f->rt, NULL));
		C(vmmrt_slot_create(f->rt, 0, &sl));
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fz f;
	memset(&f, 0, sizeof(f));
	atomic_store(&f.fail_op, -1);
	f.p = data;
	f.n = size;
	if (!make_runtime(&f))
		return 0;
	for (unsigned steps = 0; f.at < f.n && steps < 256 && f.rt; steps++)
		step(&f);
	destroy_runtime(&f);
	return 0;
}

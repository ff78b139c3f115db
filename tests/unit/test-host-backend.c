/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The host backend against the contract in src/backend/backend.h: VMM state
 * rules and accounting, faults on unmapped slots, stream/event/value ordering,
 * host-function rules, graph capture at fixed addresses, the kernels' bytes,
 * and the latency model. Ordering tests make the order observable with BUSY
 * kernels long enough that a broken implementation takes the other branch.
 */
#include "config.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <urcu/uatomic.h>

#include "backend-check.h"
#include "backend/backend.h"

#define MiB ((size_t)1 << 20)
#define CAP (64 * MiB)
#define GRAN (2 * MiB)
#define SLOT (4 * MiB)
#define MS 1000000ULL

static const vmmrt__backend_ops *const ops = &vmmrt__backend_host;

/* the status and the message naming it, so a wrong path with the right status is caught */
#define FAILS(expr, status) \
	do { \
		assert_int_equal((expr), (status)); \
		assert_non_null(strstr(vmmrt_last_error(), vmmrt_status_name(status))); \
	} while (0)

/* A query's answer (finished or not); an error fails the test. */
static bool qd;
#define ev_done(b, e) test_event_done(ops, (b), (e))
#define st_done(b, s) test_stream_done(ops, (b), (s))

/* --------------------------------------------------------------- helpers */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* stream_synchronize for waits a broken backend might never release: fail, don't hang */
static void sync_within(vmmrt__backend *b, vmmrt_stream st, unsigned ms)
{
	uint64_t deadline = now_ns() + ms * MS;

	while (!test_stream_done(ops, b, st)) {
		if (now_ns() > deadline)
			fail_msg("stream still busy after %u ms", ms);
		sleep_ms(1);
	}
}

static vmmrt__backend_config test_config(void)
{
	vmmrt__backend_config cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.host_capacity = CAP;
	cfg.host_granularity = GRAN;
	cfg.host_latency = false;
	cfg.host_copy_gbps = 55.0;
	return cfg;
}

static int setup(void **state)
{
	vmmrt__backend_config cfg = test_config();
	vmmrt__backend *b = NULL;

	if (ops->open(&cfg, &b) != VMMRT_OK)
		return -1;
	*state = b;
	return 0;
}

static int teardown(void **state)
{
	ops->close(*state);
	return 0;
}

struct slot {
	vmmrt_devptr va;
	size_t size;
	vmmrt__bhandle h;
};

static void slot_map(vmmrt__backend *b, struct slot *s)
{
	OK(ops->mem_create(b, s->size, &s->h));
	OK(ops->mem_map(b, s->va, s->size, s->h, 0));
	OK(ops->mem_set_access(b, s->va, s->size));
}

static void slot_unmap(vmmrt__backend *b, struct slot *s)
{
	OK(ops->mem_unmap(b, s->va, s->size));
	OK(ops->mem_release(b, s->h));
}

static void slot_new(vmmrt__backend *b, struct slot *s, size_t size)
{
	s->size = size;
	OK(ops->va_reserve(b, size, 0, &s->va));
	assert_int_equal(s->va % GRAN, 0);
	slot_map(b, s);
}

static void slot_free(vmmrt__backend *b, struct slot *s)
{
	slot_unmap(b, s);
	OK(ops->va_free(b, s->va, s->size));
}

static void *pinned(vmmrt__backend *b, size_t size)
{
	void *p = NULL;

	OK(ops->host_alloc(b, size, &p));
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 4096, 0);
	return p;
}

static vmmrt_devptr devptr(vmmrt__backend *b, void *p)
{
	vmmrt_devptr d = 0;

	OK(ops->host_devptr(b, p, &d));
	return d;
}

static void k_fill(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr dst, size_t bytes, uint64_t seed)
{
	vmmrt__kernel_args a = {.dst = dst, .bytes = bytes, .seed = seed};

	OK(ops->kernel_launch(b, s, VMMRT_KERNEL_FILL, &a));
}

static void k_checksum(vmmrt__backend *b, vmmrt_stream s, vmmrt_devptr src, size_t bytes, vmmrt_devptr out)
{
	vmmrt__kernel_args a = {.src = src, .bytes = bytes, .out = out};

	OK(ops->kernel_launch(b, s, VMMRT_KERNEL_CHECKSUM, &a));
}

static void k_busy(vmmrt__backend *b, vmmrt_stream s, uint64_t ns)
{
	vmmrt__kernel_args a = {.ns = ns};

	OK(ops->kernel_launch(b, s, VMMRT_KERNEL_BUSY, &a));
}

/* What FILL(seed) leaves in bytes, computed on the host: the reference the kernels must match. */
static uint64_t fill_checksum(uint64_t seed, size_t bytes)
{
	uint64_t sum = 0;

	/* the formula of backend.h, spelled out independently of pattern.c */
	for (size_t i = 0; i < bytes / 8; i++) {
		uint64_t w = vmmrt__mix64(seed + VMMRT__GOLDEN * (i + 1));
		sum += vmmrt__mix64(w + VMMRT__CKSUM_K * (i + 1));
	}
	return sum;
}

static uint64_t zero_checksum(size_t bytes)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < bytes / 8; i++)
		sum += vmmrt__mix64(VMMRT__CKSUM_K * (i + 1));
	return sum;
}

static void set_flag(void *p)
{
	uatomic_set((int *)p, 1);
}

struct log {
	int n;
	int v[512];
};

struct log_arg {
	struct log *log;
	int value;
};

static void log_fn(void *p)
{
	struct log_arg *a = p;

	a->log->v[a->log->n++] = a->value;
}

/* Run fn in a forked child; return the signal that ended it, or 0. */
static int child_signal(void (*fn)(void *), void *arg)
{
	pid_t pid = fork();
	int wstatus = 0;

	assert_true(pid >= 0);
	if (pid == 0) {
		struct sigaction sa;

		/* the default action, whatever a sanitizer installed: we want the real signal */
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigaction(SIGSEGV, &sa, NULL);
		sigaction(SIGBUS, &sa, NULL);
		fn(arg);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &wstatus, 0), pid);
	return WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
}

/* ---------------------------------------------------------------- VMM */

/* The remap cycle: same address, bytes out, memory really gone, bytes back in. */
static void test_remap_roundtrip(void **state)
{
	vmmrt__backend *b = *state;
	struct slot s;
	vmmrt_stream st;
	size_t free_b, total;
	unsigned char *saved = pinned(b, SLOT), *check = pinned(b, SLOT);
	vmmrt_devptr va0;
	uint64_t *sum = pinned(b, 4096);

	OK(ops->stream_create(b, &st));
	slot_new(b, &s, SLOT);
	va0 = s.va;
	k_fill(b, st, s.va, SLOT, 7);
	OK(ops->memcpy_dtoh_async(b, saved, s.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	for (size_t i = 0; i < SLOT / 8; i += 4099) {
		uint64_t w;
		memcpy(&w, saved + i * 8, 8);
		assert_int_equal(w, vmmrt_fill_word(7, i));
	}

	slot_unmap(b, &s);
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP);
	assert_int_equal(total, CAP);

	slot_map(b, &s);
	assert_int_equal(s.va, va0);
	/* new physical memory: the old bytes are gone, as after cuMemRelease */
	memset(check, 0xff, SLOT);
	OK(ops->memcpy_dtoh_async(b, check, s.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	for (size_t i = 0; i < SLOT; i += 4096)
		assert_int_equal(check[i], 0);

	OK(ops->memcpy_htod_async(b, s.va, saved, SLOT, st));
	k_checksum(b, st, s.va, SLOT, devptr(b, sum));
	OK(ops->memcpy_dtoh_async(b, check, s.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	assert_memory_equal(check, saved, SLOT);
	assert_int_equal(*sum, fill_checksum(7, SLOT));

	slot_free(b, &s);
	OK(ops->stream_destroy(b, st));
	OK(ops->host_free(b, saved));
	OK(ops->host_free(b, check));
	OK(ops->host_free(b, sum));
}

static void touch(void *p)
{
	*(volatile unsigned char *)p = 1;
}

static void test_unmapped_slot_faults(void **state)
{
	vmmrt__backend *b = *state;
	struct slot s = {.size = SLOT};
	void *p;

	OK(ops->va_reserve(b, SLOT, 0, &s.va));
	p = (void *)(uintptr_t)s.va;
	/* reserved only */
	{
		int sig = child_signal(touch, p);
		assert_true(sig == SIGSEGV || sig == SIGBUS);
	}

	/* mapped but no access yet */
	OK(ops->mem_create(b, SLOT, &s.h));
	OK(ops->mem_map(b, s.va, SLOT, s.h, 0));
	{
		int sig = child_signal(touch, p);
		assert_true(sig == SIGSEGV || sig == SIGBUS);
	}

	/* accessible: the control, so a child that always dies proves nothing */
	OK(ops->mem_set_access(b, s.va, SLOT));
	assert_int_equal(child_signal(touch, p), 0);
	touch(p);

	/* unmapped again */
	slot_unmap(b, &s);
	{
		int sig = child_signal(touch, (char *)p + SLOT - 1);
		assert_true(sig == SIGSEGV || sig == SIGBUS);
	}
	OK(ops->va_free(b, s.va, SLOT));
}

/* A copy from an unmapped slot kills the process, like a GPU fault. */
static void stream_fault_child(void *arg)
{
	vmmrt__backend_config cfg = test_config();
	vmmrt__backend *b;
	vmmrt_stream st;
	vmmrt_devptr va;
	static unsigned char buf[4096];

	(void)arg;
	if (ops->open(&cfg, &b) != VMMRT_OK || ops->stream_create(b, &st) != VMMRT_OK ||
	    ops->va_reserve(b, SLOT, 0, &va) != VMMRT_OK)
		_exit(2);
	if (ops->memcpy_dtoh_async(b, buf, va, sizeof(buf), st) != VMMRT_OK)
		_exit(3);
	ops->stream_synchronize(b, st);
	_exit(0);
}

static void test_stream_fault_kills(void **state)
{
	int sig = child_signal(stream_fault_child, NULL);

	assert_true(sig == SIGSEGV || sig == SIGBUS);
}

static void test_capacity_oom(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt__bhandle h[4], extra;
	size_t free_b, total;

	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP);
	assert_int_equal(total, CAP);

	OK(ops->mem_create(b, 32 * MiB, &h[0]));
	OK(ops->mem_create(b, 30 * MiB, &h[1]));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, 2 * MiB);
	FAILS(ops->mem_create(b, 4 * MiB, &extra), VMMRT_E_OUT_OF_MEMORY);
	OK(ops->mem_create(b, 2 * MiB, &h[2]));
	FAILS(ops->mem_create(b, 2 * MiB, &extra), VMMRT_E_OUT_OF_MEMORY);
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, 0);

	OK(ops->mem_release(b, h[0]));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, 32 * MiB);
	OK(ops->mem_create(b, 32 * MiB, &h[3]));

	FAILS(ops->mem_create(b, 0, &extra), VMMRT_E_INVALID_SIZE);
	FAILS(ops->mem_create(b, 1 * MiB, &extra), VMMRT_E_INVALID_SIZE);
	FAILS(ops->mem_create(b, 3 * MiB, &extra), VMMRT_E_INVALID_SIZE);
	for (int i = 1; i < 4; i++)
		OK(ops->mem_release(b, h[i]));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP);
}

static void test_vmm_named_errors(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_devptr va, other;
	vmmrt__bhandle h, h2;
	int on_stack;

	OK(ops->va_reserve(b, 8 * MiB, 0, &va));
	OK(ops->mem_create(b, 4 * MiB, &h));
	OK(ops->mem_create(b, 4 * MiB, &h2));

	FAILS(ops->mem_set_access(b, va, 4 * MiB), VMMRT_E_INVALID_STATE);
	FAILS(ops->mem_unmap(b, va, 4 * MiB), VMMRT_E_INVALID_STATE);

	OK(ops->mem_map(b, va, 4 * MiB, h, 0));
	FAILS(ops->mem_map(b, va, 4 * MiB, h2, 0), VMMRT_E_INVALID_STATE);
	FAILS(ops->mem_map(b, va + 2 * MiB, 4 * MiB, h2, 0), VMMRT_E_INVALID_STATE);
	/* past the reservation's end, and nowhere near one */
	FAILS(ops->mem_map(b, va + 6 * MiB, 4 * MiB, h2, 0), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_map(b, (vmmrt_devptr)0x100000000000ULL, 4 * MiB, h2, 0), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_map(b, va + 4 * MiB, 3 * MiB, h2, 0), VMMRT_E_INVALID_SIZE);
	FAILS(ops->mem_set_access(b, va, 8 * MiB), VMMRT_E_INVALID_STATE); /* half mapped */
	OK(ops->mem_set_access(b, va, 4 * MiB));

	FAILS(ops->va_free(b, va, 8 * MiB), VMMRT_E_INVALID_STATE);
	FAILS(ops->mem_unmap(b, va, 2 * MiB), VMMRT_E_INVALID_ARGUMENT); /* cuts the mapping */
	OK(ops->mem_unmap(b, va, 4 * MiB));
	FAILS(ops->mem_unmap(b, va, 4 * MiB), VMMRT_E_INVALID_STATE);

	OK(ops->mem_release(b, h));
	FAILS(ops->mem_release(b, h), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_map(b, va, 4 * MiB, h, 0), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_release(b, 0), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_release(b, 0xdeadbeef), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_release(b, (vmmrt__bhandle)(uintptr_t)&on_stack), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->mem_release(b, h2));

	FAILS(ops->va_reserve(b, 3 * MiB, 0, &other), VMMRT_E_INVALID_SIZE);
	FAILS(ops->va_reserve(b, 4 * MiB, 3 * MiB, &other), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->va_reserve(b, 4 * MiB, 64 * MiB, &other));
	assert_int_equal(other % (64 * MiB), 0);
	OK(ops->va_free(b, other, 4 * MiB));
	FAILS(ops->va_free(b, va, 4 * MiB), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->va_free(b, va + GRAN, 8 * MiB), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->va_free(b, va, 8 * MiB));
	FAILS(ops->va_free(b, va, 8 * MiB), VMMRT_E_INVALID_ARGUMENT);

	/* stale and bogus objects elsewhere in the table */
	FAILS(ops->stream_synchronize(b, (vmmrt_stream)(uintptr_t)&other), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->stream_query(b, (vmmrt_stream)(uintptr_t)&on_stack, &qd), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->event_query(b, (vmmrt__bevent *)(uintptr_t)&on_stack, &qd), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->graph_destroy(b, (vmmrt__bgraph *)(uintptr_t)&on_stack), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->host_free(b, &on_stack), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_info(NULL, NULL, NULL), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->open(NULL, NULL), VMMRT_E_INVALID_ARGUMENT);
}

/* cuMemMap's offset: the handle's bytes from there on, aligned, inside the handle. */
static void test_map_at_offset(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_devptr whole, part;
	vmmrt__bhandle h;

	OK(ops->va_reserve(b, 8 * MiB, 0, &whole));
	OK(ops->va_reserve(b, 4 * MiB, 0, &part));
	OK(ops->mem_create(b, 8 * MiB, &h));
	OK(ops->mem_map(b, whole, 8 * MiB, h, 0));
	OK(ops->mem_set_access(b, whole, 8 * MiB));
	FAILS(ops->mem_map(b, part, 4 * MiB, h, GRAN / 2), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->mem_map(b, part, 4 * MiB, h, 6 * MiB), VMMRT_E_INVALID_SIZE);
	FAILS(ops->mem_map(b, part, 4 * MiB, h, 10 * MiB), VMMRT_E_INVALID_SIZE);
	OK(ops->mem_map(b, part, 4 * MiB, h, 4 * MiB));
	OK(ops->mem_set_access(b, part, 4 * MiB));
	((volatile unsigned char *)(uintptr_t)whole)[4 * MiB + 77] = 0x3c;
	((volatile unsigned char *)(uintptr_t)whole)[77] = 0x11;
	assert_int_equal(((volatile unsigned char *)(uintptr_t)part)[77], 0x3c);
	((volatile unsigned char *)(uintptr_t)part)[4 * MiB - 1] = 0x7e;
	assert_int_equal(((volatile unsigned char *)(uintptr_t)whole)[8 * MiB - 1], 0x7e);
	OK(ops->mem_unmap(b, part, 4 * MiB));
	OK(ops->mem_unmap(b, whole, 8 * MiB));
	OK(ops->mem_release(b, h));
	OK(ops->va_free(b, whole, 8 * MiB));
	OK(ops->va_free(b, part, 4 * MiB));
}

/* CUDA semantics: release while mapped is fine; the memory goes with the last unmap. */
static void test_release_while_mapped(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_devptr va1, va2;
	vmmrt__bhandle h;
	size_t free_b, total;

	OK(ops->va_reserve(b, 8 * MiB, 0, &va1));
	OK(ops->va_reserve(b, 8 * MiB, 0, &va2));
	OK(ops->mem_create(b, 8 * MiB, &h));
	OK(ops->mem_map(b, va1, 8 * MiB, h, 0));
	OK(ops->mem_map(b, va2, 8 * MiB, h, 0));
	OK(ops->mem_set_access(b, va1, 8 * MiB));
	OK(ops->mem_set_access(b, va2, 8 * MiB));
	/* one physical allocation behind both addresses */
	((volatile unsigned char *)(uintptr_t)va1)[12345] = 0x5a;
	assert_int_equal(((volatile unsigned char *)(uintptr_t)va2)[12345], 0x5a);

	OK(ops->mem_release(b, h));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP - 8 * MiB);
	/* the mappings still work; the handle is dead */
	assert_int_equal(((volatile unsigned char *)(uintptr_t)va2)[12345], 0x5a);
	FAILS(ops->mem_release(b, h), VMMRT_E_INVALID_ARGUMENT);

	OK(ops->mem_unmap(b, va1, 8 * MiB));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP - 8 * MiB);
	assert_int_equal(((volatile unsigned char *)(uintptr_t)va2)[12345], 0x5a);
	FAILS(ops->mem_map(b, va1, 8 * MiB, h, 0), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->mem_unmap(b, va2, 8 * MiB));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP);

	/* released while unmapped: accounting drops at once */
	OK(ops->mem_create(b, 8 * MiB, &h));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP - 8 * MiB);
	OK(ops->mem_release(b, h));
	OK(ops->mem_info(b, &free_b, &total));
	assert_int_equal(free_b, CAP);
	OK(ops->va_free(b, va1, 8 * MiB));
	OK(ops->va_free(b, va2, 8 * MiB));
}

/* ------------------------------------------------------- streams, events */

static void test_stream_fifo(void **state)
{
	vmmrt__backend *b = *state;
	struct log log = {0};
	struct log_arg args[200];
	vmmrt_stream st;

	OK(ops->stream_create(b, &st));
	/* a slow item first: a non-FIFO runner would let later ones pass it */
	k_busy(b, st, 100 * MS);
	for (int i = 0; i < 200; i++) {
		args[i].log = &log;
		args[i].value = i;
		if (i % 50 == 25)
			k_busy(b, st, 1 * MS);
		OK(ops->launch_host_func(b, st, log_fn, &args[i]));
	}
	assert_false(st_done(b, st));
	OK(ops->stream_synchronize(b, st));
	assert_true(st_done(b, st));
	assert_int_equal(log.n, 200);
	for (int i = 0; i < 200; i++)
		assert_int_equal(log.v[i], i);

	/* destroy drains the queue before it returns */
	{
		int flag = 0;

		k_busy(b, st, 20 * MS);
		OK(ops->launch_host_func(b, st, set_flag, &flag));
		OK(ops->stream_destroy(b, st));
		assert_int_equal(uatomic_read(&flag), 1);
	}
	FAILS(ops->stream_destroy(b, st), VMMRT_E_INVALID_ARGUMENT);
}

struct observe {
	int *a, *b;
	int seen_a, seen_b;
};

static void observe_fn(void *p)
{
	struct observe *o = p;

	o->seen_a = uatomic_read(o->a);
	o->seen_b = o->b ? uatomic_read(o->b) : -1;
}

static void test_event_cross_stream(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_stream sa, sb;
	vmmrt__bevent *e, *never;
	int a_done = 0;
	struct observe o = {.a = &a_done};

	OK(ops->stream_create(b, &sa));
	OK(ops->stream_create(b, &sb));
	OK(ops->event_create(b, false, &e));
	OK(ops->event_create(b, false, &never));

	/* an event never recorded is complete: waiting on it must not block */
	assert_true(ev_done(b, never));
	OK(ops->event_synchronize(b, never));
	OK(ops->stream_wait_event(b, sb, never));
	sync_within(b, sb, 10000);

	k_busy(b, sa, 100 * MS);
	OK(ops->launch_host_func(b, sa, set_flag, &a_done));
	OK(ops->event_record(b, e, sa));
	assert_false(ev_done(b, e));
	OK(ops->stream_wait_event(b, sb, e));
	OK(ops->launch_host_func(b, sb, observe_fn, &o));
	sync_within(b, sb, 10000);
	assert_int_equal(o.seen_a, 1);
	OK(ops->event_synchronize(b, e));
	assert_true(ev_done(b, e));

	/* destroying an event with a pending record is fine (cuEventDestroy) */
	k_busy(b, sa, 10 * MS);
	OK(ops->event_record(b, e, sa));
	OK(ops->event_destroy(b, e));
	FAILS(ops->event_query(b, e, &qd), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->stream_synchronize(b, sa));

	OK(ops->event_destroy(b, never));
	OK(ops->stream_destroy(b, sa));
	OK(ops->stream_destroy(b, sb));
}

/*
 * The wait must take the record current when it is enqueued: stream B only
 * reaches its wait after A has been asked for a second, much later record.
 */
static void test_event_wait_enqueue_time(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_stream sa, sb;
	vmmrt__bevent *e;
	int first = 0, second = 0;
	struct observe o = {.a = &first, .b = &second};

	OK(ops->stream_create(b, &sa));
	OK(ops->stream_create(b, &sb));
	OK(ops->event_create(b, false, &e));

	k_busy(b, sa, 30 * MS);
	OK(ops->launch_host_func(b, sa, set_flag, &first));
	OK(ops->event_record(b, e, sa));

	k_busy(b, sb, 100 * MS);
	OK(ops->stream_wait_event(b, sb, e));
	OK(ops->launch_host_func(b, sb, observe_fn, &o));

	k_busy(b, sa, 500 * MS);
	OK(ops->launch_host_func(b, sa, set_flag, &second));
	OK(ops->event_record(b, e, sa));

	sync_within(b, sb, 10000);
	assert_int_equal(o.seen_a, 1);
	assert_int_equal(o.seen_b, 0);
	/* query and synchronize refer to the most recent record */
	assert_false(ev_done(b, e));
	OK(ops->event_synchronize(b, e));
	assert_int_equal(uatomic_read(&second), 1);

	OK(ops->event_destroy(b, e));
	OK(ops->stream_destroy(b, sa));
	OK(ops->stream_destroy(b, sb));
}

struct inside {
	vmmrt__backend *b;
	vmmrt_stream st;
	vmmrt__bevent *e;
	struct log *log;
	vmmrt__thread_role role;
	unsigned n;              /* calls made inside */
	const char *what[16];    /* each call, as written */
	vmmrt_status status[16]; /* and what it returned */
	int message_ok;
};

/* Make `call` inside the host function and keep its status for the test. */
#define INSIDE(in, call) ((in)->what[(in)->n] = #call, (in)->status[(in)->n++] = (call))

static void noop_fn(void *p)
{
	(void)p;
}

static void inside_fn(void *p)
{
	struct inside *in = p;
	vmmrt__backend_config cfg = test_config();
	vmmrt__backend *nb = NULL;
	vmmrt__bhandle h;
	vmmrt_devptr va;
	size_t f, t;
	void *mem;
	char name[64];
	vmmrt__kernel_args a = {.ns = 1};
	bool capturing;

	in->log->v[in->log->n++] = 1;
	in->role = vmmrt__thread_role_get();
	INSIDE(in, ops->mem_create(in->b, GRAN, &h));
	in->message_ok = strstr(vmmrt_last_error(), "VMMRT_E_NOT_PERMITTED") != NULL;
	INSIDE(in, ops->mem_map(in->b, 0, GRAN, 0, 0));
	INSIDE(in, ops->mem_info(in->b, &f, &t));
	INSIDE(in, ops->stream_query(in->b, in->st, &qd));
	INSIDE(in, ops->stream_synchronize(in->b, in->st));
	INSIDE(in, ops->event_record(in->b, in->e, in->st));
	INSIDE(in, ops->kernel_launch(in->b, in->st, VMMRT_KERNEL_BUSY, &a));
	INSIDE(in, ops->host_alloc(in->b, 4096, &mem));
	INSIDE(in, ops->open(&cfg, &nb));
	INSIDE(in, ops->device_name(in->b, name, sizeof(name)));
	INSIDE(in, ops->va_reserve(in->b, GRAN, 0, &va));
	INSIDE(in, ops->launch_host_func(in->b, in->st, noop_fn, NULL));
	INSIDE(in, ops->stream_is_capturing(in->b, in->st, &capturing));
}

static void test_host_func_rules(void **state)
{
	vmmrt__backend *b = *state;
	struct log log = {0};
	struct log_arg before = {&log, 0}, after = {&log, 2};
	struct inside in = {.b = b, .log = &log};
	size_t f, t;

	OK(ops->stream_create(b, &in.st));
	OK(ops->event_create(b, false, &in.e));
	k_busy(b, in.st, 10 * MS);
	OK(ops->launch_host_func(b, in.st, log_fn, &before));
	OK(ops->launch_host_func(b, in.st, inside_fn, &in));
	OK(ops->launch_host_func(b, in.st, log_fn, &after));
	sync_within(b, in.st, 10000);

	assert_int_equal(log.n, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(log.v[i], i);
	assert_int_equal(in.role, VMMRT_ROLE_HOST_FUNC);
	assert_true(in.message_ok);
	assert_int_equal(in.n, 13);
	for (unsigned i = 0; i < in.n; i++)
		if (in.status[i] != VMMRT_E_NOT_PERMITTED)
			fail_msg("%s inside a host function -> %s, expected VMMRT_E_NOT_PERMITTED", in.what[i],
				 vmmrt_status_name(in.status[i]));

	/* outside, the same calls work, and the caller's role was never touched */
	assert_int_equal(vmmrt__thread_role_get(), VMMRT_ROLE_APP);
	OK(ops->mem_info(b, &f, &t));
	assert_int_equal(f, CAP); /* the refused create created nothing */
	FAILS(ops->launch_host_func(b, in.st, NULL, NULL), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->event_destroy(b, in.e));
	OK(ops->stream_destroy(b, in.st));
}

struct wv_obs {
	uint32_t *flag;
	int *b_done;
	int seen_b;
	uint32_t seen_flag;
};

static void wv_observe(void *p)
{
	struct wv_obs *o = p;

	o->seen_b = uatomic_read(o->b_done);
	o->seen_flag = uatomic_read(o->flag);
}

static void test_wait_write_value32(void **state)
{
	vmmrt__backend *b = *state;
	uint32_t *flags = pinned(b, 4096);
	vmmrt_stream sa, sb;
	int a_done = 0, b_done = 0;
	struct wv_obs o = {.flag = &flags[1], .b_done = &b_done};

	OK(ops->stream_create(b, &sa));
	OK(ops->stream_create(b, &sb));

	/* released by a CPU store */
	OK(ops->stream_wait_value32(b, sa, devptr(b, &flags[0]), 1));
	OK(ops->launch_host_func(b, sa, set_flag, &a_done));
	sleep_ms(30);
	assert_false(st_done(b, sa));
	assert_int_equal(uatomic_read(&a_done), 0);
	uatomic_set(&flags[0], 1);
	sync_within(b, sa, 10000);
	assert_int_equal(uatomic_read(&a_done), 1);

	/* released by another stream's write, with >= semantics (waits for 3, gets 5) */
	k_busy(b, sb, 50 * MS);
	OK(ops->launch_host_func(b, sb, set_flag, &b_done));
	OK(ops->stream_write_value32(b, sb, devptr(b, &flags[1]), 5));
	OK(ops->stream_wait_value32(b, sa, devptr(b, &flags[1]), 3));
	OK(ops->launch_host_func(b, sa, wv_observe, &o));
	sync_within(b, sa, 10000);
	assert_int_equal(o.seen_b, 1);
	assert_int_equal(o.seen_flag, 5);

	/* already satisfied (equal), and a cyclic >= across the wrap */
	OK(ops->stream_wait_value32(b, sa, devptr(b, &flags[1]), 5));
	uatomic_set(&flags[2], 2);
	OK(ops->stream_wait_value32(b, sa, devptr(b, &flags[2]), 0xfffffff0u));
	sync_within(b, sa, 10000);

	FAILS(ops->stream_wait_value32(b, sa, 0, 1), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->stream_write_value32(b, sa, devptr(b, &flags[0]) + 2, 1), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->stream_destroy(b, sa));
	OK(ops->stream_destroy(b, sb));
	OK(ops->host_free(b, flags));
}

static void *write_one_later(void *p)
{
	sleep_ms(100);
	uatomic_set((uint32_t *)p, 1);
	return NULL;
}

/*
 * Freeing pinned memory first waits, as cuMemFreeHost does (it synchronizes
 * the device), until every stream has run what was enqueued before the
 * call: here a stream held on a word of another allocation, which a thread
 * sets 100 ms later. The free returns only once the stream has passed (its
 * host function ran), so no stream can still read what it frees, and a
 * stream that waits for ever makes the free wait for ever, as on a GPU.
 */
static void test_host_free_synchronizes(void **state)
{
	vmmrt__backend *b = *state;
	uint32_t *flags = pinned(b, 4096);
	void *other = pinned(b, 4096);
	vmmrt_stream sa;
	pthread_t t;
	int passed = 0;

	OK(ops->stream_create(b, &sa));
	OK(ops->stream_wait_value32(b, sa, devptr(b, &flags[0]), 1));
	OK(ops->launch_host_func(b, sa, set_flag, &passed));
	assert_int_equal(pthread_create(&t, NULL, write_one_later, &flags[0]), 0);
	OK(ops->host_free(b, other));
	assert_int_equal(uatomic_read(&passed), 1);
	assert_int_equal(pthread_join(t, NULL), 0);
	OK(ops->stream_destroy(b, sa));
	OK(ops->host_free(b, flags));
}

/* ------------------------------------------------------------------ graphs */

static void test_graph_capture_replay(void **state)
{
	vmmrt__backend *b = *state;
	uint64_t *out = pinned(b, 4096);
	unsigned char *saved = pinned(b, SLOT);
	struct slot s;
	vmmrt_stream st;
	vmmrt__bgraph *g, *g2;

	OK(ops->stream_create(b, &st));
	slot_new(b, &s, SLOT);
	*out = 0x1234;

	OK(ops->stream_begin_capture(b, st));
	FAILS(ops->stream_begin_capture(b, st), VMMRT_E_INVALID_STATE);
	k_checksum(b, st, s.va, SLOT, devptr(b, out));
	FAILS(ops->stream_query(b, st, &qd), VMMRT_E_CAPTURE);
	FAILS(ops->stream_synchronize(b, st), VMMRT_E_CAPTURE);
	OK(ops->stream_end_capture(b, st, &g));
	FAILS(ops->stream_end_capture(b, st, &g2), VMMRT_E_INVALID_STATE);
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(*out, 0x1234); /* captured, not run */

	k_fill(b, st, s.va, SLOT, 1);
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(*out, fill_checksum(1, SLOT));

	/* a replay reads the captured address, whatever is there now */
	k_fill(b, st, s.va, SLOT, 2);
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(*out, fill_checksum(2, SLOT));

	/* offload and restore behind the same address */
	OK(ops->memcpy_dtoh_async(b, saved, s.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	slot_unmap(b, &s);
	slot_map(b, &s);
	*out = 0x1234;
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_synchronize(b, st));
	/* without the H2D it reads other bytes (fresh memory: zeros), as on the H200 */
	assert_int_equal(*out, zero_checksum(SLOT));
	assert_true(*out != fill_checksum(2, SLOT));
	OK(ops->memcpy_htod_async(b, s.va, saved, SLOT, st));
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(*out, fill_checksum(2, SLOT));

	OK(ops->graph_destroy(b, g));
	FAILS(ops->graph_launch(b, g, st), VMMRT_E_INVALID_ARGUMENT);
	FAILS(ops->graph_destroy(b, g), VMMRT_E_INVALID_ARGUMENT);
	slot_free(b, &s);
	OK(ops->stream_destroy(b, st));
	OK(ops->host_free(b, out));
	OK(ops->host_free(b, saved));
}

/* What the hooks ask before they enqueue on an application's stream. */
static void test_stream_is_capturing(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_stream st, other;
	vmmrt__bgraph *g;
	bool cap = true, other_cap = true;
	int on_stack;

	OK(ops->stream_create(b, &st));
	OK(ops->stream_create(b, &other));
	OK(ops->stream_is_capturing(b, st, &cap));
	assert_false(cap);

	OK(ops->stream_begin_capture(b, st));
	OK(ops->stream_is_capturing(b, st, &cap));
	assert_true(cap);
	OK(ops->stream_is_capturing(b, other, &other_cap)); /* per stream */
	assert_false(other_cap);
	k_busy(b, st, MS); /* captured work does not change it */
	OK(ops->stream_is_capturing(b, st, &cap));
	assert_true(cap);
	OK(ops->stream_end_capture(b, st, &g));
	OK(ops->stream_is_capturing(b, st, &cap));
	assert_false(cap);

	/* a replay on the stream is work, not a capture */
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_is_capturing(b, st, &cap));
	assert_false(cap);
	sync_within(b, st, 10000);

	FAILS(ops->stream_is_capturing(b, (vmmrt_stream)(uintptr_t)&on_stack, &cap), VMMRT_E_INVALID_ARGUMENT);
	/* the default streams: known, and never capturing here */
	OK(ops->stream_is_capturing(b, NULL, &cap));
	assert_false(cap);
	FAILS(ops->stream_is_capturing(b, st, NULL), VMMRT_E_INVALID_ARGUMENT);
	OK(ops->graph_destroy(b, g));
	OK(ops->stream_destroy(b, st));
	OK(ops->stream_destroy(b, other));
}

static void count_fn(void *p)
{
	uatomic_inc((int *)p);
}

/* Host functions, records and waits inside a graph run on every replay, in order. */
static void test_graph_events(void **state)
{
	vmmrt__backend *b = *state;
	vmmrt_stream st, other;
	vmmrt__bevent *done, *gate;
	vmmrt__bgraph *g;
	int count = 0, gate_passed = 0;
	struct observe o = {.a = &gate_passed};

	OK(ops->stream_create(b, &st));
	OK(ops->stream_create(b, &other));
	OK(ops->event_create(b, false, &done));
	OK(ops->event_create(b, false, &gate));

	OK(ops->stream_begin_capture(b, st));
	OK(ops->stream_wait_event(b, st, gate));
	OK(ops->launch_host_func(b, st, count_fn, &count));
	OK(ops->event_record(b, done, st));
	OK(ops->stream_end_capture(b, st, &g));
	/* the captured record did not happen */
	assert_true(ev_done(b, done));

	for (int i = 0; i < 3; i++)
		OK(ops->graph_launch(b, g, st));
	sync_within(b, st, 10000);
	assert_int_equal(count, 3);

	/* the captured wait holds the replay until the gate's record (taken at launch) completes */
	k_busy(b, other, 200 * MS);
	OK(ops->launch_host_func(b, other, set_flag, &gate_passed));
	OK(ops->event_record(b, gate, other));
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_wait_event(b, st, done));
	OK(ops->launch_host_func(b, st, observe_fn, &o));
	assert_false(ev_done(b, done));
	sync_within(b, st, 10000);
	assert_int_equal(o.seen_a, 1);
	assert_int_equal(count, 4);

	/* destroying a graph with a launch in flight lets the launch finish */
	k_busy(b, st, 20 * MS);
	OK(ops->graph_launch(b, g, st));
	OK(ops->graph_destroy(b, g));
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(count, 5);

	/* one level of capture only: a graph launch into a capture is refused */
	OK(ops->stream_begin_capture(b, st));
	OK(ops->stream_end_capture(b, st, &g));
	OK(ops->stream_begin_capture(b, st));
	FAILS(ops->graph_launch(b, g, st), VMMRT_E_NOT_SUPPORTED);
	OK(ops->stream_end_capture(b, st, &g));
	/* an empty capture is a valid graph */
	OK(ops->graph_launch(b, g, st));
	OK(ops->stream_synchronize(b, st));
	OK(ops->graph_destroy(b, g));

	OK(ops->event_destroy(b, done));
	OK(ops->event_destroy(b, gate));
	OK(ops->stream_destroy(b, st));
	OK(ops->stream_destroy(b, other));
}

/* ----------------------------------------------------------------- kernels */

static void test_kernels(void **state)
{
	vmmrt__backend *b = *state;
	struct slot s1, s2;
	vmmrt_stream st;
	unsigned char *buf = pinned(b, SLOT);
	uint64_t *out = pinned(b, 4096);
	vmmrt__bevent *t0, *t1, *plain;
	vmmrt__kernel_args a;
	float ms = 0;
	uint64_t start;

	OK(ops->stream_create(b, &st));
	slot_new(b, &s1, SLOT);
	slot_new(b, &s2, SLOT);

	k_fill(b, st, s1.va, SLOT, 3);
	k_checksum(b, st, s1.va, SLOT, devptr(b, &out[0]));
	OK(ops->memcpy_dtoh_async(b, buf, s1.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	for (size_t i = 0; i < SLOT / 8; i++) {
		uint64_t w;
		memcpy(&w, buf + i * 8, 8);
		if (w != vmmrt_fill_word(3, i))
			fail_msg("fill word %zu: %llx", i, (unsigned long long)w);
	}
	assert_int_equal(out[0], vmmrt_checksum_host(buf, SLOT));
	assert_int_equal(out[0], fill_checksum(3, SLOT));
	/* position-dependent: swapping two words changes it */
	{
		uint64_t w0, w1;
		memcpy(&w0, buf, 8);
		memcpy(&w1, buf + 8, 8);
		memcpy(buf, &w1, 8);
		memcpy(buf + 8, &w0, 8);
		assert_true(vmmrt_checksum_host(buf, SLOT) != out[0]);
	}

	/* LAYER: dst = src ^ fill(seed), at least ns long; src 0 means plain fill */
	memset(&a, 0, sizeof(a));
	a.dst = s2.va;
	a.src = s1.va;
	a.bytes = SLOT;
	a.seed = 5;
	a.ns = 30 * MS;
	start = now_ns();
	OK(ops->kernel_launch(b, st, VMMRT_KERNEL_LAYER, &a));
	OK(ops->memcpy_dtoh_async(b, buf, s2.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	assert_true(now_ns() - start >= 30 * MS);
	for (size_t i = 0; i < SLOT / 8; i += 511) {
		uint64_t w;
		memcpy(&w, buf + i * 8, 8);
		assert_int_equal(w, vmmrt_fill_word(3, i) ^ vmmrt_fill_word(5, i));
	}
	a.src = 0;
	a.ns = 0;
	OK(ops->kernel_launch(b, st, VMMRT_KERNEL_LAYER, &a));
	OK(ops->memcpy_dtoh_async(b, buf, s2.va, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	for (size_t i = 0; i < SLOT / 8; i += 511) {
		uint64_t w;
		memcpy(&w, buf + i * 8, 8);
		assert_int_equal(w, vmmrt_fill_word(5, i));
	}

	/* sizes are checked at launch */
	memset(&a, 0, sizeof(a));
	a.dst = s1.va;
	a.src = s1.va;
	a.out = devptr(b, out);
	a.bytes = 12;
	FAILS(ops->kernel_launch(b, st, VMMRT_KERNEL_FILL, &a), VMMRT_E_INVALID_SIZE);
	FAILS(ops->kernel_launch(b, st, VMMRT_KERNEL_CHECKSUM, &a), VMMRT_E_INVALID_SIZE);
	FAILS(ops->kernel_launch(b, st, VMMRT_KERNEL_LAYER, &a), VMMRT_E_INVALID_SIZE);
	FAILS(ops->kernel_launch(b, st, VMMRT_KERNEL_COUNT_, &a), VMMRT_E_INVALID_ARGUMENT);
	a.ns = 1;
	OK(ops->kernel_launch(b, st, VMMRT_KERNEL_BUSY, &a));

	/* BUSY lasts what it says, seen through timing events */
	OK(ops->event_create(b, true, &t0));
	OK(ops->event_create(b, true, &t1));
	OK(ops->event_create(b, false, &plain));
	FAILS(ops->event_elapsed_ms(b, t0, t1, &ms), VMMRT_E_INVALID_STATE); /* never recorded */
	OK(ops->event_record(b, t0, st));
	k_busy(b, st, 25 * MS);
	OK(ops->event_record(b, t1, st));
	OK(ops->event_record(b, plain, st));
	OK(ops->stream_synchronize(b, st));
	OK(ops->event_elapsed_ms(b, t0, t1, &ms));
	assert_true(ms >= 24.9f);
	FAILS(ops->event_elapsed_ms(b, t0, plain, &ms), VMMRT_E_INVALID_STATE);
	k_busy(b, st, 100 * MS);
	OK(ops->event_record(b, t1, st));
	FAILS(ops->event_elapsed_ms(b, t0, t1, &ms), VMMRT_E_INVALID_STATE); /* not complete */
	OK(ops->stream_synchronize(b, st));

	OK(ops->event_destroy(b, t0));
	OK(ops->event_destroy(b, t1));
	OK(ops->event_destroy(b, plain));
	slot_free(b, &s1);
	slot_free(b, &s2);
	OK(ops->stream_destroy(b, st));
	OK(ops->host_free(b, buf));
	OK(ops->host_free(b, out));
}

/* ------------------------------------------------------------ latency model */

static uint64_t time_set_access(bool latency, size_t bytes)
{
	vmmrt__backend_config cfg = test_config();
	vmmrt__backend *b;
	vmmrt_devptr va;
	vmmrt__bhandle h;
	uint64_t t0, dt;

	/* accounting only: untouched memfd pages cost nothing */
	cfg.host_capacity = 2 * bytes;
	cfg.host_latency = latency;
	OK(ops->open(&cfg, &b));
	OK(ops->va_reserve(b, bytes, 0, &va));
	OK(ops->mem_create(b, bytes, &h));
	OK(ops->mem_map(b, va, bytes, h, 0));
	t0 = now_ns();
	OK(ops->mem_set_access(b, va, bytes));
	dt = now_ns() - t0;
	OK(ops->mem_unmap(b, va, bytes));
	OK(ops->mem_release(b, h));
	OK(ops->va_free(b, va, bytes));
	ops->close(b);
	return dt;
}

static void test_latency_model(void **state)
{
	vmmrt__backend_config cfg = test_config();
	uint64_t off = time_set_access(false, 256 * MiB);
	uint64_t on = time_set_access(true, 256 * MiB);
	vmmrt__backend *b;
	vmmrt_stream st;
	unsigned char *src, *dst;
	uint64_t t0;

	(void)state;
	print_message("# set_access(256 MiB): %.1f us without the model, %.1f us with it\n", off / 1e3, on / 1e3);
	assert_true(on >= 20000); /* the H200 takes 41 us */

	/* copies take bytes / bandwidth */
	cfg.host_latency = true;
	cfg.host_copy_gbps = 1.0;
	OK(ops->open(&cfg, &b));
	OK(ops->stream_create(b, &st));
	src = pinned(b, SLOT);
	dst = pinned(b, SLOT);
	t0 = now_ns();
	OK(ops->memcpy_dtoh_async(b, dst, (vmmrt_devptr)(uintptr_t)src, SLOT, st));
	OK(ops->stream_synchronize(b, st));
	assert_true(now_ns() - t0 >= 4 * MS); /* 4 MiB at 1 GB/s: 4.2 ms */
	ops->close(b);

	/* driver calls slow down while a copy is in flight (25 us idle, x5 with one copy) */
	cfg.host_copy_gbps = 0.05;
	OK(ops->open(&cfg, &b));
	OK(ops->stream_create(b, &st));
	src = pinned(b, SLOT);
	dst = pinned(b, SLOT);
	{
		vmmrt_devptr va;
		vmmrt__bhandle h;
		uint64_t dt;

		OK(ops->va_reserve(b, GRAN, 0, &va));
		OK(ops->mem_create(b, GRAN, &h));
		OK(ops->mem_map(b, va, GRAN, h, 0));
		memset(src, 0xa5, SLOT);
		memset(dst, 0, SLOT);
		OK(ops->memcpy_dtoh_async(b, dst, (vmmrt_devptr)(uintptr_t)src, SLOT, st)); /* 84 ms */
		/*
		 * In flight once its first chunk has landed (it streams 256 KiB
		 * pieces over 84 ms): waited for, not slept for, since a stream
		 * thread that a loaded machine schedules late would leave the call
		 * below to run before the copy began.
		 */
		for (unsigned waited = 0; *(volatile unsigned char *)dst != 0xa5; waited++) {
			assert_true(waited < 10000); /* 10 s */
			sleep_ms(1);
		}
		t0 = now_ns();
		OK(ops->mem_set_access(b, va, GRAN));
		dt = now_ns() - t0;
		print_message("# set_access(2 MiB) with a copy in flight: %.1f us\n", dt / 1e3);
		assert_true(dt >= 100000);
	}
	ops->close(b); /* also frees the mapping, the handle and the pinned buffers */
}

/* ------------------------------------------------------------- concurrency */

struct worker_arg {
	vmmrt__backend *b;
	vmmrt_stream shared;
	int *counter;
	int failures;
};

static void *vmm_worker(void *p)
{
	struct worker_arg *w = p;
	vmmrt_devptr va;
	vmmrt__bhandle h;

	if (ops->va_reserve(w->b, SLOT, 0, &va) != VMMRT_OK) {
		w->failures++;
		return NULL;
	}
	for (int i = 0; i < 100; i++) {
		if (ops->mem_create(w->b, SLOT, &h) != VMMRT_OK || ops->mem_map(w->b, va, SLOT, h, 0) != VMMRT_OK ||
		    ops->mem_set_access(w->b, va, SLOT) != VMMRT_OK) {
			w->failures++;
			break;
		}
		((volatile unsigned char *)(uintptr_t)va)[i * 4096] = (unsigned char)i;
		if (ops->launch_host_func(w->b, w->shared, count_fn, w->counter) != VMMRT_OK)
			w->failures++;
		if (ops->mem_unmap(w->b, va, SLOT) != VMMRT_OK || ops->mem_release(w->b, h) != VMMRT_OK) {
			w->failures++;
			break;
		}
	}
	if (ops->va_free(w->b, va, SLOT) != VMMRT_OK)
		w->failures++;
	return NULL;
}

static void test_concurrent_callers(void **state)
{
	vmmrt__backend *b = *state;
	struct worker_arg w[4];
	pthread_t th[4];
	vmmrt_stream st;
	int counter = 0;
	size_t f, t;

	OK(ops->stream_create(b, &st));
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker_arg){.b = b, .shared = st, .counter = &counter};
		assert_int_equal(pthread_create(&th[i], NULL, vmm_worker, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(w[i].failures, 0);
	}
	OK(ops->stream_synchronize(b, st));
	assert_int_equal(counter, 400);
	OK(ops->mem_info(b, &f, &t));
	assert_int_equal(f, CAP);
	OK(ops->stream_destroy(b, st));
}

/* close() frees what is left, including streams stuck on waits (checked by ASan/valgrind). */
static void test_close_releases_everything(void **state)
{
	vmmrt__backend_config cfg = test_config();
	vmmrt__backend *b;
	vmmrt_stream st, st2;
	vmmrt__bevent *e;
	vmmrt__bgraph *g;
	struct slot s;
	vmmrt__bhandle loose, orphan;
	vmmrt_devptr orphan_va;
	uint32_t *flag;
	char name[64];
	size_t gran;

	(void)state;
	OK(ops->open(&cfg, &b));
	OK(ops->device_name(b, name, sizeof(name)));
	assert_string_equal(name, "host-emulated (0.0625 GiB)");
	OK(ops->granularity(b, &gran));
	assert_int_equal(gran, GRAN);
	OK(ops->bind_thread(b));

	OK(ops->stream_create(b, &st));
	OK(ops->stream_create(b, &st2));
	OK(ops->event_create(b, true, &e));
	slot_new(b, &s, SLOT);
	OK(ops->mem_create(b, GRAN, &loose));
	OK(ops->mem_create(b, GRAN, &orphan));
	OK(ops->va_reserve(b, GRAN, 0, &orphan_va));
	OK(ops->mem_map(b, orphan_va, GRAN, orphan, 0));
	OK(ops->mem_release(b, orphan)); /* released while mapped */
	flag = pinned(b, 4096);

	OK(ops->stream_begin_capture(b, st));
	OK(ops->event_record(b, e, st));
	OK(ops->stream_end_capture(b, st, &g));
	OK(ops->stream_begin_capture(b, st2)); /* left capturing */
	OK(ops->event_record(b, e, st2));

	OK(ops->stream_wait_value32(b, st, devptr(b, flag), 1)); /* never released */
	OK(ops->graph_launch(b, g, st));
	k_busy(b, st, 10 * MS);
	ops->close(b); /* returns: the watchdog in main() catches a hang */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_remap_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unmapped_slot_faults, setup, teardown),
		cmocka_unit_test(test_stream_fault_kills),
		cmocka_unit_test_setup_teardown(test_capacity_oom, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vmm_named_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_map_at_offset, setup, teardown),
		cmocka_unit_test_setup_teardown(test_release_while_mapped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stream_fifo, setup, teardown),
		cmocka_unit_test_setup_teardown(test_event_cross_stream, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_free_synchronizes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_event_wait_enqueue_time, setup, teardown),
		cmocka_unit_test_setup_teardown(test_host_func_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wait_write_value32, setup, teardown),
		cmocka_unit_test_setup_teardown(test_graph_capture_replay, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stream_is_capturing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_graph_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kernels, setup, teardown),
		cmocka_unit_test(test_latency_model),
		cmocka_unit_test_setup_teardown(test_concurrent_callers, setup, teardown),
		cmocka_unit_test(test_close_releases_everything),
	};

	/*
	 * A stream that never drains (a lost wake-up, a host function allowed to
	 * synchronize its own stream) would hang the whole run: die instead.
	 */
	alarm(600);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

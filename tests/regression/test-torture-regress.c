/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Regression tests for the library bugs vmmrt-torture and the API fuzzer
 * found and that were fixed (numbers as in the torture's report):
 *  #3  a strategy dropped a slot whose destroy failed: its memory and VA stayed
 *      taken until the runtime was destroyed;
 *  #5  vmmrt_offload_allocate returned one failure with the message of another
 *      (its clean-up's);
 *  #7  vmmrt_offload_sync reported a timeout instead of the group failure that
 *      left the stream waiting;
 *  #10 a child of fork() hung in vmmrt_runtime_destroy (liburcu's call_rcu
 *      thread is the parent's);
 *  #11 a group's failure was published before its message was written, so
 *      vmmrt_group_error could read a message being rewritten (a data race
 *      that ThreadSanitizer reports; elsewhere, a torn message);
 *  #12 a slot destroy whose wait timed out, and whose teardown then failed on
 *      the worker, left the slot alive with nobody to destroy it;
 *  #14 vmmrt_runtime_destroy destroyed such a slot a second time (a DESTROY
 *      for a slot the first one frees) and reported it as not torn down;
 *  #15 the fault hook's function and context were published apart, so a
 *      driver call in flight could call one hook's function with another's
 *      context (ThreadSanitizer saw it when a test cleared the hook);
 *  #19 the hooks accepted a compute stream that was capturing a graph: their
 *      waits and event records went into the capture instead of the stream,
 *      so the event a worker polls before a backward's release was never
 *      really recorded ("complete"), and the release unmapped the slot before
 *      its restore and backward ran (the fuzzer: SIGSEGV in a later H2D);
 *  a map whose cuMemSetAccess failed, and whose roll-back cuMemUnmap failed
 *      too, left the memory mapped behind a slot that said it was not: its
 *      VA could not be freed (found by the short torture of make check).
 */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <urcu/uatomic.h>

#include "driver.h"
#include "offload.h"
#include "runtime.h"
#include "worker.h"
#include "test-layers.h"
#include "testing.h"
#include "tsan.h"

/*
 * GCC's ThreadSanitizer keeps the parent's threads in a forked child's
 * registry and dies there ("dup thread with used id", exit 66) when a thread
 * the child creates gets the stack, hence the id, of one that was running at
 * the fork: liburcu's call_rcu thread, a parent runtime's workers. Under it
 * a child can make no threads, so what runs in a child elsewhere runs here
 * in this process, or not at all when the fork is the point.
 */
#ifdef VMMRT__TSAN
#define CHILD_MAY_MAKE_THREADS 0
#else
#define CHILD_MAY_MAKE_THREADS 1
#endif

#define MiB (1024ull * 1024)

static vmmrt_runtime *make_rt(const char *mode, const char *timeout_ms)
{
	vmmrt_runtime *rt = NULL;
	const char *const opts[] = {"mode", mode, "host_capacity", "256M", "timeout_ms", timeout_ms, NULL};
	assert_int_equal(test_layers_runtime(opts, &rt), VMMRT_OK);
	return rt;
}

static void add_group(vmmrt_runtime *rt, size_t bytes)
{
	vmmrt_group *g;
	vmmrt_tensor_desc d = {.bytes = bytes, .dtype = 1, .ndim = 1, .shape = {(int64_t)(bytes / 8)}, .stride = {1}};
	assert_int_equal(vmmrt_group_create(rt, NULL, &g), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(g, &d), VMMRT_OK);
}

/* Fail the n-th call of each named operation (counting from 1); optionally
 * sleep before failing. */
typedef struct plan {
	const char *op[2];
	int at[2];
	int seen[2];
	uint64_t delay_us;
} plan;

static vmmrt_status hook(void *ctx, const char *op, uint64_t *delay_us)
{
	plan *p = ctx;
	for (int i = 0; i < 2; i++)
		if (p->op[i] && !strcmp(op, p->op[i]) && uatomic_add_return(&p->seen[i], 1) == p->at[i]) {
			*delay_us = p->delay_us;
			return VMMRT_E_DRIVER;
		}
	return VMMRT_OK;
}

/* #5 and #3: the second bank's map fails; the clean-up's unmap of the first
 * bank fails once too. The caller hears of the map, and nothing stays taken. */
static void failed_allocate_keeps_its_message_and_leaks_nothing(void **state)
{
	vmmrt_runtime *rt = make_rt("pingpong", "2000");
	plan p = {.op = {"cuMemMap", "cuMemUnmap"}, .at = {2, 1}};
	add_group(rt, 2 * MiB);
	add_group(rt, 2 * MiB);
	vmmrt__drv_set_fault_hook(rt, hook, &p);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuMemMap"));
	assert_null(strstr(vmmrt_last_error(), "cuMemUnmap"));
	assert_int_equal(p.seen[1], 2); /* the bank's destroy was tried again */
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	/* And allocation can be retried. */
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* A failed set access whose roll-back unmap fails once: the slot is left as
 * it was (the unmap is tried again), and destroying it frees everything. */
static void failed_rollback_of_a_map_is_tried_again(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "2000");
	plan p = {.op = {"cuMemSetAccess", "cuMemUnmap"}, .at = {1, 1}};
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, hook, &p);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "set access"));
	assert_int_equal(vmmrt_slot_get_state(s), VMMRT_SLOT_RESERVED);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* #7: a map that fails while vmmrt_offload_sync waits. Run in a child: the
 * stream then waits forever, and destroying such a runtime is the open
 * bug #2, so the child reports and leaves without destroying it. */
static void sync_names_the_failed_map(void **state)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(60);
		vmmrt_runtime *rt;
		vmmrt_stream c;
		vmmrt_group *g[2];
		const char *const opts[] = {"mode", "remap", "host_capacity", "256M", "timeout_ms", "1000", NULL};
		test_layers_cfg cfg = {.options = opts, .n = 2, .bytes = 2 * MiB, .dtype = 1, .capture = true};
		if (test_layers(&cfg, &rt, g, NULL))
			_exit(11);
		if (vmmrt_stream_create(rt, &c))
			_exit(10);
		/* The first iteration records the order; the map of the second
		 * iteration's first backward restore fails 300 ms late. */
		for (int it = 0; it < 2; it++) {
			if (it == 1) {
				static plan p = {.op = {"cuMemMap"}, .at = {1}, .delay_us = 300000};
				vmmrt__drv_set_fault_hook(rt, hook, &p);
			}
			if (vmmrt_forward_begin(g[0], c) || vmmrt_forward_end(g[0], c) || vmmrt_forward_begin(g[1], c) ||
			    vmmrt_forward_end(g[1], c) || vmmrt_backward_begin(g[1], c) || vmmrt_backward_end(g[1], c))
				_exit(14);
			if (it == 0 && (vmmrt_backward_begin(g[0], c) || vmmrt_backward_end(g[0], c)))
				_exit(15);
		}
		vmmrt_status st = vmmrt_offload_sync(rt);
		fprintf(stderr, "# child: vmmrt_offload_sync: %s\n", vmmrt_last_error());
		_exit(st == VMMRT_E_DRIVER && strstr(vmmrt_last_error(), "map") ? 0 : 1);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* #10: a runtime used here, then one made and destroyed in a child of fork(). */
static void runtime_in_a_forked_child(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "2000");
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK); /* the call_rcu thread exists now */
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(30); /* the hang this guards against */
		vmmrt_runtime *crt;
		vmmrt_slot *cs;
		if (vmmrt_runtime_create(NULL, &crt) != VMMRT_OK)
			_exit(2);
		if (vmmrt_slot_create(crt, 2 * MiB, &cs) != VMMRT_OK || vmmrt_slot_map(cs) != VMMRT_OK ||
		    vmmrt_slot_destroy(cs) != VMMRT_OK)
			_exit(3);
		_exit(vmmrt_runtime_destroy(crt) == VMMRT_OK ? 0 : 4);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

#if CHILD_MAY_MAKE_THREADS /* the threads of the child are the test */
/*
 * A data-loader worker: forked while the parent's runtime (its driver
 * workers registered with liburcu) is alive and busy, the child makes and
 * destroys runtimes of its own, twice (new threads reuse the stacks of the
 * parent's, which were liburcu readers), and the parent goes on after.
 */
static void runtime_in_a_child_while_the_parent_has_one(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "2000");
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(30);
		for (int round = 0; round < 2; round++) {
			vmmrt_runtime *crt;
			vmmrt_slot *cs;
			if (vmmrt_runtime_create(NULL, &crt) != VMMRT_OK)
				_exit(2);
			for (int i = 0; i < 8; i++)
				if (vmmrt_slot_create(crt, 2 * MiB, &cs) != VMMRT_OK || vmmrt_slot_map(cs) != VMMRT_OK ||
				    vmmrt_slot_destroy(cs) != VMMRT_OK)
					_exit(3);
			if (vmmrt_runtime_destroy(crt) != VMMRT_OK)
				_exit(4);
		}
		_exit(0);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status))
		fail_msg("the child died of signal %d", WTERMSIG(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}
#endif

/* #11: a worker-side failure (here: a thread) while the application reads. */
static const char long_why[] = "a step whose description is long enough to be caught half-written";

static void *fail_repeatedly(void *arg)
{
	vmmrt_group *g = arg;
	for (int i = 0; i < 20000; i++)
		vmmrt__group_fail(g, VMMRT_E_DRIVER, (i & 1) ? long_why : "short");
	return NULL;
}

static void group_error_message_is_whole(void **state)
{
	vmmrt_runtime *rt = make_rt("pingpong", "2000");
	vmmrt_group *g;
	vmmrt_tensor_desc d = {.bytes = 4096, .dtype = 1, .ndim = 1, .shape = {512}, .stride = {1}};
	assert_int_equal(vmmrt_group_create(rt, "G", &g), VMMRT_OK);
	assert_int_equal(vmmrt_group_discover(g, &d), VMMRT_OK);
	assert_int_equal(vmmrt_offload_allocate(rt), VMMRT_OK);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, fail_repeatedly, g), 0);
	unsigned seen = 0;
	for (int i = 0; i < 200000 && seen < 2000; i++) {
		vmmrt_status st = vmmrt_group_error(g);
		if (st == VMMRT_OK)
			continue;
		assert_int_equal(st, VMMRT_E_DRIVER);
		const char *m = vmmrt_last_error();
		char want_long[256], want_short[128];
		snprintf(want_long, sizeof(want_long), "VMMRT_E_DRIVER: group 'G': %s: driver error (the host copy is intact)",
			 long_why);
		snprintf(want_short, sizeof(want_short),
			 "VMMRT_E_DRIVER: group 'G': short: driver error (the host copy is intact)");
		if (strcmp(m, want_long) && strcmp(m, want_short))
			fail_msg("torn message: \"%s\"", m);
		seen++;
	}
	pthread_join(t, NULL);
	(void)vmmrt_group_error(g);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The first unmap takes 600 ms, and succeeds. */
static vmmrt_status stall_unmap(void *ctx, const char *op, uint64_t *delay_us)
{
	plan *p = ctx;
	if (!strcmp(op, "cuMemUnmap") && uatomic_add_return(&p->seen[0], 1) == 1)
		*delay_us = 600000;
	return VMMRT_OK;
}

/* #12: the unmap of a destroy stalls past the timeout, then fails once. */
static void abandoned_destroy_still_tears_down(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "300");
	plan p = {.op = {"cuMemUnmap"}, .at = {1}, .delay_us = 600000};
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, hook, &p);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_E_TIMEOUT); /* abandoned to the worker */
	assert_int_equal(vmmrt__slot_pools_trim(rt->workers), VMMRT_OK); /* behind it: it has run */
	assert_int_equal(p.seen[0], 2);
	assert_int_equal(uatomic_read(&rt->live_slots), 0);
	assert_int_equal(uatomic_read(&rt->live_handles), 0);
	assert_int_equal(uatomic_read(&rt->live_reservations), 0);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* #14: a destroy abandoned behind a stalled unmap, then the runtime's. */
static void runtime_destroy_after_an_abandoned_destroy(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "300");
	plan p = {.op = {NULL}}; /* stall_unmap counts in seen[0] */
	vmmrt_slot *s;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
	vmmrt__drv_set_fault_hook(rt, stall_unmap, &p);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_E_TIMEOUT); /* still queued behind the stall */
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* #15: hooks swapped while a worker makes driver calls: each call must see
 * its own hook's context. */
typedef struct tagged {
	int tag;
	int32_t wrong;
} tagged;

static vmmrt_status tag_a(void *ctx, const char *op, uint64_t *delay_us)
{
	tagged *t = ctx;
	if (t->tag != 'a')
		uatomic_inc(&t->wrong);
	return VMMRT_OK;
}

static vmmrt_status tag_b(void *ctx, const char *op, uint64_t *delay_us)
{
	tagged *t = ctx;
	if (t->tag != 'b')
		uatomic_inc(&t->wrong);
	return VMMRT_OK;
}

static int32_t swapping_done;
static tagged hook_a = {'a', 0}, hook_b = {'b', 0};

/* No cmocka assertion here: cmocka is not thread-safe; main checks. Every
 * set keeps a small record until destroy: a bounded number of them. */
static void *swap_hooks(void *arg)
{
	vmmrt_runtime *rt = arg;
	for (int i = 0; i < 20000; i++) {
		vmmrt__drv_set_fault_hook(rt, tag_a, &hook_a);
		vmmrt__drv_set_fault_hook(rt, tag_b, &hook_b);
		vmmrt__drv_set_fault_hook(rt, NULL, NULL);
		if (i % 64 == 0)
			sched_yield();
	}
	uatomic_set(&swapping_done, 1);
	return NULL;
}

static void fault_hook_pairs_stay_whole(void **state)
{
	vmmrt_runtime *rt = make_rt("remap", "2000");
	vmmrt_slot *s;
	pthread_t t;
	assert_int_equal(vmmrt_slot_create(rt, 2 * MiB, &s), VMMRT_OK);
	assert_int_equal(pthread_create(&t, NULL, swap_hooks, rt), 0);
	/* Driver calls on the worker for as long as the hooks change under them. */
	for (int i = 0; i < 20 || !uatomic_read(&swapping_done); i++) {
		assert_int_equal(vmmrt_slot_map(s), VMMRT_OK);
		assert_int_equal(vmmrt_slot_unmap(s), VMMRT_OK);
	}
	pthread_join(t, NULL);
	assert_int_equal(uatomic_read(&hook_a.wrong) + uatomic_read(&hook_b.wrong), 0);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_slot_destroy(s), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

/* The status and message of a hook refused because its stream captures. */
static bool refused_for_capture(vmmrt_status st, const char *hook)
{
	const char *m = vmmrt_last_error();
	return st == VMMRT_E_CAPTURE && strstr(m, "VMMRT_E_CAPTURE") && strstr(m, hook) && strstr(m, "capturing");
}

/* One group of 1 MiB, allocated and captured, and a compute stream. */
static vmmrt_runtime *one_group(const char *mode, vmmrt_group **g, vmmrt_stream *c, vmmrt_devptr *addr)
{
	vmmrt_runtime *rt;
	const char *const opts[] = {"mode", mode, "host_capacity", "64M", NULL};
	test_layers_cfg cfg = {.options = opts, .n = 1, .bytes = MiB, .dtype = 1, .capture = true};
	if (test_layers(&cfg, &rt, g, addr) || vmmrt_stream_create(rt, c))
		return NULL;
	return rt;
}

/*
 * #19: every hook refuses a capturing compute stream before it changes
 * anything (not even the group's pending error is taken), in every mode; once
 * the capture has ended, a whole iteration runs and restores the bytes. In a
 * child: accepted hooks used to end in a SIGSEGV.
 */
static int capture_refused_then_iteration(const char *mode)
{
	vmmrt_group *g;
	vmmrt_stream c;
	vmmrt_devptr a;
	vmmrt_graph *gr;
	uint64_t *back = malloc(MiB);
	vmmrt_runtime *rt = one_group(mode, &g, &c, &a);
	if (!rt || !back)
		return 10;
	if (vmmrt_graph_begin_capture(rt, c))
		return 11;
	vmmrt__group_fail(g, VMMRT_E_DRIVER, "an earlier step");
	if (!refused_for_capture(vmmrt_forward_begin(g, c), "vmmrt_forward_begin") ||
	    !refused_for_capture(vmmrt_forward_end(g, c), "vmmrt_forward_end") ||
	    !refused_for_capture(vmmrt_backward_begin(g, c), "vmmrt_backward_begin") ||
	    !refused_for_capture(vmmrt_backward_end(g, c), "vmmrt_backward_end"))
		return 12;
	if (vmmrt_group_error(g) != VMMRT_E_DRIVER || vmmrt_group_error(g) != VMMRT_OK)
		return 13; /* the refusals left the group's error for its next hook */
	if (vmmrt_graph_end_capture(rt, c, &gr) || vmmrt_graph_destroy(rt, gr))
		return 14;
	/* The first iteration, as if the refused calls had never been made. */
	if (vmmrt_forward_begin(g, c) || vmmrt_kernel_fill(rt, c, a, MiB, 19) || vmmrt_forward_end(g, c) ||
	    vmmrt_backward_begin(g, c) || vmmrt_stream_synchronize(rt, c) || vmmrt_copy_to_host(rt, back, a, MiB) ||
	    vmmrt_backward_end(g, c) || vmmrt_offload_sync(rt))
		return 15;
	for (uint64_t i = 0; i < MiB / 8; i++)
		if (back[i] != vmmrt_fill_word(19, i))
			return 16;
	free(back);
	return vmmrt_stream_destroy(rt, c) || vmmrt_runtime_destroy(rt) ? 17 : 0;
}

static void hooks_refuse_a_capturing_stream(void **state)
{
	static const char *const modes[] = {"pingpong", "remap", "none"};
	for (unsigned i = 0; i < 3; i++) {
		if (!CHILD_MAY_MAKE_THREADS) {
			int rc = capture_refused_then_iteration(modes[i]);
			if (rc)
				fail_msg("mode %s: step %d: %s", modes[i], rc, vmmrt_last_error());
			continue;
		}
		fflush(NULL);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			signal(SIGSEGV, SIG_DFL);
			signal(SIGBUS, SIG_DFL);
			alarm(60);
			int rc = capture_refused_then_iteration(modes[i]);
			if (rc)
				fprintf(stderr, "# child (%s): step %d: %s\n", modes[i], rc, vmmrt_last_error());
			_exit(rc);
		}
		int status;
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (WIFSIGNALED(status))
			fail_msg("mode %s: the child died of signal %d", modes[i], WTERMSIG(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
}

/* A failure of the capture query itself fails the hook with that named error,
 * and changes nothing either: the same hook then goes through. */
static void hook_fails_when_the_capture_query_fails(void **state)
{
	vmmrt_group *g;
	vmmrt_stream c;
	vmmrt_devptr a;
	vmmrt_runtime *rt = one_group("remap", &g, &c, &a);
	plan p = {.op = {"cuStreamIsCapturing"}, .at = {1}};
	assert_non_null(rt);
	vmmrt__drv_set_fault_hook(rt, hook, &p);
	assert_int_equal(vmmrt_forward_begin(g, c), VMMRT_E_DRIVER);
	assert_non_null(strstr(vmmrt_last_error(), "cuStreamIsCapturing"));
	assert_non_null(strstr(vmmrt_last_error(), "vmmrt_forward_begin"));
	assert_int_equal(vmmrt_forward_begin(g, c), VMMRT_OK);
	assert_int_equal(vmmrt_forward_end(g, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_begin(g, c), VMMRT_OK);
	assert_int_equal(vmmrt_backward_end(g, c), VMMRT_OK);
	assert_int_equal(p.seen[0], 5);
	vmmrt__drv_set_fault_hook(rt, NULL, NULL);
	assert_int_equal(vmmrt_offload_sync(rt), VMMRT_OK);
	assert_int_equal(vmmrt_stream_destroy(rt, c), VMMRT_OK);
	assert_int_equal(vmmrt_runtime_destroy(rt), VMMRT_OK);
}

int main(void)
{
	/* The child of runtime_in_a_forked_child picks the backend itself. */
	setenv("VMMRT_BACKEND", "host", 1);
	if (!CHILD_MAY_MAKE_THREADS)
		printf("# ThreadSanitizer: runtime_in_a_child_while_the_parent_has_one left out\n");
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(failed_allocate_keeps_its_message_and_leaks_nothing),
		cmocka_unit_test(failed_rollback_of_a_map_is_tried_again),
		cmocka_unit_test(sync_names_the_failed_map),
		cmocka_unit_test(runtime_in_a_forked_child),
#if CHILD_MAY_MAKE_THREADS
		cmocka_unit_test(runtime_in_a_child_while_the_parent_has_one),
#endif
		cmocka_unit_test(group_error_message_is_whole),
		cmocka_unit_test(abandoned_destroy_still_tears_down),
		cmocka_unit_test(runtime_destroy_after_an_abandoned_destroy),
		cmocka_unit_test(fault_hook_pairs_stay_whole),
		cmocka_unit_test(hooks_refuse_a_capturing_stream),
		cmocka_unit_test(hook_fails_when_the_capture_query_fails),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

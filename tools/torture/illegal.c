/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Illegal calls: each must come back with its named error and change
 * nothing, which the scenario then proves by carrying on with the legal
 * sequence and verifying every activation. A call that is accepted, or that
 * fails with another status, is a failure -- unless an injected fault got
 * there first (an earlier asynchronous failure is reported by the next call
 * on the group, whatever that call is), which ends the scenario like any
 * reported error.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "driver.h"
#include "scenario.h"

static bool fault_status(vmmrt_status st)
{
	switch (st) {
	case VMMRT_E_OUT_OF_MEMORY:
	case VMMRT_E_HOST_OUT_OF_MEMORY:
	case VMMRT_E_DRIVER:
	case VMMRT_E_TIMEOUT:
	case VMMRT_E_CANCELLED:
		return true;
	default:
		return false;
	}
}

void s_expect(scen *s, vmmrt_status got, vmmrt_status want, const char *what)
{
	const char *msg = vmmrt_last_error();
	if (got == want && msg && strstr(msg, vmmrt_status_name(want))) {
		atomic_fetch_add_explicit(&T.illegal_checked, 1, memory_order_relaxed);
		s->checked_illegal++;
		return;
	}
	if (got != VMMRT_OK && got != want && fault_status(got) && fault_causes(&s->fc)) {
		s_ok(s, got, what); /* an injected fault reported first: a named error */
		return;
	}
	if (got == want)
		t_fail(s->seed, "unnamed-error", "%s: %s, but the message does not name it: \"%s\"", what,
		       vmmrt_status_name(want), msg ? msg : "(null)");
	else
		t_fail(s->seed, "illegal-accepted", "%s: returned %s, want %s (%s)", what, vmmrt_status_name(got),
		       vmmrt_status_name(want), got == VMMRT_OK ? "the illegal call was accepted" : msg);
	s->errored = true; /* the sequence is no longer what we think it is */
	snprintf(s->errmsg, sizeof(s->errmsg), "illegal call %s was not refused", what);
}

#define EXPECT(s, want, call) s_expect((s), API((s), #call, call), (want), #call)

static grp *pick_nonempty(scen *s, unsigned not_gi)
{
	unsigned cand[MAXG], n = 0;
	for (unsigned i = 0; i < s->ng; i++)
		if (s->G[i].nt && i != not_gi)
			cand[n++] = i;
	return n ? &s->G[cand[rnd(&s->r) % n]] : NULL;
}

/* --------------------------------------------------------- life-cycle calls */

/* The life-cycle calls refused before vmmrt_offload_allocate (allocated
 * false) or after it, on a non-empty group. */
void illegal_life_cycle(scen *s, bool allocated)
{
	grp *g = pick_nonempty(s, MAXG);
	vmmrt_group *h = NULL;
	vmmrt_devptr a;
	if (!g)
		return;
	if (!allocated) {
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(g->g, NULL));
		EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_group_discover(g->g, &(vmmrt_tensor_desc){.bytes = 0}));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(g->g, &(vmmrt_tensor_desc){.bytes = 8, .ndim = 9}));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_discover(g->g, &(vmmrt_tensor_desc){.bytes = 8, .align = 3}));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_begin_capture(g->g));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_save(g->g, &g->t[0].d, 0, NULL, &a));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_forward_begin(g->g, s->compute));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_end(g->g, s->compute));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_offload_sync(s->rt));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_create(NULL, "x", &h));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_create(s->rt, "x", NULL));
		return;
	}
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_create(s->rt, "late", &h));
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_offload_allocate(s->rt));
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_discover(g->g, &g->t[0].d));
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_save(g->g, &g->t[0].d, 0, NULL, &a));
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_group_end_capture(g->g));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_group_error(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_offload_sync(NULL));
}

/* ------------------------------------------------------------------- hooks */

/* The next use the schedule expects, once it is known: the next use of a
 * non-empty group from `pos` on, wrapping to the next iteration. */
static void expected_next(scen *s, unsigned pos, unsigned *gi, bool *bwd)
{
	for (unsigned n = 0; n < 2 * s->ng; n++) {
		unsigned k = (pos + n) % (2 * s->ng);
		if (s->G[s->use_g[k]].nt) {
			*gi = s->use_g[k];
			*bwd = s->use_b[k];
			return;
		}
	}
}

/* A non-empty group whose use of kind `bwd` lies in [from, to) of the order. */
static bool nonempty_in(scen *s, bool bwd, unsigned from, unsigned to, unsigned *gi)
{
	for (unsigned k = from; k < to; k++)
		if (s->use_b[k] == bwd && s->G[s->use_g[k]].nt) {
			*gi = s->use_g[k];
			return true;
		}
	return false;
}

void illegal_hooks(scen *s, unsigned it, unsigned pos)
{
	trng *r = &s->r;
	vmmrt_stream c = s->compute;
	unsigned gi = 0;
	grp *h = pick_nonempty(s, MAXG);
	if (!h)
		return;
	/* Nothing is open between uses: an end without its begin. */
	if (chance(r, 0.5))
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_forward_end(h->g, c));
	else
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_end(h->g, c));
	if (chance(r, 0.3)) {
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_forward_begin(NULL, c));
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_backward_begin(NULL, NULL));
	}
	/* A hook on a stream that is capturing a graph: its waits and records
	 * would go into the capture, not the stream; refused, nothing changed. */
	if (chance(r, 0.1) && s_ok(s, API(s, "vmmrt_graph_begin_capture", vmmrt_graph_begin_capture(s->rt, c)),
				   "vmmrt_graph_begin_capture")) {
		vmmrt_graph *gr = NULL;
		if (chance(r, 0.5))
			EXPECT(s, VMMRT_E_CAPTURE, vmmrt_forward_begin(h->g, c));
		else
			EXPECT(s, VMMRT_E_CAPTURE, vmmrt_backward_end(h->g, c));
		if (s_ok(s, API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(s->rt, c, &gr)),
			 "vmmrt_graph_end_capture") &&
		    gr)
			s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(s->rt, gr)), "vmmrt_graph_destroy");
	}
	if (s->errored)
		return;
	/* Until the order is known, the iteration records it, up to its last
	 * non-empty use (which, when it begins, makes the order known). */
	unsigned n = 2 * s->ng;
	bool recording = !s->recorded && (nonempty_in(s, false, pos, n, &gi) || nonempty_in(s, true, pos, n, &gi));
	if (recording) {
		/* These break the recording's rules: a forward or a backward twice,
		 * a backward before its forward. */
		if (nonempty_in(s, false, pos, n, &gi))
			EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_begin(s->G[gi].g, c)); /* before its forward */
		if (nonempty_in(s, false, 0, pos, &gi))
			EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_forward_begin(s->G[gi].g, c)); /* twice */
		if (nonempty_in(s, true, 0, pos, &gi))
			EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_begin(s->G[gi].g, c)); /* twice */
		return;
	}
	/* Known: any other use than the expected one is out of order. */
	bool want_bwd = false;
	expected_next(s, pos, &gi, &want_bwd);
	bool kind = chance(r, 0.5);
	if (h == &s->G[gi] && kind == want_bwd) {
		h = pick_nonempty(s, gi);
		if (!h)
			kind = !want_bwd, h = &s->G[gi];
	}
	if (kind)
		EXPECT(s, VMMRT_E_MISMATCH, vmmrt_backward_begin(h->g, c));
	else
		EXPECT(s, VMMRT_E_MISMATCH, vmmrt_forward_begin(h->g, c));
}

void illegal_open_hook(scen *s, unsigned gi, bool backward)
{
	grp *g = &s->G[gi];
	vmmrt_stream c = s->compute;
	if (backward) {
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_begin(g->g, c)); /* begun twice */
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_forward_end(g->g, c));    /* the other end */
	} else {
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_forward_begin(g->g, c));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_backward_end(g->g, c));
	}
}

/* ------------------------------------------------------ slots and handles */

void illegal_slots(scen *s)
{
	vmmrt_runtime *rt = s->rt;
	vmmrt_slot *x = NULL;
	EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_slot_create(rt, 0, &x));
	EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_slot_create(rt, SIZE_MAX, &x));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_slot_create(NULL, 4096, &x));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_slot_create(rt, 4096, NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_slot_map(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_slot_unmap(NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_slot_destroy(NULL));
	if (s->errored)
		return;
	size_t bytes = (size_t)rnd_in(&s->r, 1, 3 * s->gran);
	if (!s_ok(s, API(s, "vmmrt_slot_create", vmmrt_slot_create(rt, bytes, &x)), "vmmrt_slot_create"))
		return;
	vmmrt_devptr va = vmmrt_slot_address(x);
	if (!va || vmmrt_slot_size(x) < bytes || vmmrt_slot_size(x) % s->gran || va % s->gran)
		t_fail(s->seed, "slot", "slot of %zu bytes: address 0x%llx, size %zu (granularity %zu)", bytes,
		       (unsigned long long)va, vmmrt_slot_size(x), s->gran);
	EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_slot_unmap(x)); /* nothing mapped: a release without a map */
	if (!s->errored && s_ok(s, API(s, "vmmrt_slot_map", vmmrt_slot_map(x)), "vmmrt_slot_map")) {
		if (vmmrt_slot_get_state(x) != VMMRT_SLOT_MAPPED)
			t_fail(s->seed, "state", "slot mapped but in state %d", (int)vmmrt_slot_get_state(x));
		EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_slot_map(x));
		if (!s->errored && chance(&s->r, 0.6) &&
		    s_ok(s, API(s, "vmmrt_slot_unmap", vmmrt_slot_unmap(x)), "vmmrt_slot_unmap"))
			EXPECT(s, VMMRT_E_INVALID_STATE, vmmrt_slot_unmap(x)); /* double release */
	}
	if (vmmrt_slot_address(x) != va)
		t_fail(s->seed, "moved", "slot moved from 0x%llx to 0x%llx", (unsigned long long)va,
		       (unsigned long long)vmmrt_slot_address(x));
	if (!s_ok(s, API(s, "vmmrt_slot_destroy", vmmrt_slot_destroy(x)), "vmmrt_slot_destroy") && s->nleft < 4)
		s->leftover[s->nleft++] = x; /* still live: destroyed again at the end */
}

/* Double frees of driver objects: the host backend's registries refuse them
 * (on a GPU they are undefined behaviour, so only on the host backend). */
void illegal_handles(scen *s)
{
	vmmrt_runtime *rt = s->rt;
	void *p = NULL;
	vmmrt_stream st2 = NULL;
	vmmrt_graph *gr = NULL;
	uint64_t word;
	EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_host_alloc(rt, 0, &p));
	EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_kernel_fill(rt, s->compute, vmmrt_slot_address(s->input), 12, 1));
	EXPECT(s, VMMRT_E_INVALID_SIZE, vmmrt_copy_to_host(rt, &word, vmmrt_slot_address(s->input), 0));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_stream_destroy(rt, NULL));      /* a default stream */
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_stream_destroy(rt, VMMRT_STREAM_PER_THREAD));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_graph_launch(rt, NULL, s->compute));
	if (s->errored)
		return;
	if (s_ok(s, API(s, "vmmrt_host_alloc", vmmrt_host_alloc(rt, 100, &p)), "vmmrt_host_alloc") &&
	    s_ok(s, API(s, "vmmrt_host_free", vmmrt_host_free(rt, p)), "vmmrt_host_free"))
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_host_free(rt, p));
	if (s->errored || !s_ok(s, API(s, "vmmrt_stream_create", vmmrt_stream_create(rt, &st2)), "vmmrt_stream_create"))
		return;
	if (s_ok(s, API(s, "vmmrt_graph_begin_capture", vmmrt_graph_begin_capture(rt, st2)), "vmmrt_graph_begin_capture")) {
		EXPECT(s, VMMRT_E_CAPTURE, vmmrt_stream_synchronize(rt, st2));
		bool k = s_ok(s, API(s, "vmmrt_kernel_busy", vmmrt_kernel_busy(rt, st2, 1000)), "vmmrt_kernel_busy");
		s_quiet(s, !k);
		if (s_ok(s, API(s, "vmmrt_graph_end_capture", vmmrt_graph_end_capture(rt, st2, &gr)),
			 "vmmrt_graph_end_capture") &&
		    s_ok(s, API(s, "vmmrt_graph_destroy", vmmrt_graph_destroy(rt, gr)), "vmmrt_graph_destroy"))
			EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_graph_destroy(rt, gr));
		s_quiet(s, false);
	}
	if (s_ok(s, API(s, "vmmrt_stream_destroy", vmmrt_stream_destroy(rt, st2)), "vmmrt_stream_destroy"))
		EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_stream_destroy(rt, st2));
}

void illegal_options(scen *s)
{
	vmmrt_options *o = NULL;
	char buf[8];
	if (vmmrt_options_create(&o) != VMMRT_OK) {
		t_fail(s->seed, "setup", "vmmrt_options_create: %s", vmmrt_last_error());
		return;
	}
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "driver_workers", "0"));
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "mode", "sideways"));
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "no_such_option", "1"));
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "timeout_ms", "-5"));
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "host_granularity", "3000"));
	EXPECT(s, VMMRT_E_INVALID_OPTION, vmmrt_options_set(o, "lookahead", NULL));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_options_set(NULL, "mode", "remap"));
	EXPECT(s, VMMRT_E_INVALID_ARGUMENT, vmmrt_options_get(o, "mode", buf, 0));
	vmmrt_options_destroy(o);
}

/* ------------------------------------------------------- host functions */

/* Runs on the stream's callback thread: every call that can reach the driver
 * must be refused with VMMRT_E_NOT_PERMITTED before it touches anything
 * (accessors and option calls are allowed anywhere, vmmrt.h). */
static void probe_fn(void *arg)
{
	hostfn_probe *p = arg;
	scen *s = p->s;
	grp *g = NULL;
	for (unsigned i = 0; i < s->ng && !g; i++)
		if (s->G[i].nt)
			g = &s->G[i];
	vmmrt_slot *x = NULL;
	vmmrt_stream st = NULL;
	vmmrt_group *ng = NULL;
	vmmrt_runtime *rt2 = NULL;
	void *hp = NULL;
	size_t f, t;
	uint64_t word;
	p->n = 0;
#define P(call) \
	do { \
		p->what[p->n] = #call; \
		p->st[p->n++] = (call); \
	} while (0)
	P(vmmrt_slot_map(s->input));
	P(vmmrt_slot_unmap(s->input));
	P(vmmrt_slot_map_async(s->input));
	P(vmmrt_slot_release_after(s->input, s->compute));
	P(vmmrt_slot_destroy(s->results));
	P(vmmrt_slot_create(s->rt, 4096, &x));
	P(vmmrt_stream_create(s->rt, &st));
	P(vmmrt_stream_synchronize(s->rt, s->compute));
	P(vmmrt_forward_begin(g->g, s->compute));
	P(vmmrt_backward_end(g->g, s->compute));
	P(vmmrt_offload_sync(s->rt));
	P(vmmrt_offload_allocate(s->rt));
	P(vmmrt_group_create(s->rt, "from-a-host-function", &ng));
	P(vmmrt_group_begin_capture(g->g));
	P(vmmrt_copy_to_host(s->rt, &word, vmmrt_slot_address(s->input), 8));
	P(vmmrt_mem_info(s->rt, &f, &t));
	P(vmmrt_kernel_fill(s->rt, s->compute, vmmrt_slot_address(s->input), 8, 1));
	P(vmmrt_graph_launch(s->rt, g->fwd, s->compute));
	P(vmmrt_host_alloc(s->rt, 64, &hp));
	P(vmmrt_slot_wait(s->input));
	P(vmmrt_runtime_destroy(s->rt));
	P(vmmrt_runtime_create(NULL, &rt2));
	P(vmmrt_graph_destroy(s->rt, g->bwd));
#undef P
	p->side_effect = x || st || ng || rt2 || hp;
	atomic_store(&p->ran, 1);
}

void hostfn_probe_launch(scen *s)
{
	memset(&s->probe, 0, sizeof(s->probe));
	s->probe.s = s;
	if (s_ok(s, API(s, "cuLaunchHostFunc(probe)", vmmrt__drv_launch_host_func(s->rt, s->compute, probe_fn, &s->probe)),
		 "launch of a host function"))
		s->probe_pending = true;
}

/* After the compute stream drained: the probe ran, and was refused throughout. */
void hostfn_probe_check(scen *s)
{
	hostfn_probe *p = &s->probe;
	if (!s->probe_pending)
		return;
	s->probe_pending = false;
	if (!atomic_load(&p->ran)) {
		t_fail(s->seed, "hostfn", "a host function enqueued on the drained compute stream never ran");
		return;
	}
	for (unsigned i = 0; i < p->n; i++) {
		if (p->st[i] == VMMRT_E_NOT_PERMITTED) {
			atomic_fetch_add_explicit(&T.hostfn_checked, 1, memory_order_relaxed);
			continue;
		}
		t_fail(s->seed, "hostfn", "%s from inside a host function returned %s, want VMMRT_E_NOT_PERMITTED",
		       p->what[i], vmmrt_status_name(p->st[i]));
	}
	if (p->side_effect)
		t_fail(s->seed, "hostfn", "a call from inside a host function created an object");
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* A scenario's settings, all from its seed: the runtime's options, the
 * groups and tensors, the order of an iteration, the faults; and the runtime
 * made from them. */
#include "config.h"

#include <stdio.h>
#include <string.h>

#include "driver.h"
#include "model/synth.h"

#include "scenario.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

void s_configure(scen *s)
{
	trng *r = &s->r;
	static const double gbps[] = {0.5, 1, 2, 5, 20};
	static const size_t aligns[] = {0, 8, 64, 256, 4096};

	if (cfg.strategy == STRAT_PINGPONG)
		s->mode = VMMRT_MODE_PINGPONG;
	else if (cfg.strategy == STRAT_REMAP)
		s->mode = VMMRT_MODE_REMAP;
	else
		s->mode = (rnd(r) & 1) ? VMMRT_MODE_REMAP : VMMRT_MODE_PINGPONG;
	s->ng = (unsigned)rnd_in(r, cfg.groups.lo, cfg.groups.hi);
	s->lookahead = (unsigned)rnd_in(r, cfg.lookahead.lo, cfg.lookahead.hi);
	s->workers = (unsigned)rnd_in(r, cfg.workers.lo, cfg.workers.hi);
	s->pool = (s->mode == VMMRT_MODE_REMAP && chance(r, 0.4)) ? (unsigned)rnd_in(r, 1, 4) : 0;
	s->oom_retries = (unsigned)rnd_in(r, 0, 3);
	s->latency = chance(r, 0.4);
	s->gbps = gbps[rnd(r) % 5];
	s->gran = chance(r, 0.8) ? 64 * KiB : 2 * MiB;
	s->fwd_ns = chance(r, 0.5) ? rnd_in(r, 0, 200000) : 0;
	s->bwd_ns = chance(r, 0.6) ? rnd_in(r, 0, 2000000) : 0;
	s->target_iters = (unsigned)rnd_in(r, cfg.iterations.lo, cfg.iterations.hi);

	s->nres = 0;
	s->nonempty = 0;
	s->input_bytes = 8;
	for (unsigned i = 0; i < s->ng; i++) {
		grp *g = &s->G[i];
		snprintf(g->name, sizeof(g->name), "L%u", i);
		g->nt = (s->ng > 1 && chance(r, 0.1)) ? 0 : (unsigned)rnd_in(r, cfg.tensors.lo, cfg.tensors.hi);
		if (i == s->ng - 1 && s->nonempty == 0 && g->nt == 0)
			g->nt = 1;
		if (g->nt)
			s->nonempty++;
		for (unsigned k = 0; k < g->nt; k++) {
			tens *t = &g->t[k];
			size_t bytes = (size_t)rnd_in(r, cfg.tensor_bytes.lo, cfg.tensor_bytes.hi) & ~(size_t)7;
			if (bytes < 8)
				bytes = 8;
			memset(&t->d, 0, sizeof(t->d));
			t->d.bytes = bytes;
			t->d.dtype = (uint32_t)(rnd(r) % 24);
			t->d.ndim = 1 + (uint32_t)(rnd(r) % 3);
			t->d.shape[0] = (int64_t)(bytes / 8);
			t->d.stride[0] = 1;
			for (unsigned d = 1; d < t->d.ndim; d++) {
				t->d.shape[d] = 1 + (int64_t)(rnd(r) % 7);
				t->d.stride[d] = (int64_t)(rnd(r) % 100);
			}
			t->d.align = aligns[rnd(r) % 5];
			t->seed = rnd(r) | 1;
			t->rix = s->nres++;
			if (bytes > s->input_bytes)
				s->input_bytes = bytes;
		}
	}
	/* Forward in registration order; backward reversed, or any order the
	 * first iteration records (the schedule must follow what it saw). */
	for (unsigned i = 0; i < s->ng; i++)
		s->fwd_order[i] = i;
	for (unsigned i = 0; i < s->ng; i++)
		s->bwd_order[i] = s->ng - 1 - i;
	if (chance(r, 0.4))
		for (unsigned i = s->ng; i > 1; i--) {
			unsigned j = (unsigned)(rnd(r) % i), tmp = s->bwd_order[i - 1];
			s->bwd_order[i - 1] = s->bwd_order[j];
			s->bwd_order[j] = tmp;
		}

	/* Faults: some scenarios run clean, so that long fault-free sequences are covered too. */
	fault_ctx *f = &s->fc;
	f->seed = vmmrt__mix64(s->seed ^ 0xfa017ULL);
	bool armed = cfg.fault_rate > 0 && chance(r, 0.65);
	f->rate = armed ? cfg.fault_rate : 0;
	f->delay_rate = (armed || chance(r, 0.3)) ? cfg.delay_rate : 0;
	f->max_delay_us = (uint64_t)cfg.max_delay_ms * 1000;
	f->stall_us = (uint64_t)cfg.stall_ms * 1000;
	f->stall_rate = 0.05;
	f->oom_retries = s->oom_retries;
	atomic_store(&f->armed, armed ? 1 : 0);
	atomic_store(&f->stall_left, (armed && cfg.stall_ms && chance(r, 1.0 / 6)) ? 1 : 0);

	/*
	 * Some remap scenarios end, without a sync, right after the last forward
	 * of their second iteration (the first one records the schedule, and
	 * only then does look-ahead begin), a while before the runtime is
	 * destroyed: the restore of the first backward was requested ahead and
	 * waits on the H2D stream for a map that waits for its group's release,
	 * itself still behind a slow D2H. Teardown must wait for that release
	 * before it lets the restore write the slot (#17); one that did not was
	 * missed by every other way a scenario ends. The group (k) has two
	 * tensors or more, of the largest size, so its copies take several of
	 * the latency model's 256 KiB steps (13 ms each here) and an unmap in
	 * the middle of one faults; the others' are small, so its D2H starts at
	 * once; the backward order starts with it.
	 */
	unsigned k = s->ng;
	for (unsigned i = 0; i + 1 < s->ng; i++)
		if (s->G[i].nt >= 2)
			k = i;
	s->end_in_flight = s->mode == VMMRT_MODE_REMAP && k < s->ng && cfg.lookahead.hi >= 1 && chance(r, 0.15);
	if (s->end_in_flight) {
		s->latency = true;
		s->gbps = 0.02;
		if (s->lookahead == 0)
			s->lookahead = 1;
		s->input_bytes = 8;
		for (unsigned i = 0; i < s->ng; i++)
			for (unsigned t = 0; t < s->G[i].nt; t++) {
				tens *x = &s->G[i].t[t];
				x->d.bytes = (size_t)(i == k ? cfg.tensor_bytes.hi : cfg.tensor_bytes.lo) & ~(size_t)7;
				if (x->d.bytes < 8)
					x->d.bytes = 8;
				x->d.shape[0] = (int64_t)(x->d.bytes / 8);
				if (x->d.bytes > s->input_bytes)
					s->input_bytes = x->d.bytes;
			}
		for (unsigned i = 0; i < s->ng; i++)
			if (s->bwd_order[i] == k) {
				s->bwd_order[i] = s->bwd_order[0];
				s->bwd_order[0] = k;
			}
	}

	/* The order: all forwards then all backwards, or (not for the end in
	 * flight, which needs that order) a random legal one: at each step a
	 * forward not yet run or a backward whose forward ran (1F1B and
	 * interleaved chunks are among them). Declared before allocation, or
	 * recorded by the first iteration. */
	s->interleaved = !s->end_in_flight && chance(r, 0.5);
	if (!s->interleaved) {
		synth_order_cfg o = {.layers = s->ng, .fwd_order = s->fwd_order, .bwd_order = s->bwd_order};
		(void)synth_order(&o, s->use_g, s->use_b); /* afab: it cannot fail */
	} else {
		bool fdone[MAXG] = {0}, bdone[MAXG] = {0};
		unsigned n = 0, nf = 0, nb = 0;
		while (n < 2 * s->ng) {
			bool fwd = nf < s->ng && (nb == nf || chance(r, 0.5));
			for (unsigned pick = (unsigned)(rnd(r) % s->ng), tries = 0;; pick = (pick + 1) % s->ng, tries++) {
				if (fwd ? !fdone[pick] : fdone[pick] && !bdone[pick]) {
					(fwd ? fdone : bdone)[pick] = true;
					s->use_g[n] = pick;
					s->use_b[n++] = !fwd;
					if (fwd)
						nf++;
					else
						nb++;
					break;
				}
				if (tries > s->ng)
					break; /* not reached: a forward or a backward is always ready */
			}
		}
	}
	s->declared = chance(r, 0.4);
	/* Allocation maps every group for capture, outside remap's budget, and
	 * a group the schedule keeps resident holds that backing until its first
	 * backward's release: the peak is measured from the end of iteration 1,
	 * when every group's first release has run (its second map waited for it). */
	s->reset_at = 2;
}

static vmmrt_status set_opt(vmmrt_options *o, const char *k, const char *v)
{
	vmmrt_status st = vmmrt_options_set(o, k, v);
	if (st != VMMRT_OK)
		t_fail(0, "setup", "option %s=%s: %s", k, v, vmmrt_last_error());
	return st;
}

bool s_create_runtime(scen *s)
{
	vmmrt_options *o = NULL;
	char buf[64];
	bool good = false;

	if (vmmrt_options_create(&o) != VMMRT_OK) {
		t_fail(s->seed, "setup", "options: %s", vmmrt_last_error());
		return false;
	}
	if (set_opt(o, "backend", cfg.backend) || set_opt(o, "mode", mode_name(s->mode)))
		goto out;
#define OPTU(name, v) \
	do { \
		snprintf(buf, sizeof(buf), "%llu", (unsigned long long)(v)); \
		if (set_opt(o, name, buf)) \
			goto out; \
	} while (0)
	OPTU("lookahead", s->lookahead);
	OPTU("driver_workers", s->workers);
	OPTU("handle_pool", s->pool);
	OPTU("oom_retries", s->oom_retries);
	OPTU("oom_backoff_us", 50);
	OPTU("timeout_ms", cfg.timeout_ms);
	OPTU("checked_threads", 1);
	OPTU("host_granularity", s->gran);
	OPTU("host_latency", s->latency);
	snprintf(buf, sizeof(buf), "%g", s->gbps);
	if (set_opt(o, "host_copy_gbps", buf) || set_opt(o, "host_capacity", "1G"))
		goto out;
#undef OPTU
	/* No hook yet: creation itself must succeed. */
	vmmrt_status st = API(s, "vmmrt_runtime_create", vmmrt_runtime_create(o, &s->rt));
	if (st != VMMRT_OK) {
		t_fail(s->seed, "setup", "vmmrt_runtime_create: %s", vmmrt_last_error());
		s->rt = NULL;
		goto out;
	}
	vmmrt_runtime_info info = {.size = sizeof(info)};
	if (vmmrt_runtime_info_get(s->rt, &info) != VMMRT_OK || info.mode != s->mode ||
	    info.driver_workers != s->workers || info.lookahead != s->lookahead) {
		t_fail(s->seed, "setup", "runtime info does not match the options: %s", vmmrt_last_error());
		goto out;
	}
	s->cuda = strcmp(info.backend, "cuda") == 0;
	/* What the backend really uses: a GPU ignores host_granularity (2 MiB on the H200). */
	s->gran = info.granularity;
	if (API(s, "vmmrt_mem_info", vmmrt_mem_info(s->rt, &s->base_free, &s->base_total)) != VMMRT_OK) {
		t_fail(s->seed, "setup", "vmmrt_mem_info: %s", vmmrt_last_error());
		goto out;
	}
	vmmrt__drv_set_fault_hook(s->rt, t_fault_hook, &s->fc);
	atomic_store(&s->th->rt, s->rt);
	good = true;
out:
	vmmrt_options_destroy(o);
	return good;
}


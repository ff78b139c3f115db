/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Pages mapped at several addresses (vmmrt_pages, vmmrt_slot_map_pages),
 * between iterations: two slots of the application's bound to the same
 * bytes of one pages object, and random cycles where one writes on a
 * stream (fill, then a layer over it for a random while) and the other
 * checksums the same bytes. Between cycles, once the stream has drained (a
 * slot's unbind wants no work pending over it), a slot is unbound and bound
 * again, sometimes after mapping memory of its own in between (what a plan
 * falls back to), and the pages may be destroyed while both are bound: the
 * memory must stay for the cycles after.
 *
 * Checked: every cycle's checksum (the reader sees the writer's bytes);
 * slot_bytes back to where it was once everything is destroyed (the
 * scenario's end checks the handles too). The decision to run here and the
 * run's own choices come from the seed, not the scenario's stream, so the
 * scenarios of every seed stay what they were. Injected faults end the
 * cycles with a named error, as anywhere.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>

#include "scenario.h"

#define NCYCLES 12
_Static_assert(NCYCLES <= S_MAX_CYCLES, "s_verify_cycles reads at most S_MAX_CYCLES");

typedef struct pages_run {
	scen *s;
	trng r;                  /* from the seed: the scenario's stream is not drawn from */
	vmmrt_stream st;
	vmmrt_pages *p;
	vmmrt_slot *x[2], *res;
	bool bound[2];
	uint64_t want[NCYCLES];
	bool launched[NCYCLES];
} pages_run;

#define OK(r, what, call) s_ok((r)->s, API((r)->s, what, call), what)

static uint64_t slot_bytes(scen *s)
{
	vmmrt_offload_stats st = {.size = sizeof(st)};
	return vmmrt_offload_stats_get(s->rt, &st) == VMMRT_OK ? st.slot_bytes : UINT64_MAX;
}

bool pages_here(const scen *s, unsigned it)
{
	uint64_t x = (s->seed ^ ((uint64_t)(it + 977) * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
	return (x >> 60) == 0; /* one time in sixteen */
}

static bool setup(pages_run *r, size_t *offset)
{
	scen *s = r->s;
	size_t npages = (size_t)rnd_in(&r->r, 1, 3);
	*offset = s->gran * (size_t)rnd_in(&r->r, 0, npages - 1);
	if (!OK(r, "vmmrt_stream_create", vmmrt_stream_create(s->rt, &r->st)) ||
	    !OK(r, "vmmrt_slot_create", vmmrt_slot_create(s->rt, NCYCLES * 8, &r->res)) ||
	    !OK(r, "vmmrt_slot_map", vmmrt_slot_map(r->res)))
		return false;
	t_range_add(vmmrt_slot_address(r->res), vmmrt_slot_size(r->res), s->seed);
	if (!OK(r, "vmmrt_pages_create", vmmrt_pages_create(s->rt, npages * s->gran - rnd_in(&r->r, 0, 4095), &r->p)))
		return false;
	for (unsigned k = 0; k < 2; k++) {
		if (!OK(r, "vmmrt_slot_create", vmmrt_slot_create(s->rt, (size_t)rnd_in(&r->r, 1, s->gran), &r->x[k])))
			return false;
		t_range_add(vmmrt_slot_address(r->x[k]), vmmrt_slot_size(r->x[k]), s->seed);
		if (!OK(r, "vmmrt_slot_map_pages", vmmrt_slot_map_pages(r->x[k], r->p, *offset)))
			return false;
		r->bound[k] = true;
	}
	return true;
}

/* Once the stream has drained: unbind a slot, perhaps map memory of its own
 * and let it go, and bind it again (if the pages are still there). */
static bool rebind(pages_run *r, unsigned k, size_t offset)
{
	scen *s = r->s;
	vmmrt_slot *x = r->x[k];
	if (!OK(r, "vmmrt_stream_synchronize", vmmrt_stream_synchronize(s->rt, r->st)) ||
	    !OK(r, "vmmrt_slot_unmap", vmmrt_slot_unmap(x)))
		return false;
	r->bound[k] = false;
	if (chance(&r->r, 0.5) &&
	    (!OK(r, "vmmrt_slot_map", vmmrt_slot_map(x)) || !OK(r, "vmmrt_slot_unmap", vmmrt_slot_unmap(x))))
		return false;
	if (!r->p)
		return true;
	if (!OK(r, "vmmrt_slot_map_pages", vmmrt_slot_map_pages(x, r->p, offset)))
		return false;
	r->bound[k] = true;
	return true;
}

static bool cycle(pages_run *r, unsigned c)
{
	scen *s = r->s;
	if (!r->bound[0] || !r->bound[1])
		return false; /* the pages are gone and a slot was unbound: nothing shared any more */
	unsigned w = (unsigned)(rnd(&r->r) & 1);
	vmmrt_devptr wa = vmmrt_slot_address(r->x[w]), ra = vmmrt_slot_address(r->x[!w]);
	size_t n = vmmrt_slot_size(r->x[0]) < vmmrt_slot_size(r->x[1]) ? vmmrt_slot_size(r->x[0])
									 : vmmrt_slot_size(r->x[1]);
	uint64_t in = rnd(&r->r), layer = rnd(&r->r), ns = rnd_in(&r->r, 0, 2000000);
	if (!OK(r, "vmmrt_kernel_fill", vmmrt_kernel_fill(s->rt, r->st, wa, n, in)) ||
	    !OK(r, "vmmrt_kernel_layer", vmmrt_kernel_layer(s->rt, r->st, wa, wa, n, layer, ns)) ||
	    !OK(r, "vmmrt_kernel_checksum",
		vmmrt_kernel_checksum(s->rt, r->st, ra, n, vmmrt_slot_address(r->res) + 8 * (vmmrt_devptr)c)))
		return false;
	r->want[c] = vmmrt_layer_checksum_host(n, in, layer);
	r->launched[c] = true;
	return true;
}

void slot_pages(scen *s)
{
	if (s->errored)
		return;
	pages_run r = {.s = s, .r = {s->seed ^ 0x7061676573ull}};
	uint64_t base = slot_bytes(s);
	size_t offset = 0;
	unsigned cycles = (unsigned)rnd_in(&r.r, 2, NCYCLES);
	bool ok = setup(&r, &offset);
	for (unsigned c = 0; ok && c < cycles; c++) {
		if (!cycle(&r, c))
			break;
		if (chance(&r.r, 0.2) && !rebind(&r, (unsigned)(rnd(&r.r) & 1), offset))
			break;
		if (r.p && chance(&r.r, 0.15)) {
			/* both still bound: the memory stays with them */
			ok = OK(&r, "vmmrt_pages_destroy", vmmrt_pages_destroy(r.p));
			if (ok)
				r.p = NULL;
		}
	}
	/* Clean-up: nothing injected, everything checked. */
	s_quiet(s, true);
	bool drained = !r.st || OK(&r, "vmmrt_stream_synchronize", vmmrt_stream_synchronize(s->rt, r.st));
	if (drained && r.res)
		s_verify_cycles(s, r.res, NCYCLES, r.want, r.launched, NULL, &T.page_cycles, "pages",
				"the reading slot does not see the bytes the writing slot, bound to the same pages, wrote");
	if (drained) {
		for (unsigned k = 0; k < 2; k++)
			if (r.x[k])
				s_slot_destroy(s, r.x[k]);
		if (r.res)
			s_slot_destroy(s, r.res);
		if (r.p)
			(void)OK(&r, "vmmrt_pages_destroy", vmmrt_pages_destroy(r.p));
		if (!s->errored && !fault_causes(&s->fc) && slot_bytes(s) != base)
			t_fail(s->seed, "slot-bytes", "slot_bytes %" PRIu64 " after the pages' slots and pages were "
			       "destroyed, %" PRIu64 " before", slot_bytes(s), base);
		if (r.st)
			(void)OK(&r, "vmmrt_stream_destroy", vmmrt_stream_destroy(s->rt, r.st));
	}
	s_quiet(s, false);
}

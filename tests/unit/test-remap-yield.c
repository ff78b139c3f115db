/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * Remap's D2H yield decided on made-up groups (vmmrt__remap_yield_due): which
 * maps a D2H waits for before it starts, with no thread and no clock. Whether
 * a map then lands beside a copy in a real run is up to the threads' timing,
 * so the end-to-end run (test-offload's maps_beside_d2h_counted) reports its
 * counts and asserts only what does not depend on timing; the decision is
 * checked here.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "group.h"
#include "offload.h"
#include "remap-yield.h"

#define NG 6

typedef struct world {
	vmmrt__offload off;
	vmmrt_group g[NG], *gp[NG];
	uint32_t flag[NG];
} world;

static vmmrt_slot *const some_slot = (vmmrt_slot *)(uintptr_t)0x1000;

/* n groups, each mapped once and released (nothing due), a budget of b. */
static void world_init(world *w, unsigned n, int64_t budget)
{
	memset(w, 0, sizeof(*w));
	for (unsigned i = 0; i < n; i++) {
		w->g[i].index = i;
		w->g[i].slot = some_slot;
		w->g[i].remap.flag = &w->flag[i];
		w->gp[i] = &w->g[i];
	}
	w->off.groups = w->gp;
	w->off.ngroups = n;
	w->off.remap.budget = budget;
}

/* Group i's latest map: ticket t, needing `need` releases, mapped at flag value seq. */
static void request_map(world *w, unsigned i, int kind, uint64_t ticket, uint64_t need)
{
	vmmrt_group *h = &w->g[i];
	vmmrt__remap_req *r = &h->remap.map[kind][h->remap.map_next[kind] % VMMRT__REQ_RING];
	h->remap.map_next[kind]++;
	r->g = h;
	r->ticket = ticket;
	r->need = need;
	r->seq = ++h->remap.map_seq;
	h->remap.maps_requested++;
}

static unsigned due(world *w, unsigned g, vmmrt__remap_req **out)
{
	return vmmrt__remap_yield_due(&w->off, &w->g[g], out, VMMRT__YIELD_MAX);
}

static void nothing_due_nothing_waited_for(void **state)
{
	world w;
	vmmrt__remap_req *out[VMMRT__YIELD_MAX];
	world_init(&w, 3, 8);
	assert_int_equal(due(&w, 0, out), 0);
	/* a map whose flag already says mapped is not due */
	request_map(&w, 1, VMMRT__USE_FORWARD, 5, 0);
	w.flag[1] = w.g[1].remap.map_seq;
	assert_int_equal(due(&w, 0, out), 0);
	/* the copying group's own map is never waited for */
	request_map(&w, 0, VMMRT__USE_FORWARD, 6, 0);
	assert_int_equal(due(&w, 0, out), 0);
	/* nor one of a group without a slot (none allocated) */
	w.g[2].slot = NULL;
	request_map(&w, 2, VMMRT__USE_FORWARD, 7, 0);
	assert_int_equal(due(&w, 0, out), 0);
}

static void maps_due_are_waited_for_in_ticket_order(void **state)
{
	world w;
	vmmrt__remap_req *out[VMMRT__YIELD_MAX];
	world_init(&w, 4, 8);
	request_map(&w, 3, VMMRT__USE_BACKWARD, 12, 0);
	request_map(&w, 1, VMMRT__USE_FORWARD, 10, 0);
	request_map(&w, 2, VMMRT__USE_FORWARD, 11, 0);
	assert_int_equal(due(&w, 0, out), 3);
	assert_ptr_equal(out[0]->g, &w.g[1]);
	assert_ptr_equal(out[1]->g, &w.g[2]);
	assert_ptr_equal(out[2]->g, &w.g[3]);
	assert_int_equal(out[2]->seq, w.g[3].remap.map_seq);
	/* max bounds what is written */
	assert_int_equal(vmmrt__remap_yield_due(&w.off, &w.g[0], out, 2), 2);
	assert_ptr_equal(out[1]->g, &w.g[2]);
}

/* A map that needs a release not handed off yet ends the list there: the D2H
 * must not wait for it (that release may come after this very copy), nor for
 * any later ticket (admission goes in ticket order). */
static void a_map_waiting_for_a_release_ends_the_list(void **state)
{
	world w;
	vmmrt__remap_req *out[VMMRT__YIELD_MAX];
	world_init(&w, 4, 8);
	request_map(&w, 1, VMMRT__USE_FORWARD, 10, 0);
	request_map(&w, 2, VMMRT__USE_FORWARD, 11, 1); /* needs its first release */
	request_map(&w, 3, VMMRT__USE_FORWARD, 12, 0);
	assert_int_equal(due(&w, 0, out), 1);
	assert_ptr_equal(out[0]->g, &w.g[1]);
	w.g[2].remap.releases_planned = 1; /* handed off: the list goes on */
	assert_int_equal(due(&w, 0, out), 3);
}

/* The budget counts the copying group as mapped (its release follows this
 * copy) and every group whose map, unreleased, has an earlier ticket. */
static void the_budget_stops_the_list_where_a_map_would_wait_for_this_copy(void **state)
{
	world w;
	vmmrt__remap_req *out[VMMRT__YIELD_MAX];
	world_init(&w, 5, 3);
	request_map(&w, 1, VMMRT__USE_FORWARD, 10, 0); /* g0 + nothing earlier: 1 < 3 */
	request_map(&w, 2, VMMRT__USE_FORWARD, 11, 0); /* g0 + g1: 2 < 3 */
	request_map(&w, 3, VMMRT__USE_FORWARD, 12, 0); /* g0 + g1 + g2: 3, not < 3 */
	assert_int_equal(due(&w, 0, out), 2);
	assert_ptr_equal(out[1]->g, &w.g[2]);
	/* g1's map released (planned): it no longer counts, g3's map fits */
	w.g[1].remap.releases_planned = 1;
	assert_int_equal(due(&w, 0, out), 3);
	/* a bigger budget admits them all; a budget of one admits none */
	w.g[1].remap.releases_planned = 0;
	w.off.remap.budget = 4;
	assert_int_equal(due(&w, 0, out), 3);
	w.off.remap.budget = 1;
	assert_int_equal(due(&w, 0, out), 0);
}

static void more_maps_due_than_it_reasons_about_waits_for_none(void **state)
{
	enum { MANY = VMMRT__YIELD_MAX / 2 + 1 };
	vmmrt__offload off;
	static vmmrt_group g[MANY + 1];
	vmmrt_group *gp[MANY + 1];
	static uint32_t flag[MANY + 1];
	vmmrt__remap_req *out[VMMRT__YIELD_MAX];
	memset(&off, 0, sizeof(off));
	memset(g, 0, sizeof(g));
	for (unsigned i = 0; i <= MANY; i++) {
		g[i].slot = some_slot;
		g[i].remap.flag = &flag[i];
		gp[i] = &g[i];
		if (i == 0)
			continue;
		for (int k = 0; k < 2; k++) {
			vmmrt__remap_req *r = &g[i].remap.map[k][0];
			g[i].remap.map_next[k] = 1;
			r->g = &g[i];
			r->ticket = 2 * i + (uint64_t)k;
			r->seq = 1 + (uint32_t)k;
		}
	}
	off.groups = gp;
	off.remap.budget = 1000;
	off.ngroups = MANY; /* 2 * (MANY - 1) = VMMRT__YIELD_MAX maps due: reasoned about */
	assert_int_equal(vmmrt__remap_yield_due(&off, &g[0], out, VMMRT__YIELD_MAX), VMMRT__YIELD_MAX);
	off.ngroups = MANY + 1; /* two more */
	assert_int_equal(vmmrt__remap_yield_due(&off, &g[0], out, VMMRT__YIELD_MAX), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(nothing_due_nothing_waited_for),
		cmocka_unit_test(maps_due_are_waited_for_in_ticket_order),
		cmocka_unit_test(a_map_waiting_for_a_release_ends_the_list),
		cmocka_unit_test(the_budget_stops_the_list_where_a_map_would_wait_for_this_copy),
		cmocka_unit_test(more_maps_due_than_it_reasons_about_waits_for_none),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/* Remap: the D2H stream yields to the maps already due (launch thread). */
#include "config.h"

#include <urcu/uatomic.h>

#include "driver.h"
#include "error.h"
#include "remap-yield.h"

/*
 * A D2H copy in flight makes cuMemSetAccess about ten times slower on the
 * H200 (the figures: backend/host-vmm.c's latency model), and in the
 * forward pass of a copy-bound model one is always in flight: the map of
 * layer k, due when layer k-2's D2H has ended, would run beside layer k-1's. So, before g's D2H, the D2H stream waits for the maps already due:
 * in ticket order (admission's), each whose releases were all handed off
 * and which the budget admits with g still mapped (g's release comes after
 * this copy, so a map that needs it must not be waited for here), up to the
 * first that is not so. The copy engine idles for those maps' calls instead.
 */
static uint64_t last_ticket(const vmmrt_group *x)
{
	uint64_t t = 0;
	for (int k = 0; k < 2; k++)
		if (x->remap.map_next[k]) {
			uint64_t tk = x->remap.map[k][(x->remap.map_next[k] - 1) % VMMRT__REQ_RING].ticket;
			t = tk > t ? tk : t;
		}
	return t;
}

unsigned vmmrt__remap_yield_due(const vmmrt__offload *off, const vmmrt_group *g, vmmrt__remap_req **out,
				 unsigned max)
{
	vmmrt__remap_req *due[VMMRT__YIELD_MAX];
	unsigned n = 0, nout = 0;
	for (unsigned i = 0; i < off->ngroups; i++) {
		vmmrt_group *h = off->groups[i];
		if (h == g || !h->slot || !h->remap.flag)
			continue;
		for (int k = 0; k < 2; k++) {
			if (!h->remap.map_next[k])
				continue;
			vmmrt__remap_req *r = &h->remap.map[k][(h->remap.map_next[k] - 1) % VMMRT__REQ_RING];
			if ((int32_t)(uatomic_read(h->remap.flag) - r->seq) >= 0)
				continue; /* mapped already */
			if (n == VMMRT__YIELD_MAX)
				return 0; /* more than it may reason about: no wait */
			due[n++] = r;
		}
	}
	for (unsigned left = n; left && nout < max; left--) {
		unsigned best = 0;
		for (unsigned j = 1; j < left; j++)
			if (due[j]->ticket < due[best]->ticket)
				best = j;
		vmmrt__remap_req *r = due[best];
		due[best] = due[left - 1];
		const vmmrt_group *h = r->g;
		if (h->remap.releases_planned < r->need)
			break;
		/* Mapped when r is admitted (tickets go in order): g, and each group
		 * whose map without a release yet has an earlier ticket. */
		int64_t mapped = 1;
		for (unsigned i = 0; i < off->ngroups; i++) {
			const vmmrt_group *x = off->groups[i];
			if (x == g || x == h || !x->slot || x->remap.maps_requested <= x->remap.releases_planned)
				continue;
			mapped += last_ticket(x) < r->ticket;
		}
		if (mapped >= uatomic_read(&off->remap.budget))
			break;
		out[nout++] = r;
	}
	return nout;
}

vmmrt_status vmmrt__remap_yield_d2h(vmmrt__offload *off, vmmrt_group *g)
{
	vmmrt__remap_req *due[VMMRT__YIELD_MAX];
	unsigned n = vmmrt__remap_yield_due(off, g, due, VMMRT__YIELD_MAX);
	for (unsigned i = 0; i < n; i++) {
		vmmrt_group *h = due[i]->g;
		vmmrt_status st = vmmrt__drv_stream_wait_value32(off->rt, off->d2h, h->remap.flag_dev, due[i]->seq);
		if (st != VMMRT_OK)
			return vmmrt__error_wrap(st, "group '%s': D2H behind the map of group '%s'", g->name, h->name);
		uatomic_inc(&off->remap.d2h_yields);
	}
	return VMMRT_OK;
}

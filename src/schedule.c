/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The schedule: the order in which the runners' graphs actually run. The
 * first iteration records it (forward order, then backward order, which need
 * not be the reverse of the forward one); from then on every hook call is
 * checked against it and the look-ahead window walks along it, wrapping from
 * the last backward of one iteration to the first forward of the next.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "group.h"
#include "schedule.h"

vmmrt_status vmmrt__schedule_init(vmmrt__schedule *s, unsigned n)
{
	memset(s, 0, sizeof(*s));
	s->n = n;
	if (n == 0)
		return VMMRT_OK;
	s->fwd = calloc(n, sizeof(*s->fwd));
	s->bwd = calloc(n, sizeof(*s->bwd));
	if (!s->fwd || !s->bwd) {
		vmmrt__schedule_free(s);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "schedule of %u groups", n);
	}
	return VMMRT_OK;
}

void vmmrt__schedule_free(vmmrt__schedule *s)
{
	free(s->fwd);
	free(s->bwd);
	s->fwd = s->bwd = NULL;
}

static bool listed(const unsigned *list, unsigned n, unsigned g)
{
	for (unsigned i = 0; i < n; i++)
		if (list[i] == g)
			return true;
	return false;
}

static vmmrt_status record(vmmrt__schedule *s, vmmrt_group *g, bool backward)
{
	if (!backward) {
		if (s->nbwd)
			return vmmrt__error(VMMRT_E_INVALID_STATE,
					   "forward of group '%s' while the first backward pass is under way "
					   "(%u of %u groups done)", g->name, s->nbwd, s->n);
		if (listed(s->fwd, s->nfwd, g->index))
			return vmmrt__error(VMMRT_E_INVALID_STATE,
					   "forward of group '%s' twice before any backward", g->name);
		s->use = s->nfwd;
		s->fwd[s->nfwd++] = g->index;
		return VMMRT_OK;
	}
	if (s->nfwd < s->n)
		return vmmrt__error(VMMRT_E_INVALID_STATE,
				   "backward of group '%s' before the forward of every group (%u of %u)", g->name,
				   s->nfwd, s->n);
	if (listed(s->bwd, s->nbwd, g->index))
		return vmmrt__error(VMMRT_E_INVALID_STATE, "backward of group '%s' twice in one iteration", g->name);
	s->use = s->n + s->nbwd;
	s->bwd[s->nbwd++] = g->index;
	if (s->nbwd == s->n) {
		s->recorded = true;
		s->iteration = 1;
	}
	return VMMRT_OK;
}

vmmrt_status vmmrt__schedule_enter(vmmrt__schedule *s, vmmrt_group *g, bool backward)
{
	if (!s->recorded) {
		vmmrt_status st = record(s, g, backward);
		if (st == VMMRT_OK)
			s->in_backward = backward;
		return st;
	}
	/* Position of the next use within its iteration. */
	uint64_t next = s->use + 1;
	uint64_t pos = next % (2ull * s->n);
	bool want_backward = pos >= s->n;
	unsigned want = want_backward ? s->bwd[pos - s->n] : s->fwd[pos];
	if (want != g->index || want_backward != backward)
		return vmmrt__error(VMMRT_E_MISMATCH,
				   "%s of group '%s' out of the recorded order: %s of group %u was expected next",
				   backward ? "backward" : "forward", g->name, want_backward ? "backward" : "forward",
				   want);
	s->use = next;
	s->iteration = next / (2ull * s->n);
	s->in_backward = backward;
	return VMMRT_OK;
}

unsigned vmmrt__schedule_group_of(const vmmrt__schedule *s, uint64_t use, bool *backward)
{
	uint64_t pos = use % (2ull * s->n);
	*backward = pos >= s->n;
	return *backward ? s->bwd[pos - s->n] : s->fwd[pos];
}

void vmmrt__schedule_window(vmmrt__schedule *s, unsigned lookahead, uint64_t *from, uint64_t *to)
{
	*from = *to = s->requested;
	if (!s->recorded)
		return;
	uint64_t end = s->use + 1 + lookahead;
	if (s->requested < s->use + 1)
		s->requested = s->use + 1;
	*from = s->requested;
	if (end > *from) {
		*to = end;
		s->requested = end;
	} else {
		*to = *from;
	}
}

/* SPDX-License-Identifier: LGPL-2.1-or-later */
/*
 * The schedule: the order in which the runners' graphs actually run. Any
 * order is one, as long as each group's forward comes before its backward
 * and each runs once an iteration: all forwards then all backwards, 1F1B
 * with several microbatches in flight (a group per layer and microbatch),
 * interleaved model chunks. The first iteration records it, or the
 * application declares it before allocation; from then on every hook call is
 * checked against it and the look-ahead window walks along it, wrapping from
 * the last use of one iteration to the first of the next.
 *
 * It also says what the order asks of device memory under a look-ahead: the
 * banks ping-pong needs (and which group gets which) and the most groups
 * remap has mapped at once, so both follow the schedule instead of assuming
 * "all forwards, then all backwards".
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "group.h"
#include "schedule.h"

static void clear_positions(vmmrt__schedule *s)
{
	/* A schedule of no uses has no position arrays (schedule_init). */
	if (!s->pos_f)
		return;
	for (unsigned i = 0; i < s->ngroups; i++)
		s->pos_f[i] = s->pos_b[i] = VMMRT__NO_POS;
}

vmmrt_status vmmrt__schedule_init(vmmrt__schedule *s, unsigned n, unsigned ngroups)
{
	memset(s, 0, sizeof(*s));
	s->n = n;
	s->ngroups = ngroups;
	if (n == 0)
		return VMMRT_OK;
	s->grp = calloc(2 * (size_t)n, sizeof(*s->grp));
	s->bwd = calloc(2 * (size_t)n, sizeof(*s->bwd));
	s->pos_f = calloc(ngroups, sizeof(*s->pos_f));
	s->pos_b = calloc(ngroups, sizeof(*s->pos_b));
	if (!s->grp || !s->bwd || !s->pos_f || !s->pos_b) {
		vmmrt__schedule_free(s);
		return vmmrt__error(VMMRT_E_HOST_OUT_OF_MEMORY, "schedule of %u groups", n);
	}
	clear_positions(s);
	return VMMRT_OK;
}

void vmmrt__schedule_free(vmmrt__schedule *s)
{
	free(s->grp);
	free(s->bwd);
	free(s->pos_f);
	free(s->pos_b);
	s->grp = NULL;
	s->bwd = NULL;
	s->pos_f = s->pos_b = NULL;
	s->n = 0;
	s->recorded = s->declared = false;
}

/* The one rule of an order, while it is being recorded or declared. */
static vmmrt_status append(vmmrt__schedule *s, unsigned g, bool backward, const char *name)
{
	if (g >= s->ngroups || s->nrec >= 2 * s->n)
		return vmmrt__error(VMMRT_E_INVALID_ARGUMENT, "group '%s' is not one of the %u groups of the schedule",
				    name, s->n);
	if (!backward && s->pos_f[g] != VMMRT__NO_POS)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "forward of group '%s' twice in one iteration", name);
	if (backward && s->pos_f[g] == VMMRT__NO_POS)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "backward of group '%s' before its forward", name);
	if (backward && s->pos_b[g] != VMMRT__NO_POS)
		return vmmrt__error(VMMRT_E_INVALID_STATE, "backward of group '%s' twice in one iteration", name);
	s->grp[s->nrec] = g;
	s->bwd[s->nrec] = backward;
	(backward ? s->pos_b : s->pos_f)[g] = s->nrec;
	s->nrec++;
	return VMMRT_OK;
}

vmmrt_status vmmrt__schedule_declare(vmmrt__schedule *s, const vmmrt__use *uses, unsigned nuses,
				     const char *const *names)
{
	if (nuses != 2 * s->n)
		return vmmrt__error(VMMRT_E_MISMATCH,
				    "the schedule has %u uses; the %u groups with tensors need %u (a forward and a "
				    "backward each)", nuses, s->n, 2 * s->n);
	s->nrec = 0;
	clear_positions(s);
	for (unsigned k = 0; k < nuses; k++) {
		unsigned g = uses[k].group;
		vmmrt_status st = append(s, g, uses[k].backward, g < s->ngroups ? names[g] : "?");
		if (st != VMMRT_OK) {
			s->nrec = 0;
			clear_positions(s);
			return vmmrt__error_wrap(st, "declared schedule, use %u", k);
		}
	}
	s->recorded = s->declared = true;
	s->next = s->use = s->requested = 0;
	s->iteration = 0;
	return VMMRT_OK;
}

vmmrt_status vmmrt__schedule_enter(vmmrt__schedule *s, vmmrt_group *g, bool backward)
{
	if (!s->recorded) {
		vmmrt_status st = append(s, g->index, backward, g->name);
		if (st != VMMRT_OK)
			return st;
		s->use = s->nrec - 1;
		s->next = s->nrec;
		s->in_backward = backward;
		if (s->nrec == 2 * s->n) {
			s->recorded = true;
			s->iteration = 1;
		}
		return VMMRT_OK;
	}
	uint64_t pos = s->next % (2ull * s->n);
	unsigned want = s->grp[pos];
	bool want_backward = s->bwd[pos];
	if (want != g->index || want_backward != backward)
		return vmmrt__error(VMMRT_E_MISMATCH,
				   "%s of group '%s' out of the recorded order: %s of group %u was expected next",
				   backward ? "backward" : "forward", g->name, want_backward ? "backward" : "forward",
				   want);
	s->use = s->next++;
	s->iteration = s->use / (2ull * s->n);
	s->in_backward = backward;
	return VMMRT_OK;
}

unsigned vmmrt__schedule_group_of(const vmmrt__schedule *s, uint64_t use, bool *backward)
{
	uint64_t pos = use % (2ull * s->n);
	*backward = s->bwd[pos];
	return s->grp[pos];
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

bool vmmrt__schedule_mid_iteration(const vmmrt__schedule *s)
{
	if (!s->n)
		return false;
	return s->recorded ? s->next % (2ull * s->n) != 0 : s->nrec > 0;
}

void vmmrt__schedule_restart(vmmrt__schedule *s)
{
	if (!s->n)
		return;
	if (!s->recorded) {
		s->nrec = 0;
		clear_positions(s);
		s->next = s->use = s->requested = 0;
		s->in_backward = false;
		return;
	}
	uint64_t per = 2ull * s->n;
	if (s->next % per)
		s->next += per - s->next % per;
	/* Prefetches made for uses of the next iteration were undone with the
	 * strategy's state: they are made again. */
	s->use = s->next ? s->next - 1 : 0;
	s->requested = s->next;
	s->iteration = s->next / per;
	s->in_backward = false;
}

/* How far apart a group's forward and backward may be for it to stay: its
 * restore would start before its forward ends. A backward right after its
 * own forward stays at any look-ahead (the tail of "all forwards, then all
 * backwards"): nothing runs in between that could want the memory. */
static int64_t reach(unsigned lookahead)
{
	return lookahead ? lookahead : 1;
}

bool vmmrt__schedule_resident(const vmmrt__schedule *s, unsigned group, unsigned lookahead)
{
	return s->recorded && group < s->ngroups && s->pos_f[group] != VMMRT__NO_POS &&
	       (int64_t)s->pos_b[group] - s->pos_f[group] <= reach(lookahead);
}

/* The holds of group g on its bank, as closed ranges of positions: one
 * (resident) or two (its forward; its restore to its backward's end). */
static unsigned holds(const vmmrt__schedule *s, unsigned g, unsigned lookahead, int64_t lo[2], int64_t hi[2])
{
	int64_t p = s->pos_f[g], q = s->pos_b[g];
	if (q - p <= reach(lookahead)) {
		lo[0] = p;
		hi[0] = q;
		return 1;
	}
	lo[0] = hi[0] = p;
	lo[1] = q - lookahead;
	hi[1] = q;
	return 2;
}

static bool overlap(const vmmrt__schedule *s, unsigned a, unsigned b, unsigned lookahead)
{
	int64_t alo[2], ahi[2], blo[2], bhi[2];
	unsigned na = holds(s, a, lookahead, alo, ahi), nb = holds(s, b, lookahead, blo, bhi);
	for (unsigned i = 0; i < na; i++)
		for (unsigned j = 0; j < nb; j++)
			if (alo[i] <= bhi[j] && blo[j] <= ahi[i])
				return true;
	return false;
}

bool vmmrt__schedule_clash(const vmmrt__schedule *s, unsigned lookahead, unsigned a, unsigned b)
{
	if (a >= s->ngroups || b >= s->ngroups || s->pos_f[a] == VMMRT__NO_POS || s->pos_f[b] == VMMRT__NO_POS)
		return false;
	return a != b && overlap(s, a, b, lookahead);
}

unsigned vmmrt__schedule_banks(const vmmrt__schedule *s, unsigned lookahead, const bool *pick, unsigned *bank)
{
	unsigned nbanks = 0;
	/* In order of first use: each group takes the lowest bank none of the
	 * groups already on it holds while it does. */
	for (unsigned pos = 0; pos < 2 * s->n; pos++) {
		unsigned g = s->grp[pos];
		if (s->bwd[pos] || (pick && !pick[g]))
			continue;
		unsigned b;
		for (b = 0; b < nbanks; b++) {
			bool clash = false;
			for (unsigned k = 0; k < pos && !clash; k++) {
				unsigned h = s->grp[k];
				clash = !s->bwd[k] && bank[h] == b && (!pick || pick[h]) && overlap(s, g, h, lookahead);
			}
			if (!clash)
				break;
		}
		bank[g] = b;
		if (b == nbanks)
			nbanks++;
	}
	return nbanks;
}

bool vmmrt__schedule_stays(const vmmrt__schedule *s, unsigned lookahead, const bool *pick, const unsigned *bank,
			   unsigned g)
{
	if (!s->recorded || g >= s->ngroups || s->pos_f[g] == VMMRT__NO_POS || (pick && !pick[g]))
		return false;
	if (vmmrt__schedule_resident(s, g, lookahead))
		return true;
	int64_t p = s->pos_f[g], q = s->pos_b[g];
	for (unsigned h = 0; h < s->ngroups; h++) {
		if (h == g || s->pos_f[h] == VMMRT__NO_POS || (pick && !pick[h]) || bank[h] != bank[g])
			continue;
		int64_t lo[2], hi[2];
		unsigned n = holds(s, h, lookahead, lo, hi);
		for (unsigned i = 0; i < n; i++)
			if (lo[i] <= q && p <= hi[i])
				return false;
	}
	return true;
}

unsigned vmmrt__schedule_peak_mapped(const vmmrt__schedule *s, unsigned lookahead)
{
	int64_t per = 2 * (int64_t)s->n;
	if (!per)
		return 1;
	unsigned *count = calloc((size_t)per, sizeof(*count));
	unsigned *stamp = calloc((size_t)per, sizeof(*stamp));
	if (!count || !stamp) {
		free(count);
		free(stamp);
		return s->n; /* every group: never too small */
	}
	int64_t ahead = lookahead < per ? (int64_t)lookahead : per - 1;
	for (unsigned g = 0; g < s->ngroups; g++) {
		if (s->pos_f[g] == VMMRT__NO_POS)
			continue;
		int64_t p = s->pos_f[g], q = s->pos_b[g];
		int64_t lo[2] = {p - ahead, q - ahead}, hi[2] = {p, q};
		unsigned narcs = 2;
		if (q - p <= reach(lookahead)) { /* resident: mapped from its forward's map to its backward */
			hi[0] = q;
			narcs = 1;
		}
		for (unsigned a = 0; a < narcs; a++)
			for (int64_t t = lo[a]; t <= hi[a] && t < lo[a] + per; t++) {
				int64_t x = ((t % per) + per) % per; /* the window wraps into the iteration before */
				if (stamp[x] != g + 1) {
					stamp[x] = g + 1;
					count[x]++;
				}
			}
	}
	unsigned peak = 1;
	for (int64_t x = 0; x < per; x++)
		if (count[x] > peak)
			peak = count[x];
	free(count);
	free(stamp);
	return peak;
}

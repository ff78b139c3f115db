# SPDX-License-Identifier: LGPL-2.1-or-later
"""Which regions of a layer move: every one, a byte fraction, or a byte budget.

Pure arithmetic over region sizes, so it is tested without a device. A region
already kept (an output, a marked tensor) is never chosen.
"""


def choose(sizes, budget):
    """Indices of the sizes to move under a byte budget: the largest first, then
    each smaller one that still fits, so few regions carry most of the bytes.
    Ties keep discovery order, so the choice is the same on every run."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    chosen, used = [], 0
    for i in order:
        if used + sizes[i] <= budget:
            chosen.append(i)
            used += sizes[i]
    return sorted(chosen)


def fraction_budget(sizes, fraction):
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("offload fraction %r is not between 0 and 1" % (fraction,))
    return fraction * sum(sizes)


def apply(cand, budget):
    """Select among candidate regions under budget (None: all of them); the
    others are kept, with the reason 'budget'. Returns the bytes that move."""
    if budget is None:
        picked = set(range(len(cand)))
    else:
        picked = set(choose([r.nbytes for r in cand], budget))
    for i, r in enumerate(cand):
        r.selected = i in picked
        if not r.selected:
            r.reason = "budget"
    return sum(r.nbytes for r in cand if r.selected)


def grow(sizes, chosen, cap):
    """The regions to move of a layer that may move up to ``cap`` bytes for
    free (one that stays in a ping-pong bank, copied never: its bank holds
    ``cap`` anyway), where that is more than ``chosen``; else None."""
    idx = choose(sizes, cap)
    return idx if sum(sizes[k] for k in idx) > sum(sizes[k] for k in chosen) else None

# SPDX-License-Identifier: LGPL-2.1-or-later
"""The graphs' pool's granules placed on pages by when its blocks are alive
(vmmrt.torch.poolplan): the lives read from a memory history, no two
granules in use at once on one page, and fewer pages than addresses where
best fit left holes. CPU only: the traces are made up."""
import random

import pytest

from vmmrt.torch import poolplan

G = 2 << 20
LO = 1 << 40


def alloc(a, n):
    return {"action": "alloc", "addr": a, "size": n}


def free(a, n):
    return [{"action": "free_requested", "addr": a, "size": n}, {"action": "free_completed", "addr": a, "size": n}]


def best_fit(ops, lo=LO, size=1 << 36):
    """The events of PyTorch's allocator placing ``ops`` (("a", key, bytes) or
    ("f", key)) best fit in one segment, freed blocks merged: what the
    graphs' pool's presized segment does, and records."""
    holes, live, ev = [(lo, size)], {}, []
    for op in ops:
        if op[0] == "a":
            _, key, n = op
            h = min((h for h in holes if h[1] >= n), key=lambda h: (h[1], h[0]))
            holes.remove(h)
            if h[1] > n:
                holes.append((h[0] + n, h[1] - n))
            live[key] = (h[0], n)
            ev.append(alloc(h[0], n))
        else:
            a, n = live.pop(op[1])
            # the completion names the block it merged into: a free one just before
            before = next((h[0] for h in holes if h[0] + h[1] == a), a)
            ev.extend([{"action": "free_requested", "addr": a, "size": n},
                       {"action": "free_completed", "addr": before, "size": n}])
            holes = sorted(holes + [(a, n)])
            merged = []
            for h in holes:
                if merged and merged[-1][0] + merged[-1][1] == h[0]:
                    merged[-1] = (merged[-1][0], merged[-1][1] + h[1])
                else:
                    merged.append(h)
            holes = merged
    return ev


def reach(ev, lo=LO):
    return max(e["addr"] + e["size"] for e in ev if e["action"] == "alloc") - lo


def test_a_blocks_life_is_from_its_alloc_to_its_free_completed_and_unfreed_is_for_good():
    ev = [alloc(LO, G), {"action": "segment_alloc", "addr": LO, "size": 8 * G},
          {"action": "free_requested", "addr": LO, "size": G},
          alloc(LO + G, G), {"action": "free_completed", "addr": LO, "size": G},
          alloc(LO + 2 * G, G),                         # never freed
          {"action": "free_requested", "addr": LO + 3 * G, "size": G},  # born before the history
          {"action": "free_completed", "addr": LO + 3 * G, "size": G},
          alloc(LO + 5 * G, G), {"action": "free_requested", "addr": LO + 5 * G, "size": G},  # never completed
          alloc(LO - G, G), alloc(LO + 9 * G, G)]       # outside the range
    got = sorted(poolplan.block_lives(ev, LO, LO + 8 * G))
    assert got == [(LO, G, 0, 4), (LO + G, G, 3, poolplan.FOREVER), (LO + 2 * G, G, 5, poolplan.FOREVER),
                   (LO + 3 * G, G, -1, poolplan.FOREVER), (LO + 5 * G, G, 8, poolplan.FOREVER)]


def test_a_block_freed_with_its_alloc_unseen_is_born_when_the_last_block_over_its_bytes_died():
    # (A history that lost allocs: until the thirty-fifth session the graphs'
    # pool's own filter dropped 40 of a Llama layer's.) X (granules 1-2) dies at event 2,
    # Y (granule 0) at 5: Z over granules 0-1, freed at 8 with no alloc
    # seen, took its bytes after both; W over granule 3, with no death
    # before its free, stays in use for good, as one with no free at all
    ev = [alloc(LO + G, 2 * G)] + free(LO + G, 2 * G) + [alloc(LO, G)] + free(LO, G) + [
        alloc(LO + 4 * G, G), alloc(LO + 5 * G, G)] + free(LO, 2 * G) + free(LO + 3 * G, G) + free(LO + 5 * G, G)
    got = sorted(poolplan.block_lives(ev, LO, LO + 8 * G))
    assert got == [(LO, G, 3, 5), (LO, 2 * G, 5, 9), (LO + G, 2 * G, 0, 2),
                   (LO + 3 * G, G, -1, poolplan.FOREVER), (LO + 4 * G, G, 6, poolplan.FOREVER),
                   (LO + 5 * G, G, 7, 13)], got
    # alive at once at most: Z, W, V and U (events 7-8), not Z from the start
    # (with X: 7 granules)
    assert poolplan.live_peak(got) == 5 * G
    assert poolplan.never_freed(got) == 2 * G
    # the bound only takes deaths before the free: one after it says nothing
    assert poolplan.unseen_birth([(3, LO, LO + G), (12, LO, LO + G)], LO, G, 9) == 3
    assert poolplan.unseen_birth([(3, LO + G, LO + 2 * G)], LO, G, 9) == -1      # not over its bytes
    assert poolplan.unseen_birth([], LO, G, 9) == -1


def test_a_blocks_history_keeps_its_free_request_and_an_address_given_again():
    # block_history, which block_lives and bench.poolcheck read: the free's
    # request beside its completion (a deferred free: completed later than
    # right after it), and the alloc that gave an address out again while
    # the history had its block allocated (then in use for good in block_lives)
    ev = [alloc(LO, G), alloc(LO + G, G)] + free(LO, G) + [
        {"action": "free_requested", "addr": LO + G, "size": G},
        alloc(LO + 2 * G, G),
        {"action": "free_completed", "addr": LO + G, "size": G},           # deferred: two events on
        alloc(LO + 2 * G, 2 * G)]                                         # given again unfreed
    got = sorted(poolplan.block_history(ev, LO, LO + 8 * G))
    assert got == [(LO, G, 0, 2, 3, None), (LO + G, G, 1, 4, 6, None),
                   (LO + 2 * G, G, 5, None, poolplan.FOREVER, 7),
                   (LO + 2 * G, 2 * G, 7, None, poolplan.FOREVER, None)]
    assert sorted(poolplan.block_lives(ev, LO, LO + 8 * G)) == [
        (LO, G, 0, 3), (LO + G, G, 1, 6), (LO + 2 * G, G, -1, poolplan.FOREVER),
        (LO + 2 * G, 2 * G, 7, poolplan.FOREVER)]


def test_a_free_completed_at_the_merged_blocks_address_ends_the_block_freed():
    # PyTorch records the completion after merging the block with a free
    # neighbour before it: its address is the neighbour's
    ev = [alloc(LO, G), alloc(LO + G, 3 * G), alloc(LO + 4 * G, 5 * G)] + free(LO, G) + [
        {"action": "free_requested", "addr": LO + G, "size": 3 * G},
        {"action": "free_completed", "addr": LO, "size": 3 * G},          # right after its request
        {"action": "free_requested", "addr": LO + 4 * G, "size": 5 * G},  # a stream used it: later
        alloc(LO + 9 * G, G),
        {"action": "free_completed", "addr": LO, "size": 5 * G}]          # the one pending of its size
    got = sorted(poolplan.block_lives(ev, LO, LO + 10 * G))
    assert got == [(LO, G, 0, 4), (LO + G, 3 * G, 1, 6), (LO + 4 * G, 5 * G, 2, 9),
                   (LO + 9 * G, G, 8, poolplan.FOREVER)]
    # two pending of one size at or above the address: neither is known ended
    ev = [alloc(LO + G, G), alloc(LO + 2 * G, G),
          {"action": "free_requested", "addr": LO + G, "size": G},
          {"action": "free_requested", "addr": LO + 2 * G, "size": G}, alloc(LO + 5 * G, G),
          {"action": "free_completed", "addr": LO, "size": G}]
    got = sorted(poolplan.block_lives(ev, LO, LO + 10 * G))
    assert [d for _, _, _, d in got] == [poolplan.FOREVER] * 3


def test_granules_share_a_page_only_when_their_blocks_lives_do_not_meet():
    # A and B, then A freed; C does not fit A's hole, so best fit puts it
    # above B: eight granules of addresses for six alive at once
    ev = best_fit([("a", "A", 2 * G), ("a", "B", 2 * G), ("f", "A"), ("a", "C", 4 * G), ("f", "B"), ("f", "C")])
    assert reach(ev) == 8 * G
    table, npages, peak = poolplan.plan(ev, LO, 8 * G, G)
    assert peak == 6 * G
    assert npages == 6
    assert table[0:2] == table[4:6]             # C's first half on A's pages
    assert not set(table[2:4]) & set(table[4:8])  # B never on C's
    assert len(set(table[4:8])) == 4


def test_a_block_in_use_for_good_keeps_its_pages():
    # A dies before K is born, but K is never freed: a graph's static output
    # that may be held across steps, when the next step's A is written
    ev = [alloc(LO, 2 * G)] + free(LO, 2 * G) + [alloc(LO + 2 * G, 2 * G)]
    table, npages, _ = poolplan.plan(ev, LO, 4 * G, G)
    assert npages == 4
    assert len(set(table)) == 4


def test_granules_no_block_touched_take_no_page_of_their_own():
    ev = [alloc(LO, G)] + free(LO, G) + [alloc(LO + 4 * G, G)] + free(LO + 4 * G, G)
    table, npages, _ = poolplan.plan(ev, LO, 6 * G, G)
    assert npages == 1
    assert set(table) == {0}


def test_a_block_over_part_of_a_granule_makes_the_whole_granule_busy():
    h = G // 2
    # X over the second half of granule 0 and the first of granule 1; Y, born
    # while X lives, over the rest of granule 1
    ev = [alloc(LO + h, G), alloc(LO + G + h, h)] + free(LO + h, G) + free(LO + G + h, h) + [alloc(LO + 2 * G, G)] \
        + free(LO + 2 * G, G)
    table, npages, _ = poolplan.plan(ev, LO, 3 * G, G)
    assert table[0] != table[1]
    assert table[2] in (table[0], table[1])
    assert npages == 2


@pytest.mark.parametrize("seed", range(6))
def test_random_captures_never_put_two_live_granules_on_one_page_and_use_no_more_than_the_addresses(seed):
    rnd = random.Random(seed)
    ops, alive, k = [], [], 0
    for _ in range(1500):
        if alive and (rnd.random() < 0.5 or len(alive) > 30):
            ops.append(("f", alive.pop(rnd.randrange(len(alive)))))
        else:
            n = rnd.choice([1, 2, 3, 8, 40]) * G + rnd.choice([0, 512, G // 2])
            ops.append(("a", k, n))
            alive.append(k)
            k += 1
    ev = best_fit(ops)
    n = reach(ev)
    table, npages, peak = poolplan.plan(ev, LO, n, G)
    blocks = poolplan.block_lives(ev, LO, LO + n)
    ms = poolplan.masks(blocks, LO, n, G)
    poolplan.check(ms, table)
    # at each birth, the granules in use then are on pages of their own
    births = max(m.bit_length() for m in ms)
    clique = max(sum(1 for m in ms if m >> i & 1) for i in range(births))
    assert clique <= npages <= -(-n // G)
    assert npages * G >= peak
    # and independently of the masks: no two blocks alive together have a
    # byte on the same byte of a page
    def physical(a, size):
        out = []
        for k in range((a - LO) // G, (a + size - 1 - LO) // G + 1):
            x, y = max(a - LO, k * G) - k * G, min(a - LO + size, (k + 1) * G) - k * G
            out.append((table[k], x, y))
        return out

    def end(b, d):
        return float("inf") if d is None or b < 0 else d

    lives = [(physical(a, size), max(b, 0), end(b, d)) for a, size, b, d in blocks]
    for i, (p1, b1, e1) in enumerate(lives):
        for p2, b2, e2 in lives[i + 1:]:
            if b1 < e2 and b2 < e1:
                for q1, x1, y1 in p1:
                    for q2, x2, y2 in p2:
                        assert q1 != q2 or y1 <= x2 or y2 <= x1


def test_the_check_catches_two_live_granules_on_one_page():
    ms = [0b01, 0b11, 0b10]
    poolplan.check(ms, [0, 1, 0])
    with pytest.raises(ValueError, match="granule 1 shares page 0"):
        poolplan.check(ms, [0, 0, 1])


# ------------------------------------------------------------ over the step
def captured(uses):
    """The events and marks of captures into one pool per use (each its own
    addresses, as vmmrt.torch.graphpool gives them): ``uses`` is a list of
    (position, ops), ops ("a", key, granules) or ("f", key); a key may be
    freed in a later use than its birth. Returns (events, marks, range)."""
    ev, marks, live, top = [], [], {}, LO
    for pos, ops in uses:
        s = len(ev)
        for op in ops:
            if op[0] == "a":
                live[op[1]] = (top, op[2] * G)
                ev.append(alloc(top, op[2] * G))
                top += op[2] * G
            else:
                ev.extend(free(*live.pop(op[1])))
        marks.append((pos, s, len(ev)))
    return ev, marks, top - LO


def test_a_granule_is_in_use_from_the_position_its_block_is_born_at_to_the_one_it_dies_at():
    ev, marks, n = captured([(0, [("a", "x", 1), ("a", "kept", 1), ("f", "x")]),
                             (1, [("a", "y", 2), ("f", "y"), ("f", "kept")]),
                             (2, [("a", "forever", 1), ("a", "late", 1)])])
    ev += free(LO + 5 * G, G)          # "late": freed after the captures
    blocks = poolplan.block_lives(ev, LO, LO + n)
    spans = poolplan.granule_spans(blocks, marks, LO, n, G)
    assert spans == [(0, 0), (0, 1), (1, 1), (1, 1), poolplan.WHOLE, (2, 2)]


def test_a_block_born_outside_the_captures_or_dying_before_its_birth_is_in_use_at_every_position():
    ev = [alloc(LO, G)] + free(LO, G)          # before the first capture
    s = len(ev)
    ev += [alloc(LO + G, G), alloc(LO + 2 * G, G)]
    marks = [(5, s, len(ev))]
    s = len(ev)
    ev += free(LO + G, G)                      # at a capture of an earlier position: out of the step's order
    marks.append((3, s, len(ev)))
    ev += free(LO + 2 * G, G)
    spans = poolplan.granule_spans(poolplan.block_lives(ev, LO, LO + 3 * G), marks, LO, 3 * G, G)
    assert spans == [poolplan.WHOLE, poolplan.WHOLE, (5, 5)]


def test_parts_group_granules_by_when_they_are_in_use_and_share_pages_inside_a_part():
    # two granules of position 0 alive one after the other share a page;
    # position 1's are a part of their own
    ev, marks, n = captured([(0, [("a", "x", 1), ("f", "x"), ("a", "y", 1), ("f", "y")]),
                             (1, [("a", "z", 3), ("f", "z")])])
    ps, own, nown, peak = poolplan.parts(ev, marks, LO, n, G)
    assert [(p.start, p.end, p.granules, p.npages) for p in ps] == [(0, 0, [0, 1], 1), (1, 1, [2, 3, 4], 3)]
    assert ps[0].table == [0, 0]
    # on pages of its own, before the memory plan: every granule by its blocks' lives
    assert nown == 3 and peak == 3 * G
    table = poolplan.compose(ps, [7 * G, 0], n // G, G)
    assert table == [7 * G, 7 * G, 0, G, 2 * G]


def test_a_granule_no_block_touched_is_in_no_part_and_goes_on_the_first_parts_first_page():
    ev, marks, _ = captured([(0, [("a", "x", 1), ("f", "x")])])
    ps, own, nown, _ = poolplan.parts(ev, marks, LO, 3 * G, G)
    assert [p.granules for p in ps] == [[0]]
    assert poolplan.compose(ps, [4 * G], 3, G) == [4 * G] * 3


def _place_parts(ps, end):
    """Offsets for parts as the memory plan gives them: none shares a byte
    with a part whose positions meet its own (first fit)."""
    def span(p):
        return (0, end - 1) if p.start is None else (p.start, p.end)
    placed, out = [], []
    for p in ps:
        s, e = span(p)
        busy = sorted((o, o + q.npages * G) for q, o in placed if span(q)[0] <= e and s <= span(q)[1])
        off = 0
        for lo, hi in busy:
            if off + p.npages * G <= lo:
                break
            off = max(off, hi)
        placed.append((p, off))
        out.append(off)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_uses_placed_by_parts_never_put_two_live_blocks_on_one_byte(seed):
    rnd = random.Random(seed)
    uses, alive, k = [], [], 0
    npos = 12
    for pos in range(npos):
        ops = []
        for _ in range(rnd.randrange(1, 12)):
            if alive and rnd.random() < 0.5:
                ops.append(("f", alive.pop(rnd.randrange(len(alive)))))
            else:
                ops.append(("a", k, rnd.choice([1, 2, 5])))
                alive.append(k)
                k += 1
        uses.append((pos, ops))
    ev, marks, n = captured(uses)
    ps, own, nown, peak = poolplan.parts(ev, marks, LO, n, G)
    table = poolplan.compose(ps, _place_parts(ps, npos), -(-n // G), G)
    blocks = poolplan.block_lives(ev, LO, LO + n)
    assert sum(len(p.granules) for p in ps) == -(-n // G)
    for own_table in (own, table):
        pages = {}
        for a, size, b, d in blocks:
            for g in range((a - LO) // G, (a + size - 1 - LO) // G + 1):
                pages.setdefault(own_table[g], []).append((b, float("inf") if d is None or b < 0 else d))
        for lives in pages.values():
            for i, (b1, e1) in enumerate(lives):
                for b2, e2 in lives[i + 1:]:
                    assert not (b1 < e2 and b2 < e1), "two live blocks on one page"

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

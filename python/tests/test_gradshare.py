# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.torch.gradshare: which gradient granules could lie on resident
granules their backward has already read (made-up timelines), and the
figure a layer built on the host backend reports."""
import pytest

from test_reuse import host  # noqa: F401  (the fixture: captures on the host backend)
from test_call_path import OPTIONS, _graphed_on_host
from vmmrt.torch import gradshare, graphed, reuse
from vmmrt.torch.reuse import NEVER

G = 16


def test_a_granule_is_free_after_its_last_reader_and_its_last_temporary():
    # granule 0: a region read at op 3; 1: a region read at op 5 and a
    # temporary dead at op 7; 2: a static input; 3: nothing; 4: a temporary
    # alive at the end
    regions = [(0, 16, 3), (16, 24, 5), (32, 48, NEVER)]
    temps = [(24, 32, 4, 7), (64, 80, 6, None)]
    assert gradshare.free_after(80, regions, temps, G) == [3, 7, NEVER, -1, NEVER]


def test_a_region_over_two_granules_holds_both():
    assert gradshare.free_after(32, [(8, 24, 9)], [], G) == [9, 9]


def test_a_gradient_granule_is_first_written_by_its_earliest_gradient():
    grads = [(0, 8, 6), (8, 16, 4), (16, 40, 9), (48, 56, None)]
    assert gradshare.first_writes(64, grads, G) == [4, 9, 9, -1]


def test_a_gradient_takes_only_a_granule_free_before_its_first_write():
    # resident granules free after ops 3 and 8; gradients written at 3 and 9:
    # the first cannot take either (free after 3 is not free at 3)
    got = gradshare.match([3, 8], [3, 9])
    assert list(got) == [1] and got[1] in (0, 1)
    got = gradshare.match([3, 8], [4, 9])
    assert got == {0: 0, 1: 1}        # the one written at 4 has only the granule free after 3


def test_the_match_takes_the_most_gradients():
    # the gradient written at 9 could take either granule; taken first by a
    # naive order it could leave the one written at 5 without its only one
    free = [4, 8]
    writes = [9, 5]
    got = gradshare.match(free, writes)
    assert len(got) == 2 and got[1] == 0 and got[0] == 1
    assert all(free[j] < writes[k] for k, j in got.items())
    assert len(set(got.values())) == len(got)


def test_never_free_granules_and_unknown_or_empty_gradients_share_nothing():
    assert gradshare.match([NEVER, NEVER], [5, 9]) == {}
    assert gradshare.match([-1, -1], [-1, None]) == {}
    assert gradshare.match([-1], [0]) == {0: 0}


@pytest.mark.skipif(not reuse.AVAILABLE, reason="torch without TorchDispatchMode or storage weak refs: no "
                    "backward timeline to read")
def test_a_layer_built_on_the_host_backend_reports_its_gradients_on_read_bytes(host):
    # at the runtime's granularity: the test options' 4 KiB host granules
    g, off, runners = _graphed_on_host("none", "mapped", inputs=True)
    try:
        assert off.granularity == OPTIONS["host_granularity"]
        share = off.grad_share()
        lays = [r.layer for r in runners]
        assert share and set(share) <= {lay.name for lay in lays}
        for lay in lays:
            timeline, _ = lay.timeline
            writes = gradshare.first_writes(lay.grads.backing.nbytes,
                                            [(o, o + b.storage_nbytes, timeline.born.get((b.key, b.out), (None,))[0])
                                             for b, o in lay.grads.regions], off.granularity)
            # every gradient's birth is in the timeline (a key read wrong would
            # make it unknown, and nothing shared)
            assert all(w is None or w >= 0 for w in writes)
            assert share.get(lay.name, 0) <= lay.grads.backing.nbytes
        # with the temporaries' bytes counted free, no less, and more where
        # a temporary took read bytes a gradient could have had
        bound = off.grad_share(temporaries=False)
        assert all(bound.get(k, 0) >= v for k, v in share.items())
        assert sum(bound.values()) > sum(share.values())
        st = off.stats()
        assert st["grad_share_bytes"] == sum(share.values()) > 0
        assert st["grad_share_bound_bytes"] == sum(bound.values())
        assert "could lie on resident bytes" in off.describe()
        # a backward that runs twice (retain_graph_in_backward) reads its
        # regions again: nothing may lie on them, nor on a recomputed layer's
        lay = next(lay for lay in lays if share.get(lay.name))
        lay.backward_once = False
        assert gradshare.layer_pairs(lay, off.granularity) == {}
        lay.backward_once, lay.recompute = True, True
        assert gradshare.layer_pairs(lay, off.granularity) == {}
        lay.recompute = False
        assert len(gradshare.layer_pairs(lay, off.granularity)) * off.granularity == share[lay.name]
    finally:
        graphed._close(off, runners)


def test_a_backward_captured_with_retain_graph_runs_twice(host):  # noqa: F811
    from conftest import samples, zoo_layers
    _, runners, _, uses, device = graphed._prepare_runners(tuple(zoo_layers(2)), samples(2), None, None, None, [],
                                                           True, False, 1.0, None)
    off, _ = graphed._open_offload(runners, uses, device, "none", 1, OPTIONS, 0, 1, True)
    try:
        assert runners and all(not r.layer.backward_once for r in runners)
    finally:
        off.close()
    _, runners, _, uses, device = graphed._prepare_runners(tuple(zoo_layers(2)), samples(2), None, None, None, [],
                                                           False, False, 1.0, None)
    off, _ = graphed._open_offload(runners, uses, device, "none", 1, OPTIONS, 0, 1, True)
    try:
        assert all(r.layer.backward_once for r in runners)
    finally:
        off.close()


class _Region:
    def __init__(self, at, nbytes, birth, how="resident"):
        self.resident, self.nbytes, self.birth, self.how = at, nbytes, birth, how


class _Birth:
    def __init__(self, key, out=0):
        self.key, self.out = key, out


class _Timeline:
    def __init__(self, last_use):
        self.last_use = last_use


class _Lay:
    def __init__(self, regions, input_at=None, input_bytes=None):
        self.regions, self.input_at, self.input_bytes = regions, input_at, input_bytes

    def kept_resident(self):
        return [r for r in self.regions if r.resident is not None]


def test_a_kept_region_whose_birth_is_unknown_is_never_given_away():
    # the reuse plan skips it (nothing to time it by); the gradients must not
    # take its bytes: nothing tells when the backward is done with them
    known = _Region(0, 4096, _Birth("mm"))
    unknown = _Region(4096, 4096, None)
    lay = _Lay([known, unknown, _Region(None, 4096, None)], input_at=[8192], input_bytes=[100])
    regions = gradshare.regions_of(lay, _Timeline({("mm", 0): 5}))
    assert sorted(regions) == [(0, 4096, 5), (4096, 8192, NEVER), (8192, 8292, NEVER)]
    free = gradshare.free_after(3 * 4096, regions, [], 4096)
    assert free == [5, NEVER, NEVER]
    assert gradshare.match(free, [6, 6, 6]) == {0: 0}

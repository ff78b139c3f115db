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
    finally:
        graphed._close(off, runners)

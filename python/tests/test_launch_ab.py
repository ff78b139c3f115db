# SPDX-License-Identifier: LGPL-2.1-or-later
"""The bench's --launch-ab: torch's graphed callables and vmmrt none
alternated (ABBA), the excess read pair by pair (vmmrt.torch.bench.launch_ab):
the arithmetic with made-up clocks, and the command line's refusals."""
import pytest
import torch

from vmmrt.torch.bench import __main__ as bench
from vmmrt.torch.bench import launch_ab


def test_steps_alternate_abba_and_pair_by_index():
    order = []
    a = iter([100.0, 120.0, 90.0, 110.0])
    b = iter([130.0, 150.0, 118.0, 141.0])

    def step_a():
        order.append("A")
        return next(a)

    def step_b():
        order.append("B")
        return next(b)
    got = launch_ab.interleave([("torch", step_a), ("vmmrt", step_b)], 4)
    assert "".join(order) == "ABBAABBA"
    assert got == {"torch": [100.0, 120.0, 90.0, 110.0], "vmmrt": [130.0, 150.0, 118.0, 141.0]}


def test_the_excess_is_the_median_of_the_pairs_differences_not_of_the_leasts():
    # the machine drifts (the third pair is slow for both) and torch's least
    # came from a quiet moment vmmrt's step of that pair missed: the leasts
    # differ by 40 us, the pairs by 10 but that one
    samples = {"torch": [90.0, 150.0, 300.0, 160.0, 140.0], "vmmrt": [130.0, 160.0, 310.0, 170.0, 150.0]}
    s = launch_ab.summarize(samples, "torch")
    assert s["torch"]["least"] == 90.0 and s["vmmrt"]["least"] == 130.0
    assert s["vmmrt"]["excess_median"] == 10.0
    assert s["vmmrt"]["excess_q1"] == 10.0
    assert "excess_median" not in s["torch"]
    text = "\n".join(launch_ab.lines(s, "torch"))
    assert "over torch: median +10.0 us" in text, text


def test_a_drift_between_the_sides_shows_in_the_quartiles():
    samples = {"torch": [100.0, 100.0, 100.0, 100.0], "vmmrt": [105.0, 115.0, 125.0, 135.0]}
    s = launch_ab.summarize(samples, "torch")["vmmrt"]
    assert s["excess_median"] == 20.0 and s["excess_q1"] < 20.0 < s["excess_q3"]


def test_the_command_line_refuses_what_it_cannot_measure():
    with pytest.raises(SystemExit):
        bench.parse(["--launch-ab", "-1", "--device", "cpu"])
    with pytest.raises(SystemExit):
        bench.parse(["--launch-ab", "5", "--front", "--device", "cpu"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            bench.parse(["--launch-ab", "5", "--device", "cpu"])
    else:
        a = bench.parse(["--launch-ab", "5", "--shape", "launch"])
        assert a.launch_ab == 5 and a.loops == ["set_to_none"]

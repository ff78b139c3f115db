# SPDX-License-Identifier: LGPL-2.1-or-later
"""A plan's predicted peak against the measured one, for the user's own step.

``memory_budget=`` plans from a model of the step (vmmrt.torch.budget): what
stays, the banks, the largest working set, resident activations and
gradients over the step, the optimizer's states and temporaries. Whether
the model holds for a given training loop is a measurement: the
driver-level used memory (cuMemGetInfo, vmmrt.torch.memory.PeakSampler)
sampled over whole steps of the caller's, optimizer step included, against
the plan's predicted peak. :func:`check_plan` makes it and keeps it on the
Offload: ``describe()`` prints it, as the benchmark's fronts print theirs.

A plan that does not predict a peak (``offload="auto"``'s bandwidth plan,
a fraction) gets the measurement alone.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from vmmrt.torch import memory

MiB = float(1 << 20)


class PlanCheck:
    """One reading: ``predicted`` (bytes, None where the plan predicts no
    peak), ``measured`` (the sampled driver-level peak over the steps, in
    bytes; None where nothing could be sampled), ``steps``, the sampler's
    ``samples`` and ``max_gap_s`` (what a spike must last to be seen), and
    ``step_ms`` (the steps' mean wall time, the device waited for)."""

    __slots__ = ("predicted", "measured", "steps", "samples", "max_gap_s", "step_ms", "left_out")

    def __init__(self, predicted, measured, steps, samples, max_gap_s, step_ms, left_out=()):
        self.predicted, self.measured, self.steps = predicted, measured, steps
        self.samples, self.max_gap_s, self.step_ms = samples, max_gap_s, step_ms
        # what the plan was not told of (left_out_of): named when the step holds more than it predicts
        self.left_out = tuple(left_out)

    @property
    def ratio(self) -> float | None:
        """predicted / measured (above 1: the plan over-predicts)."""
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured

    def describe(self) -> str:
        if self.measured is None:
            return "plan check: nothing sampled (no CUDA device, and no reading given)"
        head = "plan check over %d step(s) of %.2f ms: measured peak %.0f MiB (driver-level, %d samples, " \
               "longest gap %.0f us)" % (self.steps, self.step_ms, self.measured / MiB, self.samples,
                                         1e6 * self.max_gap_s)
        if self.predicted is None:
            return head + "; the plan predicts no peak"
        out = head + "; predicted %.0f MiB (%+.1f %%)" % (self.predicted / MiB,
                                                          100.0 * (self.predicted / self.measured - 1))
        if self.left_out and self.predicted < self.measured * (1 - TOLERANCE):
            out += "; the plan was given no %s: a step that makes them holds that much more than it predicts" \
                % " nor ".join(self.left_out)
        return out

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__slots__}
        out["ratio"] = self.ratio
        return out


# Below this share under the measured peak, a prediction is off (the memory plan's target: 2 %).
TOLERANCE = 0.02


def left_out_of(off: Any) -> tuple:
    """What a budget plan counts only when told (``Budget(reserve=, step=)``)
    and was not: the optimizer's states, created at its first step, and the
    temporaries its step makes (foreach AdamW: the parameters' size)."""
    plan = getattr(off, "plan", None)
    if getattr(plan, "peak_bytes", None) is None:
        return ()
    out = []
    if not getattr(plan, "reserve_bytes", 0):
        out.append("reserve= (the optimizer's states)")
    if not getattr(plan, "step_bytes", 0):
        out.append("step= (the optimizer step's temporaries)")
    return tuple(out)


def predicted_peak(off: Any) -> int | None:
    """The peak the Offload's plan predicts (bytes of the device in use, as
    ``memory_budget=`` counts them), or None."""
    plan = getattr(off, "plan", None)
    peak = getattr(plan, "peak_bytes", None)
    return int(peak) if peak is not None else None


def check_plan(target: Any, step: Callable[[], Any], steps: int = 3, read: Callable[[], int] | None = None,
               interval_s: float = 50e-6) -> PlanCheck:
    """Run ``step()`` (one whole training step of the caller's: forwards,
    backwards, optimizer step, zero_grad) ``steps`` times while sampling the
    device's used memory, and compare the peak with what the plan of
    ``target`` (a callable of make_graphed_callables, or its Offload)
    predicts. The device is waited for after each step, so that the work it
    queued is sampled. Kept as ``Offload.plan_check`` and printed by
    ``describe()``. ``read``: the reading (bytes in use), for tests and for
    other counters; by default cuMemGetInfo's on the Offload's device."""
    from vmmrt.torch.graphed import offload_of
    from vmmrt.torch.offload import Offload
    off = target if isinstance(target, Offload) else offload_of(target)
    if not callable(step):
        raise TypeError("check_plan(step=%r): a function that runs one training step" % (step,))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError("check_plan(steps=%r): one step or more" % (steps,))
    if read is not None and not callable(read):
        raise TypeError("check_plan(read=%r): a function returning the bytes in use, or None" % (read,))
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
        raise ValueError("check_plan(interval_s=%r): seconds between readings, above 0" % (interval_s,))
    off.check_usable()
    cuda = off.device_type == "cuda" and torch.cuda.is_available()
    if read is None and cuda:
        index = off.device.index if off.device.index is not None else torch.cuda.current_device()

        def read():
            return memory.driver_used(index)
    # (no device and no reading: the steps run, nothing is sampled)
    sampler = memory.PeakSampler(interval_s=interval_s, read=read) if read is not None else None
    t0 = time.perf_counter()
    if sampler is not None:
        sampler.start()
    try:
        for _ in range(steps):
            step()
            if cuda:
                torch.cuda.synchronize(off.device)
    finally:
        if sampler is not None:
            sampler.stop()
    elapsed = time.perf_counter() - t0
    out = PlanCheck(predicted_peak(off), sampler.peak if sampler else None, steps,
                    sampler.samples if sampler else 0, sampler.max_gap_s if sampler else 0.0,
                    1e3 * elapsed / steps, left_out_of(off))
    off.plan_check = out
    return out

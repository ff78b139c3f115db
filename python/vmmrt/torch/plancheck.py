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

A plan made without ``memory_budget=`` (``offload="auto"``'s bandwidth
plan, a fraction, mode none) is predicted by the same model over its
layers (vmmrt.torch.planner.StepModel, ``Offload.step_model``); as it was
told nothing of the optimizer, :func:`check_plan` takes that as
``reserve=`` and ``step_bytes=``, and the loop as ``loop=``.
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

    __slots__ = ("predicted", "measured", "steps", "samples", "max_gap_s", "step_ms", "left_out", "model")

    def __init__(self, predicted, measured, steps, samples, max_gap_s, step_ms, left_out=(), model=None):
        self.predicted, self.measured, self.steps = predicted, measured, steps
        # where the prediction came from, when not a budget plan's own (StepModel: the loop, what it was told)
        self.model = model
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
        out = head + "; predicted %.0f MiB (%+.1f %%%s)" % (self.predicted / MiB,
                                                            100.0 * (self.predicted / self.measured - 1),
                                                            "" if self.model is None else ": " + self.model)
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


def left_out_of(off: Any, reserve: int = 0, step_bytes: int = 0) -> tuple:
    """What a plan counts only when told and was not: the optimizer's
    states, created at its first step, and the temporaries its step makes
    (foreach AdamW: the parameters' size); a budget plan is told by
    ``Budget(reserve=, step=)``, a plan without one by check_plan's
    ``reserve=`` and ``step_bytes=``."""
    plan = getattr(off, "plan", None)
    if getattr(plan, "peak_bytes", None) is None:
        if getattr(off, "step_model", None) is None:
            return ()
        return tuple(w for v, w in ((reserve, "check_plan(reserve=) (the optimizer's states)"),
                                    (step_bytes, "check_plan(step_bytes=) (the optimizer step's temporaries)"))
                     if not v)
    out = []
    if not getattr(plan, "reserve_bytes", 0):
        out.append("reserve= (the optimizer's states)")
    if not getattr(plan, "step_bytes", 0):
        out.append("step= (the optimizer step's temporaries)")
    return tuple(out)


def predicted_peak(off: Any, reserve: int = 0, step_bytes: int = 0, loop: str | None = None) -> int | None:
    """The peak the Offload's plan predicts (bytes of the device in use, as
    ``memory_budget=`` counts them), or None: a budget plan's own, else its
    whole-step model's (``Offload.step_model``) with the optimizer's
    ``reserve`` and ``step_bytes`` in ``loop`` (None: the loop
    make_graphed_callables(loop=) named, else the larger of the two)."""
    plan = getattr(off, "plan", None)
    peak = getattr(plan, "peak_bytes", None)
    if peak is not None:
        return int(peak)
    model = getattr(off, "step_model", None)
    if model is None:
        return None
    loops = (loop,) if loop is not None else (off.loop,) if off.loop is not None else ("set_to_none", "persistent")
    return max(model.peak(reserve, step_bytes, x) for x in loops)


def check_plan(target: Any, step: Callable[[], Any], steps: int = 3, read: Callable[[], int] | None = None,
               interval_s: float = 50e-6, reserve: int = 0, step_bytes: int = 0,
               loop: str | None = None) -> PlanCheck:
    """Run ``step()`` (one whole training step of the caller's: forwards,
    backwards, optimizer step, zero_grad) ``steps`` times while sampling the
    device's used memory, and compare the peak with what the plan of
    ``target`` (a callable of make_graphed_callables, or its Offload)
    predicts. The device is waited for after each step, so that the work it
    queued is sampled. Kept as ``Offload.plan_check`` and printed by
    ``describe()``. ``read``: the reading (bytes in use), for tests and for
    other counters; by default cuMemGetInfo's on the Offload's device.
    ``reserve``, ``step_bytes`` and ``loop``: for a plan made without
    ``memory_budget=`` (whose Budget would say them), the optimizer's
    states, its step's temporaries and the loop ("set_to_none" or
    "persistent"; None: the one make_graphed_callables(loop=) named, else
    the larger prediction of the two)."""
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
    for name, v in (("reserve", reserve), ("step_bytes", step_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError("check_plan(%s=%r): bytes, 0 or more" % (name, v))
    if loop is not None:
        from vmmrt.torch.budget import check_loop
        check_loop(loop, "check_plan(loop=%r) (None: the larger of the two)")
    if (reserve or step_bytes or loop is not None) and getattr(off.plan, "peak_bytes", None) is not None:
        raise ValueError("check_plan(reserve=, step_bytes=, loop=) are for a plan made without memory_budget=; "
                         "this one was given its own: vmmrt.torch.Budget(reserve=, step=, loop=)")
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
    model = None
    if getattr(off.plan, "peak_bytes", None) is None and off.step_model is not None:
        which = loop or off.loop
        model = "the whole-step model, %s, told %.0f MiB of optimizer states and %.0f MiB of step temporaries" % (
            "%s loop" % which if which else "the larger of the two loops", reserve / MiB, step_bytes / MiB)
    out = PlanCheck(predicted_peak(off, reserve, step_bytes, loop), sampler.peak if sampler else None, steps,
                    sampler.samples if sampler else 0, sampler.max_gap_s if sampler else 0.0,
                    1e3 * elapsed / steps, left_out_of(off, reserve, step_bytes), model)
    off.plan_check = out
    return out

# SPDX-License-Identifier: LGPL-2.1-or-later
"""A memory budget in, the fastest plan out: per layer, keep, offload or recompute.

Arithmetic only (plain numbers in, a :class:`BudgetPlan` out), as
:func:`vmmrt.torch.planner.plan` is, so every case is checked by hand
without a device. What it is given, per layer in forward order
(:class:`LayerCost`): the forward and backward time of the warm-up passes,
the bytes of each region that may move and of those that stay whatever
happens, and whether the layer may (or must) be recomputed. Globally: the
pinned bandwidths, the bytes that are on the device whatever the plan
(parameters, gradients, optimizer states, the graph pool's floor:
``static_bytes``), the driver's granularity and remap's cost per map.

Each layer gets one action:

keep       what it saves stays on the device from its forward to its backward;
offload    some of its regions move (the rest stays): libvmmrt's banks (ping-pong:
           two of the largest group) or mapped groups (remap: the look-ahead + 1
           largest) hold what moves, rounded up to the granularity;
recompute  its forward saves only its inputs (the graph's static inputs: in its
           resident slot from its forward to its backward, or, in ping-pong, moved
           through the banks as an offloaded layer's regions are) and its backward
           runs the forward again first: its whole saved set is in flight during its
           own backward only.

Predicted step time = sum of forward and backward times + every recomputed
forward + the copy time not hidden: a layer's D2H behind the next forward
and its H2D behind the backwards of the look-ahead layers before it in
backward order, each window scaled by ``margin`` (the planner's model) +
remap's per-map cost. Predicted driver-level peak = static + banks + the
largest working set + the most the timeline holds at once:

- the working set of a layer is what its forward or backward allocates
  beyond what it keeps (intermediates, the activations' gradients), and for
  a recomputed layer its whole saved set again on top: these live in the
  graph pool (or the caching allocator), which keeps its most reserved for
  the life of the graphs, so the largest one counts at every moment;
- the timeline: each layer's resident slot (what it keeps that does not
  move) from just before its forward to its backward, and its mapped
  gradients (grads="mapped") from just before its backward to the
  optimizer's step, ``map_ahead`` uses ahead as Offload maps them, or, in
  the persistent ``.grad`` loop (``Budget(loop="persistent")``), the whole
  step: the ``.grad`` the user keeps holds them across the next forwards;
  static gradient buffers are in ``static_bytes``.

What a step holds outside the layers is the caller's: an optimizer's
states (``Budget(reserve=)``, beside everything above) and the temporaries
its step allocates and frees (``Budget(step=)``: foreach AdamW's sqrt of a
second moment is 1x the parameters). With the memory plan's pages
(``pages``: vmmrt.torch.memplan, the optimizer step routed into them by
vmmrt.torch.optmem), only the gradients are live in them at the step and
the temporaries take the rest: the layers' part of the peak is then the
larger of the above and gradients + temporaries; without them the
temporaries add to it.

The search, per strategy and per bound on the largest group that moves
(which fixes the banks), is the greedy of a multiple-choice knapsack: each
layer's options (keep, offload levels, recompute) reduced to the lower
convex hull of (bytes saved, time added), walked by the best bytes per
millisecond until the peak fits, then every action undone that the budget
allows back. Among all plans that fit, the fastest wins (ties: the lower
peak); when none fits, :class:`BudgetError` gives the smallest peak found.
"""
import math
import re

import vmmrt
from vmmrt import _capi
from vmmrt.torch import select

STRATEGIES = (("pingpong", 1), ("remap", 1), ("remap", 2), ("remap", 3))
ACTIONS = ("keep", "offload", "recompute")
LOOPS = ("set_to_none", "persistent")
# remap's cost per offloaded layer on the forward path: its map waits for a
# D2H, a host function and the driver worker (H200: ~0.4 ms).
REMAP_MS = 0.4


class BudgetError(vmmrt.Error):
    """No plan fits the memory budget; ``smallest`` is the smallest budget (bytes)
    the planner can fit, ``budget`` the one asked, ``keep`` the predicted peak of
    keeping everything (from the same measurements: between the two, a
    budget has a plan that recomputes or offloads)."""

    def __init__(self, detail, budget=None, smallest=None, where="vmmrt.torch memory_budget", keep=None):
        super().__init__(_capi.E_OUT_OF_MEMORY, detail, where)
        self.budget, self.smallest, self.keep = budget, smallest, keep


class InvalidBudget(vmmrt.Error, ValueError):
    """A memory_budget (or hand plan) that is not one: wrong type, range or format."""

    def __init__(self, detail, where="vmmrt.torch memory_budget"):
        vmmrt.Error.__init__(self, _capi.E_INVALID_ARGUMENT, detail, where)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4, "tb": 1000 ** 4,
          "tib": 1 << 40}
_FORMAT = "bytes as an int (24 << 30), a share of the device as a string (\"80%\"), or a size (\"60GiB\")"


def parse(value, device_total=None):
    """Bytes of a memory_budget: an int of bytes, "80%" of ``device_total``
    (cuMemGetInfo's total) or a size with a unit ("60GiB", "64 GB")."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidBudget("memory_budget=%r is a %s; give %s" % (value, type(value).__name__, _FORMAT))
    if isinstance(value, int):
        if value <= 0:
            raise InvalidBudget("memory_budget=%d: a budget is a positive number of bytes" % value)
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%|[A-Za-z]*)\s*", value)
    if m is None:
        raise InvalidBudget("memory_budget=%r is not a budget; give %s" % (value, _FORMAT))
    num, unit = float(m.group(1)), m.group(2)
    if unit == "%":
        if not 0 < num <= 100:
            raise InvalidBudget("memory_budget=%r: a share of the device is above 0%% and at most 100%%" % value)
        if device_total is None or device_total <= 0:
            raise InvalidBudget("memory_budget=%r: the device's total memory is not known here; give bytes"
                                % value)
        return int(device_total * num / 100)
    scale = _UNITS.get(unit.lower())
    if scale is None:
        raise InvalidBudget("memory_budget=%r: unknown unit %r (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or %%)"
                            % (value, unit))
    if num * scale < 1:
        raise InvalidBudget("memory_budget=%r: a budget is a positive number of bytes" % value)
    return int(num * scale)


def check(value):
    """Refuse what is not a memory_budget (type and format), before any work:
    the device's total is not needed to tell."""
    if isinstance(value, Budget):
        if value.limit is not None:
            parse(value.limit, 1 << 40)
        return value
    parse(value, 1 << 40)
    return value


class Budget:
    """A memory_budget with more said than a number: ``limit`` (what
    :func:`parse` takes, or None with ``layers``), ``reserve`` (bytes that
    the step will hold beyond what is on the device when the plan is made,
    e.g. optimizer states created at the first step), ``step`` (bytes the
    optimizer step allocates and frees within itself: foreach AdamW's
    temporaries, about the parameters' size; on the memory plan's pages they
    take the bytes the activations left free then, else they add to
    ``reserve``), ``layers`` (a hand plan:
    one choice per layer, "keep", "recompute", "offload" (every region) or a
    fraction of the layer's bytes to offload; predicted, not searched),
    ``recompute`` (False: the planner never recomputes) and ``loop``: the
    training loop the plan is for, "set_to_none" (zero_grad(set_to_none=True)
    drops the gradients before the next forward: they hold memory from
    their backward to the optimizer step) or "persistent" (a ``.grad`` kept
    and zeroed in place: the gradients hold memory the whole step, beside
    the activations of the next forwards). The loop is learned only at the
    second step, after the plan: a budget planned for the wrong one is
    exceeded by up to the gradients' size in the persistent loop."""

    def __init__(self, limit=None, reserve=0, layers=None, recompute=True, step=0, loop="set_to_none"):
        if limit is None and layers is None:
            raise InvalidBudget("Budget() needs a limit, a hand plan (layers=) or both")
        for name, v in (("reserve", reserve), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidBudget("Budget(%s=%r): bytes, 0 or more" % (name, v))
        check_loop(loop, "Budget(loop=%r)")
        if layers is not None:
            layers = [check_choice(c, i) for i, c in enumerate(layers)]
        self.limit, self.reserve, self.layers, self.recompute = limit, reserve, layers, bool(recompute)
        self.step = step
        self.loop = loop


def check_loop(loop, how="loop=%r"):
    """``loop`` if it is one of LOOPS, else an InvalidBudget (a ValueError)
    saying it as ``how`` does (Budget's, make_graphed_callables' and
    vmmrt.torch.planner.peak_model's argument)."""
    if loop not in LOOPS:
        raise InvalidBudget("%s: %s" % (how % (loop,), " or ".join(repr(x) for x in LOOPS)))
    return loop


def check_choice(c, i):
    """One layer of a hand plan: "keep", "recompute", "offload" or a fraction in [0, 1]."""
    if isinstance(c, str) and c in ACTIONS:
        return c
    if not isinstance(c, bool) and isinstance(c, (int, float)) and 0 <= c <= 1:
        return float(c)
    if isinstance(c, (tuple, list, dict)):
        raise InvalidBudget("layer %d: %r: a layer is recomputed or offloaded, not both (recomputing it saves "
                            "only its inputs, so there is nothing of it to offload)" % (i, c))
    raise InvalidBudget("layer %d: %r is not a choice; give 'keep', 'recompute', 'offload' or a fraction of the "
                        "layer's saved bytes to offload" % (i, c))


class LayerCost:
    """What the planner knows of one layer: ``sizes`` the bytes of each region
    that may move (Offload.candidates), ``fixed`` the saved bytes that stay if
    it is not recomputed (outputs, marked and small tensors), ``recompute``
    None (may be), True (must be: marked by the user) or False (may not);
    ``grads`` the bytes of its parameters' gradients when they come and go
    (grads="mapped": mapped at its backward, released by zero_grad; static
    buffers are in static_bytes instead); ``fwd_work`` and ``bwd_work`` what
    its forward and backward allocate beyond what they keep (intermediates,
    the gradients of activations: the warm-up's allocator peak over what
    stays), which a graph pool or the caching allocator keeps reserved;
    ``inputs`` the bytes of its graphs' static inputs that go in its resident
    slot where it has one (vmmrt.torch.static_inputs, with the memory plan):
    from its forward to its backward when it is kept, partly offloaded or
    recomputed (its checkpoint), for the graphs' life when a plan moves all
    it saves (no slot: they stay where they are)."""
    __slots__ = ("name", "fwd_ms", "bwd_ms", "sizes", "fixed", "recompute", "grads", "fwd_work", "bwd_work",
                 "inputs")

    def __init__(self, name, fwd_ms, bwd_ms, sizes, fixed=0, recompute=None, grads=0, fwd_work=0, bwd_work=0,
                 inputs=0):
        self.name, self.fwd_ms, self.bwd_ms = name, float(fwd_ms), float(bwd_ms or 0.0)
        self.sizes, self.fixed, self.recompute = [int(s) for s in sizes], int(fixed), recompute
        self.grads, self.fwd_work, self.bwd_work = int(grads), int(fwd_work), int(bwd_work)
        self.inputs = int(inputs)

    def but(self, **kw):
        """A copy with some fields changed."""
        c = LayerCost(self.name, self.fwd_ms, self.bwd_ms, self.sizes, self.fixed, self.recompute, self.grads,
                      self.fwd_work, self.bwd_work, self.inputs)
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    @property
    def total(self):
        return sum(self.sizes) + self.fixed


class LayerChoice:
    __slots__ = ("name", "action", "chosen", "moved", "resident", "total", "fwd_ms", "bwd_ms", "exposed_ms",
                 "shared_ms", "grads", "work", "held_inputs", "inputs_moved")

    def __init__(self, cost, action, chosen=(), mode=None):
        self.name, self.action, self.chosen = cost.name, action, sorted(chosen)
        self.moved = sum(cost.sizes[i] for i in self.chosen)
        self.total = cost.total
        self.resident = 0 if action == "recompute" else self.total - self.moved
        # its static inputs: in ping-pong a recomputed layer's, and those of
        # a layer that moves every region, move with the banks
        # (LayerOffload.inputs_move); else in its resident slot where it has
        # one (a recomputed layer's holds them alone), else held all along
        whole = action == "offload" and bool(self.chosen) and len(self.chosen) == len(cost.sizes)
        self.inputs_moved = (action == "recompute" or whole) and mode == "pingpong" and cost.inputs > 0
        if self.inputs_moved:
            self.moved = cost.inputs + (self.moved if whole else 0)
        in_slot = cost.inputs if not self.inputs_moved and (action == "recompute" or self.resident) else 0
        self.resident += in_slot
        self.held_inputs = 0 if self.inputs_moved else cost.inputs - in_slot
        self.fwd_ms, self.bwd_ms = cost.fwd_ms, cost.bwd_ms
        self.exposed_ms = 0.0
        self.shared_ms = 0.0      # what its copies, hidden or not, cost the compute beside them
        self.grads = cost.grads
        # its working set: a recomputed layer's backward holds its whole saved
        # set again (in the pool) under the forward's or the backward's own
        self.work = max(cost.fwd_work, cost.bwd_work) + (self.total if action == "recompute" else 0)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


def _round(n, g):
    return -(-n // g) * g if g > 1 else n


class BudgetPlan:
    """What the planner chose and what it predicts. ``layers[i].chosen`` are
    the indices of the regions that move (what Offload.allocate(plan=) reads)."""

    def __init__(self, layers, mode, lookahead, static_bytes, d2h_gbps, h2d_gbps, margin, granularity,
                 remap_ms, budget=None, map_ahead=1, step_bytes=0, pages=False, persistent=False,
                 contention=(0.0, 0.0)):
        self.layers, self.mode, self.lookahead, self.map_ahead = layers, mode, lookahead, map_ahead
        self.contention = contention
        self.step_bytes, self.pages, self.persistent = step_bytes, pages, persistent
        # Budget(reserve=), inside static_bytes (planner.budget_plan sets it):
        # what check_plan names as left out when it is 0
        self.reserve_bytes = 0
        self.static_bytes, self.d2h_gbps, self.h2d_gbps = static_bytes, d2h_gbps, h2d_gbps
        self.margin, self.granularity, self.remap_ms, self.budget = margin, granularity, remap_ms, budget
        self.alternatives = []      # (mode, lookahead, predicted_ms, peak_bytes) of the other strategies
        self._evaluate()

    def _evaluate(self):
        ls, n = self.layers, len(self.layers)
        groups = sorted((_round(c.moved, self.granularity) for c in ls if c.moved), reverse=True)
        if not groups:
            self.bank_bytes = 0
        elif self.mode == "pingpong":
            self.bank_bytes = 2 * groups[0]
        else:
            self.bank_bytes = sum(groups[:self.lookahead + 1])
        bwd_eff = [c.bwd_ms + (c.fwd_ms if c.action == "recompute" else 0.0) for c in ls]
        d2h, h2d = self.d2h_gbps * 1e6, self.h2d_gbps * 1e6       # bytes per ms
        # The groups libvmmrt never copies: the tail (its backward comes
        # next), and in ping-pong the one before it too, whose bank the tail
        # does not take (vmmrt__schedule_stays): their banks hold them.
        stay = [i for i, c in enumerate(ls) if c.moved][-(2 if self.mode == "pingpong" else 1):]
        for i, c in enumerate(ls):
            c.exposed_ms = c.shared_ms = 0.0
            if not c.moved or i in stay:
                continue
            c.shared_ms = c.moved * (self.contention[0] / d2h + self.contention[1] / h2d)
            nxt = ls[i + 1].fwd_ms if i + 1 < n else 0.0
            window = sum(bwd_eff[i + 1:i + 1 + self.lookahead])
            c.exposed_ms = (max(0.0, c.moved / d2h - self.margin * nxt) + max(0.0, c.moved / h2d - self.margin * window)
                            + (self.remap_ms if self.mode == "remap" else 0.0))
        self.graph_ms = sum(c.fwd_ms + c.bwd_ms for c in ls)
        self.recompute_ms = sum(c.fwd_ms for c in ls if c.action == "recompute")
        self.copy_ms = sum(c.exposed_ms + c.shared_ms for c in ls)
        self.predicted_ms = self.graph_ms + self.recompute_ms + self.copy_ms
        # The pool (or the caching allocator) keeps what the passes allocated
        # at most reserved: the largest working set is held all along.
        self.inflight_bytes = max([c.work for c in ls] or [0])
        # On the memory plan's pages a slot lives exactly from its first use
        # to its last (vmmrt.torch.memplan binds them once): nothing is
        # mapped ahead of the GPU there, as the runtime's per-step maps are.
        self.timeline_bytes = timeline(ls, 0 if self.pages else self.map_ahead, self.persistent)
        during = self.inflight_bytes + self.timeline_bytes
        if self.pages:
            # On the memory plan's pages (pool, resident and gradient slots),
            # only the gradients are live at the optimizer step: its
            # temporaries take the bytes free then (vmmrt.torch.optmem), and
            # ping-pong's banks, which optmem lends with them; they add only
            # what does not fit.
            self.step_peak_bytes = sum(c.grads for c in ls) + self.step_bytes
            held = max(during, self.step_peak_bytes - (self.bank_bytes if self.mode == "pingpong" else 0))
        else:
            self.step_peak_bytes = None
            held = during + self.step_bytes
        # the static inputs of the layers without a resident slot, all along
        self.inputs_bytes = sum(c.held_inputs for c in ls)
        self.peak_bytes = self.static_bytes + self.inputs_bytes + self.bank_bytes + held

    @property
    def fits(self):
        return self.budget is None or self.peak_bytes <= self.budget

    def counts(self):
        out = dict.fromkeys(ACTIONS, 0)
        for c in self.layers:
            out[c.action] += 1
        return out

    def summary(self):
        mib = float(1 << 20)
        k = self.counts()
        head = ("memory plan (%s, look-ahead %d): %d kept, %d offloaded, %d recomputed; predicted step %.2f ms "
                "(layers %.2f + recompute %.2f + copies not hidden or slowing the compute %.2f) = %.3fx the layers' time; "
                "predicted peak "
                "%.0f MiB (static %.0f%s + banks %.0f + working set %.0f + activations and gradients at their "
                "most %.0f, of which kept %.0f and gradients %.0f)%s"
                % (self.mode, self.lookahead, k["keep"], k["offload"], k["recompute"], self.predicted_ms,
                   self.graph_ms, self.recompute_ms, self.copy_ms,
                   self.predicted_ms / self.graph_ms if self.graph_ms else 1.0, self.peak_bytes / mib,
                   self.static_bytes / mib,
                   " + static inputs %.0f" % (self.inputs_bytes / mib) if self.inputs_bytes else "",
                   self.bank_bytes / mib, self.inflight_bytes / mib,
                   self.timeline_bytes / mib, sum(c.resident for c in self.layers) / mib,
                   sum(c.grads for c in self.layers) / mib,
                   "" if self.budget is None else " within the budget of %.0f MiB" % (self.budget / mib))
                + ("; persistent .grad loop: the gradients all step" if self.persistent else ""))
        lines = [head]
        if self.step_bytes:
            lines.append("  the optimizer step's temporaries: %.0f MiB, %s" % (
                self.step_bytes / mib, "on the memory plan's pages beside the gradients (%.0f MiB at the step)%s"
                % (self.step_peak_bytes / mib, " and in ping-pong's banks" if self.mode == "pingpong" else "")
                if self.pages else "beside everything else"))
        for c in self.layers:
            what = {"keep": "keeps", "offload": "offloads %.1f MiB (%d regions%s)" % (
                        c.moved / mib, len(c.chosen), " and its static inputs" if c.inputs_moved else ""),
                    "recompute": "recomputes its forward in backward (+%.2f ms)%s" % (
                        c.fwd_ms, ", its checkpoint (%.1f MiB) through the banks" % (c.moved / mib)
                        if c.inputs_moved else "")}[c.action]
            lines.append("  %-24s fwd %7.2f ms  bwd %7.2f ms  saved %8.1f MiB  work %7.1f MiB  grads %7.1f MiB  %s%s%s"
                         % (c.name, c.fwd_ms, c.bwd_ms, c.total / mib, c.work / mib, c.grads / mib, what,
                            ", %.2f ms not hidden" % c.exposed_ms if c.exposed_ms else "",
                            ", %.2f ms of compute slowed by its copies" % c.shared_ms if c.shared_ms else ""))
        for mode, la, ms, peak in self.alternatives:
            lines.append("  alternative: %s look-ahead %d predicts %.2f ms at %.0f MiB (Offload(mode=, lookahead=) "
                         "chooses the strategy)" % (mode, la, ms, peak / mib))
        return "\n".join(lines)

    def as_dict(self):
        return {"mode": self.mode, "lookahead": self.lookahead, "budget_bytes": self.budget,
                "static_bytes": self.static_bytes, "inputs_bytes": self.inputs_bytes, "bank_bytes": self.bank_bytes,
                "inflight_bytes": self.inflight_bytes, "timeline_bytes": self.timeline_bytes,
                "map_ahead": self.map_ahead, "peak_bytes": self.peak_bytes,
                "step_bytes": self.step_bytes, "pages": self.pages, "step_peak_bytes": self.step_peak_bytes,
                "persistent": self.persistent, "contention": list(self.contention),
                "graph_ms": self.graph_ms, "recompute_ms": self.recompute_ms, "copy_ms": self.copy_ms,
                "predicted_ms": self.predicted_ms, "counts": self.counts(),
                "alternatives": [list(a) for a in self.alternatives],
                "layers": [c.as_dict() for c in self.layers]}


def timeline(ls, ahead=1, persistent=False):
    """The most that resident activations and mapped gradients hold at once
    over a step (every forward, then the backwards in reverse): a layer's
    resident slot from ``ahead`` uses before its forward to its backward, its
    gradients from ``ahead`` uses before its backward to the optimizer's step
    (Offload.gpu_reached_previous maps that far ahead of the GPU), or at
    every use with ``persistent`` (a .grad kept across steps)."""
    n = len(ls)
    worst = sum(c.grads for c in ls)            # the optimizer's step: every gradient
    for u in range(2 * n):
        live = 0
        for i, c in enumerate(ls):
            f, b = i, 2 * n - 1 - i             # the layer's forward and backward uses
            if f - ahead <= u <= b:
                live += c.resident
            if persistent or u >= b - ahead:
                live += c.grads
        worst = max(worst, live)
    return worst


class _Env:
    def __init__(self, costs, static_bytes, d2h_gbps, h2d_gbps, margin, granularity, remap_ms, map_ahead=1,
                 step_bytes=0, pages=False, persistent=False, contention=(0.0, 0.0)):
        self.costs, self.static, self.d2h, self.h2d = costs, static_bytes, d2h_gbps, h2d_gbps
        self.margin, self.gran, self.remap_ms, self.map_ahead = margin, granularity, remap_ms, map_ahead
        self.step_bytes, self.pages, self.persistent = step_bytes, pages, persistent
        self.contention = contention

    def make(self, choices, mode, la, budget=None):
        ls = [LayerChoice(c, a, ch, mode) for c, (a, ch) in zip(self.costs, choices)]
        p = BudgetPlan(ls, mode, la, self.static, self.d2h, self.h2d, self.margin, self.gran, self.remap_ms,
                       budget, self.map_ahead, self.step_bytes, self.pages, self.persistent, self.contention)
        p.costs = self.costs        # what it was planned from (the benchmark predicts hand plans with it)
        return p


def _check_inputs(costs, static_bytes, d2h_gbps, h2d_gbps, margin, step_bytes=0):
    if not 0 < margin <= 1:
        raise InvalidBudget("planner margin %r is not in (0, 1]" % (margin,))
    if not d2h_gbps > 0 or not h2d_gbps > 0:
        raise InvalidBudget("the planner needs positive bandwidths, got D2H %r, H2D %r" % (d2h_gbps, h2d_gbps))
    if static_bytes < 0 or step_bytes < 0:
        raise InvalidBudget("static_bytes=%r or step_bytes=%r is negative" % (static_bytes, step_bytes))
    for c in costs:
        if c.fwd_ms < 0 or c.bwd_ms < 0 or any(s < 0 for s in c.sizes) or min(c.fixed, c.grads, c.fwd_work,
                                                                                 c.bwd_work, c.inputs) < 0:
            raise InvalidBudget("layer %r: negative time or size" % c.name)


def contention_pair(c):
    """The copies' contention as both planners take it (this one and
    vmmrt.torch.planner.plan): (D2H, H2D) ms of compute lost per ms of copy,
    None (or a None side: not measured) 0; anything else that is not two
    finite numbers, 0 or more, is an InvalidBudget (a ValueError)."""
    try:
        c = (0.0, 0.0) if c is None else tuple(0.0 if x is None else x for x in c)
    except TypeError:
        c = None
    if c is None or len(c) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                           and math.isfinite(x) and x >= 0 for x in c):
        raise InvalidBudget("contention %r is not (D2H, H2D) ms of compute lost per ms of copy, each a finite "
                            "number, 0 or more" % (c,))
    return c


def evaluate(costs, choices, mode="pingpong", lookahead=1, static_bytes=0, d2h_gbps=1.0, h2d_gbps=None,
             margin=0.9, granularity=1, remap_ms=REMAP_MS, budget=None, map_ahead=1, step_bytes=0, pages=False,
             persistent=False, contention=None):
    """The prediction of a hand plan: ``choices`` one per layer as
    :class:`Budget`'s ``layers`` take them. A fraction offloads the largest
    regions first that fit in it (the same selection as offload=fraction),
    the tail's (last layer's) too: libvmmrt never copies them, they stay in
    its bank (or remap's slot), as offload=fraction leaves them.
    ``contention``: (D2H, H2D) ms the compute loses per ms of copy, hidden
    or not (Offload.copy_contention; None: 0), charged per copied byte."""
    h2d_gbps = h2d_gbps or d2h_gbps
    _check_inputs(costs, static_bytes, d2h_gbps, h2d_gbps, margin, step_bytes)
    if len(choices) != len(costs):
        raise InvalidBudget("a hand plan of %d choices for %d layers" % (len(choices), len(costs)))
    env = _Env(costs, static_bytes, d2h_gbps, h2d_gbps, margin, granularity, remap_ms, map_ahead, step_bytes, pages,
               persistent, contention_pair(contention))
    out = []
    for i, (c, ch) in enumerate(zip(costs, choices)):
        ch = check_choice(ch, i)
        if c.recompute is True and ch not in ("recompute",):
            raise InvalidBudget("layer %d (%r) is marked for recomputation (vmmrt.torch.mark_recompute) and the "
                                "hand plan says %r: a layer is recomputed or offloaded, not both" % (i, c.name, ch))
        if ch == "recompute" and c.recompute is False:
            raise InvalidBudget("layer %d (%r) cannot be recomputed" % (i, c.name))
        if ch == "offload":
            ch = 1.0
        if isinstance(ch, float):
            idx = fraction_chosen(c, ch)
            out.append(("offload" if idx else "keep", idx))
        else:
            out.append((ch, []))
    return env.make(out, mode, lookahead, budget)


def auto_strategies():
    """What mode="auto" chooses among: :data:`STRATEGIES`, and mode none for
    a plan that moves nothing (every layer kept or recomputed). Ping-pong
    moves a recomputed layer's checkpoint (its graphs' static inputs)
    through two banks held all along; mode none keeps it in the layer's
    resident slot from its forward to its backward, on the memory plan's
    pages beside what is not alive then: on 4 long-context layers two
    banks of 256 MiB against one checkpoint alive at the busiest use (the
    first layer's backward). With many layers every checkpoint is alive at
    the first backward, and the banks can be the smaller: the prediction
    chooses."""
    return (("none", 1),) + tuple(STRATEGIES)


def hand_plan(costs, choices, mode="pingpong", lookahead=1, strategies=None, **kw):
    """:func:`evaluate`'s prediction of a hand plan in ``mode``; where
    ``strategies`` (mode="auto"'s, :func:`auto_strategies`) include mode
    none and the plan moves nothing there (it keeps or recomputes every
    layer), in mode none instead when its predicted peak is no higher:
    it copies nothing, so it is no slower. The other's prediction is in
    the plan's ``alternatives``."""
    p = evaluate(costs, choices, mode, lookahead, **kw)
    if mode == "none" or not any(m == "none" for m, _ in strategies or ()):
        return p
    q = evaluate(costs, choices, "none", 1, **kw)
    if any(c.moved for c in q.layers):      # it offloads: only ping-pong or remap can
        return p
    best, other = (q, p) if q.peak_bytes <= p.peak_bytes else (p, q)
    best.alternatives = [(other.mode, other.lookahead, other.predicted_ms, other.peak_bytes)]
    return best


def fraction_chosen(c, fraction):
    """The regions of ``c`` (indices into its sizes) that offload=fraction
    moves: the largest first that fit in the fraction. The tail's too
    (Offload.allocate selects them as any layer's): libvmmrt never copies
    them (vmmrt_group_stays(3)), but they lie in its group, not in a
    resident slot, so they count in the banks, not beside them."""
    if fraction == 0:
        return []
    return list(range(len(c.sizes))) if fraction >= 1 else select.choose(c.sizes, select.fraction_budget(c.sizes,
                                                                                                          fraction))


def predict(costs, chosen, mode="pingpong", lookahead=1, granularity=1, map_ahead=1, pages=False,
            persistent=False, static_bytes=0, step_bytes=0):
    """The memory model's view of a plan that moves the regions ``chosen``
    (per layer, indices into its ``sizes``; nothing recomputed): the
    bandwidth planner's plans (vmmrt.torch.planner.lightest), weighed by the
    peak they predict over the static bytes, which no such plan changes;
    with ``static_bytes`` and ``step_bytes`` (Budget(step=)) the whole
    step's (vmmrt.torch.planner.StepModel)."""
    if len(chosen) != len(costs):
        raise InvalidBudget("%d layers chosen for %d layers" % (len(chosen), len(costs)))
    _check_inputs(costs, static_bytes, 1.0, 1.0, 0.9, step_bytes)
    # (the copies' times are the bandwidth planner's, not this model's: placeholders)
    env = _Env(costs, static_bytes=static_bytes, d2h_gbps=1.0, h2d_gbps=1.0, margin=0.9, granularity=granularity,
               remap_ms=0.0, map_ahead=map_ahead, step_bytes=step_bytes, pages=pages, persistent=persistent)
    return env.make([("offload" if idx else "keep", list(idx)) for idx in chosen], mode, lookahead)


def _options(c, tail, env, la_window, nxt_fwd, mode):
    """(bytes saved, ms added, (action, chosen)) of a layer's options, keep first."""
    opts = [(0, 0.0, ("keep", []))]
    if c.recompute is True:
        return [(c.total, c.fwd_ms, ("recompute", []))]
    if not tail and c.sizes:
        d2h, h2d = env.d2h * 1e6, env.h2d * 1e6
        seen = set()
        order = sorted(range(len(c.sizes)), key=lambda k: (-c.sizes[k], k))
        hidden = env.margin * min(nxt_fwd * env.d2h, la_window * env.h2d) * 1e6
        budgets = [hidden]
        acc = 0
        for k in order:
            acc += c.sizes[k]
            budgets.append(acc)
        for b in budgets:
            idx = tuple(select.choose(c.sizes, b))
            m = sum(c.sizes[k] for k in idx)
            if not m or idx in seen:
                continue
            seen.add(idx)
            t = (max(0.0, m / d2h - env.margin * nxt_fwd) + max(0.0, m / h2d - env.margin * la_window)
                 + m * (env.contention[0] / d2h + env.contention[1] / h2d)
                 + (env.remap_ms if mode == "remap" else 0.0))
            opts.append((m, t, ("offload", list(idx))))
    if c.recompute is None and c.total:
        opts.append((c.total, c.fwd_ms, ("recompute", [])))
    return opts


def _hull(opts):
    """The lower convex hull of (bytes saved, ms added) from keep: the options a
    greedy by bytes per millisecond walks through, in order."""
    pts = sorted(opts, key=lambda o: (o[0], o[1]))
    front = []
    for p in pts:          # drop the dominated: more time for fewer or equal bytes
        # ... but never the start (keep, no bytes saved): an offload whose
        # copies hide completely costs no more time than keep, and without
        # keep the greedy could not undo the layer back to it, and would
        # move every layer where fewer fit the budget in the same time
        while front and front[-1][0] > 0 and front[-1][1] >= p[1]:
            front.pop()
        front.append(p)
    hull = []
    for p in front:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = (hull[-2][0], hull[-2][1]), (hull[-1][0], hull[-1][1])
            if (y2 - y1) * (p[0] - x1) >= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def _search(env, mode, la, cap, budget):
    """The greedy under a cap on the bytes a layer moves (which fixes the banks)."""
    costs, n = env.costs, len(env.costs)
    hulls = []
    for i, c in enumerate(costs):
        nxt = costs[i + 1].fwd_ms if i + 1 < n else 0.0
        window = sum(x.bwd_ms for x in costs[i + 1:i + 1 + la])
        opts = [o for o in _options(c, i == n - 1, env, window, nxt, mode) if o[2][0] != "offload" or o[0] <= cap]
        hulls.append(_hull(opts))
    at = [0] * n
    plan = env.make([h[0][2] for h in hulls], mode, la, budget)
    best_fit = plan if plan.fits else None
    smallest = plan
    while True:
        if plan.fits:
            break
        pick, pick_eff = None, None
        for i, h in enumerate(hulls):
            if at[i] + 1 < len(h):
                a, b = h[at[i]], h[at[i] + 1]
                dt = b[1] - a[1]
                eff = (b[0] - a[0]) / dt if dt > 1e-12 else float("inf")
                key = (eff, b[0] - a[0])
                if pick is None or key > pick_eff:
                    pick, pick_eff = i, key
        if pick is None:
            break
        at[pick] += 1
        plan = env.make([h[k][2] for h, k in zip(hulls, at)], mode, la, budget)
        if plan.peak_bytes < smallest.peak_bytes:
            smallest = plan
    if plan.fits:
        # Undo what the budget allows back, the costliest first.
        improved = True
        while improved:
            improved = False
            order = sorted(range(n), key=lambda i: -(hulls[i][at[i]][1] - hulls[i][at[i] - 1][1]) if at[i] else 0)
            for i in order:
                if not at[i]:
                    continue
                at[i] -= 1
                trial = env.make([h[k][2] for h, k in zip(hulls, at)], mode, la, budget)
                if trial.fits and trial.predicted_ms <= plan.predicted_ms:
                    plan, improved = trial, True
                else:
                    at[i] += 1
        best_fit = plan
    # the smallest peak this cap reaches: every layer at its option of most bytes
    most = env.make([max(h, key=lambda o: o[0])[2] for h in hulls], mode, la, budget)
    if most.peak_bytes < smallest.peak_bytes:
        smallest = most
    return best_fit, smallest


def search(costs, budget, static_bytes=0, d2h_gbps=1.0, h2d_gbps=None, margin=0.9, granularity=1,
           strategies=(("pingpong", 1),), remap_ms=REMAP_MS, recompute=True, caps=24, map_ahead=1, step_bytes=0,
           pages=False, persistent=False, contention=None):
    """The fastest plan whose predicted peak is within ``budget`` bytes, over
    ``strategies`` ((mode, look-ahead) pairs); :class:`BudgetError` with the
    smallest budget that would fit when none does. ``recompute=False``: no
    layer is recomputed unless it is marked. ``contention``: as
    :func:`evaluate`'s."""
    h2d_gbps = h2d_gbps or d2h_gbps
    _check_inputs(costs, static_bytes, d2h_gbps, h2d_gbps, margin, step_bytes)
    if not strategies:
        raise InvalidBudget("no strategy to plan with")
    for mode, la in strategies:
        if mode not in ("pingpong", "remap", "none") or not isinstance(la, int) or la < 1:
            raise InvalidBudget("strategy (%r, %r): mode 'pingpong', 'remap' or 'none' (nothing moves), look-ahead "
                                "1 or more" % (mode, la))
    if not recompute:
        costs = [c if c.recompute is True else c.but(recompute=False) for c in costs]
    env = _Env(costs, static_bytes, d2h_gbps, h2d_gbps, margin, granularity, remap_ms, map_ahead, step_bytes, pages,
               persistent, contention_pair(contention))
    movable = sorted({s for i, c in enumerate(costs[:-1]) for s in _level_bytes(c)})
    if len(movable) > caps:     # quantiles of the candidate group sizes, the largest kept
        movable = sorted({movable[int(k * (len(movable) - 1) / (caps - 1))] for k in range(caps)})
    best, smallest, per = None, None, {}
    for mode, la in strategies:
        for cap in [0] + (movable if mode != "none" else []):
            fit, small = _search(env, mode, la, cap, budget)
            if smallest is None or small.peak_bytes < smallest.peak_bytes:
                smallest = small
            if fit is not None:
                # ties: what moves and is recomputed least (the prediction
                # counts hidden copies as free, the device does not quite)
                key = _rank(fit)
                if (mode, la) not in per or key < per[(mode, la)][0]:
                    per[(mode, la)] = (key, fit)
                if best is None or key < _rank(best):
                    best = fit
    keep = env.make([("recompute", []) if c.recompute is True else ("keep", []) for c in costs], "none", 1).peak_bytes
    if best is None:
        mib = float(1 << 20)
        raise BudgetError("no plan fits a memory budget of %.0f MiB (%d bytes): the smallest the planner can fit is "
                          "%.0f MiB (%d bytes: static %.0f MiB + %s); give at least that, or %s"
                          % (budget / mib, budget, smallest.peak_bytes / mib, smallest.peak_bytes,
                             smallest.static_bytes / mib,
                             "; ".join("%d %s" % (v, k) for k, v in smallest.counts().items() if v),
                             "allow recomputation" if not recompute else
                             "lower the static memory (parameters, optimizer states, other tensors)"),
                          budget, smallest.peak_bytes, keep=keep)
    best, smallest = _fill_banks(env, best), _fill_banks(env, smallest)
    # the range of budgets these measurements plan in (what a caller chooses a budget from)
    best.smallest_bytes, best.keep_bytes = smallest.peak_bytes, keep
    best.alternatives = [(m, la, p.predicted_ms, p.peak_bytes) for (m, la), (_, p) in sorted(per.items())
                         if (m, la) != (best.mode, best.lookahead)]
    return best


def _fill_banks(env, p):
    """Ping-pong: libvmmrt keeps the last two layers that move in their banks,
    copied never (vmmrt_group_stays(3)), and its two banks take the largest
    group anyway: each of the last two layers moves what fits in one, for no
    time, in place of resident bytes. Kept only where the plan's peak does
    not grow (a layer that then moves all it saves takes its static inputs
    along, which may make the banks larger) and its time does not either."""
    if p.mode != "pingpong":
        return p
    bank = max((c.moved for c in p.layers), default=0)
    if not bank:
        return p
    choices = [(c.action, c.chosen) for c in p.layers]
    changed = False
    for i in range(max(0, len(p.layers) - 2), len(p.layers)):
        c, cost = p.layers[i], env.costs[i]
        if c.action not in ("keep", "offload") or cost.recompute is True:
            continue
        idx = select.grow(cost.sizes, c.chosen, bank)
        if idx is not None:
            choices[i] = ("offload", idx)
            changed = True
    if not changed:
        return p
    q = env.make(choices, p.mode, p.lookahead, p.budget)
    if q.peak_bytes > p.peak_bytes or q.predicted_ms > p.predicted_ms + 1e-9:
        return p
    return q


def _rank(p):
    return (round(p.predicted_ms, 6), sum(c.moved for c in p.layers), p.counts()["recompute"], p.peak_bytes)


def _level_bytes(c):
    order = sorted(c.sizes, reverse=True)
    acc, out = 0, []
    for s in order:
        acc += s
        out.append(acc)
    return out

# SPDX-License-Identifier: LGPL-2.1-or-later
"""--one-time: the device memory a process keeps once a kind of step has
run in it, stage by stage, driver-level.

The front charges every point with what the points before it left in the
process (its "before its build" line): on the launch-bound layers, 80 MiB
after the first torch graphs and 30 more after vmmrt none's first point,
paid once per process and never given back. This run puts a number on each
source in one fresh process: the model, one eager step, then each of torch's
graphed callables, a libvmmrt runtime opened and closed with nothing in it,
and vmmrt none, twice (a second build shows what the first left for good
against what every build costs). Per stage: what its build took, what its
steps added, and what is left once it is torn down and PyTorch's caches are
emptied (bench.frontrun.fresh, as between the front's points).
"""
import torch

import vmmrt
from vmmrt.torch import memory
from vmmrt.torch.bench import frontrun, loops, modes, shapes

MiB = float(1 << 20)


class Stage:
    """One stage: ``build()`` returns what ``step(built)`` runs and
    ``teardown(built)`` undoes; ``steps`` of them run between."""

    def __init__(self, label, build, step=None, teardown=None, steps=0):
        self.label, self.build, self.step, self.teardown, self.steps = label, build, step, teardown, steps


def measure(stages, used, settle, say=None):
    """Run ``stages`` in order; ``used()``: the device's used bytes now;
    ``settle()``: the work done and the caches emptied; ``say(text)``, if
    given, is told each stage as it starts (a fault names its stage). Returns
    one row per stage: its bytes at build, over its steps, and left after its
    teardown, each against the reading before it; and the running total left."""
    rows = []
    settle()
    start = used()
    for i, st in enumerate(stages):
        if say is not None:
            say("[%d/%d] %s: started" % (i + 1, len(stages), st.label))
        settle()
        before = used()
        built = st.build()
        settle()
        at_build = used()
        for _ in range(st.steps):
            st.step(built)
        settle()
        stepped = used()
        if st.teardown is not None:
            st.teardown(built)
        del built
        settle()
        after = used()
        rows.append({"stage": st.label, "build": at_build - before, "steps": stepped - at_build,
                     "left": after - before, "left_total": after - start})
    return rows


def lines(rows):
    out = ["  %-32s %10s %10s %10s %12s" % ("stage", "build MiB", "steps MiB", "left MiB", "left in all")]
    for r in rows:
        out.append("  %-32s %10.0f %10.0f %10.0f %12.0f" % (
            r["stage"], r["build"] / MiB, r["steps"] / MiB, r["left"] / MiB, r["left_total"] / MiB))
    return out


def run(args, spec, dev, dtype):
    """The stages on ``spec``'s layers (CUDA only), printed; returns the rows."""
    loop = loops.Loop(args.loops[0], args.microbatches)
    made = {}           # the model stage's layers, input dims, inputs and output gradients

    def build_model():
        made["layers"], made["dims"] = shapes.build(spec, dev, dtype, args.attention)
        g = torch.Generator(device="cpu").manual_seed(7)
        made["xs"] = [torch.randn(*made["dims"], generator=g).to(dev, dtype).requires_grad_()
                      for _ in range(args.microbatches)]
        made["gys"] = [torch.randn(*made["dims"], generator=g).to(dev, dtype) for _ in range(args.microbatches)]

    def sample():
        return torch.randn(*made["dims"], device=dev, dtype=dtype, requires_grad=True)

    def eager_step(_):
        frontrun.warm(made["layers"], made["xs"][0], made["gys"][0], args.optimizer, args.attention, dev)

    def graphed(name):
        return (lambda: modes.build(name, made["layers"], sample, args),
                lambda b: loop.step(b.run, b.opt, made["xs"], made["gys"]),
                lambda b: modes.teardown(b, made["layers"], inputs=made["xs"]))

    def runtime():
        return vmmrt.Runtime({"backend": "cuda"})

    steps = max(3, modes.warmup_steps(args, True) + 1)
    stages = [Stage("the model and its inputs", build_model),
              Stage("one eager step (twice)", lambda: None, eager_step, None, 2),
              Stage("torch graphs", *graphed("graph"), steps),
              Stage("libvmmrt runtime, empty", runtime, None, lambda rt: rt.close()),
              Stage("vmmrt none", *graphed("none"), steps),
              Stage("vmmrt none, again", *graphed("none"), steps)]

    def settle():
        torch.cuda.synchronize()
        frontrun.fresh(True)

    rows = measure(stages, lambda: memory.driver_used(dev), settle, lambda text: print(text, flush=True))
    print("one-time memory, %s, %s loop, AdamW %s (driver-level, cuMemGetInfo; left: after the stage's teardown "
          "and PyTorch's caches emptied):" % (spec.name, loop.name, args.optimizer), flush=True)
    for line in lines(rows):
        print(line, flush=True)
    return {"shape": spec.name, "loop": loop.name, "rows": rows}

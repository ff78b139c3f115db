# SPDX-License-Identifier: LGPL-2.1-or-later
"""The two training loops people write, as the benchmark runs them.

A step is what a user's step costs: the gradients zeroed, K microbatches'
forward and backward (their gradients accumulate into ``.grad``), then the
optimizer's step:

set_to_none   ``opt.zero_grad(set_to_none=True)``: no ``.grad`` exists until
              the first backward of the step makes it (PyTorch 2's default)
persistent    ``opt.zero_grad(set_to_none=False)``: each ``.grad`` is one
              tensor kept across steps and zeroed in place (the loop of
              frameworks that keep gradients in fixed buffers)

The loops differ in what they hold between forward and backward and in what
torch.cuda.make_graphed_callables gets right: its backward hands autograd a
static gradient buffer, which AccumulateGrad keeps as ``.grad`` when there
was none, and the next replay rewrites that buffer before AccumulateGrad
adds it in again. So once a ``.grad`` outlives a step (persistent) or a
microbatch (K > 1), graph-only's gradients would be wrong (doubled, in the
persistent loop with one microbatch). In the persistent loop torch's
graphed callables get what a framework keeping gradients in fixed buffers
has anyway, every ``.grad`` made before the first backward
(:meth:`Loop.made_first`), so that AccumulateGrad adds into it; with K > 1
microbatches in the set_to_none loop they stay wrong, said in the point.
The gradients are checked against eager wherever graph-only's could be
wrong (:func:`reference`).
"""
import threading
import time

import torch

LOOPS = ("set_to_none", "persistent")
OPTIMIZERS = ("foreach", "fused")


def optimizer(params, kind="foreach"):
    """The optimizer of every mode: AdamW, as real training runs it, so that
    its two states per parameter are in the memory measured; ``kind``
    foreach (multi-tensor kernels; a temporary the size of the parameters
    at its step) or fused (one fused kernel per group; CUDA only)."""
    if kind not in OPTIMIZERS:
        raise ValueError("optimizer %r is not one of %s" % (kind, ", ".join(OPTIMIZERS)))
    if kind == "fused":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def optimizer_memory(params, kind="foreach"):
    """(reserve, step): what :func:`optimizer`'s AdamW adds to a step, as a
    plan is told it (vmmrt.torch.Budget(reserve=, step=), check_plan):
    its two states per parameter, kept, and foreach's temporary (the
    square root of the second moments, 1x the parameters) made and freed
    within its step; fused makes none."""
    pb = sum(p.numel() * p.element_size() for p in params)
    return 2 * pb, pb if kind == "foreach" else 0


def warm_process(layers, x, gy, kind="foreach"):
    """One eager training step of ``layers`` on ``x`` (output gradient
    ``gy``) with an AdamW of ``kind`` at learning rate 0 (its kernels run,
    the weights stay as they were), everything it made dropped after: what
    a process loads once and keeps (the kernels CUDA loads lazily, the
    libraries' handles), loaded before any option's peak is measured, so
    that the first option does not carry it in its own peak and the later
    ones as memory held before their build. The caller empties the caches
    and reads what stayed."""
    if kind not in OPTIMIZERS:
        raise ValueError("optimizer %r is not one of %s" % (kind, ", ".join(OPTIMIZERS)))
    params = [p for m in layers for p in m.parameters() if p.requires_grad]
    x = x.detach().requires_grad_()
    y = x
    for m in layers:
        y = m(y)
    y.backward(gy)
    del y
    opt = torch.optim.AdamW(params, lr=0.0, **{kind: True})
    opt.step()
    for p in params:
        p.grad = None
    del opt, x


def reference(loop, microbatches):
    """The mode whose gradients are right in this loop: graph-only where its
    .grad never outlives the microbatch that made it, eager otherwise."""
    return "graph" if loop == "set_to_none" and microbatches == 1 else "eager"


def made_first(tensors):
    """A zero ``.grad`` for each of ``tensors`` that wants one and has none."""
    for t in tensors:
        if t.requires_grad and t.grad is None:
            t.grad = torch.zeros_like(t)


class Loop:
    """One training loop: ``name`` (one of LOOPS) and its microbatches."""

    def __init__(self, name, microbatches=1, grads_first=False):
        if name not in LOOPS:
            raise ValueError("loop %r is not one of %s" % (name, ", ".join(LOOPS)))
        if microbatches < 1:
            raise ValueError("microbatches must be at least 1")
        self.name = name
        self.microbatches = microbatches
        if grads_first and name != "persistent":
            raise ValueError("grads_first: only the persistent loop keeps a .grad to make first, not %r" % name)
        self.reference = reference(name, microbatches)
        self.grads_first = bool(grads_first)

    def made_first(self):
        """This loop for torch's graphed callables: in the persistent loop,
        each missing ``.grad`` made (zeros) at the zeroing, before the first
        backward (see the module's words); the same loop otherwise."""
        return Loop(self.name, self.microbatches, grads_first=True) if self.name == "persistent" else self

    def zero(self, opt, xs):
        """The loop's zeroing of every gradient: the parameters' through the
        optimizer, and the inputs' (leaves here, as an embedding's output
        would not be) alike."""
        if self.name == "set_to_none":
            opt.zero_grad(set_to_none=True)
            for x in xs:
                x.grad = None
        else:
            opt.zero_grad(set_to_none=False)
            if self.grads_first:
                made_first([p for g in opt.param_groups for p in g["params"]] + list(xs))
            for x in xs:
                if x.grad is not None:
                    x.grad.zero_()

    def step(self, run, opt, xs, gys, marks=None, between=None, launch=None):
        """One optimizer step: zero, then forward and backward of each
        microbatch (xs[k], gys[k]), then opt.step().

        ``marks``: four callables (or None) called before zeroing, after it,
        after the last backward and after the optimizer's step (CUDA events'
        record, for the time of each part). ``between``: called after the
        last microbatch's forward, before its backward (the memory reading
        between forward and backward). ``launch``: a :class:`LaunchClock`
        that adds up the CPU time of the threads calling the layers."""
        if marks:
            marks[0]()
        self.zero(opt, xs)
        if marks:
            marks[1]()
        last = len(xs) - 1
        for k, (x, gy) in enumerate(zip(xs, gys)):
            y = launch.forward(run, x) if launch is not None else run(x)
            if between is not None and k == last:
                between()
            if launch is not None:
                launch.backward(y, gy)
            else:
                y.backward(gy)
            del y
        if marks:
            marks[2]()
        opt.step()
        if marks:
            marks[3]()

    def describe(self, opt_kind):
        z = "opt.zero_grad(set_to_none=%s)" % (self.name == "set_to_none")
        return "%s loop: %s, %d microbatch%s, AdamW %s" % (self.name, z, self.microbatches,
                                                          "" if self.microbatches == 1 else "es", opt_kind)


def _thread_cpu_ns(ident):
    """CPU time of another thread of this process (threading.get_ident())."""
    return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))


class LaunchClock:
    """The CPU time of the threads that call the layers over one step, in ns:
    ``fwd_ns`` around each forward call of the layers, ``bwd_ns`` around each
    backward, and how many of each (``forwards``, ``backwards``; of the
    backwards, ``elsewhere`` ran on another thread than the caller's).

    The forward runs on the calling thread. The backward runs there on the
    CPU, but on CUDA autograd runs the layers' backwards on its device
    thread while the caller waits: a hook on the output, called by whichever
    thread starts the backward, reads that thread's clock, which is read
    again when backward() returns; the caller's own time around the call
    (waiting, the engine's bookkeeping) is added. ``clock`` reads the calling
    thread's CPU clock (time.thread_time_ns; a test injects its own),
    ``clock_of(ident)`` another thread's on the same clock (by default that
    of the thread; ``clock`` itself when only ``clock`` is given)."""

    def __init__(self, clock=None, clock_of=None):
        if clock_of is None:
            clock_of = _thread_cpu_ns if clock is None else (lambda _ident: clock())
        self.clock, self.clock_of = clock or time.thread_time_ns, clock_of
        self.fwd_ns = self.bwd_ns = 0
        self.forwards = self.backwards = self.elsewhere = 0

    def forward(self, run, x):
        t0 = self.clock()
        y = run(x)
        self.fwd_ns += self.clock() - t0
        self.forwards += 1
        return y

    def backward(self, y, gy):
        me = threading.get_ident()
        first = {}

        def hook(_grad):
            if not first:
                first["ident"], first["t0"] = threading.get_ident(), self.clock()

        if y.requires_grad:
            y.register_hook(hook)
        t0 = self.clock()
        y.backward(gy)
        self.bwd_ns += self.clock() - t0
        if first and first["ident"] != me:
            self.bwd_ns += self.clock_of(first["ident"]) - first["t0"]
            self.elsewhere += 1
        self.backwards += 1

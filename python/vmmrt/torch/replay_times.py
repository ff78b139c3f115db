# SPDX-License-Identifier: LGPL-2.1-or-later
"""The layers' forward and backward times as CUDA graphs replay them, for
the planners (``offload="auto"``, ``memory_budget=``).

The warm-up passes time each layer eagerly, under discovery's hooks. On
small layers that is several times what their graphs take (launch-bound
layers, hidden 1024 and seq 1024 on the H200: eager 3.2-5.1x torch graphs'
step time), and a plan made from those times counts on compute the graphs
do not spend: the copies it expects to hide behind the next layer do not
(``offload="auto"`` moved 93.8 % of the saved bytes there and ran 3.67x
torch graphs' time). So before planning, each callable is captured once for
timing alone (its forward, then its gradients, into a pool of their own),
replayed, and dropped, and the planners read those times.

Nothing of it stays: the graphs and their pool go before the allocation,
and the module's buffers and the CUDA generator's state are put back as
they were (a replay updates running statistics and draws random numbers).
A callable that cannot be captured this way keeps its warm-up times; the
log and ``LayerOffload.times_from`` say which.

The copies' bandwidth is measured the same way: a layer's D2H runs while
the next layer's forward does, its H2D while a backward does, and they
share the device's memory bandwidth. So with each layer's graphs a pinned
copy is timed alone and then while the graph replays; the planners take
the least bandwidth any layer's compute left the copies
(``Offload.copy_gbps``), so that a copy the plan expects to hide does.
Sharing goes both ways: the compute is slower while a copy runs. The same
replays are timed without the copy too, and what the copy added to them,
per millisecond of copy, is its cost even where it hides
(``Offload.copy_contention``: the most any layer lost, each way). On the
H100, `offload="auto"` ran 0.7-4.6 % of a copy's time slower than mode
none where its copies hid (six shapes, 2026-12-05); on the H200 about 1 %.
"""
import logging
import math

import torch

from vmmrt.torch import _compat

log = logging.getLogger("vmmrt.torch")

REPEATS = 3
COPY_BYTES = 64 << 20


def measure(runners, time_one):
    """Each runner's layer (``runners`` in forward order) given the times of
    ``time_one(runner) -> (fwd_ms, bwd_ms, d2h_gbps, h2d_gbps[, d2h_slow,
    h2d_slow])`` in place of its warm-up's (kept as ``LayerOffload.warmup_ms``);
    runners of one callable (a pipeline's microbatches) are timed once. A
    runner whose timing raises keeps its warm-up times. Returns ({layer
    name: why} for those, (D2H, H2D) GB/s: the least of each the layers
    measured under their graphs, (D2H, H2D) contention: the most compute
    time a layer lost per millisecond of copy each way (:func:`copy_under`);
    None where none was measured)."""
    done, failed = {}, {}
    d2h = h2d = None
    slow = [None, None]
    for r in runners:
        lay = r.layer
        got = done.get(r.callable_index)
        if got is None:
            try:
                got = time_one(r)
            except Exception as e:  # noqa: B902 - the plan is made from the warm-up's times instead
                why = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:200])
                failed[lay.name] = why
                lay.times_from = "warm-up (its graphs could not be timed: %s)" % why
                log.warning("vmmrt: layer %r: the planner uses its warm-up times, not its graphs': %s", lay.name, why)
                continue
            done[r.callable_index] = got
            if got[2] is not None:
                d2h = got[2] if d2h is None else min(d2h, got[2])
            if got[3] is not None:
                h2d = got[3] if h2d is None else min(h2d, got[3])
            for k, v in enumerate(got[4:6]):
                if v is not None:
                    slow[k] = v if slow[k] is None else max(slow[k], v)
        lay.warmup_ms = (min(lay.fwd_ms) if lay.fwd_ms else None, min(lay.bwd_ms) if lay.bwd_ms else None)
        lay.fwd_ms, lay.bwd_ms = [float(got[0])], [float(got[1])]
        lay.times_from = "graphs"
    return failed, (d2h, h2d), tuple(slow)


def timer(off, stream, allow_unused_input):
    """The ``time_one`` of :func:`measure` for ``off``'s device: graphs
    replayed on ``stream`` on CUDA; None on the host backend, whose layers
    are not graphed (the warm-up's times stand)."""
    if off.device_type != "cuda":
        return None
    return lambda r: time_graphs(r, stream, allow_unused_input)


def time_graphs(r, stream, allow_unused_input, repeats=REPEATS):
    """(forward ms, backward ms, D2H GB/s, H2D GB/s, D2H contention, H2D
    contention) of runner ``r``: its forward and its gradients captured on
    ``stream`` into a pool of their own, replayed ``repeats`` times after
    one untimed pair, the least of each; then a pinned copy each way while
    the forward (D2H) or the backward (H2D) replays (:func:`copy_under`);
    the module's buffers and the CUDA generator's state as they were
    before."""
    bufs = [b.detach().clone() for b in r.buffers]
    rng = torch.cuda.get_rng_state()
    pool = torch.cuda.graph_pool_handle()
    gf, gb = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    for g in r.generators:
        gf.register_generator_state(g)
        gb.register_generator_state(g)
    try:
        with torch.cuda.stream(stream), torch.enable_grad():
            outputs = _capture(gf, pool, stream, lambda: r.split_outputs(r.call(r.sample)))
            need = tuple(o for o in outputs if o.requires_grad)
            wrt = tuple(i for i in r.surface if i.requires_grad)
            gos = tuple(torch.empty_like(o) for o in need)
            if need and wrt:
                _capture(gb, pool, stream, lambda: torch.autograd.grad(
                    need, wrt, gos, only_inputs=True, allow_unused=allow_unused_input))
            else:
                gb = None
            fwd, bwd = [], []
            for k in range(repeats + 1):
                e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                e[0].record(stream)
                gf.replay()
                e[1].record(stream)
                if gb is not None:
                    gb.replay()
                e[2].record(stream)
                e[2].synchronize()
                if k:
                    fwd.append(e[0].elapsed_time(e[1]))
                    bwd.append(e[1].elapsed_time(e[2]))
            d2h, d2h_slow = copy_under(gf.replay, min(fwd), stream, True)
            h2d, h2d_slow = copy_under(gb.replay, min(bwd), stream, False) if gb is not None else (None, None)
        return min(fwd), min(bwd), d2h, h2d, d2h_slow, h2d_slow
    finally:
        outputs = need = wrt = gos = None
        gf = gb = None
        torch.cuda.synchronize()
        with torch.no_grad():
            for b, saved in zip(r.buffers, bufs):
                b.copy_(saved)
        torch.cuda.set_rng_state(rng)
        # the pool's segments, held by nothing now, back to the driver before
        # the next layer's (each capture has a pool of its own)
        from vmmrt.torch import empty_cache
        empty_cache()


def copy_under(replay, replay_ms, stream, d2h, nbytes=COPY_BYTES, repeats=REPEATS):
    """(GB/s, contention) of pinned copies of ``nbytes`` (device to host if
    ``d2h``) on a stream of their own while ``replay()`` runs on ``stream``:
    the copy alone first; then replays that last twice as long at least,
    and as many copies back to back as fill about 70 % of them (all within
    the replays while the compute leaves them 70 % of their speed or more).
    Returns the
    copies' bandwidth beside the replays, and the milliseconds the replays
    lost per millisecond of copying against the same replays alone (0 or
    more), the least of ``repeats`` each: the copies span most of the
    replays, so what they cost the compute is most of the difference read
    (one copy beside a long layer would read noise). (None, None) when the
    copy cannot be made (no pinned memory): the idle bandwidth stands, and
    no contention is known."""
    try:
        dev = torch.empty(nbytes, dtype=torch.uint8, device=stream.device)
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:
        return None, None
    cs = torch.cuda.Stream(device=stream.device)

    def timed(n, k):
        """(ms of ``k`` copies or None, ms of ``n`` replays or None): the
        replays enqueued first, the copies beside them."""
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        if n:
            with torch.cuda.stream(stream):
                ev[2].record(stream)
                for _ in range(n):
                    replay()
                ev[3].record(stream)
        if k:
            with torch.cuda.stream(cs):
                ev[0].record(cs)
                for _ in range(k):
                    if d2h:
                        host.copy_(dev, non_blocking=True)
                    else:
                        dev.copy_(host, non_blocking=True)
                ev[1].record(cs)
        torch.cuda.synchronize(stream.device)
        return (ev[0].elapsed_time(ev[1]) if k else None, ev[2].elapsed_time(ev[3]) if n else None)

    alone, _ = timed(0, 1)
    replay_ms = max(replay_ms, 1e-3)
    n = min(1000, max(2, math.ceil(2 * alone / replay_ms)))
    k = min(1000, max(1, int(0.7 * n * replay_ms / max(alone, 1e-6))))
    compute = min(timed(n, 0)[1] for _ in range(repeats))
    both = [timed(n, k) for _ in range(repeats)]
    under = min(c for c, _ in both)
    lost = min(t for _, t in both) - compute
    return k * nbytes / (max(under, 1e-6) * 1e-3) / 1e9, max(0.0, lost) / max(under, 1e-6)


def _capture(graph, pool, stream, body):
    """body() captured into ``graph`` ("thread_local": the library's driver
    workers may map while it runs; _compat.capture ends what a failed
    capture leaves under way)."""
    return _compat.capture(graph, pool, stream, "thread_local", body)

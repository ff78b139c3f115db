# SPDX-License-Identifier: LGPL-2.1-or-later
"""What the graphs' pool holds at its busiest moment, against eager
checkpointing's backward, block by block:

    python3 -m vmmrt.torch.bench.poolcheck --shape llama --layers 2

Every layer recomputed, vmmrt.torch's pool is the largest part of the
step's memory plan, and it is where the smallest plan misses checkpointing
every layer's peak (README, thirtieth session: on 8 Llama-3-8B layers 1272
MiB at the first layer's backward, where eager checkpointing's whole
working set beside the gradients is ~960). This builds the first
``--layers`` layers of a shape (:mod:`shapes`), runs their forward under
torch.utils.checkpoint and then the backward with PyTorch's memory history
on, then makes them vmmrt.torch's graphed callables recomputing every
layer (``mode="auto"``, the memory plan on), whose captures record the
same history (vmmrt.torch.graphpool). For each it prints the most bytes
alive at once (:func:`alive_at_peak`, from poolplan.block_lives: the
caching allocator's own rule for when a block's bytes may be handed out
again) and the blocks alive then by size (:func:`by_size`): a size the
pool holds more of than eager's backward is what to look for. ``--plan
none`` builds mode none instead (nothing moves: the pool that keeps mode
none above eager's peak on the launch-bound layers), against eager's
backward without checkpointing. Each capture's frees
are counted by how they went (:func:`frees`), and ``--trace`` keeps the
captures' history to read offline. CUDA only.
"""
import argparse
import collections
import json
import sys

from vmmrt.torch import graphpool, poolplan
from vmmrt.torch.memplan import _use

MiB = float(1 << 20)


def alive_at_peak(events, lo=0, hi=1 << 62):
    """(bytes, event index, blocks) at the moment the most bytes of the
    blocks in [lo, hi) are alive at once (poolplan.peak_moment over
    poolplan.block_lives' (address, bytes, birth, death): one never freed
    alive from its birth on; one freed with its alloc unseen from the
    latest death over its bytes before, or the history's start)."""
    return _peak(poolplan.block_lives(events, lo, hi))


def _peak(blocks):
    """(bytes, event, blocks alive then) of ``blocks`` at their busiest moment."""
    top, at = poolplan.peak_moment(blocks)
    if at is None:
        return 0, None, []
    return top, at, [b for b in blocks if max(b[2], 0) <= at and (b[3] is poolplan.FOREVER or b[3] > at)]


def capture_peaks(events, marks, lo=0, hi=1 << 62):
    """[(use, bytes, blocks, carried, reach)] per marked capture
    (graphpool.GraphPool.marks: (use, first event, end event)): the most
    bytes of the blocks in [lo, hi) alive at once within its span, a block
    born before it counted from its start and one freed after it alive to
    its end; the blocks alive then; how many of those bytes were born
    before the span (what the captures before it left in the pool); and
    the end of the highest block it was handed, from ``lo`` (with the
    bytes alive at its busiest, the holes best fit left in its range)."""
    blocks = poolplan.block_lives(events, lo, hi)
    out = []
    for use, b, e in marks:
        win = [(a, n, max(bb, b, 0), poolplan.FOREVER if d is poolplan.FOREVER or d >= e else d, bb < b)
               for a, n, bb, d in blocks if bb < e and (d is poolplan.FOREVER or d > b)]
        top, at, live = _peak([w[:4] for w in win])
        carried = 0 if at is None else sum(n for _, n, _, d, before in win
                                           if before and (d is poolplan.FOREVER or d > at))
        out.append((use, top, live, carried, graphpool.high_water(events[b:e], lo, hi)))
    return out


FREE_KINDS = ("at once", "later in the capture", "after the capture", "never", "given again unfreed",
              "its alloc unseen")


def frees(events, marks, lo=0, hi=1 << 62):
    """How the frees of each marked capture (graphpool.GraphPool.marks: (use,
    first event, end event)) in [lo, hi) went by the memory history
    (poolplan.block_history): a block no other stream used completes its
    free at once (its ``free_completed`` right after its
    ``free_requested``) and the capture may hand its bytes out again; one
    recorded on another stream (a ``record_stream``, or autograd's for a
    node whose stream is not the capture's) completes only once PyTorch can
    query that stream's events, which it cannot during a capture: "after
    the capture", or "never" by the history's end, its bytes not reused
    meanwhile, and the pool grows by them. "given again unfreed": an
    ``alloc`` at an address whose block the history saw no free of (what
    poolplan.block_lives keeps in use for good), counted where it came;
    "its alloc unseen": a free of a block whose alloc the history lacks
    (poolplan.block_lives bears it from the latest death of a block over its
    bytes before its free; 40 of them, all at one address, in the H100 run
    of the thirty-fourth session, were the graphs' pool's doing: it dropped
    every alloc at its plug's address from the history it kept, mended in
    the thirty-fifth). Returns
    [(use, {kind: [count, bytes]}, streams)] per mark, streams the
    allocating streams seen in its span."""
    spans = list(marks)

    def mark_of(k):
        return next((j for j, (_, b, e) in enumerate(spans) if b <= k < e), None)
    out = [(use, {kind: [0, 0] for kind in FREE_KINDS}, set()) for use, _, _ in spans]

    def count(k, kind, n):
        j = mark_of(k)
        if j is not None:
            out[j][1][kind][0] += 1
            out[j][1][kind][1] += n
    for _, n, b, r, d, again in poolplan.block_history(events, lo, hi):
        if again is not None:
            count(again, "given again unfreed", n)
        elif r is None:
            continue
        elif b < 0:
            count(r, "its alloc unseen", n)
        elif d is poolplan.FOREVER:
            count(r, "never", n)
        else:
            j = mark_of(r)
            count(r, "at once" if d == r + 1 else
                  "later in the capture" if j is not None and d < spans[j][2] else "after the capture", n)
    for k, e in enumerate(events):
        if e.get("action") == "alloc" and lo <= e.get("addr", 0) < hi:
            j = mark_of(k)
            if j is not None:
                out[j][2].add(e.get("stream"))
    return out


def describe_frees(counts):
    """One line of :func:`frees`' counts of a capture."""
    parts = ["%d %s (%.0f MiB)" % (c, kind, n / MiB) for kind, (c, n) in counts.items() if c]
    return ", ".join(parts) or "no frees"


def gradients_in(blocks, ptrs):
    """The bytes of ``blocks`` ((address, bytes, birth, death)) that are the
    storages at ``ptrs`` (the parameters' gradients after the backward):
    at eager's busiest moment, the gradients made by then, which the pool
    of a recomputing backward's capture does not hold (they lie in the
    gradients' slot), beside the working set it is to be held against."""
    ptrs = set(ptrs)
    return sum(n for a, n, _, _ in blocks if a in ptrs)


def by_size(blocks):
    """[(bytes of one block, how many)] of ``blocks``, the most bytes in all first."""
    c = collections.Counter(n for _, n, _, _ in blocks)
    return sorted(c.items(), key=lambda kv: (-kv[0] * kv[1], -kv[0]))


def _where(events, blocks):
    """{block bytes: the first vmmrt or bench frame of the first such block's birth}."""
    out = {}
    for _, n, b, _ in blocks:
        if n in out or b < 0:
            continue
        fr = [f for f in events[b].get("frames", ()) if "vmmrt" in f.get("filename", "")]
        out[n] = "%s:%s" % (fr[0]["filename"].rsplit("/", 1)[-1], fr[0]["line"]) if fr else ""
    return out


def describe(top, blocks, events=None, most=12):
    where = _where(events, blocks) if events is not None else {}
    parts = ["%d x %.1f%s" % (k, n / MiB, " (%s)" % where[n] if where.get(n) else "") for n, k in by_size(blocks)[:most]]
    return "%.0f MiB alive at once: %s" % (top / MiB, ", ".join(parts) or "nothing")


def _parser():
    p = argparse.ArgumentParser(prog="python3 -m vmmrt.torch.bench.poolcheck", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama")
    p.add_argument("--layers", type=int, default=2, help="the shape's first N layers")
    p.add_argument("--attention", choices=("auto", "flash", "math"), default="auto")
    p.add_argument("--plan", choices=("recompute", "none"), default="recompute",
                   help="vmmrt's plan: every layer recomputed (the smallest), or mode none (nothing moves)")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--read", metavar="PATH", help="no GPU: the report of a history --trace kept")
    p.add_argument("--trace", metavar="PATH", help="the captures' memory history (action, address, size, stream "
                   "of every event; the pool's range and the captures' spans) as gzipped JSON, to read offline")
    return p


def report(evs, lo, hi, marks, label, out):
    """Print what the captures' history ``evs`` says of the pool [lo, hi)
    (each capture's span in ``marks``), the numbers into ``out``: the most
    bytes alive at once and in which capture, each capture's own busiest
    moment, and how each capture's frees went."""
    top, at, live = alive_at_peak(evs, lo, hi)
    inside = [u for u, b, e in marks if at is not None and b <= at < e]
    out["pool_bytes"], out["pool_alive"], out["pool_by_size"] = hi - lo, top, by_size(live)
    out["pool_busiest_capture"] = [list(u) for u in inside]
    reached = out["pool_reached"] = graphpool.high_water(evs, lo, hi)
    print("%s: the graphs' pool %.0f MiB (its blocks reached %.0f); %s; in the capture of %s" % (
        label, (hi - lo) / MiB, reached / MiB, describe(top, live, evs),
        ", ".join(_use(u) for u in inside) or ("? (no capture spans it)" if marks else
                                              "? (one pool for every capture: the captures' spans are marked "
                                              "per use only)")), flush=True)
    caps = capture_peaks(evs, marks, lo, hi)
    out["pool_captures"] = [[list(u), n, by_size(live), carried, reach] for u, n, live, carried, reach in caps]
    for u, n, live, carried, reach in caps:
        print("  %s: %s; of them %.0f MiB left by the captures before; its blocks reached %.0f" % (
            _use(u), describe(n, live, evs, most=8), carried / MiB, reach / MiB), flush=True)
    fr = frees(evs, marks, lo, hi)
    out["pool_frees"] = [[list(u), c, sorted(str(x) for x in st)] for u, c, st in fr]
    if fr:
        print("  the captures' frees (at once: the capture may hand the bytes out again; after the capture or "
              "never: recorded on another stream, not reused in it):", flush=True)
    for u, c, st in fr:
        print("  %s: %s; allocating on %d stream%s" % (_use(u), describe_frees(c), len(st),
                                                        "" if len(st) == 1 else "s"), flush=True)


def read_trace(path):
    """(events, lo, hi, marks) of a history ``--trace`` kept."""
    import gzip
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    fields = doc["fields"]
    lo, n = doc["pool"]
    return ([dict(zip(fields, row)) for row in doc["events"]], lo, lo + n,
            [(tuple(u), b, e) for u, b, e in doc["marks"]])


def dump_trace(path, events, lo, nbytes, marks):
    """Keep the captures' history (what :func:`read_trace` reads): the pool
    [lo, lo + nbytes), the captures' spans, and each event's action,
    address, size and stream, gzipped JSON."""
    import gzip
    keep = ("action", "addr", "size", "stream")
    doc = {"pool": [lo, nbytes], "marks": [[list(u), b, e] for u, b, e in marks],
           "events": [[e.get(k) for k in keep] for e in events], "fields": list(keep)}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    print("the captures' memory history: %s (%d events)" % (path, len(events)), flush=True)


def main(argv=None):
    a = _parser().parse_args(argv)
    if a.read:
        out = {}
        try:
            evs, lo, hi, marks = read_trace(a.read)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit("--read %s: not a history --trace kept (%s: %s)" % (a.read, type(e).__name__, e))
        report(evs, lo, hi, marks, "the history in %s" % a.read, out)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    import torch
    from vmmrt.torch.bench import llama, loops, shapes
    if a.shape not in shapes.SHAPES:
        raise SystemExit("unknown shape %r; shapes are %s" % (a.shape, ", ".join(shapes.SHAPES)))
    s0 = shapes.SHAPES[a.shape]
    if not 1 <= a.layers <= s0.layers:
        raise SystemExit("--layers %d: the %s shape has 1 to %d" % (a.layers, a.shape, s0.layers))
    if not torch.cuda.is_available():
        print("poolcheck: CUDA only (the graphs' pool and PyTorch's memory history are the device's)")
        return 77
    import vmmrt.torch as vt
    sh = s0.shape
    spec = shapes.Spec(s0.name, s0.kind, a.layers, s0.title, sh.hidden, sh.ffn, sh.heads, sh.kv_heads, sh.seq,
                       sh.batch)
    dev, dt = torch.device("cuda"), torch.bfloat16
    layers, dims = shapes.build(spec, dev, dt, a.attention)
    params = [p for m in layers for p in m.parameters() if p.requires_grad]
    x = torch.randn(*dims, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn_like(x)
    out = {"shape": a.shape, "layers": a.layers}
    with llama.attention_backend(a.attention):
        # (against mode none, eager without checkpointing: what its backward
        # allocates beside the activations it keeps)
        ckpt = a.plan == "recompute"

        def forward():
            h = x
            for m in layers:
                h = torch.utils.checkpoint.checkpoint(m, h, use_reentrant=False) if ckpt else m(h)
            return h
        for _ in range(2):
            forward().backward(gy)
            for p in params:
                p.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        h = forward()
        torch.cuda.synchronize()
        a0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
        try:
            h.backward(gy)
            del h
            torch.cuda.synchronize()
            events = torch.cuda.memory._snapshot()["device_traces"][dev.index or 0]
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        grads = sum(p.numel() * p.element_size() for p in params)
        out["eager_backward_peak"] = torch.cuda.max_memory_allocated() - a0
        top, _, live = alive_at_peak(events)
        made = gradients_in(live, [p.grad.untyped_storage().data_ptr() for p in params if p.grad is not None])
        out["eager_alive"], out["eager_by_size"], out["eager_alive_grads"] = top, by_size(live), made
        print("eager%s, %d %s layers, backward: %.0f MiB allocated at most over the forward's end "
              "(the gradients %.0f in all); its history: %s, %.0f of them the gradients made by then" % (
                  " checkpointing" if ckpt else "", a.layers, a.shape, out["eager_backward_peak"] / MiB,
                  grads / MiB, describe(top, live, events), made / MiB),
              flush=True)
        for p in params:
            p.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        reserve, step = loops.optimizer_memory(params, "fused")
        samples = tuple((torch.randn(*dims, device=dev, dtype=dt, requires_grad=True),) for _ in layers)
        graphpool.DIAGNOSE = True       # each block's frames, each capture's span: this build only
        try:
            if a.plan == "none":
                mods = vt.make_graphed_callables(tuple(layers), samples, mode="none")
            else:
                mods = vt.make_graphed_callables(tuple(layers), samples, mode="auto", memory_budget=vt.Budget(
                    layers=["recompute"] * a.layers, reserve=reserve, step=step, loop="set_to_none"))
        finally:
            graphpool.DIAGNOSE = False
        off = vt.offload_of(mods[0])
        label = "recompute all" if a.plan == "recompute" else "none"
        try:
            gp = off.graph_pool
            evs = getattr(gp, "_events_kept", None) if gp is not None else None
            if not evs:
                print("vmmrt %s: no memory history of the captures (%s)" % (label,
                      getattr(gp, "place_why_not", None) or "no graphs' pool of the library's"), flush=True)
            else:
                lo = gp.backing.address
                # (mode none has no budget plan: the planner's mode is the budget's alone)
                mode = off.plan.mode if off.plan is not None else "no budget plan"
                report(evs, lo, lo + gp.backing.nbytes, gp.marks, "vmmrt %s (%s)" % (label, mode), out)
                if a.trace:
                    dump_trace(a.trace, evs, lo, gp.backing.nbytes, gp.marks)
            print(off.describe(), flush=True)
        finally:
            off.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

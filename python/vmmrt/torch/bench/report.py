# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark's output: a progress line per mode, the table, the targets of
issue #12 (met, or missed by how much), and the JSON document."""
import json
import math

MiB = float(1 << 20)


def _f(v, fmt):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt % v


def _mib(v):
    return None if v is None else v / MiB


def _round_up(n, g):
    return (n + g - 1) // g * g


def copy_ms(row, d2h_gbps, h2d_gbps):
    """The copies alone: D2H bytes at the D2H bandwidth plus H2D bytes at the
    H2D bandwidth (they run in different passes)."""
    if not row.get("d2h_bytes_per_step"):
        return None
    return row["d2h_bytes_per_step"] / (d2h_gbps * 1e6) + row["h2d_bytes_per_step"] / (h2d_gbps * 1e6)


def copy_bound_ms(row, d2h_gbps, h2d_gbps):
    """The step cannot be faster than its copies plus what no copy can
    overlap: the first layer's forward (nothing to copy before it ends) and
    its backward (nothing left to restore while it runs), taken as one
    layer's share of graph-only's step (row["head_tail_ms"]; the layers are
    alike)."""
    c = copy_ms(row, d2h_gbps, h2d_gbps)
    return None if c is None else c + row.get("head_tail_ms", 0.0)


def progress(i, n, row, ref_ms):
    mem = row.get("memory")
    parts = ["[%d/%d] %-14s build %5.1f s  step %8.2f ms" % (i, n, row["mode"], row["build_s"], row["step_ms"])]
    if ref_ms:
        parts.append("(x%.3f graph)" % (row["step_ms"] / ref_ms))
    if mem:
        parts.append("used %.0f MiB" % (mem["used"] / MiB))
    if row.get("d2h_bytes_per_step"):
        parts.append("moved %.0f MiB/step" % (row["d2h_bytes_per_step"] / MiB))
    if row.get("grad_bitwise") is not None:
        parts.append("grads %s" % ("bitwise" if row["grad_bitwise"] else "%.3g ulp" % row["grad_max_ulp"]))
    return "  ".join(parts)


def table(rows, title, d2h_gbps, h2d_gbps):
    ref = next((r for r in rows if r["mode"] == "graph"), None)
    ref_ms = ref["step_ms"] if ref else None
    head = ("%-14s %9s %8s %9s %8s %8s %8s %8s %9s %8s %8s %9s %7s  %s"
            % ("mode", "step ms", "vs graph", "used MiB", "pool", "alloc", "vmmrt", "other", "moved MiB",
               "D2H GB/s", "H2D GB/s", "bound ms", "/bound", "grads vs graph"))
    lines = [title, head, "-" * len(head)]
    for r in rows:
        m = r.get("memory") or {}
        bound = copy_bound_ms(r, d2h_gbps, h2d_gbps) if d2h_gbps else None
        g = r.get("grad_bitwise")
        grads = "-" if g is None else ("bitwise" if g else "%.3g ulp%s" % (
            r["grad_max_ulp"], " (within spread)" if r.get("grad_within_spread") else ""))
        lines.append("%-14s %9.2f %8s %9s %8s %8s %8s %8s %9s %8s %8s %9s %7s  %s" % (
            r["mode"], r["step_ms"], _f(r["step_ms"] / ref_ms if ref_ms else None, "%.3f"),
            _f(_mib(m.get("used")), "%.0f"), _f(_mib(m.get("graph_pool")), "%.0f"),
            _f(_mib(m.get("allocator")), "%.0f"), _f(_mib(m.get("vmmrt")), "%.0f"), _f(_mib(m.get("other")), "%.0f"),
            _f(_mib(r.get("d2h_bytes_per_step")), "%.0f"),
            _f(r.get("d2h_gbps"), "%.1f"), _f(r.get("h2d_gbps"), "%.1f"), _f(bound, "%.2f"),
            _f(r["step_ms"] / bound if bound else None, "%.3f"), grads))
    return "\n".join(lines)


def _target(name, ok, detail):
    return {"target": name, "met": bool(ok), "detail": detail}


def targets(rows, d2h_gbps, h2d_gbps, full_offload, seq=None):
    """Issue #12's targets, each met or missed by how much, from one table's rows."""
    by = {r["mode"]: r for r in rows}
    out = []
    g = by.get("graph")
    if g and "save_on_cpu" in by and "pingpong" in by and full_offload:
        x = by["save_on_cpu"]["step_ms"] / by["pingpong"]["step_ms"]
        out.append(_target("full offload (pingpong) >= 2.2x faster than save_on_cpu", x >= 2.2,
                           "%.3fx (%.1f vs %.1f ms)" % (x, by["pingpong"]["step_ms"], by["save_on_cpu"]["step_ms"])))
    for m in ("pingpong", "remap"):
        r = by.get(m)
        if r and full_offload:
            b = copy_bound_ms(r, d2h_gbps, h2d_gbps)
            if b:
                c = copy_ms(r, d2h_gbps, h2d_gbps)
                out.append(_target("full offload (%s) within 5%% of the copy bound" % m, r["step_ms"] <= 1.05 * b,
                                   "%.2f ms vs bound %.2f ms (x%.3f; the copies alone %.2f ms, x%.3f)"
                                   % (r["step_ms"], b, r["step_ms"] / b, c, r["step_ms"] / c)))
    if g and "planner" in by:
        x = by["planner"]["step_ms"] / g["step_ms"]
        out.append(_target("planner <= 1% slower than graph-only", x <= 1.01,
                           "x%.4f (%.2f vs %.2f ms)" % (x, by["planner"]["step_ms"], g["step_ms"])))
    # Memory: the floor is what "none" holds outside its slots (the pool with no
    # saved tensor in it, the allocator, the context); each strategy should hold
    # the floor plus its own slots.
    none = by.get("none")
    if none and none.get("memory"):
        floor = none["memory"]["used"] - none["memory"]["vmmrt"]
        for m in ("pingpong", "remap", "pingpong-acc"):
            r = by.get(m)
            if not (r and r.get("memory") and r.get("group_bytes")):
                continue
            gran = r["granularity"]
            big = sorted((_round_up(b, gran) for b in r["group_bytes"] if b), reverse=True)
            own = 2 * big[0] if r["vmmrt_mode"] == "pingpong" else sum(big[:r["lookahead"] + 1])
            used = r["memory"]["used"]
            want = floor + own
            out.append(_target("%s: used between fwd and bwd <= floor + its slots (+2%%)" % m, used <= 1.02 * want,
                               "%.0f MiB vs %.0f floor + %.0f slots = %.0f (x%.3f)"
                               % (used / MiB, floor / MiB, own / MiB, want / MiB, used / want)))
    if g and g.get("memory"):
        gu = g["memory"]["used"]
        # ("none" keeps every slot resident: the baseline machinery, not an offload.)
        for m in ("pingpong", "remap", "planner", "pingpong-acc"):
            r = by.get(m)
            if r and r.get("memory"):
                u = r["memory"]["used"]
                out.append(_target("%s: used <= graph-only + 1%%" % m, u <= 1.01 * gu,
                                   "%.0f vs %.0f MiB (x%.3f)" % (u / MiB, gu / MiB, u / gu)))
        for m in ("pingpong", "remap"):
            r = by.get(m)
            if r and r.get("memory") and full_offload and seq and seq >= 8192:
                u = r["memory"]["used"]
                out.append(_target("%s: full offload at seq %d uses <= 0.7x graph-only" % (m, seq), u <= 0.7 * gu,
                                   "%.0f vs %.0f MiB (x%.3f)" % (u / MiB, gu / MiB, u / gu)))
    for m, r in by.items():
        if r.get("grad_bitwise") is not None and m not in ("eager", "save_on_cpu", "eager-pingpong",
                                                           "eager-remap", "graph"):
            ok = r["grad_bitwise"] or r.get("grad_within_spread")
            out.append(_target("%s: gradients as graph-only's" % m, ok,
                               "bitwise" if r["grad_bitwise"] else "%.3g ulp (graph-only spread %.3g ulp)"
                               % (r["grad_max_ulp"], r.get("spread", float("nan")))))
    return out


def print_targets(ts, title):
    lines = [title]
    for t in ts:
        lines.append("  [%s] %s: %s" % ("met" if t["met"] else "MISSED", t["target"], t["detail"]))
    return "\n".join(lines)


def dump(path, doc):
    def clean(o):
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items() if k != "grads"}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return None
        return o
    with open(path, "w") as f:
        json.dump(clean(doc), f, indent=1)

# SPDX-License-Identifier: LGPL-2.1-or-later
"""The benchmark's output: a progress line per mode, a table per loop, the
targets for the whole step and for offload (met, or missed by how much), and the JSON
document."""
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
    overlap (row["head_tail_ms"]): in each microbatch the first layer's
    forward (nothing to copy before it ends) and its backward (nothing left
    to restore while it runs), taken as one layer's share of graph-only's
    forwards and backwards (the layers are alike), and the zeroing and the
    optimizer's step, graph-only's. None without graph-only in the run: the
    copies alone are no bound (on the CPU they are a small part of a step)."""
    c = copy_ms(row, d2h_gbps, h2d_gbps)
    return None if c is None or "head_tail_ms" not in row else c + row["head_tail_ms"]


def two_banks(row):
    """Ping-pong's two banks: twice the largest group, rounded up to the
    mapping granularity (None without the numbers)."""
    sizes = [b for b in row.get("group_bytes") or () if b]
    if not sizes or not row.get("granularity"):
        return None
    return 2 * _round_up(max(sizes), row["granularity"])


def peak(row):
    """The whole step's peak of driver-level used memory, in bytes (None: not sampled)."""
    p = row.get("peak")
    return p.get("peak") if p else None


def used(row):
    """Driver-level used memory between forward and backward, in bytes (None: not read)."""
    m = row.get("memory")
    return m.get("used") if m else None


def _ratio(a, b):
    return a / b if a is not None and b else None


def ratios(rows):
    """Each row's step time and memory against graph-only's and eager's of the
    same loop, stored in the rows (row["vs_graph"], row["vs_eager"])."""
    by = {r["mode"]: r for r in rows if "error" not in r}
    for r in rows:
        if "error" in r:
            continue
        for key, name in (("vs_graph", "graph"), ("vs_eager", "eager")):
            b = by.get(name)
            if b is None:
                continue
            r[key] = {"step": _ratio(r.get("step_ms"), b.get("step_ms")), "peak": _ratio(peak(r), peak(b)),
                      "used": _ratio(used(r), used(b))}


def _grads_text(r):
    if r.get("grad_reference"):
        s = r.get("spread")
        return "reference" + ("" if s is None else ", bitwise run to run" if not s else
                              ", run to run %.3g ulp" % s)
    g = r.get("grad_bitwise")
    if g is None:
        return "-"
    if g:
        return "bitwise"
    text = "%.3g ulp" % r["grad_max_ulp"]
    if r.get("grad_within_spread"):
        text += " (within spread)"
    q = r.get("grad_norm_ratio")
    if q is not None and abs(q - 1.0) > 1e-3:
        text += " norm x%.3f" % q
    return text


def progress(i, n, row, ref_ms):
    mem = row.get("memory")
    parts = ["[%d/%d] %-14s build %5.1f s  step %8.2f ms" % (i, n, row["mode"], row["build_s"], row["step_ms"])]
    if ref_ms:
        parts.append("(x%.3f graph)" % (row["step_ms"] / ref_ms))
    if peak(row) is not None:
        parts.append("peak %.0f MiB (%d samples, %.1f kHz)" % (peak(row) / MiB, row["peak"]["samples"],
                                                                (row["peak"]["rate_hz"] or 0) / 1e3))
    if mem:
        parts.append("used %.0f MiB between fwd and bwd" % (mem["used"] / MiB))
    if row.get("d2h_bytes_per_step"):
        parts.append("moved %.0f MiB/step" % (row["d2h_bytes_per_step"] / MiB))
    if row.get("launch_us_per_layer_step") is not None:
        parts.append("launch %.1f us/layer/step" % row["launch_us_per_layer_step"])
    if row.get("driver_calls_per_step") is not None:
        parts.append("%.1f driver calls/step" % row["driver_calls_per_step"])
    om = row.get("optimizer_memory") or {}
    if om.get("routed_steps"):
        parts.append("optimizer in the pages: %.0f MiB lent, %.0f used, %.0f from the driver, %.0f us hooks%s"
                     % (om["lent_bytes"] / MiB, om["peak_bytes"] / MiB, om["fallback_bytes"] / MiB, om["hook_us"],
                        ", %d steps left a tensor" % om["survivors"] if om.get("survivors") else ""))
    if row.get("grad_bitwise") is not None or row.get("grad_reference"):
        parts.append("grads %s" % _grads_text(row))
    return "  ".join(parts)


_COLUMNS = (("mode", "%-14s", 14), ("step ms", "%9s", 9), ("vs graph", "%8s", 8), ("opt ms", "%7s", 7),
            ("peak MiB", "%9s", 9), ("vs graph", "%8s", 8), ("smp kHz", "%7s", 7),
            ("used MiB", "%9s", 9), ("vs graph", "%8s", 8), ("pool", "%7s", 7), ("free", "%6s", 6), ("alloc", "%7s", 7),
            ("vmmrt", "%7s", 7), ("slots", "%7s", 7), ("other", "%6s", 6), ("moved MiB", "%9s", 9),
            ("D2H GB/s", "%8s", 8), ("H2D GB/s", "%8s", 8), ("bound ms", "%9s", 9), ("/bound", "%7s", 7),
            ("fwd us/L", "%8s", 8), ("bwd us/L", "%8s", 8), ("drv/step", "%8s", 8))


def table(rows, title, d2h_gbps, h2d_gbps, ref_name=None):
    """One loop's table: a row per mode; "peak" is the sampled whole step,
    "used" and its parts the reading between forward and backward ("free":
    of the graph pools' bytes, the blocks no tensor holds); "fwd
    us/L" and "bwd us/L" the launch thread's CPU time per layer per forward
    and backward call, "drv/step" the driver's VMM calls per step. A column
    no row has a figure for (graph-only's ratios where it did not run, memory
    on the CPU) is left out."""
    body = []
    for r in rows:
        m = r.get("memory") or {}
        vg = r.get("vs_graph") or {}
        bound = copy_bound_ms(r, d2h_gbps, h2d_gbps) if d2h_gbps else None
        rate = (r.get("peak") or {}).get("rate_hz")
        cells = (r["mode"], _f(r["step_ms"], "%.2f"), _f(vg.get("step"), "%.3f"), _f(r.get("opt_ms"), "%.2f"),
                 _f(_mib(peak(r)), "%.0f"), _f(vg.get("peak"), "%.3f"), _f(rate / 1e3 if rate else None, "%.1f"),
                 _f(_mib(m.get("used")), "%.0f"), _f(vg.get("used"), "%.3f"), _f(_mib(m.get("graph_pool")), "%.0f"),
                 _f(_mib(m.get("graph_pool_free")), "%.0f"), _f(_mib(m.get("allocator")), "%.0f"), _f(_mib(m.get("vmmrt")), "%.0f"),
                 _f(_mib(m.get("slots")), "%.0f"), _f(_mib(m.get("other")), "%.0f"),
                 _f(_mib(r.get("d2h_bytes_per_step")), "%.0f"), _f(r.get("d2h_gbps"), "%.1f"),
                 _f(r.get("h2d_gbps"), "%.1f"), _f(bound, "%.2f"), _f(r["step_ms"] / bound if bound else None, "%.3f"),
                 _f(r.get("launch_fwd_us_per_layer"), "%.1f"), _f(r.get("launch_bwd_us_per_layer"), "%.1f"),
                 _f(r.get("driver_calls_per_step"), "%.1f"))
        body.append((cells, _grads_text(r)))
    keep = [k for k in range(len(_COLUMNS)) if k < 2 or any(cells[k] != "-" for cells, _ in body)]
    head = " ".join(_COLUMNS[k][1] % _COLUMNS[k][0] for k in keep) + "  grads vs %s" % (ref_name or "-")
    lines = [title, head, "-" * len(head)]
    for cells, grads in body:
        lines.append(" ".join(_COLUMNS[k][1] % cells[k] for k in keep) + "  " + grads)
    sampled = [r for r in rows if r.get("peak")]
    if sampled:
        slow = min(sampled, key=lambda r: r["peak"]["rate_hz"] or 0)
        gap = max(sampled, key=lambda r: r["peak"]["max_gap_s"])
        lines.append("peak: driver-level used memory (cuMemGetInfo) sampled every %.0f us asked over one whole step "
                     "apart from the timed ones; got %.1f kHz at the slowest (%s), longest gap %.2f ms (%s)"
                     % (sampled[0]["peak"]["interval_s"] * 1e6, (slow["peak"]["rate_hz"] or 0) / 1e3, slow["mode"],
                        gap["peak"]["max_gap_s"] * 1e3, gap["mode"]))
    return "\n".join(lines)


# The groups of targets: for the whole step (time with the optimizer, the
# whole step's peak), for offload itself, for the budget planner.
STEP, OFFLOAD, PLANNER = "whole step", "offload", "budget planner"


def _target(name, ok, detail, group=OFFLOAD):
    return {"group": group, "target": name, "met": bool(ok), "detail": detail}


def _info(name, detail, group=STEP):
    """A figure worth seeing, with no threshold to meet."""
    return {"group": group, "target": name, "met": None, "detail": detail}


def targets(rows, d2h_gbps, h2d_gbps, full_offload, seq=None, ref_name="graph"):
    """The targets for offload, each met or missed by how much, from one table's rows
    (its gradients are checked against ``ref_name``, the loop's reference)."""
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
            out.append(_target("%s: gradients as %s's" % (m, ref_name), ok,
                               "bitwise" if r["grad_bitwise"] else "%.3g ulp (%s's spread %.3g ulp)"
                               % (r["grad_max_ulp"], ref_name, r.get("spread", float("nan")))))
    return out


def targets_20(rows, d2h_gbps, h2d_gbps, full_offload, loop, ref_name):
    """The targets for the whole step, from one loop's rows: what users judge, the whole
    step's peak of driver-level memory and the step time with the optimizer."""
    by = {r["mode"]: r for r in rows if "error" not in r}
    out = []
    g, e, soc = by.get("graph"), by.get("eager"), by.get("save_on_cpu")

    def mem_target(name, r, b, limit, what):
        a, bb = peak(r), (peak(b) if b else None)
        if a is not None and bb:
            out.append(_target(name, a <= limit * bb, "%.0f vs %.0f MiB %s (x%.4f)"
                               % (a / MiB, bb / MiB, what, a / bb), STEP))

    none = by.get("none")
    if none and g:
        x = none["step_ms"] / g["step_ms"]
        out.append(_target("none: step time <= 1.005x graph-only", x <= 1.005,
                           "x%.4f (%.2f vs %.2f ms)" % (x, none["step_ms"], g["step_ms"]), STEP))
        mem_target("none: whole-step peak <= 1.00x graph-only", none, g, 1.0, "graph-only")
    pp = by.get("pingpong")
    if pp and full_offload:
        banks = two_banks(pp)
        if peak(pp) is not None and soc and peak(soc) is not None and banks:
            want = peak(soc) + banks
            out.append(_target("pingpong (full offload): whole-step peak <= 1.05x (save_on_cpu's + two banks)",
                               peak(pp) <= 1.05 * want,
                               "%.0f MiB vs %.0f save_on_cpu + %.0f two banks = %.0f (x%.4f)"
                               % (peak(pp) / MiB, peak(soc) / MiB, banks / MiB, want / MiB, peak(pp) / want), STEP))
        b = copy_bound_ms(pp, d2h_gbps, h2d_gbps) if d2h_gbps else None
        if b:
            out.append(_target("pingpong (full offload): step within 5% of the copy bound", pp["step_ms"] <= 1.05 * b,
                               "%.2f ms vs bound %.2f ms (x%.3f)" % (pp["step_ms"], b, pp["step_ms"] / b), STEP))
    if loop == "set_to_none":
        # What the library maps beside the activations (gradients, resident
        # activations) while no .grad exists: the gradient memory this loop
        # holds between forward and backward.
        for m in VMMRT_ROWS:
            r = by.get(m)
            if r is None or r.get("offload_stats") is None:
                continue
            st = r["offload_stats"]
            if r.get("slot_bytes") is None:
                out.append(_info("%s: libvmmrt slot bytes beyond the activations between forward and backward" % m,
                                 "not reported (Offload.stats() has no slot_bytes)"))
            else:
                peak_slots = st.get("slot_peak_bytes")
                out.append(_info("%s: libvmmrt slot bytes beyond the activations between forward and backward" % m,
                                 "%.0f MiB%s" % (r["slot_bytes"] / MiB, "" if peak_slots is None else
                                                 " (peak %.0f MiB)" % (peak_slots / MiB))))
    pl = by.get("planner")
    if pl and g:
        x = pl["step_ms"] / g["step_ms"]
        out.append(_target("planner: step time <= 1.01x graph-only", x <= 1.01,
                           "x%.4f (%.2f vs %.2f ms)" % (x, pl["step_ms"], g["step_ms"]), STEP))
    if pl:
        mem_target("planner: whole-step peak <= eager's", pl, e, 1.0, "eager")
        mem_target("planner: whole-step peak <= graph-only's", pl, g, 1.0, "graph-only")
    if g and ref_name == "eager" and g.get("grad_bitwise") is not None:
        # Not a target of ours: torch's own graphs, shown where they go wrong.
        q = g.get("grad_norm_ratio")
        out.append(_info("graph-only's gradients against eager's (%s loop)" % loop,
                         "bitwise" if g["grad_bitwise"] else "%.3g ulp%s%s" % (
                             g["grad_max_ulp"], "" if q is None else ", norm x%.4f" % q,
                             "; torch.cuda.make_graphed_callables' .grad aliases its static gradient buffer, "
                             "which the next replay rewrites before AccumulateGrad adds it again"
                             if q is not None and q > 1.5 else "")))
    for m in VMMRT_ROWS:
        r = by.get(m)
        if r is None or r.get("grad_bitwise") is None:
            continue
        if r["grad_bitwise"]:
            detail = "bitwise"
        else:
            detail = "%.3g ulp" % r["grad_max_ulp"]
            if r.get("grad_within_spread"):
                detail += ", within %s's own run-to-run spread (%.3g ulp: non-deterministic kernels; " \
                          "--attention math compares bitwise)" % (ref_name, r["spread"])
            q = r.get("grad_norm_ratio")
            if q is not None and abs(q - 1.0) > 1e-3:
                detail += ", norm x%.4f" % q
        out.append(_target("%s: gradients bitwise as %s's (%s loop)" % (m, ref_name, loop), r["grad_bitwise"],
                           detail, STEP))
    return out


# The rows of libvmmrt's modes, in the order targets list them.
VMMRT_ROWS = ("none", "pingpong", "remap", "planner", "pingpong-acc", "eager-pingpong", "eager-remap")


def print_targets(ts, title):
    lines = [title]
    for t in ts:
        tag = "info" if t["met"] is None else "met" if t["met"] else "MISSED"
        lines.append("  [%s] %s: %s" % (tag, t["target"], t["detail"]))
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


def load_run(argv, prog, key, what):
    """The part ``key`` of a run's --json, for a command that renders it
    again (``prog RUN.json [PLOT.png]``), or None after saying on stderr why
    not (wrong arguments, an unreadable file, no such part: ``what`` names
    the run it wants); the caller then exits with 2."""
    import sys
    if len(argv) not in (1, 2):
        print("usage: python3 -m %s RUN.json [PLOT.png]" % prog, file=sys.stderr)
        return None
    try:
        with open(argv[0]) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print("%s: not a readable JSON file: %s" % (argv[0], e), file=sys.stderr)
        return None
    part = doc.get(key) if isinstance(doc, dict) else None
    if not part:
        print("%s: %s" % (argv[0], what), file=sys.stderr)
    return part or None

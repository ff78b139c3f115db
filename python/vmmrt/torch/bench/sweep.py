# SPDX-License-Identifier: LGPL-2.1-or-later
"""--budget-sweep: the budget planner's prediction checked against the device.

Budgets from graph-only's measured peak (the keep-everything plan's
predicted peak on the CPU) down to the smallest the planner can fit; at each
one the planner's choice (``memory_budget=Budget(b, reserve=AdamW's
states)``) and the hand-made choices predicted to fit (every layer but the
tail offloading a fraction, whole-layer checkpointing of the first k
layers, k checkpointed and the others offloaded), the fastest ``--sweep-hand``
of them by prediction. Each distinct choice is built and measured once
(the set_to_none loop, one microbatch): predicted and measured step time and
peak side by side, the gradients against keeping everything, then per budget
the planner against the best hand-made choice that fits (measured peak
within the budget, 2 % slack), and the Pareto front of everything measured.
A plot too when matplotlib is importable (``--json``'s path, .png).
"""
import time

import torch

import vmmrt.torch as vt
from vmmrt.torch import budget, memory
from vmmrt.torch.bench import llama, loops, modes, report

MiB = float(1 << 20)
SLACK = 1.02
# Under attention other than math (SDPA's flash or efficient kernels) the
# backward is not bitwise deterministic between runs: the gradients are then
# checked by their norm against keeping all, within this (rounding moves the
# ratio by ~1e-6; a dropped or doubled gradient by far more), and a NaN fails.
NORM_TOL = 1e-3


def grads_check(cmp, bitwise):
    """(right, words) of modes.compare's (same, ulps, norm ratio) against the
    reference: bitwise when ``bitwise`` (math attention), otherwise the norm
    ratio within NORM_TOL of 1 and nothing NaN or missing."""
    same, ulps, ratio = cmp
    if same:
        return True, "bitwise"
    if same is None:
        return False, "not compared"
    if bitwise:
        return False, "%.0f ulps off (not bitwise)" % ulps
    if ratio is None or ulps != ulps or ratio != ratio or ulps == float("inf"):
        return False, "a gradient missing or NaN"
    ok = abs(ratio - 1.0) <= NORM_TOL
    return ok, "norm ratio %.6f, %.0f ulps%s" % (ratio, ulps, "" if ok else " (over %g)" % NORM_TOL)


def hand_plans(n):
    """(label, choices) of the hand-made plans over n layers."""
    out = []
    for f in (0.25, 0.5, 1.0):
        out.append(("offload %g" % f, [f] * (n - 1) + ["keep"]))
    for k in sorted({1, max(1, n // 4), max(1, n // 2), max(1, n - 1), n}):
        out.append(("checkpoint %d" % k, ["recompute"] * k + ["keep"] * (n - k)))
    for k in sorted({max(1, n // 4), max(1, n // 2)}):
        if k < n - 1:
            out.append(("checkpoint %d + offload" % k, ["recompute"] * k + [1.0] * (n - k - 1) + ["keep"]))
    return out


def _sig(plan):
    return tuple((c.action, tuple(c.chosen)) for c in plan.layers)


def _inputs(plan):
    """What a budget plan was planned with, to plan again under other budgets
    (the copies' contention too: a hand plan predicted without it would be
    compared with searched plans that charge it)."""
    return dict(static_bytes=plan.static_bytes, d2h_gbps=plan.d2h_gbps, h2d_gbps=plan.h2d_gbps, margin=plan.margin,
                granularity=plan.granularity, remap_ms=plan.remap_ms, map_ahead=plan.map_ahead,
                step_bytes=plan.step_bytes, pages=plan.pages, persistent=getattr(plan, "persistent", False),
                contention=getattr(plan, "contention", None))


class Sweep:
    def __init__(self, args, layers, xs, gys, sample, weights):
        self.args, self.layers, self.xs, self.gys, self.sample, self.weights = args, layers, xs, gys, sample, weights
        self.loop = loops.Loop("set_to_none", 1)
        self.cuda = xs[0].is_cuda
        self.reserve, self.step = loops.optimizer_memory(modes.parameters(layers),
                                                         getattr(args, "optimizer", "foreach"))
        self.ref = None
        self.bitwise = getattr(args, "attention", "math") == "math"
        self.measured = {}          # signature -> row

    def run(self, label, memory_budget):
        """Build the layers with memory_budget, measure, tear down: a row."""
        a, n = self.args, len(self.layers)
        t0 = time.perf_counter()
        seq = list(vt.make_graphed_callables(tuple(self.layers), tuple((self.sample(),) for _ in self.layers),
                                             names=["layer%d" % i for i in range(n)], mode=a.sweep_mode,
                                             lookahead=a.lookahead, margin=a.margin, graphs=self.cuda,
                                             memory_budget=memory_budget))
        off = vt.offload_of(seq[0])
        plan = off.plan

        def run(x):
            for m in seq:
                x = m(x)
            return x
        built = modes.Built(label, run, off, time.perf_counter() - t0,
                            loops.optimizer(modes.parameters(self.layers), getattr(a, "optimizer", "foreach")))
        try:
            row, grads = modes.measure(built, self.layers, self.loop, self.xs, self.gys, a, self.weights)
            if self.ref is None:
                self.ref = modes.host_copies(grads)
                cmp = (True, 0.0, None)
            else:
                cmp = modes.compare(grads, self.ref)
            del grads
        finally:
            modes.teardown(built, self.layers, self.weights, self.xs)
        peak = row["peak"]["peak"] if row.get("peak") else None
        # the planner predicts the layers' part of a step; the rest (zeroing,
        # the optimizer) is what this run measured of it
        outside = row["zero_ms"] + row["opt_ms"]
        out = {"label": label, "counts": plan.counts(), "predicted_layers_ms": plan.predicted_ms,
               "predicted_ms": plan.predicted_ms + outside, "fwd_bwd_ms": row["fwd_bwd_ms"],
               "predicted_peak": plan.peak_bytes, "step_ms": row["step_ms"], "peak": peak,
               "grad_bitwise_vs_keep": bool(cmp[0]), "grad_ulps_vs_keep": cmp[1], "grad_norm_ratio_vs_keep": cmp[2],
               "plan": plan.as_dict(), "summary": plan.summary()}
        out["grads_ok"], out["grads_check"] = grads_check(cmp, self.bitwise)
        self.measured[_sig(plan)] = out
        snap = row.get("memory")
        print("[sweep] %s: predicted %.0f MiB = static %.0f + banks %.0f + working set %.0f + timeline %.0f; "
              "measured peak %s%s" % (label, plan.peak_bytes / MiB, plan.static_bytes / MiB, plan.bank_bytes / MiB,
                                      plan.inflight_bytes / MiB, plan.timeline_bytes / MiB, _peak(peak),
                                      "; between forward and backward: " + memory.describe(snap) if snap else ""),
              flush=True)
        return out, plan

    def measure(self, label, memory_budget, sig):
        if sig in self.measured:
            return self.measured[sig]
        row, _ = self.run(label, memory_budget)
        return row


def run_sweep(args, title, make_layers, shape, dtype):
    dev = torch.device(args.device)
    layers = make_layers()
    n = len(layers)
    weights = modes.Weights(layers)
    g = torch.Generator(device="cpu").manual_seed(7)
    dims = (shape.batch, shape.seq, shape.hidden)
    xs = [torch.randn(*dims, generator=g).to(dev, dtype).requires_grad_()]
    gys = [torch.randn(*dims, generator=g).to(dev, dtype)]

    def sample():
        return torch.randn(*dims, device=dev, dtype=dtype, requires_grad=True)

    sw = Sweep(args, layers, xs, gys, sample, weights)
    doc = {"title": title, "mode": args.sweep_mode, "lookahead": args.lookahead,
           "reserve_what": "AdamW's states, 2x the parameters (its foreach temporary, 1x, as Budget(step=))",
           "grads_check": "bitwise" if sw.bitwise else "norm ratio within %g" % NORM_TOL}
    with llama.attention_backend(args.attention):
        keep, kplan = sw.run("keep all", vt.Budget(layers=["keep"] * n, reserve=sw.reserve, step=sw.step))
        print("[sweep] keep all: predicted %.2f ms %.0f MiB, measured %.2f ms %s" % (
            keep["predicted_ms"], keep["predicted_peak"] / MiB, keep["step_ms"], _peak(keep["peak"])), flush=True)
        costs, inputs = kplan.costs, _inputs(kplan)
        # What the model does not see (the backward's transient gradients, the
        # optimizer's temporaries, allocator slack): the keep-everything run's
        # measured peak over its prediction, added to the reserve of every
        # later run, as a user would measure one step and reserve the rest.
        extra = max(0, keep["peak"] - keep["predicted_peak"]) if keep["peak"] else 0
        sw.reserve += extra
        inputs["static_bytes"] += extra
        doc["calibration_bytes"] = extra
        if extra:
            print("[sweep] keep all measured %.0f MiB over its prediction: reserved for every later run"
                  % (extra / MiB), flush=True)
        # "auto": the planner chooses the strategy; hand-made choices run in ping-pong
        mode = "pingpong" if args.sweep_mode == "auto" else args.sweep_mode
        la = args.lookahead if mode == "remap" else 1       # ping-pong: two banks, one layer ahead
        strategies = budget.auto_strategies() if args.sweep_mode == "auto" else [(mode, la)]
        graph = None
        if sw.cuda:
            built = modes.build("graph", layers, sample, args)
            try:
                row, grads = modes.measure(built, layers, sw.loop, xs, gys, args, weights)
                del grads
            finally:
                modes.teardown(built, layers, weights, xs)
            graph = {"step_ms": row["step_ms"], "peak": row["peak"]["peak"] if row.get("peak") else None}
            print("[sweep] graph-only: %.2f ms %s" % (graph["step_ms"], _peak(graph["peak"])), flush=True)
        try:
            budget.search(costs, 1, strategies=strategies, **inputs)
            smallest = 1
        except budget.BudgetError as e:
            smallest = e.smallest
        top = (graph or {}).get("peak") or keep["predicted_peak"]
        top = max(top, smallest)
        k = max(2, args.sweep_points)
        budgets = [int(top - (top - smallest) * i / (k - 1)) for i in range(k)]
        hands = [(lab, ch, budget.evaluate(costs, ch, mode, la, **inputs)) for lab, ch in hand_plans(n)
                 if mode != "none" or all(c in ("keep", "recompute") for c in ch)]
        doc.update(graph=graph, keep=keep, smallest_bytes=smallest, budgets=budgets,
                   hand_predicted=[{"label": lab, "choices": ch, "predicted_ms": p.predicted_ms,
                                    "predicted_peak": p.peak_bytes} for lab, ch, p in hands])
        points = []
        for i, b in enumerate(budgets):
            pl = budget.search(costs, b, strategies=strategies, **inputs)
            print("[sweep] budget %d/%d: %.0f MiB" % (i + 1, k, b / MiB), flush=True)
            sig, mine = _sig(pl), None
            for _ in range(3):
                try:
                    mine = sw.measure("planner @ %.0f MiB" % (b / MiB), vt.Budget(b, reserve=sw.reserve, step=sw.step), sig)
                    break
                except budget.BudgetError as e:
                    # The build measures its own static memory: should it
                    # have grown since the keep-all run (a new warm-up
                    # stream per build once left 64 MiB of cuBLAS
                    # workspaces each time), the point moves to what fits
                    # in the next build, with some room for it, and says so.
                    planned, b = b, int(e.smallest * 1.01)
                    print("[sweep] budget %.0f MiB: no plan fits in this build (smallest %.0f MiB); trying %.0f MiB"
                          % (planned / MiB, e.smallest / MiB, b / MiB), flush=True)
                    doc.setdefault("moved_budgets", []).append({"planned": planned, "measured_at": b})
                    sig = ("moved", b)
            if mine is None:
                print("[sweep] budget %.0f MiB: nothing fits after three tries; the sweep ends here" % (b / MiB),
                      flush=True)
                break
            fit = sorted((p.predicted_ms, lab, ch, p) for lab, ch, p in hands if p.peak_bytes <= b)
            tried = []
            for _, lab, ch, p in fit[:max(0, args.sweep_hand)]:
                tried.append(sw.measure(lab, vt.Budget(layers=ch, reserve=sw.reserve, step=sw.step), _sig(p)))
            points.append({"budget": b, "planner": mine, "hand": tried})
    doc["points"] = points
    doc["reserve_bytes"] = sw.reserve
    # full offload (every layer but the tail), measured once for the comparison of peaks
    full = dict((lab, (ch, p)) for lab, ch, p in hands).get("offload 1")
    if full is not None:
        with llama.attention_backend(args.attention):
            sw.measure("offload 1", vt.Budget(layers=full[0], reserve=sw.reserve, step=sw.step), _sig(full[1]))
    doc["measured"] = list(sw.measured.values())
    doc["pareto"] = pareto(list(sw.measured.values()))
    doc["targets"] = targets(doc)
    print(table(doc, title), flush=True)
    print(report.print_targets(doc["targets"], "targets of the budget planner:"), flush=True)
    return doc


def targets(doc):
    """The budget planner's targets, met or missed by how much (on the CPU no peak is
    measured: the predicted one stands in, and the times are the host's)."""
    out, worst_t, worst_s, worst_p = [], [], [], []
    for pt in doc["points"]:
        b, m = pt["budget"], pt["planner"]
        best = _best_hand(_hands(doc, pt), b)
        if best:
            worst_t.append((m["step_ms"] / best["step_ms"], b, best["label"]))
        loose = _best_hand(_hands(doc, pt), b, SLACK)
        if loose:
            worst_s.append((m["step_ms"] / loose["step_ms"], b, loose["label"], _peak_of(loose) / b))
        worst_p.append((_peak_of(m) / b, b))
    if worst_t:
        r, b, lab = max(worst_t)
        also = ""
        if worst_s and max(worst_s)[0] > r:
            rs, bs, ls, over = max(worst_s)
            also = ("; against choices up to 2 %% over the budget as well, which the planner may not plan for: "
                    "%.3fx (at %.0f MiB, %s at %.3f of it)" % (rs, bs / MiB, ls, over))
        out.append(report._target("planner within 3 % of the best hand-made choice that fits, at every budget",
                                  r <= 1.03, "worst %.3fx (at %.0f MiB, against %s)%s" % (r, b / MiB, lab, also),
                                  report.PLANNER))
    r, b = max(worst_p)
    out.append(report._target("planner's measured peak within the budget (2 % slack), at every budget", r <= SLACK,
                              "worst %.3f of the budget (at %.0f MiB)%s" % (r, b / MiB, "" if doc["points"][0][
                                  "planner"]["peak"] is not None else "; predicted peaks (no device reading)"),
                              report.PLANNER))
    rows = doc.get("measured", [])
    bad = [r["label"] for r in rows if not r.get("grads_ok", r["grad_bitwise_vs_keep"])]
    if rows:
        out.append(report._target("gradients right in every measured plan (%s against keeping all)"
                                  % doc.get("grads_check", "bitwise"), not bad,
                                  "%d of %d%s" % (len(rows) - len(bad), len(rows),
                                                  "; wrong: " + ", ".join(bad) if bad else ""), report.PLANNER))
    full = [r for r in rows if r["label"] == "offload 1"]
    rec = [p["planner"] for p in doc["points"] if p["planner"]["counts"]["recompute"]]
    if full and rec and full[0]["peak"] is not None and all(r["peak"] is not None for r in rec):
        low = min(r["peak"] for r in rec)
        out.append(report._target("with recomputation, a peak below full offload's", low < full[0]["peak"],
                                  "%.0f MiB against %.0f MiB" % (low / MiB, full[0]["peak"] / MiB), report.PLANNER))
    return out


def _peak(v):
    return "%.0f MiB" % (v / MiB) if v else "-"


def _peak_of(row):
    return row["peak"] if row["peak"] is not None else row["predicted_peak"]


def _fits(row, b, slack=SLACK):
    return _peak_of(row) <= b * slack


def _hands(doc, pt):
    """Every hand-made choice the sweep measured (keeping all included),
    whichever budget it was measured at: each one fits some budgets."""
    rows = [r for r in doc.get("measured", ()) if not r["label"].startswith("planner")]
    return rows or pt["hand"]


def _best_hand(rows, b, slack=1.0):
    """The fastest hand-made choice that fits: its measured peak within the
    budget itself (the planner plans to the budget; SLACK is its prediction's
    tolerance, not room a hand-made choice may use)."""
    ok = [h for h in rows if _fits(h, b, slack)]
    return min(ok, key=lambda h: h["step_ms"]) if ok else None


def pareto(rows):
    """The measured rows no other is both faster and smaller than (peak: the
    measured one, the predicted where none was measured)."""
    def key(r):
        return (r["peak"] if r["peak"] is not None else r["predicted_peak"], r["step_ms"])
    out = []
    for r in sorted(rows, key=key):
        if not out or r["step_ms"] < out[-1]["step_ms"]:
            out.append(r)
    return [{"label": r["label"], "peak": key(r)[0], "step_ms": r["step_ms"], "counts": r["counts"]} for r in out]


def _choice(r):
    c, pl = r["counts"], r["plan"]
    return "%dk/%do/%dr %s%d" % (c["keep"], c["offload"], c["recompute"], pl["mode"][:2], pl["lookahead"])


def _grads_cell(m):
    if "grads_ok" not in m:
        return "bitwise" if m["grad_bitwise_vs_keep"] else "DIFFER"
    if m["grad_bitwise_vs_keep"]:
        return "bitwise"
    r = m.get("grad_norm_ratio_vs_keep")
    word = "%+.1e" % (r - 1.0) if r is not None and r == r else "nan"
    return word if m["grads_ok"] else "DIFFER " + word


def table(doc, title):
    ref = (doc.get("graph") or doc["keep"])["step_ms"]
    check = doc.get("grads_check", "bitwise")
    lines = ["", "budget sweep: %s, %s look-ahead %d, reserve %.0f MiB (%s + %.0f calibrated), smallest plan %.0f MiB; "
             "times against %s (%.2f ms); predicted step: the planner's layers + this run's zeroing and optimizer; "
             "grads against keeping all: %s"
             % (title, doc["mode"], doc["lookahead"], doc["reserve_bytes"] / MiB,
                doc.get("reserve_what", "AdamW's states"), doc["calibration_bytes"] / MiB,
                doc["smallest_bytes"] / MiB,
                "graph-only" if doc.get("graph") else "keeping all", ref,
                check if check == "bitwise" else check + " (the attention's backward is not deterministic; "
                "norm ratio - 1 shown, DIFFER beyond it or NaN; --attention math checks bitwise)"),
             "  %9s | %-16s %9s %9s %9s %9s %-16s | %-22s %9s %9s | %7s %4s" % (
                 "budget", "planner k/o/r", "pred ms", "meas ms", "pred MiB", "meas MiB", "grads",
                 "best hand-made", "meas ms", "meas MiB", "vs hand", "fits")]
    for pt in doc["points"]:
        b, m = pt["budget"], pt["planner"]
        best = _best_hand(_hands(doc, pt), b)
        lines.append("  %9.0f | %-16s %9.2f %9.2f %9.0f %9s %-16s | %-22s %9s %9s | %7s %4s" % (
            b / MiB, _choice(m), m["predicted_ms"], m["step_ms"], m["predicted_peak"] / MiB,
            _peak(m["peak"])[:-4] if m["peak"] else "-", _grads_cell(m),
            best["label"] if best else "(none fits)", "%.2f" % best["step_ms"] if best else "-",
            _peak(best["peak"])[:-4] if best and best["peak"] else "-",
            "%.3fx" % (m["step_ms"] / best["step_ms"]) if best else "-", "yes" if _fits(m, b) else "NO"))
    bad = [r for r in doc.get("measured", []) if not r.get("grads_ok", r["grad_bitwise_vs_keep"])]
    if bad:
        lines.append("  GRADS DIFFER: " + "; ".join("%s (%s)" % (r["label"], r.get("grads_check", "not bitwise"))
                                                     for r in bad))
    lines.append("  Pareto front (measured): " + "; ".join(
        "%s %.0f MiB %.2f ms (%.3fx)" % (p["label"], p["peak"] / MiB, p["step_ms"], p["step_ms"] / ref)
        for p in doc["pareto"]))
    return "\n".join(lines)


def plot(doc, path):
    """A PNG of measured peak against step time (nothing without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in [doc["keep"]] + [p["planner"] for p in doc["points"]] + [h for p in doc["points"]
                                                                               for h in p["hand"]]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        peak = (r["peak"] if r["peak"] is not None else r["predicted_peak"]) / MiB
        planner = r["label"].startswith("planner")
        ax.scatter(peak, r["step_ms"], marker="o" if planner else "x", color="C0" if planner else "C1")
        ax.annotate(r["label"], (peak, r["step_ms"]), fontsize=6)
    ax.set_xlabel("peak device memory (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("memory budget sweep: planner (o) and hand-made (x)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    """``python3 -m vmmrt.torch.bench.sweep RUN.json [PLOT.png]``: the table,
    targets and plot of a sweep's --json again, without a device (the
    figures as measured; the verdicts by this version's rules)."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    sw = report.load_run(argv, "vmmrt.torch.bench.sweep", "sweep",
                         "no budget sweep in it (a --budget-sweep run's --json)")
    if sw is None:
        return 2
    sw["targets"] = targets(sw)
    print(table(sw, sw["title"]))
    print(report.print_targets(sw["targets"], "targets of the budget planner:"))
    if len(argv) == 2:
        print("plot: %s" % (plot(sw, argv[1]) or "none (matplotlib is not importable)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

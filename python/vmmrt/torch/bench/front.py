# SPDX-License-Identifier: LGPL-2.1-or-later
"""The front's arithmetic: points of (step time, peak), the two Pareto
fronts, and for each vmmrt.torch point how it stands against PyTorch's own
options. Plain numbers in, plain numbers out (no device), so that made-up
fronts check every rule (python/tests/test_bench.py).

A point is one option measured in one loop: ``label``, ``family`` ("torch"
or "vmmrt"), ``step_ms`` and ``peak`` (the whole step's driver-level peak
over the process's memory before the model, in bytes). A point that failed,
has no measured peak (the CPU) or whose gradients differ from the loop's
reference takes no part in a front nor in a verdict.

Memory levels: every vmmrt point's measured peak is one level. At the level
of point v, PyTorch's answer is the fastest PyTorch option whose peak is
within v's (peak <= v's); the ratio is v's step time over that one's. Then v
is, at its level:

ahead        faster than every PyTorch option within its peak, and either
             no PyTorch option fits within its peak at all ("only vmmrt
             fits"), or v beats a PyTorch option that holds at least as much
             as v (that option is named): never a claim made by using more
             memory than the option beaten;
dominated    some PyTorch option holds no more and takes no longer (that
             fastest one within its peak does; ties count for PyTorch);
in between   faster than every PyTorch option within its peak, but only by
             holding more than they do, and slower than every PyTorch option
             that holds as much: a point on a gap of PyTorch's measured front,
             not beyond it.

"Faster" means faster by more than ``TIE`` (1 %): step times closer than
that are a tie, and ties count for PyTorch. One run's step times on the
H200 move by about that much between two measurements of the same option
(mode none against torch's graphs: 1.001-1.016x over the sessions), so a
vmmrt point 0.1 % faster than eager while holding GBs more is dominated by
eager, not ahead of anything.

The verdict of a shape: "vmmrt ahead at N of M memory levels; dominated at
K" (and how many were in between).
"""
import math

MiB = float(1 << 20)
TIE = 0.01
AHEAD, ONLY, DOMINATED, BETWEEN = "ahead", "ahead (only vmmrt fits)", "dominated", "in between"
DEFINITION = ("memory levels: each vmmrt point's measured peak; at a level, PyTorch's answer is its fastest option "
              "whose peak is within it. ahead: faster than that answer and, unless no PyTorch option fits, faster "
              "than a PyTorch option holding at least as much; dominated: a PyTorch option holds no more and takes "
              "no longer; in between: faster only by holding more than PyTorch's answer; faster: by more than 1 %, "
              "closer is a tie, and ties count for PyTorch")


def usable(points):
    """The points that count: measured (no error), a finite step time, a
    peak, gradients not found wrong."""
    out = []
    for p in points:
        if p.get("error") or p.get("peak") is None or p.get("grads_ok") is False:
            continue
        t = p.get("step_ms")
        if t is None or not isinstance(t, (int, float)) or math.isnan(t) or math.isinf(t):
            continue
        out.append(p)
    return out


def pareto(points):
    """The usable points no other usable point is both no larger and faster
    than, in increasing peak (and decreasing step time)."""
    out = []
    for p in sorted(usable(points), key=lambda p: (p["peak"], p["step_ms"])):
        if not out or p["step_ms"] < out[-1]["step_ms"]:
            out.append(p)
    return out


def fastest_within(points, peak):
    """The fastest usable point whose peak is within ``peak`` (ties: the
    smaller peak), or None."""
    fit = [p for p in usable(points) if p["peak"] <= peak]
    return min(fit, key=lambda p: (p["step_ms"], p["peak"])) if fit else None


def faster(a, b, tie=TIE):
    """Whether step time ``a`` is faster than ``b`` by more than ``tie``."""
    return a < b * (1.0 - tie)


def judge(v, torch_points, tie=TIE):
    """How vmmrt point ``v`` stands at its level against ``torch_points``:
    {"verdict", "answer" (PyTorch's fastest within v's peak, or None),
    "ratio" (v's time over the answer's), "beats" (a PyTorch option holding
    at least as much as v and slower, when ahead)}. Faster: by more than
    ``tie`` (see :func:`faster`)."""
    ans = fastest_within(torch_points, v["peak"])
    out = {"label": v["label"], "peak": v["peak"], "step_ms": v["step_ms"], "answer": None, "ratio": None,
           "beats": None}
    if ans is None:
        out["verdict"] = ONLY
        return out
    out["answer"], out["ratio"] = ans["label"], v["step_ms"] / ans["step_ms"]
    if not faster(v["step_ms"], ans["step_ms"], tie):
        out["verdict"] = DOMINATED
        return out
    # Faster than all PyTorch does within v's peak; beyond PyTorch's front
    # only if it also beats an option that holds at least as much as it does.
    beaten = [t for t in usable(torch_points) if t["peak"] >= v["peak"] and faster(v["step_ms"], t["step_ms"], tie)]
    if beaten:
        b = min(beaten, key=lambda t: (t["peak"], t["step_ms"]))
        out["verdict"], out["beats"] = AHEAD, b["label"]
    else:
        out["verdict"] = BETWEEN
    return out


def verdict(points, tie=TIE):
    """Every usable vmmrt point judged against the usable PyTorch ones, and
    the counts: {"judged": [...], "levels", "ahead", "only", "dominated",
    "between", "line"}."""
    torch_pts = [p for p in points if p.get("family") == "torch"]
    vm = [p for p in usable(points) if p.get("family") == "vmmrt"]
    judged = [judge(v, torch_pts, tie) for v in sorted(vm, key=lambda p: (p["peak"], p["step_ms"]))]
    n = {k: sum(1 for j in judged if j["verdict"] == k) for k in (AHEAD, ONLY, DOMINATED, BETWEEN)}
    ahead = n[AHEAD] + n[ONLY]
    out = {"judged": judged, "levels": len(judged), "ahead": ahead, "only": n[ONLY], "dominated": n[DOMINATED],
           "between": n[BETWEEN]}
    if not judged:
        out["line"] = "no verdict: no vmmrt point with a measured peak and right gradients"
        if not usable(torch_pts):
            out["line"] = "no verdict: no peak measured (the CPU has no driver-level memory to sample)"
        return out
    out["line"] = "vmmrt ahead at %d of %d memory levels%s; dominated at %d%s" % (
        ahead, len(judged), " (%d where no PyTorch option fits)" % n[ONLY] if n[ONLY] else "", n[DOMINATED],
        "; in between at %d" % n[BETWEEN] if n[BETWEEN] else "")
    return out


def _mib(v):
    return "-" if v is None else "%.0f" % (v / MiB)


def _ms(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else "%.2f" % v


def _num(v, fmt="%.1f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt % v


def table(points, ref_label=None):
    """A line per point: step time and peak, against ``ref_label``'s; the
    launch thread's CPU time per layer per step (forward and backward, us)
    and the driver's VMM calls per step (vmmrt's points)."""
    ref = next((p for p in points if p["label"] == ref_label and not p.get("error")), None)
    on = {id(p) for p in pareto([p for p in points if p.get("family") == "torch"])}
    on |= {id(p) for p in pareto([p for p in points if p.get("family") == "vmmrt"])}
    head = "  %-26s %-6s %9s %8s %9s %8s %5s %8s %8s  %s" % (
        "option", "family", "step ms", "x" + (ref_label or "-")[:7], "peak MiB", "x" + (ref_label or "-")[:7],
        "front", "us/L/stp", "drv/step", "gradients")
    lines = [head, "  " + "-" * (len(head) - 2)]
    for p in points:
        if p.get("error"):
            lines.append("  %-26s %-6s FAILED: %s" % (p["label"], p["family"], p["error"]))
            continue
        rt = p["step_ms"] / ref["step_ms"] if ref and ref.get("step_ms") else None
        rp = p["peak"] / ref["peak"] if ref and ref.get("peak") and p.get("peak") is not None else None
        lines.append("  %-26s %-6s %9s %8s %9s %8s %5s %8s %8s  %s" % (
            p["label"], p["family"], _ms(p["step_ms"]), "-" if rt is None else "%.3f" % rt, _mib(p.get("peak")),
            "-" if rp is None else "%.3f" % rp, "*" if id(p) in on else "", _num(p.get("launch_us_per_layer_step")),
            _num(p.get("driver_calls_per_step")), _grads_words(p))
            + ("  [%s]" % p["note"] if p.get("note") else ""))
    return "\n".join(lines)


def describe_front(points, family):
    f = pareto([p for p in points if p.get("family") == family])
    if not f:
        return "  %s front: none (no usable point with a measured peak)" % family
    return "  %s front: %s" % ("PyTorch" if family == "torch" else "vmmrt", "; ".join(
        "%s %s MiB %s ms" % (p["label"], _mib(p["peak"]), _ms(p["step_ms"])) for p in f))


def describe_judged(v):
    j = v
    head = "  %-26s %6s MiB %9s ms: " % (j["label"], _mib(j["peak"]), _ms(j["step_ms"]))
    if j["answer"] is None:
        return head + "no PyTorch option fits within its peak -> %s" % j["verdict"]
    text = head + "PyTorch's fastest within its peak: %s, x%.3f -> %s" % (j["answer"], j["ratio"], j["verdict"])
    if j["beats"]:
        text += " (faster than %s, which holds at least as much)" % j["beats"]
    return text


def report(points, ref_label, title, notes=()):
    """The text: the table (then ``notes``), both fronts, every vmmrt point
    judged, the verdict line and what it means."""
    v = verdict(points)
    lines = ["", "front: %s" % title, table(points, ref_label)] + ["  " + n for n in notes] + [
        describe_front(points, "torch"), describe_front(points, "vmmrt")]
    if v["judged"]:
        lines.append("  each vmmrt point against PyTorch at its peak:")
        lines += [describe_judged(j) for j in v["judged"]]
    lines.append("  (%s)" % DEFINITION)
    lines.append("verdict (%s): %s" % (title, v["line"]))
    return "\n".join(lines), v


def _draw(ax, points, title):
    for fam, color, marker in (("torch", "C1", "x"), ("vmmrt", "C0", "o")):
        pts = [p for p in usable(points) if p.get("family") == fam]
        for p in pts:
            ax.scatter(p["peak"] / MiB, p["step_ms"], color=color, marker=marker)
            ax.annotate(p["label"], (p["peak"] / MiB, p["step_ms"]), fontsize=6)
        f = pareto(pts)
        if f:
            ax.step([p["peak"] / MiB for p in f], [p["step_ms"] for p in f], where="post", color=color,
                    label="%s front" % ("PyTorch" if fam == "torch" else "vmmrt.torch"))
    ax.set_xlabel("whole-step peak over the memory before the model (MiB)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def plot_all(fronts, path):
    """A PNG of step time against peak with both fronts, a panel per front
    (None without matplotlib or without a measured peak)."""
    fronts = [d for d in fronts if usable(d.get("points", []))]
    if not fronts:
        return None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(len(fronts), 1, figsize=(8, 4.5 * len(fronts)), squeeze=False)
    for ax, d in zip(axes[:, 0], fronts):
        _draw(ax, d["points"], d.get("describe", d.get("title", "")) + " (%s loop)" % d.get("loop", ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _grads_words(p):
    """What the point's gradients were against the reference, in words (a
    run written before the words were kept: from the numbers)."""
    if p.get("grads_text"):
        return p["grads_text"]
    if p.get("grad_bitwise"):
        return "bitwise"
    if p.get("grad_max_ulp") is not None:
        return "%.3g ulp%s" % (p["grad_max_ulp"], "" if p.get("grads_ok", True) else " (wrong)")
    return "-"


def main(argv=None):
    """``python3 -m vmmrt.torch.bench.front RUN.json [PLOT.png]``: the
    fronts, every vmmrt point judged and the verdicts of a --front run's
    JSON again, without a device (the figures as measured, the verdicts by
    this version's rules), and the plot."""
    import sys
    from vmmrt.torch.bench.report import load_run
    argv = sys.argv[1:] if argv is None else argv
    fronts = load_run(argv, "vmmrt.torch.bench.front", "fronts", "no front in it (a --front run's --json)")
    if fronts is None:
        return 2
    for d in fronts:
        if d.get("error"):
            print("\nfront %s: not run: %s" % (d.get("title"), d["error"]))
            continue
        text, _ = report(d["points"], d.get("reference") if d.get("reference") in ("graphs", "eager") else "eager",
                         d.get("title", ""))
        print(text)
    if len(argv) == 2:
        print("plot: %s" % (plot_all(fronts, argv[1]) or "none (matplotlib is not importable, or no peak)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

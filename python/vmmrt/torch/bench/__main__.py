# SPDX-License-Identifier: LGPL-2.1-or-later
"""python3 -m vmmrt.torch.bench: whole-layer CUDA graphs with CPU activation
offload on Llama-style decoder layers, against eager, save_on_cpu and
graph-only, in one run.

Default: 6 Llama-3-8B-shaped layers (hidden 4096, ffn 14336, 32 heads / 8 kv
heads, seq 4096, batch 1, bf16), every mode, then Hugging Face transformers'
LlamaDecoderLayer in the same shape (graph, pingpong, planner) when
transformers is installed. --smoke: a tiny shape that runs in seconds (on the
CPU too, where only the eager modes run, on the host backend).
"""
import argparse
import logging
import platform
import sys
import time

import torch

import vmmrt
from vmmrt.torch import planner
from vmmrt.torch.bench import llama, modes, report

MiB = float(1 << 20)
HF_MODES = ("graph", "pingpong", "planner")


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m vmmrt.torch.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    p.add_argument("--modes", default=None, help="comma-separated, from: %s (default: all that the device runs)"
                   % ",".join(modes.MODES))
    p.add_argument("--layer", choices=("torch", "hf", "both"), default="both",
                   help="the torch-ops layer, transformers' LlamaDecoderLayer (if installed), or both")
    p.add_argument("--hf-modes", default=",".join(HF_MODES), help="modes run with the transformers layer")
    p.add_argument("--fraction", type=float, default=1.0, help="offload fraction of the vmmrt modes (planner: auto)")
    p.add_argument("--lookahead", type=int, default=1)
    p.add_argument("--margin", type=float, default=0.9, help="the planner's safety factor")
    p.add_argument("--attention", choices=("auto", "flash", "math"), default="auto",
                   help="math: sdpa's deterministic math backend (gradients compare bitwise)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps before the timed ones, after building")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="a tiny shape: seconds, not minutes")
    p.add_argument("--json", metavar="PATH", help="write every number as JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.layers, a.seq, a.hidden, a.ffn, a.heads, a.kv_heads = 3, 256, 256, 704, 4, 2
        a.iterations, a.warmup = min(a.iterations, 3), 1
        if a.device == "cpu":
            a.dtype = "fp32"
    cpu_modes = ("eager", "save_on_cpu", "eager-pingpong", "eager-remap")
    if a.modes is None:
        a.modes = list(modes.MODES) if a.device == "cuda" else list(cpu_modes)
    else:
        a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in a.modes:
        if m not in modes.MODES:
            p.error("unknown mode %r; modes are %s" % (m, ", ".join(modes.MODES)))
        if a.device == "cpu" and m not in cpu_modes:
            p.error("mode %r needs CUDA; on the CPU: %s" % (m, ", ".join(cpu_modes)))
    a.hf_modes = [m.strip() for m in a.hf_modes.split(",") if m.strip()]
    return a


def run_set(title, make_layers, args, shape, dtype, bw):
    """Every mode of args.modes on fresh callables over the same layers."""
    dev = torch.device(args.device)
    layers = make_layers()
    g = torch.Generator(device="cpu").manual_seed(7)
    x = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g).to(dev, dtype).requires_grad_()
    gy = torch.randn(shape.batch, shape.seq, shape.hidden, generator=g).to(dev, dtype)

    def sample():
        return torch.randn(shape.batch, shape.seq, shape.hidden, device=dev, dtype=dtype, requires_grad=True)

    order = sorted(args.run_modes, key=lambda m: m != "graph")  # graph-only first: the reference
    ref = spread = None
    rows = {}
    for i, name in enumerate(order, 1):
        built = None
        try:
            with llama.attention_backend(args.attention):
                built = modes.build(name, layers, sample, args)
                row = modes.measure(built, layers, x, gy, args)
                if name == "graph":
                    # graph-only's own run-to-run spread (non-deterministic
                    # kernels such as flash attention's backward): three more runs
                    spread = 0.0
                    for _ in range(3):
                        again = modes.measure(built, layers, x, gy, _one(args))
                        same, d = modes.compare(again["grads"], row["grads"])
                        spread = max(spread, 0.0 if same else d)
                    row["spread"] = spread
        except Exception as e:  # a mode that fails is reported, the others still run
            print("[%d/%d] %-14s FAILED: %s: %s" % (i, len(order), name, type(e).__name__, e), flush=True)
            rows[name] = {"mode": name, "error": "%s: %s" % (type(e).__name__, e), "step_ms": float("nan"),
                          "build_s": 0.0}
            if built is not None:
                try:
                    modes.teardown(built, layers)
                except Exception:
                    pass
            continue
        grads = row.pop("grads")
        if name == "graph" or (ref is None and name == "eager"):
            ref = grads
        else:
            same, diff = modes.compare(grads, ref)
            row["grad_bitwise"], row["grad_max_ulp"] = same, diff
            if spread is not None and diff is not None:
                row["spread"] = spread or 0.0
                row["grad_within_spread"] = bool(same or (spread and diff <= spread))
        rows[name] = row
        print(report.progress(i, len(order), row, rows.get("graph", {}).get("step_ms")), flush=True)
        if row.get("plan_text"):
            print(row["plan_text"], flush=True)
        modes.teardown(built, layers)
    nlayers = len(layers)
    del layers
    graph_ms = rows.get("graph", {}).get("step_ms")
    for r in rows.values():
        if graph_ms and graph_ms == graph_ms:
            r["head_tail_ms"] = graph_ms / nlayers
    ordered = [rows[m] for m in args.run_modes if m in rows]
    ok = [r for r in ordered if "error" not in r]
    print(report.table(ok, title, *bw), flush=True)
    for r in ordered:
        if "error" in r:
            print("  %s: FAILED: %s" % (r["mode"], r["error"]), flush=True)
    ts = report.targets(ok, bw[0], bw[1], args.fraction >= 1.0, shape.seq) if args.device == "cuda" else []
    if ts:
        print(report.print_targets(ts, "targets (issue #12):"), flush=True)
    return {"title": title, "rows": ordered, "targets": ts}


def _one(args):
    class A:
        pass
    a = A()
    a.__dict__.update(vars(args))
    a.iterations, a.warmup = 1, 0
    return a


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shape = llama.Shape(args.hidden, args.ffn, args.heads, args.kv_heads, args.seq, args.batch)
    dev = torch.device(args.device)
    t0 = time.perf_counter()
    probe = 256 << 20 if dev.type == "cuda" else 64 << 20
    bw = planner.measure_bandwidth(dev, probe)
    info = {"torch": torch.__version__, "python": platform.python_version(), "vmmrt": vmmrt.version_string(),
            "device": torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu"}
    print("vmmrt.torch.bench: %d layers, %s, %s, attention %s, on %s (torch %s, libvmmrt %s)"
          % (args.layers, shape.as_dict(), args.dtype, args.attention, info["device"], info["torch"],
             info["vmmrt"]), flush=True)
    print("libvmmrt's copies (a slot and pinned host memory, %d MiB): D2H %.1f GB/s, H2D %.1f GB/s"
          % (probe >> 20, bw[0], bw[1]), flush=True)
    doc = {"config": dict(vars(args), shape=shape.as_dict()), "info": info,
           "bandwidth": {"d2h_gbps": bw[0], "h2d_gbps": bw[1]}, "sets": []}
    sets = []
    if args.layer in ("torch", "both"):
        sets.append(("torch-ops Llama layer", lambda: llama.torch_layers(args.layers, shape, dev, dtype,
                                                                            args.attention), args.modes))
    if args.layer in ("hf", "both"):
        try:
            import transformers  # noqa: F401
            hf_modes = [m for m in args.hf_modes if m in args.modes] if args.layer == "both" else args.hf_modes
            sets.append(("transformers LlamaDecoderLayer (%s)" % transformers.__version__,
                         lambda: llama.hf_layers(args.layers, shape, dev, dtype, args.attention), hf_modes))
        except ImportError as e:
            print("transformers layer: skipped (%s)" % e, flush=True)
            doc["hf_skipped"] = str(e)
    for title, make, run_modes in sets:
        args.run_modes = run_modes
        print("\n== %s: %s" % (title, ", ".join(run_modes)), flush=True)
        try:
            doc["sets"].append(run_set(title, make, args, shape, dtype, bw))
        except Exception as e:
            print("%s: FAILED: %s: %s" % (title, type(e).__name__, e), flush=True)
            doc["sets"].append({"title": title, "error": "%s: %s" % (type(e).__name__, e)})
    doc["wall_s"] = time.perf_counter() - t0
    print("\ncommand: python3 -m vmmrt.torch.bench %s   (%.0f s)" % (" ".join(sys.argv[1:] if argv is None else argv),
                                                                      doc["wall_s"]), flush=True)
    if args.json:
        report.dump(args.json, doc)
    failed = any("error" in s or any("error" in r for r in s.get("rows", [])) for s in doc["sets"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

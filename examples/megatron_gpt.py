#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""megatron-core's GPTModel trained with whole-layer CUDA graphs whose saved
activations vmmrt.torch offloads, beside the same model eager, eager with
torch's save_on_cpu, with Megatron's own full recomputation, and graphed by
torch.cuda.make_graphed_callables.

    python3 examples/megatron_gpt.py [--modes eager,graph,pingpong,...] [--loop both] [--json out.json]

One GPU, tensor and pipeline parallel 1, megatron-core's local spec (RMSNorm,
GQA, SwiGLU, Megatron's own unfused attention: no TransformerEngine). Every
mode starts from the same weights and trains on the same batches; the table
gives each mode's loss per step, its step time and the driver-level peak of
the device's used memory over whole steps (optimizer step included).

How the layers are graphed is the way Megatron's own TransformerEngine path
(TECudaGraphHelper) would call make_graphed_callables: each TransformerLayer
with no positional sample and its keyword arguments as the TransformerBlock
passes them (``sample_kwargs``); the graphed layers stay in the block, which
calls them as before. TECudaGraphHelper itself cannot run without
TransformerEngine (its constructor asserts HAVE_TE_GRAPHS, and
TransformerLayer._get_te_cuda_graph_replay_args imports
transformer_engine.pytorch), nor can megatron-core's own activation
offloading (fine-grained offloading raises "TE CPU offload is not available";
cpu_offloading asserts that TE is present): this is the closest working
equivalent, and Megatron's recomputation is the memory-saving feature of its
own that runs here.

Modes: eager, save_on_cpu, recompute (Megatron's recompute_granularity="full",
uniform, one layer per checkpoint), graph (torch.cuda.make_graphed_callables
per layer, through a positional wrapper since it takes no keywords), none /
pingpong / remap (vmmrt.torch, offload 1.0 or --fraction), auto (the planner).
"""
import argparse
import copy
import gc
import json
import os
import sys
import time

import torch


def _init_megatron(seed):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    # The graph-safe tracker: Megatron's generators can then be captured
    # (vmmrt.torch registers them with every graph, as TransformerEngine does).
    model_parallel_cuda_manual_seed(seed, use_cudagraphable_rng=True)


def build(a, recompute=False):
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig
    extra = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute \
        else {}
    cfg = TransformerConfig(num_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                            num_query_groups=a.kv_heads, ffn_hidden_size=a.ffn, normalization="RMSNorm",
                            gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, bf16=True,
                            params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, hidden_dropout=0.0,
                            attention_dropout=0.0, **extra)
    return GPTModel(cfg, get_gpt_layer_local_spec(), vocab_size=a.vocab, max_sequence_length=a.seq,
                    position_embedding_type="rope").cuda()


def batches(a, n):
    g = torch.Generator(device="cuda").manual_seed(1234)
    out = []
    for _ in range(n):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda", generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def layer_kwargs(model, ids, pos):
    """Each layer's keyword arguments, as the TransformerBlock passes them in
    one forward: the samples make_graphed_callables captures with."""
    seen = []
    layers = list(model.decoder.layers)
    origs = [l.forward for l in layers]

    def spy(i):
        def fwd(*args, **kw):
            assert not args, "TransformerBlock passes every argument by keyword"
            seen.append((i, {k: (v.detach().clone().requires_grad_(v.requires_grad) if torch.is_tensor(v) else v)
                             for k, v in kw.items()}))
            return origs[i](**kw)
        return fwd

    for i, l in enumerate(layers):
        l.forward = spy(i)
    try:
        model(ids, pos, None, labels=ids).float().mean().backward()
    finally:
        for l in layers:
            del l.forward
        model.zero_grad(set_to_none=True)
    kws = [kw for _, kw in sorted(seen, key=lambda s: s[0])]
    assert len(kws) == len(layers)
    return kws


class _Positional(torch.nn.Module):
    """One TransformerLayer as torch.cuda.make_graphed_callables can take it:
    positional tensors in, one tensor out."""

    def __init__(self, layer, kw):
        super().__init__()
        self.layer = layer
        self.forward_of = layer.forward
        self.tensor_keys = [k for k, v in kw.items() if torch.is_tensor(v)]
        self.consts = {k: v for k, v in kw.items() if not torch.is_tensor(v)}

    def forward(self, *tensors):
        out, _ = self.forward_of(**dict(zip(self.tensor_keys, tensors)), **self.consts)
        return out


def graph_torch(model, kws):
    for layer, kw in zip(model.decoder.layers, kws):
        pos = _Positional(layer, kw)
        g = torch.cuda.make_graphed_callables(pos, tuple(kw[k] for k in pos.tensor_keys))

        def fwd(_g=g, _keys=pos.tensor_keys, **kw):
            return _g(*(kw[k] for k in _keys)), None
        layer.forward = fwd


def graph_vmmrt(model, kws, mode, offload):
    import vmmrt.torch as vt
    layers = tuple(model.decoder.layers)
    graphed = vt.make_graphed_callables(layers, tuple(() for _ in layers), sample_kwargs=tuple(kws), mode=mode,
                                        offload=offload, names=["layer%d" % i for i in range(len(layers))])
    return vt.offload_of(graphed[0])


def run_mode(a, mode, loop, state, data, pos):
    from vmmrt.torch.memory import PeakSampler, driver_used
    torch.cuda.synchronize()
    before = driver_used()
    model = build(a, recompute=(mode == "recompute"))
    model.load_state_dict(state)
    off = None
    if mode not in ("eager", "save_on_cpu", "recompute"):
        kws = layer_kwargs(model, data[0][0], pos)
        if mode == "graph":
            graph_torch(model, kws)
        else:
            offload = "auto" if mode == "auto" else (a.fraction if mode != "none" else 0.0)
            off = graph_vmmrt(model, kws, "pingpong" if mode == "auto" else mode, offload)
        del kws
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    losses, times = [], []
    sampler = PeakSampler()

    def step(ids, labels):
        opt.zero_grad(set_to_none=(loop == "set_to_none"))
        if mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = model(ids, pos, None, labels=labels).float().mean()
        else:
            loss = model(ids, pos, None, labels=labels).float().mean()
        loss.backward()
        opt.step()
        return loss

    for k, (ids, labels) in enumerate(data):
        timed = k >= a.warmup
        if timed and k == a.warmup:
            torch.cuda.synchronize()
            sampler.start()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss = step(ids, labels)
        e1.record()
        losses.append(loss.detach())
        if timed:
            times.append((e0, e1))
    torch.cuda.synchronize()
    sampler.stop()
    row = {"mode": mode, "loop": loop, "losses": [float(l.item()) for l in losses],
           "loss_bits": [l.float().view(torch.int32).item() for l in losses],
           "step_ms": sorted(e0.elapsed_time(e1) for e0, e1 in times)[len(times) // 2],
           "peak": sampler.peak - before, "before": before, "sampler": sampler.as_dict()}
    if off is not None:
        off.sync()
        s = off.stats()
        n = len(data)
        row["d2h_bytes_per_step"] = s["bytes_offloaded"] / n
        row["h2d_bytes_per_step"] = s["bytes_restored"] / n
        row["layer_ms"] = [min(l.fwd_ms) + min(l.bwd_ms) for l in off.layers]
        if off.plan is not None:
            row["plan"] = off.plan.summary()
        row["describe"] = off.describe()
        off.close()
    model = opt = off = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


def report(rows, d2h, h2d):
    mib = float(1 << 20)
    lines = []
    for loop in sorted({r["loop"] for r in rows}):
        rs = [r for r in rows if r["loop"] == loop]
        ref = next((r for r in rs if r["mode"] == "graph"), None)
        eager = next((r for r in rs if r["mode"] == "eager"), None)
        lines.append("loop %s (%d steps, median of the timed ones; peak: driver-level, whole steps, "
                     "above the device's use before the model)" % (loop, len(rs[0]["losses"])))
        lines.append("  %-12s %9s %7s %10s %7s %9s %7s  %s" % ("mode", "step ms", "x graph", "peak MiB", "x graph",
                                                               "moved MiB", "/bound", "loss = eager's"))
        for r in rs:
            bound = None
            if r.get("d2h_bytes_per_step") and ref is not None and r.get("layer_ms"):
                lm = r["layer_ms"]
                head_tail = max(0.0, ref["step_ms"] - sum(lm)) + lm[0]
                bound = r["d2h_bytes_per_step"] / (d2h * 1e6) + r["h2d_bytes_per_step"] / (h2d * 1e6) + head_tail
            same = "-" if eager is None else ("bitwise" if r["loss_bits"] == eager["loss_bits"] else
                                              "differs (max %.2e)" % max(abs(x - y) for x, y in
                                                                         zip(r["losses"], eager["losses"])))
            lines.append("  %-12s %9.2f %7s %10.0f %7s %9s %7s  %s" % (
                r["mode"], r["step_ms"], "%.3f" % (r["step_ms"] / ref["step_ms"]) if ref else "-", r["peak"] / mib,
                "%.3f" % (r["peak"] / ref["peak"]) if ref else "-",
                "%.0f" % (r["d2h_bytes_per_step"] / mib) if r.get("d2h_bytes_per_step") else "-",
                "%.3f" % (r["step_ms"] / bound) if bound else "-", same))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="eager,save_on_cpu,recompute,graph,none,pingpong,remap,auto")
    p.add_argument("--loop", default="both", choices=("set_to_none", "persistent", "both"))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="steps before the timed ones")
    p.add_argument("--fraction", type=float, default=1.0, help="what pingpong and remap offload")
    p.add_argument("--json", help="write every row here")
    p.add_argument("--tiny", action="store_true", help="a small model (2 layers, hidden 256, seq 128): a quick check")
    a = p.parse_args()
    if a.tiny:
        a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, a.seq, a.vocab, a.steps, a.warmup = \
            2, 256, 704, 4, 2, 128, 1024, 4, 1
    if not torch.cuda.is_available():
        print("megatron_gpt: needs a CUDA GPU (megatron-core's GPTModel and CUDA graphs)", file=sys.stderr)
        return 2
    try:
        import megatron.core
    except ImportError as e:
        print("megatron_gpt: megatron-core is not installed (pip install megatron-core): %s" % e, file=sys.stderr)
        return 2
    import warnings
    warnings.filterwarnings("ignore", module="megatron")
    print("megatron-core %s, torch %s" % (getattr(megatron.core, "__version__", "?"), torch.__version__))
    from vmmrt.torch import planner
    _init_megatron(1234)
    base = build(a)
    state = copy.deepcopy(base.state_dict())
    del base
    torch.cuda.empty_cache()
    data = batches(a, a.steps)
    pos = torch.arange(a.seq, device="cuda").unsqueeze(0).expand(a.batch, -1)
    d2h, h2d = planner.measure_bandwidth("cuda")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    loops = ("set_to_none", "persistent") if a.loop == "both" else (a.loop,)
    rows = []
    for loop in loops:
        for mode in modes:
            t0 = time.time()
            print("megatron_gpt: %s, loop %s ..." % (mode, loop), flush=True)
            r = run_mode(a, mode, loop, state, data, pos)
            rows.append(r)
            print("megatron_gpt: %s, loop %s: %.2f ms per step, peak %.0f MiB (%.0f s)"
                  % (mode, loop, r["step_ms"], r["peak"] / 2 ** 20, time.time() - t0), flush=True)
            if r.get("plan"):
                print(r["plan"])
    print("model: GPTModel, %d layers, hidden %d, ffn %d, heads %d/%d, seq %d, batch %d, vocab %d, bf16; "
          "pinned copies D2H %.1f GB/s, H2D %.1f GB/s" % (a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, a.seq,
                                                          a.batch, a.vocab, d2h, h2d))
    print(report(rows, d2h, h2d))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "d2h_gbps": d2h, "h2d_gbps": h2d, "rows": rows}, f, indent=1)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

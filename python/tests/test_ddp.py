# SPDX-License-Identifier: LGPL-2.1-or-later
"""vmmrt.torch under DistributedDataParallel.

On the CPU: examples/torch_ddp.py under torchrun with two processes (gloo,
CPU tensors, libvmmrt's host backend, eager offload): per rank, the gradients
after DDP's all-reduce are bitwise those of the same DDP run without offload,
and the same on both ranks. Then what the package does for DDP: it knows when
a DDP forward runs, takes a runtime's device from the tensors and refuses one
the environment put elsewhere, and refuses parameters that moved since the
layers were graphed (FSDP's). On a GPU (skipped without one): grads="accumulate"
is refused under DDP; with two GPUs, a VMMRT_DEVICE that contradicts the
tensors' device is refused.
"""
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import _compat, offload

from conftest import samples, zoo_layers

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(TREE, "examples", "torch_ddp.py")
# Small enough for seconds on two CPU cores, big enough that every layer
# offloads (regions above min_bytes), and three of them: ping-pong keeps the
# last two in their banks, so the first goes to the host and back.
SHAPE = ["--layers", "3", "--seq", "64", "--hidden", "128", "--ffn", "352", "--heads", "4", "--kv-heads", "2",
         "--iterations", "2", "--warmup", "1"]


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _run_job(args, timeout=120):
    """Two local ranks of the example, started directly with torchrun's
    environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT), not through
    torch.distributed.run: its elastic agent keeps a rendezvous heartbeat
    that a loaded 2-core machine lost ("Broken pipe"), killing a job that
    was fine. Returns (the worst exit status, both outputs, each line
    prefixed with its rank); whatever is left when it times out is killed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(TREE, "python")] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")    # a local job: loopback, whatever the host name resolves to
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k in ("VMMRT_DEVICE", "VMMRT_BACKEND", "VMMRT_MODE", "VMMRT_LOOKAHEAD", "CUDA_VISIBLE_DEVICES"):
        env.pop(k, None)
    env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    procs = []
    for rank in range(2):
        e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, EXAMPLE] + args, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=e, cwd=TREE,
                                      start_new_session=True))
    outs, timed_out = [], False
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(1, deadline - time.monotonic()))[0])
            except subprocess.TimeoutExpired:
                timed_out = True
                for q in procs:
                    _kill(q)
                outs.append(p.communicate()[0])
    finally:
        for p in procs:
            _kill(p)        # nothing may outlive the job
    out = "\n".join("[rank%d]: %s" % (r, line) for r, o in enumerate(outs) for line in (o or "").splitlines())
    if timed_out:
        pytest.fail("the two-process job did not finish in %d s:\n%s" % (timeout, out[-4000:]))
    codes = [p.returncode for p in procs]
    return max(codes, key=abs), out


def _kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_two_ranks_gradients_after_all_reduce_are_bitwise_those_without_offload(tmp_path):
    out_json = tmp_path / "ddp.json"
    rc, out = _run_job(["--device", "cpu", "--json", str(out_json)] + SHAPE)
    assert out_json.exists(), out[-4000:]
    doc = json.loads(out_json.read_text())
    assert rc == 0 and doc["ok"], out[-4000:]
    rows = doc["rows"]
    assert doc["info"]["world_size"] == 2 and doc["info"]["backend"] == "gloo"
    assert len({r["pid"] for r in doc["ranks"]}) == 2          # two processes, each its own runtime
    for mode in ("eager-pingpong", "eager-remap"):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["rank"])
        assert [r["rank"] for r in mine] == [0, 1], mode
        for r in mine:
            assert "error" not in r, r
            assert r["reference"] == "eager" and r["vmmrt_device"] == "host:0"
            assert r["grad_bitwise"] is True, (mode, r["rank"], r.get("grad_max_ulp"))
            assert r["ranks_agree"] is True, (mode, r["rank"])
            assert r["d2h_bytes_per_step"] > 0 and r["h2d_bytes_per_step"] > 0   # it did offload
    assert all(r["ranks_agree"] for r in rows if r["mode"] == "eager")
    assert "bitwise = eager" in out and "[FAILED]" not in out


@pytest.fixture
def one_process_group(tmp_path, monkeypatch):
    """A gloo group of this process alone, destroyed afterwards."""
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="file://%s" % (tmp_path / "pg"), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_ddp_forward_is_seen_by_the_package(one_process_group):
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            seen.append(_compat.ddp_forward_active())
            return self.lin(x)

    assert not _compat.ddp_forward_active()
    m = Probe()
    m(torch.randn(2, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(m)
    ddp(torch.randn(2, 4)).sum().backward()
    assert seen == [False, True]
    assert not _compat.ddp_forward_active()


@pytest.mark.parametrize("bucket_view,find_unused", [(False, False), (True, True)])
def test_offloaded_layers_under_ddp_in_one_process(one_process_group, bucket_view, find_unused):
    """The job above in one process (a group of one), with DDP's options and
    gradient accumulation: the first microbatch of each step under no_sync(),
    the second one reduced. Bitwise the plain layers' under the same DDP."""
    base = zoo_layers(3)
    ref = copy.deepcopy(base)
    g = vt.make_graphed_callables(tuple(base), samples(3), graphs=False, min_bytes=0)
    kw = dict(gradient_as_bucket_view=bucket_view, find_unused_parameters=find_unused)
    d_off = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*g), **kw)
    d_ref = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*ref), **kw)
    torch.manual_seed(3)
    for _ in range(2):
        for micro in range(2):
            x = torch.randn(2, 8, 32, requires_grad=True)
            gy = torch.randn(2, 8, 32)
            for d, xx in ((d_off, x), (d_ref, x.detach().clone().requires_grad_())):
                if micro == 0:
                    with d.no_sync():
                        (d(xx) * gy).sum().backward()
                else:
                    (d(xx) * gy).sum().backward()
        got = [p.grad.clone() for m in base for p in m.parameters()]
        want = [p.grad.clone() for m in ref for p in m.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        for d in (d_off, d_ref):
            d.zero_grad(set_to_none=not bucket_view)
    assert vt.offload_of(g[0]).stats()["bytes_offloaded"] > 0


def test_a_runtime_on_another_device_than_the_tensors_is_refused(monkeypatch):
    cuda1 = torch.device("cuda", 1)
    offload.check_runtime_device({"backend": "cuda", "device_ordinal": 1, "device": "H200"}, cuda1)
    offload.check_runtime_device({"backend": "host", "device_ordinal": 0}, torch.device("cpu"))
    monkeypatch.setenv("VMMRT_DEVICE", "0")
    with pytest.raises(vmmrt.Error) as e:
        offload.check_runtime_device({"backend": "cuda", "device_ordinal": 0, "device": "H200"}, cuda1)
    msg = str(e.value)
    assert e.value.name == "VMMRT_E_MISMATCH"
    assert "cuda:1" in msg and "cuda device 0" in msg and "VMMRT_DEVICE=0" in msg and "LOCAL_RANK" in msg
    monkeypatch.delenv("VMMRT_DEVICE")
    monkeypatch.setenv("VMMRT_BACKEND", "host")
    with pytest.raises(vmmrt.Error) as e:
        offload.check_runtime_device({"backend": "host", "device_ordinal": 0}, cuda1)
    assert "host device 0" in str(e.value) and "VMMRT_BACKEND=host" in str(e.value)


def test_parameters_replaced_or_moved_after_graphing_are_refused():
    """What FSDP does to a layer's parameters (another tensor on the module,
    or the same one over re-allocated storage) after make_graphed_callables."""
    layers = zoo_layers(2)
    g = vt.make_graphed_callables(tuple(layers), samples(2), graphs=False, min_bytes=0)
    x = torch.randn(2, 8, 32, requires_grad=True)
    g[1](g[0](x)).sum().backward()
    old = layers[0].proj.weight
    layers[0].proj.weight = torch.nn.Parameter(old.detach().clone())
    with pytest.raises(vmmrt.Error) as e:
        g[0](torch.randn(2, 8, 32, requires_grad=True))
    msg = str(e.value)
    assert e.value.name == "VMMRT_E_MISMATCH" and "layer '0:Zoo'" in msg and "proj.weight" in msg
    assert "another tensor" in msg and "FSDP" in msg
    layers[0].proj.weight = old
    layers[1].w.data = layers[1].w.data.clone()               # same object, new storage
    with pytest.raises(vmmrt.Error) as e:
        g[1](torch.randn(2, 8, 32, requires_grad=True))
    assert "layer '1:Zoo'" in str(e.value) and "moved from" in str(e.value)
    with torch.no_grad():                                     # no graph, nothing offloaded: runs as it is
        g[1](torch.randn(2, 8, 32))


def _cuda_process_group(tmp_path):
    backend = "nccl" if dist.is_nccl_available() else "gloo"
    dist.init_process_group(backend, init_method="file://%s" % (tmp_path / "pg"), rank=0, world_size=1)


@pytest.mark.gpu
def test_accumulate_is_refused_under_ddp(tmp_path):
    from vmmrt.torch.bench import llama
    s = llama.Shape(hidden=256, ffn=512, heads=4, kv_heads=2, seq=128, batch=1)
    layers = llama.torch_layers(2, s, "cuda", torch.bfloat16, "math")

    def sample():
        return torch.randn(s.batch, s.seq, s.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    g = vt.make_graphed_callables(tuple(layers), tuple((sample(),) for _ in layers), grads="accumulate",
                                  capture_error_mode="thread_local")
    _cuda_process_group(tmp_path)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*g),
                                                        device_ids=[torch.cuda.current_device()])
        with pytest.raises(vmmrt.Error) as e:
            ddp(sample())
        assert e.value.name == "VMMRT_E_NOT_SUPPORTED"
        assert "grads='accumulate' under DistributedDataParallel" in str(e.value)
        assert "layer '0:DecoderLayer'" in str(e.value)
        g[1](g[0](sample())).float().sum().backward()         # outside DDP the same callables still train
    finally:
        dist.destroy_process_group()
        vt.offload_of(g[0]).close()


@pytest.mark.gpu
def test_vmmrt_device_contradicting_the_tensors_is_refused(monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    monkeypatch.setenv("VMMRT_DEVICE", "0")
    with pytest.raises(vmmrt.Error) as e:      # only when the environment is let override the package
        vt.Offload(device="cuda:1", options={"environment": "override"})
    assert e.value.name == "VMMRT_E_MISMATCH" and "VMMRT_DEVICE=0" in str(e.value)
    off = vt.Offload(device="cuda:1")          # by default the package's device wins (environment=fallback)
    try:
        assert off.runtime.info()["device_ordinal"] == 1
    finally:
        off.close()

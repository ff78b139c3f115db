# SPDX-License-Identifier: LGPL-2.1-or-later
"""Stream-ordered maps on the host backend: Slot.map_after (the worker maps
once an event has completed) and Slot.wait_stream (a stream waits for the
map on the device), then vmmrt.torch's memory that lives only while used
(resident activations, gradients) mapped that way, map_ahead uses ahead:
the path is taken, the results stay bitwise, map_ahead=0 still maps on the
host, and the tensors made over a slot before its memory is there die as
the others do (the memory comes back)."""
import ctypes
import time

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt.torch import _dlpack, place

from conftest import grads, same, step


def settle(slot, timeout=5.0):
    t0 = time.monotonic()
    while slot.state == "pending" and time.monotonic() - t0 < timeout:
        time.sleep(0.002)
    return slot.state


def test_map_after_and_wait_stream():
    """The map waits for its event; the stream's work after wait_stream finds the memory."""
    with vmmrt.Runtime({"backend": "host"}) as rt:
        s = rt.slot(1 << 20)
        busy, use = rt.stream_create(), rt.stream_create()
        ev, passed = rt.event(), rt.event()
        rt.kernel_busy(200 * 1000 * 1000, busy)      # 200 ms
        ev.record(busy)
        s.map_after(ev)
        s.wait_stream(use)
        passed.record(use)
        rt.kernel_fill(s.address, s.size, 5, use)    # over an unmapped slot it would fault
        assert s.state == "pending" and not ev.query() and not passed.query()
        rt.stream_synchronize(use)
        assert ev.query() and s.state == "mapped"
        word = ctypes.c_uint64()
        rt.copy_to_host(ctypes.addressof(word), s.address, 8)
        assert word.value == vmmrt.fill_word(5, 0)
        s.release_after(use)
        assert settle(s) == "reserved"
        with pytest.raises(vmmrt.Error) as e:
            s.wait_stream(use)                        # released: nothing to wait for
        assert e.value.name == "VMMRT_E_INVALID_STATE" and "neither mapped" in str(e.value)
        with pytest.raises(vmmrt.Error) as e:
            s.map_after(None)
        assert e.value.name == "VMMRT_E_INVALID_ARGUMENT" and "event is NULL" in str(e.value)
        for x in (ev, passed):
            x.destroy()
        s.destroy()
        rt.stream_destroy(busy)
        rt.stream_destroy(use)


def test_a_tensor_over_the_address_alone_lives_as_long_as_its_views():
    buf = (ctypes.c_uint8 * 256)(*range(256))
    t, owner = _dlpack.owned_tensor_at(ctypes.addressof(buf), 256, "cpu")
    gone = []
    import weakref
    weakref.finalize(owner, gone.append, True)
    del owner
    assert t.data_ptr() == ctypes.addressof(buf) and t.dtype == torch.uint8 and torch.equal(t, torch.arange(256).to(torch.uint8))
    v = t.view(torch.int32)[3:5]
    del t
    assert not gone
    assert v.tolist() == [int.from_bytes(bytes(range(12 + 4 * k, 16 + 4 * k)), "little") for k in range(2)]
    del v
    assert gone == [True]


def build(mode, n=3, **kw):
    from conftest import samples, zoo_layers
    import copy
    base = zoo_layers(n)
    ref = copy.deepcopy(base)
    kw.setdefault("min_bytes", 0)
    if mode == "none":
        kw.setdefault("options", {"host_granularity": 4096})   # resident slots for these small layers
    g = vt.make_graphed_callables(tuple(base), samples(n), graphs=False, mode=mode, **kw)
    return g, base, ref


@pytest.mark.skipif(not place.AVAILABLE, reason="torch without TorchDispatchMode")
@pytest.mark.parametrize("mode", ["none", "remap"])
@pytest.mark.parametrize("map_ahead", [1, 2, 0])
def test_memory_of_a_use_is_mapped_on_the_stream_and_results_stay_bitwise(mode, map_ahead):
    # (the path before the memory plan is made, and without it: every step here)
    g, base, ref = build(mode, map_ahead=map_ahead, memory_plan=False)
    off = vt.offload_of(g[0])
    grads_ = [lay.grads.backing for lay in off.layers if lay.grads is not None and lay.grads.mapped]
    residents = [lay.resident for lay in off.layers if lay.resident is not None]
    assert grads_ and (residents or mode != "none")
    before = {id(b): (b.maps, b.stream_maps) for b in off.backings}
    torch.manual_seed(5)
    for it in range(3):
        x = torch.randn(2, 8, 32, requires_grad=True)
        gy = torch.randn(2, 8, 32)
        xr = x.detach().clone().requires_grad_()
        y, yr = step(g, x, gy), step(ref, xr, gy)
        assert torch.equal(y, yr) and torch.equal(x.grad, xr.grad), "iteration %d" % it
        assert same(grads(base), grads(ref)), "iteration %d" % it
        for m in base + ref:
            m.zero_grad(set_to_none=True)            # the gradients' memory goes, to come back next step
    off.sync()
    off.runtime.stream_synchronize(None)
    for b in grads_ + residents:
        maps, stream_maps = b.maps - before[id(b)][0], b.stream_maps - before[id(b)][1]
        assert maps >= 2, (b.name, maps)             # mapped each step after the first, released between
        # one use ahead or more, every map of the steps is stream-ordered; 0 maps on the host
        assert stream_maps == (maps if map_ahead else 0), (b.name, maps, stream_maps)
        assert settle(b.slot) == "reserved", b.name  # and the memory came back
    assert off.stats()["slot_bytes"] == 0
    off.close()


@pytest.mark.parametrize("pinned", [False, True])
def test_a_pinned_backing_is_never_released(pinned):
    """A slot that holds a runner's static gradient buffers (graphed.py, a
    runner whose gradients did not land at their addresses) stays mapped when
    the last counted tensor over it dies: those buffers are written at every
    replay. (The H200 said "invalid argument" when it had been released.)"""
    from vmmrt.torch.backing import Backing
    off = vt.Offload(mode="none", device="cpu", options={"host_granularity": 4096})
    try:
        b = Backing(off, "grads", 1 << 16)
        off.backings.append(b)
        if pinned:
            b.pin()
        t = b.tensor(None)
        t.fill_(3)
        del t
        assert b.mapped == pinned and b.releases == (0 if pinned else 1)
        if pinned:                  # the bytes stayed: the same memory
            assert b.tensor(None, counted=False).sum().item() == 3 << 16
    finally:
        off.close()


class _Spy:
    """A real slot whose calls are recorded, in order."""

    def __init__(self, slot, calls):
        self._slot, self.calls = slot, calls

    def __getattr__(self, name):
        attr = getattr(self._slot, name)
        if not callable(attr):
            return attr

        def call(*args):
            self.calls.append((name,) + args)
            return attr(*args)
        return call


def test_backing_map_on_stream_makes_every_using_stream_wait_for_the_map():
    """Backing.map_on_stream asks the worker to map after the event, and the
    stream of the use waits for that map on the device: driven directly, so
    that no later host wait (the host backend's, Offload.map_for_use's) can
    hide a missing wait_stream. A second use while the map is asked for
    queues no second map, but its stream waits too."""
    from vmmrt.torch.backing import Backing
    off = vt.Offload(device="cpu")
    try:
        b = Backing(off, "t", 1 << 16)
        calls = []
        b.slot = _Spy(b.slot, calls)
        rt = off.runtime
        s1, s2 = rt.stream_create(), rt.stream_create()
        ev = rt.event()
        ev.record(s1)
        b.map_on_stream(ev, s1)
        assert [c[0] for c in calls] == ["map_after", "wait_stream"] and calls[1][1] == s1
        assert b.mapped and b.stream_maps == 1
        b.map_on_stream(ev, s2)
        assert [c[0] for c in calls[2:]] == ["wait_stream"] and calls[2][1] == s2 and b.maps == 1
        rt.stream_synchronize(s2)
        assert settle(b.slot) == "mapped"
        b.release(s2)
        rt.stream_synchronize(s2)
        assert settle(b.slot) == "reserved"
        ev.destroy()
        rt.stream_destroy(s1)
        rt.stream_destroy(s2)
    finally:
        off.close()


def test_unalias_copies_a_slot_buffer_only_once_it_is_mapped():
    """static_grads.unalias: a .grad that is a static gradient buffer in a
    gradient slot becomes a copy of its own before a forward replays, and
    the copy is enqueued only once the slot's memory is mapped (a map asked
    for on the stream may not be made yet: the H200's "invalid argument" in
    the 1F1B example; on the host backend a read of the unmapped slot)."""
    from vmmrt.torch import static_grads
    from vmmrt.torch.backing import Backing
    off = vt.Offload(device="cpu")
    try:
        b = Backing(off, "grads", 1 << 16)
        sg = b.tensor(None)[:64].view(torch.float32)     # a static buffer in the slot, mapped now
        sg.fill_(3.0)
        p = torch.nn.Parameter(torch.zeros(16))
        p.grad = sg
        order = []
        ensure = b.ensure

        def spy():
            order.append(("ensure", p.grad is sg))        # before the copy: .grad is still the buffer
            ensure()
        b.ensure = spy
        static_grads.unalias([(p, sg, b)])
        assert order == [("ensure", True)]
        assert p.grad is not sg and p.grad.data_ptr() != sg.data_ptr() and torch.equal(p.grad, torch.full((16,), 3.0))
        static_grads.unalias([(p, sg, b)])               # no longer an alias: nothing to do
        assert len(order) == 1
        del sg
    finally:
        off.close()


def test_unalias_of_a_buffer_in_a_released_slot_maps_it_first():
    """The same on the host backend's memory itself, in a subprocess: the
    slot released under a static buffer (uncounted, as graphed.py's are),
    the copy of unalias reads the slot, mapped again first (a read of the
    unmapped slot is a SIGSEGV there)."""
    import os
    import subprocess
    import sys
    code = """
import time, torch
import vmmrt.torch as vt
from vmmrt.torch import static_grads
from vmmrt.torch.backing import Backing
off = vt.Offload(device="cpu")
b = Backing(off, "grads", 1 << 16)
sg = b.tensor(None, counted=False)[:64].view(torch.float32)
p = torch.nn.Parameter(torch.zeros(16))
p.grad = sg
b.release(None)
off.runtime.stream_synchronize(None)
t0 = time.monotonic()
while b.slot.state != "reserved" and time.monotonic() - t0 < 5:
    time.sleep(0.002)
assert b.slot.state == "reserved", b.slot.state
static_grads.unalias([(p, sg, b)])
print("copied", p.grad is not sg and b.slot.state == "mapped", flush=True)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in sys.path if x))
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "copied True" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])

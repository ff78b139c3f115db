# SPDX-License-Identifier: LGPL-2.1-or-later
"""The C library is the one validator (issue 25): status names, strategies and
option ranges come from it, a declared schedule is checked by it, and the
descriptors it compares at every save are the saved views' own; the Runner
declares all of its state; a typo is matched against make_graphed_callables'
own signature."""
import gc
import inspect

import pytest
import torch

import vmmrt
import vmmrt.torch as vt
from vmmrt import _capi
from vmmrt.torch import _callables, _te, saved

from conftest import samples, zoo_layers


# ------------------------------------------------------ names from the library

def test_status_names_are_the_librarys(monkeypatch):
    lib = vmmrt.library()
    for k, v in vars(_capi).items():
        if k == "OK" or k.startswith("E_"):
            assert vmmrt.Error(v).name == lib.vmmrt_status_name(v).decode() == "VMMRT_" + k
    assert vmmrt.Error(99).name == "VMMRT_STATUS_%d" % 99      # the name of a status no library names
    monkeypatch.setattr(lib, "vmmrt_status_name", lambda s: b"NAME_AS_THE_LIBRARY_SAYS")
    assert vmmrt.Error(_capi.E_MISMATCH, "x").name == "NAME_AS_THE_LIBRARY_SAYS"


def test_modes_and_ranges_are_the_option_tables(monkeypatch):
    rows = {r["name"]: r for r in vmmrt.options_table()}
    assert vmmrt.MODES == vmmrt.option_choices("mode") == tuple(rows["mode"]["range"].split("|"))
    assert vmmrt.option_bounds("lookahead") == tuple(int(v) for v in rows["lookahead"]["range"].split(".."))
    with pytest.raises(vmmrt.InvalidValue):
        vmmrt.option_choices("lookahead")
    with pytest.raises(ValueError, match="no libvmmrt option"):
        vmmrt.option_bounds("lookahed")
    # A library with another strategy and a longer look-ahead: the package follows it.
    table = [dict(r) for r in rows.values()]
    for r in table:
        if r["name"] == "mode":
            r["range"] += "|tiered"
        if r["name"] == "lookahead":
            r["range"] = "0..3"
    monkeypatch.setattr(vmmrt, "_option_rows", table)
    layers = zoo_layers(1)
    with pytest.raises(ValueError, match="'tiered'"):
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, mode="teired")
    with pytest.raises(TypeError, match="between 0 and 3"):
        vt.make_graphed_callables(tuple(layers), samples(1), graphs=False, lookahead=4)


def test_a_mode_the_library_refuses_is_a_value_error_naming_its_choices():
    with pytest.raises(ValueError) as e:
        vt.Offload(mode="pingpog", device="cpu")
    assert isinstance(e.value, vmmrt.Error) and e.value.name == "VMMRT_E_INVALID_OPTION"
    assert all(m in str(e.value) for m in vmmrt.MODES)


# ------------------------------------------------------ the declared schedule

def test_the_library_checks_a_declared_schedule():
    off = vt.Offload(device="cpu", min_bytes=0)
    other = vt.Offload(device="cpu", min_bytes=0)
    a, b = off.layer("a"), off.layer("b")
    with pytest.raises(ValueError) as e:
        off.set_schedule([(a, False), (a, False), (b, True), (b, False)])
    assert isinstance(e.value, vmmrt.Error) and "forward of group 'a' twice" in str(e.value)
    with pytest.raises(ValueError, match="another runtime"):
        off.set_schedule([(a, False), (other.layer("c"), False), (a, True), (b, True)])
    off.set_schedule([(a, False), (b, False), (b, True), (a, True)])
    with pytest.raises(ValueError, match="leaves out .* 'b'"):
        off.set_schedule([(a, False), (a, True)])
    assert [(lay.name, bwd) for lay, bwd in off.schedule] == [("a", False), ("b", False), ("b", True), ("a", True)]
    off.close()
    other.close()


@pytest.mark.parametrize("mode", ["pingpong", "remap", "none"])
def test_the_bound_is_the_librarys(mode):
    off = vt.Offload(mode=mode, device="cpu")
    assert off.expected_bytes() == 0                 # nothing held before allocation
    off.close()
    g = vt.make_graphed_callables(tuple(zoo_layers(3)), samples(3), graphs=False, mode=mode, min_bytes=0)
    off = vt.offload_of(g[0])
    assert off.expected_bytes() == off.stats()["bound_bytes"]
    assert off.expected_bytes() == (0 if mode == "none" else 2 * off.granularity)   # 2 banks; look-ahead 1 + 1
    off.close()


# ------------------------------------------------------ real descriptors

class _Viewed(torch.nn.Module):
    """Saves x viewed as self.shape (sin saves its input)."""

    def __init__(self):
        super().__init__()
        self.shape = (2, 8, 32)

    def forward(self, x):
        return torch.sin(x.view(self.shape)).view(x.shape)


def _discovered(layer, monkeypatch):
    descs = []
    real = vmmrt.Group.discover
    monkeypatch.setattr(vmmrt.Group, "discover", lambda g, d: (descs.append(d), real(g, d))[1])
    g = vt.make_graphed_callables((layer,), samples(1), graphs=False, min_bytes=0)
    return g[0], descs


def test_a_region_is_described_by_its_view(monkeypatch):
    g, descs = _discovered(_Viewed(), monkeypatch)
    assert len(descs) == 1
    d = descs[0]
    assert d.ndim == 3 and tuple(d.shape[:3]) == (2, 8, 32) and tuple(d.stride[:3]) == (256, 32, 1)
    assert d.dtype == saved.DTYPE_TAG[torch.float32] and d.bytes == 2 * 8 * 32 * 4
    vt.offload_of(g).close()


def test_the_library_compares_each_pass_with_discovery(monkeypatch):
    """With the package's own per-tensor check out of the way, a view of
    another shape over the same bytes is the library's VMMRT_E_MISMATCH."""
    layer = _Viewed()
    g, _ = _discovered(layer, monkeypatch)
    x = torch.randn(2, 8, 32, requires_grad=True)
    g(x).sum().backward()
    monkeypatch.setattr(saved.Recorder, "_check", lambda self, i: None)
    layer.shape = (16, 32)
    with pytest.raises(vmmrt.Error) as e:
        g(x).sum().backward()
    assert e.value.name == "VMMRT_E_MISMATCH" and "differs from discovery" in str(e.value)
    vt.offload_of(g).close()


# ------------------------------------------------------ the Runner, the typos

def test_a_runner_holds_only_what_it_declares():
    declared = set(vars(_callables.Runner(0, torch.nn.Linear(2, 2), (torch.zeros(1, 2),), "r")))
    order = vt.order_1f1b(2, in_flight=2)
    for g in (vt.make_graphed_callables(tuple(zoo_layers(2)), samples(2), graphs=False),
              vt.make_graphed_callables(tuple(zoo_layers(2)), samples(4), graphs=False, order=order),
              vt.make_graphed_callables(tuple(vt.mark_recompute(m) for m in zoo_layers(2)), samples(2),
                                        graphs=False, offload=0.5)):
        x = torch.randn(2, 8, 32, requires_grad=True)
        for f in g:
            f(x).sum().backward()
        for r in [o for o in gc.get_objects() if isinstance(o, _callables.Runner)]:
            extra = set(vars(r)) - declared
            assert not extra, "Runner attributes set from outside its class: %s" % sorted(extra)
        vt.offload_of(g[0]).close()


def test_every_argument_is_suggested_for_its_typo():
    params = [p for p in inspect.signature(vt.make_graphed_callables).parameters.values()
              if p.kind is not p.VAR_KEYWORD][2:]
    for name in [p.name for p in params] + list(_te.FP8):
        with pytest.raises(TypeError, match="did you mean %r" % name):
            vt.make_graphed_callables(tuple(zoo_layers(1)), samples(1), graphs=False, **{name + "x": 1})


# ------------------------------------------------------ type hints

def test_the_public_api_has_type_hints():
    """Every public function and method, its return included; the hints
    evaluate on this Python (they are strings until asked for)."""
    import typing
    from vmmrt.torch import pipeline
    fs = [vt.make_graphed_callables, vt.make_offloaded_callables, vt.offload_of, vt.mark_not_offload,
          vt.order_1f1b, pipeline.split, pipeline.steps, vmmrt.check, vmmrt.status_name, vmmrt.option_choices,
          vmmrt.option_bounds, vmmrt.version, vmmrt.version_string, vmmrt.options_table, vmmrt.library]
    for cls in (vt.Offload, vmmrt.Runtime, vmmrt.Error, pipeline.Layout):
        fs += [m for n, m in vars(cls).items() if inspect.isfunction(m) and (not n.startswith("_") or n == "__init__")]
        fs += [p.fget for p in vars(cls).values() if isinstance(p, property)]
    bare = []
    for f in fs:
        hints = typing.get_type_hints(f)
        params = [p for p in inspect.signature(f).parameters if p != "self"]
        if "return" not in hints or any(p not in hints for p in params):
            bare.append(f.__qualname__)
    assert not bare, "without type hints: %s" % bare

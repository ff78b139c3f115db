# SPDX-License-Identifier: LGPL-2.1-or-later
"""PyTorch integration of libvmmrt: whole-layer CUDA graphs with CPU activation offload.

- :func:`make_graphed_callables`: a drop-in for torch.cuda.make_graphed_callables
  whose saved tensors live at fixed addresses and move to pinned host memory
  between forward and backward (``graphs=False``: the same offload, eagerly);
- :func:`mark_not_offload` and :class:`no_offload`: tensors that stay;
- :class:`Offload` and :class:`LayerOffload`: the per-runner API (discovery,
  capture, the four replay hooks) for frameworks that own their graph runners;
- :mod:`vmmrt.torch.pipeline`: pipeline schedules (``order=``: several
  microbatches in flight, a runner per layer and microbatch), and
  :func:`order_1f1b`, Megatron-LM's 1F1B order of one stage;
- :meth:`Offload.abort`: abandon an iteration (a step skipped for a NaN loss);
- :mod:`vmmrt.torch.planner`: what to offload so the copies hide behind compute;
- ``memory_budget=`` (:mod:`vmmrt.torch.budget`): per layer keep, offload or
  recompute (:mod:`vmmrt.torch.recompute`, :func:`mark_recompute`) within a budget;
- :mod:`vmmrt.torch.memory`: driver-level device memory and where it goes;
- ``python3 -m vmmrt.torch.bench``: the benchmark on Llama-style layers.

Importing this module imports torch; the C library loads on first use.
"""
from __future__ import annotations

from typing import Any, Callable

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    # The binding (import vmmrt) needs no torch; this part does. Say which
    # python lacks it and how to get it, rather than a bare "No module named".
    import sys as _sys

    raise ModuleNotFoundError(
        "vmmrt.torch needs PyTorch, which %s cannot import. Install it for that python: "
        "`%s -m pip install torch` (or your framework's own build of torch; installing this "
        "package with its [torch] extra does the same), or on Debian `apt-get install "
        "python3-torch` (CPU only; a venv sees it with --system-site-packages). The C binding, "
        "`import vmmrt`, works without torch." % (_sys.executable, _sys.executable), name="torch") from None

from vmmrt import Error  # noqa: F401
from vmmrt.torch.graphed import make_graphed_callables, offload_of  # noqa: F401
from vmmrt.torch.layer import LayerOffload  # noqa: F401
from vmmrt.torch.offload import Offload  # noqa: F401
from vmmrt.torch.plancheck import check_plan  # noqa: F401
from vmmrt.torch.pipeline import order_1f1b  # noqa: F401
from vmmrt.torch.budget import Budget, BudgetError, InvalidBudget  # noqa: F401
from vmmrt.torch.recompute import mark_recompute  # noqa: F401
from vmmrt.torch.saved import mark_not_offload, no_offload  # noqa: F401


def make_offloaded_callables(callables: Callable | tuple[Callable, ...], sample_args: tuple,
                             **kwargs: Any) -> Callable | tuple[Callable, ...]:
    """make_graphed_callables(..., graphs=False): eager layers with the same offload."""
    return make_graphed_callables(callables, sample_args, graphs=False, **kwargs)


def empty_cache() -> int:
    """torch.cuda.empty_cache(), then every runtime closed (or collected) while
    PyTorch still held segments libvmmrt's arena served from its ranges (the
    graphs' pool, the optimizer step's pools) and held for them since, whose
    segments have now all been given back, is destroyed. Returns how many
    runtimes are still held for their ranges (a tensor handed out from such
    a pool still alive, say). A process measuring memory between builds
    calls this where it would call torch.cuda.empty_cache(). An optimizer
    step that raised leaves this thread's allocations routed to the memory
    plan's pages until the next layer's use (vmmrt.torch.optmem); this ends
    that first (torch.cuda.empty_cache() under it would abort the process)."""
    import torch
    from vmmrt.torch import _arena, optmem
    # an optimizer step that raised left this thread's allocations routed
    # to the pages (its post-hook never ran): emptying the cache under it
    # would abort the process
    optmem.end_routing()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return _arena.sweep()


__all__ = ["Error", "make_graphed_callables", "make_offloaded_callables", "offload_of", "mark_not_offload",
           "no_offload", "Offload", "LayerOffload", "order_1f1b", "Budget", "BudgetError", "InvalidBudget",
           "mark_recompute", "empty_cache", "check_plan"]

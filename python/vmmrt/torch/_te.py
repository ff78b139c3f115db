# SPDX-License-Identifier: LGPL-2.1-or-later
"""TransformerEngine's make_graphed_callables arguments, taken as ours.

Megatron-LM (TECudaGraphHelper) calls TransformerEngine's
``make_graphed_callables(modules, sample_args, sample_kwargs=..., _order=...,
_num_layers_per_chunk=..., retain_graph_in_backward=..., fp8_enabled=...,
pre_warmup_hook=..., post_warmup_hook=...)``, every argument after
``sample_args`` by keyword. Those that mean the same here are accepted under
TE's names; FP8 is TE's own (its fp8_autocast and amax state around every
capture and replay) and is refused by name rather than ignored.
"""
import sys

from vmmrt import Error, _capi

# TE's FP8 arguments and the value that means "no FP8".
FP8 = {"fp8_enabled": False, "fp8_calibrating": False, "fp8_recipe": None, "fp8_group": None,
       "fp8_weight_caching": False}


def take_fp8(unknown):
    """Remove TE's FP8 arguments from ``unknown``; refuse any that asks for FP8."""
    for name, off in FP8.items():
        if name not in unknown:
            continue
        v = unknown.pop(name)
        enabled = v if name != "fp8_enabled" or not isinstance(v, (tuple, list)) else any(v)
        if enabled is not off and enabled != off:
            raise Error(_capi.E_NOT_SUPPORTED, "%s=%r: FP8 is TransformerEngine's (its fp8_autocast and amax "
                        "reduction around each capture and replay); vmmrt.torch graphs bf16/fp16/fp32 layers. "
                        "Leave %s at %r, or graph FP8 layers with transformer_engine.pytorch.make_graphed_callables"
                        % (name, v, name, off), "make_graphed_callables")


def pipeline_args(order, layers_per_chunk, _order, _num_layers_per_chunk):
    """order= / layers_per_chunk=, given under either name (not both)."""
    if _order is not None:
        if order is not None:
            raise TypeError("make_graphed_callables(): order= and _order= are the same argument; give one")
        order = _order
    if _num_layers_per_chunk is not None:
        if layers_per_chunk is not None:
            raise TypeError("make_graphed_callables(): layers_per_chunk= and _num_layers_per_chunk= are the same "
                            "argument; give one")
        layers_per_chunk = _num_layers_per_chunk
    return order, layers_per_chunk


def check_flags(retain_graph_in_backward, reuse_buffers, pre_warmup_hook, post_warmup_hook):
    if not isinstance(retain_graph_in_backward, bool):
        raise TypeError("retain_graph_in_backward=%r: True or False" % (retain_graph_in_backward,))
    if reuse_buffers not in (False, None):
        raise Error(_capi.E_NOT_SUPPORTED, "_reuse_graph_input_output_buffers=%r: each (layer, microbatch) keeps its "
                    "own static inputs and outputs here (their saved tensors are what libvmmrt offloads); pass False"
                    % (reuse_buffers,), "make_graphed_callables")
    for name, h in (("pre_warmup_hook", pre_warmup_hook), ("post_warmup_hook", post_warmup_hook)):
        if h is not None and not callable(h):
            raise TypeError("%s=%r: a function of no arguments, or None" % (name, h))


def generators(given):
    """The CUDA generators every graph registers (torch.cuda.CUDAGraph
    .register_generator_state), besides the default one that torch.cuda.graph
    registers itself: ``given``, else those of Megatron's RNG tracker when
    Megatron is loaded and its tracker is the graph-safe one (as
    TransformerEngine finds them), else none."""
    if given is not None:
        gens = list(given.values()) if isinstance(given, dict) else list(given)
        for g in gens:
            if type(g).__name__ != "Generator":
                raise TypeError("generators=: torch.Generator objects (CUDA), got a %s" % type(g).__name__)
        return gens
    rnd = sys.modules.get("megatron.core.tensor_parallel.random")
    if rnd is None:
        return []
    try:
        if not rnd.is_graph_safe_cuda_rng_tracker(rnd.get_cuda_rng_tracker()):
            return []
        return [g for g in rnd.get_all_rng_states().values() if type(g).__name__ == "Generator"]
    except Exception:
        return []


RNG_HINT = ("a random generator that cannot be captured: with Megatron, seed with its graph-safe tracker, "
            "model_parallel_cuda_manual_seed(seed, use_cudagraphable_rng=True) (its generators are then "
            "registered with every graph); otherwise pass your torch.Generator objects as generators=")


def rng_failure(err):
    """Whether a capture failed in a generator that is not graph-safe."""
    text = str(err)
    return "set_current_seed" in text or "graph-safe" in text or "register_generator_state" in text \
        or ("generator" in text.lower() and "capture" in text.lower())

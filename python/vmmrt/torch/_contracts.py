# SPDX-License-Identifier: LGPL-2.1-or-later
"""The contracts vmmrt.torch keeps with autograd and with torch's
make_graphed_callables, and how it survives a user's mistake.

- Arguments: each one's type and range is checked where it is given, and the
  graph-only ones are refused without graphs, so a typo never runs silently
  with a default.
- Calls: a tensor argument of any strides or memory format is taken as torch
  takes it (copied into the static input under graphs, into the sample's
  layout eagerly, where the saved tensors must keep discovery's views); a
  dtype, device or shape other than the sample's is refused, naming the
  argument and what the sample had.
- Saved tensors: the version of each is recorded when autograd saves it and
  compared when the backward uses it (kept on the device or offloaded, eager
  or graphed), raising autograd's own error, naming the layer; autograd does
  not check tensors that went through saved_tensors_hooks itself.
- Recovery: an exception inside a layer's forward or backward, a saved tensor
  changed in place, a layer that saved other tensors than discovery saw
  (eagerly), or a forward called again before its backward (an output
  dropped) abandon the iteration under way as Offload.abort() does, and the
  next call starts a new one. Only a failure of libvmmrt's own state (a
  failed capture, a driver call that failed part-way) leaves the offload
  unusable, and its message says which.
"""
import inspect
import logging
import warnings
import weakref

import torch

import vmmrt
from vmmrt import Error, _capi
from vmmrt.torch import _compat

log = logging.getLogger("vmmrt.torch")

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


class InplaceError(Error, RuntimeError):
    """A saved tensor was changed in place before the backward that needs it:
    autograd's own error (a RuntimeError), and a vmmrt.Error naming the layer."""


# ----------------------------------------------------------- arguments

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_callables(callables):
    """A tuple of modules or functions, or one: as torch.cuda.make_graphed_callables takes them."""
    if isinstance(callables, list):
        raise TypeError("callables is a list: pass a tuple of modules or functions (as "
                        "torch.cuda.make_graphed_callables takes them), or one of them")
    for i, c in enumerate(callables if isinstance(callables, tuple) else (callables,)):
        if not callable(c):
            raise TypeError("callable %d is a %s, not a module or function" % (i, type(c).__name__))


def check_offload_arguments(lookahead, min_bytes):
    """What Offload takes from the caller, checked as make_graphed_callables checks it."""
    lo, hi = vmmrt.option_bounds("lookahead")     # the library's range (its option table)
    if not _is_int(lookahead) or not lo <= lookahead <= hi:
        raise TypeError("lookahead=%r: a whole number of layers between %d and %d (an int, not %s)"
                        % (lookahead, lo, hi, type(lookahead).__name__))
    if not _is_int(min_bytes) or min_bytes < 0:
        raise TypeError("min_bytes=%r: a whole number of bytes, 0 or more" % (min_bytes,))


def check_arguments(num_warmup_iters, allow_unused_input, pool, capture_error_mode, lookahead, graphs, grads,
                    names, options, margin, min_bytes):
    """make_graphed_callables' arguments, each of its type; the graph-only ones
    (pool, capture_error_mode, grads="accumulate") refused with graphs=False."""
    if not _is_int(num_warmup_iters) or num_warmup_iters < 0:
        raise TypeError("num_warmup_iters=%r: a whole number of warm-up passes, 0 or more" % (num_warmup_iters,))
    if not isinstance(allow_unused_input, bool):
        raise TypeError("allow_unused_input=%r: True or False" % (allow_unused_input,))
    check_offload_arguments(lookahead, min_bytes)
    if not isinstance(graphs, bool):
        raise TypeError("graphs=%r: True (CUDA graphs) or False (eager offload)" % (graphs,))
    if capture_error_mode not in CAPTURE_ERROR_MODES:
        raise ValueError("capture_error_mode=%r: choose %s (torch.cuda.graph's)"
                         % (capture_error_mode, ", ".join(repr(m) for m in CAPTURE_ERROR_MODES)))
    if names is not None and (isinstance(names, str) or not all(isinstance(n, str) for n in names)):
        raise TypeError("names=%r: a list of strings, one per callable" % (names,))
    if options is not None and (not isinstance(options, dict) or not all(isinstance(k, str) for k in options)):
        raise TypeError("options=%r: a dict of libvmmrt option names to values (see vmmrt.options_table())"
                        % (options,))
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise TypeError("margin=%r: the planner's safety factor, a number above 0" % (margin,))
    if not graphs:
        for given, what in ((pool is not None and "pool=%r" % (pool,), "the graphs' memory pool"),
                            (capture_error_mode != "global" and "capture_error_mode=%r" % capture_error_mode,
                             "how a capture treats unsafe calls"),
                            (grads == "accumulate" and "grads='accumulate'", "the backward graph adds into .grad")):
            if given:
                raise ValueError("%s with graphs=False: it applies to CUDA graphs only (%s); drop it, or use "
                                 "graphs=True" % (given, what))


def runtime_options(options):
    """The C options the package passes: an explicit argument beats a VMMRT_*
    variable (option "environment" = "fallback": a variable fills only what
    the package leaves unset), unless ``options`` says otherwise."""
    opts = dict(options or {})
    opts.setdefault("environment", "fallback")
    return opts


_DEFAULTS = {"mode": "pingpong", "lookahead": 1}


def _text(v):
    return str(int(v)) if isinstance(v, bool) else str(v)


def environment_settings(given, package, options, where="vmmrt.torch", stacklevel=3):
    """The VMMRT_* environment against what the runtime is asked for, before it
    opens. Every variable is parsed by the library (vmmrt.environment_options),
    so a malformed one is an error here as in the C tools, even for an option
    given as an argument. ``given``: the caller's arguments by option name
    ("mode", "lookahead"; None where left out), ``package``: what the package
    chooses itself (the backend and device of the tensors). Returns ``given``
    with each left out filled from the environment, else the default. A
    variable that says otherwise than an argument (or than the package,
    or than one of ``options``) is one warning naming both, and which one
    the runtime takes ("environment" option: fallback, the argument;
    override, the variable), attributed ``stacklevel`` frames up: the
    caller of the public function that asked."""
    opts = runtime_options(options)
    env = vmmrt.environment_options(str(opts["environment"]))
    override = str(opts["environment"]) == "override"
    rows = {row["name"]: row["env"] for row in vmmrt.options_table()}
    clashes = []
    asked = [(k, v, "%s=%r" % (k, v)) for k, v in given.items() if v is not None]
    asked += [(k, v, "options[%r]=%r" % (k, v)) for k, v in (options or {}).items() if k != "environment"]
    asked += [(k, v, "%s %s (from the tensors' device)" % (k, v)) for k, v in package.items()
              if k not in (options or {})]
    for name, value, what in asked:
        if name in env and env[name] != _text(value):
            clashes.append("%s=%s and %s" % (rows.get(name, name), env[name], what))
    if clashes:
        warnings.warn("%s: %s: %s" % (where, "; ".join(clashes), "the variable applies (options={'environment': "
                                      "'override'})" if override else "the argument applies (an argument beats the "
                                      "environment; options={'environment': 'override'} lets the variable win)"),
                      UserWarning, stacklevel=stacklevel)
    out = {}
    for k, v in given.items():
        if v is None:
            v = env.get(k, _DEFAULTS.get(k))
            if k == "lookahead" and isinstance(v, str):
                v = int(v)
        out[k] = v
    return out


def distinct_callables(callables, names):
    """The same module twice would share one forward, replaced once per
    callable: refused, naming both."""
    seen = {}
    for i, c in enumerate(callables):
        if isinstance(c, torch.nn.Module):
            j = seen.setdefault(id(c), i)
            if j != i:
                nm = names if names is not None else [None] * len(callables)
                raise ValueError("callables %d%s and %d%s are the same module: each callable is one layer with "
                                 "its own graphs and saved tensors; pass distinct modules (copy.deepcopy), or, for "
                                 "several microbatches through one layer, order= (vmmrt.torch.order_1f1b)"
                                 % (j, " (%r)" % nm[j] if nm[j] else "", i, " (%r)" % nm[i] if nm[i] else ""))


# --------------------------------------------------------------- calls

def _argument_names(runner):
    """Tensor argument k's name for messages, when the sample's positional
    arguments are flat tensors: "argument 0 ('x')", then the keyword ones
    ("keyword 'attention_mask'")."""
    out = {}
    if not all(isinstance(a, torch.Tensor) for a in runner.sample_args):
        return out
    fn = runner.orig_forward or (runner.module.forward if runner.module is not None else runner.fn)
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    for k in range(len(runner.sample_args)):
        out[k] = "argument %d (%r)" % (k, params[k].name) if k < len(params) else "argument %d" % k
    j = len(runner.sample_args)
    kwargs = getattr(runner, "sample_kwargs", None) or {}
    for key in getattr(runner, "kw_keys", ()):
        for leaf in _compat.tree_flatten(kwargs[key])[0]:
            if isinstance(leaf, torch.Tensor):
                out[j] = "keyword %r" % key
                j += 1
    return out


def describe_argument(runner, k):
    names = getattr(runner, "_arg_names", None)
    if names is None:
        names = runner._arg_names = _argument_names(runner)
    return names.get(k, "argument %d" % k)


def _layout(t):
    return (tuple(t.stride()), _compat.storage_offset_bytes(t), _compat.storage_of(t)[1])


def eager_inputs(runner, leaves):
    """Eagerly the saved tensors must keep discovery's views, so an argument
    laid out otherwise than its sample (a transposed view, channels_last, a
    view into a larger tensor) goes in as a copy in the sample's layout, as
    the copy into a static input does under graphs (autograd carries the
    gradient back through the copy)."""
    out = list(leaves)
    for k, (a, s) in enumerate(zip(leaves, runner.sample)):
        if a.numel() and _layout(a) != _layout(s):
            c = torch.empty_strided(s.shape, s.stride(), dtype=s.dtype, device=a.device)
            out[k] = c.copy_(a)
    return tuple(out)


def mismatch(runner, k, a, s):
    """The error for argument k whose dtype, device or shape is not its sample's."""
    def what(t):
        return "%s %s on %s" % (str(t.dtype).replace("torch.", ""), list(t.shape), t.device)
    differ = [w for w, x, y in (("dtype", a.dtype, s.dtype), ("shape", a.shape, s.shape),
                                ("device", a.device, s.device)) if x != y]
    fix = ("capture one set of callables per shape" if differ == ["shape"] else
           "pass the %s the sample had (%s), or build callables for this one" % (
               " and ".join(differ), ", ".join("%s" % {"dtype": s.dtype, "shape": list(s.shape),
                                                       "device": s.device}[d] for d in differ)))
    return Error(_capi.E_MISMATCH, "%s is %s where the sample was %s: its %s may not change between calls (the "
                 "graphs and the saved tensors' slots are laid out for the sample); %s"
                 % (describe_argument(runner, k), what(a), what(s), " and ".join(differ), fix),
                 "layer %r" % runner.name)


# ------------------------------------------------------- saved versions

def _tensor_type(t):
    try:
        return t.type()
    except Exception:  # a tensor subclass without a legacy type name
        return str(t.dtype)


def inplace_error(layer, t, what, now, then):
    """Autograd's own error for a saved tensor changed in place, naming the layer."""
    return InplaceError(_capi.E_MISMATCH, "one of the variables needed for gradient computation has been modified "
                        "by an inplace operation: [%s %s], %s, is at version %d; expected version %d instead. "
                        "Hint: it was changed in place after the layer's forward saved it; change a clone of it "
                        "(or change it before the layer runs)" % (_tensor_type(t), list(t.shape), what, now, then), layer)


class Watch:
    """The user-visible tensors a graphed call's backward depends on (its
    arguments and outputs that the layer saved at capture), with their
    versions at the forward."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items     # (weakref, version, what)

    def check(self, layer):
        for ref, v, what in self.items:
            t = ref()
            if t is not None and t._version != v:
                return inplace_error(layer, t, what, t._version, v)
        return None


def watched(runner, rec):
    """Which arguments and outputs of a graphed runner the layer saves (from
    the capture pass's recorder): their in-place changes are the user's to
    answer for, as autograd would refuse them eagerly. Returns (the
    arguments, the outputs), each as (index, its name in a message), named
    once here rather than at every call."""
    saved = rec.saved_storages if rec is not None else frozenset()
    ins = [(k, "%s of the call" % describe_argument(runner, k)) for k, t in enumerate(runner.surface[:runner.n_user])
           if t.numel() and _compat.storage_of(t)[0] in saved]
    outs = [(k, "output %d of the layer, which its backward needs" % k) for k, t in enumerate(runner.static_outputs)
            if isinstance(t, torch.Tensor) and t.numel() and _compat.storage_of(t)[0] in saved]
    return ins, outs


def watch(ins, outs, inputs, outputs):
    """The Watch of one call (``ins``, ``outs``: :func:`watched`'s), or None."""
    items = [(weakref.ref(inputs[k]), inputs[k]._version, what) for k, what in ins]
    items += [(weakref.ref(outputs[k]), outputs[k]._version, what) for k, what in outs]
    return Watch(items) if items else None


# ------------------------------------------------------------ recovery

class _Iteration:
    """The runners whose forward ran in the iteration under way, and those of
    them whose backward has not: the iteration ends when none is left."""

    def __init__(self):
        self.ran, self.pending = set(), set()

    def clear(self):
        self.ran.clear()
        self.pending.clear()


def _iteration(off):
    it = getattr(off, "_iteration", None)
    if it is None:
        it = off._iteration = _Iteration()
        off._abort_hooks.append(it.clear)
    return it


def in_flight(off):
    """Whether a forward of ``off``'s layers awaits its backward (an iteration
    under way: what they saved is in their slots or banks)."""
    it = getattr(off, "_iteration", None)
    return it is not None and bool(it.pending)


def abandon(off, why):
    """Abandon the iteration under way (Offload.abort), remembering why for the
    refusal of a backward through it. Quiet if the offload cannot abort (then
    its own failure is what the next call reports)."""
    if off.failed is not None or off.runtime.closed or not off.allocated:
        return
    try:
        off.abort()
    except Error as e:
        off.fail("abandoning the iteration after %s: %s" % (why, e))
        return
    off.abandoned_why = why
    log.warning("vmmrt: %s: the iteration under way was abandoned, as Offload.abort() does (its outputs cannot be "
                "backpropagated; .grad its backwards accumulated stays); the next call starts a new one", why)


def forward_starts(runner):
    """Before a runner's forward: one that already ran in this iteration (its
    output dropped without its backward, a step given up without abort(), two
    microbatches in flight without order=) ends that iteration, and this call
    starts the next."""
    off = runner.layer.offload
    it = getattr(off, "_iteration", None) or _iteration(off)     # (a call once: this runs at every forward)
    if runner.name in it.ran:
        abandon(off, "layer %r was called again before %s (an output dropped without its backward; without "
                "order=, one microbatch at a time)" % (
                    runner.name, "the backward of its previous call" if runner.name in it.pending else
                    "the iteration of its previous call ended (the backwards of the layers before it never came)"))
    it.ran.add(runner.name)
    it.pending.add(runner.name)


def forward_failed(runner):
    it = _iteration(runner.layer.offload)
    it.ran.discard(runner.name)
    it.pending.discard(runner.name)


def backward_done(runner):
    off = runner.layer.offload
    it = getattr(off, "_iteration", None) or _iteration(off)
    it.pending.discard(runner.name)
    if not it.pending:
        it.ran.clear()


def abandoned_error(runner):
    off = runner.layer.offload
    why = getattr(off, "abandoned_why", None)
    return Error(_capi.E_INVALID_STATE, "backward of a forward whose iteration was abandoned (%s); run the forward "
                 "again, and its backward before the next forward of the layer" % (
                     why or "Offload.abort()"), "layer %r" % runner.name)


def user_failure(lay, kind, exc):
    """An exception inside a layer's eager forward (the user's code, a saved
    tensor that drifted from discovery): the group's capture ends and the
    iteration is abandoned, so the offload stays usable."""
    try:
        lay.group.end_capture()
    except Error:
        pass  # fewer tensors saved than discovered: the group goes back to allocated, as wanted
    abandon(lay.offload, "layer %r: the %s raised %s: %s" % (lay.name, kind, type(exc).__name__, exc))


def not_offload_marked(t):
    """TransformerEngine's mark (mark_not_offload sets _TE_do_not_offload) and
    Megatron's (offloading_activation = False)."""
    return getattr(t, "_TE_do_not_offload", False) or getattr(t, "offloading_activation", True) is False

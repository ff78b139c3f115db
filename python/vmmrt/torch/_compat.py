# SPDX-License-Identifier: LGPL-2.1-or-later
"""What differs between the PyTorch versions this package runs on.

CI has Debian's torch 1.13 (CPU only: no untyped_storage(), no
scaled_dot_product_attention, an older pytree); the GPU machine has 2.11.
Every difference is feature-detected here, never decided by version number.
"""
import gc

import torch
import torch.utils._pytree as _pytree

HAS_UNTYPED_STORAGE = hasattr(torch.Tensor, "untyped_storage")
HAS_SDPA = hasattr(torch.nn.functional, "scaled_dot_product_attention")


def storage_of(t):
    """(data_ptr, nbytes) of the storage behind t. (torch 1.13: the untyped
    storage itself; Tensor.storage() wraps it in a TypedStorage first, a
    dozen Python calls for each of the many tensors an eager pass asks
    about.)"""
    s = t.untyped_storage() if HAS_UNTYPED_STORAGE else t._storage()
    return s.data_ptr(), s.nbytes()


_ITEMSIZE = {}


def itemsize(dtype):
    """Bytes per element of dtype, asked of torch once per dtype (it takes a
    tensor to ask: one torch.empty, not one per tensor built over a slot)."""
    n = _ITEMSIZE.get(dtype)
    if n is None:
        n = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return n


def memory_segments(mempool_id=None):
    """torch.cuda.memory_snapshot()'s segments (of one pool's, given its id),
    without the memory history's trace entries where this PyTorch can leave
    them out (2.11: a full snapshot converts every entry; only the segments
    are wanted)."""
    args = () if mempool_id is None else (mempool_id,)
    try:
        return torch.cuda.memory_snapshot(*args, include_traces=False)
    except TypeError:       # (no include_traces)
        return torch.cuda.memory_snapshot(*args)


def storage_offset_bytes(t):
    return t.storage_offset() * t.element_size()


def tree_leaves(*args):
    """The leaves of the positional arguments, as make_graphed_callables flattens them."""
    leaves, _ = _pytree.tree_flatten(args)
    return leaves


def tree_flatten(obj):
    return _pytree.tree_flatten(obj)


def tree_unflatten(leaves, spec):
    return _pytree.tree_unflatten(leaves, spec)


def cuda_available():
    return torch.cuda.is_available()


_cuda = None


def is_capturing():
    """Whether the current CUDA stream is capturing a graph (False without
    CUDA). Asked in the per-call hooks (a release, a flush): whether there is
    CUDA at all is asked of torch once per process (torch.cuda.is_available
    reads the environment and counts devices each time; the answer does not
    change in a running process: torch caches the device count itself)."""
    global _cuda
    if _cuda is None:
        _cuda = torch.cuda.is_available()
    if not _cuda:
        return False
    return torch.cuda.is_current_stream_capturing()


def span_elements(shape, stride):
    """Elements from a strided view's first element to its last, inclusive (0 if empty)."""
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(shape, stride))


def ddp_forward_active():
    """Whether a DistributedDataParallel forward is running on this thread's
    call stack: DDP sets its class attribute ``_active_ddp_module`` around the
    wrapped module's forward (torch 1.13 to 2.11, for TorchDynamo). False where
    torch has no such attribute, and under DDP's "python reducer" (compiled
    autograd), which does not set it."""
    global _ddp_active
    if _ddp_active is None:
        try:
            from torch.nn.parallel import DistributedDataParallel
            _ddp_active = getattr(DistributedDataParallel, "_get_active_ddp_module", None) or False
        except ImportError:
            _ddp_active = False
    try:
        return bool(_ddp_active) and _ddp_active() is not None
    except Exception:
        return False


_ddp_active = None     # DDP's getter, looked up once (it is asked at every grads="accumulate" call)


def tensor_over(base, dtype, shape, stride, offset_bytes):
    """A new tensor (its own TensorImpl, no view of base as far as autograd
    knows) over base's storage: dtype, shape, strides, and its first element
    offset_bytes from the storage's start. base's storage must hold it."""
    item = itemsize(dtype)
    if offset_bytes % item:
        raise ValueError("offset %d is not a multiple of %s's size" % (offset_bytes, dtype))
    t = torch.empty((0,), dtype=dtype, device=base.device)
    if HAS_UNTYPED_STORAGE:
        t.set_(base.untyped_storage(), offset_bytes // item, tuple(shape), tuple(stride))
    else:
        # torch 1.13: set_ takes a storage of the tensor's own dtype
        typed = torch.storage.TypedStorage(wrap_storage=base.storage().untyped(), dtype=dtype)
        t.set_(typed, offset_bytes // item, tuple(shape), tuple(stride))
    return t


def capture(graph, pool, stream, error_mode, body):
    """body() captured into ``graph`` on ``stream`` into ``pool``; returns what
    it returned. No garbage collection inside: a finalizer it runs (an old
    CUDA graph, another runtime) makes driver calls that invalidate the
    capture from within it (torch.cuda.graph collects just before). A
    failure raises the first error (body's own; else capture_end's, which
    says only that the capture was invalidated) once what the failed capture
    left under way is ended (:func:`end_abandoned_pool`,
    :func:`end_abandoned_capture`)."""
    inner, result = None, None
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=error_mode):
            try:
                result = body()
            except BaseException as e:  # noqa: B902 - re-raised below, after the capture ends
                inner = e
    except BaseException as e:  # noqa: B902 - capture_end's, when body's own is not there
        if inner is None:
            inner = e
    finally:
        if collecting:
            gc.enable()
    if inner is not None:
        # (a capture_end that returned ended the routing itself: then nothing is done)
        end_abandoned_pool(pool)
        end_abandoned_capture(stream)
        raise inner
    return result


def end_abandoned_pools(device=None, margin=256):
    """Every routing a failed capture left under way, whatever its pool: for
    a capture someone else made (torch.cuda.make_graphed_callables inside a
    benchmark, a framework's own graphs), whose pool id nobody kept. Tries
    :func:`end_abandoned_pool` on each pool id the process can have handed
    out so far: torch numbers them from one counter, (0, k) for a shared
    pool, (k, 0) for a graph's own; ``margin`` ids past the newest cover a
    second counter. Only where no capture is under way in the process (it
    would end that one's routing too): a benchmark between two points, not
    the library. Returns the pools ended; never raises."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is None:
        return []
    try:
        newest = max(torch.cuda.graph_pool_handle())
    except Exception:  # noqa: B902 - no handle: nothing was captured in this process
        return []
    ended = []
    for k in range(1, int(newest) + 1 + margin):
        for pool in ((0, k), (k, 0)):
            if end_abandoned_pool(pool, device):
                ended.append(pool)
    return ended


def end_abandoned_pool(pool, device=None):
    """After a capture into ``pool`` (a pool id) whose end failed (the driver
    invalidated it: CUDAGraph.capture_end raises at cudaStreamEndCapture),
    the caching allocator still routes the capture's allocations to the
    pool: capture_begin began that routing and took a reference on the pool,
    and only a capture_end that succeeds ends it. Every later emptying of
    PyTorch's cache in the process then aborts it (captures_underway.empty(),
    an internal assertion of the caching allocator), wherever it is called
    from: torch.cuda.empty_cache(), an out-of-memory retry, libvmmrt's own
    release of the optimizer's pools. The routing is ended here and the
    reference capture_begin took given back (the graph, whose capture never
    ended, never gives it back); returns whether a routing was under way
    (none: capture_begin failed before it, or capture_end got past it).
    Never raises."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    release = getattr(torch._C, "_cuda_releasePool", None)
    if pool is None or end is None:
        return False
    try:
        dev = torch.cuda.current_device() if device is None else device
        end(dev, pool)
    except Exception:  # noqa: B902 - "not currently recording to mempool_id": nothing to end
        return False
    if release is not None:
        try:
            release(dev, pool)
        except Exception:  # noqa: B902 - the routing is ended, which is what keeps the process alive
            pass
    return True


def end_abandoned_capture(stream=None):
    """After a capture the driver invalidated (a .item(), a host sync, an op
    on the legacy stream), CUDAGraph.capture_end raises before it ends the
    CUDA generator's capture, and the generator then refuses every later
    random number outside a graph ("Offset increment outside graph capture
    encountered unexpectedly"). An empty capture on ``stream`` (torch's
    capture stream if None) begins and ends it again. Never raises: the
    failure that abandoned the capture is what a caller reports."""
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            pass
        del g
    except Exception:
        pass


def deferred_graph():
    """A CUDA graph instantiated at its first replay, not at the end of its
    capture (torch's keep_graph=True, where this torch has it; an ordinary
    CUDAGraph otherwise): a graph no call ever replays then never holds an
    executable graph's device memory. ``graph.vmmrt_deferred`` says which
    (vmmrt.torch._launch reads the handle once the first replay made it)."""
    try:
        g = torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:           # (a torch without keep_graph)
        return torch.cuda.CUDAGraph()
    g.vmmrt_deferred = True
    return g

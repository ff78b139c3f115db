# SPDX-License-Identifier: LGPL-2.1-or-later
"""Device memory as the driver sees it, and where it goes.

Allocator statistics alone cannot prove that offload gave memory back:
libvmmrt's slots are mapped with the driver's VMM calls, outside PyTorch's
caching allocator, and the allocator keeps freed blocks reserved. So the
total here is the driver's (cuMemGetInfo), and the parts are what each owner
reports: PyTorch's graph pools and the rest of its caching allocator (from
its segment list), libvmmrt's activation slots or banks (from its workers'
count), libvmmrt's other slots (gradients and resident activations, where
the offload reports them) and the remainder (CUDA context, libraries, other
processes).

:func:`snapshot` reads that once; :class:`PeakSampler` samples the driver's
used memory from a background thread over a stretch of work (a whole
training step, optimizer step included) and keeps the peak, which a single
reading between forward and backward cannot see: gradients are born during
the backward, the optimizer's states at its first step, and remap maps and
releases device memory while the step runs.
"""
import threading
import time

import torch

from vmmrt.torch import _compat

MiB = float(1 << 20)


def _counted(segments, index, views):
    """The segments of device ``index`` outside ``views`` (see pool_parts),
    each with whether it is a graph pool's (None: the segments do not say
    their pool)."""
    for s in segments:
        if s.get("device", index) != index:
            continue
        a = s.get("address")
        if a is not None and any(lo <= a < hi for lo, hi in views):
            continue
        pid = s.get("segment_pool_id")
        yield s, (None if pid is None else tuple(pid) != (0, 0))


def _free(s):
    size = s.get("total_size", 0)
    return size - s.get("allocated_size", size)


def pool_parts(segments, index, views=()):
    """(graph-pool bytes, of them free, other caching-allocator bytes) of
    device ``index`` in ``segments`` (torch.cuda.memory_snapshot()'s list):
    graph pools are the segments not in the default pool (0, 0); a pool's
    free bytes are its segments' blocks no tensor holds, which a graph pool
    keeps reserved for the life of its graphs (what the captures allocated
    and freed). Graph-pool figures are None when the segments do not say
    their pool. Segments inside ``views`` ([lo, hi) address ranges: the
    memory plan's pages mapped again for the optimizer step,
    vmmrt.torch.optmem; the graphs' pool on a slot, vmmrt.torch.graphpool)
    are the library's bytes, counted there: left out."""
    pool = free = other = 0
    known = False
    for s, graph in _counted(segments, index, views):
        known = known or graph is not None
        if graph:
            pool += s.get("total_size", 0)
            free += _free(s)
        else:
            other += s.get("total_size", 0)
    return (pool if known else None), (free if known else None), other


def allocator_free(segments, index, views=()):
    """The bytes of the default pool's segments (those :func:`pool_parts`
    counts as "other") that no tensor holds: what PyTorch's cache keeps
    reserved beyond what is in use, which a step of graphs does not take
    back as eager's next activations do."""
    return sum(_free(s) for s, graph in _counted(segments, index, views) if not graph)


def _pool_bytes(index, views=()):
    """pool_parts of the device's caching allocator now, and allocator_free
    (None where the segments cannot be read)."""
    try:
        segs = _compat.memory_segments()
    except Exception:
        return None, None, torch.cuda.memory_reserved(index), None
    return pool_parts(segs, index, views) + (allocator_free(segs, index, views),)


def _views(offloads):
    """The library's address ranges that PyTorch's pools take segments in:
    the optimizer step's view of the pages (vmmrt.torch.optmem) and the
    graphs' pool on a slot (vmmrt.torch.graphpool), whose segments are
    addresses (one pool per use: several times what its pages hold) over
    memory counted in "slots"."""
    out = []
    for o in offloads:
        om = getattr(getattr(o, "memplan", None), "optimizer", None)
        if om is not None and om.view is not None:
            out.append((om.view.address, om.view.address + om.view.size))
        gp = getattr(o, "graph_pool", None)
        if gp is not None:
            out.append((gp.backing.address, gp.backing.address + gp.backing.nbytes))
    return out


def _slot_bytes(offloads):
    """libvmmrt's device bytes on slots other than the activations' (gradients,
    resident activations): Offload.stats()["slot_bytes"], summed; None when no
    offload reports it (a vmmrt.torch that maps no such slot)."""
    total = None
    for o in offloads:
        n = o.stats().get("slot_bytes")
        if n is not None:
            total = (total or 0) + n
    return total


def snapshot(offloads=(), device=None):
    """Driver-level used memory and its parts, in bytes (CUDA only).

    "vmmrt" is what libvmmrt maps for activations (slots or banks), "slots"
    what it maps beside them (None when the offloads do not report it), and
    "other" the rest of the driver's count: context, libraries, other
    processes."""
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    with torch.cuda.device(dev):
        free, total = torch.cuda.mem_get_info()
        pool, pool_free, other, other_free = _pool_bytes(dev.index, _views(offloads))
    acts = sum(o.device_bytes() for o in offloads)
    slots = _slot_bytes(offloads)
    used = total - free
    known = (pool or 0) + other + acts + (slots or 0)
    return {"used": used, "total": total, "graph_pool": pool, "graph_pool_free": pool_free, "allocator": other,
            "allocator_free": other_free, "vmmrt": acts, "slots": slots, "other": used - known}


def describe(snap):
    pool = snap["graph_pool"]
    slots = snap.get("slots")
    free = snap.get("graph_pool_free")
    pool_text = "?" if pool is None else "%.0f" % (pool / MiB) + ("" if not free else " (%.0f free)" % (free / MiB))
    afree = snap.get("allocator_free")
    alloc_text = "%.0f" % (snap["allocator"] / MiB) + ("" if not afree else " (%.0f free)" % (afree / MiB))
    return ("used %.0f MiB = graph pool %s + caching allocator %s + libvmmrt %.0f%s + other %.0f"
            % (snap["used"] / MiB, pool_text, alloc_text,
               snap["vmmrt"] / MiB, "" if slots is None else " + libvmmrt's other slots %.0f" % (slots / MiB),
               snap["other"] / MiB))


def driver_used(device=None):
    """Driver-level used memory of a CUDA device now (total - free, cuMemGetInfo), in bytes."""
    index = torch.device(device).index if device is not None else None
    if index is None:
        index = torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    return total - free


class PeakSampler:
    """The peak of driver-level used memory over a stretch of work, sampled by
    a background thread::

        with PeakSampler() as s:
            step()
            torch.cuda.synchronize()   # the work must end inside the block
        print(s.peak, s.rate_hz)

    The thread reads ``total - free`` (torch.cuda.mem_get_info on the device)
    in a loop with a short sleep (``interval_s``) and keeps the largest
    reading, with one reading at start() and one at stop() so that even a
    stretch shorter than a sample has a peak. What it can see is what the
    driver counts: cudaMalloc/cudaFree of the caching allocator, libvmmrt's
    maps and releases, made by host threads; so the block must also wait for
    the device, or the work queued last is not sampled.

    The readings cost the main thread a little: each one takes the GIL (the
    torch calls that launch work release it, so the thread gets it often) and
    makes a driver call. Time the work in other runs than the sampled ones.
    How often it really sampled is measured (``samples``, ``rate_hz``, and
    ``max_gap_s``, the longest time between two readings: what a spike must
    last to be sure to be seen); report it with the peak.

    Without CUDA (or with ``device=None`` on a machine without it) the
    sampler is a no-op: start/stop work, ``peak`` is None and no thread
    runs. ``read`` replaces the reading (a function returning bytes), for
    tests and for other counters.
    """

    def __init__(self, device=None, interval_s=50e-6, read=None, where=None):
        self.interval_s = interval_s
        self._read = read
        # where(): called right after a reading that is a new peak, from the
        # sampling thread; what it returns is kept as ``peak_where`` (the
        # step's phase and the caching allocator's share: where a peak
        # above another's was made)
        if where is not None and not callable(where):
            raise TypeError("PeakSampler(where=%r): a callable, or None" % (where,))
        self._where = where
        if read is None and torch.cuda.is_available():
            index = torch.device(device).index if device is not None else None
            if index is None:
                index = torch.cuda.current_device()
            self._read = lambda: driver_used(index)
        self._thread = None
        self._reset()

    @property
    def active(self):
        """Whether anything is sampled (False: no CUDA and no ``read``)."""
        return self._read is not None

    def _reset(self):
        self.peak = self.start_bytes = self.end_bytes = self.peak_where = None
        self.samples = 0
        self.max_gap_s = 0.0
        self.duration_s = 0.0
        self._t0 = None

    def start(self):
        if self._thread is not None:
            raise RuntimeError("PeakSampler.start(): already sampling")
        self._reset()
        if not self.active:
            return self
        self._stop = threading.Event()
        self.start_bytes = self.peak = self._read()
        self._mark()
        self._t0 = self._last = time.perf_counter()
        self.samples = 1
        self._thread = threading.Thread(target=self._loop, name="vmmrt-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        read, stop, interval = self._read, self._stop, self.interval_s
        while not stop.is_set():
            v = read()
            now = time.perf_counter()
            # Only this thread writes these until stop() has joined it.
            self.samples += 1
            self.max_gap_s = max(self.max_gap_s, now - self._last)
            self._last = now
            if v > self.peak:
                self.peak = v
                self._mark()
            time.sleep(interval)

    def _mark(self):
        if self._where is not None:
            try:
                self.peak_where = self._where()
            except Exception as e:  # noqa: B902 - the sampling thread goes on: the peak counts more
                self.peak_where = {"error": "%s: %s" % (type(e).__name__, e)}

    def stop(self):
        """End sampling (after a last reading); returns the peak in bytes (None: inactive)."""
        if self._thread is None:
            return self.peak
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.end_bytes = self._read()
        now = time.perf_counter()
        self.samples += 1
        self.max_gap_s = max(self.max_gap_s, now - self._last)
        if self.end_bytes > self.peak:
            self.peak = self.end_bytes
            self._mark()
        self.duration_s = now - self._t0
        return self.peak

    @property
    def rate_hz(self):
        return self.samples / self.duration_s if self.duration_s > 0 else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def as_dict(self):
        """Every number, for reports: bytes, counts and seconds."""
        return {"peak": self.peak, "start": self.start_bytes, "end": self.end_bytes, "samples": self.samples,
                "duration_s": self.duration_s, "rate_hz": self.rate_hz, "max_gap_s": self.max_gap_s,
                "interval_s": self.interval_s, "where": self.peak_where}

# SPDX-License-Identifier: LGPL-2.1-or-later
"""Whether a captured graph can wait on an event the copy stream records
outside it (an external wait node) and record one the copy stream waits
on (an external record node), with torch's Event(external=True): what
per-tensor copies inside a layer's graphs (sub-layer banks, smaller than a
whole layer's saved bytes) would stand on. Each of three graphs (both
nodes; no wait; no record) is replayed 8 times against a 256 MiB copy;
a wrong value read is a node that does not order what it should.

    python3 python/tests/gpu_probe_external_events.py
"""
import sys

import torch

if not torch.cuda.is_available():
    print("gpu_probe_external_events: skipped (needs CUDA)")
    sys.exit(0)
print("torch", torch.__version__, flush=True)
try:
    torch.cuda.Event(external=True)
except TypeError as e:
    print("no external events in this torch:", e)
    sys.exit(0)
n = (256 << 20) // 4
host = torch.empty(n, pin_memory=True)
buf = torch.zeros(n, device="cuda")
out = torch.zeros(2, device="cuda")
cs, s = torch.cuda.Stream(), torch.cuda.Stream()


def make(wait, record):
    loaded, consumed = torch.cuda.Event(external=True), torch.cuda.Event(external=True)
    # torch creates a CUDA event at its first record: waiting on one never
    # recorded does nothing, so a capture would hold no wait node at all
    # (the probe's first run, H100: every replay read the buffer before
    # the copy, in each of the three graphs)
    loaded.record(cs)
    consumed.record(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        if wait:
            torch.cuda.current_stream().wait_event(loaded)
        out[0:1].copy_(buf[-1:])          # the last element the copy writes
        torch.cuda._sleep(20_000_000)     # ~10 ms: the copy stream must not overwrite before the next read
        out[1:2].copy_(buf[-1:])
        if record:
            consumed.record()
    return g, loaded, consumed


for wait, record in ((True, True), (False, True), (True, False)):
    g, loaded, consumed = make(wait, record)
    torch.cuda.synchronize()
    bad = 0
    for i in range(1, 9):
        cs.synchronize()
        host.fill_(float(i))
        with torch.cuda.stream(cs):
            if i > 1:
                cs.wait_event(consumed)
            buf.copy_(host, non_blocking=True)
            loaded.record(cs)
        with torch.cuda.stream(s):
            g.replay()
        with torch.cuda.stream(cs):       # the next load, queued at once: must wait for the graph's reads
            cs.wait_event(consumed)
            buf.fill_(-1.0)
        torch.cuda.synchronize()
        got = out.tolist()
        bad += got != [float(i), float(i)]
        if i <= 2 or got != [float(i), float(i)]:
            print("  wait=%s record=%s replay %d: read %s (expected %d, %d)" % (wait, record, i, got, i, i))
    print("wait node %s, record node %s: %d of 8 replays read a wrong value" % (wait, record, bad), flush=True)

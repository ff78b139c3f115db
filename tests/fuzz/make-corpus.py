#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Writes the seed corpus of the API fuzzer (tests/fuzz/corpus/).

Each seed is a program in the byte code of fuzz-api.c: two configuration
bytes, then steps of (operation, group, slot, arguments...). The seeds reach
the steady state of both strategies at once, so the fuzzer mutates from there.
Run from the top of the tree: python3 tests/fuzz/make-corpus.py
"""
import os

OP = dict(group=0, discover=1, allocate=2, begin=3, save=4, end=5, fb=6, fe=7, bb=8, be=9, sync=10,
          slot=11, map=12, unmap=13, sdestroy=14, fill=15, copy=16, stats=17, errors=18, options=19,
          graph=20, host=21, recreate=22, fault=23, hostfn=24, iterate=25, capture=26, nulls=27)
FAIL = ["cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemAddressReserve", "cuMemHostAlloc",
        "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuStreamWaitEvent", "cuStreamWaitValue32", "cuEventRecord",
        "cuLaunchHostFunc", "cuGraphLaunch", "cuStreamCreate", "cuEventCreate", "cuStreamBeginCapture",
        "cuStreamEndCapture", "cuLaunchKernel", "cuEventQuery"]


def cfg(mode, lookahead=1, workers=1, pool=0, cap=0, retries=1):
    a = mode | (lookahead << 2) | ((workers - 1) << 4) | (pool << 5)
    return bytes([a, cap | (retries << 2)])


def step(op, g=0, s=0, *args):
    return bytes([OP[op], g, s] + list(args))


def discover(g, words, ndim=1, big=False):
    """A tensor of `words` 8-byte words (times 64 if big)."""
    return step("discover", g, 0, (0x80 if big else 0) | (ndim << 3), words & 0xff, words >> 8, 1, *([2] * ndim))


def model(groups=3, words=(1024, 512, 2048, 256), big=False):
    p = b""
    for i in range(groups):
        p += step("group", 0, 0, 1)
    for i in range(groups):
        p += discover(i, words[i % len(words)], big=big)
        if i == 1:
            p += discover(i, 128, ndim=2)
    p += step("allocate") + step("capture")
    return p


EDGE = dict(all=0, schedule=1, abort=2, rediscover=3, retired=4, async_slot=5)


def edge(what, g=0, s=0, *args):
    """Operation 27 with the group byte's top bit: an edge (fuzz-api.c, edge_step)."""
    return step("nulls", 0x80 | g, s, EDGE[what], *args)


def groups_discovered(groups=3, words=(1024, 512, 2048, 256)):
    p = b""
    for i in range(groups):
        p += step("group", 0, 0, 1)
    for i in range(groups):
        p += discover(i, words[i % len(words)])
    return p


def write(name, data, where="corpus"):
    with open(os.path.join("tests/fuzz", where, name), "wb") as f:
        f.write(data)


os.makedirs("tests/fuzz/corpus", exist_ok=True)
for mode, mname in ((0, "pingpong"), (1, "remap"), (2, "none")):
    write(f"{mname}-3-groups", cfg(mode) + model() + step("iterate", 0, 0, 2) + step("sync"))
write("remap-lookahead-2", cfg(1, lookahead=2, workers=2, pool=1) + model(4) + step("iterate", 0, 0, 2) +
      step("stats", 0, 0, 1, 3) + step("iterate", 0, 0, 1) + step("sync"))
write("pingpong-lookahead-0", cfg(0, lookahead=0) + model(4) + step("iterate", 0, 0, 2) + step("sync"))
# Reproduces a known library bug (tests/fuzz/known/README): not in the corpus yet.
write("remap-map-fails", cfg(1) + model() + step("fault", 0, 0, FAIL.index("cuMemMap"), 3) +
      step("iterate", 0, 0, 2) + step("sync"), where="known")
write("remap-oom", cfg(1, retries=2) + model() + step("fault", 0, 0, FAIL.index("cuMemCreate"), 2 | (4 << 4)) +
      step("iterate", 0, 0, 2) + step("sync"))
write("pingpong-copy-fails", cfg(0) + model() + step("iterate", 0, 0, 0) +
      step("fault", 0, 0, FAIL.index("cuMemcpyDtoHAsync"), 1) + step("iterate", 0, 0, 1))
write("tight-memory", cfg(1, cap=1) + model(4, words=(2000, 2000, 2000, 2000), big=True) + step("iterate", 0, 0, 1) +
      step("sync"))
write("slots", cfg(0) + step("slot", 0, 0, 0, 4) + step("map", 0, 0) + step("fill", 0, 0, 0, 2, 7) +
      step("copy", 0, 0, 1) + step("copy", 0, 0, 0) + step("unmap", 0, 0) + step("unmap", 0, 0) +
      step("map", 0, 0) + step("sdestroy", 0, 0) + step("slot", 0, 1, 0, 1) + step("nulls"))
write("graphs-and-host", cfg(1) + step("graph", 0, 0, 0, 5) + step("graph", 0, 0, 0, 1) + step("graph", 0, 0, 0, 0) +
      step("host", 0, 0, 0, 0x10, 0x00, 0) + step("host", 0, 0, 0) + step("hostfn") + step("errors"))
write("options", cfg(2) + step("options", 0, 0, 5, 3, *b"lookahead"[:5], *b"7x9", 4, 1) +
      step("options", 0, 0, 9, 2, *b"timeout_m", *b"-1", 8, 0))
write("recreate-mid-iteration", cfg(1) + model() + step("iterate", 0, 0, 0) + step("fb", 0, 0, 1) +
      step("recreate", 0, 0, 0x05, 0x00) + model(2) + step("iterate", 0, 0, 1))
write("out-of-order", cfg(0) + model() + step("bb", 0) + step("fb", 1, 0, 1) + step("fb", 1, 0, 1) + step("fe", 2) +
      step("iterate", 0, 0, 1) + step("bb", 2) + step("fb", 2, 0, 1) + step("fe", 2) + step("begin", 1) +
      step("save", 1, 0, 0x40) + step("end", 1))

# Issue 23: every call's zero, NULL and one-past-the-end arguments in every
# state a program reaches, and the empty schedule that crashed.
for mode, mname in ((0, "pingpong"), (1, "remap"), (2, "none")):
    write(f"edges-every-state-{mname}", cfg(mode) + edge("all") + step("group", 0, 0, 1) + step("group", 0, 0, 1) +
          edge("all") + discover(0, 1024) + discover(1, 512) + edge("all") + step("allocate") + edge("all") +
          step("capture") + edge("all") + step("fb", 0, 0, 1) + edge("all") + step("fe", 0) + step("fb", 1, 0, 1) +
          step("fe", 1) + step("bb", 1) + edge("all") + step("be", 1) + step("bb", 0) + step("be", 0) +
          edge("all") + step("iterate", 0, 0, 1) + step("fb", 0, 0, 1) + edge("abort") + edge("all") +
          step("iterate", 0, 0, 1) + step("sync") + edge("all"))
    write(f"empty-schedule-{mname}", cfg(mode) + groups_discovered() + edge("schedule", 0, 0, 0) + step("allocate") +
          step("capture") + step("iterate", 0, 0, 2) + step("sync"))
write("empty-schedule-no-groups", cfg(0) + edge("schedule", 0, 0, 0) + step("allocate") + step("iterate", 0, 0, 1) +
      edge("all"))
write("declared-schedule-abort", cfg(0, lookahead=2) + groups_discovered(4) + edge("schedule", 0, 0, 0x80) +
      step("allocate") + step("capture") + step("iterate", 0, 0, 0) + step("fb", 0, 0, 1) + step("fe", 0) +
      step("fb", 1, 0, 1) + edge("abort") + step("iterate", 0, 0, 1) + edge("abort") + edge("all") + step("sync"))
write("schedule-one-past-the-end", cfg(1) + groups_discovered(2) +
      edge("schedule", 0, 0, 4, 0, 0, 2, 0, 1, 1, 0, 1) +        # group 2 of 2: NULL
      edge("schedule", 0, 0, 4, 0, 0, 1, 0, 1, 2, 0, 1) +        # backward 2
      edge("schedule", 0, 0, 4, 0, 1, 0, 0, 1, 0, 1, 1) +        # a backward before its forward
      edge("schedule", 0, 0, 9) + step("allocate") + step("capture") + step("iterate", 0, 0, 1) +
      edge("schedule", 0, 0, 0x80) + step("sync"))
write("rediscover-and-retire", cfg(1) + model() + step("iterate", 0, 0, 1) + step("fb", 0, 0, 1) + edge("rediscover", 1) +
      edge("abort") + edge("rediscover", 1) + discover(1, 3000) + edge("all") + step("allocate") + step("capture") +
      step("iterate", 0, 0, 1) + edge("retired") + step("iterate", 0, 0, 1) + edge("retired") + step("sync"))
write("async-slots", cfg(0) + step("slot", 0, 1, 0, 4) + edge("async_slot", 0, 1) + step("fill", 0, 1, 0, 2, 7) +
      edge("async_slot", 0, 1) + edge("async_slot", 0, 1) + step("fill", 0, 1, 0, 2, 7) + edge("async_slot", 0, 1) +
      step("sdestroy", 0, 1) + edge("async_slot", 0, 2) + edge("all"))

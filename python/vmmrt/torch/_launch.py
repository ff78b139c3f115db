# SPDX-License-Identifier: LGPL-2.1-or-later
"""How a graphed call runs a graph between its layer's hooks, decided per graph.

The library can make a use's begin hook, the graph's launch and its end hook
in one call (vmmrt_group_replay) when torch gives the graph's executable
handle (CUDAGraph.raw_cuda_graph_exec: torch 2.11 has it, 1.13 not): one crossing
instead of the hooks' Python and torch's replay. Torch's ``replay()`` also
advances the philox offset of the generators registered with the graph; a
raw launch does not, so a graph that draws random numbers (dropout) would
draw the same ones at every call. Torch gives no way to ask a captured graph
whether it draws any, so the first call replays through torch and compares
the generators' offsets before and after: a graph that moved none launches
raw from then on. Torch's replay stays for the host backend (its graphs are
not CUDA graphs), for torch without the handle, for the generators a user
registers (``generators=``: theirs to advance), for recomputed layers
(vmmrt.torch.recompute registers cloned generator states with their graphs)
and where memory is mapped per use (Offload.maps_per_use: until the memory
plan binds every slot, and after a conflict). A Launcher holds
its graph: torch destroys the executable graph with it.
"""
import torch

# Launcher.how, as describe() shows it.
RAW = "vmmrt_group_replay"
PROBING = "torch replay (the first, to learn whether the graph draws random numbers)"
NOT_INSTANTIATED = ("not instantiated (a graph instantiated at its first replay, through torch, which learns "
                    "whether it draws random numbers)")
# Launcher.exec of a graph not instantiated yet (_compat.deferred_graph): no
# handle until its first replay (probe) makes one.
_NOT_YET = -1


MAPPED = ("torch replay (memory mapped per use: a map follows the events recorded between a use's begin hook "
          "and its graph)")


class Launcher:
    """One graph's way: ``exec`` > 0: the handle the library launches, in
    the one call of the use (the hooks, Offload.flush where releases fell
    due, the memory plan's check of the resident slot, nothing else);
    0: torch's replay, for the reason in ``how``; < 0: the handle, not yet
    used, after a first replay through torch (:meth:`probe`), or _NOT_YET:
    a graph instantiated at its first replay (_compat.deferred_graph), whose
    handle that replay makes. Memory mapped per use keeps torch's replay
    until the memory plan has put every slot on its pages for good
    (:meth:`reconsider`), and again from a conflict on (:meth:`map_again`)."""
    __slots__ = ("exec", "how", "graph", "gens", "off", "generators", "recomputed")

    def __init__(self, graph, off, generators, recomputed=False):
        self.graph, self.off, self.generators, self.recomputed = graph, off, generators, recomputed
        self._decide()

    def _decide(self):
        off = self.off
        self.gens, self.exec = (), 0
        if off.host:
            self.how = "torch replay (host backend)"
        elif self.generators:
            self.how = "torch replay (generators= registered with the graph)"
        elif self.recomputed:
            self.how = "torch replay (recomputed: its graphs advance generator states of their own)"
        elif off.maps_per_use():
            self.how = MAPPED
        elif not hasattr(self.graph, "raw_cuda_graph_exec"):
            self.how = "torch replay (this torch has no CUDAGraph.raw_cuda_graph_exec)"
        else:
            deferred = getattr(self.graph, "vmmrt_deferred", False)
            h = _handle(self.graph)
            if h == 0 and not deferred:
                self.how = "torch replay (no executable graph)"     # (nothing to replay: torch's replay says so)
            else:
                self.exec, self.how = (-h, PROBING) if h else (_NOT_YET, NOT_INSTANTIATED)
                self.gens = tuple(torch.cuda.default_generators)

    def reconsider(self):
        """The memory plan has put every slot on its pages: a graph that kept
        torch's replay only for memory mapped per use decides again."""
        if self.how == MAPPED:
            self._decide()

    def map_again(self):
        """A slot left the plan's pages (a conflict): its maps follow the
        events of the hooks' path again, so torch's replay until the slot is
        back (:meth:`reconsider`)."""
        if self.exec != 0:
            self.exec, self.how = 0, MAPPED

    def probe(self):
        """The first call's replay, through torch: the graph launches raw from
        the next call on unless a generator's offset moved."""
        before = [g.get_offset() for g in self.gens]
        self.graph.replay()
        if [g.get_offset() for g in self.gens] != before:
            self.exec, self.how = 0, "torch replay (the graph draws random numbers)"
            return
        h = _handle(self.graph) if self.exec == _NOT_YET else -self.exec    # (that replay instantiated it)
        self.exec, self.how = (h, RAW) if h else (0, "torch replay (no executable graph)")


def _handle(graph):
    """``graph``'s executable handle, or 0 where it has none (not captured,
    or not instantiated yet)."""
    try:
        return int(graph.raw_cuda_graph_exec())
    except RuntimeError:
        return 0


def summary(launchers):
    """{how: graphs} over an offload's launchers (describe(), stats())."""
    out = {}
    for l in launchers.values():
        out[l.how] = out.get(l.how, 0) + 1
    return out

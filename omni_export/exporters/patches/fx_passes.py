"""Two fixed costs of torch's graph passes, removed without changing what they produce.

1. FX node provenance without the quadratic copy.

Every pass that retraces a graph (torch.export's decompositions, each of ExecuTorch's edge and
XNNPACK passes, run once per delegated partition) gives each new node `meta["from_node"]`:
a NodeSource for the node it came from, which in torch 2.13 *deep-copies* that node's whole
from_node history. The history grows by one level per pass, so the copying grows with the square
of the pass count: lowering the demo Code2Wav graph (677 nodes, 23 XNNPACK partitions, ~17 passes
each) spent 23 of 125 profiled seconds in those deep copies.

NodeSource objects are never changed after they are made (torch and ExecuTorch only read them,
to name a node's origin and to find debug handles), so sharing the older levels instead of
copying them records the same history. `shared_provenance()` does that for the span of a build;
the lowered program is byte-for-byte the one made without it (tests/test_fxmeta.py).

2. The CompositeImplicitAutograd op set, collected once. Every run_decompositions (torch.export's,
to_edge's, one per XNNPACK partition, the ONNX exporter's) walks every registered operator of every
namespace to list the CIA ops it may keep: ~0.3 s a call, whatever the graph's size, and much of the
lowering time of a small graph (a 3-layer fp16 .pte, the third lowering in a process, single runs:
8.4 -> 6.7 s). torch does not cache it because a custom op registered later adds to the set; `cached_cia_ops()` keys its cache on the dispatcher's
CIA registrations and the op namespaces, so a new registration is a new walk.

`fast_passes()` applies both for the span of a build.
"""
from __future__ import annotations

import contextlib
import threading

import torch

PINNED = {"torch": "2.13.0"}
TARGETS = ("torch.fx.traceback:NodeSource.__init__",
           "torch._export.utils:_collect_all_valid_cia_ops",
           "torch.export.exported_program:_collect_all_valid_cia_ops",
           "torch.export.decomp_utils:_collect_all_valid_cia_ops")

_lock = threading.Lock()
_depth = 0
_original = None


def _init_sharing_history(self, node, pass_name="", action=None):
    history = node.meta.get("from_node") if node is not None else None
    if not history:
        _original(self, node, pass_name, action)
        return
    node.meta["from_node"] = []          # the original deep-copies this; hand it nothing to copy
    try:
        _original(self, node, pass_name, action)
    finally:
        node.meta["from_node"] = history
    self.from_node = list(history)       # a new list of the same (never-mutated) NodeSources


@contextlib.contextmanager
def shared_provenance():
    """Within the block, NodeSource shares its node's from_node history instead of deep-copying it.
    Nests; restores torch's own constructor when the outermost block exits."""
    global _depth, _original
    from torch.fx.traceback import NodeSource

    with _lock:
        if _depth == 0:
            _original = NodeSource.__init__
            NodeSource.__init__ = _init_sharing_history
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                NodeSource.__init__ = _original
                _original = None


_cia_cache: dict = {}


def _collect_cia_ops_cached():
    key = (len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
           tuple(torch.ops._dir))
    ops = _cia_cache.get(key)
    if ops is None:
        _cia_cache.clear()
        ops = _cia_cache[key] = _cia_original()
    return ops


_cia_depth = 0
_cia_original = None


@contextlib.contextmanager
def cached_cia_ops():
    """Within the block, torch._export.utils._collect_all_valid_cia_ops answers from a cache keyed on
    the dispatcher's registrations. Nests; restores torch's function when the outermost block exits."""
    global _cia_depth, _cia_original

    with _lock:
        if _cia_depth == 0:
            _cia_original = _cia_modules()[0]._collect_all_valid_cia_ops
            for m in _cia_modules():          # each imported the function by name
                m._collect_all_valid_cia_ops = _collect_cia_ops_cached
        _cia_depth += 1
    try:
        yield
    finally:
        with _lock:
            _cia_depth -= 1
            if _cia_depth == 0:
                for m in _cia_modules():
                    m._collect_all_valid_cia_ops = _cia_original
                _cia_original = None
                _cia_cache.clear()


def _cia_modules() -> list:
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    return [export_utils, exported_program, decomp_utils]


@contextlib.contextmanager
def fast_passes():
    """shared_provenance() and cached_cia_ops() together."""
    with shared_provenance(), cached_cia_ops():
        yield

"""FX node provenance without the quadratic copy.

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
"""
from __future__ import annotations

import contextlib
import threading

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

"""XNNPACK's preprocessing handed each partition's program with its weights shared, not copied (used by
exporters/executorch.py while lowering a .pte)."""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

PINNED = {"executorch": "1.5.1"}
TARGETS = ("executorch.backends.xnnpack.xnnpack_preprocess:XnnpackBackend.copy_exported_program_for_preprocess",)


@contextlib.contextmanager
def preprocess_shares_weights():
    """Within the block, XNNPACK's preprocessing gets its copy of each partition's program with the
    weights shared, not copied.

    ExecuTorch deep-copies every delegated partition's program before preprocessing it (in case a
    backend changes the graph; BackendDetails.copy_exported_program_for_preprocess), all of them
    before the first is processed: a whole extra copy of the lowered weights beside the program's
    own and the serialized ones. Lowering the 0.6B talker decode step to an fp16 .pte, memray
    attributed 0.83 GiB alive at the peak to that deepcopy -- one of its three copies of the fp16
    weights. XNNPACK's preprocessing reads the constants and serializes them; it does not write
    them, so the copy keeps a graph and state dict of its own whose tensors are new objects over
    the same storage (ExecuTorch's CUDA backend shares them the same way in its low-memory mode).
    The .pte is byte-for-byte the one made with the copies (tests/test_exporters.py)."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    own = XnnpackBackend.__dict__.get("copy_exported_program_for_preprocess")

    def copy_sharing(cls, edge_program, compile_specs):
        memo = {}
        for t in list(edge_program.state_dict.values()) + list(edge_program.constants.values()):
            if isinstance(t, torch.Tensor) and id(t) not in memo:
                memo[id(t)] = (nn.Parameter(t.detach(), requires_grad=t.requires_grad)
                               if isinstance(t, nn.Parameter) else t.detach())
        return copy.deepcopy(edge_program, memo)

    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(copy_sharing)
    try:
        yield
    finally:
        if own is None:
            del XnnpackBackend.copy_exported_program_for_preprocess
        else:
            XnnpackBackend.copy_exported_program_for_preprocess = own

"""XNNPACK's preprocessing handed each partition's program with its weights shared, not copied, and its
convolution weights serialized in their own dtype (used by exporters/executorch.py while lowering a .pte)."""
from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

PINNED = {"executorch": "1.5.1"}
TARGETS = ("executorch.backends.xnnpack.xnnpack_preprocess:XnnpackBackend.copy_exported_program_for_preprocess",
           "executorch.backends.xnnpack.operators.node_visitor:_node_visitor_dict",
           "executorch.backends.xnnpack.operators.node_visitor:NodeVisitor.define_tensor")


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


@contextlib.contextmanager
def conv_weights_keep_fp16():
    """Within the block, XNNPACK's convolution visitor serializes an fp16 filter and bias as fp16.

    ExecuTorch 1.5.1's Conv2d visitor (operators/op_conv2d.py) defines both with force_fp32=True, so
    NodeVisitor.get_serialized_buffer_index converts every fp16 convolution weight to fp32 and keeps those
    bytes in the NamedDataStore until the .pte is written: the fp16 .pte stores convolution weights at 4
    bytes each and XNNPACK's runtime converts them back to fp16 when it packs them (linear weights are
    serialized in their own dtype). Four 0.6B-width decoder layers with every linear a `SplitLinear`
    grouped convolution (104 MB of fp16 weights): lowering peaked at 686 MB RssAnon against 515 for plain
    linears and wrote a 208 MB .pte; with fp16 filters, 545 MB and 104 MB, the same outputs on this host's
    runtime. Transposed convolutions keep fp32 filters (the runtime's deconvolution refuses fp16 ones:
    "Failed to create deconvolution node", xnn_status_invalid_parameter), as do quantized filters and
    other dtypes."""
    import executorch.backends.xnnpack.operators  # noqa: F401  (registers the node visitors)
    from executorch.backends.xnnpack.operators.node_visitor import _node_visitor_dict

    from .fx_passes import _nested

    conv = _node_visitor_dict["aten.convolution.default"]    # op_conv2d.Conv2d: the decorator returns None
    own = conv.__dict__["define_node"]

    def define_node(self, node, *args, **kwargs):
        if node.args[6]:        # transposed: XNNPACK's deconvolution rejects an fp16 filter (invalid_parameter)
            return own(self, node, *args, **kwargs)

        def define_tensor(tensor, *a, force_fp32=False, **k):
            val = tensor.meta.get("val")
            if force_fp32 and k.get("quant_params") is None and isinstance(val, torch.Tensor) \
                    and val.dtype == torch.float16 and not _read_by_transposed(tensor):
                force_fp32 = False
            return type(self).define_tensor(self, tensor, *a, force_fp32=force_fp32, **k)

        before = self.__dict__.get("define_tensor")
        self.define_tensor = define_tensor
        try:
            return own(self, node, *args, **kwargs)
        finally:
            if before is None:
                self.__dict__.pop("define_tensor", None)
            else:
                self.define_tensor = before

    def install():
        conv.define_node = define_node

    def restore():
        conv.define_node = own

    with _nested("conv_weights_keep_fp16", install, restore):
        yield


def _read_by_transposed(tensor) -> bool:
    """Whether a transposed convolution also reads this weight (it is serialized once, for whichever
    convolution is defined first, and the deconvolution must get it as fp32)."""
    return any(u.op == "call_function" and "convolution" in str(u.target) and len(u.args) > 6 and u.args[6]
               for u in getattr(tensor, "users", ()))

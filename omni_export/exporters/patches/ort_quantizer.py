"""ONNX Runtime's QDQ quantizer and MinMax calibrator with their quadratic scans made linear (used by
exporters/onnx.py quantize_qdq and activation_ranges). The QDQ model is the same (tests/test_qdq_options.py)."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

PINNED = {"onnxruntime": "1.32.0"}
TARGETS = ("onnxruntime.quantization.onnx_model:ONNXModel.replace_node_input",
           "onnxruntime.quantization.onnx_model:ONNXModel.replace_input_of_all_nodes",
           "onnxruntime.quantization.onnx_model:ONNXModel.replace_input_of_nodes",
           "onnxruntime.quantization.quant_utils:find_by_name",
           "onnxruntime.quantization.qdq_quantizer:find_by_name",
           "onnxruntime.quantization.base_quantizer:find_by_name",
           "onnxruntime.quantization.onnx_model:find_by_name",
           "onnxruntime.quantization.calibrate:MinMaxCalibrater.augment_graph",
           "onnxruntime.quantization.calibrate:MinMaxCalibrater.select_tensors_to_calibrate",
           "onnxruntime.quantization.calibrate:load_model_with_shape_infer",
           "onnxruntime.quantization.calibrate:CalibraterBase.create_inference_session")


@contextlib.contextmanager
def linear_quantizer():
    """ONNX Runtime's QDQ quantizer, with a tensor -> consuming nodes index while it runs.

    For every activation it quantizes, the quantizer rewires the consumers with
    `ONNXModel.replace_input_of_all_nodes`, a scan of every node of the graph: quadratic in the graph's
    size. The 0.6B fused predictor frame (15 unrolled decoder steps) sat in it for over 20 minutes of
    its w8a16 quantization. Here the scan is a lookup: consumers are indexed once, nodes the quantizer
    appends are indexed as they appear, and every input it rewires (also through `replace_node_input`
    and `replace_input_of_nodes`) moves its node in the index. If the node list was rebuilt (not
    appended to) the index is rebuilt. `find_by_name`, which it calls per tensor over the initializers
    (two more per quantized tensor), gets a name index the same way (`_NameIndex`). The QDQ model is
    the same (tests/test_qdq_options.py)."""
    from collections import defaultdict

    from onnxruntime.quantization import base_quantizer, onnx_model, qdq_quantizer, quant_utils
    from onnxruntime.quantization.onnx_model import ONNXModel

    saved = {k: ONNXModel.__dict__[k] for k in ("replace_node_input", "replace_input_of_all_nodes",
                                                 "replace_input_of_nodes")}
    plain_replace = saved["replace_node_input"].__func__
    live: list[dict] = []

    def consumers(self) -> dict:
        nodes = self.model.graph.node
        idx = self.__dict__.get("_omni_consumers")
        if (idx is None or idx["graph"] is not self.model.graph or idx["n"] > len(nodes)
                or (idx["n"] and nodes[0] is not idx["first"])):
            if idx in live:
                live.remove(idx)
            idx = {"graph": self.model.graph, "n": 0, "first": None, "by": defaultdict(list)}
            self._omni_consumers = idx
            live.append(idx)
        for node in nodes[idx["n"]:]:
            for name in node.input:
                idx["by"][name].append(node)
        idx["n"], idx["first"] = len(nodes), (nodes[0] if len(nodes) else None)
        return idx["by"]

    def replace_node_input(node, old, new):
        plain_replace(node, old, new)
        for idx in live:                                  # keep every index true to the node's inputs
            if old not in node.input and any(n is node for n in idx["by"].get(old, ())):
                idx["by"][old] = [n for n in idx["by"][old] if n is not node]
            if new in node.input and all(n is not node for n in idx["by"][new]):
                idx["by"][new].append(node)

    def replace_input_of_nodes(self, old, new, names):
        for node in [n for n in consumers(self).get(old, ()) if n.name in names]:
            replace_node_input(node, old, new)

    def replace_input_of_all_nodes(self, old, new):
        for node in list(consumers(self).get(old, ())):
            replace_node_input(node, old, new)

    ONNXModel.replace_node_input = staticmethod(replace_node_input)
    ONNXModel.replace_input_of_nodes = replace_input_of_nodes
    ONNXModel.replace_input_of_all_nodes = replace_input_of_all_nodes
    modules = [m for m in (quant_utils, qdq_quantizer, base_quantizer, onnx_model)
               if getattr(m, "find_by_name", None) is quant_utils.find_by_name]
    plain_find = quant_utils.find_by_name
    names = _NameIndex(plain_find)
    for m in modules:
        m.find_by_name = names
    try:
        with linear_calibrator():
            yield
    finally:
        for k, v in saved.items():
            setattr(ONNXModel, k, v)
        for m in modules:
            m.find_by_name = plain_find


@contextlib.contextmanager
def linear_calibrator():
    """ONNX Runtime's MinMax calibrator with its calibration graph built in one pass
    (`_augment_graph_linear`); for our own range pass (`activation_ranges`) and the quantizer's."""
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    from onnxruntime.quantization import calibrate

    base = calibrate.CalibraterBase
    saved = (MinMaxCalibrater.__dict__["augment_graph"], calibrate.load_model_with_shape_infer,
             base.__dict__["create_inference_session"])
    MinMaxCalibrater.augment_graph = _augment_graph_linear
    calibrate.load_model_with_shape_infer = _load_graph_only
    base.create_inference_session = _calibration_session
    try:
        yield
    finally:
        (MinMaxCalibrater.augment_graph, calibrate.load_model_with_shape_infer,
         base.create_inference_session) = saved


def _calibration_session(self) -> None:
    """CalibraterBase.create_inference_session without pre-packed weights: ONNX Runtime's CPU kernels
    re-lay every constant MatMul / Conv weight into a second buffer at load, for speed over many
    calls; a calibration pass makes a few."""
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_prepacking", "1")
    self.infer_session = onnxruntime.InferenceSession(self.augmented_model_path, sess_options=so,
                                                      providers=self.execution_providers)


def _load_graph_only(model_path: Path):
    """The calibrator's model load (onnxruntime.quantization.quant_utils.load_model_with_shape_infer)
    without external weights: it only adds nodes and outputs, and the session it opens reads the
    weights from the data file. Loaded, they were a second copy beside the session's (1.9 GB for
    the 0.6B talker prefill), and the calibration graph was written out with all of them again."""
    import onnx
    from onnxruntime.quantization.quant_utils import add_infer_metadata, generate_identified_filename

    inferred = generate_identified_filename(Path(model_path), "-inferred")
    onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred))
    model = onnx.load(inferred.as_posix(), load_external_data=False)
    add_infer_metadata(model)
    inferred.unlink()
    return model


def _augment_graph_linear(self) -> None:
    """MinMaxCalibrater.augment_graph in one pass. ONNX Runtime's adds a ReduceMin and a ReduceMax
    (each + Reshape, as graph outputs) per calibrated tensor, each inserted before the tensor's first
    consumer found by a scan of the node list, after rebuilding a dict of every value info: quadratic
    (the 0.6B fused frame's calibration graph was still being built after 10 minutes). The same nodes
    and outputs are placed here in one rebuild of the node list (before each tensor's first consumer;
    tensors come from a set, so upstream's order between them is arbitrary too)."""
    import uuid

    import onnx
    from onnx import helper, numpy_helper

    tensors, value_infos = self.select_tensors_to_calibrate(self.model)
    graph = self.model.graph
    shape_name = str(uuid.uuid4())
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), shape_name))
    nodes = list(graph.node)
    first_use: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            first_use.setdefault(name, i)
    before: dict[int, list] = {}
    for tensor in tensors:
        if tensor not in value_infos:
            raise ValueError(f"Unable to guess tensor type for tensor {tensor!r}, "
                             "running shape inference before quantization may resolve this issue.")
        vi = value_infos[tensor]
        for op in ("ReduceMin", "ReduceMax"):
            out = f"{tensor}_{op}"
            reduce = helper.make_node(op, [tensor], [out + "_Reshape"], keepdims=1, name=out)
            if self.per_channel:
                axes = [0, *range(2, len(vi.type.tensor_type.shape.dim))]
                version = next((o.version for o in self.model.opset_import if onnx.defs.has(op, o.domain)), None)
                if version is None:
                    raise RuntimeError(f"Model does not contain a version for '{op}'.")
                if version < 18:
                    reduce.attribute.append(helper.make_attribute("axes", axes))
                else:
                    axes_name = str(uuid.uuid4())
                    reduce.input.append(axes_name)
                    graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
            reshape = helper.make_node("Reshape", [out + "_Reshape", shape_name], [out], name=out + "_Reshape")
            before.setdefault(first_use.get(tensor, len(nodes)), []).extend([reduce, reshape])
            graph.output.append(helper.make_tensor_value_info(out, vi.type.tensor_type.elem_type, [None]))
    graph.ClearField("node")
    for i, node in enumerate(nodes + [None]):
        graph.node.extend(before.get(i, []))
        if node is not None:
            graph.node.append(node)
    # Weights loaded graph-only (`_load_graph_only`) stay references to the model's data file, so
    # the calibration graph is saved beside that file (callers put augmented_model_path there).
    onnx.save(self.model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)


class _NameIndex:
    """find_by_name(name, items) for ONNX Runtime's quantizer: the first item called `name`, looked up in
    a name index of the protobuf container instead of a scan. Items appended since the last call are
    indexed then; anything else (an item removed or replaced: the item at the old end is no longer the
    one seen there) rebuilds the index. Plain lists are scanned as before."""

    def __init__(self, plain):
        self.plain, self.seen = plain, {}

    def __call__(self, name, items):
        if isinstance(items, (list, tuple)) or not hasattr(items, "__getitem__"):
            return self.plain(name, items)
        entry = self.seen.get(id(items))
        n = len(items)
        if entry is None or entry["items"] is not items or n < entry["n"] or (
                entry["n"] and items[entry["n"] - 1] is not entry["last"]):
            entry = self.seen[id(items)] = {"items": items, "n": 0, "last": None, "by": {}}
        by = entry["by"]
        for item in items[entry["n"]:]:
            by.setdefault(item.name, item)
        entry["n"], entry["last"] = n, (items[n - 1] if n else None)
        hit = by.get(name)
        if hit is not None and hit.name != name:          # renamed in place: start over
            del self.seen[id(items)]
            return self.plain(name, items)
        return hit

"""ONNX: export (torch dynamo exporter), fp16 conversion, QDQ quantization for the HTP.

Knows the format, never the model: every function takes a program or a file and tensors by name.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..core import Precision
from . import onnxfile
from .patches.onnxscript_rules import linear_rewrites
from .patches.ort_quantizer import linear_calibrator, linear_quantizer

OPSET = 21
# Graphs with more weight than this are exported with external data even below the 2 GB line: the
# exporter then streams each tensor to disk instead of building the whole model as one protobuf
# (and its serialised copy), and the fp16 conversion reads the fp32 weights from a memory map one
# tensor at a time. Measured on the 0.6B talker_decode (1.7 GB fp32): inline, the ONNX export
# peaked 3.1 GiB and the fp16 conversion 6.6 GiB above the loaded model.
_STREAM_BYTES = 256 << 20


def export(program, path: Path, input_names: Sequence[str], output_names: Sequence[str]) -> Path:
    """Export a torch.export ExportedProgram to ONNX (weights inline below ~1.8 GB)."""
    import torch

    from ..memory import tensor_bytes

    weight_bytes = tensor_bytes([*program.state_dict.values(),
                                 *(t for t in program.constants.values() if isinstance(t, torch.Tensor))])
    path.parent.mkdir(parents=True, exist_ok=True)
    _quiet_exporter()
    big = weight_bytes > min(onnxfile.EXTERNAL_DATA_BYTES, _STREAM_BYTES)
    from .patches.fx_passes import fast_passes

    with fast_passes(), linear_rewrites():
        onnx_program = torch.onnx.export(program, (), None, opset_version=OPSET, dynamo=True, verbose=False)
    model = onnx_program.model_proto if not big else None
    if model is None:                        # large: save with external data, then rename in place
        onnx_program.save(str(path), external_data=True)
        import onnx

        model = onnx.load(str(path), load_external_data=False)
    name_io(model, input_names, output_names)
    strip_source_paths(model)
    if not big:
        fold_weight_layouts(model)
        share_equal_weights(model)
        onnxfile.save(model, path)
    elif fold_shared_transposes(model, path) == 0:
        import onnx

        onnx.save(model, str(path))
    return path


def share_equal_weights(model) -> int:
    """Make the initializers (held in the model, not external) of equal type, shape and bytes one,
    read by every node that read any of them; returns how many were dropped.

    The exporter folds a small weight's Transpose once per reader: the fused predictor frame reads each
    decoder weight in 15 unrolled steps, and the demo's frame held 15 copies of each (tiny: 210
    MatMul weights for 14). Quantized, each copy got its own scale; compiled, its own bytes."""
    import hashlib

    g = model.graph
    if _has_subgraphs(g):           # readers inside If / Loop bodies are not renamed here
        return 0
    first: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    for t in g.initializer:
        if len(t.dims) < 2 or not t.HasField("raw_data"):
            continue
        key = (t.data_type, tuple(t.dims), hashlib.sha256(t.raw_data).digest())
        if key in first:
            rename[t.name] = first[key]
        else:
            first[key] = t.name
    outputs = {o.name for o in g.output}
    rename = {a: b for a, b in rename.items() if a not in outputs}
    if not rename:
        return 0
    _rename_inputs(g, rename)
    keep = [t for t in g.initializer if t.name not in rename]
    del g.initializer[:]
    g.initializer.extend(keep)
    return len(rename)


def fold_shared_transposes(model, path: Path) -> int:
    """For a model whose weights are in PATH's external data: fold every Transpose of an initializer
    into a transposed initializer, one per weight and permutation however many nodes read it, and make
    initializers of equal type, shape and bytes one (share_equal_weights' rule); rewrite PATH and its
    data (streamed, a tensor at a time) when either changed anything. Returns how many Transposes and
    copies were removed (0: nothing written).

    The exporter folds a large weight's Transpose only when the weight has one reader, and a small
    one's once per reader: the fused predictor frame's decoder weights, read in 15 unrolled steps,
    stayed fp32 initializers behind Transposes at 0.6B, which the quantizer takes for activations
    (16-bit, one scale per tensor) and the HTP transposes on every call: the frame's w8a16 had 17 %
    of its weight bytes at 8 bits."""
    import hashlib

    import onnx
    from onnx import helper, numpy_helper
    from onnx.external_data_helper import uses_external_data

    g = model.graph
    if _has_subgraphs(g):           # readers inside If / Loop bodies are not renamed here
        return 0
    inits = {i.name: i for i in g.initializer}
    outputs = {o.name for o in g.output}
    src_data = data_file(path)
    base = str(src_data.parent)
    raw = np.memmap(src_data, dtype=np.uint8, mode="r") if src_data.exists() else None

    def digest(t) -> bytes:
        if uses_external_data(t):
            info = _external(t)
            offset, length = int(info.get("offset", 0)), int(info["length"])
            return hashlib.sha256(memoryview(raw[offset:offset + length])).digest()
        return hashlib.sha256(numpy_helper.to_array(t).tobytes()).digest()

    rename: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for t in g.initializer:
        if len(t.dims) >= 2 and t.name not in outputs:
            key = (t.data_type, tuple(t.dims), digest(t))
            if first.setdefault(key, t.name) != t.name:
                rename[t.name] = first[key]
    folds: dict[tuple, str] = {}             # (weight, perm) -> the folded initializer's name
    drop = []
    for n in g.node:
        if n.op_type != "Transpose" or not n.input or rename.get(n.input[0], n.input[0]) not in inits \
                or n.output[0] in outputs:
            continue
        weight = rename.get(n.input[0], n.input[0])
        perm = [helper.get_attribute_value(a) for a in n.attribute if a.name == "perm"]
        key = (weight, tuple(perm[0]) if perm else tuple(reversed(range(len(inits[weight].dims)))))
        rename[n.output[0]] = folds.setdefault(key, n.output[0])
        drop.append(n)
    rename = {a: b for a, b in rename.items() if a != b}
    if not drop and not rename:
        return 0
    for n in drop:
        g.node.remove(n)
    _rename_inputs(g, rename)
    used = {x for n in g.node for x in n.input} | outputs
    out = path.with_name(path.name + ".fold")
    out_data = data_file(out)
    try:
        _write_folded(model, path, out, inits, folds, used, base)
    finally:
        out.unlink(missing_ok=True)
        out_data.unlink(missing_ok=True)
    del raw
    return len(drop) + sum(1 for a in rename if a in inits)


def _has_subgraphs(g) -> bool:
    import onnx

    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute)


def _rename_inputs(g, rename: dict[str, str]) -> None:
    """Every node of `g` that read a name in `rename` reads its new name."""
    for n in g.node:
        for k, x in enumerate(n.input):
            if x in rename:
                n.input[k] = rename[x]


def _write_external(f, name: str, array: np.ndarray, location: str):
    """`array` appended to the open data file `f` (page-aligned, as onnx writes) and the TensorProto
    that points at it in LOCATION."""
    import onnx
    from onnx import helper

    array = np.ascontiguousarray(array)
    t = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                         dims=array.shape, data_location=onnx.TensorProto.EXTERNAL)
    f.seek(-(-f.tell() // 4096) * 4096)
    offset = f.tell()
    array.tofile(f)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(array.nbytes))):
        t.external_data.add(key=key, value=value)
    return t


def _write_folded(model, path: Path, out: Path, inits: dict, folds: dict, used: set, base: str) -> None:
    """fold_shared_transposes' rewrite: OUT and its data (streamed), then moved over PATH's. A kill
    between the two moves leaves a graph that does not match its data: the export job did not finish,
    and reruns."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import uses_external_data

    g = model.graph
    src_data, out_data = data_file(path), data_file(out)
    tensors = []
    with open(out_data, "wb") as f:
        def stream(t, name: str, array: np.ndarray | None = None):
            if array is None and not uses_external_data(t):
                return t
            return _write_external(f, name, array if array is not None else numpy_helper.to_array(t, base),
                                   src_data.name)

        for t in g.initializer:
            if t.name in used:
                tensors.append(stream(t, t.name))
        for (weight, perm), name in folds.items():
            tensors.append(stream(inits[weight], name, np.transpose(numpy_helper.to_array(inits[weight], base), perm)))
    del g.initializer[:]
    g.initializer.extend(tensors)
    onnx.save(model, str(out))
    out_data.replace(src_data)
    out.replace(path)


SOURCE_METADATA = ("pkg.torch.onnx.stack_trace",)


def strip_source_paths(model) -> int:
    """Drop each node's Python stack trace, which torch's exporter records: absolute paths and line
    numbers of the build machine's source files. They leaked where a build ran, and made an ONNX's
    bytes change with any edit that moved a line of a model's module (a docstring) although the graph
    was the same. The node names, namespaces and FX node records stay. Returns the entries dropped."""
    dropped = 0
    graphs = [model.graph] + [f for f in model.functions]
    for g in graphs:
        for node in g.node:
            keep = [p for p in node.metadata_props if p.key not in SOURCE_METADATA]
            if len(keep) != len(node.metadata_props):
                dropped += len(node.metadata_props) - len(keep)
                del node.metadata_props[:]
                node.metadata_props.extend(keep)
    return dropped



def fold_weight_layouts(model) -> int:
    """Replace Pad / Reshape / Transpose / Identity nodes whose inputs are all initializers by their result, until
    none is left; returns how many. A rewrite that rearranges a weight (exporters/rewrites.py
    conv_polyphase) exports it as such a chain, and the exporter's own folding stops at 8192 elements:
    left as ops, the QDQ quantizer takes the weight for an activation and the QNN EP cannot run the conv."""
    from onnx import helper, numpy_helper

    g = model.graph
    values = {i.name: i for i in g.initializer}
    folded = 0
    changed = True
    while changed:
        changed = False
        for n in list(g.node):
            if n.op_type not in ("Pad", "Reshape", "Transpose", "Identity") or not n.input or \
                    not all(i in values for i in n.input if i):
                continue
            args = [numpy_helper.to_array(values[i]) if i else None for i in n.input]
            attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
            x = args[0]
            if n.op_type == "Identity":
                y = x
            elif n.op_type == "Transpose":
                y = np.transpose(x, attrs.get("perm"))
            elif n.op_type == "Reshape":
                shape = [d if d != 0 or attrs.get("allowzero") else x.shape[k] for k, d in enumerate(args[1])]
                y = np.reshape(x, shape)
            else:
                if attrs.get("mode", b"constant") not in (b"constant", "constant") or (len(args) > 3 and args[3] is not None):
                    continue
                pads = np.asarray(args[1], np.int64)
                fill = args[2].item() if len(args) > 2 and args[2] is not None else 0
                r = x.ndim
                if (pads < 0).any():
                    continue
                y = np.pad(x, [(int(pads[k]), int(pads[k + r])) for k in range(r)], constant_values=fill)
            t = numpy_helper.from_array(np.ascontiguousarray(y), n.output[0])
            g.initializer.append(t)
            values[t.name] = t
            g.node.remove(n)
            folded += 1
            changed = True
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return folded


def name_io(model, input_names: Sequence[str], output_names: Sequence[str]) -> None:
    """Give the graph's inputs and outputs our names, renaming any internal value that already
    carries one of them (the exporter names values after ops, e.g. an `embedding` op)."""
    g = model.graph
    wanted = {v.name: new for v, new in zip(g.input, input_names)}
    wanted.update({v.name: new for v, new in zip(g.output, output_names)})
    taken = set(wanted.values())
    renames = {}
    for node in g.node:
        for out in node.output:
            if out in taken and out not in wanted:
                renames[out] = f"{out}__internal"
    renames.update(wanted)
    if len(g.input) != len(input_names) or len(g.output) != len(output_names):
        raise ValueError(f"graph has {len(g.input)} inputs / {len(g.output)} outputs, expected "
                         f"{len(input_names)} / {len(output_names)}")

    def r(name):
        return renames.get(name, name)

    for node in g.node:
        node.input[:] = [r(n) for n in node.input]
        node.output[:] = [r(n) for n in node.output]
    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = r(v.name)


def inline_copy(src: Path, dst: Path) -> Path | None:
    """`src` with its external data folded in, as one file at `dst` (for consumers that take a
    single .onnx, e.g. the AI Hub sources); None when it would pass protobuf's 2 GB limit.

    Streamed: the model without its weights is written first, then each weight as one more
    `graph { initializer { ... raw_data } }` record, its bytes copied from the memory-mapped data
    file. Protobuf parsers merge repeated occurrences of a message field, so the file reads back
    as the same model (initializers in their original order). Loading every weight into the
    protobuf and serialising it held the weights twice more: on the 0.6B talker decode's fp32
    source (1.77 GB), +3.55 GiB RssAnon and 10.4 s; streamed, +0.01 GiB and 1.9 s (single runs).
    In the 0.6B build that copy was the peak (the build process alone at 10.16 GiB, after the
    talker decode's scoring, where its sources are kept)."""
    import onnx

    if not data_file(src).exists():
        return src
    if src.stat().st_size + data_file(src).stat().st_size > onnxfile.EXTERNAL_DATA_BYTES:
        return None
    # Our own data file is read here, not through onnx.load: builds share it by hard link with
    # their artifacts (ONNX copies, no gigabytes copied), and onnx refuses a data file with more
    # than one link ("potential hardlink attack") -- which failed the first 0.6B build after 48 min.
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(src), load_external_data=False)
    outside = [t for t in _get_all_tensors(model) if uses_external_data(t)]
    for t in outside:
        if _external(t).get("location") != data_file(src).name:
            raise ValueError(f"{src}: tensor {t.name} keeps its data in {_external(t).get('location')}, "
                             f"expected {data_file(src).name}")
    inits = list(model.graph.initializer)
    if sum(uses_external_data(t) for t in inits) != len(outside):
        return _inline_in_memory(model, src, dst)      # external data outside the initializers
    data = np.memmap(data_file(src), dtype=np.uint8, mode="r")
    del model.graph.initializer[:]
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as f:
        f.write(model.SerializeToString())
        for t in inits:
            raw = b""
            if uses_external_data(t):
                info = _external(t)
                start = int(info.get("offset", 0))
                raw = data[start:start + int(info["length"])] if "length" in info else data[start:]
                t = _without_external(t)
            body = t.SerializeToString()
            field = _RAW_DATA_TAG + _varint(len(raw)) if len(raw) else b""
            tensor = len(body) + len(field) + len(raw)
            init = _INITIALIZER_TAG + _varint(tensor)
            f.write(_GRAPH_TAG + _varint(len(init) + tensor) + init + body + field)
            if len(raw):
                f.write(memoryview(raw))
    del data
    return dst


# protobuf keys (field number << 3 | 2, length-delimited): ModelProto.graph = 7,
# GraphProto.initializer = 5, TensorProto.raw_data = 9
_GRAPH_TAG, _INITIALIZER_TAG, _RAW_DATA_TAG = bytes([7 << 3 | 2]), bytes([5 << 3 | 2]), bytes([9 << 3 | 2])


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _without_external(t):
    """A copy of tensor proto `t` without its external-data fields (and no data yet)."""
    import onnx

    meta = onnx.TensorProto()
    meta.CopyFrom(t)
    del meta.external_data[:]
    meta.data_location = onnx.TensorProto.DEFAULT
    return meta


def _inline_in_memory(model, src: Path, dst: Path) -> Path:
    """The unstreamed form (every weight loaded into the protobuf), for external tensors held
    outside the graph's initializers (e.g. in a Constant node's attribute)."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    data = np.memmap(data_file(src), dtype=np.uint8, mode="r")
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            info = _external(t)
            start = int(info.get("offset", 0))
            end = start + int(info["length"]) if "length" in info else len(data)
            t.raw_data = data[start:end].tobytes()
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    del data
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(dst))
    return dst


def data_file(path: Path) -> Path:
    """Where our ONNX files keep external weights: `<name>.onnx.data` beside them."""
    return path.with_name(path.name + ".data")


def to_fp16(src: Path, dst: Path) -> Path:
    """fp16 weights and compute, fp32 inputs/outputs (Cast nodes at the edges).

    A model with external data is converted without loading its weights: the graph (a few MB) goes
    through ONNX Runtime's converter with the weights left on disk, then each fp32 tensor is read
    from a memory map, converted with the same clamping, and appended to the new data file, one
    tensor at a time (peak: the largest tensor, not two copies of the model)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    if not data_file(src).exists():
        model = onnx.load(str(src))
        half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)
        onnxfile.save(half, dst)
        return dst
    from .patches.ort_float16 import value_info_from_dims

    model = onnx.load(str(src), load_external_data=False)
    with value_info_from_dims():
        half = convert_float_to_float16(model, keep_io_types=True, disable_shape_infer=False)
    _rewrite_external(half, data_file(src), dst, to_half=True)
    return dst


def share_matmul_weights(src: Path, dst: Path) -> int:
    """Write `src` as `dst` with every 2-D weight that several MatMuls read (an initializer, or the
    Transpose of one) fed to them as one [1, K, N] value; returns how many weights; 0 writes nothing.

    The QNN EP turns a MatMul by a 2-D constant into a FullyConnected with its own transposed copy
    of the weight, one copy per MatMul (onnxruntime's matmul_op_builder names each
    `<weight>_transpose` uniquely): the fused predictor frame reads each decoder weight in 15
    unrolled steps, so its fp16 DLC held 15 copies (4.98 GB for 0.58 GB of fp32 weights at 0.6B).
    A 3-D constant takes the QNN MatMul path, whose static weight is added once by name and shared.
    Same values (a leading broadcast dim of 1); only MatMuls whose activation is at least 3-D (the
    output keeps its rank) are changed. External data is copied beside `dst` (streamed)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src), load_external_data=False)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in (*g.value_info, *g.input, *g.output)
            if v.type.tensor_type.HasField("shape")}
    transposed = {n.output[0] for n in g.node if n.op_type == "Transpose" and n.input[0] in inits
                  and len(inits[n.input[0]].dims) == 2}
    readers: dict[str, list] = {}
    for n in g.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and (
                n.input[1] in transposed or (n.input[1] in inits and len(inits[n.input[1]].dims) == 2)):
            readers.setdefault(n.input[1], []).append(n)
    shared = {w: ns for w, ns in readers.items() if len(ns) > 1 and all(rank.get(n.input[0], 0) >= 3 for n in ns)}
    if not shared:
        return 0
    axes = numpy_helper.from_array(np.array([0], np.int64), "omni_share__axis0")
    g.initializer.append(axes)
    unsq = {}
    for w, ns in shared.items():
        out = f"{w}__shared3d"
        unsq[w] = helper.make_node("Unsqueeze", [w, axes.name], [out], name=f"{out}__unsqueeze")
        for n in ns:
            n.input[1] = out
    nodes = [unsq[w] for w in shared if w in inits]           # an initializer: first
    for n in g.node:
        nodes.append(n)
        nodes.extend(unsq[o] for o in n.output if o in unsq and o not in inits)
    del g.node[:]
    g.node.extend(nodes)
    src_data = data_file(src)
    if not src_data.exists():
        onnxfile.save(model, dst)
        return len(shared)
    import shutil

    dst_data = data_file(dst)
    # a copy, not a hard link: onnx refuses to read external data with several links (its guard
    # against hard-link attacks), so a link would break every later load of `src`
    shutil.copyfile(src_data, dst_data)
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    e.value = dst_data.name
    onnx.save(model, str(dst))
    return len(shared)


def _external(tensor) -> dict:
    return {e.key: e.value for e in tensor.external_data}


def _rewrite_external(model, src_data: Path, dst: Path, to_half: bool = False) -> None:
    """Save `model` (weights external, not loaded) as `dst` + `dst.data`, streaming each tensor's
    bytes from `src_data`; with `to_half`, tensors now typed FLOAT16 whose stored bytes are still
    fp32 are converted on the way."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data
    from onnxruntime.transformers.float16 import convert_np_to_float16

    dst.parent.mkdir(parents=True, exist_ok=True)
    out_data = data_file(dst)
    tmp = out_data.with_name(out_data.name + ".tmp")
    src_map = np.memmap(src_data, dtype=np.uint8, mode="r")
    with open(tmp, "wb") as f:
        for t in _get_all_tensors(model):
            if not uses_external_data(t):
                continue
            info = _external(t)
            offset, length = int(info.get("offset", 0)), int(info["length"])
            raw = src_map[offset:offset + length]
            numel = int(np.prod(t.dims)) if len(t.dims) else 1
            if to_half and t.data_type == onnx.TensorProto.FLOAT16 and length == 4 * numel:
                raw = convert_np_to_float16(np.frombuffer(raw, dtype=np.float32)).view(np.uint8)
            pad = (-f.tell()) % 4096                     # page-aligned, as ONNX Runtime prefers
            f.write(b"\0" * pad)
            start = f.tell()
            f.write(memoryview(np.ascontiguousarray(raw)))
            del t.external_data[:]
            for k, v in (("location", out_data.name), ("offset", str(start)), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
            t.data_location = onnx.TensorProto.EXTERNAL
    del src_map
    tmp.replace(out_data)
    onnx.save(model, str(dst))


def copy(src: Path, dst: Path) -> list[Path]:
    """Copy an ONNX file under a new name; external data moves with it (renamed, and the model's
    references to it rewritten). Returns the files written."""
    import shutil

    data = data_file(src)
    if not data.exists():
        shutil.copyfile(src, dst)
        return [dst]
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(src), load_external_data=False)
    locations = {_external(t).get("location") for t in _get_all_tensors(model) if uses_external_data(t)}
    if locations != {data.name}:
        raise ValueError(f"{src}: external data in {sorted(locations)}, expected only {data.name}")
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for e in t.external_data:
                if e.key == "location":
                    e.value = data_file(dst).name
    target = data_file(dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(data, target)                            # same file system: no copy of gigabytes
    except OSError:
        shutil.copyfile(data, target)
    onnx.save(model, str(dst))
    return [dst, target]


class MappedSamples(Sequence):
    """Input dicts stored as one .npy per (sample, input) and read back memory-mapped. A quantizer
    child gets paths instead of a pickle: the 0.6B talker prefill's 16 calibration calls carry the
    KV cache (235 MB each, 3.7 GB), which the pickle copied into the child's heap (and transiently
    into a send buffer in the parent); mapped, the pages are file-backed and evictable."""

    def __init__(self, root: Path, count: int, names: tuple[str, ...]):
        self.root, self.count, self.names = Path(root), count, tuple(names)

    @classmethod
    def write(cls, samples: Sequence[dict], root: Path) -> "MappedSamples":
        root.mkdir(parents=True, exist_ok=True)
        names = tuple(samples[0]) if len(samples) else ()
        for i, sample in enumerate(samples):
            for j, name in enumerate(names):
                np.save(root / f"{i}.{j}.npy", np.ascontiguousarray(sample[name]))
        return cls(root, len(samples), names)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.count))]
        if not -self.count <= i < self.count:
            raise IndexError(i)
        i %= self.count
        return {name: np.load(self.root / f"{i}.{j}.npy", mmap_mode="r") for j, name in enumerate(self.names)}


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over a list of input dicts."""

    def __init__(self, data: Sequence[dict]):
        self._it = iter(data)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # not needed by MinMax, kept for the reader protocol
        pass


# 16-bit activation ranges are the calibrated [min, max] widened by this fraction of their span on
# each side. A few calibration calls do not see the extremes of other inputs: on the demo talker,
# held-out embedding sums (codes never drawn in calibration) clipped at the first quantizer and
# the graph scored 14.2 dB; with the span doubled, 36.1 dB. 16 bits leave ~90 dB of resolution,
# so the 6 dB the headroom costs is not seen. 8-bit activations have no such margin: MinMax as is.
# A recipe may set its own per component (Component.activation_headroom).
HEADROOM = {Precision.W8A16: 0.5, Precision.W8A8: 0.0, Precision.W4A16: 0.5}


def quantize_qdq(src: Path, dst: Path, calibration: Sequence[dict], precision: Precision,
                 headroom: float | None = None, per_channel_linears: bool = False,
                 weight_rounding: str = "nearest", calibrate_once: bool = True,
                 int4_weights: str = "block", keep_float: Sequence[str] = (),
                 wide_weights: Sequence[str] = (), wide_bits: int = 16) -> Path:
    """Static QDQ for the HTP: int8 weights (w8a16, w8a8; per channel for Conv, per tensor for MatMul,
    which ONNX Runtime's QNN config quantizes per tensor, unless `per_channel_linears` lowers the
    linears as 1x1 Conv first), or for w4a16 signed symmetric int4 weights for every MatMul / Conv /
    ConvTranspose weight laid out as `int4_weights` says (INT4_WEIGHTS), the other constants as w8a16's
    (8-bit LayerNorm weights; tables and elementwise constants at the activations' 16 bits),
    16- or 8-bit activations, MinMax ranges collected by running the fp32 model on `calibration`
    (captured real inputs; never dummies), with `headroom` (default HEADROOM[precision]) around them.
    `weight_rounding` "gptq" then re-rounds the weights on the quantizer's grid (exporters/gptq.py).
    `keep_float` names nodes left unquantized (precision repair's blocks kept at higher precision: float
    in the QDQ graph, fp16 on the HTP; a linear lowered as Conv keeps its name + ".conv").
    `wide_weights` names nodes whose MatMul / Conv weights are quantized to signed symmetric `wide_bits`
    (16, or 8 over w4a16's int4; per output channel for Conv) instead: precision repair's other raise,
    integer all the way. Large
    tables go to 8 bits with a scale per row (tables_per_row) but those a Gather named in either list reads.

    The calibration inputs run through the fp32 model once: with headroom, every activation's range
    comes from our own MinMax pass (`activation_ranges`) as an override, and ONNX Runtime's quantizer
    is handed that pass's ranges as its calibration cache, so it does not calibrate again
    (`calibrate_once`; the same QDQ model, tests/test_qdq_options.py). Its own calibration loads a
    second copy of the fp32 model and a session over it beside the model it quantizes: the 0.6B
    talker prefill's quantizer process peaked at 6.93 GiB with it."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from .gptq import check_method

    check_method(weight_rounding)
    if int4_weights not in INT4_WEIGHTS:
        raise ValueError(f"int4_weights must be one of {', '.join(INT4_WEIGHTS)}; got {int4_weights!r}")
    if not calibration:
        raise ValueError("quantization needs calibration data; none was given")
    act = {Precision.W8A16: QuantType.QUInt16, Precision.W8A8: QuantType.QUInt8,
           Precision.W4A16: QuantType.QUInt16}[precision]
    weight = QuantType.QUInt8          # w4a16: int4 for the linear weights only (int4_overrides)
    logging.getLogger().setLevel(logging.ERROR)   # ORT prints pre-processing advice at WARNING
    if per_channel_linears:
        src = linears_as_conv(src, dst.with_name(dst.name.replace(".onnx", "") + ".conv.onnx"))
    headroom = HEADROOM[precision] if headroom is None else float(headroom)
    second = activation_matmul_operands(src) if act == QuantType.QUInt16 else {}
    cache = dst.with_name(dst.name + ".ranges.json") if calibrate_once and headroom else None
    if cache is not None:
        cache.unlink(missing_ok=True)           # ONNX Runtime would take a stale one as is
    ranges = activation_ranges(src, calibration, dst.parent, keep=cache) if headroom or second else {}
    # the path, not a loaded model: the config reads the graph only (weights may be external)
    int4 = int4_overrides(src, int4_weights) if precision == Precision.W4A16 else None
    if wide_weights:
        int4 = {**(int4 or {}), **wide_overrides(src, wide_weights, wide_bits)}
    cfg = get_qnn_qdq_config(Path(src), _Reader(calibration), activation_type=act, weight_type=weight,
                             per_channel=True, init_overrides=int4)
    overrides = dict(cfg.extra_options.get("TensorQuantOverrides") or {})

    def padded(lo, hi) -> dict:
        # a tensor never negative in calibration (ReLU, abs, squares, sqrt) is not padded below zero:
        # ONNX Runtime's quantizer removes a ReLU whose output range starts at 0 and lets the
        # quantizer's clamp do its work; with the range padded below 0 the ReLU was still removed and
        # negatives went through (MiniCPM-o tts_condition w8a16: its ReLU output 0.9 dB, the graph
        # 4.1 dB on ORT CPU and the HTP; 36.9 dB with the range kept at 0)
        pad = headroom * (hi - lo)
        return {"rmin": np.float32(lo - pad if lo < 0 else max(lo - pad, 0.0)), "rmax": np.float32(hi + pad)}

    if headroom:
        for name, (lo, hi) in ranges.items():
            if name not in overrides:             # ranges the QNN config fixes (e.g. sigmoid) stay
                overrides[name] = [padded(lo, hi)]
    for name, matmuls in second.items():          # see activation_matmul_operands
        first, *rest = overrides.get(name) or [padded(*ranges[name]) if name in ranges else {}]
        if "rmin" not in first and name not in ranges:
            continue
        span = {k: first[k] for k in ("rmin", "rmax")} if "rmin" in first else padded(*ranges[name])
        convert = {**span, "quant_type": QuantType.QInt16, "symmetric": True}
        if matmuls:
            convert["recv_nodes"] = set(matmuls)
        overrides[name] = [{**first, "convert": convert}, *rest]
    cfg.extra_options["TensorQuantOverrides"] = overrides
    if keep_float:
        keep = set(keep_float)
        cfg.nodes_to_exclude = list(cfg.nodes_to_exclude or []) + sorted(keep | {f"{n}.conv" for n in keep})
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        with linear_quantizer():
            _quantize_static(src, dst, cfg, cache)
    finally:
        if cache is not None:
            cache.unlink(missing_ok=True)
    if keep_float:
        float_tables_as_16bit(dst)
        float_weights_as_fp16(dst)
    tables_per_row(dst, skip=set(keep_float) | set(wide_weights))
    if precision == Precision.W4A16 and int4_weights == "block":
        int4_blocks(Path(src), dst)
    if weight_rounding == "gptq":
        from .gptq import round_weights

        round_weights(Path(src), dst, calibration)
    if per_channel_linears:       # the 1x1-Conv form was this quantization's input only
        Path(src).unlink(missing_ok=True)
        data_file(Path(src)).unlink(missing_ok=True)
    return dst


# How w4a16 lays out its int4 weights (MatMul, Conv, ConvTranspose; the other constants as in w8a16):
# "tensor": one scale per MatMul weight, per output channel for Conv (ONNX Runtime's QNN default, the
# scheme before these options); "channel": one scale per output channel everywhere; "block": one scale
# per INT4_BLOCK input channels of each output channel for MatMul and 1x1 Conv weights (ONNX
# DequantizeLinear block_size, opset 21), per output channel for the other Conv weights. The QNN EP
# (onnxruntime-qnn 2.7, QNN 2.51) compiles all three for the HTP (docs/quantization.md).
INT4_WEIGHTS = ("tensor", "channel", "block")
INT4_BLOCK = 64


def _linear_weights(model) -> dict[str, tuple[str, int]]:
    """{weight initializer: (consumer op, output-channel axis)} for the constant weights (input 1) of
    MatMul (rank 2), Conv and ConvTranspose nodes in `model`."""
    inits = {i.name: len(i.dims) for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if len(n.input) < 2 or n.input[1] not in inits:
            continue
        rank = inits[n.input[1]]
        if n.op_type == "MatMul" and rank == 2:
            out[n.input[1]] = ("MatMul", 1)
        elif n.op_type in ("Conv", "ConvTranspose") and rank >= 3:
            out[n.input[1]] = (n.op_type, 0 if n.op_type == "Conv" else 1)
    return out


def int4_overrides(src: Path, layout: str) -> dict:
    """ONNX Runtime quantizer overrides that make the linear weights of `src` signed symmetric int4,
    per output channel (per tensor for MatMul when `layout` is "tensor"); block layouts start per channel
    and are re-cut by int4_blocks after the quantizer."""
    import onnx
    from onnxruntime.quantization import QuantType

    model = onnx.load(str(src), load_external_data=False)
    out = {}
    for name, (op, axis) in _linear_weights(model).items():
        o = {"quant_type": QuantType.QInt4, "symmetric": True}
        if not (layout == "tensor" and op == "MatMul"):
            o["axis"] = axis
        out[name] = [o]
    return out


# The widths precision repair raises a module's weights to (quantize_qdq's `wide_bits`).
WIDE_BITS = (8, 16)


def wide_overrides(src: Path, nodes: Sequence[str], bits: int = 16) -> dict:
    """ONNX Runtime quantizer overrides that make the weights of `nodes` (by name; a linear lowered as
    Conv by its name + ".conv") signed symmetric int16 (or int8, `bits`): per tensor for MatMul, per
    output channel for Conv."""
    import onnx
    from onnxruntime.quantization import QuantType

    if bits not in WIDE_BITS:
        raise ValueError(f"wide weights are {' or '.join(map(str, WIDE_BITS))} bits; got {bits!r}")

    model = onnx.load(str(src), load_external_data=False)
    names = set(nodes) | {f"{n}.conv" for n in nodes}
    weights = _linear_weights(model)
    out = {}
    for n in model.graph.node:
        if n.name in names and len(n.input) > 1 and n.input[1] in weights:
            op, axis = weights[n.input[1]]
            o = {"quant_type": QuantType.QInt16 if bits == 16 else QuantType.QInt8, "symmetric": True}
            if op != "MatMul":
                o["axis"] = axis
            out[n.input[1]] = [o]
    return out


def int4_blocks(fp32: Path, qdq: Path, block: int | None = None) -> int:
    """Re-cut the per-channel int4 weights of `qdq` (quantized from `fp32`) that feed a MatMul [K, N] or a
    1x1 Conv [N, K, 1, 1] into one symmetric scale per `block` (INT4_BLOCK) input channels of each output
    channel, from the fp32 weights: a DequantizeLinear with `block_size` (opset 21), which the QNN EP
    compiles for the HTP as a block-quantized weight (its "BQ" path; 4-bit storage). Weights whose K is
    not a multiple of `block` stay per channel. A per-channel scale is set by the channel's largest weight
    (an outlier input channel takes every output channel's range); a block's only by its own.
    Returns how many weights were re-cut."""
    import onnx
    from onnx import helper, numpy_helper

    block = block or INT4_BLOCK
    model = onnx.load(str(qdq))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    src = onnx.load(str(fp32), load_external_data=False)
    by_name = {n.name: n for n in src.graph.node if n.name}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    todo = []
    for dq in g.node:
        if dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        q = inits[dq.input[0]]
        users = consumers.get(dq.output[0], [])
        # several readers (the fused frame's 15 steps read one weight): one re-cut if they all read the
        # same fp32 weight as their weight, in the same op
        if q.data_type != onnx.TensorProto.INT4 or not users or any(u.input[1:2] != [dq.output[0]] for u in users):
            continue
        user = users[0]
        refs = [by_name.get(u.name) for u in users]
        ref = refs[0]
        dims = list(q.dims)
        if any(r is None or r.op_type != user.op_type or len(r.input) < 2 or u.op_type != user.op_type
               or r.input[1] != ref.input[1] for r, u in zip(refs, users)):
            continue
        if user.op_type == "MatMul" and len(dims) == 2:
            k_axis = 0
        elif (user.op_type == "Conv" and dims[2:] == [1, 1] and len(dims) == 4
              and all(a.i == 1 for a in user.attribute if a.name == "group")):
            k_axis = 1
        else:
            continue
        if dims[k_axis] % block or dims[k_axis] == block:
            continue
        todo.append((dq, ref.input[1], k_axis))
    if not todo:
        return 0
    fp = {i.name: i for i in src.graph.initializer}
    for dq, name, k_axis in todo:
        # one fp32 weight at a time, read from the data file (at 1.7B the fp32 weights are 6.8 GB)
        w = numpy_helper.to_array(fp[name], base_dir=str(Path(fp32).parent)).astype(np.float32)
        q, scale = _int4_block_quantize(w, k_axis, block)
        qi, si, zi = dq.input[0], dq.input[1], dq.input[2] if len(dq.input) > 2 else ""
        inits[qi].CopyFrom(onnxfile.int4_tensor(qi, q))
        inits[si].CopyFrom(numpy_helper.from_array(scale, si))
        if zi:
            inits[zi].CopyFrom(onnxfile.int4_tensor(zi, np.zeros(scale.shape, np.int8)))
        for a in [a for a in dq.attribute if a.name in ("axis", "block_size")]:
            dq.attribute.remove(a)
        dq.attribute.extend([helper.make_attribute("axis", k_axis), helper.make_attribute("block_size", block)])
    onnxfile.save(model, qdq)
    return len(todo)


def _scopes(node) -> list:
    import ast

    meta = {p.key: p.value for p in node.metadata_props}
    try:
        scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
    except (ValueError, SyntaxError):
        return []
    return scopes if isinstance(scopes, list) and all(isinstance(x, str) for x in scopes) else []


_WEIGHTED_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


def _root_weighted(node, inits: dict) -> str | None:
    """The op's name (its scope list's last entry, `matmul_16`) when `node` belongs to the root module
    itself and multiplies by a constant weight: a tied LM head (`hidden @ embedding.T` in the model's own
    forward) is such an op. Glue between modules (reshapes, concats) is not."""
    scopes = _scopes(node)
    if len(scopes) != 2 or node.op_type not in _WEIGHTED_OPS or len(node.input) < 2:
        return None
    w = inits.get(node.input[1])
    return scopes[1] if w is not None and len(w.dims) >= 2 else None


def scope_nodes(src: Path) -> dict[str, list[str]]:
    """{module scope: node names} at every depth below the root: a node is listed under each module it
    sits in (`decoder`, `decoder.layers.24`, `decoder.layers.24.self_attn`, ...; the scope list's last
    entry names the op, not a module), and a weighted op of the root module under its own name
    (_root_weighted). block_nodes' blocks are the first level of these."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.name:
            root = _root_weighted(n, inits)
            for scope in [root] if root else _scopes(n)[1:-1]:
                out.setdefault(scope, []).append(n.name)
    return out


def output_scopes(src: Path) -> dict[str, str]:
    """{graph output: the module that makes it}: of the producing node's modules, the deepest element of
    a module list (`decoder.layers.24` for a transformer layer's new_key_24), else the deepest module
    (`decoder.norm`, `codec_head`). A node of the root module (glue: a reshape, a concat) is walked
    back through to the nearest node inside a module. Outputs no module makes are left out."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    made = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for o in model.graph.output:
        todo, seen = [o.name], set()
        while todo:
            name = todo.pop(0)
            n = made.get(name)
            if n is None or id(n) in seen:
                continue
            seen.add(id(n))
            modules = _scopes(n)[1:-1]
            if modules:
                listed = [m for m in modules if m.rsplit(".", 1)[-1].isdigit()]
                out[o.name] = (listed or modules)[-1]
                break
            todo.extend(x for x in n.input if x)
    return out


def block_nodes(src: Path) -> dict[str, list[str]]:
    """{block: node names} of an exported graph, by the module each node came from: torch's exporter
    records each node's module scopes (`pkg.torch.onnx.name_scopes`, ['', 'blocks.3', ...]), and the
    first below the root names its block -- a BlockChain's `blocks.<i>` (blocks.py), a transformer's
    `layers.<i>`, `norm`, `lm_head`, ... -- in the order the graph first reaches it. A weighted op of
    the root module itself (a tied LM head's MatMul, _root_weighted) is a block of its own, named by its
    op (`matmul_16`); the root's other nodes (glue between blocks) are left out."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        scopes = _scopes(n)
        top = _root_weighted(n, inits) or (scopes[1] if len(scopes) > 2 else "")
        if top and n.name:
            out.setdefault(top, []).append(n.name)
    return out


MIN_COLUMN_LEVELS = 4096


def float_tables_as_16bit(qdq: Path) -> int:
    """Gather tables a float island left in float (ONNX Runtime's quantizer does not quantize a Gather
    whose consumers it does not quantize) stored as uint16 behind a DequantizeLinear, as the plain
    build stores them: a lookup reads its rows to ~1e-5 of the table's range, and the tables (a Code2Wav
    RVQ's codebooks) are most of such a block's bytes. Inline models only (a model with external data
    keeps its tables). Returns the tables converted."""
    import onnx
    from onnx import helper, numpy_helper

    if data_file(qdq).exists():
        return 0
    model = onnx.load(str(qdq))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    readers: dict[str, int] = {}
    for n in g.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    nodes, done = [], {}
    for n in g.node:
        t = inits.get(n.input[0]) if n.op_type == "Gather" and n.input else None
        if t is not None and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2 and readers[t.name] == 1:
            # one scale for the table (the HTP takes no per-column DequantizeLinear in front of a Gather),
            # and only where every column keeps >= MIN_COLUMN_LEVELS of the 65536 levels: a float island
            # is where an outlier channel lives, and a column 400x smaller than the others (the outlier
            # checkpoint's RVQ) lost 7 dB of the graph at 16 bits; such a table stays in float
            w = numpy_helper.to_array(t).astype(np.float64)
            flat = w.reshape(-1, w.shape[-1])
            span = np.maximum(flat.max(0), 0.0) - np.minimum(flat.min(0), 0.0)
            lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
            if hi <= lo or span.min() * 65535.0 / (hi - lo) < MIN_COLUMN_LEVELS:
                nodes.append(n)
                continue
            scale = (hi - lo) / 65535.0
            zero = int(round(-lo / scale))
            q = np.clip(np.round(w / scale) + zero, 0, 65535).astype(np.uint16)
            g.initializer.remove(t)
            g.initializer.extend([numpy_helper.from_array(q, t.name + "_u16"),
                                  numpy_helper.from_array(np.float32(scale), t.name + "_u16_scale"),
                                  numpy_helper.from_array(np.uint16(zero), t.name + "_u16_zero_point")])
            nodes.append(helper.make_node("DequantizeLinear", [t.name + "_u16", t.name + "_u16_scale",
                                                              t.name + "_u16_zero_point"], [t.name],
                                          name=t.name + "_u16_dq"))
            done[t.name] = True
        nodes.append(n)
    if done:
        del g.node[:]
        g.node.extend(nodes)
        onnxfile.save(model, qdq)
    return len(done)


# A 16-bit [rows, columns] table (a Gather's constant: an RVQ's codebooks, a talker's embedding table)
# goes to 8 bits with one scale per row when it holds at least TABLE_MIN_SHARE of the graph's weight
# bytes (smaller ones, RoPE cos / sin, save nothing worth it) and every column keeps TABLE_MIN_COLUMN_DB
# through it (a column far smaller than the rest, the outlier checkpoints' RVQ, keeps its 16 bits).
TABLE_MIN_SHARE = 0.01
TABLE_MIN_COLUMN_DB = 35.0


def _dq_weight_bytes(model, inits: dict) -> float:
    """The bytes of every constant of 2 dims or more behind a DequantizeLinear (weight_bits' count)."""
    import onnx

    width = {onnx.TensorProto.INT4: 0.5, onnx.TensorProto.UINT4: 0.5, onnx.TensorProto.INT8: 1,
             onnx.TensorProto.UINT8: 1, onnx.TensorProto.INT16: 2, onnx.TensorProto.UINT16: 2}
    seen, total = set(), 0.0
    for n in model.graph.node:
        t = inits.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if t is not None and len(t.dims) >= 2 and t.name not in seen:
            seen.add(t.name)
            total += float(np.prod(t.dims)) * width.get(t.data_type, 4)
    return total


def row_scaled_table(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """`w` as signed 8-bit codes with one scale per row (per vector along the last axis), the scales
    themselves uint16 with one step: (codes + 128 as uint8, scale codes [..., 1] as uint16, the
    scales' step). A row reads back as (codes - 128) * scale codes * step; the scales round up, so no
    code clips."""
    s = np.abs(w).max(axis=-1, keepdims=True) / 127.0
    step = float(s.max()) / 65535.0 if s.max() > 0 else 1.0
    sq = np.minimum(np.ceil(s / step), 65535.0)
    sv = sq * step
    codes = np.clip(np.rint(np.divide(w, sv, out=np.zeros_like(w), where=sv > 0)), -127, 127)
    return (codes + 128).astype(np.uint8), sq.astype(np.uint16), step


def tables_per_row(qdq: Path, min_share: float = TABLE_MIN_SHARE,
                   min_column_db: float = TABLE_MIN_COLUMN_DB, skip: set[str] | frozenset = frozenset()) -> list[str]:
    """Rewrite each large 16-bit table lookup of a QDQ model (a uint16 / int16 constant with one scale
    behind a DequantizeLinear read only by axis-0 Gathers) to 8-bit codes with a scale per row:

        Gather(DQ(codes u8, 1, 128), idx) -> Q/DQ u8 -> Q/DQ u16 (a Convert on the HTP)
        Gather(DQ(row scales u16), idx) -> Q/DQ u16           } -> Mul -> the lookup's own output

    Each lookup reads its rows as before to ~45 dB (a random table; the demo Code2Wav's codebooks: 47 dB
    where one 8-bit scale gave 30 and the graph lost 4.5 dB), and the tables' bytes halve. The HTP
    takes no per-row DequantizeLinear in front of a Gather, hence the gathered scales and the Mul.
    Which tables: [rows, columns] ones (a stack of tables a Gather picks one of by a step index stays
    16-bit: the code predictor's [15, 2048, 1024] stacks so rewritten made QNN 2.51's HTP simulator
    crash on the 0.6B predictor decode; its graphs now export 2-D tables, talker.PredictorCore); see
    TABLE_MIN_SHARE / TABLE_MIN_COLUMN_DB; not a table a Gather named in `skip` reads
    (precision repair's raised blocks: their lookups keep 16 bits). A model with external data is read
    a table at a time (the new tables go inline, the other weights are streamed to a new data file).
    Returns the tables rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    external = data_file(qdq).exists()
    model = onnx.load(str(qdq), load_external_data=False)
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    readers: dict[str, list] = {}
    for n in g.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    total = _dq_weight_bytes(model, inits)
    sixteen = (onnx.TensorProto.UINT16, onnx.TensorProto.INT16)

    def axis(n) -> int:
        return next((a.i for a in n.attribute if a.name == "axis"), 0)

    plans: dict[str, tuple] = {}           # DequantizeLinear output -> (its node, new initializers, table)
    for n in g.node:
        if n.op_type != "DequantizeLinear" or len(n.input) < 2:
            continue
        t, sc = inits.get(n.input[0]), inits.get(n.input[1])
        users = readers.get(n.output[0], [])
        if (t is None or sc is None or t.data_type not in sixteen or len(t.dims) != 2 or list(sc.dims)
                or len(readers.get(t.name, [])) != 1 or not users
                or any(u.op_type != "Gather" or u.input[0] != n.output[0] or axis(u) != 0 or u.name in skip
                       for u in users)
                or np.prod(t.dims) * 2 < min_share * total):
            continue
        here = str(Path(qdq).parent)
        zp = (numpy_helper.to_array(inits[n.input[2]], here).astype(np.float64)
              if len(n.input) > 2 and n.input[2] else 0.0)
        w = (numpy_helper.to_array(t, here).astype(np.float64) - zp) * float(numpy_helper.to_array(sc, here))
        codes, sq, step = row_scaled_table(w)
        err = (codes.astype(np.float64) - 128.0) * (sq * step) - w
        col = w.reshape(-1, w.shape[-1])
        power, noise_ = (col ** 2).sum(0), (err.reshape(col.shape) ** 2).sum(0)
        live = power > 0
        if live.any() and (noise_[live] > 0).any():
            db = 10 * np.log10(power[live] / np.maximum(noise_[live], 1e-300))
            if float(db.min()) < min_column_db:
                continue
        base = t.name
        plans[n.output[0]] = (n, [numpy_helper.from_array(codes, base + "_rows8"),
                                   numpy_helper.from_array(np.float32(1.0), base + "_rows8_scale"),
                                   numpy_helper.from_array(np.uint8(128), base + "_rows8_zero_point"),
                                   numpy_helper.from_array(sq, base + "_rowscale"),
                                   numpy_helper.from_array(np.float32(step), base + "_rowscale_scale"),
                                   numpy_helper.from_array(np.uint16(0), base + "_rowscale_zero_point"),
                                   numpy_helper.from_array(np.uint16(32768), base + "_rows16_zero_point")], t)
    if not plans:
        return []
    nodes = []
    for n in g.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in plans:
            _, new, t = plans[n.output[0]]
            b = t.name
            g.initializer.remove(t)
            g.initializer.extend(new)
            nodes += [helper.make_node("DequantizeLinear", [b + "_rows8", b + "_rows8_scale", b + "_rows8_zero_point"],
                                       [b + "_rows8_dq"], name=b + "_rows8_dq"),
                      helper.make_node("DequantizeLinear", [b + "_rowscale", b + "_rowscale_scale",
                                                            b + "_rowscale_zero_point"],
                                       [b + "_rowscale_dq"], name=b + "_rowscale_dq")]
            continue
        if n.op_type == "Gather" and n.input[0] in plans:
            b = plans[n.input[0]][2].name
            idx, out, k = n.input[1], n.output[0], n.name or n.output[0]
            r8, r16, s = f"{k}_rows8", f"{k}_rows16", f"{k}_rowscale"
            q8 = [b + "_rows8_scale", b + "_rows8_zero_point"]
            q16 = [b + "_rows8_scale", b + "_rows16_zero_point"]
            qs = [b + "_rowscale_scale", b + "_rowscale_zero_point"]
            nodes += [helper.make_node("Gather", [b + "_rows8_dq", idx], [r8], name=r8, axis=0),
                      helper.make_node("QuantizeLinear", [r8, *q8], [r8 + "_q"], name=r8 + "_q"),
                      helper.make_node("DequantizeLinear", [r8 + "_q", *q8], [r8 + "_dq"], name=r8 + "_dq"),
                      helper.make_node("QuantizeLinear", [r8 + "_dq", *q16], [r16 + "_q"], name=r16 + "_q"),
                      helper.make_node("DequantizeLinear", [r16 + "_q", *q16], [r16 + "_dq"], name=r16 + "_dq"),
                      helper.make_node("Gather", [b + "_rowscale_dq", idx], [s], name=s, axis=0),
                      helper.make_node("QuantizeLinear", [s, *qs], [s + "_q"], name=s + "_q"),
                      helper.make_node("DequantizeLinear", [s + "_q", *qs], [s + "_dq"], name=s + "_dq"),
                      helper.make_node("Mul", [r16 + "_dq", s + "_dq"], [out], name=k)]
            for m in nodes[-9:]:            # the lookup's scope (output_scopes, scope_nodes) stays
                m.metadata_props.extend(n.metadata_props)
            continue
        nodes.append(n)
    _save_with_nodes(model, nodes, qdq, external)
    return [p[2].name for p in plans.values()]


# A float island's weights stored as fp16 must read back this close to their fp32 values (fp16 keeps
# ~11 bits per value; a tensor past fp16's range or mostly subnormal there stays fp32).
FP16_WEIGHT_MIN_DB = 60.0


def float_weights_as_fp16(qdq: Path, min_db: float = FP16_WEIGHT_MIN_DB) -> list[str]:
    """The float weights of a QDQ model's float island (precision repair's kept blocks: constants of 2+
    dims read unquantized) stored as fp16 behind a Cast to fp32: the HTP runs those nodes in fp16, so
    their weights lose nothing the context binary keeps, and the ONNX stores what the device holds
    (fp32 took twice the bytes: the demo Code2Wav's four kept blocks were 35 % of its weight bytes at
    fp32). A tensor that does not read back within `min_db` of itself in fp16 stays fp32. A model with
    external data is read a tensor at a time. Returns the tensors converted."""
    import onnx
    from onnx import helper, numpy_helper

    external = data_file(qdq).exists()
    model = onnx.load(str(qdq), load_external_data=False)
    g = model.graph
    here = str(Path(qdq).parent)
    readers: dict[str, set[str]] = {}
    for n in g.node:
        for x in n.input:
            readers.setdefault(x, set()).add(n.op_type)
    skip = {"DequantizeLinear", "QuantizeLinear", "Reshape", "Expand", "Tile", "ConstantOfShape"}
    casts, done = [], []
    for t in list(g.initializer):
        ops = readers.get(t.name, set())
        if t.data_type != onnx.TensorProto.FLOAT or len(t.dims) < 2 or not ops or ops & skip:
            continue
        w = numpy_helper.to_array(t, here)
        h = w.astype(np.float16)
        err = float(((h.astype(np.float64) - w) ** 2).sum())
        power = float((w.astype(np.float64) ** 2).sum())
        if not np.isfinite(h).all() or (err > 0 and 10 * np.log10(power / err) < min_db):
            continue
        g.initializer.remove(t)
        g.initializer.append(numpy_helper.from_array(h, t.name + "_fp16"))
        casts.append(helper.make_node("Cast", [t.name + "_fp16"], [t.name], name=t.name + "_fp16_cast",
                                      to=onnx.TensorProto.FLOAT))
        done.append(t.name)
    if not done:
        return []
    _save_with_nodes(model, casts + list(g.node), qdq, external)
    return done


def _save_with_nodes(model, nodes: list, qdq: Path, external: bool) -> None:
    """`model` with `nodes` as its graph's nodes, saved over `qdq`: a model read without its external
    data streams the weights it still holds there to a new data file (_rewrite_external)."""
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    if external:
        _rewrite_external(model, data_file(qdq), qdq)
    else:
        onnxfile.save(model, qdq)


def float_island(src: Path, nodes: Sequence[str]) -> list[str]:
    """`nodes` (but their table lookups) and the nodes that produce their activation inputs: left out
    of quantization together, the island reads its inputs unquantized too. (ONNX Runtime's quantizer quantizes a tensor at its
    producer: a kept block fed a 16-bit activation with an outlier channel -- the channel the block's
    weights then amplify -- lost as much as the all-quantized graph.)"""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    # table lookups stay quantized: a Gather reads its table's rows exactly at the tables' 16 bits, and a
    # kept block's tables (a Code2Wav RVQ's codebooks) are most of its bytes
    gathers = {n.name for n in model.graph.node if n.op_type == "Gather"}
    nodes = [n for n in nodes if n not in gathers]
    keep = set(nodes)
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n.name for n in model.graph.node for o in n.output}
    feeding = {producer[x] for n in model.graph.node if n.name in keep for x in n.input
               if x and x not in inits and x in producer}
    return list(nodes) + sorted(feeding - keep)


def weight_bits(qdq: Path) -> dict[str, float]:
    """{width: share of the weight bytes} of a QDQ model: every constant of 2 dims or more behind a
    DequantizeLinear (MatMul / Conv weights, tables, ...), counted at its integer width ("4", "8",
    "16"), and every such constant a node reads unquantized (a block precision repair kept in float) at
    its float width: "fp16" (float_weights_as_fp16) or "32"."""
    import onnx

    model = onnx.load(str(qdq), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    width = {onnx.TensorProto.INT4: (4, "4"), onnx.TensorProto.UINT4: (4, "4"), onnx.TensorProto.INT8: (8, "8"),
             onnx.TensorProto.UINT8: (8, "8"), onnx.TensorProto.INT16: (16, "16"),
             onnx.TensorProto.UINT16: (16, "16"), onnx.TensorProto.INT32: (32, "32"),
             onnx.TensorProto.FLOAT16: (16, "fp16"), onnx.TensorProto.FLOAT: (32, "32")}
    total: dict[tuple[int, str], float] = {}
    counted: set[str] = set()
    for n in model.graph.node:
        names = n.input[:1] if n.op_type == "DequantizeLinear" else [
            x for x in n.input if x in inits and inits[x].data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
            and n.op_type not in ("QuantizeLinear", "Reshape", "Expand", "Tile", "ConstantOfShape")]
        for name in names:
            t = inits.get(name)
            if t is None or len(t.dims) < 2 or name in counted:
                continue
            counted.add(name)
            key = width.get(t.data_type, (32, "32"))
            total[key] = total.get(key, 0.0) + float(np.prod(t.dims)) * key[0] / 8
    all_bytes = sum(total.values())
    return {k[1]: round(v / all_bytes, 4) for k, v in sorted(total.items())} if all_bytes else {}


def _int4_block_quantize(w: np.ndarray, k_axis: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Signed symmetric int4 codes for `w` and its scales, one per `block` entries along `k_axis` (the
    scale tensor has w's rank with shape[k_axis] = K / block)."""
    shape = list(w.shape)
    k = shape[k_axis]
    split = shape[:k_axis] + [k // block, block] + shape[k_axis + 1:]
    wb = w.reshape(split)
    scale = np.abs(wb).max(axis=k_axis + 1, keepdims=True) / 7.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.rint(wb / scale), -8, 7).astype(np.int8).reshape(shape)
    return q, np.squeeze(scale, axis=k_axis + 1)


def _quantize_static(src: Path, dst: Path, cfg, ranges_cache: Path | None) -> None:
    """onnxruntime.quantization.quantize(src, dst, cfg), with `ranges_cache` (when given) as its
    calibration cache: the quantizer then takes those ranges instead of calibrating."""
    from onnxruntime.quantization import quantize_static

    quantize_static(str(src), str(dst), cfg.calibration_data_reader, calibrate_method=cfg.calibrate_method,
                    quant_format=cfg.quant_format, activation_type=cfg.activation_type,
                    weight_type=cfg.weight_type, op_types_to_quantize=cfg.op_types_to_quantize,
                    nodes_to_quantize=cfg.nodes_to_quantize, nodes_to_exclude=cfg.nodes_to_exclude,
                    per_channel=cfg.per_channel, reduce_range=cfg.reduce_range,
                    use_external_data_format=cfg.use_external_data_format,
                    calibration_providers=cfg.calibration_providers, extra_options=cfg.extra_options,
                    calibration_cache_path=None if ranges_cache is None else str(ranges_cache))



def activation_matmul_operands(src: Path) -> dict[str, list[str]]:
    """{tensor: [MatMul names]} for the second input of every activation x activation MatMul (attention's
    Q.K^T and P.V). With 16-bit activations these are re-encoded as int16 symmetric for those MatMuls
    only (a quantizer `convert` override; other consumers keep uint16).

    Why: for a uint16 x uint16 MatMul, ONNX Runtime's QNN EP inserts a Convert of input[1] to uint8 at the
    same range, so the HTP multiplies 16 x 8 bits (a lone Q.K^T at Spark's prefill shapes: 38.4 dB on
    the simulator, 81.6 on ORT CPU; the same product computed exactly at uint16 x uint8 on ORT CPU:
    38.4). With input[1] int16 symmetric the EP adds no Convert and the HTP runs a native 16 x 16 MatMul
    (73.3 dB); Spark's demo prefill logits 27.9 -> 30.4 dB (probe scripts mm3.py, exp13/14.py:
    `git show e0661b8:tools/spark_w8a16/`)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    consumers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers[i] = consumers.get(i, 0) + 1
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and not any(i in inits for i in n.input):
            t = n.input[1]
            if n.name:
                out.setdefault(t, []).append(n.name)
            elif consumers[t] == 1:          # an unnamed MatMul: convert for every consumer (it is the only one)
                out[t] = []
    return out


def linears_as_conv(src: Path, dst: Path) -> Path:
    """Every MatMul by a constant 2-D weight [in, out] (and every Gemm of a 2-D input by a constant
    weight, F.linear's form: its bias becomes the Conv's) as a 1x1 Conv over [1, in, 1, T] (T = the
    flattened leading dims), between Reshape/Transpose pairs; the node's output name is kept. Nodes
    reading one weight share one Conv weight (the fused predictor frame's 15 steps).

    Why: the QNN EP quantizes MatMul weights per tensor (QNN has no per-channel MatMul; onnxruntime's
    get_qnn_qdq_config forces per-tensor even with per_channel=True), Conv weights per output
    channel. Tokens go in the spatial axis: batching them (N = T) broke the quantized prefill on the
    HTP simulator (7.7 dB logits, 30.5 on ORT CPU) where this layout scores 27.9 dB.

    A source with external weights is read one weight at a time and dst's weights are streamed to
    DST.data: loaded whole and saved inline (1.78 GB, under onnxfile's 1.8 GB), the 0.6B talker
    prefill's form peaked at 7.2 GiB (shape inference copies the model) and its quantization, parsing
    that protobuf twice, at 11.1 GiB."""
    import onnx
    from onnx import helper, numpy_helper

    external = data_file(src).exists()
    model = onnx.load(str(src), load_external_data=not external)     # the graph alone when external
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    del inferred
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    nodes, k = [], 0
    conv_of: dict[str, tuple[str, bool]] = {}     # new Conv weight -> (the weight it lays out, stored [out, in])

    def const(name, values):
        g.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    shared: dict[tuple[str, bool], str] = {}   # (weight, stored [out, in]) -> its Conv weight
    for n in g.node:
        w, transposed, bias = None, False, None
        if n.op_type == "MatMul" and len(n.input) == 2:
            w = inits.get(n.input[1])
        elif n.op_type == "Gemm" and len(n.input) >= 2 and n.input[0] not in inits:
            # y = A B' + C with A [M, K], a constant B, unit alpha / beta (F.linear of a 2-D input)
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            b = inits.get(n.input[1])
            c = inits.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
            outs = b.dims[0 if a.get("transB", 0) else 1] if b is not None and len(b.dims) == 2 else None
            if not a.get("transA", 0) and a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0 and \
                    (len(n.input) < 3 or not n.input[2] or (c is not None and list(c.dims) == [outs])):
                w, transposed = b, bool(a.get("transB", 0))     # the bias: one per output, the Conv's
                bias = n.input[2] if c is not None else None
        out_shape = shapes.get(n.output[0], [])
        if w is None or len(w.dims) != 2 or not out_shape or 0 in out_shape:
            nodes.append(n)
            continue
        k += 1
        fan_in, fan_out = w.dims[::-1] if transposed else w.dims
        conv_w = shared.get((w.name, transposed))
        if conv_w is None:          # one Conv weight per weight, however many nodes read it
            conv_w = shared[(w.name, transposed)] = f"{w.name}.conv{k}"
            conv_of[conv_w] = (w.name, transposed)
        t = [f"{n.output[0]}.lc{k}.{x}" for x in ("x2", "xt", "x4", "y4", "y2", "yt")]
        nodes += [helper.make_node("Reshape", [n.input[0], const(f"lc{k}.s1", [-1, fan_in])], [t[0]]),
                  helper.make_node("Transpose", [t[0]], [t[1]], perm=[1, 0]),
                  helper.make_node("Reshape", [t[1], const(f"lc{k}.s2", [1, fan_in, 1, -1])], [t[2]]),
                  helper.make_node("Conv", [t[2], conv_w] + ([bias] if bias else []), [t[3]], kernel_shape=[1, 1],
                                   name=(n.name or f"linear{k}") + ".conv"),
                  helper.make_node("Reshape", [t[3], const(f"lc{k}.s3", [fan_out, -1])], [t[4]]),
                  helper.make_node("Transpose", [t[4]], [t[5]], perm=[1, 0]),
                  helper.make_node("Reshape", [t[5], const(f"lc{k}.s4", out_shape)], [n.output[0]])]
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}

    def conv_weight(name: str) -> np.ndarray:
        weight, transposed = conv_of[name]
        weight = numpy_helper.to_array(inits[weight], str(Path(src).parent))    # [in, out] ([out, in]: transposed)
        return np.ascontiguousarray((weight if transposed else weight.T)[:, :, None, None])

    if not external:
        keep = [i for i in g.initializer if i.name in used]
        keep += [numpy_helper.from_array(conv_weight(c), c) for c in conv_of]
        del g.initializer[:]
        g.initializer.extend(keep)
        onnxfile.save(model, dst)
        return dst
    from onnx.external_data_helper import uses_external_data

    data = data_file(dst)
    data.parent.mkdir(parents=True, exist_ok=True)
    tensors = []
    with open(data, "wb") as f:
        def stream(name: str, array: np.ndarray):
            return _write_external(f, name, array, data.name)

        for i in g.initializer:
            if i.name not in used:
                continue
            if uses_external_data(i):     # an untouched weight, copied one at a time
                tensors.append(stream(i.name, numpy_helper.to_array(i, str(Path(src).parent))))
            else:
                tensors.append(i)
        for c in conv_of:
            tensors.append(stream(c, conv_weight(c)))
    del g.initializer[:]
    g.initializer.extend(tensors)
    onnx.save(model, str(dst))
    return dst


# The last inline graph's activation ranges in this process: (sha256 of the graph's bytes, the calibration
# set itself, ONNX Runtime's TensorsData). Precision repair quantizes one fp32 graph on one calibration set
# once per sensitivity block and per step: Spark's demo decode at w4a16, 9 quantizations, spent 38 of
# their 60 s running the graph over the calibration set again for the same ranges. A graph with external
# data (past 256 MB) is not kept: each of its quantizations is a process of its own.
_RANGES: list = []


def activation_ranges(src: Path, calibration: Sequence[dict], work: Path,
                      keep: Path | None = None) -> dict[str, tuple[float, float]]:
    """MinMax of every activation over the calibration inputs (ONNX Runtime's calibrator).
    keep: also write them there as ONNX Runtime's calibration cache (quantize_static reads it).
    The same inline graph (by its bytes) on the same calibration set (the same object) is run once
    per process (_RANGES)."""
    import hashlib

    from onnxruntime.quantization.calibrate import save_tensors_data

    work.mkdir(parents=True, exist_ok=True)
    key = None if data_file(src).exists() else hashlib.sha256(Path(src).read_bytes()).hexdigest()
    ranges = next((r for k, cal, r in _RANGES if k == key and cal is calibration), None) if key else None
    if ranges is None:
        ranges = _collect_ranges(src, calibration)
        if key is not None:
            _RANGES[:] = [(key, calibration, ranges)]     # holds the set: its id is not reused meanwhile
    if keep is not None:
        save_tensors_data(ranges, keep)
    return {name: (float(np.min(r.range_value[0])), float(np.max(r.range_value[1]))) for name, r in ranges.items()}


def _collect_ranges(src: Path, calibration: Sequence[dict]):
    """ONNX Runtime's MinMax calibrator run over `calibration` on `src`: its TensorsData."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from ..memory import trim_heap

    # beside src: the calibration graph refers to src's data file by a relative path
    augmented = Path(src).with_name(f".{Path(src).stem}.augmented-{os.getpid()}.onnx")
    try:
        with linear_calibrator():
            cal = create_calibrator(Path(src), None, augmented_model_path=str(augmented),
                                    calibrate_method=CalibrationMethod.MinMax,
                                    use_external_data_format=data_file(src).exists(),
                                    providers=["CPUExecutionProvider"])
        cal.collect_data(_Reader(calibration))
        ranges = cal.compute_data()
        del cal
    finally:
        augmented.unlink(missing_ok=True)
        data_file(augmented).unlink(missing_ok=True)
        trim_heap()
    return ranges


def input_feed(path: Path) -> list[tuple[str, list, str]]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    out = []
    for i in m.graph.input:
        t = i.type.tensor_type
        out.append((i.name, [d.dim_value for d in t.shape.dim], onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name))
    return out


def _quiet_exporter() -> None:
    for name in ("torch.onnx", "torch.export", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)


def as_arrays(d: dict) -> dict:
    return {k: np.ascontiguousarray(v) for k, v in d.items()}

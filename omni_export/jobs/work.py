"""What a worker runs: each job is a plain function of values and paths, returning values and paths.

A worker rebuilds a component's graph from what the trace job left on disk: the recipe's loader on
the checkpoint the driver resolved (weights are read per component, safetensors only) and the
captured inputs and fp32 references as .npy files (read memory-mapped, no pickles). A long-lived
worker keeps the last graphs it rebuilt for the next job of the same component.

Intermediate graphs (fp32, fp16 and QDQ ONNX) are outputs of their own jobs; a job that needs one
is handed its path (`Lowering.adopt`) and never makes it again.
"""
from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

INPUT_KINDS = ("calibration", "heldout", "reference")
_KEEP = 2            # graphs a long-lived worker keeps (a component's jobs tend to follow each other)
_graphs: OrderedDict = OrderedDict()


@dataclass(frozen=True)
class GraphRef:
    """Everything a worker needs to rebuild one component's traced graph."""
    recipe: str
    checkpoint: str                  # the checkpoint directory the driver's loader resolved
    options: str                     # the recipe options, JSON
    scratch: str                     # the loader's scratch directory (OUT)
    component: str
    inputs: str                      # directory of calibration/ heldout/ reference/ (MappedSamples)
    counts: tuple[int, int, int]     # calibration, held-out, reference samples
    sources: tuple[str, str]         # where the calibration and held-out inputs came from
    target: str
    work: str                        # the component's intermediate graphs
    lowering: str                    # exporters.lower.Lowering keyword options, JSON
    specs: str = "{}"                # the graph's inputs, outputs and logits, JSON
    weight_bytes: int = 0            # > 0 only for graphs past HEAVY_BYTES (lean ORT sessions)
    placement: str = ""              # the unit the component runs on (targets.place_components)


def _lowering_kwargs(ref: GraphRef) -> dict:
    from ..core import Precision

    kw = json.loads(ref.lowering)
    kw["rewrites"] = tuple(kw.get("rewrites") or ())
    kw["headroom"] = {Precision(k): v for k, v in (kw.get("headroom") or {}).items()}
    return kw


def write_inputs(root: Path, traced) -> tuple[int, int, int]:
    """The trace job's hand-off: a traced graph's inputs and references as .npy files."""
    from ..exporters.onnx import MappedSamples

    counts = []
    for kind in INPUT_KINDS:
        samples = getattr(traced, kind)
        MappedSamples.write(samples, root / kind)
        counts.append(len(samples))
    return tuple(counts)


def _mapped(ref: GraphRef, kind: str, names: tuple[str, ...]):
    from ..exporters.onnx import MappedSamples

    n = ref.counts[INPUT_KINDS.index(kind)]
    return MappedSamples(Path(ref.inputs) / kind, n, names if n else ())


def load_graph(ref: GraphRef, module: bool = False):
    """(Lowering, Traced) of a component, made once per worker. The recipe's module (its weights) is
    loaded only for the jobs that need it (`module`: ONNX export, .pte lowering, attribution); the
    others work on files and the graph's I/O names."""
    from ..core import TensorSpec
    from ..exporters.lower import Lowering
    from ..targets import placed_on
    from ..trace import Traced

    if ref not in _graphs:
        specs = json.loads(ref.specs)
        ins = tuple(TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in specs["inputs"])
        outs = tuple(TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in specs["outputs"])
        names_in, names_out = tuple(s.name for s in ins), tuple(s.name for s in outs)
        traced = Traced(ref.component, None, ins, outs, calibration=_mapped(ref, "calibration", names_in),
                        heldout=list(_mapped(ref, "heldout", names_in)),
                        reference=list(_mapped(ref, "reference", names_out)), calibration_source=ref.sources[0],
                        heldout_source=ref.sources[1], logits=tuple(specs["logits"]))
        target = placed_on(ref.target, {ref.component: ref.placement} if ref.placement else {})
        lowering = Lowering(traced, target, Path(ref.work), **_lowering_kwargs(ref))
        lowering.weight_bytes = ref.weight_bytes
        while len(_graphs) >= _KEEP:
            _graphs.popitem(last=False)
        _graphs[ref] = (lowering, traced)
    _graphs.move_to_end(ref)
    lowering, traced = _graphs[ref]
    if module and traced.module is None:
        from ..core import RANDOM_WEIGHTS
        from ..recipes import get_recipe, load_model

        options = {**json.loads(ref.options), RANDOM_WEIGHTS: False}     # the checkpoint is written already
        model = load_model(get_recipe(ref.recipe), Path(ref.checkpoint), options, Path(ref.scratch))
        traced.module = model.graph(ref.component).module.eval()
    return lowering, traced


def _adopted(ref: GraphRef, states: list[dict], module: bool = False):
    lowering, traced = load_graph(ref, module)
    for s in states:
        lowering.adopt(s)
    return lowering, traced


@contextlib.contextmanager
def _finalized(lowering, finalize: str | None):
    """The block's QNN compiles at HTP graph finalization mode `finalize` (None: the build's own); the
    worker's cached lowering gets its mode back after."""
    before = lowering.htp_finalize
    if finalize is not None:
        lowering.htp_finalize = finalize
    try:
        yield
    finally:
        lowering.htp_finalize = before


# ---------------------------------------------------------------------------------- job functions

def export_onnx(ref: GraphRef) -> dict:
    """The fp32 ONNX (HTP-safe rewrites applied and checked in fp32)."""
    from ..core import Precision

    lowering, _ = load_graph(ref, module=True)
    lowering.onnx(Precision.FP32)
    return lowering.state()


def to_fp16(ref: GraphRef, states: list[dict], qnn: bool) -> dict:
    """The fp16 ONNX, and the QNN EP's fp16 source (shared MatMul weights) when an HTP build needs it."""
    from ..core import Precision

    lowering, _ = _adopted(ref, states)
    lowering.onnx(Precision.FP16)
    if qnn:
        lowering.qnn_fp16()
    return lowering.state()


def quantize(ref: GraphRef, states: list[dict], precision: str) -> dict:
    """The QDQ ONNX of a quantized precision, calibrated on the captured inputs."""
    from ..core import Precision

    lowering, _ = _adopted(ref, states)
    lowering.onnx(Precision(precision))
    return lowering.state()


def lower(ref: GraphRef, states: list[dict], spec, staging: str, consume: bool = False,
          finalize: str | None = None):
    """One artifact: exporters.lower.Built (files in `staging`, how to run them, details). `consume`:
    this process ends with the job, so a .pte lowering may free the module's fp32 weights once it
    holds its converted copy (the worker's cached module is unusable after). `finalize`: the HTP graph
    finalization mode of its QNN compile, when not the build's (a repair step that crashed QNN's)."""
    from ..core import Format

    lowering, traced = _adopted(ref, states, module=spec.format == Format.PTE)
    try:
        with _finalized(lowering, finalize):
            return lowering.build(spec, Path(staging), consume=consume)
    finally:
        if consume and spec.format == Format.PTE:
            _graphs.pop(ref, None)


def score(spec, ref: GraphRef, indices: list[int] | None):
    """A runner's outputs on held-out samples (all, or those `indices`), with the run's own seconds."""
    from ..runtime.pool import run_job

    held = _mapped(ref, "heldout", spec.input_names)
    return run_job(spec, list(held) if indices is None else [held[i] for i in indices])


def attribute(ref: GraphRef, states: list[dict], precision: str, on_cpu: bool, limit: int,
              only: str | None = None, on_target: tuple[str, ...] = ()) -> list[dict]:
    """Per block of a BlockChain: lower it alone at `precision`, feed it the fp32 activations in front
    of it, and score it on the target's runner (ORT CPU when `on_cpu`). Rows {block, runner, snr_db, ...}.
    `only`: that block alone (the block of the node a QNN compile refused, exporters/qnn_diagnose.py).
    `on_target`: blocks lowered on the target's runner even when `on_cpu` (a failed compile's block)."""
    from ..core import Precision
    from ..exporters.lower import Lowering
    from ..parity.metrics import score_outputs
    from ..runtime.runners import run_all
    from ..trace import trace_blocks
    from .errors import short

    lowering, traced = _adopted(ref, states, module=True)
    p = Precision(precision)
    rows = []
    for i, block in enumerate(trace_blocks(traced, heldout_limit=limit)):
        row = {"block": block.name.split(":", 1)[1]}
        if only is not None and row["block"] != only:
            continue
        try:
            lw = Lowering(block, lowering.target, Path(ref.work) / f"block{i}", **_lowering_kwargs(ref))
            spec = lw.cpu_runner(p) if on_cpu and row["block"] not in on_target else lw.primary_runner(p)
            row["runner"] = spec.label
            scores = score_outputs(block.output_names, block.reference, run_all(spec, block.heldout))
            s = min(scores, key=lambda x: x.snr_db)
            row.update({"snr_db": round(s.snr_db, 3) if s.finite else None,
                        "psnr_db": round(s.psnr_db, 3) if s.finite else None, "finite": s.finite})
        except Exception as e:
            from ..artifacts.store import is_disk_full

            if is_disk_full(e):
                raise
            row.update({"snr_db": None, "error": short(e)})
        rows.append(row)
    return rows


def repair_step(ref: GraphRef, states: list[dict], precision: str, blocks: list[str], tag: str, runner: str,
                indices: list[int] | None, per_channel: bool = False, raise_to: str = "float",
                finalize: str | None = None) -> dict:
    """One step of precision repair (jobs/repair.py): the graph quantized at `precision`'s base with the
    nodes of `blocks` (module scopes, exporters.onnx.scope_nodes: a BlockChain's `blocks.3`, a
    transformer's `decoder.layers.24`) kept in float, run on `runner` ("qnn-htp": the HTP
    simulator, compiling it; "ort-cpu") over the held-out samples (all, or those `indices`); with
    `per_channel`, its linears quantized per output channel (as 1x1 Conv) where the component's are per
    tensor. `raise_to` "float" keeps the blocks' nodes in float; "int16" / "int8" quantize their weights
    at that width instead, every node still quantized (jobs/repair.RAISES). `finalize`: the HTP graph
    finalization mode of the simulator's compile, when not the build's. Returns the
    intermediate graphs' state (the mixed QDQ ONNX among them, for the builds made from it), the
    outputs, the share of weight bytes per width and the nodes kept."""
    from ..core import Precision
    from ..exporters.onnx import float_island, scope_nodes, weight_bits
    from ..runtime.runners import run_all
    from .repair import RAISES

    lowering, _ = _adopted(ref, states)
    p = Precision(precision)
    src = lowering.onnx(Precision.FP32)
    nodes = scope_nodes(src)
    chosen = [n for b in blocks for n in nodes.get(b, [])]
    bits = RAISES[raise_to]
    if bits:                        # the blocks' weights at `bits`, every node still quantized
        keep, wide = [], chosen
    else:           # the blocks' table lookups, left out of the float island, keep 16-bit tables
        keep = float_island(src, chosen)
        island = set(keep)
        wide = [n for n in chosen if n not in island]
    path = lowering.quantize_mixed(p, keep, tag, True if per_channel else None, wide, bits or 16)
    with _finalized(lowering, finalize):
        spec = lowering.primary_runner(p) if runner == "qnn-htp" else lowering.cpu_runner(p)
    held = _mapped(ref, "heldout", spec.input_names)
    outputs = run_all(spec, list(held) if indices is None else [held[i] for i in indices])
    return {**lowering.state(), "outputs": outputs, "weight_bits": weight_bits(path), "kept_nodes": len(keep),
            "runner": spec.label}


def sensitivity(ref: GraphRef, states: list[dict], precision: str, limit: int, gated: tuple = ()) -> list[dict]:
    """Per block (exporters.onnx.block_nodes: a BlockChain's blocks, a transformer's layers, its norm and
    heads, ...): the whole graph with only that block quantized at `precision` (every other node in
    float), run on ORT CPU over the last `limit` held-out samples and scored against fp32 -- what
    quantizing that block costs the graph's outputs, downstream amplification included (an outlier
    channel a block's rounding loses and a later block amplifies shows here, not in the block-alone
    attribution). Rows {block, snr_db} in graph order (jobs/repair.py ranks them)."""
    from ..core import Precision
    from ..exporters.onnx import block_nodes
    from ..parity.metrics import score_outputs
    from ..runtime.runners import run_all
    from .errors import short

    lowering, traced = _adopted(ref, states)
    p = Precision(precision)
    src = lowering.onnx(Precision.FP32)
    nodes = block_nodes(src)
    every = [n for ns in nodes.values() for n in ns]
    held = list(_mapped(ref, "heldout", traced.input_names))[-limit:]
    refs = list(_mapped(ref, "reference", traced.output_names))[-limit:]
    specs = json.loads(ref.specs)
    rows = []
    for i in nodes:
        row = {"block": i}
        try:
            mine = set(nodes[i])
            lowering.quantize_mixed(p.repaired(), [n for n in every if n not in mine], f"only{i}")
            outs = run_all(lowering.cpu_runner(p.repaired()), held)
            scores = score_outputs(traced.output_names, refs, outs, tuple(specs.get("logits") or ()))
            floats = [s.snr_db for s in scores if s.agreement is None and (not gated or s.name in gated)]
            row["snr_db"] = round(min(floats), 3) if floats and all(s.finite for s in scores) else None
        except Exception as e:
            from ..artifacts.store import is_disk_full

            if is_disk_full(e):
                raise
            row.update({"snr_db": None, "error": short(e)})
        rows.append(row)
    lowering.forget(p.repaired())
    return rows


def end_to_end(recipe: str, checkpoint: str, options: str, out: str, manifest: str, runners: dict,
               meter: str | None = None, part: tuple[int, int] | None = None) -> dict:
    """The recipe's end-to-end rows for `runners` over the builds in OUT that `manifest` lists; the
    model loaded here (weights per graph as the rows need them). {"rows", "notes"}. The host loops'
    frames done / total go to the file `meter` (progress.FrameFile), for the build's heartbeat.
    `part` (k, n): the recipe's part k of n of the held-out prompts (Recipe.end_to_end_merge)."""
    import contextlib

    from ..progress import FrameFile, Progress, frame_sink
    from ..core import RANDOM_WEIGHTS
    from ..recipes import get_recipe, load_callable, load_model

    class Notes(Progress):
        def __init__(self):
            self.notes: list[str] = []

        def note(self, text: str) -> None:
            self.notes.append(text)

    r = get_recipe(recipe)
    model = load_model(r, Path(checkpoint), {**json.loads(options), RANDOM_WEIGHTS: False}, Path(out))
    progress = Notes()
    with frame_sink(FrameFile(meter)) if meter else contextlib.nullcontext():
        kw = {"part": tuple(part)} if part is not None else {}
        rows = load_callable(r.end_to_end)(model, Path(out), json.loads(manifest), runners, progress, **kw)
    return {"rows": rows, "notes": progress.notes}

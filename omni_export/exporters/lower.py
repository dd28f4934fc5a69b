"""Lower: one traced graph -> artifact files for a (format, precision), plus how to run them.

Intermediate graphs are shared between formats: the (HTP-rewritten) fp32 ONNX feeds the ONNX,
DLC and context-binary builds; each QDQ ONNX is quantized once per precision. Exporters take
programs, files and named tensors -- never a model.
"""
from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import faults
from ..core import BuildSpec, Format, Precision, Target
from ..parity.metrics import score_outputs
from ..runtime.runners import RunnerSpec
from . import rewrites as rw

REWRITE_MIN_DB = 100.0


_CHILD_ROLES = {"compile_context": "QNN context-binary compile child", "compile_dlc": "QNN DLC compile child",
                "quantize_qdq": "quantizer child"}


def isolated(big: bool, fn, *args):
    """fn(*args), in a fresh spawned process when `big` (a graph with external data, past 256 MB
    of weights). The QNN EP's graph compiles and ONNX Runtime's quantizer keep what they allocate
    after their session is gone: in one process, lowering the 0.6B talker's prefill grew RssAnon
    from 5.7 to 12.3 GiB (QNN DLC + context compiles) and peaked at 18.2 GiB quantizing it, and the
    next graph started from there. A child returns all of it on exit. Small graphs stay in process
    (spawning costs ~2 s), and so does every step of a job already in a process of its own (a job
    worker, jobs/local.py: a heavy graph's job gets a fresh one)."""
    import os

    if not big or os.environ.get("OMNI_EXPORT_IN_WORKER"):
        return fn(*args)
    import concurrent.futures as cf
    import gc
    import multiprocessing as mp

    from ..memory import trim_heap
    from ..runtime.pool import init_child

    # the child's GiBs run beside this process: hand back first what the last steps freed (the
    # talker decode's build process held 2.59 GiB after its fp16 .pte lowering, 1.49 once trimmed)
    gc.collect()
    trim_heap()

    with cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                initializer=init_child, initargs=(_CHILD_ROLES.get(fn.__name__, fn.__name__),)) as ex:
        return ex.submit(fn, *args).result()


@dataclass
class Built:
    files: list[Path]
    runner: RunnerSpec
    details: dict = field(default_factory=dict)


class Lowering:
    """Per (traced graph, target): memoised intermediate graphs in `work`."""

    def __init__(self, traced, target: Target, work: Path, rewrites: tuple[str, ...] = (),
                 headroom: dict | None = None, per_channel_linears: bool = False,
                 weight_rounding: str = "nearest", htp_finalize: str | None = None):
        self.traced, self.target, self.work = traced, target, work
        self.htp_finalize = htp_finalize          # QNN graph finalization mode (qnn_ep.provider_options)
        self.shared_weights = 0
        self.headroom = dict(headroom or {})      # {Precision: fraction}: the component's override
        self.per_channel_linears = per_channel_linears
        self.weight_rounding = weight_rounding
        self.rewrites = tuple(rewrites)
        self.rewrite_report: list[dict] = []
        self._program = None
        self._onnx: dict[str, Path] = {}
        self.kept_float: dict[str, list[str]] = {}   # mixed precision -> nodes precision repair kept in float
        self.mixed_per_channel: dict[str, bool] = {}  # mixed precision -> its linears quantized per channel
        from ..memory import NO_GATE

        self.gate = NO_GATE          # memory.MemoryGate: heavy steps hold their estimate while they run
        self.weight_bytes = 0        # the graph's fp32 weight bytes, when it is heavy enough to gate
        work.mkdir(parents=True, exist_ok=True)

    # ---- hand-off between jobs
    def state(self) -> dict:
        """The intermediate graphs made so far and what they found, for the jobs that need them."""
        return {"onnx": {k: str(v) for k, v in self._onnx.items()}, "rewrite_report": self.rewrite_report,
                "shared_weights": self.shared_weights, "kept_float": self.kept_float,
                "mixed_per_channel": self.mixed_per_channel}

    def adopt(self, state: dict) -> None:
        """Take intermediate graphs another job made (its `state()`) instead of making them again."""
        self._onnx.update({k: Path(v) for k, v in state.get("onnx", {}).items()})
        if state.get("rewrite_report"):
            self.rewrite_report = state["rewrite_report"]
        self.shared_weights = state.get("shared_weights") or self.shared_weights
        self.kept_float.update(state.get("kept_float") or {})
        self.mixed_per_channel.update(state.get("mixed_per_channel") or {})

    # ---- graphs
    def program(self):
        """The exported program with the HTP-safe rewrites, each checked in fp32."""
        if self._program is not None:
            return self._program
        base = self.traced.program()
        if not self.rewrites:
            self._program = base
            return base
        rewritten, counts = rw.apply(base, self.rewrites)
        applied = {k: v for k, v in counts.items() if v}
        if applied:
            module = rewritten.module()
            outs = [self.traced.run_eager(s, module) for s in self.traced.heldout]
            scores = score_outputs(self.traced.output_names, self.traced.reference, outs)
            floats = [s.snr_db for s in scores if s.agreement is None]
            exact = all(s.agreement == 1.0 for s in scores if s.agreement is not None)
            db = min(floats) if floats and exact else (float("inf") if exact else float("-inf"))
            ok = db >= REWRITE_MIN_DB
            self.rewrite_report = [{"rewrite": k, "ops_replaced": v, "fp32_snr_db": round(db, 2),
                                    "applied": ok, "doc": rw.REWRITES[k].doc} for k, v in applied.items()]
            self._program = rewritten if ok else base
        else:
            self._program = base
        return self._program

    def onnx(self, precision: Precision) -> Path:
        from . import onnx as ox

        key = precision.value
        if key in self._onnx:
            return self._onnx[key]
        names = (self.traced.input_names, self.traced.output_names)
        if precision == Precision.FP32:
            path = ox.export(self.program(), self.work / "fp32.onnx", *names)
        elif precision == Precision.FP16:
            path = ox.to_fp16(self.onnx(Precision.FP32), self.work / "fp16.onnx")
        elif precision.mixed:
            raise ValueError(f"{key} is made by precision repair (Lowering.quantize_mixed), from a rejected "
                             f"{precision.base.value} build")
        else:
            if not self.traced.calibration:
                raise ValueError(f"{precision.value} needs calibration inputs; none were captured")
            src = self.onnx(Precision.FP32)
            big = ox.data_file(src).exists()
            calibration = self.traced.calibration
            mapped = big and not isinstance(calibration, ox.MappedSamples)
            if mapped:  # the child maps the calibration inputs from files instead of unpickling a copy
                calibration = ox.MappedSamples.write(calibration, self.work / f"{key}.calibration")
            try:
                with self._hold("quantize"):
                    path = isolated(big, ox.quantize_qdq, src, self.work / f"{key}.qdq.onnx", calibration, precision,
                                    self.headroom.get(precision), self.per_channel_linears, self.weight_rounding)
            finally:
                if mapped:
                    shutil.rmtree(calibration.root, ignore_errors=True)
        self._onnx[key] = path
        return path

    def quantize_mixed(self, precision: Precision, keep_float: list[str], tag: str,
                       per_channel: bool | None = None, wide: list[str] = (), wide_bits: int = 16) -> Path:
        """Precision repair's QDQ graph: `precision`'s base quantization with the nodes `keep_float`
        left in float (fp16 on the HTP) and the weights of the nodes `wide` at `wide_bits` integers,
        its linears per output channel when `per_channel` (lowered as 1x1 Conv; None: as the component
        says). Written as <mixed>.<tag>.qdq.onnx, one per search step."""
        from . import onnx as ox

        base = precision.base
        per_channel = self.per_channel_linears if per_channel is None else bool(per_channel)
        src = self.onnx(Precision.FP32)
        calibration = self.traced.calibration
        big = ox.data_file(src).exists()
        mapped = big and not isinstance(calibration, ox.MappedSamples)
        if mapped:
            calibration = ox.MappedSamples.write(calibration, self.work / f"{precision.value}.{tag}.calibration")
        try:
            with self._hold("quantize"):
                path = isolated(big, ox.quantize_qdq, src, self.work / f"{precision.value}.{tag}.qdq.onnx",
                                calibration, base, self.headroom.get(base), per_channel,
                                self.weight_rounding, True, "block", tuple(keep_float), tuple(wide), wide_bits)
        finally:
            if mapped:
                shutil.rmtree(calibration.root, ignore_errors=True)
        self._onnx[precision.value] = path
        self.kept_float[precision.value] = list(keep_float)
        self.mixed_per_channel[precision.value] = per_channel
        return path

    def forget(self, precision: Precision) -> None:
        """Drop the graph recorded for `precision` (a probe of quantize_mixed that is no build's graph:
        precision repair's per-block sensitivity), so a later build of it makes its own."""
        self._onnx.pop(precision.value, None)
        self.kept_float.pop(precision.value, None)
        self.mixed_per_channel.pop(precision.value, None)

    def qnn_source(self, precision: Precision) -> tuple[Path, dict]:
        """The ONNX the QNN EP compiles for this precision, and its provider options (fp16 on for a
        mixed graph's float nodes)."""
        from .. import qnn_ep

        src = self.qnn_fp16() if precision == Precision.FP16 else self.onnx(precision)
        fp16 = precision == Precision.FP16 or bool(self.kept_float.get(precision.value))
        opts = qnn_ep.provider_options(self.target.soc_model, self.target.htp_arch,
                                       fp16=fp16, finalize=self.htp_finalize)
        return src, opts

    def qnn_fp16(self) -> Path:
        """The ONNX the QNN EP compiles at fp16: the fp16 ONNX, with each weight several MatMuls read
        passed so that the EP keeps one copy of it (onnx.share_matmul_weights).

        Not the fp32 ONNX: the HTP computes in fp16 either way (same outputs to 0.01 dB on the 0.6B
        talker decode step), but from fp32 weights the compile holds them and the DLC stores them at
        fp32. Measured on that graph (single runs, one process each): DLC 1.78 -> 0.89 GB, its compile
        13.9 -> 6.7 s and 3.56 -> 1.79 GiB RssAnon; context binary compile 19.5 -> 14.5 s and
        4.41 -> 3.68 GiB."""
        from . import onnx as ox

        if "qnn-fp16" not in self._onnx:
            src = self.onnx(Precision.FP16)
            dst = self.work / "fp16.qnn.onnx"
            self.shared_weights = ox.share_matmul_weights(src, dst)
            self._onnx["qnn-fp16"] = dst if self.shared_weights else src
        return self._onnx["qnn-fp16"]

    @property
    def placement(self):
        """Where this graph runs on the target (a block graph "comp:block" runs with its component)."""
        return self.target.place(self.traced.name.split(":", 1)[0])

    def primary_runner(self, precision: Precision) -> RunnerSpec:
        """Where this graph would run on the target: the HTP simulator for an HTP-placed graph,
        else ORT CPU (for a GPU-placed graph, as a proxy at the same precision)."""
        if self.target.has_htp and self.placement.unit == "htp" and precision != Precision.FP32:
            src, opts = self.qnn_source(precision)
            return self._htp_spec(str(src), src, opts)
        return self._spec("ort-cpu", self.onnx(precision), self._proxy())

    def cpu_runner(self, precision: Precision) -> RunnerSpec:
        """This graph's ONNX at `precision` (QDQ when quantized) on ORT CPU."""
        return self._spec("ort-cpu", self.onnx(precision), self._proxy())

    # ---- builds
    def build(self, spec: BuildSpec, staging: Path, consume: bool = False) -> Built:
        """One artifact in `staging`. `consume`: a .pte lowering may free the traced module's fp32
        weights once it holds its converted copy (exporters.executorch.export_pte)."""
        out = staging / spec.filename
        p = spec.precision
        if spec.format == Format.ONNX:
            from .onnx import copy as copy_onnx

            files = copy_onnx(self.onnx(p), out)
            return Built(files, self._spec("ort-cpu", out, self._proxy()), self._details(p))
        if spec.format == Format.DLC:
            from .. import qnn_ep

            src, opts = self.qnn_source(p)
            with self._hold("qnn-dlc"), self._diagnosed(src, opts):
                dlc = isolated(_big(src), qnn_ep.compile_dlc, src, staging / "dlc", opts)
            shutil.move(str(dlc), out)
            shutil.rmtree(staging / "dlc", ignore_errors=True)
            d = self._details(p, qnn=True)
            d["scored_as"] = ("the QNN graph this DLC serialises, run on the HTP simulator (the outputs of the "
                              "context binary compiled from the same ONNX and options, when one is built)")
            return Built([out], self._htp_spec(str(src), src, opts), d)
        if spec.format == Format.CTX:
            from .. import qnn_ep

            src, opts = self.qnn_source(p)
            faults.htp_crash(src, opts)
            with self._hold("qnn-compile"), self._diagnosed(src, opts):
                ctx, binary = isolated(_big(src), qnn_ep.compile_context, src, out, opts)
            d = self._details(p, qnn=True)
            d["wrapper"] = "EPContext .onnx (ONNX Runtime QNN EP); the *_qnn.bin is the raw QNN context binary"
            return Built([ctx, binary], self._htp_spec(str(ctx), src, opts), d)
        if spec.format == Format.PTE:
            from .executorch import export_pte

            calib = _CallArgs(self.traced) if p.quantized else ()
            with self._hold("pte-lower"):
                details = export_pte(self.traced.module, self.traced.example, out, p, calib,
                                     self.weight_rounding if p == Precision.W8A16 else "nearest", consume=consume)
            return Built([out], self._spec("executorch", out), details)
        raise ValueError(f"no exporter for {spec.format}")

    # ---- helpers
    @contextlib.contextmanager
    def _diagnosed(self, src: Path, opts: dict):
        """A QNN compile of `src` that fails raises a QnnCompileError naming the node QNN refused, its
        op type and shapes, and the rewrite that may avoid it (qnn_diagnose.py), when QNN's log says."""
        try:
            yield
        except Exception as e:
            from ..artifacts.store import is_disk_full
            from .qnn_diagnose import compile_failure

            if is_disk_full(e):
                raise
            raise compile_failure(e, src, opts, self.rewrites) from e

    def _hold(self, kind: str):
        """Hold this graph's reservation for a heavy step of `kind` on the memory gate (alone when
        memory.runs_alone says so and the gate keeps those alone)."""
        from ..memory import runs_alone

        need = self.need(kind)
        return self.gate.hold(need, alone=runs_alone(kind, need))

    def need(self, kind: str) -> int:
        """The memory a heavy step of this graph reserves (memory.step_bytes); 0 for a light graph."""
        from ..memory import step_bytes

        return step_bytes(kind, self.weight_bytes)

    def _details(self, p: Precision, qnn: bool = False) -> dict:
        from .onnx import INT4_BLOCK, OPSET

        d = {"opset": OPSET, "rewrites": self.rewrite_report}
        if p.quantized:
            # Per channel for Conv weights; MatMul weights are per tensor (the QNN EP has no per-channel
            # MatMul) unless the component lowers its linears as Conv (per_channel_linears).
            d["scheme"] = {"w8a16": "QDQ: uint8 weights (Conv per channel, MatMul per tensor), uint16 activations (MinMax)",
                           "w8a8": "QDQ: uint8 weights (Conv per channel, MatMul per tensor), uint8 activations (MinMax)",
                           "w4a16": f"QDQ: int4 symmetric MatMul / Conv weights (per block of {INT4_BLOCK} input channels "
                                    "for MatMul and 1x1 Conv, else per output channel), other constants as w8a16, uint16 "
                                    "activations (MinMax)"}[p.base.value]
            if self.kept_float.get(p.value):
                d["scheme"] += (f"; precision repair kept {len(self.kept_float[p.value])} nodes in float "
                                "(fp16 on the HTP)")
            d["calibration_samples"] = len(self.traced.calibration)
            from .onnx import HEADROOM

            d["activation_headroom"] = self.headroom.get(p.base, HEADROOM[p.base])
            if self.mixed_per_channel.get(p.value, self.per_channel_linears):
                d["scheme"] += ("; precision repair: " if self.mixed_per_channel.get(p.value) and not
                                self.per_channel_linears else "; ") + "linears as 1x1 Conv" + ("" if p.base == Precision.W4A16 else ": per-output-channel weights")
            d["weight_rounding"] = self._rounding(p)
            if p.value in self._onnx:
                from .onnx import weight_bits

                d["weight_bits"] = weight_bits(self._onnx[p.value])
        elif p == Precision.FP16:
            d["scheme"] = ("HTP fp16 (enable_htp_fp16_precision) from the fp16 ONNX" if qnn
                           else "fp16 weights and compute, fp32 I/O (Cast at the edges)")
        else:
            d["scheme"] = "fp32"
        if qnn:
            d["htp_graph_finalization"] = self.htp_finalize or "QNN default"
            if p == Precision.FP16 and self.shared_weights:
                d["shared_matmul_weights"] = self.shared_weights
        return d

    def _rounding(self, p: Precision):
        """How the QDQ weights were rounded: "nearest", or GPTQ's summary (exporters/gptq.py)."""
        if self.weight_rounding == "nearest":
            return "nearest"
        import json

        from .gptq import sidecar

        path = sidecar(self._onnx[p.value]) if p.value in self._onnx else None
        if path is None or not path.exists():
            return self.weight_rounding
        return {"method": self.weight_rounding, **json.loads(path.read_text())["summary"],
                "per_weight": path.name}

    def _proxy(self) -> dict:
        """ORT CPU stands in for a unit nothing here can run (the Adreno GPU): say so in the runner."""
        unit = self.placement.unit
        return {"proxy_for": unit} if unit not in ("cpu", "htp") else {}

    def _spec(self, kind: str, path: Path, options: dict | None = None, key: str | None = None) -> RunnerSpec:
        options = dict(options or {})
        if kind == "ort-cpu" and self.weight_bytes:
            # a heavy graph scores in a lean session (runtime.runners.open_runner): its fp16 / QDQ
            # weights stay in the file's pages instead of an fp32 copy in the scoring worker
            options["session"] = "lean"
        return RunnerSpec(kind, str(path), self.traced.input_names, self.traced.output_names, options, key)

    def _htp_spec(self, model: str, src: Path, opts: dict) -> RunnerSpec:
        # A context binary and a DLC from the same source ONNX and options hold the same QNN graph:
        # their outputs are computed once (result_key); the context binary is still loaded.
        key = hashlib.sha256((_file_digest(src) + repr(sorted(opts.items()))).encode()).hexdigest()
        return self._spec("qnn-htp", Path(model), dict(opts), key)


def _big(path: Path) -> bool:
    from .onnx import data_file

    return data_file(Path(path)).exists()


def _file_digest(path: Path) -> str:
    from ..artifacts.store import sha256_file

    return sha256_file(path)


class _CallArgs(Sequence):
    """The traced calibration calls as positional tensors, each made when it is used: a KV-cache
    graph's call is held compact (captured.Sample) and padded back to its full cache when read --
    235 MB per talker decode call at real sizes, 3.7 GB for its 16 calibration calls held at once."""

    def __init__(self, traced):
        self.traced = traced

    def __len__(self) -> int:
        return len(self.traced.calibration)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self.traced.args(self.traced.calibration[i])

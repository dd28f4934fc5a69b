"""Runners: load an artifact file on a real runtime and run named inputs to named outputs.

Parity knows runners, not formats: an exporter hands back a RunnerSpec saying which runtime loads
which file with which options.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .. import faults


PROXY_NAMES = {"gpu": "Adreno GPU"}


@dataclass(frozen=True)
class RunnerSpec:
    kind: str                       # "ort-cpu" | "qnn-htp" | "executorch"
    model: str                      # file the runtime loads
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    options: dict = field(default_factory=dict, hash=False)
    # Builds whose outputs are the same computation share a key, so they run once (see lower.py).
    result_key: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "qnn-htp":
            o = self.options
            prec = "fp16" if o.get("enable_htp_fp16_precision") == "1" else "quantized"
            return f"QNN HTP simulator (soc_model {o.get('soc_model')}, v{o.get('htp_arch')}, {prec})"
        lean = " (lean session)" if self.lean else ""
        if self.proxy_for:
            return f"ONNX Runtime CPU{lean} as a proxy for the {PROXY_NAMES[self.proxy_for]} (same precision)"
        return {"ort-cpu": f"ONNX Runtime CPU{lean}", "executorch": "ExecuTorch runtime (XNNPACK)"}[self.kind]

    @property
    def short(self) -> str:
        if self.kind == "qnn-htp":
            return "htp-sim fp16" if self.options.get("enable_htp_fp16_precision") == "1" else "htp-sim"
        if self.proxy_for:
            return f"ort-cpu ({self.proxy_for} proxy)"
        return {"ort-cpu": "ort-cpu", "executorch": "executorch"}[self.kind]

    @property
    def lean(self) -> bool:
        """An ONNX Runtime CPU session that keeps the weights in the file (open_runner's `lean`)."""
        return self.kind == "ort-cpu" and self.options.get("session") == "lean"

    @property
    def proxy_for(self) -> str | None:
        """The device unit an ORT CPU run stands in for (a GPU-placed graph), else None."""
        return self.options.get("proxy_for") if self.kind == "ort-cpu" else None

    def to_json(self) -> dict:
        return {"kind": self.kind, "short": self.short, "label": self.label, "options": dict(self.options)}


def proxy_verdict(runner: RunnerSpec, precision: str) -> dict | None:
    """What a verdict from a proxy runner rests on (a graph placed on a unit nothing here runs: the
    Adreno GPU): which runner, which precision, for which unit; None for a runner of the unit itself.
    Its `note` is what the reports say beside the verdict; AI Hub's device run re-judges it (hub/stage.py)."""
    if not runner.proxy_for:
        return None
    unit = PROXY_NAMES[runner.proxy_for]
    return {"runner": "ORT CPU", "precision": precision, "for": unit,
            "note": f"judged on ORT CPU at {precision} by proxy for the {unit}; re-judged on the device with --hub"}


class Runner:
    def __init__(self, spec: RunnerSpec):
        self.spec = spec

    def run(self, inputs: dict) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass


class OrtRunner(Runner):
    def __init__(self, spec: RunnerSpec, session):
        super().__init__(spec)
        self.session = session
        self._names = [o.name for o in session.get_outputs()]
        self._inputs = {i.name: i for i in session.get_inputs()}

    def run(self, inputs: dict) -> dict:
        feed = {n: _as_type(inputs[n], self._inputs[n].type) for n in self._inputs}
        outs = self.session.run(None, feed)
        return dict(zip(self.spec.output_names, outs)) if len(outs) == len(self.spec.output_names) \
            else dict(zip(self._names, outs))

    def close(self) -> None:
        self.session = None


class ExecuTorchRunner(Runner):
    def __init__(self, spec: RunnerSpec):
        super().__init__(spec)
        from executorch.runtime import Runtime

        from ..quiet import filtered_stderr

        self.program = Runtime.get().load_program(spec.model)
        with filtered_stderr():      # XNNPACK's Arm-only CPU probe prints on first load here
            self.method = self.program.load_method("forward")

    def run(self, inputs: dict) -> dict:
        import torch

        # writable: held-out inputs are read-only memory maps, which torch warns about
        args = [torch.from_numpy(np.require(inputs[n], requirements=["C", "W"])) for n in self.spec.input_names]
        outs = self.method.execute(args)
        return {n: o.float().numpy() if o.is_floating_point() and o.dtype != torch.float32 else o.numpy()
                for n, o in zip(self.spec.output_names, outs)}

    def close(self) -> None:
        self.method = self.program = None


def open_runner(spec: RunnerSpec, threads: int | None = None, lean: bool = False) -> Runner:
    """`threads` fixes ONNX Runtime CPU's intra-op thread count (benchmarks); None: its default.

    lean (ONNX Runtime CPU only): the session runs on the weights as the file holds them, for runs
    where memory matters more than speed. ONNX Runtime's extended graph optimizations give an fp16
    graph an fp32 copy of its weights when the session opens (+1.8 GiB for the 0.6B talker, whose
    fp16 file is 0.85 GB and stays memory-mapped), and its memory arena keeps what a run allocates;
    lean sessions use the basic optimizations only and no arena, so the fp32 copy of each weight
    lives only while its op runs. Same graph, same fp32 arithmetic; measured on the 0.6B talker
    decode step: 0.08 vs 1.97 GiB after a call, 627 vs 164 ms per call."""
    if spec.kind == "ort-cpu":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
        if lean or spec.lean:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
            so.enable_cpu_mem_arena = False
            so.enable_mem_pattern = False
        return OrtRunner(spec, ort.InferenceSession(spec.model, so, providers=["CPUExecutionProvider"]))
    if spec.kind == "qnn-htp":
        from .. import qnn_ep

        faults.htp_crash(spec.model, spec.options)
        return OrtRunner(spec, qnn_ep.session(spec.model, spec.options))
    if spec.kind == "executorch":
        return ExecuTorchRunner(spec)
    raise ValueError(f"unknown runner kind {spec.kind}")


def run_all(spec: RunnerSpec, inputs: Sequence[dict], times: dict | None = None) -> list[dict]:
    """times: filled with open_s (loading / compiling the artifact) and run_s (every sample)."""
    import time

    t0 = time.time()
    runner = open_runner(spec)
    t1 = time.time()
    try:
        outputs = [runner.run(x) for x in inputs]
    finally:
        runner.close()
        if times is not None:
            times.update(open_s=round(t1 - t0, 3), run_s=round(time.time() - t1, 3))
    if faults.poisoned(spec.model):
        outputs = [{k: np.full_like(v, np.nan) if np.issubdtype(v.dtype, np.floating) else v for k, v in o.items()}
                   for o in outputs]
    return outputs


_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32,
              "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


def _as_type(a, ort_type: str):
    dt = _ORT_TYPES.get(ort_type)
    a = np.asarray(a)
    return np.ascontiguousarray(a.astype(dt, copy=False) if dt is not None else a)

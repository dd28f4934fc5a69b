"""Ways to run a recipe's graphs by name: fp32 eager modules, or the artifacts of a build on a
runner (ONNX Runtime, the HTP simulator, ExecuTorch). A host loop only sees `graphs(name, inputs)`.
Shared by every recipe (no recipe is named here).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core import UsageError


class GraphSet(Protocol):
    def __call__(self, name: str, inputs: dict) -> dict: ...


class EagerGraphs:
    """fp32 torch modules from the loaded checkpoint: the reference every build is scored against."""

    def __init__(self, model):
        self.model = model
        self._graphs = {}

    def graph(self, name: str):
        if name not in self._graphs:
            self._graphs[name] = self.model.graph(name)
        return self._graphs[name]

    def __call__(self, name: str, inputs: dict) -> dict:
        import torch

        g = self.graph(name)
        args = [torch.from_numpy(np.ascontiguousarray(inputs[s.name])) for s in g.inputs]
        with torch.no_grad():
            out = g.module(*args)
        out = out if isinstance(out, tuple) else (out,)
        return {s.name: o.detach().numpy() for s, o in zip(g.outputs, out)}


RUNNER_FORMATS = {"ort": ("onnx", "ort-cpu"), "htp": ("ctx", "qnn-htp"), "pte": ("pte", "executorch")}


class BuildGraphs:
    """The accepted artifacts of a build directory, run on one runner kind (ort | htp | pte).

    A graph that must stay fp32 (its manifest entry has `fp32_on_cpu`) runs its fp32 build on the CPU
    whatever the row's precision (ONNX Runtime; ExecuTorch for the pte runner), as deployed beside an
    NPU; `fp32_on_cpu=False` runs it at the row's precision on the runner like every other graph.
    `placed` names the graphs run that way.

    Sessions open on first use and stay open, unless `max_open_bytes` is given: then opening one
    whose estimate (SESSION_FACTOR x its files' bytes) would not fit beside the open ones first
    closes the least recently used (at 1.7B the talker's prefill and decode sessions at fp16 would
    not both fit beside the build on 24 GiB; the prefill runs once per prompt).

    lean: ONNX Runtime CPU sessions keep the weights in the file's pages (runtime.runners.open_runner):
    ~4x slower per talker step, ~1.8 GiB less per 0.6B talker session."""

    SESSION_FACTOR = 3      # an fp16 ONNX on ORT CPU folds its weights to fp32 (2x) beside the fp16 copy
    LEAN_FACTOR = 1         # lean: the file's pages, plus one op's fp32 weights at a time

    def __init__(self, out: Path, runner: str, precision: str | None = None, allow_rejected: bool = False,
                 manifest: dict | None = None, fp32_on_cpu: bool = True, max_open_bytes: int | None = None,
                 lean: bool = False):
        from .runners import RunnerSpec

        if runner not in RUNNER_FORMATS:
            raise UsageError(f"unknown runner '{runner}'; valid: {', '.join(RUNNER_FORMATS)}")
        m = manifest or self._read(Path(out))
        self._m, self.runner, self._asked = m, runner, precision
        fmt = RUNNER_FORMATS[runner][0]
        precs = [precision] if precision else sorted({b["precision"] for b in m["builds"] if b["format"] == fmt},
                                                     key=PRECISION_ORDER.index)
        self.specs, self.precision, self.placed = {}, {}, {}
        self.repaired: dict[str, str] = {}     # graph -> the repaired precision it runs at (jobs/repair.py)
        self._bytes: dict[str, int] = {}
        self.max_open_bytes = max_open_bytes
        self.lean = lean
        self.reopened = 0
        for comp, info in m["components"].items():
            for prec in precs:
                found = placed_build(m, comp, runner, prec, fp32_on_cpu, allow_rejected)
                if found:
                    b, kind, used = found
                    self.specs[comp] = RunnerSpec(kind, str(Path(out) / b["files"][0]["path"]),
                                                  tuple(s["name"] for s in info["inputs"]),
                                                  tuple(s["name"] for s in info["outputs"]),
                                                  _runner_options(m, kind)(used))
                    self.precision[comp] = used
                    self._bytes[comp] = sum(int(f.get("bytes", 0)) for f in b["files"])
                    if used == prec + "-mixed":      # precision repair's build (the plain one was rejected)
                        self.repaired[comp] = used
                    elif used != prec or kind != RUNNER_FORMATS[runner][1]:
                        self.placed[comp] = f"fp32 {b['format']} on {kind} ({info['fp32_on_cpu']})"
                    break
        self._runners = {}
        self._opened: set[str] = set()

    @classmethod
    def from_bundle(cls, root: Path, rt: dict) -> "BuildGraphs":
        """The graphs of a bundle (artifacts/bundle.py; `rt` its checked runtime.json), each on the
        runtime of its format: a context binary on the HTP simulator with the options it was scored
        with, ONNX on ONNX Runtime CPU, .pte on ExecuTorch. A DLC runs on the phone's QNN runtime only."""
        from ..artifacts.bundle import RUNTIMES, provider_options
        from .runners import RunnerSpec

        self = cls.__new__(cls)
        self._m, self.runner, self._asked = None, "bundle", None
        self.specs, self.precision, self.placed, self._bytes, self._unrunnable = {}, {}, {}, {}, {}
        self.repaired = {}
        self.max_open_bytes, self.lean, self.reopened = None, False, 0
        self._runners, self._opened = {}, set()
        for comp, g in rt["graphs"].items():
            kind = RUNTIMES[g["format"]][0]
            if kind == "qnn-dlc":
                self._unrunnable[comp] = (f"the bundle's {comp} graph is a DLC, which only the phone's QNN runtime "
                                          f"runs; make the bundle with --pick {comp}=ctx:{g['precision']}")
                continue
            model = next(f for f in g["files"] if f.endswith((".onnx", ".pte")))
            opts = provider_options(rt["target"], g["precision"], rt["target"].get("htp_optimization")) \
                if kind == "qnn-htp" else {}
            self.specs[comp] = RunnerSpec(kind, str(Path(root) / model), tuple(s["name"] for s in g["inputs"]),
                                          tuple(s["name"] for s in g["outputs"]), opts)
            self.precision[comp] = g["precision"]
        return self

    @staticmethod
    def _read(out: Path) -> dict:
        path = out / "manifest.json"
        if not path.exists():
            raise UsageError(f"{out}: no manifest.json (not an omni-export build directory)")
        try:
            return json.loads(path.read_text())
        except ValueError as e:
            raise UsageError(f"{path}: unreadable ({e})") from None

    def __call__(self, name: str, inputs: dict) -> dict:
        from .runners import open_runner

        if name not in self.specs:
            raise UsageError(self.why_missing(name))
        if name not in self._runners:
            self._make_room(name)
            self._runners[name] = open_runner(self.specs[name], lean=self.lean)
            if name in self._opened:
                self.reopened += 1
            self._opened.add(name)
        runner = self._runners.pop(name)         # most recently used last
        self._runners[name] = runner
        return runner.run(inputs)

    def open(self, names) -> None:
        """Open these graphs' sessions now (synth's latency figures leave session creation out)."""
        from .runners import open_runner

        for name in names:
            if name not in self._runners:
                self._make_room(name)
                self._runners[name] = open_runner(self.specs[name], lean=self.lean)
                self._opened.add(name)

    def why_missing(self, name: str) -> str:
        """Why graph `name` has no build to run here, and what would run: the other precisions or
        runners of this build that have an accepted one."""
        m, runner = self._m, self.runner
        if m is None:                    # a bundle's (from_bundle)
            return self._unrunnable.get(name) or f"the bundle has no '{name}' graph (it has {', '.join(self.specs)})"
        fmt = RUNNER_FORMATS[runner][0]
        head = f"the build has no usable '{name}' graph for --runner {runner}"
        if name not in m["components"]:
            return (f"{head}: it did not build that component (it built {', '.join(m['components'])}); "
                    f"rebuild with it in --components")
        mine = [b for b in m["builds"] if b["component"] == name and b["format"] == fmt]
        usable = [r for r in RUNNER_FORMATS if r != runner and
                  any(placed_build(m, name, r, p) for p in PRECISION_ORDER)]
        elsewhere = (f"; runners with an accepted '{name}' here: "
                     + ", ".join(f"--runner {r}" for r in usable)) if usable else ""
        if not mine:
            formats = sorted({b["format"] for b in m["builds"]})
            return (f"{head}: the build made no {fmt} build of it (target {m['target']['name']}, formats "
                    f"{', '.join(formats) or 'none'}){elsewhere}")
        asked = [b for b in mine if b["precision"] == self._asked] if self._asked else mine
        accepted = sorted({b["precision"] for b in mine if b["status"] == "accepted" and b["files"]},
                          key=PRECISION_ORDER.index)
        if self._asked and not asked:
            what = f"no {fmt} build of it at {self._asked}"
        else:
            what = "; ".join(f"{fmt} {b['precision']} {b['status']}"
                             + (f" ({b['parity']['reason']})" if (b.get("parity") or {}).get("reason") else "")
                             for b in sorted(asked, key=lambda b: PRECISION_ORDER.index(b["precision"])))
        fix = (f"; accepted {fmt} precisions: {', '.join(accepted)} (--precision {accepted[0]})"
               if accepted and self._asked else "")
        return f"{head}: {what}{fix}{elsewhere}"

    def _make_room(self, name: str) -> None:
        if self.max_open_bytes is None:
            return
        factor = self.LEAN_FACTOR if self.lean else self.SESSION_FACTOR
        need = lambda c: factor * self._bytes.get(c, 0)  # noqa: E731
        closed = False
        while self._runners and sum(map(need, self._runners)) + need(name) > self.max_open_bytes:
            oldest = next(iter(self._runners))
            self._runners.pop(oldest).close()
            closed = True
        if closed:
            from ..memory import trim_heap

            trim_heap()

    def close(self) -> None:
        from ..memory import trim_heap

        for r in self._runners.values():
            r.close()
        self._runners = {}
        trim_heap()         # a closed session's weights otherwise stay in glibc's arenas


PRECISION_ORDER = ["fp32", "fp16", "w8a16", "w8a16-mixed", "w8a8", "w8a8-mixed", "w4a16", "w4a16-mixed"]


def placed_build(m: dict, comp: str, runner: str, precision: str, fp32_on_cpu: bool = True,
                 allow_rejected: bool = False):
    """(build entry, runner kind, precision) that runs graph `comp` in the (runner, precision) row of
    manifest `m`, or None: the runner's format at that precision, except for a graph that must stay
    fp32 (`fp32_on_cpu` in its manifest entry; Component.fp32_on_cpu), whose fp32 build runs on the CPU
    (.pte on ExecuTorch for the pte runner when built, else ONNX on ONNX Runtime)."""
    fmt, kind = RUNNER_FORMATS[runner]

    def find(f: str, p: str):
        return next((b for b in m["builds"] if b["component"] == comp and b["format"] == f and
                     b["precision"] == p and (b["status"] == "accepted" or allow_rejected) and b.get("files")), None)

    if fp32_on_cpu and (m.get("components") or {}).get(comp, {}).get("fp32_on_cpu"):
        cpu = ((fmt, kind),) if fmt == "pte" else ()
        for f, k in (*cpu, RUNNER_FORMATS["ort"]):
            b = find(f, "fp32")
            if b:
                return b, k, "fp32"
    b = find(fmt, precision)
    if b is None and precision in ("w8a16", "w8a8", "w4a16") and not allow_rejected:
        # precision repair's result stands in for a rejected quantized build (jobs/repair.py)
        mixed = find(fmt, precision + "-mixed")
        return (mixed, kind, precision + "-mixed") if mixed else None
    return (b, kind, precision) if b else None


def accepted(m: dict, comp: str, runner: str, precision: str, fp32_on_cpu: bool = True) -> bool:
    """Whether the (runner, precision) end-to-end row of manifest `m` has an accepted build to run graph
    `comp` on, as BuildGraphs loads it (placed_build: precision repair's build stands in for a rejected one)."""
    return placed_build(m, comp, runner, precision, fp32_on_cpu) is not None


def _runner_options(m: dict, kind: str):
    def opts(precision: str) -> dict:
        if kind != "qnn-htp":
            return {}
        from .. import qnn_ep

        t = m["target"]
        return qnn_ep.provider_options(t["soc_model"], t["htp_arch"], fp16=precision == "fp16",
                                       finalize=(m.get("options") or {}).get("htp_optimization"))
    return opts


class Capture:
    """Records the inputs of every call, per graph: the real activations for calibration. Held
    compactly and, past a byte budget per graph, thinned evenly (omni_export/captured.py)."""

    def __init__(self, inner: GraphSet):
        from ..captured import CallRecorder

        self.inner = inner
        self._recorders: dict[str, CallRecorder] = {}
        self._new = CallRecorder

    def __call__(self, name: str, inputs: dict) -> dict:
        rec = self._recorders.get(name)
        if rec is None:
            rec = self._recorders[name] = self._new()
        rec.add(inputs)
        return self.inner(name, inputs)

    @property
    def calls(self) -> dict[str, list]:
        return {name: rec.kept for name, rec in self._recorders.items()}

    def counts(self) -> dict[str, tuple[int, int]]:
        """graph -> (calls made, calls kept)."""
        return {name: (rec.seen, len(rec.kept)) for name, rec in self._recorders.items()}

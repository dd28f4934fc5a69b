"""The values every stage passes around: specs, components, recipes, targets, builds, verdicts.

Frozen dataclasses and enums only: no torch, no runtimes, so the CLI can import this instantly.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


class UsageError(Exception):
    """A bad flag, input or checkpoint: the user can fix it. The CLI prints it on one line, exit 2."""


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    W8A16 = "w8a16"
    W8A8 = "w8a8"

    @property
    def quantized(self) -> bool:
        return self in (Precision.W8A16, Precision.W8A8)

    @classmethod
    def parse(cls, text: str) -> "Precision":
        return _parse_enum(cls, text, "precision")


class Format(str, enum.Enum):
    ONNX = "onnx"   # ONNX model, scored on ONNX Runtime CPU
    DLC = "dlc"     # QNN IR serialised graph (.dlc), scored on the HTP simulator
    CTX = "ctx"     # QNN context binary for one SoC (+ EPContext .onnx wrapper), HTP simulator
    PTE = "pte"     # ExecuTorch program (XNNPACK), ExecuTorch runtime

    @property
    def extension(self) -> str:
        return {"onnx": "onnx", "dlc": "dlc", "ctx": "ctx.onnx", "pte": "pte"}[self.value]

    @classmethod
    def parse(cls, text: str) -> "Format":
        return _parse_enum(cls, text, "format")


def _parse_enum(cls, text: str, what: str):
    try:
        return cls(text.strip().lower())
    except ValueError:
        valid = ", ".join(m.value for m in cls)
        raise UsageError(f"unknown {what} '{text}'; valid: {valid}") from None


# The gate, in dB of SNR against fp32, when a recipe does not set its own.
DEFAULT_GATES_DB: Mapping[Precision, float] = {
    Precision.FP32: 80.0,
    Precision.FP16: 40.0,
    Precision.W8A16: 30.0,
    Precision.W8A8: 30.0,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple  # ints, or symbols (str) a recipe resolves from the checkpoint and options
    dtype: str    # numpy dtype name: float32, int32, ...
    doc: str = ""

    def resolve(self, sizes: Mapping[str, int]) -> "TensorSpec":
        dims = []
        for d in self.shape:
            if isinstance(d, str):
                d = int(eval(d, {"__builtins__": {}}, dict(sizes)))  # dims like "L+N" or "T*1920"
            dims.append(int(d))
        return TensorSpec(self.name, tuple(dims), self.dtype, self.doc)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "doc": self.doc}


@dataclass(frozen=True)
class Component:
    """One graph of a recipe: its name, I/O and gates. The nn.Module comes from the recipe's loader."""
    name: str
    doc: str
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    gates_db: Mapping[Precision, float] = field(default_factory=dict)
    # Outputs scored by the gate; others are reported only. Empty = all outputs.
    gated_outputs: tuple[str, ...] = ()
    # The part of the model this graph needs (checked when the checkpoint loads).
    requires: tuple[str, ...] = ()

    def gate_db(self, precision: Precision) -> float:
        return self.gates_db.get(precision, DEFAULT_GATES_DB[precision])


@dataclass(frozen=True)
class RecipeOption:
    """A recipe-specific CLI flag, declared as data so `--help` needs no heavy import."""
    name: str            # flag name without dashes, e.g. "chunk-frames"
    type: type
    default: Any
    help: str


@dataclass(frozen=True)
class Recipe:
    """A model family's page: components, options and where its loader lives (imported lazily)."""
    name: str
    doc: str
    components: tuple[Component, ...]
    loader: str                              # "package.module:function"
    tiny: str = ""                           # "module:function(dir) -> dir": a tiny seeded checkpoint
    options: tuple[RecipeOption, ...] = ()
    version: str = "1"                       # bump when graphs change (part of build cache keys)

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise UsageError(f"unknown component '{name}' for {self.name}; valid: "
                         f"{', '.join(c.name for c in self.components)}")


@dataclass
class Graph:
    """One exportable graph as a recipe hands it over: an fp32 eval nn.Module and resolved I/O."""
    name: str
    module: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    logits: tuple[str, ...] = ()            # outputs that also get top-1 agreement


@dataclass
class Samples:
    """Real inputs for one graph: a list of {input name: ndarray}, and where they came from."""
    inputs: list
    source: str


@dataclass(frozen=True)
class Target:
    name: str
    device: str                       # human name
    soc: str                          # e.g. SM8750
    soc_model: str | None             # QNN soc_model id
    htp_arch: str | None              # QNN htp_arch (v79 -> "79")
    formats: tuple[Format, ...]
    default_precisions: tuple[Precision, ...]
    hub_device: str | None = None
    # HTP-safe graph rewrites applied to every graph built for this target's QNN path.
    rewrites: tuple[str, ...] = ()
    doc: str = ""
    # Precisions the target's placement can run (empty: all), and why others cannot.
    precisions: tuple[Precision, ...] = ()
    precision_note: str = ""

    @property
    def has_htp(self) -> bool:
        return self.soc_model is not None


@dataclass(frozen=True)
class BuildSpec:
    recipe: str
    component: str
    format: Format
    precision: Precision
    target: str

    @property
    def name(self) -> str:
        return f"{self.recipe}-{self.component}-{self.precision.value}-{self.target}"

    @property
    def filename(self) -> str:
        return f"{self.name}.{self.format.extension}"

    @property
    def key(self) -> str:
        return f"{self.component}/{self.format.value}/{self.precision.value}"


@dataclass(frozen=True)
class OutputScore:
    name: str
    snr_db: float
    psnr_db: float
    max_abs_err: float
    finite: bool = True
    top1: float | None = None

    def to_json(self) -> dict:
        d = {"name": self.name, "snr_db": _round(self.snr_db), "psnr_db": _round(self.psnr_db),
             "max_abs_err": float(f"{self.max_abs_err:.6g}"), "finite": self.finite}
        if self.top1 is not None:
            d["top1"] = round(self.top1, 6)
        return d


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    threshold_db: float
    reason: str
    scores: tuple[OutputScore, ...] = ()

    @property
    def status(self) -> str:
        return "accepted" if self.accepted else "rejected"

    @property
    def min_snr_db(self) -> float | None:
        vals = [s.snr_db for s in self.scores]
        return min(vals) if vals else None


def _round(x: float) -> float | str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return round(float(x), 3)


InputSet = list  # list[dict[str, numpy.ndarray]]; a tiny alias for readability
Factory = Callable[..., Any]

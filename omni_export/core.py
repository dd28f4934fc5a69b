"""The values every stage passes around: specs, components, recipes, targets, builds, verdicts.

Frozen dataclasses and enums only: no torch, no runtimes, so the CLI can import this instantly.
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Protocol


class UsageError(Exception):
    """A bad flag, input or checkpoint: the user can fix it. The CLI prints it on one line, exit 2."""


class Precision(str, enum.Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    W8A16 = "w8a16"
    W8A8 = "w8a8"
    W4A16 = "w4a16"     # int4 per-channel weights, uint16 activations (QDQ; QNN HTP only)
    # Precision repair's results (jobs/repair.py): the base precision with the blocks that lost the dB
    # kept at higher precision. Made from a rejected build of the base, never asked for directly.
    W8A16_MIXED = "w8a16-mixed"
    W8A8_MIXED = "w8a8-mixed"
    W4A16_MIXED = "w4a16-mixed"

    @property
    def quantized(self) -> bool:
        return self not in (Precision.FP32, Precision.FP16)

    @property
    def mixed(self) -> bool:
        return self.value.endswith(MIXED_SUFFIX)

    @property
    def base(self) -> "Precision":
        """The precision a mixed one was repaired from (itself for the others)."""
        return Precision(self.value[:-len(MIXED_SUFFIX)]) if self.mixed else self

    def repaired(self) -> "Precision":
        """The mixed precision precision repair makes from this one."""
        return Precision(self.value + MIXED_SUFFIX)

    @classmethod
    def parse(cls, text: str) -> "Precision":
        p = _parse_enum(cls, text, "precision")
        if p.mixed:
            raise UsageError(f"precision '{p.value}' is not built on request: precision repair (--repair auto) "
                             f"makes it from a rejected {p.base.value} build")
        return p

    @classmethod
    def requestable(cls) -> tuple["Precision", ...]:
        return tuple(p for p in cls if not p.mixed)


MIXED_SUFFIX = "-mixed"


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
        valid = ", ".join(m.value for m in cls if not getattr(m, "mixed", False))
        raise UsageError(f"unknown {what} '{text}'; valid: {valid}") from None


# The gate, in dB of SNR against fp32, when a recipe does not set its own.
DEFAULT_GATES_DB: Mapping[Precision, float] = {
    Precision.FP32: 80.0,
    Precision.FP16: 40.0,
    Precision.W8A16: 30.0,
    Precision.W8A8: 30.0,
    Precision.W4A16: 30.0,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple  # ints, or symbols (str) a recipe resolves from the checkpoint and options
    dtype: str    # numpy dtype name: float32, int32, ...
    doc: str = ""
    repeat: str | None = None   # per-layer tensors: name has "{i}", expanded over range(sizes[repeat])
    repeat_from: str | None = None  # ... starting at i = sizes[repeat_from] (a graph of later layers)

    def resolve(self, sizes: Mapping[str, int]) -> "TensorSpec":
        dims = []
        for d in self.shape:
            if isinstance(d, str):
                d = int(eval(d, {"__builtins__": {}}, dict(sizes)))  # dims like "L+N" or "T*1920"
            dims.append(int(d))
        return TensorSpec(self.name, tuple(dims), self.dtype, self.doc)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "doc": self.doc}


def resolve_specs(specs: tuple[TensorSpec, ...], sizes: Mapping[str, int]) -> tuple[TensorSpec, ...]:
    """Resolve symbolic shapes; expand runs of specs repeated over the same symbol interleaved
    (past_key_0, past_value_0, past_key_1, ...), the order graphs take per-layer caches in."""
    out, i = [], 0
    while i < len(specs):
        s = specs[i]
        if s.repeat is None:
            out.append(s.resolve(sizes))
            i += 1
            continue
        group = [s]
        while (i + len(group) < len(specs) and specs[i + len(group)].repeat == s.repeat
               and specs[i + len(group)].repeat_from == s.repeat_from):
            group.append(specs[i + len(group)])
        start = int(sizes[s.repeat_from]) if s.repeat_from else 0
        for n in range(start, start + int(sizes[s.repeat])):
            for g in group:
                out.append(TensorSpec(g.name.format(i=n), g.shape, g.dtype, g.doc).resolve(sizes))
        i += len(group)
    return tuple(out)


def variant_name(component: str, symbol: str, value: int) -> str:
    """The component of `component` built at another value of shape symbol `symbol` (Component.variants)."""
    return f"{component}_{symbol.lower()[:1]}{int(value)}"


def variant_base(name: str) -> str | None:
    """The component a variant name was made from by variant_name (code2wav_n1 -> code2wav), or None."""
    m = re.fullmatch(r"(.+)_[a-z]\d+", name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class RowSum:
    """A float output that is the sum of table rows picked by integer tensors of the same call (the
    summed codebook embedding a fused frame hands the next graph). `picks` names those inputs or
    outputs; their last axes, concatenated, give one pick per table, in order. The tables are the
    loader's (Graph.row_tables), read from the checkpoint as a host loop reads them. The gate reads two
    scores of it (parity/metrics.row_sum_scores): `own`, the output against the rows its own picks
    select (exact up to the runner's precision), and the output's own name, against fp32's output up to
    each row's first pick that differs from fp32's. `words` name a table and a pick in reasons."""
    picks: tuple[str, ...]
    own: str
    words: tuple[str, str] = ("table", "pick")


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
    # Outputs that are logits: scored with top-1 agreement too.
    logits: tuple[str, ...] = ()
    # Integer outputs (codes, ids) are gated on the fraction of elements equal to fp32's.
    agreement_min: float = 1.0
    # {precision: fraction}: at these precisions the logits outputs must also pick fp32's top-1 on at
    # least this fraction of rows, beside the SNR gate (what users of a 4-bit LLM judge it by).
    top1_min: Mapping[Precision, float] = field(default_factory=dict)
    # {integer output: float output of per-element decision margins}: disagreements where the
    # fp32 decision was a near tie are excused (parity/metrics.py, TIE_MARGIN).
    tie_margins: Mapping[str, str] = field(default_factory=dict)
    # {float output: RowSum}: outputs that sum table rows picked by integer tensors (a summed codebook
    # embedding); gated against the rows of the build's own picks too (list RowSum.own in gated_outputs).
    row_sums: Mapping[str, RowSum] = field(default_factory=dict)
    # Held-out samples the slow runners (the HTP simulator) score of this graph once it is past
    # jobs/component.py HEAVY_BYTES of weights (0: SLOW_SAMPLES); --sim-samples overrides.
    sim_samples: int = 0
    # Outputs that are audio, with their sample rate in Hz: the report keeps one held-out clip
    # per build as a WAV (fp32 and every build) and draws its waveform and spectrogram.
    audio_outputs: Mapping[str, int] = field(default_factory=dict)
    # {format value: why}: formats built only when named in --formats (the default plan skips them
    # and records the reason), for graphs whose lowering in that format costs far more than it is worth.
    opt_in_formats: Mapping[str, str] = field(default_factory=dict)
    # {setting: what the graph does not do}: what a host loop must not ask of this graph (written to
    # the manifest's component record as "limits"; e.g. a sampling key a fused graph cannot follow).
    limits: Mapping[str, str] = field(default_factory=dict)
    # {precision: fraction}: 16-bit activation range headroom for this graph's QDQ builds, overriding
    # the exporter's default (exporters/onnx.py HEADROOM). Headroom absorbs held-out activations outside
    # the calibrated ranges but widens every quantization step; which wins depends on the graph.
    activation_headroom: Mapping[Precision, float] = field(default_factory=dict)
    # QDQ builds: lower every linear (MatMul by a constant weight) as a 1x1 Conv so its weights are
    # quantized per output channel (the QNN EP quantizes MatMul weights per tensor); exporters/onnx.py.
    per_channel_linears: bool = False
    # QDQ builds: how weights are rounded on the quantizer's grid: "nearest", or "gptq" (each layer's
    # output error on the calibration activations minimised, error spread through the inverse input
    # Hessian; exporters/gptq.py). Scales, zero points and the integer type stay the quantizer's.
    weight_rounding: str = "nearest"
    # Why this graph's deployable form is fp32 (e.g. its output is integrated in float64 on the host, so
    # fp16 rounding drifts): the plan adds its fp32 build on a unit that runs fp32 (the CPU beside an NPU
    # that has none: ONNX -> ONNX Runtime, .pte -> XNNPACK) next to its other builds, and end-to-end
    # parity and synth run that build for this graph at every precision (runtime/graphs.py).
    fp32_on_cpu: str = ""
    # Bump when a change to this graph's module changes what it computes (its build cache keys;
    # omni_export/numerics.py has the exporters' and the runtime's).
    version: str = "1"
    # A shape symbol the loader may also build this graph at other values of: each value is a component
    # of its own, named variant_name(name, symbol, value) (code2wav_n1: Code2Wav at N = 1), with this
    # one's I/O, gates and placement; which values are built is the loader's (its components()).
    variants: str = ""
    # What the graph is in the pipeline, for placement (Target.roles): e.g. "vocoder" (codes or mel to
    # waveform), which the heterogeneous targets put on the GPU. Empty: the target's default unit.
    role: str = ""

    def gate_db(self, precision: Precision) -> float:
        """The gate of `precision` (a repaired build is held to its base precision's gate)."""
        return self.gates_db.get(precision.base, DEFAULT_GATES_DB[precision.base])


@dataclass(frozen=True)
class RecipeOption:
    """A recipe-specific CLI flag, declared as data so `--help` needs no heavy import."""
    name: str            # flag name without dashes, e.g. "chunk-frames"
    type: type
    default: Any
    help: str
    # the components whose graphs or captured inputs the option changes (build cache keys):
    # None = all of them; () = none (e.g. an option of the end-to-end check only)
    affects: tuple[str, ...] | None = None
    range: tuple[int | None, int | None] | None = None     # int options: the allowed [min, max]


@dataclass(frozen=True)
class RealTime:
    """How a recipe's graphs add up to real time, for the on-device RTF estimate (hub/rtf.py).

    `calls` lists (component, calls per unit of output) for one unit of output (e.g. one 80 ms
    audio frame); a count is an expression over the recipe options (dashes read as underscores),
    e.g. "1/chunk_frames" for a vocoder that runs once per chunk. `alternatives` names graphs that
    can stand in for a component that was not measured (the fused predictor frame, or its prefill
    + 14 single steps)."""
    unit: str                                   # what one unit of output is, e.g. "frame"
    unit_ms: float                              # its duration in ms of output (audio)
    calls: tuple[tuple[str, str], ...]
    alternatives: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    doc: str = ""
    call_names: Mapping[str, str] = field(default_factory=dict)   # what one call is, e.g. "chunk"
    # Time to first audio (hub/latency.py): the graphs run once per utterance before the first unit
    # (the prompt; counts as above, for a prompt that fits one call; a recorded synth run gives its own),
    # and "module:function(options) -> {frames, graph, calls}": the units of output generated before the
    # first audio leaves, the graph that decodes them, and the (component, calls) that generate them.
    prompt: tuple[tuple[str, str], ...] = ()
    first_audio: str = ""


@dataclass(frozen=True)
class LinkGroup:
    """Components whose device builds AI Hub links into one QNN context binary with shared weights
    (`submit_link_job` over their compiled DLCs), e.g. an LLM's prefill and decode graphs over the
    same weights. Each member is a graph of the linked binary, named after its component."""
    name: str
    components: tuple[str, ...]
    doc: str = ""


@dataclass(frozen=True)
class Recipe:
    """A model family's page: components, options and where its loader lives (imported lazily)."""
    name: str
    doc: str
    components: tuple[Component, ...]
    loader: str                              # "package.module:function"
    tiny: str = ""                           # "module:function(dir) -> dir": a tiny seeded checkpoint
    # "module:function(model, out, manifest, runners, progress) -> rows": whole-pipeline parity
    end_to_end: str = ""
    # "module:function(parts) -> rows": end_to_end takes part=(k, n) (held-out prompts k, k + n, ...) and
    # this merges the parts' rows; a row then runs as parts at once (jobs/e2e.py)
    end_to_end_merge: str = ""
    synth: str = ""                          # module with HELP, options() and run(**kw): `omni-export synth`
    bundle: str = ""                         # "module:function(manifest, out) -> artifacts.bundle.Bundle": host data
    options: tuple[RecipeOption, ...] = ()
    version: str = "1"                       # bump when graphs change (part of build cache keys)
    realtime: RealTime | None = None         # per unit of output: which graphs run how often
    links: tuple[LinkGroup, ...] = ()        # graphs linked into one context binary on AI Hub
    # precisions the default plan (no --precision) also attempts, beyond the target's default ladder, on
    # units that run them: gated like the rest, so the report shows whether they are deployable
    # (Spark: w8a8 and w4a16, which real LLMs lose -- the report is where a user sees that)
    also_attempt: tuple[Precision, ...] = ()
    # The options that choose the weights the loader writes itself when given no checkpoint: the build
    # cache keys those weights by these options' values (artifacts/cache.py checkpoint_identity).
    demo_keys: tuple[str, ...] = ()            # the tiny demo checkpoint (qwen3-tts: variant)
    random_weights_keys: tuple[str, ...] = ()  # --random-weights, real shapes (qwen3-tts: size, variant)

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        base = variant_base(name)
        c = next((c for c in self.components if c.name == base and c.variants), None)
        if c is not None:
            value = name[len(base) + 2:]
            return replace(c, name=name, doc=f"{c.doc} [{c.variants} = {value}]")
        raise UsageError(f"unknown component '{name}' for {self.name}; valid: "
                         f"{', '.join(c.name for c in self.components)}")

    def graph(self, name: str, module, sizes: Mapping[str, int]) -> "Graph":
        """Component `name`'s Graph: the fp32 `module`, with the component's I/O resolved at `sizes`."""
        c = self.component(name)
        return Graph(name, module, resolve_specs(c.inputs, sizes), resolve_specs(c.outputs, sizes), c.logits)


# The recipe option that has the loader write seeded weights at real shapes instead of reading a checkpoint.
RANDOM_WEIGHTS = "random-weights"


class RecipeModel(Protocol):
    """What a recipe's loader returns (Recipe.loader: load(checkpoint, options, scratch) -> RecipeModel):
    the one interface the pipeline, the jobs and the CLI use. `recipes.load_model` checks every member
    is there, so a loader that forgets one fails with one line naming it (check_model)."""
    info: dict                      # the manifest's checkpoint record: path, label, demo, weights, config
    options: dict                   # the recipe options the model was loaded with, defaults filled in
    seeds: Mapping[str, Any]        # the seeds behind the captured inputs (the manifest's seeds)
    capture_cache: dict | None      # {"key", "hit", "store"} when inputs came through the capture cache

    def sizes(self) -> dict[str, int]: ...                   # shape symbol -> value
    def components(self) -> tuple[str, ...]: ...             # the components this checkpoint has
    def graph(self, name: str) -> "Graph": ...               # an fp32 eval module and its resolved I/O
    def samples(self, name: str, kind: str) -> "Samples": ...   # kind: calibration | heldout


MODEL_MEMBERS = ("info", "options", "seeds", "capture_cache", "sizes", "components", "graph", "samples")
_MODEL_METHODS = ("sizes", "components", "graph", "samples")


def check_model(recipe: str, loader: str, model) -> None:
    """UsageError (one line) when the model `loader` returned lacks a RecipeModel member."""
    missing = [m for m in MODEL_MEMBERS if not hasattr(model, m)]
    missing += [m for m in _MODEL_METHODS if m not in missing and not callable(getattr(model, m))]
    if missing:
        raise UsageError(f"recipe {recipe}: its loader {loader} returned a {type(model).__name__} without "
                         f"{', '.join(missing)} (omni_export.core.RecipeModel: {', '.join(MODEL_MEMBERS)})")


@dataclass
class Graph:
    """One exportable graph as a recipe hands it over: an fp32 eval nn.Module and resolved I/O."""
    name: str
    module: Any
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    logits: tuple[str, ...] = ()            # outputs that also get top-1 agreement
    # {output: its tables, one per pick} for the component's row_sums (fp32 arrays, the checkpoint's)
    row_tables: Mapping[str, tuple] = field(default_factory=dict)


@dataclass
class Samples:
    """Real inputs for one graph: a list of {input name: ndarray}, and where they came from."""
    inputs: list
    source: str


# Compute units a component can be placed on, and the AI Hub --compute_unit each one is.
UNITS = {"htp": "npu", "gpu": "gpu", "cpu": "cpu"}
UNIT_NAMES = {"htp": "Hexagon NPU (HTP)", "gpu": "Adreno GPU", "cpu": "CPU"}
# What each unit can run: the HTP has no fp32 datapath; the GPU runs float only.
UNIT_PRECISIONS = {"htp": (Precision.FP16, Precision.W8A16, Precision.W8A8, Precision.W4A16),
                   "gpu": (Precision.FP32, Precision.FP16),
                   "cpu": tuple(Precision)}


@dataclass(frozen=True)
class Placement:
    """Where one component runs on the device, what is built for it there, and how AI Hub takes it.

    `hub_runtimes` maps a local format to the AI Hub --target_runtime its device build is compiled
    for; formats not listed are built and scored locally but never submitted."""
    unit: str                                   # a key of UNITS
    formats: tuple[Format, ...]
    precisions: tuple[Precision, ...]           # the default ladder on this unit
    hub_runtimes: Mapping[Format, str] = field(default_factory=dict)
    doc: str = ""
    # Why a component is here (targets.place_components): "--place code2wav=npu", "role vocoder (...)", ...
    by: str = ""

    @property
    def runs(self) -> tuple[Precision, ...]:
        """Every precision this unit can run (the ladder is the default subset)."""
        return UNIT_PRECISIONS[self.unit]

    @property
    def hub_compute_unit(self) -> str:
        return UNITS[self.unit]

    @property
    def unit_name(self) -> str:
        return UNIT_NAMES[self.unit]


@dataclass(frozen=True)
class Target:
    name: str
    device: str                       # human name
    soc: str                          # e.g. SM8750
    soc_model: str | None             # QNN soc_model id
    htp_arch: str | None              # QNN htp_arch (v79 -> "79")
    formats: tuple[Format, ...]       # every format some placement builds
    default_precisions: tuple[Precision, ...]
    hub_device: str | None = None
    # HTP-safe graph rewrites applied to every graph built for this target's QNN path.
    rewrites: tuple[str, ...] = ()
    doc: str = ""
    # Precisions the target's placement can run (empty: all), and why others cannot.
    precisions: tuple[Precision, ...] = ()
    precision_note: str = ""
    # Where each component runs: {component name: Placement}, resolved for a run by
    # targets.place_components (recipe roles, --place); others use `default_placement` (None: every
    # format and the default ladder on the HTP, or the CPU for a target without one).
    placement: Mapping[str, Placement] = field(default_factory=dict)
    default_placement: Placement | None = None
    # The compute units this target has, each with what it builds there: {unit: Placement}
    # (the units --place may name), and where a component of a given role goes: {role: unit}.
    units: Mapping[str, Placement] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_htp(self) -> bool:
        return self.soc_model is not None

    def place(self, component: str) -> Placement:
        if component in self.placement:
            return self.placement[component]
        if variant_base(component) in self.placement:        # a shape variant runs where its graph runs
            return self.placement[variant_base(component)]
        if self.default_placement is not None:
            return self.default_placement
        return Placement("htp" if self.has_htp else "cpu", self.formats, self.default_precisions)

    @property
    def heterogeneous(self) -> bool:
        return len({p.unit for p in self.placement.values()} | {self.place("").unit}) > 1


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
    snr_db: float | None          # None for integer outputs (ids, codes): scored by agreement
    psnr_db: float | None
    max_abs_err: float
    finite: bool = True
    top1: float | None = None     # logits: fraction of positions whose argmax agrees
    agreement: float | None = None  # integer outputs: fraction of elements equal (tie-aware if declared)
    agreement_raw: float | None = None  # ... counting every flip, near ties included
    ties: int | None = None       # flips excused because fp32's decision was a near tie
    against: str | None = None    # what it was compared with when not fp32's output as is (RowSum)

    def to_json(self) -> dict:
        d = {"name": self.name, "snr_db": _round(self.snr_db), "psnr_db": _round(self.psnr_db),
             "max_abs_err": float(f"{self.max_abs_err:.6g}"), "finite": self.finite}
        if self.top1 is not None:
            d["top1"] = round(self.top1, 6)
        if self.agreement is not None:
            d["agreement"] = round(self.agreement, 6)
        if self.agreement_raw is not None:
            d["agreement_raw"] = round(self.agreement_raw, 6)
            d["ties"] = self.ties
        if self.against is not None:
            d["against"] = self.against
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
        vals = [s.snr_db for s in self.scores if s.snr_db is not None]
        return min(vals) if vals else None


def strict_json(obj):
    """`obj` with every non-finite float as the manifest's word for it ("inf" / "-inf" / "nan"), so
    json.dumps(..., allow_nan=False) writes strict JSON (bare Infinity / NaN is not JSON: jq and
    JSON.parse reject it). artifacts.scores.num reads the words back."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def _round(x: float | None) -> float | str | None:
    if x is None:
        return None
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return round(float(x), 3)


InputSet = list  # list[dict[str, numpy.ndarray]]; a tiny alias for readability
Factory = Callable[..., Any]

"""Which accepted builds go to AI Hub, and how: the uploaded ONNX, the runtime, the job options.

Pure functions of the manifest and the targets table, so `hub submit` on an old output directory
decides exactly what `--hub` decided at build time.

Per build (its format and precision, on the unit its component is placed on):
  upload   sources/...-fp32-....onnx for fp32/fp16 builds; for w8a16/w8a8 the local QDQ ONNX
           (quantize_on="local") or the fp32 ONNX plus AI Hub's quantize job on our calibration set
           (quantize_on="hub": INT8 weights, INT16 activations for w8a16 / INT8 for w8a8)
  compile  --target_runtime {the placement's runtime for the format} --compute_unit {npu|gpu|cpu}
           --qairt_version {pinned}; fp16 adds --quantize_full_type float16. Inputs and outputs stay
           float32 (no --quantize_io), so the device run takes the same held-out inputs and is scored
           against the same fp32 references as every local build.
  inference  the compiled model on the held-out inputs with profile=True: one job gives the outputs
           and the profile; --compute_unit and --qairt_version pinned as for the compile.

Linked graphs (Recipe.links, e.g. an LLM's prefill + decode): the DLC builds of a link group's
components are compiled with `--qnn_options context_enable_graphs=<component>` (the graph's name in
a linked binary, as qai_hub's submit_compile_and_link_jobs does), then one link job per group and
precision turns their compiled DLCs into one context binary with shared weights, and one inference
job per graph (`--qnn_options context_enable_graphs=<component>` selects it) profiles and scores it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..artifacts.inputs import source_key
from ..core import Format, Precision, Target
from ..targets import place_build

QUANTIZE_DTYPES = {"w8a16": ("INT8", "INT16"), "w8a8": ("INT8", "INT8"), "w4a16": ("INT4", "INT16")}
LOCAL_QDQ = "local QDQ (onnxruntime QNN config: uint8 weights, per channel for Conv, MinMax calibration)"


@dataclass(frozen=True)
class Route:
    key: str                   # component/format/precision
    name: str                  # the build's artifact stem
    component: str
    format: str
    precision: str
    runtime: str               # AI Hub --target_runtime
    compute_unit: str          # AI Hub --compute_unit
    upload: str                # source key of the ONNX uploaded: fp32 | w8a16 | w8a8
    upload_sha256: str = ""    # of that ONNX (a rebuild with the same bytes keeps its AI Hub jobs)
    quantize: tuple[str, str] | None = None   # (weights, activations) QuantizeDtype names: AI Hub quantizes
    graph: str = ""            # its graph name in a linked context binary (a link group's DLC)

    @property
    def quantized_by(self) -> str | None:
        if not Precision(self.precision).quantized:
            return None
        if self.quantize:
            w, a = self.quantize
            return f"AI Hub quantize job ({w} weights, {a} activations) on the captured calibration set"
        if Precision(self.precision).mixed:
            return LOCAL_QDQ + "; precision repair's blocks kept in float in the same graph"
        return LOCAL_QDQ

    def compile_options(self, qairt: str) -> str:
        opts = [f"--target_runtime {self.runtime}", f"--compute_unit {self.compute_unit}",
                f"--qairt_version {qairt}"]
        if self.precision == Precision.FP16.value:
            opts.append("--quantize_full_type float16")
        if self.graph:
            opts.append(f"--qnn_options context_enable_graphs={self.graph}")
        return " ".join(opts)

    def inference_options(self, qairt: str) -> str:
        return f"--compute_unit {self.compute_unit} --qairt_version {qairt}"

    @property
    def steps(self) -> tuple[str, ...]:
        return (("quantize",) if self.quantize else ()) + ("compile", "inference")

    def to_json(self) -> dict:
        return {"runtime": self.runtime, "compute_unit": self.compute_unit, "upload": self.upload,
                "upload_sha256": self.upload_sha256, "quantized_by": self.quantized_by,
                "steps": list(self.steps)}


def plan(manifest: dict, target: Target, quantize_on: str = "local", components: tuple = (),
         formats: tuple = (), precisions: tuple = (), links: tuple = ()) -> tuple[list[Route], list[dict]]:
    """(routes for the builds to submit, [{key, reason}] for the builds left out). `links`: the
    recipe's LinkGroups (their members' DLCs get a graph name)."""
    linked = {c for g in links for c in g.components}
    if quantize_on not in ("local", "hub"):
        raise ValueError(f"quantize_on must be local or hub, not {quantize_on}")
    routes, left = [], []
    for b in manifest["builds"]:
        key = f"{b['component']}/{b['format']}/{b['precision']}"
        if ((components and b["component"] not in components) or (formats and b["format"] not in formats)
                or (precisions and b["precision"] not in precisions)):
            continue
        reason = _why_not(manifest, target, b)
        if reason:
            left.append({"key": key, "reason": reason})
            continue
        place = _place(manifest, target, b)
        prec = Precision(b["precision"])
        # a repaired build's mixed assignment lives in its QDQ graph (float islands): always uploaded
        # as built, never re-quantized by AI Hub
        hub_quantizes = quantize_on == "hub" and prec.quantized and not prec.mixed
        upload = "fp32" if hub_quantizes else source_key(prec)
        sources = manifest["components"][b["component"]]["sources"]
        if upload not in sources or "path" not in sources[upload]:
            left.append({"key": key, "reason": f"no {upload} source ONNX kept"})
            continue
        routes.append(Route(
            key=key, name=b["name"], component=b["component"], format=b["format"], precision=b["precision"],
            runtime=place.hub_runtimes[Format(b["format"])], compute_unit=place.hub_compute_unit,
            upload=upload, upload_sha256=sources[upload]["sha256"],
            quantize=QUANTIZE_DTYPES[prec.value] if hub_quantizes else None,
            graph=b["component"] if b["format"] == Format.DLC.value and b["component"] in linked else ""))
    return routes, left


@dataclass(frozen=True)
class LinkRoute:
    key: str                       # "link:{group}/{precision}"
    group: str
    precision: str
    members: tuple[str, ...]       # the member builds' route keys, in the group's order
    graphs: tuple[str, ...]        # their graph names in the linked binary

    @property
    def name(self) -> str:         # job names and the result directory under hub/
        return f"link-{self.group.replace('+', '-')}-{self.precision}"

    format = "ctx"

    @property
    def steps(self) -> tuple[str, ...]:
        return ("link", *(f"inference {g}" for g in self.graphs))

    def options(self) -> str:
        return ""                  # AI Hub's link options: none needed (the graphs keep their names)

    def inference_options(self, graph: str, qairt: str) -> str:
        return f"--compute_unit npu --qairt_version {qairt} --qnn_options context_enable_graphs={graph}"

    def to_json(self) -> dict:
        return {"group": self.group, "precision": self.precision, "members": list(self.members),
                "graphs": list(self.graphs)}


def link_plan(routes: list[Route], links: tuple) -> tuple[list[LinkRoute], list[dict]]:
    """One link per (group, precision) whose every member has a DLC route on the NPU; the others are
    left out with the reason."""
    by_key = {r.key: r for r in routes}
    out, left = [], []
    precisions = sorted({r.precision for r in routes if r.graph})
    for g in links:
        for p in precisions:
            keys = tuple(f"{c}/{Format.DLC.value}/{p}" for c in g.components)
            missing = [k for k in keys if k not in by_key or by_key[k].runtime != "qnn_dlc"
                       or by_key[k].compute_unit != "npu"]         # a context binary is an HTP one
            key = f"link:{g.name}/{p}"
            if len(missing) == len(keys):
                continue
            if missing:
                left.append({"key": key, "reason": f"no accepted DLC submitted for {', '.join(missing)}; "
                                                   f"a link takes every graph of the group"})
                continue
            out.append(LinkRoute(key, g.name, p, keys, tuple(g.components)))
    return out, left


def _place(manifest: dict, target: Target, b: dict):
    fp32_on_cpu = bool(manifest["components"].get(b["component"], {}).get("fp32_on_cpu"))
    return place_build(target, b["component"], Precision(b["precision"]), fp32_on_cpu)


def _why_not(manifest: dict, target: Target, b: dict) -> str | None:
    place = _place(manifest, target, b)
    fmt = Format(b["format"])
    if b["status"] != "accepted":
        return "rejected" + (" on the device" if b.get("rejected_by") == "device" else " locally") + \
               "; only accepted builds are submitted"
    if fmt not in place.hub_runtimes:
        if fmt == Format.PTE:
            return "AI Hub takes no ExecuTorch programs (.pte)"
        return f"{fmt.value} builds on the {place.unit_name} are scored locally only"
    sources = manifest["components"].get(b["component"], {}).get("sources") or {}
    src = sources.get(source_key(Precision(b["precision"])))
    if not src or "path" not in src:
        return (src or {}).get("error") or "the build kept no source ONNX in sources/ (rebuild with --keep-sources)"
    return None

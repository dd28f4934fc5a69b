"""Why QNN would not take a graph: the node, its op type and shapes, and what may avoid it.

A failed QNN compile says only that the session failed: "graph nodes that are assigned to the
default CPU EP, but fallback to CPU EP has been explicitly disabled" (a node the HTP cannot take),
or "Failed to finalize QNN graph" with an error code. QNN names the node in ONNX Runtime's log:
at error level for an op type it has no builder for ("Unsupported nodes in QNN EP: { name: N, type:
T }"), at verbose level only for an op whose configuration the HTP backend rejects ("Validation
FAILED ... Operator type: T Node name: N ... REASON : R"). omni-export compiles with the log at
fatal only (the simulator logs a harmless error per session), so on a failure `diagnose` creates
the same session again in a child process with the verbose log on its stderr (a child: redirecting
this process's stderr would swallow other threads' output), reads the node from it, and looks the
node up in the ONNX graph: op type, input and output shapes, and the block of a BlockChain
(`blocks.N` in the exporter's name scopes) so attribution can lower exactly that block. QNN's
finalize (QNN_COMMON_ERROR_MEM_ALLOC) names no op even at verbose level: nothing is compiled again,
the graph's largest activation is named as the likely node (`finalize_suspect`).

    python -m omni_export.exporters.qnn_diagnose < {"model": PATH, "options": {...}}     # the child
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# The failure classes docs/errors.md describes, one section each.
UNSUPPORTED = "unsupported op"
VALIDATION = "op config validation"
FINALIZE = "finalize"
RUN = "simulator run"

# one block per OrtNodeUnit (a QDQ unit lists its DequantizeLinear nodes and its op), then QNN's REASON
_VALIDATION = re.compile(r"Validation FAILED for \d+ nodes in OrtNodeUnit \((?P<unit>[^)]*)\) :\s*"
                         r"(?P<nodes>(?:Operator type: \S+ Node name: .*? Node index: \d+\s*)+)"
                         r"(?:REASON : (?P<reason>[^\n]*))?")
_UNIT_NODE = re.compile(r"Operator type: (?P<op>\S+) Node name: (?P<node>.*?) Node index: \d+")
_BACKEND = re.compile(r"backendValidateOpConfig\(\) failed for node `(?P<node>[^`]*)` of type `(?P<qnn>[^`]*)` "
                      r"with error code (?P<code>\d+)")
_UNSUPPORTED = re.compile(r"Unsupported nodes in QNN EP: (?P<list>.*)")
_UNSUPPORTED_ONE = re.compile(r"\{ name: (?P<node>.*?), type: (?P<op>[^ }]+) \}")
_ERROR_LINE = re.compile(r"\[E:onnxruntime:[^\]]*\] (?P<text>.*)")
_QNN_CODE = re.compile(r"QNN_[A-Z_]+")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Compile time allowed to the diagnosing child: a finalize failure compiles the graph again.
TIMEOUT_S = float(os.environ.get("OMNI_EXPORT_DIAGNOSE_TIMEOUT", "900"))


class QnnCompileError(RuntimeError):
    """A QNN compile that failed, with what QNN's log and the ONNX graph say about it (`diagnosis`)."""

    def __init__(self, message: str, diagnosis: dict | None = None):
        super().__init__(message, diagnosis)

    @property
    def diagnosis(self) -> dict:
        return self.args[1] or {}

    def __str__(self) -> str:
        return self.args[0]


def parse_log(text: str) -> list[dict]:
    """The nodes QNN refused, in log order: {node, op_type, reason, class}; a finalize error with no
    node gives {class: finalize, reason} (the node, if any, is looked up by name later)."""
    text = _ANSI.sub("", text)
    found: dict[str, dict] = {}
    backend = {b["node"]: b for b in _BACKEND.finditer(text)}
    for m in _VALIDATION.finditer(text):
        unit = [(u["op"], u["node"]) for u in _UNIT_NODE.finditer(m["nodes"])]
        # the unit's own op (a QDQ unit also lists the DequantizeLinear nodes feeding it)
        op, node = next((u for u in unit if u[0] == m["unit"]), unit[0])
        reason = (m["reason"] or "").strip()
        kind = UNSUPPORTED if "not supported by QNN EP" in reason else VALIDATION
        if kind == UNSUPPORTED:
            reason = f"QNN has no {op} op for the HTP"
        elif node in backend:
            b = backend[node]
            said = f"QNN's HTP backend refused this {b['qnn']} op config (error {b['code']})"
            reason = f"{reason.rstrip('.')}: {said}" if reason else said
        found.setdefault(node, {"node": node, "op_type": op, "class": kind, "reason": reason})
    for m in _UNSUPPORTED.finditer(text):
        for one in _UNSUPPORTED_ONE.finditer(m["list"]):
            found.setdefault(one["node"], {"node": one["node"], "op_type": one["op"], "class": UNSUPPORTED,
                                           "reason": f"QNN has no {one['op']} op for the HTP"})
    out = list(found.values())
    if not out:
        errors = [m["text"].strip() for m in _ERROR_LINE.finditer(text)]
        errors = [e for e in errors if "power config" not in e and "fallback to CPU EP" not in e]
        codes = [c for e in errors for c in _QNN_CODE.findall(e)]
        if errors:
            out.append({"node": None, "op_type": None, "class": FINALIZE if codes or any(
                "finalize" in e.lower() for e in errors) else UNSUPPORTED, "reason": errors[-1][:300],
                "errors": errors[-8:]})
    return out


def node_facts(model: Path, node: str | None = None, mentioned: list[str] = (), op_type: str | None = None) -> dict:
    """The ONNX graph's view of `node` (or of the first node named in `mentioned` log lines; or, when
    QNN names an unnamed node, the one node of `op_type` without a name): its op type, input and output
    names with dtype and shape, its module scope and BlockChain block index. Reads the graph only
    (external weights stay on disk)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    nodes = {n.name: n for n in m.graph.node if n.name}
    unnamed = [n for n in m.graph.node if not n.name and n.op_type == op_type]
    if not node and len(unnamed) == 1:
        n = unnamed[0]
        node = f"unnamed {n.op_type} -> {n.output[0] if n.output else '?'}"
    elif node not in nodes:
        named_in = (max((x for x in nodes if x in line), key=len, default=None) for line in mentioned)
        node = next((x for x in named_in if x), None)
        if node is None:
            return {}
        n = nodes[node]
    else:
        n = nodes[node]
    try:
        g = onnx.shape_inference.infer_shapes(m).graph
    except Exception:                      # shapes are a help, not a need
        g = m.graph
    types = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        types[vi.name] = (onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "?",
                          [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim])
    for init in g.initializer:
        types[init.name] = (onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name, list(init.dims))
    def scopes_of(x) -> list[str]:
        return _scopes({p.key: p.value for p in x.metadata_props}.get("pkg.torch.onnx.name_scopes", ""))

    # a node the quantizer inserted has no name scope: the scope of the node it feeds
    consumers = [x for x in m.graph.node if set(x.input) & set(n.output)]
    scopes = scopes_of(n) or next((sc for sc in map(scopes_of, consumers) if sc), [])
    block = next((int(s.split(".")[1]) for s in scopes if re.fullmatch(r"blocks\.\d+", s)), None)

    producer = {o: x for x in m.graph.node for o in x.output}

    def tensors(names):
        out = []
        for x in names:
            if not x:
                continue
            t = {"name": x, "dtype": types.get(x, ("?", None))[0], "shape": types.get(x, ("?", None))[1]}
            dq = producer.get(x)
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input:
                t["stored"] = types.get(dq.input[0], ("?", None))[0]        # the QDQ's integer type
            out.append(t)
        return out

    return {"node": node, "op_type": n.op_type, "inputs": tensors(n.input), "outputs": tensors(n.output),
            "scope": next((s for s in reversed(scopes[:-1]) if s), ""), "block_index": block}


def _scopes(text: str) -> list[str]:
    try:
        value = ast.literal_eval(text) if text else []
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def avoid(op_type: str | None, rewrites_on: tuple[str, ...] = ()) -> str:
    """What may avoid a failure on `op_type`: the HTP-safe rewrite that replaces the op, if one does."""
    if not op_type:
        return ""
    from .rewrites import REWRITES

    names = [r.name for r in REWRITES.values() if op_type in r.onnx_ops]
    if not names:
        return f"no omni-export rewrite replaces {op_type}"
    on = [n for n in names if n in rewrites_on]
    if on:
        return f"the {', '.join(on)} rewrite replaces {op_type} and was on; its ops still failed"
    return f"the {', '.join(names)} rewrite replaces {op_type} (--rewrites {','.join(names)})"


def describe(d: dict) -> str:
    """One line: node, op type, shapes, QNN's reason, what may avoid it."""
    if not d.get("node"):
        return f"QNN {d.get('class', 'compile')} failed: {d.get('reason', '')}".strip()

    def shapes(ts):     # a QDQ-fed input as stored->computed type: uint16->float32[1, 8, 24]
        return ", ".join((f"{t['stored']}->" if t.get("stored") else "") + t["dtype"]
                         + (str(t["shape"]) if t.get("shape") is not None else "") for t in ts)

    b = d.get("block") or d.get("likely_block")
    block = f" in block {b}" if b else (f" in blocks.{d['block_index']}" if d.get("block_index") is not None else "")
    io = f" ({shapes(d.get('inputs', []))} -> {shapes(d.get('outputs', []))})" if d.get("inputs") else ""
    if d.get("likely"):         # finalize: QNN names no op, the graph's largest activation is the suspect
        line = (f"QNN could not finalize the graph [{d['class']}]: {d.get('reason', '')}; likely node "
                f"'{d['node']}' ({d.get('op_type')}{block}){io}, the graph's largest activation "
                f"({d['bytes'] / 2**20:.1f} MiB)")
        return line + (f"; {d['hint']}" if d.get("hint") else "")
    line = f"QNN could not compile node '{d['node']}' ({d.get('op_type')}{block}){io} [{d['class']}]"
    if d.get("reason"):
        line += f": {d['reason']}"
    if d.get("also"):
        line += f"; QNN also refused {', '.join(d['also'])}"
    return line + (f"; {d['hint']}" if d.get("hint") else "")


def diagnose(model: Path, options: dict, rewrites_on: tuple[str, ...] = (), timeout: float | None = None) -> dict:
    """Create the QNN session for `model` again in a child with the verbose log, and say which node
    failed and why. {} when the child compiled it (the failure did not reproduce) or said nothing."""
    req = json.dumps({"model": str(model), "options": dict(options)})
    try:
        proc = subprocess.run([sys.executable, "-m", "omni_export.exporters.qnn_diagnose"], input=req, text=True,
                              capture_output=True, timeout=timeout or TIMEOUT_S,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        return {"class": FINALIZE, "node": None, "reason": f"diagnosis timed out after {timeout or TIMEOUT_S:.0f} s"}
    if proc.returncode == 0 and proc.stdout.strip() == "compiled":
        return {}
    found = parse_log(proc.stderr)
    if not found:
        return {}
    d = found[0]
    facts = node_facts(Path(model), d.get("node"), d.get("errors", ()), d.get("op_type"))
    d = {**d, **{k: v for k, v in facts.items() if v is not None or k not in d}}
    d["hint"] = avoid(d.get("op_type"), rewrites_on)
    if len(found) > 1:
        d["also"] = [f"{x['node']} ({x['op_type']})" for x in found[1:6]]
    d.pop("errors", None)
    return d


def compile_failure(e: BaseException, model: Path, options: dict, rewrites_on: tuple[str, ...] = ()) -> BaseException:
    """`e` from a QNN compile of `model`, as a QnnCompileError naming the node when QNN's log does."""
    if isinstance(e, QnnCompileError) or "ONNXRuntimeError" not in str(e):
        return e               # not the QNN EP's refusal (a killed compile child, a disk error): no second compile
    try:
        # QNN's finalize log names no op (checked at verbose level on a tiny graph that fails with
        # QNN_COMMON_ERROR_MEM_ALLOC), so no second compile: the graph's largest activation instead
        d = finalize_suspect(model, str(e)) if "Failed to finalize" in str(e) else diagnose(model, options, rewrites_on)
    except Exception:              # a diagnosis that fails must not hide the compile's own error
        return e
    if not d or not d.get("node"):        # nothing named: the compile's own words say more
        return e
    d["error"] = " ".join(str(e).split())[:300]
    return QnnCompileError(describe(d), d)


def finalize_suspect(model: Path, error: str) -> dict:
    """A finalize failure's likely node: the one whose output is the graph's largest activation (from
    shape inference on the graph alone). Attribution still lowers every block (`likely_block`, not
    `block`): the guess is said, not acted on."""
    import numpy as np
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    g = onnx.shape_inference.infer_shapes(m).graph
    sizes = {}
    for vi in [*g.value_info, *g.output]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if t.elem_type and dims and all(dims):
            sizes[vi.name] = int(np.prod(dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).itemsize
    node, n_bytes = max(((n.name, sizes.get(o, 0)) for n in m.graph.node if n.name for o in n.output),
                        key=lambda x: x[1], default=(None, 0))
    if not node or not n_bytes:
        return {}
    code = next(iter(_QNN_CODE.findall(error)), "finalize error")
    hint = ("a shorter time axis (a smaller streaming chunk) or a split graph may fit" if "MEM_ALLOC" in code
            else "")
    return {**node_facts(model, node), "class": FINALIZE, "likely": True, "bytes": n_bytes, "reason": code,
            "hint": hint}


def named(error: BaseException | None, block_names=()) -> dict | None:
    """A failed lowering's diagnosis when QNN named its node (or a finalize failure's likely node), with
    the node's block by name: `block` when QNN named the node, `likely_block` for a finalize suspect."""
    d = dict(getattr(error, "diagnosis", None) or {})
    if not d.get("node"):
        return None
    i = d.get("block_index")
    if isinstance(i, int) and 0 <= i < len(block_names):
        d["likely_block" if d.get("likely") else "block"] = block_names[i]
    return d


def precision_notes(entries: list[dict]) -> None:
    """Say in each diagnosed build's reason whether the same graph compiled at another precision (the
    component's other builds of the QNN formats), i.e. whether another precision avoids the failure."""
    qnn = [e for e in entries if e["format"] in ("dlc", "ctx")]
    for e in entries:
        d = e.get("diagnosis")
        if not d:
            continue
        others = sorted({o["precision"] for o in qnn if o["precision"] != e["precision"]})
        ok = sorted({o["precision"] for o in qnn if o["precision"] != e["precision"] and o.get("files")})
        if ok:
            note = f"at {', '.join(ok)} the same graph compiled: that precision avoids it"
        elif others:
            note = f"it failed at {', '.join(others)} too: no precision built avoids it"
        else:
            note = "no other precision was built for the HTP"
        d["precisions"] = note
        e["parity"]["reason"] += f"; {note}"
        e["error"] = e["parity"]["reason"]


# A simulator run whose process died (jobs/errors.WorkerDied), at QNN's fast graph preparation: the
# 0.6B code2wav_n2 w8a16 graph with pre_transformer and upsample.1 in float segfaulted in its 25th
# Snake's quantized Sin with htp_graph_finalization_optimization_mode 1, every time, and ran at 2.
CRASH_HINT = ("the HTP simulator crashed in native code; QNN's fast graph preparation (--htp-optimization 1) "
              "crashed it on a graph QNN's default preparation (--htp-optimization 2) runs")
# The mode a repair step runs at once its process died at mode 1 (jobs/component._repair_stepped).
FALLBACK_FINALIZE = "2"


def run_failure(error: str, runner_kind: str, finalize: str | None = None) -> str:
    """The reason of a build that compiled and failed to run. On the HTP simulator the failing op is
    not in the error; attribution then runs every block alone on the simulator and names the one
    that fails (_link_attribution appends it). A run whose process died at finalization mode 1
    (`finalize`) says what ran such a graph (CRASH_HINT)."""
    if runner_kind != "qnn-htp":
        return f"runner failed: {error}"
    hint = f" ({CRASH_HINT})" if error.startswith("WorkerDied") and str(finalize) == "1" else ""
    return f"runner failed: the HTP simulator could not run the compiled graph [{RUN}]: {error}{hint}"


def _child() -> int:
    req = json.loads(sys.stdin.read())
    from .. import qnn_ep

    ort, _ = qnn_ep._register()
    ort.set_default_logger_severity(0)
    try:
        sess = qnn_ep.session(Path(req["model"]), req["options"], log_severity=0)
    except Exception as e:                  # the log on stderr says which node
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    del sess
    print("compiled")
    return 0


if __name__ == "__main__":
    sys.exit(_child())

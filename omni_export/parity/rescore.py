"""Re-run the parity of every listed artifact on its runner and compare with the recorded scores.

Inputs and fp32 references come from OUT/parity-inputs/<component>.npz (hash-checked first by
`verify`), so a build can be rescored without its checkpoint; what the gate read of a component
(gated outputs, logits, tie margins, summed rows, agreement floor) comes from its manifest record,
never from the recipe, so a build is rescored as it was judged. The DLC is not rescored: it was
scored as the QNN graph it serialises (compiled from the source ONNX, which is not kept), and ONNX
Runtime cannot load a DLC.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..artifacts.integrity import Finding


def rescore(out: Path, manifest: dict, tolerance_db: float) -> tuple[list[Finding], list[dict]]:
    from ..artifacts.reproducibility import read_parity_inputs
    from .gate import top1_gate

    findings, rows, data = [], [], {}
    for comp, info in (manifest.get("components") or {}).items():
        rec = (info or {}).get("parity_inputs")
        if rec and (out / rec["path"]).is_file():
            data[comp] = (info, read_parity_inputs(out / rec["path"]))
    for b in manifest["builds"]:
        row = {"name": b.get("name"), "format": b.get("format"), "precision": b.get("precision")}
        rows.append(row)
        skip = _unscorable(b, data)
        if skip:
            row["skipped"] = skip
            continue
        info, (inputs, refs) = data[b["component"]]
        comp = _declared(info)
        try:
            scores = _scores(out, b, info, inputs, refs, comp)
        except Exception as e:  # the artifact no longer loads or runs: that is drift, not a crash
            findings.append(Finding("rescore", b["files"][0]["path"], f"runner failed: {type(e).__name__}: "
                                    f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"))
            row["error"] = True
            continue
        row["outputs"] = {n: round(s.snr_db, 3) if math.isfinite(s.snr_db) else str(s.snr_db)
                          for n, s in scores.items() if s.agreement is None}
        agreements = {n: round(s.agreement, 6) for n, s in scores.items() if s.agreement is not None}
        if agreements:
            row["agreement"] = agreements
        top1 = top1_gate(info.get("top1_min"), b["precision"])
        findings += _compare(b, scores, tolerance_db, comp["gated"], top1, comp["agreement_min"])
    return findings, rows


def _declared(info: dict) -> dict:
    """What the gate read of a component, from its manifest record (jobs/component.py writes it)."""
    from ..core import RowSum

    floor = info.get("agreement_min")
    return {"gated": tuple(info.get("gated_outputs") or ()), "logits": tuple(info.get("logits") or ()),
            "tie_margins": dict(info.get("tie_margins") or {}),
            "row_sums": {o: RowSum(tuple(r["picks"]), r["own"]) for o, r in (info.get("row_sums") or {}).items()},
            "agreement_min": 1.0 if floor is None else float(floor)}


def _unscorable(b: dict, data: dict) -> str | None:
    if not b.get("files"):
        return "no file (the build failed before scoring)"
    if b.get("format") == "dlc":
        return "a DLC is scored as the QNN graph it serialises; ONNX Runtime cannot load the file"
    if b.get("component") not in data:
        return "no parity-inputs for its component"
    if not (b.get("parity") or {}).get("runner"):
        return "no runner recorded"
    return None


def _scores(out: Path, b: dict, info: dict, inputs: list[dict], refs: list[dict], comp: dict) -> dict:
    """The build's outputs scored as the gate scores them (codes by tie-aware agreement; a summed
    embedding without its codebook tables, which are the checkpoint's: on the frames whose codes agree)."""
    from ..runtime.runners import RunnerSpec, run_all
    from .metrics import score_outputs

    r = b["parity"]["runner"]
    names_in = tuple(s["name"] for s in info["inputs"])
    names_out = tuple(s["name"] for s in info["outputs"])
    spec = RunnerSpec(r["kind"], str(out / b["files"][0]["path"]), names_in, names_out, dict(r.get("options") or {}))
    outputs = run_all(spec, inputs)
    return {s.name: s for s in score_outputs(names_out, refs, outputs, comp["logits"], comp["tie_margins"],
                                             comp["row_sums"], inputs)}


def _compare(b: dict, scores: dict, tol: float, gated: tuple[str, ...], top1_min: float | None = None,
             agreement_min: float = 1.0) -> list[Finding]:
    from ..artifacts.scores import score_from_json
    from .gate import judge

    path = b["files"][0]["path"]
    found = []
    recorded = {o["name"]: o for o in b["parity"].get("outputs", [])}
    for name, s in scores.items():
        if s.agreement is not None:
            was = recorded.get(name, {}).get("agreement")
            if not isinstance(was, (int, float)) or abs(was - s.agreement) > 1e-6:
                found.append(Finding("score", path, f"output '{name}' agrees with fp32 on {100 * s.agreement:.1f}% "
                                                    f"now, {was if was is None else f'{100 * was:.1f}%'} recorded"))
            continue
        if s.against != recorded.get(name, {}).get("against"):
            continue               # compared with something else than the build compared it with
        was = _num(recorded.get(name, {}).get("snr_db"))
        now = s.snr_db
        if math.isfinite(was) and math.isfinite(now):
            same = abs(was - now) <= tol
        else:
            same = was == now or (math.isnan(was) and math.isnan(now))
        if not same:
            found.append(Finding("score", path, f"output '{name}' scores {now:.3f} dB now, {was:.3f} dB recorded "
                                                f"(tolerance {tol} dB)"))
    # a recorded score rescoring cannot make (a summed embedding against its own codes' codebook rows:
    # the tables are the checkpoint's) is judged as recorded
    kept = [score_from_json(o) for n, o in recorded.items() if n not in scores and (not gated or n in gated)]
    verdict = judge((*scores.values(), *kept), float(b["parity"]["threshold_db"]), gated, top1_min=top1_min,
                    agreement_min=agreement_min)
    # A build the phone rejected (AI Hub) keeps its local verdict under parity: compare with that.
    recorded = b["parity"].get("verdict") if b.get("rejected_by") == "device" else b.get("status")
    if verdict.status != recorded:
        found.append(Finding("score", path, f"verdict now {verdict.status}, recorded {recorded}"))
    return found


def _num(x) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    return {"inf": math.inf, "-inf": -math.inf}.get(x, math.nan)

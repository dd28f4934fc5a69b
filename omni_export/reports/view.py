"""What report.md and report.html show, computed once from the manifest (and a re-gating record).

Plain values only: the Markdown and HTML renderers format them, the figures draw them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..artifacts.scores import gated, gated_outputs, min_snr_db, num


@dataclass(frozen=True)
class BuildRow:
    key: str                  # component/format/precision: a build's identity across runs
    name: str                 # the artifact stem (shared by the formats of one precision)
    component: str
    format: str
    precision: str
    runner: str               # short runner name, e.g. "htp-sim fp16"
    runner_label: str
    threshold_db: float | None
    verdict: str              # what the reports show: the re-gated verdict when there is one
    reason: str
    built_verdict: str        # the manifest's verdict
    outputs: tuple = ()
    gated: tuple = ()
    min_snr_db: float | None = None
    bytes: int = 0
    files: tuple = ()
    samples: tuple = ()
    hub: dict | None = None
    scored: str = ""          # "2 of 12 samples" / "12 samples"; "shares the ctx build's run, not run itself"
    runner_kind: str = ""     # the runner's kind: ort-cpu, qnn-htp, executorch, device
    proxy: str = ""           # a verdict judged by proxy: on which runner and precision, for which unit, re-judged how

    @property
    def accepted(self) -> bool:
        return self.verdict == "accepted"

    @property
    def verdict_changed(self) -> bool:
        """True when a re-gating turned the build-time verdict around."""
        return self.verdict != self.built_verdict

    @property
    def worst(self) -> dict:
        """The gated output with the lowest SNR (non-finite first); {} when nothing was scored."""
        outs = gated(self.outputs, self.gated)
        return min(outs, key=_snr_key) if outs else {}

    @property
    def label(self) -> str:
        return f"{self.component} {self.format} {self.precision}"

    @property
    def agreement(self) -> str:
        """The gated outputs scored by agreement (codes), for the SNR column: `codes 100.0% (raw 73.3%,
        near ties excused)`; "" when every gated output has an SNR."""
        return "; ".join(agreement_note(o) for o in gated(self.outputs, self.gated) if o.get("agreement") is not None)


def _snr_key(o: dict) -> float:
    v = num(o.get("snr_db"))
    return -math.inf if o.get("finite") is False or math.isnan(v) else v


def build_rows(m: dict, regated: dict | None = None) -> list[BuildRow]:
    again = {r["key"]: r for r in (regated or {}).get("builds", [])}
    return [_row(m, b, again.get(f"{b['component']}/{b['format']}/{b['precision']}")) for b in m["builds"]]


def _row(m: dict, b: dict, again: dict | None) -> BuildRow:
    p = b.get("parity") or {}
    runner = p.get("runner") or {}
    outputs = tuple(p.get("outputs") or ())
    names = gated_outputs(m, b["component"])
    return BuildRow(
        key=f"{b['component']}/{b['format']}/{b['precision']}", name=b["name"], component=b["component"],
        format=b["format"], precision=b["precision"], runner=runner.get("short", "—"),
        runner_label=runner.get("label", "no runner (not built)"),
        threshold_db=(again or p).get("threshold_db"),
        verdict=(again or {}).get("verdict", b["status"]),
        reason=(again or {}).get("reason") or _device_reason(b) or p.get("reason") or b.get("error") or "",
        built_verdict=b["status"], outputs=outputs, gated=names, min_snr_db=min_snr_db(outputs, names),
        bytes=sum(f["bytes"] for f in b.get("files", [])), files=tuple(b.get("files", [])),
        samples=tuple(b.get("samples", [])), hub=b.get("hub"), scored=_scored(m, b),
        runner_kind=runner.get("kind", ""), proxy=(p.get("proxy") or {}).get("note", ""))


def _scored(m: dict, b: dict) -> str:
    """What the verdict rests on besides the runner: how many of the component's held-out samples it
    scored (which ones, when not all: parity.heldout_indices), and, for a build whose outputs are a sibling's (a DLC sharing its context binary's
    run), that it was not run itself."""
    n = ((m.get("components") or {}).get(b["component"]) or {}).get("heldout", {}).get("count")
    k = (b.get("parity") or {}).get("samples")
    which = (b.get("parity") or {}).get("heldout_indices")
    said = ""
    if isinstance(k, int) and isinstance(n, int):
        said = f"{k} of {n} samples" if k < n else f"{k} sample{'s' if k != 1 else ''}"
        if k < n and isinstance(which, list) and all(isinstance(x, int) for x in which):
            said += ": " + ", ".join(f"#{x}" for x in which)          # which held-out samples (0-based)
    if b.get("outputs_from"):
        said += f"{'; ' if said else ''}shares the {b['outputs_from']} build's run, not run itself"
    return said


def _device_reason(b: dict) -> str:
    """A build accepted locally and rejected on the phone: the phone's reason."""
    if b.get("rejected_by") != "device":
        return ""
    return "on the device (AI Hub): " + str(((b.get("hub") or {}).get("parity") or {}).get("reason"))


def components_without_accepted(m: dict, rows: list[BuildRow]) -> list[str]:
    comps = list(m["components"]) or sorted({r.component for r in rows})
    return [c for c in comps if not any(r.component == c and r.accepted for r in rows)]


def weakest_blocks(m: dict) -> list[dict]:
    """Per component and precision, the block that loses the most dB on its own."""
    out = []
    for comp, info in m["components"].items():
        for prec, rows in (info.get("attribution") or {}).items():
            failed = [r for r in rows if r.get("error") or r.get("finite") is False]
            scored = [r for r in rows if r.get("snr_db") is not None]
            if failed:
                out.append({"component": comp, "precision": prec, "block": failed[0]["block"],
                            "snr_db": None, "note": failed[0].get("error") or "NaN/Inf"})
            elif scored:
                r = min(scored, key=lambda r: r["snr_db"])
                out.append({"component": comp, "precision": prec, "block": r["block"], "snr_db": r["snr_db"],
                            "note": ""})
    return out


def agreement_note(o: dict) -> str:
    """An output gated by agreement (codes) in words, with its raw agreement beside the excused one."""
    agree, raw = o["agreement"], o.get("agreement_raw")
    extra = f" (raw {100 * raw:.1f}%, near ties excused)" if raw is not None and raw != agree else ""
    return f"{o['name']} agreement {100 * agree:.1f}%{extra}"


def fmt_db(x) -> str:
    """A dB value for people: one decimal, ∞ for exact, NaN/Inf for broken, — for missing."""
    if x is None:
        return "—"
    v = num(x)
    if math.isnan(v) or v == -math.inf:
        return "NaN/Inf"
    if v == math.inf:
        return "∞"
    return f"{v:.1f}"


def human_bytes(n: int | None) -> str:
    if not n:
        return "—"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover


def short_sha(sha: str | None) -> str:
    if not sha:
        return "unknown"
    base, dirty = sha.removesuffix("-dirty"), sha.endswith("-dirty")
    return base[:10] + ("-dirty" if dirty else "")


# What a verdict does not cover, said next to it (issue 37: a report that never misleads).
E2E_GATE_NOTE = ("The end-to-end gate is teacher-forced agreement: every step is fed the fp32 model's previous "
                 "codes, so one differing code is counted once. Free-running codes (and the waveform made from "
                 "them) follow their own history after the first difference, so their lower agreement is "
                 "expected and is shown, not gated.")


def caveats(m: dict, rows: list[BuildRow]) -> list[str]:
    """Plain sentences on what the verdicts above were not checked against."""
    out = []
    acc = (m.get("host") or {}).get("xnnpack_fp16_accumulation")
    pte16 = [r for r in rows if r.format == "pte" and r.precision == "fp16" and r.accepted]
    if pte16 and acc != "fp16":
        how = "in fp32" if acc == "fp32" else "in a way omni-export could not tell"
        out.append(f"{len(pte16)} accepted fp16 .pte build(s) were scored on a CPU whose XNNPACK sums fp16 "
                   f"products {how}; phones sum them in fp16, which loses more on long reductions "
                   f"(docs/fp16-pte.md). Confirm them on a device (--hub) or on a CPU with AVX512-FP16.")
    target = m.get("target") or {}
    if target.get("htp_arch"):
        placement = target.get("placement")
        placement = placement if isinstance(placement, dict) else {}      # a damaged manifest: read, not trusted
        unchecked = [c for c in m.get("components", {})
                     if placement.get(c, "htp") == "htp"
                     and not any(r.component == c and (r.runner_kind == "qnn-htp" or r.hub) for r in rows)
                     and any(r.component == c for r in rows)]
        if unchecked:
            # a dlc / ctx build that failed to compile or run was asked for: saying "add them" would mislead
            tried = any(r.component in unchecked and r.format in ("dlc", "ctx") for r in rows)
            fix = ("Its dlc / ctx builds failed before they could be scored: see their reasons." if tried
                   else "Add dlc or ctx to --formats to score on the HTP simulator.")
            out.append(f"Nothing of {', '.join(unchecked)} ran on the HTP (simulator or device): "
                       f"{'its' if len(unchecked) == 1 else 'their'} verdicts come from CPU runtimes only. {fix}")
    return out


def raised_text(step: dict, escape=str) -> str:
    """What a precision repair step (or its result) raised, in words: "layers.0 at 8-bit weights",
    "blocks.3, blocks.6 kept in float", or "nothing raised"; `escape` applies to the module names."""
    from ..artifacts.manifest import raised_names

    names, how = raised_names(step)
    return f"{escape(', '.join(names))} {how}" if names else "nothing raised"

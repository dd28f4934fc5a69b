"""End-to-end parity: the held-out prompts through a build's graphs on one runner, against the
fp32 pipeline.

Two measures, because one flipped code changes every later frame of a free-running utterance:
  teacher-forced code agreement (gated): every code the build decides given the fp32 pipeline's
    history (the talker fed the fp32 frames, the predictor step graphs the fp32 codes), as a
    fraction of the 16 x frames codes. A flip where fp32's two best logits were within
    TIE_MARGIN (0.05, i.e. 5 % in probability) is a near tie, not a defect, and is excused and
    counted. Gate: >= 99 %.
  free-running (reported): the build synthesises greedily on its own (fused predictor frame graph,
    streaming Code2Wav): code agreement, the first frame that differs, and the waveform SNR over
    the common length.
"""
from __future__ import annotations

import numpy as np

from ...core import variant_base
from ...parity.metrics import TIE_MARGIN

CODE_AGREEMENT_MIN = 0.99
# What a frame's codes 1..15 run through when the fused predictor_frame graph has no accepted build at
# a row's precision and runner (the recipe's realtime alternative): its prefill and 14 decode steps.
STEP_GRAPHS = ("predictor_prefill", "predictor_decode")
E2E_GRAPHS = ("text_projection", "talker_prefill", "talker_decode", "talker_prefill_part1", "talker_prefill_part2",
              "talker_decode_part1", "talker_decode_part2", "predictor_prefill", "predictor_decode",
              "predictor_frame", "code2wav")


def agreement(ref: np.ndarray, out: np.ndarray) -> tuple[float, int | None]:
    """Fraction of equal codes over the reference's frames (missing frames count as unequal),
    and the first frame that differs."""
    n = len(ref)
    if n == 0:
        return 1.0, None
    m = min(n, len(out))
    eq = (ref[:m] == out[:m])
    diff = np.nonzero(~eq.all(axis=1))[0]
    first = int(diff[0]) if len(diff) else (m if len(out) != n else None)
    return float(eq.sum()) / ref.size, first


def _why_skipped(manifest: dict, missing: list[str], precision: str) -> str:
    """Why a row cannot run: graphs this run built at `precision` but rejected, and graphs it did not
    build at that precision at all (a --components or --precision subset) -- the second is the
    user's choice, not a finding about the model."""
    built = {b["component"] for b in manifest.get("builds", []) if b.get("precision") == precision}
    rejected = [g for g in missing if g in built]
    absent = [g for g in missing if g not in built]
    parts = [f"no accepted {', '.join(rejected)} build"] if rejected else []
    if absent:
        parts.append(f"{', '.join(absent)} not built at {precision} in this run")
    return "; ".join(parts)


def run(model, out_dir, manifest: dict, runners: dict, progress, part: tuple[int, int] | None = None) -> list[dict]:
    """runners: {runner kind (ort | htp | pte): precisions}; returns one row per (precision, runner).
    `part` (k, n): only the held-out prompts k, k + n, ...; each row then carries what `merge` scores
    over the parts (`_part`), not its verdict -- the build runs a light model's row as n jobs at once."""
    from ...runtime.graphs import BuildGraphs, EagerGraphs, accepted

    if int(model.options["e2e-frames"]) == 0:
        progress.note("end-to-end parity skipped (--e2e-frames 0)")
        return []
    graphs = [g for g in model.components() if g in E2E_GRAPHS or variant_base(g) in E2E_GRAPHS]   # + chunk shapes
    if model.cfg.tts_model_type == "base":
        graphs.append("speaker_encoder")
    plan = [(runner, prec, *_predictor([g for g in graphs if not accepted(manifest, g, runner, prec)], graphs))
            for runner, precisions in runners.items() for prec in precisions]
    if all(missing for _, _, missing, _ in plan):
        # A partial build (--components) or every precision rejected: no row can run, so the fp32
        # reference pipeline (minutes and GBs at real size) is not computed.
        n = len(model.requests("heldout"))
        return [{"runner": runner, "precision": prec, "prompts": n, "threshold": CODE_AGREEMENT_MIN,
                 "tie_margin": TIE_MARGIN, "verdict": "skipped", "reason": _why_skipped(manifest, missing, prec)}
                for runner, prec, missing, _ in plan]
    requests = model.requests("heldout")
    if part is not None:
        requests = requests[part[0]::part[1]]
    with progress.stage("end-to-end: fp32 reference pipeline on the held-out prompts"):
        eager = EagerGraphs(model)
        reference = _free_running(model, eager, requests)
        margins = [_teacher_forced(model, eager, req, codes)[1] for req, (codes, _) in zip(requests, reference)]
    # The fp32 modules are done: each holds its own copy of its weights (2.5 GB at 0.6B), which
    # otherwise sat beside every runner's sessions below.
    del eager
    from ...memory import available_bytes
    from ...memory import release_memory

    release_memory()
    rows = []
    for runner, prec, missing, predictor in plan:
        row = {"runner": runner, "precision": prec, "prompts": len(reference),
               "frames": int(sum(len(r[0]) for r in reference)), "threshold": CODE_AGREEMENT_MIN,
               "tie_margin": TIE_MARGIN}
        if missing:
            rows.append({**row, "verdict": "skipped", "reason": _why_skipped(manifest, missing, prec)})
            continue
        if predictor == "step":
            row["predictor"] = {"graphs": "step", "why": _why_skipped(manifest, ["predictor_frame"], prec)}
        with progress.stage(f"end-to-end: held-out prompts through {prec} graphs on {runner}"):
            avail = available_bytes()
            # lean ORT sessions: the default ones hold an fp32 copy of every fp16 graph's weights
            # (6.1 GiB for the 0.6B graphs; 1.5 GiB lean, 69 vs 55 s for this stage)
            built = BuildGraphs(out_dir, runner, prec, manifest=manifest,
                                max_open_bytes=int(avail * 0.8) if avail else None, lean=True)
            try:
                free = _free_running(model, built, requests, predictor)
                forced = [_teacher_forced(model, built, req, codes)[0] for req, (codes, _) in zip(requests, reference)]
            finally:
                built.close()
        if built.repaired:
            row["repaired"] = dict(sorted(built.repaired.items()))
        if runner == "ort":
            row["ort_sessions"] = "lean (basic graph optimizations, no memory arena)"
        if part is not None:
            rows.append({**row, "_part": {"reference": reference, "margins": margins, "free": free, "forced": forced}})
        else:
            rows.append({**row, **_score(reference, margins, free, forced)})
    return rows


def merge(parts: list[list[dict]]) -> list[dict]:
    """One row per (runner, precision) from the rows of `run`'s parts (each part's rows in the same
    order): the verdict over every prompt, as one job would have scored it."""
    rows = []
    for same in zip(*parts):
        data = [r.get("_part") for r in same]
        row = {k: v for k, v in same[0].items() if k != "_part"}
        if any(d is None for d in data):            # skipped (the same in every part)
            rows.append(row)
            continue
        # part k held prompts k, k + n, ...: back in prompt order
        n, total = len(data), sum(len(d["reference"]) for d in data)
        joined = {k: [data[i % n][k][i // n] for i in range(total)] for k in ("reference", "margins", "free", "forced")}
        row["prompts"] = sum(r["prompts"] for r in same)
        row["frames"] = int(sum(len(c) for c, _ in joined["reference"]))
        rows.append({**row, **_score(joined["reference"], joined["margins"], joined["free"], joined["forced"])})
    return rows


def _predictor(missing: list[str], graphs: list[str]) -> tuple[list[str], str]:
    """(the graphs a row still lacks, how its free-running synthesis runs the code predictor): "frame"
    (the fused graph), or "step" when predictor_frame lacks an accepted build and both step graphs have
    one -- they decide the same codes (greedy, as synth --predictor step), a frame in 15 calls."""
    if "predictor_frame" in missing and all(g in graphs and g not in missing for g in STEP_GRAPHS):
        return [g for g in missing if g != "predictor_frame"], "step"
    return missing, "frame"


def _free_running(model, graphs, requests=None, predictor: str = "frame") -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for req in model.requests("heldout") if requests is None else requests:
        gen, wav = model.synthesize(graphs, req, model.gen_options(greedy=True, max_frames=int(model.options["e2e-frames"]),
                                                                   predictor=predictor))
        out.append((gen.codes, wav if wav is not None else np.zeros(0, np.float32)))
    return out


def _teacher_forced(model, graphs, req, codes):
    from . import host
    from .prompt import build

    if model.cfg.tts_model_type == "base":
        req.speaker_embedding = model.speaker_embedding(graphs, model.default_voice())
    pr = build(model.cfg, req, lambda ids: model.text_proj(graphs, ids), model.tables.codec_emb)
    return host.teacher_forced(graphs, model.cfg, model.tables, pr, codes, model.gen_options(greedy=True))


def _score(reference, margins, free, forced) -> dict:
    from ...parity.metrics import Accumulator, Agreement

    counts, firsts = Agreement(), []
    for (rc, _), mar, pred in zip(reference, margins, forced):
        counts.forced(rc, pred, mar)
    wav = Accumulator("wav")
    for (rc, rw), (oc, ow) in zip(reference, free):
        frac, first = agreement(rc, oc)
        counts.equal += frac * rc.size
        firsts.append(first)
        n = min(len(rw), len(ow))
        wav.add(rw[:n], ow[:n])          # over the common length when frame counts differ
    s = wav.score()
    return counts.row("code", "codes", CODE_AGREEMENT_MIN, firsts,
                      wav_snr_db=round(s.snr_db, 3) if s.finite else None)

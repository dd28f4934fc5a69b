"""End-to-end parity: the held-out prompts synthesised greedily through a build's graphs on one
runner, against the fp32 pipeline: code agreement (% of the 16 x frames codes equal) and waveform
SNR. Graphs that pass one by one can still diverge as a pipeline (a flipped code changes every
later frame), so this is gated too.

Gate: at least 95 % of the held-out codes equal. Greedy decoding is deterministic, so any
disagreement is the build's numerics; an early flip derails the rest of the utterance and shows
up as a large loss, while a late isolated flip costs a few percent. 95 % admits a late flip in
one of the held-out utterances but not a derailed one.
"""
from __future__ import annotations

import numpy as np

CODE_AGREEMENT_MIN = 0.95
E2E_GRAPHS = ("text_projection", "talker_prefill", "talker_decode", "predictor_frame", "code2wav")


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


def run(model, out_dir, manifest: dict, runners: dict, progress) -> list[dict]:
    """runners: {runner kind (ort | htp | pte): precisions}; returns one row per (precision, runner)."""
    from .graphs import BuildGraphs, EagerGraphs

    graphs = [g for g in E2E_GRAPHS if g in model.components()]
    if model.cfg.tts_model_type == "base":
        graphs.append("speaker_encoder")
    reference = _synthesize(model, EagerGraphs(model))
    rows = []
    for runner, precisions in runners.items():
        for prec in precisions:
            missing = [g for g in graphs if not _accepted(manifest, g, runner, prec)]
            row = {"runner": runner, "precision": prec, "prompts": len(reference),
                   "frames": int(sum(len(r[0]) for r in reference)), "threshold": CODE_AGREEMENT_MIN}
            if missing:
                rows.append({**row, "verdict": "skipped", "reason": f"no accepted {', '.join(missing)} build"})
                continue
            with progress.stage(f"end-to-end: held-out prompts through {prec} graphs on {runner}"):
                built = BuildGraphs(out_dir, runner, prec)
                try:
                    results = _synthesize(model, built)
                finally:
                    built.close()
            rows.append({**row, **_score(reference, results)})
    return rows


def _accepted(manifest: dict, graph: str, runner: str, prec: str) -> bool:
    from .graphs import RUNNER_FORMATS

    fmt = RUNNER_FORMATS[runner][0]
    return any(b["component"] == graph and b["format"] == fmt and b["precision"] == prec and
               b["status"] == "accepted" for b in manifest["builds"])


def _synthesize(model, graphs) -> list[tuple[np.ndarray, np.ndarray]]:
    from .model import HELDOUT_FRAMES

    out = []
    for req in model.requests("heldout"):
        gen, wav = model.synthesize(graphs, req, model.gen_options(greedy=True, max_frames=HELDOUT_FRAMES))
        out.append((gen.codes, wav if wav is not None else np.zeros(0, np.float32)))
    return out


def _score(reference, results) -> dict:
    from ...parity.metrics import Accumulator

    equal = total = 0
    firsts = []
    wav = Accumulator("wav")
    for (rc, rw), (oc, ow) in zip(reference, results):
        frac, first = agreement(rc, oc)
        equal += frac * rc.size
        total += rc.size
        firsts.append(first)
        n = min(len(rw), len(ow))
        wav.add(rw[:n], ow[:n])          # over the common length when frame counts differ
    agree = equal / total if total else 1.0
    s = wav.score()
    ok = agree >= CODE_AGREEMENT_MIN
    reason = (f"codes {100 * agree:.1f}% equal to fp32 {'>=' if ok else '<'} {100 * CODE_AGREEMENT_MIN:.0f}%"
              + ("" if ok else f"; first divergent frame per prompt: {firsts}"))
    return {"code_agreement": round(agree, 6), "first_divergence": firsts,
            "wav_snr_db": round(s.snr_db, 3) if s.finite else None,
            "verdict": "accepted" if ok else "rejected", "reason": reason}

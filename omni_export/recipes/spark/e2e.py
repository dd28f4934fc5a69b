"""End-to-end parity for Spark: the held-out prompts generated greedily through a build's prefill +
decode graphs on one runner, against the fp32 graphs.

  teacher-forced top-1 (gated): at every step of fp32's greedy continuation, does the build, given
    the same history, pick fp32's token? A flip where fp32's two best logits were within TIE_MARGIN
    is a near tie and is excused (counted). Gate: >= TOKEN_AGREEMENT_MIN.
  free-running (reported): the build generates on its own; fraction of tokens equal to fp32's
    position by position, and the first step that differs.
"""
from __future__ import annotations

import numpy as np

from ...parity.metrics import TIE_MARGIN

TOKEN_AGREEMENT_MIN = 0.95


def run(model, out_dir, manifest: dict, runners: dict, progress) -> list[dict]:
    from ...runtime.graphs import BuildGraphs, EagerGraphs, accepted

    n = int(model.options["e2e-tokens"])
    if n == 0:
        progress.note("end-to-end parity skipped (--e2e-tokens 0)")
        return []
    prompts = model.prompt_ids("heldout", n)
    with progress.stage(f"end-to-end: fp32 greedy generation of {n} tokens per held-out prompt"):
        eager = EagerGraphs(model)
        reference = [model.generate(eager, ids, n, stop=False) for ids in prompts]
    rows = []
    for runner, precisions in runners.items():
        for prec in precisions:
            row = {"runner": runner, "precision": prec, "prompts": len(prompts), "tokens": n,
                   "threshold": TOKEN_AGREEMENT_MIN, "tie_margin": TIE_MARGIN}
            missing = [g for g in ("prefill", "decode") if not accepted(manifest, g, runner, prec)]
            if missing:
                rows.append({**row, "verdict": "skipped", "reason": f"no accepted {', '.join(missing)} build"})
                continue
            with progress.stage(f"end-to-end: held-out prompts through {prec} graphs on {runner}"):
                built = BuildGraphs(out_dir, runner, prec, manifest=manifest)
                try:
                    free = [model.generate(built, ids, n, stop=False) for ids in prompts]
                    # where the build generated fp32's tokens, its free run *is* the teacher-forced run
                    forced = [f.logits if f.tokens == r.tokens else model.teacher_forced(built, ids, r.tokens)
                              for ids, r, f in zip(prompts, reference, free)]
                finally:
                    built.close()
            if built.repaired:
                row["repaired"] = dict(sorted(built.repaired.items()))
            rows.append({**row, **score(reference, free, forced)})
    return rows


def score(reference, free, forced) -> dict:
    from ...parity.metrics import Agreement

    agreement, firsts = Agreement(), []
    for ref, fr, fo in zip(reference, free, forced):
        top2 = np.sort(np.stack(ref.logits), axis=-1)[:, -2:]
        agreement.forced(np.array(ref.tokens), np.array([int(np.argmax(x)) for x in fo]), top2[:, 1] - top2[:, 0])
        same = [a == b for a, b in zip(ref.tokens, fr.tokens)]
        agreement.equal += sum(same)
        firsts.append(next((i for i, s in enumerate(same) if not s), None))
    return agreement.row("token", "greedy tokens", TOKEN_AGREEMENT_MIN, firsts)

"""Device outputs -> the same scores and verdict as a local build (parity/metrics.py, parity/gate.py).

The held-out inputs and fp32 references come from parity-inputs/<component>.npz (hash-checked);
the threshold is the build's own gate; the gated outputs, integer agreement and near-tie margins
are the component's. Outputs are matched by name; when AI Hub renamed them (some runtimes do), by
position, and the record says so.
"""
from __future__ import annotations

import numpy as np

from ..artifacts.reproducibility import npz_bytes


def dataset(inputs: list[dict], names: list[str]) -> dict:
    """AI Hub DatasetEntries: {input name: [one array per sample]} in the graph's input order."""
    return {n: [np.ascontiguousarray(s[n]) for s in inputs] for n in names}


def per_sample(entries: dict, names: list[str], count: int) -> tuple[list[dict], str]:
    """DatasetEntries from the device -> one {output name: array} per sample, and how names matched."""
    got = list(entries)
    if set(names) <= set(got):
        order, how = names, "by name"
    elif len(got) == len(names):
        order, how = got, f"by position (AI Hub named them {', '.join(got)})"
    else:
        raise ValueError(f"the device returned outputs {', '.join(got)}; the graph has {', '.join(names)}")
    outs = [{} for _ in range(count)]
    for name, key in zip(names, order):
        arrays = entries[key]
        if len(arrays) != count:
            raise ValueError(f"the device returned {len(arrays)} samples of '{key}' for {count} inputs")
        for i, a in enumerate(arrays):
            a = np.asarray(a)
            outs[i][name] = a.astype(np.float32) if a.dtype == np.float16 else a
    return outs, how


def score(component, info: dict, refs: list[dict], outs: list[dict], threshold: float,
          precision: str | None = None, inputs: list[dict] | None = None) -> dict:
    """The verdict dict (same shape as a local build's "parity", runner added by the caller); `precision`
    picks the component's top-1 gate for logits (Component.top1_min), when it has one. A summed
    embedding (Component.row_sums) is compared with fp32's on the rows whose codes all agree: the
    codebook tables are the checkpoint's, not at hand here, so its own-codes score is the local build's."""
    from ..parity.gate import judge, top1_gate
    from ..parity.metrics import score_outputs

    names = [o["name"] for o in info["outputs"]]
    scores = score_outputs(names, refs, outs, component.logits, dict(component.tie_margins),
                           component.row_sums, inputs)
    v = judge(scores, threshold, tuple(info.get("gated_outputs") or component.gated_outputs),
              agreement_min=info.get("agreement_min", component.agreement_min),
              top1_min=top1_gate(info.get("top1_min"), precision) if precision else None)
    return {"threshold_db": threshold, "verdict": v.status, "reason": v.reason,
            "outputs": [s.to_json() for s in v.scores]}


def outputs_npz(outs: list[dict]) -> bytes:
    """The device outputs as kept under hub/: `output.{i}.{name}` per held-out sample."""
    return npz_bytes({f"output.{i}.{n}": a for i, o in enumerate(outs) for n, a in o.items()})

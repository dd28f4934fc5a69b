"""Fidelity metrics, pure numpy, in float64.

SNR_dB  = 10 log10( sum(ref^2) / sum((ref - out)^2) )
PSNR_dB = 20 log10( max|ref| / RMSE )   (peak from the fp32 reference, as AI Hub reports it)
Both accumulate over every held-out sample of an output before taking the ratio.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from ..core import OutputScore

INF_DB = float("inf")


class Accumulator:
    """Sums signal and error energy of one output across held-out samples."""

    def __init__(self, name: str, logits: bool = False):
        self.name, self.logits = name, logits
        self.signal = 0.0
        self.error = 0.0
        self.count = 0
        self.peak = 0.0
        self.max_abs = 0.0
        self.finite = True
        self.top1_hits = 0
        self.top1_total = 0
        self.integer = None
        self.equal = 0

    def add(self, ref: np.ndarray, out: np.ndarray) -> None:
        ref, out = np.asarray(ref), np.asarray(out)
        if self.integer is None:
            self.integer = np.issubdtype(ref.dtype, np.integer)
        if self.integer:
            if ref.size != np.size(out):
                raise ValueError(f"output '{self.name}': shape {np.shape(out)} != reference {ref.shape}")
            self.equal += int((ref.reshape(-1) == np.asarray(out).reshape(-1)).sum())
            self.count += ref.size
            return
        ref = np.asarray(ref, dtype=np.float64)
        out = np.asarray(out, dtype=np.float64)
        if ref.shape != out.shape:
            if ref.size != out.size:
                raise ValueError(f"output '{self.name}': shape {out.shape} != reference {ref.shape}")
            out = out.reshape(ref.shape)
        if not np.isfinite(out).all():
            self.finite = False
            out = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
            self.error = math.inf
        diff = ref - out
        self.signal += float(np.sum(ref * ref))
        if self.error != math.inf:
            self.error += float(np.sum(diff * diff))
        self.count += ref.size
        self.peak = max(self.peak, float(np.max(np.abs(ref))) if ref.size else 0.0)
        self.max_abs = max(self.max_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
        if self.logits and ref.ndim >= 1 and ref.shape[-1] > 1:
            a = ref.reshape(-1, ref.shape[-1]).argmax(-1)
            b = out.reshape(-1, out.shape[-1]).argmax(-1)
            self.top1_hits += int((a == b).sum())
            self.top1_total += a.size

    def score(self) -> OutputScore:
        if self.integer:
            agree = self.equal / self.count if self.count else 0.0
            return OutputScore(self.name, None, None, 0.0, agreement=agree)
        if not self.finite:
            return OutputScore(self.name, -INF_DB, -INF_DB, math.inf, finite=False,
                               top1=self._top1())
        return OutputScore(self.name, snr_db(self.signal, self.error),
                           psnr_db(self.peak, self.error, self.count), self.max_abs,
                           top1=self._top1())

    def _top1(self) -> float | None:
        return self.top1_hits / self.top1_total if self.top1_total else None


def snr_db(signal: float, error: float) -> float:
    if error == 0.0:
        return INF_DB
    if signal == 0.0:
        return -INF_DB
    return 10.0 * math.log10(signal / error)


def psnr_db(peak: float, error: float, count: int) -> float:
    if error == 0.0:
        return INF_DB
    if peak == 0.0 or count == 0:
        return -INF_DB
    rmse = math.sqrt(error / count)
    return 20.0 * math.log10(peak / rmse)


def snr(ref: np.ndarray, out: np.ndarray) -> float:
    acc = Accumulator("x")
    acc.add(ref, out)
    return acc.score().snr_db


# Two decisions whose fp32 scores differ by less than this (in logits, i.e. nats) are a near tie:
# e^0.05 = 1.05, the two choices are within 5 % of each other's probability.
TIE_MARGIN = 0.05


class Agreement:
    """An end-to-end row's integer picks (tokens, codes) against fp32's: teacher-forced (the build given
    fp32's history picks fp32's choice?), a flip where fp32's decision was within TIE_MARGIN excused and
    counted, and the free-running run's fraction equal position by position."""

    def __init__(self):
        self.agreed = self.total = self.ties = self.flips = 0
        self.equal = 0.0

    def forced(self, reference: np.ndarray, picked: np.ndarray, margins: np.ndarray) -> None:
        differ = picked != reference
        near = differ & (margins < TIE_MARGIN)
        self.ties += int(near.sum())
        self.flips += int(differ.sum())
        self.agreed += int(reference.size - differ.sum() + near.sum())
        self.total += reference.size

    def row(self, key: str, what: str, minimum: float, firsts: list, **reported) -> dict:
        """The row's fields: `key`_agreement (gated at `minimum`), the flips, the free-running figures,
        `reported` ones, verdict and reason."""
        agree = self.agreed / self.total if self.total else 1.0
        ok = agree >= minimum
        reason = (f"teacher-forced {what} {100 * agree:.1f}% equal to fp32 ({self.ties} near-tie flips of "
                  f"{self.flips} excused) {'>=' if ok else '<'} {100 * minimum:.0f}%")
        return {f"{key}_agreement": round(agree, 6), "near_tie_flips": self.ties, "flips": self.flips,
                "free_running_agreement": round(self.equal / self.total, 6) if self.total else 1.0,
                "first_divergence": firsts, **reported, "verdict": "accepted" if ok else "rejected", "reason": reason}


def tie_aware(refs: Sequence[np.ndarray], outs: Sequence[np.ndarray], margins: Sequence[np.ndarray]):
    """Agreement of rows of sequential decisions (last axis), excusing near ties: a row agrees up to
    its first flip; if fp32's margin at that flip was under TIE_MARGIN, the whole row is excused
    (its later decisions were conditioned on an equally good choice). Returns (agreement, ties)."""
    agreed = total = ties = 0
    for ref, out, mar in zip(refs, outs, margins):
        r = np.asarray(ref).reshape(-1, np.shape(ref)[-1])
        o = np.asarray(out).reshape(r.shape)
        m = np.asarray(mar, dtype=np.float64).reshape(r.shape)
        for rr, oo, mm in zip(r, o, m):
            total += rr.size
            diff = np.nonzero(rr != oo)[0]
            if not len(diff):
                agreed += rr.size
            elif mm[diff[0]] < TIE_MARGIN:
                agreed += rr.size
                ties += 1
            else:
                agreed += int(diff[0])
    return (agreed / total if total else 1.0), ties


def score_outputs(names: Sequence[str], refs: Sequence[dict], outs: Sequence[dict],
                  logits: Sequence[str] = (), tie_margins: dict | None = None, row_sums: Mapping | None = None,
                  inputs: Sequence[dict] | None = None, tables: Mapping | None = None) -> list[OutputScore]:
    """Score every named output over paired lists of reference/output dicts. With `row_sums`
    ({output: RowSum}) and the held-out `inputs` they were run on, those outputs are scored by
    row_sum_scores on `tables` ({output: its tables}; missing: fp32 on the rows whose picks agree)."""
    accs = {n: Accumulator(n, n in logits) for n in names}
    for ref, out in zip(refs, outs, strict=True):
        for n in names:
            accs[n].add(ref[n], out[n])
    scores = [accs[n].score() for n in names]
    for i, s in enumerate(scores):
        margin = (tie_margins or {}).get(s.name)
        if s.agreement is not None and margin:
            agree, ties = tie_aware([r[s.name] for r in refs], [o[s.name] for o in outs], [r[margin] for r in refs])
            scores[i] = OutputScore(s.name, None, None, 0.0, agreement=agree, agreement_raw=s.agreement, ties=ties)
    if inputs is None:
        return scores
    for name, rs in (row_sums or {}).items():
        if name in names:
            i = [s.name for s in scores].index(name)
            scores[i:i + 1] = row_sum_scores(name, rs, (tables or {}).get(name), inputs, refs, outs)
    return scores


def row_sum(tables: Sequence[np.ndarray], picks: np.ndarray) -> np.ndarray:
    """Per row of `picks` [rows, len(tables)]: the sum of tables[g][picks[row, g]] over g, in float64
    (a pick outside its table is clipped into it: the picks' own agreement gate names it)."""
    picks = np.asarray(picks, dtype=np.int64).reshape(-1, len(tables))
    total = np.zeros((picks.shape[0], np.shape(tables[0])[-1]))
    for g, t in enumerate(tables):
        total += np.asarray(t)[np.clip(picks[:, g], 0, len(t) - 1)]
    return total


def _picks(names: Sequence[str], *sources: dict) -> np.ndarray:
    """The picks named by `names` (from the first source holding each) as [rows, picks]."""
    cols = []
    for n in names:
        a = np.asarray(next(src[n] for src in sources if n in src))
        cols.append(a.reshape(-1, a.shape[-1] if a.ndim else 1))
    return np.concatenate(cols, axis=1)


def row_sum_scores(name: str, rs, tables, inputs: Sequence[dict], refs: Sequence[dict],
                   outs: Sequence[dict]) -> list[OutputScore]:
    """Scores of an output that sums table rows picked by integer tensors (a RowSum), per held-out row:
    `name` against fp32's output up to the first pick that differs from fp32's (both sides less the
    rows of their own picks from there on), and `rs.own` against the sum of the rows its own picks
    select (exact up to the runner's precision). Without `tables`: `name` against fp32's on the rows
    whose picks all agree, and no `rs.own` score."""
    table, pick = rs.words
    own, fp32 = Accumulator(rs.own), Accumulator(name)
    for i, r, o in zip(inputs, refs, outs, strict=True):
        mine, theirs = _picks(rs.picks, o, i), _picks(rs.picks, r, i)
        out = np.asarray(o[name], dtype=np.float64).reshape(len(mine), -1)
        ref = np.asarray(r[name], dtype=np.float64).reshape(len(theirs), -1)
        differs = mine != theirs
        if tables is None:
            same = ~differs.any(axis=1)
            if same.any():
                fp32.add(ref[same], out[same])
            continue
        own.add(row_sum(tables, mine), out)
        first = np.where(differs.any(axis=1), differs.argmax(axis=1), mine.shape[1])
        for row, k in enumerate(first):
            if k == len(tables):             # every pick agrees: the outputs compare as they are
                fp32.add(ref[row], out[row])
            elif k > 0:                      # (a row differing from its first pick shares nothing)
                fp32.add(ref[row] - row_sum(tables[k:], theirs[row, k:])[0],
                         out[row] - row_sum(tables[k:], mine[row, k:])[0])
    if tables is None:
        return [replace(fp32.score(), against=f"fp32 on the rows whose {pick}s all equal fp32's "
                                              f"(the {table} tables were not at hand)")]
    return [replace(fp32.score(), against=f"fp32 up to the first {pick} that differs from fp32's"),
            replace(own.score(), against=f"the sum of the {table} rows its own {pick}s select")]

"""Audio sections of report.html: the kept held-out clips, played and drawn against fp32.

Works from the WAVs under samples/ and the manifest's records of them, so `omni-export report`
redraws everything without rerunning a model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..artifacts.samples import read_wav
from ..parity.metrics import snr
from . import figures
from .view import BuildRow


@dataclass
class Clip:
    label: str
    path: str                 # relative to the output directory: the HTML links it
    seconds: float | None
    verdict: str = ""
    snr_db: float | None = None   # this clip only (the gate scores every held-out input)
    figure: str = ""
    error: str = ""


@dataclass
class AudioSection:
    component: str
    output: str
    rate: int
    heldout: str              # which held-out input the clips come from
    reference: Clip
    clips: list[Clip] = field(default_factory=list)


def sections(root: Path, m: dict, rows: list[BuildRow]) -> list[AudioSection]:
    out = []
    for comp, info in m["components"].items():
        for rec in info.get("samples") or []:
            out.append(_section(root, comp, info, rec, [r for r in rows if r.component == comp]))
    return out


def _section(root: Path, comp: str, info: dict, rec: dict, rows: list[BuildRow]) -> AudioSection:
    ref_clip = Clip("fp32 reference", rec["path"], rec.get("seconds"))
    ref = _load(root, rec, ref_clip)
    if ref is not None:
        ref_clip.figure = figures.reference_figure(ref, rec["sample_rate"])
    held = (f"held-out input #{rec['heldout_index'] + 1} of {info.get('heldout', {}).get('count', '?')} "
            f"({info.get('heldout', {}).get('source', 'source not recorded')})")
    sec = AudioSection(comp, rec["output"], rec["sample_rate"], held, ref_clip)
    for r in rows:
        kept = next((s for s in r.samples if s["output"] == rec["output"]), None)
        if kept is not None:
            sec.clips.append(_clip(root, r, kept, ref, rec["sample_rate"]))
    return sec


def _clip(root: Path, r: BuildRow, kept: dict, ref: np.ndarray | None, rate: int) -> Clip:
    clip = Clip(f"{r.format} {r.precision} · {r.runner}", kept["path"], kept.get("seconds"), r.verdict)
    out = _load(root, kept, clip)
    if out is None or ref is None:
        return clip
    if out.shape != ref.shape:
        clip.error = f"shape {out.shape} differs from the fp32 clip {ref.shape}"
        return clip
    clip.snr_db = snr(ref, out)
    clip.figure = figures.clip_figure(ref, out, rate, r.accepted)
    return clip


def _load(root: Path, rec: dict, clip: Clip) -> np.ndarray | None:
    path = Path(root) / rec["path"]
    try:
        _, data = read_wav(path)
    except (OSError, ValueError) as e:
        clip.error = f"{rec['path']}: {e}"
        return None
    return data[0]     # the first channel is drawn; every channel is played

"""The report's figures, drawn with matplotlib (Agg, no pyplot state) and inlined as base64 PNG.

Each function takes plain values and returns a `data:image/png;base64,...` URI. Drawing is most
of a report's cost (4.7 s of the demo Code2Wav's 6.9 s no-change rebuild), so each figure is kept
in the per-user cache keyed by sha256 over its arguments, this file's source and matplotlib's
version: a report whose scores did not change draws nothing (and does not import matplotlib).
OMNI_EXPORT_FIGURE_CACHE=off draws every figure.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts.scores import num

ACCEPTED, REJECTED, FP32, PSNR, GATE, ERROR = "#2e7d32", "#c62828", "#616161", "#1565c0", "#212121", "#ef6c00"
RC = {"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False,
      "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8, "legend.frameon": False}
SPECTRUM_RANGE_DB = 100.0


ENV_SWITCH = "OMNI_EXPORT_FIGURE_CACHE"
KEEP = 512            # figures kept in the cache (the least recently written go first)


def _memo_dir() -> Path | None:
    from ..artifacts.captures import cache_root, switched_off

    return None if switched_off(ENV_SWITCH) else cache_root() / "figures"


@functools.lru_cache(maxsize=1)
def _code_identity() -> bytes:
    from importlib import metadata

    try:
        mpl = metadata.version("matplotlib")
    except metadata.PackageNotFoundError:
        mpl = "?"
    return hashlib.sha256(Path(__file__).read_bytes() + mpl.encode()).digest()


def _feed(h, value) -> None:
    """Hash a figure argument: arrays by dtype, shape and bytes; anything else as canonical JSON."""
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"nd:{a.dtype.str}:{a.shape}:".encode())
        h.update(a.data)
    else:
        h.update(json.dumps(value, sort_keys=True, default=repr).encode())
    h.update(b"\0")


def memoized(draw):
    """Serve `draw(*args)` from the figure cache when the same arguments were drawn before."""
    @functools.wraps(draw)
    def wrapper(*args):
        root = _memo_dir()
        if root is None:
            return draw(*args)
        h = hashlib.sha256(_code_identity() + draw.__name__.encode())
        for a in args:
            _feed(h, a)
        path = root / (h.hexdigest() + ".uri")
        try:
            return path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            pass
        uri = draw(*args)
        _store(root, path, uri)
        return uri
    return wrapper


def _store(root: Path, path: Path, uri: str) -> None:
    """Atomic write; a cache that cannot be written (read-only home) only costs the redraw."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(uri, encoding="ascii")
        os.replace(tmp, path)
        kept = sorted(root.glob("*.uri"), key=lambda p: p.stat().st_mtime)
        for old in kept[:-KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _style():
    import matplotlib

    return matplotlib.rc_context(RC)


# ------------------------------------------------------------------------------------ SNR vs gate

@memoized
def snr_chart(bars: Sequence[dict]) -> str:
    """Horizontal bars of SNR per (build, output), PSNR as a marker, each bar's gate as a dashed tick.

    bars: {"label", "snr_db", "psnr_db", "finite", "threshold_db", "accepted", "note"} (dB may be
    words; "note" labels a bar with no finite SNR: "NaN/Inf" or "not scored")."""
    with _style():
        fig = _figure(9.0, 0.9 + 0.42 * len(bars))
        ax = fig.subplots()
        snr = [_finite_or(num(b["snr_db"]), b) for b in bars]
        cap = _cap([*snr, *(num(b["psnr_db"]) for b in bars), *(num(b["threshold_db"]) for b in bars)])
        y = np.arange(len(bars))[::-1]
        for yi, b, v in zip(y, bars, snr):
            _snr_bar(ax, yi, b, v, cap)
        ax.set_yticks(y, [b["label"] for b in bars])
        ax.set_xlim(0, cap * 1.12)
        ax.set_xlabel("dB against fp32 (SNR gates; PSNR for comparison with AI Hub)")
        ax.grid(axis="y", visible=False)
        _snr_legend(ax)
        return _uri(fig)


def _finite_or(v: float, b: dict) -> float:
    return math.nan if b.get("finite") is False else v


def _cap(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return max(finite + [10.0]) * 1.05


def _snr_bar(ax, y: float, b: dict, v: float, cap: float) -> None:
    color = ACCEPTED if b["accepted"] else REJECTED
    if math.isnan(v) or v == -math.inf:       # no SNR: broken, unscored, or an output gated otherwise (codes)
        ax.text(0.5, y, f"{b.get('note', 'NaN/Inf')}: {'accepted' if b['accepted'] else 'rejected'}", va="center",
                color=color, fontweight="bold")
    else:
        width = min(max(v, 0.0), cap)
        ax.barh(y, width, height=0.62, color=color, alpha=0.85)
        ax.text(width + cap * 0.01, y, "∞" if v == math.inf else f"{v:.1f}", va="center", fontsize=8)
    p = num(b["psnr_db"])
    if math.isfinite(p):
        ax.plot([min(p, cap)], [y], marker="D", color=PSNR, markersize=4, linestyle="none")
    t = num(b["threshold_db"])
    if math.isfinite(t):
        ax.plot([t, t], [y - 0.42, y + 0.42], color=GATE, linestyle="--", linewidth=1.4)


def _snr_legend(ax) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=ACCEPTED, label="SNR, accepted"), Patch(color=REJECTED, label="SNR, rejected"),
                       Line2D([], [], color=GATE, linestyle="--", label="gate (SNR)"),
                       Line2D([], [], color=PSNR, marker="D", linestyle="none", markersize=4, label="PSNR")],
              loc="lower right", ncols=4, bbox_to_anchor=(1.0, 1.0))


# ------------------------------------------------------------------------------------ attribution

@memoized
def attribution_chart(blocks: Sequence[str], series: dict[str, Sequence[float | None]],
                      gates: dict[str, float]) -> str:
    """Grouped bars: each block's SNR when lowered alone, one colour per precision; the build gate
    as a dotted line for scale (blocks are not gated: their losses add up along the chain)."""
    with _style():
        fig = _figure(9.0, 3.2)
        ax = fig.subplots()
        x = np.arange(len(blocks))
        width = 0.8 / max(1, len(series))
        colors = ["#5c6bc0", "#ef6c00", "#00897b", "#8e24aa"]
        for i, (prec, values) in enumerate(series.items()):
            vals = np.array([np.nan if v is None else v for v in values], dtype=float)
            c = colors[i % len(colors)]
            ax.bar(x + (i - (len(series) - 1) / 2) * width, np.nan_to_num(vals, nan=0.0), width,
                   color=c, label=f"{prec}: block alone")
            _mark_weakest(ax, x + (i - (len(series) - 1) / 2) * width, vals, c)
            if prec in gates:
                ax.axhline(gates[prec], color=c, linestyle=":", linewidth=1.2, label=f"{prec} gate (whole graph)")
        ax.set_xticks(x, blocks, rotation=30, ha="right")
        ax.set_ylabel("SNR dB vs fp32")
        ax.set_ylim(0, max([*(v for vs in series.values() for v in vs if v is not None), *gates.values(), 10]) * 1.12)
        ax.legend(loc="lower right", ncols=2 * len(series), bbox_to_anchor=(1.0, 1.0))
        return _uri(fig)


def _mark_weakest(ax, xs, vals, color) -> None:
    if np.isnan(vals).all():
        return
    i = int(np.nanargmin(vals))
    ax.annotate(f"weakest\n{vals[i]:.1f}", (xs[i], vals[i]), textcoords="offset points", xytext=(0, 3),
                ha="center", va="bottom", fontsize=7, color=color, fontweight="bold",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})


# -------------------------------------------------------------------------------------------- audio

@memoized
def reference_figure(ref: np.ndarray, rate: int) -> str:
    """The fp32 clip: waveform and spectrogram side by side."""
    with _style():
        fig = _figure(6.2, 2.2)
        ax_w, ax_s = fig.subplots(1, 2)
        t = np.arange(ref.size) / rate
        ax_w.plot(t, ref, color=FP32, linewidth=0.6)
        ax_w.set_xlim(0, t[-1] if t.size else 1)
        ax_w.set_title("waveform", loc="left")
        ax_w.set_xlabel("s")
        _spectrogram(ax_s, ref, rate, _spectrum_peak(ref, rate), "spectrogram")
        return _uri(fig)


@memoized
def clip_figure(ref: np.ndarray, out: np.ndarray, rate: int, accepted: bool) -> str:
    """One build against fp32: the whole clip overlaid with the error, a zoom where the error is
    largest, and the spectrograms of the build and of the error (build - fp32), both on the fp32
    spectrogram's colour scale."""
    with _style():
        fig = _figure(6.2, 4.2)
        ax = fig.subplot_mosaic([["wave", "zoom"], ["spec", "err"]])
        safe = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
        color = ACCEPTED if accepted else REJECTED
        _overlay(ax["wave"], ref, safe, rate, slice(0, ref.size), color, "whole clip")
        _overlay(ax["zoom"], ref, safe, rate, _zoom_window(ref, safe, rate), color, "zoom: largest error")
        ax["zoom"].legend(loc="lower right", ncols=3, bbox_to_anchor=(1.0, 1.08))
        vmax = _spectrum_peak(ref, rate)
        _spectrogram(ax["spec"], safe, rate, vmax, "build")
        _spectrogram(ax["err"], safe - ref, rate, vmax, "error (build − fp32)")
        return _uri(fig)


ZOOM_SECONDS = 0.01


def _zoom_window(ref: np.ndarray, out: np.ndarray, rate: int) -> slice:
    half = max(8, int(ZOOM_SECONDS * rate) // 2)
    centre = int(np.argmax(np.abs(out - ref))) if ref.size else 0
    start = min(max(0, centre - half), max(0, ref.size - 2 * half))
    return slice(start, min(ref.size, start + 2 * half))


def _overlay(ax, ref: np.ndarray, out: np.ndarray, rate: int, window: slice, color: str, title: str) -> None:
    t = np.arange(ref.size)[window] / rate
    ax.plot(t, ref[window], color=FP32, linewidth=1.5, alpha=0.6, label="fp32")
    ax.plot(t, out[window], color=color, linewidth=0.7, label="build")
    ax.plot(t, (out - ref)[window], color=ERROR, linewidth=0.7, label="error")
    if t.size:
        ax.set_xlim(t[0], t[-1])
    ax.set_title(title, loc="left")


def _nfft(n: int) -> int:
    return int(min(512, max(16, 2 ** int(math.log2(max(n // 8, 16))))))


def _spectrum_peak(x: np.ndarray, rate: int) -> float:
    from matplotlib import mlab

    n = _nfft(x.size)
    spec, _, _ = mlab.specgram(x, NFFT=n, Fs=rate, noverlap=n * 3 // 4)
    return 10 * math.log10(max(float(spec.max()), 1e-20))


def _spectrogram(ax, x: np.ndarray, rate: int, vmax: float, title: str) -> None:
    n = _nfft(x.size)
    with np.errstate(divide="ignore"):     # silent bins (a zeroed build) are -inf dB: drawn as the floor
        ax.specgram(x, NFFT=n, Fs=rate, noverlap=n * 3 // 4, cmap="magma", vmin=vmax - SPECTRUM_RANGE_DB,
                    vmax=vmax)
    ax.set_ylabel("Hz")
    ax.set_title(title, loc="left")
    ax.grid(False)

"""Host side of the HiFT vocoder: the NSF source excitation and the iSTFT, in float64 numpy, around the
`hift_f0` and `hift` graphs (hift.py). Graphs are called by name, as everywhere in this recipe.

Source excitation (SourceModuleHnNSF2 / SineGen2 at 24 kHz, upstream hifigan_components/layers.py), for
f0 [M] frames at 50 Hz and U = 480 samples per frame:
  harmonic k = 1..K+1: cycles per sample r_k[i] = (k f0[i] / sr) mod 1 (upstream computes these per
  sample on the nearest-upsampled f0, adds a random initial phase at sample 0 and linearly downsamples
  by U, which lands mid-frame: the random phase never survives, so none is drawn here);
  phase_k = 2 pi * linear-upsample(U * cumsum_i r_k[i]) (align_corners False, edges clamped) -- a
  running sum that reaches thousands of radians, kept in float64 and reduced mod 2 pi before sin;
  voiced uv = f0 > 10 Hz per sample; sine = 0.1 sin(phase) uv + noise (std 0.003 voiced, 0.1/3 unvoiced);
  source = tanh(l_linear(sine)). The noise is drawn by the host from a seeded generator (upstream
  draws torch.randn_like on every call), so parity runs are deterministic.

iSTFT (HiFTGenerator._istft + torch.istft, centred, periodic hann): X = mag e^{i phase}, mag clipped at
1e2; frames = irfft(X, n_fft) * window, overlap-added at hop, divided by the overlap-added squared
window, n_fft/2 trimmed at each end -> hop * (frames - 1) samples; then clamped to +-0.99.
"""
from __future__ import annotations

import numpy as np

from .hift import HiFTConfig


def upsampled_cycles(f0: np.ndarray, cfg: HiFTConfig) -> np.ndarray:
    """[M * U, K + 1] float64 running phase in cycles (not reduced)."""
    u = cfg.upsample
    k = np.arange(1, cfg.nb_harmonics + 2, dtype=np.float64)
    rad = np.mod(np.asarray(f0, np.float64)[:, None] * k / cfg.sampling_rate, 1.0)      # [M, K+1]
    cyc = np.cumsum(rad, axis=0) * u
    m = len(f0)
    src = np.maximum((np.arange(m * u, dtype=np.float64) + 0.5) / u - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), m - 1)
    i1 = np.minimum(i0 + 1, m - 1)
    lam = (src - i0)[:, None]
    return (1.0 - lam) * cyc[i0] + lam * cyc[i1]


def excitation(f0: np.ndarray, weight: np.ndarray, bias: np.ndarray, noise: np.ndarray, cfg: HiFTConfig) -> np.ndarray:
    """f0 [M] (Hz), l_linear weight [1, K+1] / bias [1], noise [M*U, K+1] standard normal -> source [M*U]."""
    cycles = upsampled_cycles(f0, cfg)
    sines = cfg.nsf_alpha * np.sin(2.0 * np.pi * np.mod(cycles, 1.0))
    uv = (np.repeat(np.asarray(f0, np.float64), cfg.upsample) > cfg.voiced_threshold)[:, None].astype(np.float64)
    amp = uv * cfg.nsf_sigma + (1.0 - uv) * cfg.nsf_alpha / 3.0
    wave = sines * uv + amp * noise
    return np.tanh(wave @ np.asarray(weight, np.float64).T + np.asarray(bias, np.float64))[:, 0]


def pad_source(source: np.ndarray, cfg: HiFTConfig) -> np.ndarray:
    """[M*U] -> [1, 1, M*U + n_fft]: reflect-padded by n_fft/2 (torch.stft center=True), float32."""
    h = cfg.n_fft // 2
    return np.pad(np.asarray(source, np.float64), (h, h), mode="reflect")[None, None].astype(np.float32)


def noise(frames: int, cfg: HiFTConfig, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((frames * cfg.upsample, cfg.nb_harmonics + 1))


def window(n_fft: int) -> np.ndarray:
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n_fft) / n_fft)


def istft(magnitude: np.ndarray, phase: np.ndarray, cfg: HiFTConfig) -> np.ndarray:
    """magnitude, phase [bins, F] -> waveform [hop * (F - 1)] float64 (before the clamp)."""
    n, hop = cfg.n_fft, cfg.hop
    mag = np.minimum(np.asarray(magnitude, np.float64), 1e2)
    ph = np.asarray(phase, np.float64)
    frames = np.fft.irfft((mag * np.cos(ph) + 1j * mag * np.sin(ph)).T, n=n, axis=-1) * window(n)   # [F, n]
    count = frames.shape[0]
    total = n + hop * (count - 1)
    y = np.zeros(total)
    env = np.zeros(total)
    w2 = window(n) ** 2
    idx = np.arange(count)[:, None] * hop + np.arange(n)[None]
    np.add.at(y, idx.ravel(), frames.ravel())
    np.add.at(env, idx.ravel(), np.broadcast_to(w2, frames.shape).ravel())
    h = n // 2
    y, env = y[h:total - h], env[h:total - h]
    return y / np.where(env > 1e-11, env, 1.0)


def waveform(graphs, mel: np.ndarray, weight: np.ndarray, bias: np.ndarray, cfg: HiFTConfig, seed: int,
             frames: int | None = None, f0_graphs=None) -> np.ndarray:
    """mel [1, 80, M] -> float32 waveform [frames * U] through hift_f0, the host source, hift and the iSTFT.
    `frames` (default M) real frames are kept; the rest of the window is padding. `f0_graphs` runs hift_f0
    instead of `graphs` (parity: the fp32 f0 in front of a build's hift isolates hift's own error)."""
    m = mel.shape[-1]
    f0 = (f0_graphs or graphs)("hift_f0", {"mel": mel.astype(np.float32)})["f0"][0]
    source = excitation(f0, weight, bias, noise(m, cfg, seed), cfg)
    out = graphs("hift", {"mel": mel.astype(np.float32), "source": pad_source(source, cfg)})
    wav = istft(out["magnitude"][0], out["phase"][0], cfg)
    n = (frames if frames is not None else m) * cfg.upsample
    return np.clip(wav[:n], -cfg.audio_limit, cfg.audio_limit).astype(np.float32)


def spectral_snr(refs, outs, n_fft: int = 512, hop: int = 128) -> float:
    """SNR in dB of the STFT magnitudes (hann, n_fft / hop) of waveforms against references: blind to the
    phase drift an NSF source's f0 integral builds up from sub-Hz f0 differences."""
    def mag(x):
        x = np.asarray(x, np.float64)
        if len(x) < n_fft:
            x = np.pad(x, (0, n_fft - len(x)))
        idx = np.arange(0, len(x) - n_fft + 1, hop)[:, None] + np.arange(n_fft)[None]
        return np.abs(np.fft.rfft(x[idx] * window(n_fft), axis=-1))
    sig = err = 0.0
    for r, o in zip(refs, outs):
        a, b = mag(r), mag(o)
        sig += float(np.sum(a ** 2))
        err += float(np.sum((a - b) ** 2))
    return float("inf") if err == 0 else 10.0 * float(np.log10(sig / err))

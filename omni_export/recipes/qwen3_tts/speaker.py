"""Base checkpoints' speaker encoder: log-mel on the host (numpy), ECAPA-TDNN as a graph.

Log-mel as upstream's `mel_spectrogram` (24 kHz, n_fft 1024, hop 256, win 1024, 128 Slaney mels
0-12 kHz): reflect-pad 384 samples each side, periodic Hann, |STFT| with +1e-9 under the root,
mel projection, log(clamp(., 1e-5)). The graph takes a static window of F log-mel frames
(--speaker-frames, the longest reference; default 938, 10 s) and the valid length L: its x-vector is
upstream's over the L frames exactly, for any L from the encoder's largest reflect pad + 1 (5 frames,
53 ms, at upstream's geometry) to F. A reference outside that range is an error, never cropped or
tiled.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import SpeakerEncoderConfig

N_FFT, HOP, WIN, FMIN, FMAX = 1024, 256, 1024, 0.0, 12000.0


def _hz_to_mel(f):
    """Slaney mel scale (librosa's default, htk=False)."""
    f = np.asarray(f, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = f / f_sp
    min_log_hz = 1000.0
    logstep = np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sr: int = 24000, n_fft: int = N_FFT, n_mels: int = 128, fmin: float = FMIN,
                   fmax: float = FMAX) -> np.ndarray:
    """[n_mels, n_fft/2 + 1] triangular filters, Slaney area-normalised (librosa.filters.mel defaults)."""
    fft_freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]
    return weights.astype(np.float32)


def log_mel(wav: np.ndarray, sr: int = 24000, n_mels: int = 128) -> np.ndarray:
    """wav [samples] at 24 kHz -> log-mel [frames, n_mels] (float32)."""
    y = torch.from_numpy(np.asarray(wav, dtype=np.float32))[None, None]
    pad = (N_FFT - HOP) // 2
    y = F.pad(y, (pad, pad), mode="reflect")[0]
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WIN, window=torch.hann_window(WIN), center=False,
                      normalized=False, onesided=True, return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(torch.from_numpy(mel_filterbank(sr, N_FFT, n_mels)), mag)
    return torch.log(torch.clamp(mel, min=1e-5))[0].T.numpy()


def mel_frames(samples: int) -> int:
    """Log-mel frames of `samples` samples (`log_mel`: reflect pad (N_FFT - HOP) / 2 each side, no
    centring); 0 when the reflect pad does not fit (fewer than 385 samples)."""
    pad = (N_FFT - HOP) // 2
    return (samples + 2 * pad - N_FFT) // HOP + 1 if samples > pad else 0


def shortest(c: SpeakerEncoderConfig) -> int:
    """The fewest log-mel frames the encoder takes: its largest reflect pad + 1 (upstream's
    padding_mode='reflect' needs pad < length; one frame less is an error there too)."""
    return max(d * (k - 1) // 2 for k, d in zip(c.enc_kernel_sizes, c.enc_dilations)) + 1


def check_reference(samples: int, most: int, least: int, sr: int = 24000, what: str = "the reference audio",
                    hint: str = "") -> int:
    """The reference's log-mel frames, or a one-line UsageError when the graph cannot take them
    (more than `most` = --speaker-frames, or fewer than `least`). Never cropped nor tiled."""
    from ...core import UsageError

    n = mel_frames(samples)
    secs = f"{samples / sr:.2f} s ({n} log-mel frames)"
    if n > most:
        raise UsageError(f"{what} is {secs}; the speaker encoder takes at most {most} frames "
                         f"({most * HOP / sr:.2f} s, --speaker-frames): trim it{', or ' + hint if hint else ''}")
    if n < least:
        raise UsageError(f"{what} is {secs}; the speaker encoder needs at least {least} frames "
                         f"({least * HOP / sr:.2f} s: its largest reflect pad is {least - 1} frames)")
    return n


def window(mel: np.ndarray, frames: int) -> dict:
    """The graph's inputs for a log-mel [L, 128]: zero-padded to `frames`, and L."""
    x = np.zeros((1, frames, mel.shape[1]), np.float32)
    x[0, :len(mel)] = mel
    return {"mel": x, "length": np.array([len(mel)], np.int32)}


class ReflectConv(nn.Module):
    """Conv1d with padding='same', padding_mode='reflect' (odd kernels), the reflection taken around
    the last valid frame: the padded input is a gather whose indices (`SpeakerEncoder._reflect`)
    come from the valid length."""

    def __init__(self, cin: int, cout: int, k: int, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, dilation=dilation)
        self.pad = dilation * (k - 1) // 2

    def forward(self, x, reflect: dict):
        return self.conv(torch.index_select(x, 2, reflect[self.pad]) if self.pad else x)


class TDNN(nn.Module):
    def __init__(self, cin, cout, k, d=1):
        super().__init__()
        self.conv = ReflectConv(cin, cout, k, d)

    def forward(self, x, reflect: dict):
        return F.relu(self.conv(x, reflect))


class SERes2Net(nn.Module):
    def __init__(self, ch: int, scale: int, se: int, k: int, d: int):
        super().__init__()
        self.tdnn1 = TDNN(ch, ch, 1)
        self.res = nn.ModuleList(TDNN(ch // scale, ch // scale, k, d) for _ in range(scale - 1))
        self.tdnn2 = TDNN(ch, ch, 1)
        self.se1 = nn.Conv1d(ch, se, 1)
        self.se2 = nn.Conv1d(se, ch, 1)
        self.scale = scale

    def forward(self, x, reflect: dict, mean_weights):
        h = self.tdnn1(x, reflect)
        parts = torch.chunk(h, self.scale, dim=1)
        outs, y = [parts[0]], None
        for i in range(1, self.scale):
            y = self.res[i - 1](parts[i] if i == 1 else parts[i] + y, reflect)
            outs.append(y)
        h = self.tdnn2(torch.cat(outs, dim=1), reflect)
        mean = (h * mean_weights).sum(dim=2, keepdim=True)          # over the L valid frames
        s = torch.sigmoid(self.se2(F.relu(self.se1(mean))))
        return h * s + x


class SpeakerEncoder(nn.Module):
    """log-mel [1, F, mel_dim] (valid frames 0..L-1, the rest ignored) and L [1] -> speaker
    embedding [1, enc_dim]: upstream's x-vector of the L frames, for any L in [shortest, F].

    Frames past L hold garbage after the first layer, but no valid frame reads them: every
    reflect-padded conv gathers from valid frames only (t < 0 -> -t, t >= L -> 2(L-1) - t, and
    positions past 2(L-1) -> 0: those feed garbage frames alone), and every mean, standard
    deviation and softmax over time is weighted by the valid frames. The softmax is masked without
    a large constant (which would stretch a quantized tensor's range, or overflow fp16): invalid
    frames take frame 0's score for the maximum, and their exponentials are multiplied by 0."""

    def __init__(self, c: SpeakerEncoderConfig, tensors: dict, frames: int):
        super().__init__()
        ch, ks, ds = c.enc_channels, c.enc_kernel_sizes, c.enc_dilations
        self.first = TDNN(c.mel_dim, ch[0], ks[0], ds[0])
        self.blocks = nn.ModuleList(SERes2Net(ch[i], c.enc_res2net_scale, c.enc_se_channels, ks[i], ds[i])
                                    for i in range(1, len(ch) - 1))
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], ds[-1])
        self.asp_tdnn = TDNN(ch[-1] * 3, c.enc_attention_channels, 1)
        self.asp_conv = nn.Conv1d(c.enc_attention_channels, ch[-1], 1)
        self.fc = nn.Conv1d(ch[-1] * 2, c.enc_dim, 1)
        self.load_state_dict({k: tensors[v] for k, v in _official_names(self).items()}, strict=True)
        self.pads = sorted({m.pad for m in self.modules() if isinstance(m, ReflectConv) and m.pad})
        self.register_buffer("t", torch.arange(frames, dtype=torch.int32), persistent=False)
        for p in self.pads:       # padded positions -p .. F-1+p, and their distance from 0
            tp = torch.arange(-p, frames + p, dtype=torch.int32)
            self.register_buffer(f"tp{p}", tp, persistent=False)
            self.register_buffer(f"abs{p}", tp.abs(), persistent=False)

    def _reflect(self, length) -> dict:
        """{pad: gather indices [F + 2 pad]} reflecting around frame L-1 (int32 arithmetic)."""
        out = {}
        for p in self.pads:
            tp = getattr(self, f"tp{p}")
            back = length * 2 - 2 - tp
            idx = torch.where(tp < length, getattr(self, f"abs{p}"), torch.clamp(back, min=0))
            out[p] = idx.long()
        return out

    @staticmethod
    def _stats(x, w):
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(min=1e-12))
        return mean, std

    def forward(self, mel, length):
        reflect = self._reflect(length)
        valid = (self.t < length)[None, None]                           # [1, 1, F]
        mean_weights = valid.to(mel.dtype) / length.to(mel.dtype)
        x = self.first(mel.transpose(1, 2), reflect)
        outs = []
        for b in self.blocks:
            x = b(x, reflect, mean_weights)
            outs.append(x)
        h = self.mfa(torch.cat(outs, dim=1), reflect)
        t = h.shape[2]
        mean, std = self._stats(h, mean_weights)
        att = torch.cat([h, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], dim=1)
        score = self.asp_conv(torch.tanh(self.asp_tdnn(att, reflect)))
        score = torch.where(valid, score, score[:, :, :1])
        e = torch.exp(score - score.amax(dim=2, keepdim=True)) * valid.to(score.dtype)
        mean, std = self._stats(h, e / e.sum(dim=2, keepdim=True))
        return self.fc(torch.cat([mean, std], dim=1)[..., None])[..., 0]


def _official_names(m: SpeakerEncoder) -> dict[str, str]:
    """Our parameter names -> upstream's `speaker_encoder.*` names."""
    names = {}
    for name, _ in m.named_parameters():
        off = name.replace(".conv.conv.", ".conv.")               # TDNN -> ReflectConv -> Conv1d
        head, _, rest = off.partition(".")
        if head == "first":
            off = "blocks.0." + rest
        elif head == "blocks":
            i, _, rest = rest.partition(".")
            rest = rest.replace("res.", "res2net_block.blocks.", 1).replace("se1.", "se_block.conv1.", 1) \
                       .replace("se2.", "se_block.conv2.", 1)
            off = f"blocks.{int(i) + 1}.{rest}"
        elif head in ("asp_tdnn", "asp_conv"):
            off = "asp." + head[4:] + "." + rest
        names[name] = "speaker_encoder." + off
    return names

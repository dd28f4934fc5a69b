"""token2wav's HiFT vocoder (CosyVoice2's HiFTGenerator as token2wav instantiates it: NSF source + iSTFTNet):
checkpoint tensors, loading, seeded writer, and the two graphs.

Upstream (PyPI stepaudio2-minicpmo 0.1.1: flashcosyvoice/modules/hifigan.py, hifigan_components/layers.py;
token2wav.py builds `HiFTGenerator()` with its defaults and loads hift.pt with "generator." stripped):
  f0_predictor  ConvRNNF0Predictor: 5 x (weight-normed conv3 80|C -> C, ELU), Linear C -> 1, abs -> f0 [1, M]
  m_source      SourceModuleHnNSF2 (sampling rate 24 kHz): f0 nearest-upsampled x480; 9 harmonics; per-frame
                phase increments, cumsum over frames, linear upsampling; sin * 0.1 where voiced (f0 > 10 Hz),
                Gaussian noise (std 0.003 voiced, 0.1/3 unvoiced); Linear 9 -> 1, tanh -> source [1, 1, 480 M]
  decode        STFT of the source (n_fft 16, hop 4, hann, centred) -> 18 channels; conv_pre (k7) ->
                3 x [leaky_relu 0.1, weight-normed ConvTranspose (8/16, 5/11, 3/7), reflection pad (1, 0)
                after the last, + source_resblock(source_down(stft)), mean of 3 ResBlocks (k 3/7/11,
                dilations 1/3/5, Snake)]; leaky_relu 0.01, conv_post (k7) -> 18 channels:
                magnitude = exp(first 9) (clipped at 1e2 by _istft), phase = sin(last 9); iSTFT; clamp 0.99.

Graph split (NPUs have neither float64 nor iSTFT; the phase integral of the sine source needs float64):
  `hift_f0`  mel [1, 80, M] -> f0 [1, M]                                                   (graph)
  host       f0 -> source excitation: float64 phase integral, seeded noise, Linear + tanh   (vocoder.py)
  `hift`     mel + reflect-padded source -> magnitude, phase [1, 9, 120 M + 1]               (graph)
  host       iSTFT in float64, clamp -> 24 kHz waveform                                       (vocoder.py)
The source's STFT is a fixed Conv1d in `hift` (the NPU's strength); exp is taken of min(x, ln 100),
which equals upstream's clip(exp(x), max=1e2) and cannot overflow fp16.

Official tensor names: HiFTGenerator.state_dict() (328 tensors). Weight norm is stored either as
torch's parametrisation (`X.parametrizations.weight.original0/1`) or the older `X.weight_g/weight_v`
(same shapes); a "generator." prefix (CosyVoice training checkpoints) is accepted. Folded at load:
W = g v / ||v|| (norm over all but dim 0). hift.pt is a pickle and is refused; read hift.safetensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...blocks import Block, BlockChain
from ...core import UsageError
from ...weights import TensorDecl, load_tensors, read_header

WN = ".parametrizations.weight."
LOG_MAG_MAX = math.log(1e2)          # HiFTGenerator._istft clips the magnitude at 1e2
SNAKE_EPS = 1e-9


@dataclass(frozen=True)
class HiFTConfig:
    """HiFTGenerator's defaults (token2wav passes none); channel counts are read from the tensors."""
    in_channels: int = 80
    base_channels: int = 512
    cond_channels: int = 512                      # ConvRNNF0Predictor
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    voiced_threshold: float = 10.0
    upsample_rates: tuple = (8, 5, 3)
    upsample_kernel_sizes: tuple = (16, 11, 7)
    n_fft: int = 16
    hop: int = 4
    resblock_kernel_sizes: tuple = (3, 7, 11)
    resblock_dilations: tuple = (1, 3, 5)
    source_resblock_kernel_sizes: tuple = (7, 7, 11)
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99

    @property
    def upsample(self) -> int:
        """Waveform samples per mel frame (480 at 24 kHz / 50 Hz)."""
        return math.prod(self.upsample_rates) * self.hop

    @property
    def bins(self) -> int:
        return self.n_fft // 2 + 1

    def channels(self, i: int) -> int:
        return self.base_channels // 2 ** (i + 1)

    def to_json(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


TINY_HIFT = HiFTConfig(base_channels=32, cond_channels=16)
REAL_HIFT = HiFTConfig()


def _wn(t: dict, name: str, shape: tuple, g=("uniform", 0.6, 1.2), transposed: bool = False) -> None:
    """A weight-normed conv: g [dim0, 1, 1], v (the direction), bias [out]."""
    t[name + WN + "original0"] = TensorDecl((shape[0], 1, 1), g)
    t[name + WN + "original1"] = TensorDecl(shape, ("normal", 0.05))
    t[name + ".bias"] = TensorDecl((shape[1] if transposed else shape[0],), ("normal", 0.02))


def _resblock(t: dict, name: str, ch: int, k: int, dilations: tuple) -> None:
    for j in range(len(dilations)):
        for conv in ("convs1", "convs2"):
            _wn(t, f"{name}.{conv}.{j}", (ch, ch, k), g=("uniform", 0.3, 0.7))
        for act in ("activations1", "activations2"):
            t[f"{name}.{act}.{j}.alpha"] = TensorDecl((ch,), ("uniform", 0.5, 1.5))


def hift_tensors(c: HiFTConfig) -> dict[str, TensorDecl]:
    """Canonical names (torch's parametrisation) and shapes of HiFTGenerator.state_dict()."""
    t: dict[str, TensorDecl] = {}
    cc, n2 = c.cond_channels, c.n_fft + 2
    for i in range(5):
        _wn(t, f"f0_predictor.condnet.{2 * i}", (cc, c.in_channels if i == 0 else cc, 3), g=("uniform", 0.8, 1.2))
    t["f0_predictor.classifier.weight"] = TensorDecl((1, cc), ("normal", 120.0 / math.sqrt(cc)))
    t["f0_predictor.classifier.bias"] = TensorDecl((1,), ("uniform", 40.0, 80.0))
    t["m_source.l_linear.weight"] = TensorDecl((1, c.nb_harmonics + 1), ("normal", 0.5))
    t["m_source.l_linear.bias"] = TensorDecl((1,), ("normal", 0.02))
    _wn(t, "conv_pre", (c.base_channels, c.in_channels, 7))
    for i, k in enumerate(c.upsample_kernel_sizes):
        _wn(t, f"ups.{i}", (c.base_channels // 2 ** i, c.channels(i), k), transposed=True)
    cum = _down_rates(c)
    for i, (u, k) in enumerate(zip(cum, c.source_resblock_kernel_sizes)):
        ks = 1 if u == 1 else 2 * u
        t[f"source_downs.{i}.weight"] = TensorDecl((c.channels(i), n2, ks), ("normal", 1.0 / math.sqrt(n2 * ks)))
        t[f"source_downs.{i}.bias"] = TensorDecl((c.channels(i),), ("normal", 0.02))
        _resblock(t, f"source_resblocks.{i}", c.channels(i), k, c.resblock_dilations)
    for i in range(len(c.upsample_rates)):
        for j, k in enumerate(c.resblock_kernel_sizes):
            _resblock(t, f"resblocks.{i * len(c.resblock_kernel_sizes) + j}", c.channels(i), k, c.resblock_dilations)
    _wn(t, "conv_post", (n2, c.channels(len(c.upsample_rates) - 1), 7), g=("uniform", 0.5, 1.0))
    return t


def _down_rates(c: HiFTConfig) -> list[int]:
    """source_downs strides, from the first upsampling stage to the last ([15, 3, 1] by default)."""
    rates = [1, *c.upsample_rates[::-1][:-1]]
    return [int(x) for x in reversed([math.prod(rates[:i + 1]) for i in range(len(rates))])]


# ------------------------------------------------------------------------------------- loading

def hift_path(directory: Path) -> Path | None:
    """hift.safetensors in the token2wav directory; a hift.pt alone is refused (a pickle)."""
    from .token2wav import asset_path

    return asset_path(directory, "hift")


def _layout(header: dict, path: Path) -> tuple[str, str]:
    """(prefix, weight-norm style) of the file: prefix "" or "generator."; style "param" or "gv"."""
    for prefix in ("", "generator."):
        if prefix + "conv_pre" + WN + "original1" in header:
            return prefix, "param"
        if prefix + "conv_pre.weight_v" in header:
            return prefix, "gv"
    raise UsageError(f"{path}: no 'conv_pre' weight-norm tensors (parametrizations.weight.original1 or weight_v); "
                     f"is this token2wav's HiFT vocoder (CosyVoice2 HiFTGenerator)?")


def read_hift_config(path: Path) -> HiFTConfig:
    header = read_header(path)
    prefix, style = _layout(header, path)
    v = (lambda n: prefix + n + (WN + "original1" if style == "param" else ".weight_v"))    # noqa: E731

    def shape(name: str) -> list[int]:
        entry = header.get(name)
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: tensor '{name}' is missing; is this token2wav's HiFT vocoder?")
        return entry["shape"]

    base, mels, _ = shape(v("conv_pre"))
    cond = shape(v("f0_predictor.condnet.0"))[0]
    harmonics = shape(prefix + "m_source.l_linear.weight")[1] - 1
    n_fft = shape(v("conv_post"))[0] - 2
    c = HiFTConfig(in_channels=mels, base_channels=base, cond_channels=cond, nb_harmonics=harmonics, n_fft=n_fft)
    if n_fft != REAL_HIFT.n_fft or base % 8 or harmonics < 0:
        raise UsageError(f"{path}: conv_post has {n_fft + 2} channels (n_fft {n_fft}) and conv_pre {base}; "
                         f"token2wav's HiFT has n_fft 16 and a base width divisible by 8")
    return c


def load_hift(path: Path) -> tuple[HiFTConfig, dict]:
    """(config, tensors by canonical name with weight norm folded: 'X.weight')."""
    cfg = read_hift_config(path)
    prefix, style = _layout(read_header(path), path)
    table = hift_tensors(cfg)
    stored = {prefix + _stored_name(n, style): d for n, d in table.items()}
    raw = load_tensors(path, stored)
    t = {n: raw[prefix + _stored_name(n, style)] for n in table}
    out = {}
    for name, w in t.items():
        if name.endswith(WN + "original1"):
            base = name[: -len(WN + "original1")]
            g = t[base + WN + "original0"]
            norm = w.flatten(1).norm(dim=1).reshape(-1, *([1] * (w.dim() - 1)))
            if bool((norm == 0).any()):
                raise UsageError(f"{path}: '{base}' has an all-zero weight-norm direction; the file is corrupt")
            out[base + ".weight"] = g * w / norm
        elif not name.endswith(WN + "original0"):
            out[name] = w
    return cfg, out


def _stored_name(name: str, style: str) -> str:
    if style == "gv" and WN in name:
        return name.replace(WN + "original0", ".weight_g").replace(WN + "original1", ".weight_v")
    return name


def write_hift(directory: Path, cfg: HiFTConfig = TINY_HIFT, seed: int = 0, style: str = "param",
               prefix: str = "") -> Path:
    """A seeded hift.safetensors in the official layout (torch's parametrisation names by default)."""
    from ...weights import seeded_tensors, write_safetensors

    directory.mkdir(parents=True, exist_ok=True)
    t = seeded_tensors(hift_tensors(cfg), seed)
    write_safetensors(directory / "hift.safetensors", {prefix + _stored_name(n, style): a for n, a in t.items()})
    return directory


# -------------------------------------------------------------------------------------- graphs

def _conv(t: dict, name: str, stride: int = 1, padding: int = 0, dilation: int = 1, transposed: bool = False):
    w = t[name + ".weight"]
    cls = nn.ConvTranspose1d if transposed else nn.Conv1d
    cin, cout = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
    with torch.device("meta"):
        conv = cls(cin, cout, w.shape[2], stride=stride, padding=padding, dilation=dilation)
    conv.load_state_dict({"weight": w, "bias": t[name + ".bias"]}, assign=True)
    return conv.requires_grad_(False)


class Snake(nn.Module):
    """x + 1/(alpha + 1e-9) * sin(alpha x) ** 2 (the reciprocal folded at load)."""

    def __init__(self, alpha: torch.Tensor):
        super().__init__()
        self.register_buffer("alpha", alpha[None, :, None].clone())
        self.register_buffer("inv", 1.0 / (alpha[None, :, None] + SNAKE_EPS))

    def forward(self, x):
        return x + self.inv * torch.pow(torch.sin(x * self.alpha), 2)


class ResBlock(nn.Module):
    def __init__(self, t: dict, name: str, k: int, dilations: tuple):
        super().__init__()
        self.c1 = nn.ModuleList(_conv(t, f"{name}.convs1.{j}", padding=d * (k - 1) // 2, dilation=d)
                                for j, d in enumerate(dilations))
        self.c2 = nn.ModuleList(_conv(t, f"{name}.convs2.{j}", padding=(k - 1) // 2) for j in range(len(dilations)))
        self.a1 = nn.ModuleList(Snake(t[f"{name}.activations1.{j}.alpha"]) for j in range(len(dilations)))
        self.a2 = nn.ModuleList(Snake(t[f"{name}.activations2.{j}.alpha"]) for j in range(len(dilations)))

    def forward(self, x):
        for c1, c2, a1, a2 in zip(self.c1, self.c2, self.a1, self.a2):
            x = x + c2(a2(c1(a1(x))))
        return x


class F0Predictor(Block):
    def __init__(self, t: dict):
        super().__init__()
        self.convs = nn.ModuleList(_conv(t, f"f0_predictor.condnet.{2 * i}", padding=1) for i in range(5))
        w, b = t["f0_predictor.classifier.weight"], t["f0_predictor.classifier.bias"]
        with torch.device("meta"):
            self.classifier = nn.Linear(w.shape[1], 1)
        self.classifier.load_state_dict({"weight": w, "bias": b}, assign=True)
        self.classifier.requires_grad_(False)

    def forward(self, mel):
        x = mel
        for conv in self.convs:
            x = F.elu(conv(x))
        return torch.abs(self.classifier(x.transpose(1, 2))[..., 0])          # [1, M]


def stft_basis(n_fft: int) -> torch.Tensor:
    """Conv1d weight [n_fft + 2, 1, n_fft]: rows of hann * cos (real), then -hann * sin (imaginary),
    as torch.stft(onesided, periodic hann window) computes them."""
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
    win = 0.5 - 0.5 * torch.cos(2 * math.pi * n / n_fft)
    ang = 2 * math.pi * k * n / n_fft
    return torch.cat([win * torch.cos(ang), -win * torch.sin(ang)])[:, None].float()


class SourceSTFT(Block):
    def __init__(self, c: HiFTConfig):
        super().__init__()
        self.register_buffer("basis", stft_basis(c.n_fft))
        self.hop = c.hop

    def forward(self, source):
        return F.conv1d(source, self.basis, stride=self.hop)                   # [1, n_fft + 2, 120 M + 1]


class ConvPre(Block):
    def __init__(self, t: dict):
        super().__init__()
        self.conv = _conv(t, "conv_pre", padding=3)

    def forward(self, mel):
        return self.conv(mel)


class UpStage(Block):
    """leaky_relu, transposed conv, (last stage: reflection pad (1, 0)), + the source branch, mean of ResBlocks."""

    def __init__(self, c: HiFTConfig, t: dict, i: int):
        super().__init__()
        u, k = c.upsample_rates[i], c.upsample_kernel_sizes[i]
        self.slope, self.last = c.lrelu_slope, i == len(c.upsample_rates) - 1
        self.up = _conv(t, f"ups.{i}", stride=u, padding=(k - u) // 2, transposed=True)
        r = _down_rates(c)[i]
        self.down = _conv(t, f"source_downs.{i}", stride=r, padding=r // 2) if r > 1 else _conv(t, f"source_downs.{i}")
        self.source_res = ResBlock(t, f"source_resblocks.{i}", c.source_resblock_kernel_sizes[i], c.resblock_dilations)
        n = len(c.resblock_kernel_sizes)
        self.res = nn.ModuleList(ResBlock(t, f"resblocks.{i * n + j}", k2, c.resblock_dilations)
                                 for j, k2 in enumerate(c.resblock_kernel_sizes))

    def forward(self, x, s_stft):
        x = self.up(F.leaky_relu(x, self.slope))
        if self.last:
            x = torch.cat([x[..., 1:2], x], dim=-1)                              # ReflectionPad1d((1, 0))
        x = x + self.source_res(self.down(s_stft))
        xs = self.res[0](x)
        for r in self.res[1:]:
            xs = xs + r(x)
        return xs / len(self.res)


class ConvPost(Block):
    def __init__(self, c: HiFTConfig, t: dict):
        super().__init__()
        self.conv = _conv(t, "conv_post", padding=3)
        self.bins = c.bins

    def forward(self, x):
        x = self.conv(F.leaky_relu(x, 0.01))
        magnitude = torch.exp(torch.clamp(x[:, :self.bins], max=LOG_MAG_MAX))
        return magnitude, torch.sin(x[:, self.bins:])


def hift_f0(c: HiFTConfig, t: dict) -> BlockChain:
    return BlockChain(["mel"], ["f0"], [("f0_predictor", F0Predictor(t).named(["mel"], ["f0"]))])


def hift(c: HiFTConfig, t: dict) -> BlockChain:
    """mel [1, 80, M] + padded source [1, 1, 480 M + 16] -> magnitude, phase [1, 9, 120 M + 1]."""
    n = len(c.upsample_rates)
    chain = [("source_stft", SourceSTFT(c).named(["source"], ["s_stft"])),
             ("conv_pre", ConvPre(t).named(["mel"], ["x0"]))]
    chain += [(f"up_{i}", UpStage(c, t, i).named([f"x{i}", "s_stft"], [f"x{i + 1}"])) for i in range(n)]
    chain.append(("conv_post", ConvPost(c, t).named([f"x{n}"], ["magnitude", "phase"])))
    return BlockChain(["mel", "source"], ["magnitude", "phase"], chain)

"""token2wav assets (Step-Audio2 / CosyVoice2-style flow matching, as MiniCPM-o 4.5 ships them) and the
host side of the flow-matching solver.

Layout: MiniCPM-o 4.5 keeps token2wav beside the checkpoint (assets/token2wav/: flow.yaml, flow.pt,
hift.pt, campplus.onnx, speech_tokenizer_v2_25hz.onnx). The .pt files are pickles, which omni-export
never opens: convert flow.pt once to flow.safetensors with the same state-dict names, e.g.
  python -c "import torch, safetensors.torch as s; s.save_file(torch.load('flow.pt', weights_only=True), 'flow.safetensors')"
hift.pt likewise becomes hift.safetensors (read by hift.py). From the flow, the encoder and the DiT
estimator ("decoder.estimator.*", CausalMaskedDiffWithXvec.decoder = CausalConditionalCFM) are read; the
estimator's geometry is read from the tensor shapes (the yaml is hyperpyyaml with object
tags, never executed): hidden 512, 16 blocks, 8 heads of 64, in 320 = x|mu|spks|cond (4 x 80 mels)
in the released flow.

Solver (CausalConditionalCFM.forward / solve_euler): x0 = noise; t_span = 1 - cos(linspace(0,1,n+1)
* pi/2); each step runs the estimator on the pair [conditional, unconditional (mu, spks, cond = 0)],
mixes v = (1 + r) v_c - r v_u (r = inference_cfg_rate, 0.7) and steps x += dt v. `dit_step` is one
estimator call on the pair; the loop, the CFG mix and the timestep's sinusoidal features (1000 t
through sin/cos: arguments up to 1000 rad, which HTP's fp16 sin cannot take) run on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core import UsageError
from ...weights import TensorDecl, load_tensors, read_header

PREFIX = "decoder.estimator."
FREQ_DIM = 256                 # TimestepEmbedder.frequency_embedding_size
TIME_SCALE = 1000.0            # TimestepEmbedder.scale
CFG_RATE = 0.7                 # CausalConditionalCFM.inference_cfg_rate


@dataclass(frozen=True)
class DiTConfig:
    in_channels: int = 320
    out_channels: int = 80
    hidden_size: int = 512
    depth: int = 16
    num_heads: int = 8
    head_dim: int = 64
    mlp_hidden: int = 2048

    @property
    def mels(self) -> int:
        return self.out_channels

    def to_json(self) -> dict:
        return dict(self.__dict__)


TINY_DIT = DiTConfig(in_channels=320, out_channels=80, hidden_size=48, depth=2, num_heads=2, head_dim=16, mlp_hidden=96)
REAL_DIT = DiTConfig()


def dit_tensors(c: DiTConfig) -> dict[str, TensorDecl]:
    h, inner = c.hidden_size, c.num_heads * c.head_dim
    s = 1.0 / math.sqrt(h)
    t = {
        "t_embedder.mlp.0.weight": TensorDecl((h, FREQ_DIM), ("normal", 1 / 16)),
        "t_embedder.mlp.0.bias": TensorDecl((h,), ("normal", 0.02)),
        "t_embedder.mlp.2.weight": TensorDecl((h, h), ("normal", s)),
        "t_embedder.mlp.2.bias": TensorDecl((h,), ("normal", 0.02)),
        "in_proj.weight": TensorDecl((h, c.in_channels), ("normal", 1 / math.sqrt(c.in_channels))),
        "in_proj.bias": TensorDecl((h,), ("normal", 0.02)),
        "final_layer.adaLN_modulation.1.weight": TensorDecl((2 * h, h), ("normal", s / 4)),
        "final_layer.adaLN_modulation.1.bias": TensorDecl((2 * h,), ("normal", 0.02)),
        "final_layer.linear.weight": TensorDecl((c.out_channels, h), ("normal", s)),
        "final_layer.linear.bias": TensorDecl((c.out_channels,), ("normal", 0.02)),
    }
    for n in range(c.depth):
        p = f"blocks.{n}."
        t.update({
            p + "attn.to_q.weight": TensorDecl((inner, h), ("normal", s)), p + "attn.to_q.bias": TensorDecl((inner,), ("normal", 0.02)),
            p + "attn.to_k.weight": TensorDecl((inner, h), ("normal", s)), p + "attn.to_k.bias": TensorDecl((inner,), ("normal", 0.02)),
            p + "attn.to_v.weight": TensorDecl((inner, h), ("normal", s)), p + "attn.to_v.bias": TensorDecl((inner,), ("normal", 0.02)),
            p + "attn.q_norm.weight": TensorDecl((c.head_dim,), ("uniform", 0.8, 1.2)),
            p + "attn.q_norm.bias": TensorDecl((c.head_dim,), ("normal", 0.02)),
            p + "attn.k_norm.weight": TensorDecl((c.head_dim,), ("uniform", 0.8, 1.2)),
            p + "attn.k_norm.bias": TensorDecl((c.head_dim,), ("normal", 0.02)),
            p + "attn.proj.weight": TensorDecl((h, inner), ("normal", 1 / math.sqrt(inner))),
            p + "attn.proj.bias": TensorDecl((h,), ("normal", 0.02)),
            p + "mlp.fc1.weight": TensorDecl((c.mlp_hidden, h), ("normal", s)),
            p + "mlp.fc1.bias": TensorDecl((c.mlp_hidden,), ("normal", 0.02)),
            p + "mlp.fc2.weight": TensorDecl((h, c.mlp_hidden), ("normal", 1 / math.sqrt(c.mlp_hidden))),
            p + "mlp.fc2.bias": TensorDecl((h,), ("normal", 0.02)),
            p + "conv.block.1.weight": TensorDecl((h, h, 3), ("normal", s / math.sqrt(3))),
            p + "conv.block.1.bias": TensorDecl((h,), ("normal", 0.02)),
            p + "conv.block.3.weight": TensorDecl((h,), ("uniform", 0.8, 1.2)),
            p + "conv.block.3.bias": TensorDecl((h,), ("normal", 0.02)),
            p + "conv.block.6.weight": TensorDecl((h, h, 3), ("normal", s / math.sqrt(3))),
            p + "conv.block.6.bias": TensorDecl((h,), ("normal", 0.02)),
            p + "adaLN_modulation.1.weight": TensorDecl((9 * h, h), ("normal", s / 4)),
            p + "adaLN_modulation.1.bias": TensorDecl((9 * h,), ("normal", 0.1)),
        })
    return t


def asset_path(directory: Path, stem: str) -> Path | None:
    """`<stem>.safetensors` in the token2wav directory; a `<stem>.pt` alone is refused (a pickle)."""
    st, pt = directory / f"{stem}.safetensors", directory / f"{stem}.pt"
    if st.exists() or st.is_symlink():
        return st
    if pt.exists():
        raise UsageError(f"{pt} is a pickle (torch.save); omni-export never unpickles. Convert it once: python -c "
                         f"\"import torch, safetensors.torch as s; s.save_file(torch.load('{stem}.pt', weights_only=True), "
                         f"'{stem}.safetensors')\" in {directory}")
    return None


def flow_path(directory: Path) -> Path | None:
    return asset_path(directory, "flow")


def read_dit_config(path: Path) -> DiTConfig:
    """The estimator's geometry from the tensor shapes in the safetensors header."""
    header = read_header(path)

    def shape(name: str) -> list[int]:
        entry = header.get(PREFIX + name)
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: tensor '{PREFIX + name}' is missing; is this token2wav's flow (CosyVoice2 "
                             f"flow matching with a DiT estimator)?")
        return entry["shape"]

    h, cin = shape("in_proj.weight")
    depth = 0
    while isinstance(header.get(f"{PREFIX}blocks.{depth}.attn.to_q.weight"), dict):
        depth += 1
    hd = shape("blocks.0.attn.q_norm.weight")[0] if depth else 0
    inner = shape("blocks.0.attn.to_q.weight")[0] if depth else 0
    if not depth or not hd or inner % hd:
        raise UsageError(f"{path}: the DiT estimator has no blocks or inconsistent head sizes; the file is corrupt")
    c = DiTConfig(in_channels=cin, out_channels=shape("final_layer.linear.weight")[0], hidden_size=h, depth=depth,
                  num_heads=inner // hd, head_dim=hd, mlp_hidden=shape("blocks.0.mlp.fc1.weight")[0])
    if c.in_channels != 4 * c.out_channels:
        raise UsageError(f"{path}: estimator input {c.in_channels} is not x|mu|spks|cond (4 x {c.out_channels} mels)")
    return c


def load_dit(path: Path) -> tuple[DiTConfig, dict]:
    cfg = read_dit_config(path)
    return cfg, load_tensors(path, dit_tensors(cfg), prefix=PREFIX)


def load_encoder(path: Path):
    """(EncoderConfig, tensors) of the flow encoder, or None when flow.safetensors has none."""
    from .flow_encoder import encoder_tensors, read_encoder_config

    cfg = read_encoder_config(read_header(path))
    return None if cfg is None else (cfg, load_tensors(path, encoder_tensors(cfg)))


def write_flow(directory: Path, cfg: DiTConfig = TINY_DIT, seed: int = 0, encoder=None) -> Path:
    from ...weights import prefixed, seeded_tensors, write_safetensors
    from .flow_encoder import TINY_ENCODER, encoder_tensors

    directory.mkdir(parents=True, exist_ok=True)
    tensors = prefixed(seeded_tensors(dit_tensors(cfg), seed), PREFIX)
    tensors.update(seeded_tensors(encoder_tensors(encoder or TINY_ENCODER), seed + 1))
    write_safetensors(directory / "flow.safetensors", tensors)
    return directory


# ------------------------------------------------------------------------------ host solver

def t_span(steps: int) -> np.ndarray:
    return 1.0 - np.cos(np.linspace(0.0, 1.0, steps + 1) * 0.5 * np.pi)


def time_features(t: float) -> np.ndarray:
    """TimestepEmbedder.timestep_embedding(1000 t, 256) in float64 -> [1, 256] float32 (cos half, sin half)."""
    half = FREQ_DIM // 2
    freqs = np.exp(-math.log(10000.0) * np.arange(half) / half)
    a = TIME_SCALE * t * freqs
    return np.concatenate([np.cos(a), np.sin(a)])[None].astype(np.float32)


def solve(graphs, noise: np.ndarray, mu: np.ndarray, spks: np.ndarray, cond: np.ndarray, mask: np.ndarray,
          steps: int, cfg_rate: float = CFG_RATE) -> np.ndarray:
    """The Euler loop over `dit_step`: noise, mu, cond [1, 80, M], spks [1, 80], mask [1, 1, M] -> mel [1, 80, M]."""
    ts = t_span(steps)
    x = noise.astype(np.float32)
    for k in range(steps):
        v = graphs("dit_step", {"x": x, "mu": mu, "spks": spks, "cond": cond, "mask": mask,
                                "t_freq": time_features(ts[k])})["velocity"]
        v = (1.0 + cfg_rate) * v[:1] - cfg_rate * v[1:]
        x = (x + (ts[k + 1] - ts[k]) * v).astype(np.float32)
    return x

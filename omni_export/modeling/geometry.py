"""The sizes every decoder-only transformer config names (Hugging Face's keys), shared by the recipes'
config dataclasses; each adds what its family has beyond them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerGeometry:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

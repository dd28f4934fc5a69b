"""Safetensors-only weight loading, validated against a recipe's tensor table; seeded tiny writers.

A recipe declares the tensors it needs as a table {official name: TensorDecl(shape, init)}. The same
table drives loading (missing / wrong-shape tensors are named in the error) and the seeded
checkpoints written for the demo and the tests. Pickles are never loaded.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from .core import UsageError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_}


@dataclass(frozen=True)
class TensorDecl:
    shape: tuple[int, ...]
    init: tuple = ("normal", 0.02)   # ("normal", std) | ("ones",) | ("zeros",) | ("const", v) | ("uniform", lo, hi)
    required: bool = True


TensorTable = Mapping[str, TensorDecl]


def refuse_pickles(directory: Path, stem: str = "model") -> None:
    for suffix in PICKLE_SUFFIXES:
        p = directory / f"{stem}{suffix}"
        if p.exists() and not (directory / f"{stem}.safetensors").exists():
            raise UsageError(
                f"{p} is a pickle checkpoint; omni-export never unpickles (a pickle can run code). "
                f"Convert it to safetensors (e.g. save_pretrained(..., safe_serialization=True))")


def read_header(path: Path) -> dict:
    """Parse a safetensors header with our own checks, so a corrupt file gives our error."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n <= 1 or n > min(size - 8, 100 * 2**20):
                raise ValueError(f"header length {n} does not fit the file ({size} bytes)")
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not a readable safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: safetensors header is not a JSON object")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
            dtype = info["dtype"]
        except (TypeError, KeyError, ValueError):
            raise UsageError(f"{path}: malformed entry for tensor '{name}' in the header") from None
        itemsize = np.dtype(_ST_DTYPES[dtype]).itemsize if _ST_DTYPES.get(dtype) else (2 if dtype == "BF16" else None)
        if itemsize is None:
            raise UsageError(f"{path}: tensor '{name}' has unsupported dtype {dtype}")
        if not (0 <= begin <= end <= data_len) or end - begin != itemsize * int(np.prod(shape)):
            raise UsageError(f"{path}: tensor '{name}' lies outside the file or has the wrong size "
                             f"(truncated or corrupted download?)")
    return header


def load_tensors(path: Path, table: TensorTable, *, prefix: str = "", check_finite: bool = True) -> dict:
    """Load the tensors `table` declares (names relative to `prefix`) as fp32 torch tensors."""
    import torch
    from safetensors import safe_open

    if not path.exists():
        raise UsageError(f"missing weight file {path}")
    header = read_header(path)
    missing = [n for n, d in table.items() if d.required and prefix + n not in header]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{path}: tensor '{prefix + missing[0]}' is missing{more}; "
                         f"is this the right checkpoint for this recipe?")
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name, decl in table.items():
            full = prefix + name
            if full not in header:
                continue
            found = tuple(header[full]["shape"])
            if found != tuple(decl.shape):
                raise UsageError(f"{path}: tensor '{full}' has shape {list(found)}, expected "
                                 f"{list(decl.shape)} from the config")
            t = f.get_tensor(full).to(torch.float32)
            if check_finite and not torch.isfinite(t).all():
                bad = int((~torch.isfinite(t)).sum())
                raise UsageError(f"{path}: tensor '{full}' holds {bad} NaN/Inf values; "
                                 f"the checkpoint is corrupt")
            out[name] = t
    return out


def seeded_tensors(table: TensorTable, seed: int) -> dict[str, np.ndarray]:
    """Deterministic random tensors for a table (numpy's PCG64 is stable across versions)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(table):
        decl = table[name]
        kind, *args = decl.init
        if kind == "normal":
            a = rng.standard_normal(decl.shape) * args[0]
        elif kind == "uniform":
            a = rng.uniform(args[0], args[1], decl.shape)
        elif kind == "ones":
            a = np.ones(decl.shape)
        elif kind == "zeros":
            a = np.zeros(decl.shape)
        elif kind == "const":
            a = np.full(decl.shape, args[0])
        else:
            raise ValueError(f"unknown init {decl.init} for {name}")
        out[name] = np.ascontiguousarray(a, dtype=np.float32)
    return out


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(dict(tensors), str(tmp), metadata={"format": "pt", **(metadata or {})})
    tmp.replace(path)


def prefixed(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {prefix + k: v for k, v in tensors.items()}


def names(table: TensorTable) -> Iterable[str]:
    return sorted(table)

"""Reproducibility: fixed seeds, which formats are byte-stable (and why not), and the held-out
parity inputs kept in OUT for `omni-export verify --rescore`.

parity-inputs/<component>.npz holds, for held-out sample i and tensor name n, `input.{i}.{n}`
(the graph input) and `reference.{i}.{n}` (the fp32 output of the traced model). It is written
without timestamps, so the same inputs give the same bytes; its sha256 is in the manifest.
"""
from __future__ import annotations

import io
import random
import zipfile

import numpy as np

SEED = 0
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

# Measured by tests/test_reproducibility.py: two builds of the same inputs, sha256 per file.
BYTE_STABLE: dict[str, tuple[bool, str]] = {
    "onnx": (True, "the same inputs give the same bytes (torch.onnx dynamo export; ORT fp16 and QDQ passes)"),
    "pte": (True, "the same inputs give the same bytes (ExecuTorch flatbuffer)"),
    "dlc": (False, "QNN's DLC writer records the build time (the 'timestamp' fields of the dlc.metadata "
                   "entries, 1 s resolution); every other entry (graph, params) is byte-identical"),
    "ctx": (False, "the QNN context binary (*_qnn.bin) holds some bytes of uninitialised memory of the "
                   "compiling process (pointers, stale buffer contents in padding: between 34 bytes and "
                   "16 kB of 2.8 MB differed between two builds here); the EPContext .onnx wrapper "
                   "is byte-identical and both binaries give bit-identical outputs on the HTP simulator"),
    "parity-inputs": (True, "numpy arrays in a zip with fixed timestamps"),
}


def seed_everything(seed: int = SEED) -> dict:
    """Seed every global generator a build could touch; recipes seed their own data explicitly."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return {"python_random": seed, "numpy_global": seed, "torch": seed}


def declared(manifest: dict) -> dict:
    """Per format built (and for the parity inputs): byte_stable and why."""
    formats = sorted({b["format"] for b in manifest.get("builds", [])}) + ["parity-inputs"]
    return {f: {"byte_stable": BYTE_STABLE[f][0], "why": BYTE_STABLE[f][1]} for f in formats if f in BYTE_STABLE}


def npz_bytes(arrays: dict) -> bytes:
    """An .npz (readable by numpy.load) with fixed zip timestamps, entries in name order. Values
    are arrays or zero-argument callables returning one: each is made, deflated and dropped in
    turn (a KV-cache input padded to its full context is mostly zeros and compresses ~1000x)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(arrays):
            a = arrays[name]
            a = np.ascontiguousarray(a() if callable(a) else a)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w", force_zip64=a.nbytes > (1 << 30)) as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
            del a
    return buf.getvalue()


def parity_inputs_npz(traced) -> bytes:
    arrays = {}
    for i, (sample, ref) in enumerate(zip(traced.heldout, traced.reference)):
        arrays.update({f"input.{i}.{n}": (lambda s=sample, n=n: np.asarray(s[n])) for n in traced.input_names})
        arrays.update({f"reference.{i}.{n}": np.asarray(ref[n]) for n in traced.output_names})
    return npz_bytes(arrays)


def read_parity_inputs(path) -> tuple[list[dict], list[dict]]:
    """(held-out inputs, fp32 references), one dict per sample, from parity-inputs/<component>.npz."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    n = 1 + max((int(k.split(".")[1]) for k in arrays), default=-1)
    inputs: list[dict] = [{} for _ in range(n)]
    refs: list[dict] = [{} for _ in range(n)]
    for k, a in arrays.items():
        kind, i, name = k.split(".", 2)
        (inputs if kind == "input" else refs)[int(i)][name] = a
    return inputs, refs

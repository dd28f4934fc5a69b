"""Manifest schema and provenance: who built what, from which weights, with which toolchain."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SCHEMA_VERSION = 1
TOOL_PACKAGES = ("omni-export", "torch", "executorch", "torchao", "onnx", "onnxscript", "onnxruntime",
                 "onnxruntime-qnn", "qai-hub", "numpy", "safetensors")


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_sha() -> str | None:
    """The omni-export source revision (with '-dirty' when the tree has local changes)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None


def toolchain() -> dict:
    from ..qnn_ep import qnn_version

    versions = {name: package_version(name) for name in TOOL_PACKAGES}
    versions["qnn"] = qnn_version()
    versions["python"] = platform.python_version()
    versions["omni-export-git"] = git_sha()
    return versions


def host() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "torch_threads": _torch_threads()}


def _torch_threads() -> int | None:
    if "torch" not in sys.modules:
        return None
    return sys.modules["torch"].get_num_threads()


def hash_arrays(samples: list[dict]) -> str:
    """A content hash of a list of {name: ndarray} samples (names, dtypes, shapes and bytes)."""
    import numpy as np

    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            a = np.ascontiguousarray(s[k])
            h.update(f"{k}|{a.dtype.str}|{a.shape}".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def dumps(obj) -> str:
    return json.dumps(obj, indent=2)

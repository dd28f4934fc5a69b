"""Every patch of a pinned upstream internal, one module each, applied only inside a context manager.

Each module names what it was written against and what it replaces:
  PINNED  = {distribution: version}: the installed version it was written and checked on;
  TARGETS = ("module:Attribute.path", ...): the upstream names it replaces or relies on.
`problems()` lists where the installed packages differ from a patch's pins or a target is gone;
tests/test_patches.py fails on any, so a dependency upgrade re-checks each patch by hand (does it
still apply, is it still needed) before its pin moves. Heavy imports wait for `problems()`.
"""
from __future__ import annotations

import importlib

MODULES = ("fx_passes", "onnxscript_rules", "ort_float16", "ort_quantizer", "xnnpack_preprocess")


def installed_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution).split("+")[0]          # torch's local tag: 2.13.0+cpu is 2.13.0
    except PackageNotFoundError:
        return None


def _resolve(target: str) -> bool:
    module, _, path = target.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return False
    for part in path.split("."):
        if part not in getattr(obj, "__dict__", {}) and not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def problems(name: str, pinned: dict | None = None, targets: tuple | None = None) -> list[str]:
    """One line per mismatch of patch `name` (its own PINNED / TARGETS unless given)."""
    mod = importlib.import_module(f"{__name__}.{name}")
    pinned = mod.PINNED if pinned is None else pinned
    targets = mod.TARGETS if targets is None else targets
    out = [f"exporters/patches/{name}.py was written against {dist}=={want}; installed: {have or 'none'}"
           for dist, want in pinned.items() if (have := installed_version(dist)) != want]
    out += [f"exporters/patches/{name}.py patches {t}, which no longer exists" for t in targets if not _resolve(t)]
    return out

"""A checkpoint's JSON files and the demo marker, shared by every recipe's checkpoint reader and writer.

The tiny seeded checkpoints the recipes write for the demo and the tests carry a marker in their
config.json ({DEMO_MARKER: {"seed", "label", ...}}): the manifest labels such a checkpoint as the demo's,
and the build records its seed."""
from __future__ import annotations

import json
from pathlib import Path

DEMO_MARKER = "omni_export_demo"
MAX_CONFIG_BYTES = 16 * 2**20


def read_json(path: Path, what: str, holds: str = "") -> dict:
    """The JSON object in `path` (`what` it is, e.g. "model config"), with one-line errors naming the file:
    missing (`holds`: what the recipe's checkpoint directory holds, for the hint), not a regular file,
    too large for a config, not JSON, not an object."""
    from ..core import UsageError
    from ..weights import require_regular_file

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"missing {path} ({what})" + (f"; {holds}" if holds else ""))
    require_regular_file(path, what)
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"{path}: {path.stat().st_size} bytes is too large for a config ({what})")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise UsageError(f"{path}: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object ({what})")
    return data


def demo_info(checkpoint: Path) -> dict:
    """The demo marker of a checkpoint written by a recipe's write_checkpoint, else {}."""
    from ..core import UsageError

    try:
        raw = read_json(Path(checkpoint) / "config.json", "model config")
    except UsageError:
        return {}
    info = raw.get(DEMO_MARKER)
    return info if isinstance(info, dict) else {}


def demo_label(checkpoint: Path) -> str | None:
    """The demo label if this checkpoint was written by a recipe's `write_checkpoint`, else None."""
    label = demo_info(checkpoint).get("label")
    return label if isinstance(label, str) else None


def demo_seed(checkpoint: Path) -> int | None:
    seed = demo_info(checkpoint).get("seed")
    return seed if type(seed) is int else None


def check_directory(checkpoint: Path, holds: str) -> None:
    """A checkpoint given as a directory that exists (`holds`: what it should hold, for the hints); a
    pickle file or any other file in its place is refused in one line."""
    from ..core import UsageError
    from ..weights import PICKLE_SUFFIXES

    if not checkpoint.exists():
        raise UsageError(f"checkpoint directory {checkpoint} does not exist; pass the directory holding "
                         f"{holds} (or omit --checkpoint for the demo)")
    if not checkpoint.is_dir():
        if checkpoint.suffix in PICKLE_SUFFIXES:
            raise UsageError(f"{checkpoint} is a pickle checkpoint; omni-export never unpickles (a pickle can "
                             f"run code). Pass a checkpoint directory with safetensors weights")
        raise UsageError(f"--checkpoint {checkpoint} is a file; pass the checkpoint directory (holding {holds})")

"""The output directory: atomic file writes, accepted vs rejected/, and an in-progress marker.

Layout of OUT:
  manifest.json, parity.json, report.md        written last, each atomically (tmp + rename)
  {recipe}-{component}-{precision}-{target}.*  accepted builds
  rejected/...                                 builds under the gate: kept, never deployable
  .staging/                                    exporters write here; files move out by rename
  .incomplete                                  present while a run is under way or after a crash
A manifest entry is only written for a file that has been renamed into place, so a crash never
leaves a manifest naming a missing or partial file; `.incomplete` tells the next run (and
`omni-export verify`) that the directory holds an unfinished run.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import UsageError

MARKER = ".incomplete"
STAGING = ".staging"
REJECTED = "rejected"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@dataclass(frozen=True)
class FileRecord:
    path: str          # relative to OUT
    sha256: str
    bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)

    # ---- run lifecycle
    def begin(self, recipe: str, target: str, force: bool) -> dict | None:
        """Prepare OUT for a run; returns the previous manifest (if any) for cache reuse."""
        self._check_writable()
        previous = self.read_manifest()
        if previous and not force:
            prev = (previous.get("recipe", {}).get("name"), previous.get("target", {}).get("name"))
            if prev != (recipe, target):
                raise UsageError(f"{self.root} holds a build of {prev[0]} for {prev[1]}; choose another "
                                 f"--out or pass --force to replace it")
        atomic_write_json(self.root / MARKER, {"pid": os.getpid(), "started": time.time()})
        shutil.rmtree(self.root / STAGING, ignore_errors=True)
        return previous

    def finish(self) -> None:
        shutil.rmtree(self.root / STAGING, ignore_errors=True)
        (self.root / MARKER).unlink(missing_ok=True)

    @property
    def incomplete(self) -> bool:
        return (self.root / MARKER).exists()

    def _check_writable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise UsageError(f"output directory {self.root} is not writable ({e.strerror}); "
                             f"choose another --out") from None

    # ---- files
    def staging(self, name: str) -> Path:
        d = self.root / STAGING / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def commit(self, files: list[Path], accepted: bool) -> list[FileRecord]:
        """Move staged files into OUT (or OUT/rejected) by rename; return their records."""
        dest_dir = self.root if accepted else self.root / REJECTED
        other = self.root / REJECTED if accepted else self.root
        dest_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for f in files:
            f = Path(f)
            rec = FileRecord(str((dest_dir / f.name).relative_to(self.root)), sha256_file(f), f.stat().st_size)
            os.replace(f, dest_dir / f.name)
            (other / f.name).unlink(missing_ok=True)      # a build that moved between verdicts
            records.append(rec)
        return records

    def remove(self, relpaths: list[str]) -> None:
        for p in relpaths:
            (self.root / p).unlink(missing_ok=True)

    # ---- documents
    def read_manifest(self) -> dict | None:
        p = self.root / "manifest.json"
        if not p.exists():
            return None
        try:
            return json.loads(p.read_text())
        except ValueError:
            return None

    def write_json(self, name: str, obj) -> Path:
        p = self.root / name
        atomic_write_json(p, obj)
        return p

    def write_text(self, name: str, text: str) -> Path:
        p = self.root / name
        atomic_write_text(p, text)
        return p

"""Integrity of an output directory against its manifest: what `omni-export verify` reports.

Drift is anything that makes OUT differ from what its manifest says: a listed file missing, its
bytes changed, a file nobody listed, the `.incomplete` marker or `.staging/` of a run that did not
finish, a listed path that leaves OUT. Reading only: nothing here writes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..core import UsageError
from .manifest import path_outside
from .store import DOCUMENTS, LOCK, MARKER, REPORT_FILES, STAGING, is_ours, listed_files, sha256_file


@dataclass(frozen=True)
class Finding:
    kind: str       # incomplete | staging | manifest | missing | changed | extra | outside | score | rescore
    path: str
    detail: str

    def line(self) -> str:
        return f"{self.kind:10s} {self.path}: {self.detail}"

    def to_json(self) -> dict:
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


def load_manifest(out: Path) -> tuple[dict | None, list[Finding]]:
    """The manifest (or None) and findings about OUT's state. UsageError when OUT holds no build."""
    if not out.is_dir():
        raise UsageError(f"{out} is not a directory; pass the --out directory of a build")
    findings = []
    marker = out / MARKER
    if marker.exists():
        findings.append(Finding("incomplete", MARKER, "a run did not finish here (killed or interrupted); "
                                "rerun the build to complete or clean it"))
    if (out / STAGING).exists():
        findings.append(Finding("staging", STAGING, "scratch files of an unfinished run"))
    path = out / "manifest.json"
    if not path.exists():
        if not findings:
            raise UsageError(f"{out} holds no manifest.json; pass the --out directory of a build")
        return None, findings
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, findings + [Finding("manifest", "manifest.json", f"not readable JSON ({e})")]
    if not is_ours(manifest) or not isinstance(manifest.get("builds"), list):
        return None, findings + [Finding("manifest", "manifest.json", "not an omni-export manifest")]
    return manifest, findings


def check_files(out: Path, manifest: dict) -> list[Finding]:
    """Re-hash every listed file; name missing, changed, outside and unlisted ones."""
    findings, listed = [], set()
    for rec in listed_files(manifest):
        rel = rec.get("path")
        if not isinstance(rel, str):
            findings.append(Finding("manifest", "manifest.json", f"a file record has no path: {rec}"))
            continue
        why = path_outside(out, rel)
        if why is not None:
            findings.append(Finding("outside", rel, "the manifest lists a path outside the output directory"
                                    if why.startswith("leaves") else f"the manifest lists a path outside the output "
                                                                     f"directory: it {why}"))
            continue
        p = out / rel
        listed.add(Path(rel).as_posix())
        findings += _check_one(p, rel, rec)
    findings += _check_documents(out, manifest)
    findings += [Finding("extra", rel, "not listed in the manifest") for rel in _unlisted(out, manifest, listed)]
    return findings


def _check_documents(out: Path, manifest: dict) -> list[Finding]:
    """The reports against the hashes the manifest keeps of them ("documents"; a manifest written
    before reports were hashed has none, and its reports are not checked)."""
    docs = manifest.get("documents")
    if docs is None:
        return []
    if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
        return [Finding("manifest", "manifest.json", "its \"documents\" is not a list of file records")]
    findings, named = [], set()
    for rec in docs:
        name = rec.get("path")
        if name not in REPORT_FILES:
            findings.append(Finding("manifest", "manifest.json", f"\"documents\" lists {name!r}, not a report "
                                                                 f"({', '.join(REPORT_FILES)})"))
            continue
        named.add(name)
        findings += _check_one(out / name, name, rec)
    findings += [Finding("extra", name, "a report the manifest does not hash") for name in REPORT_FILES
                 if name not in named and (out / name).exists()]
    return findings


def _check_one(p: Path, rel: str, rec: dict) -> list[Finding]:
    if p.is_symlink():
        return [Finding("changed", rel, f"is now a symlink to {os.readlink(p)}")]
    if not p.is_file():
        return [Finding("missing", rel, "listed in the manifest, not on disk")]
    size, digest = p.stat().st_size, sha256_file(p)
    if digest != rec.get("sha256") or size != rec.get("bytes"):
        return [Finding("changed", rel, f"sha256 {digest[:12]}.. ({size} bytes), manifest says "
                                        f"{str(rec.get('sha256'))[:12]}.. ({rec.get('bytes')} bytes)")]
    return []


def _unlisted(out: Path, manifest: dict, listed: set[str]) -> list[str]:
    skip_dirs = {STAGING}
    ck = (manifest.get("checkpoint") or {}).get("path")
    if isinstance(ck, str):                       # the embedded demo checkpoint lives in OUT
        try:
            skip_dirs.add(Path(ck).resolve().relative_to(out.resolve()).parts[0])
        except (ValueError, IndexError):
            pass
    extra = []
    for dirpath, dirnames, filenames in os.walk(out):
        rel_dir = Path(dirpath).relative_to(out)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip_dirs]
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if rel not in listed and rel not in DOCUMENTS and rel not in (MARKER, LOCK):
                extra.append(rel)
    return sorted(extra)

"""The output directory: atomic file writes, accepted vs rejected/, an in-progress marker and journal.

Layout of OUT:
  manifest.json, parity.json, report.md        written last, each atomically (tmp + rename);
                                               manifest.json last of all
  {recipe}-{component}-{precision}-{target}.*  accepted builds
  rejected/...                                 builds under the gate: kept, never deployable
  parity-inputs/<component>.npz                held-out inputs + fp32 references (verify --rescore)
  parity-inputs/<component>.calibration.npz    calibration inputs (AI Hub's quantize job)
  sources/...onnx                              the ONNX AI Hub compiles from (accepted builds)
  hub/<build>/...                              AI Hub results: compiled model, profile, device outputs
  .staging/                                    exporters write here; files move out by rename
  .jobs/<key>/                                 finished jobs' outputs by content key, for a rerun after
                                               a kill (jobs/results.py); removed when a run finishes
  .lock                                        the one-writer lock (lockf, held while a run writes;
                                               the file stays: removing it would let two runs lock
                                               two different files)
  .incomplete                                  present while a run is under way or after a crash:
                                               JSON with pid, host, start time, recipe, target and
                                               the journal of every file put into OUT since the
                                               last complete run

`omni-export hub submit` amends a finished build (amend()): the marker says mode "hub" and
journals the files it puts, manifest.json is rewritten (write_manifest) after each file it lists
lands and whenever an AI Hub job id or state changes, and nothing of the build is removed.

The invariant, wherever a run is killed: if manifest.json exists, every file it lists exists with
the listed sha256 and size. A run removes the previous run's documents just before its first file
lands in OUT (a run that fails earlier leaves the previous build as it was), and writes the new
manifest after every file it lists. A file enters the journal before it is renamed into OUT; at the
end, journal files the new manifest does not list (a format built last time, a crashed run's
build) are removed. Files the store did not write are never removed, and nothing is written
outside OUT (artifact names are single path components from the recipe and target tables).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import UsageError, strict_json
from ..faults import crash_point

MARKER = ".incomplete"
LOCK = ".lock"
STAGING = ".staging"
JOBS = ".jobs"                        # finished jobs' outputs by content key (jobs/results.py)
REJECTED = "rejected"
MANIFEST = "manifest.json"
DOCUMENTS = ("manifest.json", "parity.json", "report.md", "report.html")
REPORT_FILES = DOCUMENTS[1:]          # hashed in the manifest's "documents" (the manifest cannot hash itself)
_SCRATCH_PREFIXES = (MARKER, STAGING, JOBS, LOCK, ".write-test-")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _file_mode() -> int:
    """The mode a file written with open() gets under this process's umask (0644 under 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


FILE_MODE = _file_mode()


def _plain_mode(path: Path) -> None:
    """`path` (ours, staged) readable like any written file; a link is not followed."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(strict_json(obj), indent=2, allow_nan=False) + "\n")


def disk_full(e: BaseException | None) -> BaseException | None:
    """The ENOSPC / EDQUOT error anywhere in an exception chain (exporters wrap the OSError in
    their own exceptions, or only keep its message), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return e
        if os.strerror(errno.ENOSPC) in str(e):
            return e
        e = e.__cause__ or e.__context__
    return None


def is_disk_full(e: BaseException) -> bool:
    return disk_full(e) is not None


def raise_if_disk_full(e: BaseException, out: Path, incomplete: bool) -> None:
    """A full disk is the user's to fix: one line, exit 2, wherever the exporters wrapped it."""
    full = disk_full(e)
    if full is not None:
        where = getattr(full, "filename", None) or out
        raise UsageError(f"disk full while writing {where}; free space and rerun"
                         + (f" ({out} is marked incomplete)" if incomplete else "")) from e


@dataclass(frozen=True)
class FileRecord:
    path: str          # relative to OUT
    sha256: str
    bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}


def listed_files(manifest: dict) -> list[dict]:
    """Every file record a manifest lists: build files, kept audio samples, parity and calibration
    inputs, the source ONNX kept for AI Hub, each build's AI Hub results and the bundle's files
    (tolerates damage)."""
    out = []
    for b in manifest.get("builds") or []:
        if isinstance(b, dict):
            out += [f for f in b.get("files") or [] if isinstance(f, dict)]
            out += [f for f in b.get("samples") or [] if isinstance(f, dict)]
            hub = b.get("hub")
            if isinstance(hub, dict):
                out += [f for f in hub.get("files") or [] if isinstance(f, dict)]
    comps = manifest.get("components")
    for c in (comps.values() if isinstance(comps, dict) else []):
        if not isinstance(c, dict):
            continue
        for key in ("parity_inputs", "calibration_inputs"):
            if isinstance(c.get(key), dict) and "path" in c[key]:
                out.append(c[key])
        out += [f for f in c.get("samples") or [] if isinstance(f, dict)]
        sources = c.get("sources")
        if isinstance(sources, dict):
            out += [f for f in sources.values() if isinstance(f, dict) and "path" in f]
    bundle = manifest.get("bundle")                  # OUT/bundle/ (artifacts/bundle.py), paths relative to OUT
    if isinstance(bundle, dict):
        out += [f for f in bundle.get("files") or [] if isinstance(f, dict)]
    return out


def document_records(root: Path) -> list[dict]:
    """The reports in OUT as file records, for the manifest's "documents": what `verify` checks
    them against (an edited report.md is drift like an edited artifact)."""
    return [FileRecord(name, sha256_file(root / name), (root / name).stat().st_size).to_json()
            for name in REPORT_FILES if (root / name).is_file() and not (root / name).is_symlink()]


def is_ours(manifest) -> bool:
    return isinstance(manifest, dict) and manifest.get("tool") == "omni-export"


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.recovered: dict | None = None   # the marker of a run that did not finish
        self._journal: set[str] = set()
        self._written: set[str] = set()
        self._claimed = False
        self._had_build = False
        self._amending = False
        self._info: dict = {}
        self._finished: dict = {}            # component -> {record, entries}: what a killed run resumes from
        self._lock_fd: int | None = None
        self._made_lock = False

    # ---- run lifecycle
    def begin(self, recipe: str, target: str, force: bool) -> dict | None:
        """Prepare OUT for a run; returns the previous manifest (if any)."""
        self._check_writable()
        self._lock()
        crashed = self.read_marker()
        if crashed is not None:
            _refuse_live_run(self.root, crashed)
        previous, state = self._previous_manifest()
        try:
            if not force:
                self._check_owner(previous, state, crashed, recipe, target)
            if previous is None and crashed is None:
                self._check_scratch_names()
        except UsageError:
            self._release_refused()
            raise
        self._journal = {f["path"] for f in listed_files(previous or {}) if isinstance(f.get("path"), str)}
        self._journal |= {p for p in (crashed or {}).get("files", []) if isinstance(p, str)}
        self._had_build = previous is not None and crashed is None
        self.recovered = crashed
        self._info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                      "recipe": recipe, "target": target}
        self._write_marker()
        crash_point("begin")
        self._remove_scratch()
        if crashed is None or force:          # the job store serves a rerun after a kill, never --force
            _remove_tree(self.root / JOBS)
        return previous

    def amend(self, mode: str = "hub") -> dict:
        """Open a finished build to add files to it and rewrite its manifest as they land (AI Hub
        results). Returns the manifest. The marker (with `mode`) journals every file put; a run of
        the same mode killed earlier is taken over (its unlisted files are removed at the end), an
        unfinished build or a live run is refused. Nothing of the build is removed."""
        self._check_writable()
        self._lock()
        marker = self.read_marker()
        if marker is not None:
            _refuse_live_run(self.root, marker)
            if marker.get("mode") != mode:
                raise UsageError(f"{self.root} holds an unfinished build (.incomplete); rerun the build first")
        manifest, state = self._previous_manifest()
        if state != "ours":
            raise UsageError(f"{self.root} holds no finished omni-export build (manifest.json "
                             f"{'missing' if state == 'none' else state}); run a build first")
        self._journal = {f["path"] for f in listed_files(manifest) if isinstance(f.get("path"), str)}
        self._journal |= {p for p in (marker or {}).get("files", []) if isinstance(p, str)}
        self._claimed = self._had_build = self._amending = True
        self.recovered = marker
        self._info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                      "recipe": _name(manifest.get("recipe")), "target": _name(manifest.get("target")),
                      "mode": mode}
        self._write_marker()
        return manifest

    def write_manifest(self, manifest: dict) -> None:
        """Amending: rewrite manifest.json atomically now (every file it lists is already in place)."""
        if not self._amending:
            raise ValueError("manifest.json is written by finish(), after every file it lists")
        missing = [f["path"] for f in listed_files(manifest) if not (self.root / f["path"]).is_file()]
        if missing:
            raise ValueError(f"manifest lists files not in place: {', '.join(missing[:3])}")
        manifest["documents"] = document_records(self.root)
        self._write_document(MANIFEST, manifest)

    def finish(self, manifest: dict) -> None:
        """Remove files of older builds, write manifest.json (last, atomically), drop the marker."""
        self._claim()
        listed = {f["path"] for f in listed_files(manifest)}
        for rel in sorted(self._journal - listed - self._written):
            self._unlink(rel)
        for d in (self.root / REJECTED, self.root / "parity-inputs", self.root / "sources"):
            _rmdir_if_empty(d)
        _remove_empty_dirs(self.root / "hub")
        crash_point("pruned")
        _remove_tree(self.root / STAGING)
        _remove_tree(self.root / JOBS)
        crash_point("documents")
        manifest["documents"] = document_records(self.root)
        self._write_document(MANIFEST, manifest)
        _fsync_dir(self.root)
        crash_point("manifest")
        (self.root / MARKER).unlink(missing_ok=True)
        self._unlock()

    def abort(self) -> bool:
        """After a failed or interrupted run. Returns True when OUT stays marked incomplete: when the
        run had put files into OUT, or OUT held no complete build before it. An amending run leaves
        the build as its last manifest describes it (files it put but never listed are removed)."""
        try:
            _remove_tree(self.root / STAGING)
            if self._amending:
                manifest, state = self._previous_manifest()
                if state == "ours":
                    listed = {f["path"] for f in listed_files(manifest)}
                    for rel in sorted(self._journal - listed):
                        self._unlink(rel)
                    (self.root / MARKER).unlink(missing_ok=True)
                return self.incomplete
            if self._claimed or not self._had_build:
                return self.incomplete
            (self.root / MARKER).unlink(missing_ok=True)
            return False
        finally:
            self._unlock()

    @property
    def incomplete(self) -> bool:
        return (self.root / MARKER).exists()

    def rewrite_reports(self, manifest: dict, write) -> None:
        """`omni-export report` / `parity`: under the lock, `write(atomic_write_text)` puts new
        reports into a finished build, then manifest.json is rewritten with their hashes."""
        self._lock()
        try:
            if (self.root / MARKER).exists():
                raise UsageError(f"{self.root} holds an unfinished run (.incomplete); rerun the build")
            write(lambda name, text: atomic_write_text(self.root / self._relpath(self.root, name), text))
            manifest["documents"] = document_records(self.root)
            atomic_write_json(self.root / MANIFEST, manifest)
        finally:
            self._unlock()

    # ---- files
    def staging(self, name: str) -> Path:
        """A fresh directory for one artifact's files, inside OUT/.staging (never through a link)."""
        root = self.staging_root()
        d = root / _component(name)
        _remove_tree(d)
        d.mkdir()
        return d

    def staging_root(self) -> Path:
        """OUT/.staging as a real directory of OUT: a symlink there (to anywhere) is removed, never
        followed, and a fresh directory made in its place."""
        d = self.root / STAGING
        if d.is_symlink() or not d.is_dir():
            _remove_tree(d)
        d.mkdir(exist_ok=True)
        return d

    # ---- one writer per OUT
    def _lock(self) -> None:
        """An OS lock on OUT/.lock for the whole run (released by the kernel when the process dies):
        a second run into the same OUT stops at once with who holds it. A POSIX record lock (lockf),
        not flock: it belongs to this process, so the workers it forks or spawns never hold it on
        after it died, and a process that opens a build's store again (tests, `hub submit` after a
        build) does not lock itself out."""
        import fcntl

        if self._lock_fd is not None:
            return
        path = self.root / LOCK
        self._made_lock = not os.path.lexists(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise UsageError(f"{path} cannot be opened as the output directory's lock file ({e.strerror}); "
                             f"remove it or choose another --out") from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            held = self.read_marker() or {}
            pid, started = held.get("pid"), held.get("started")
            since = time.strftime(" since %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else ""
            who = f"pid {pid}{since}" if isinstance(pid, int) else "another process"
            raise UsageError(f"{self.root} is being built by another omni-export run ({who}); wait for it "
                             f"to finish or choose another --out") from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)            # closing the descriptor releases the lock
            self._lock_fd = None

    def commit(self, files: list[Path], accepted: bool) -> list[FileRecord]:
        """Move staged files into OUT (or OUT/rejected) by rename; return their records."""
        self._claim()
        dest_dir = self.root if accepted else self.root / REJECTED
        other = self.root / REJECTED if accepted else self.root
        records = []
        for f in files:
            f = Path(f)
            rec = FileRecord(self._relpath(dest_dir, f.name), sha256_file(f), f.stat().st_size)
            _plain_mode(f)                  # QNN writes DLCs 0640: every artifact alike
            self._place(rec.path, lambda dest, f=f: os.replace(f, dest))
            self._unlink(self._relpath(other, f.name))     # a build that moved between verdicts
            records.append(rec)
        return records

    def put_bytes(self, relpath: str, data: bytes) -> FileRecord:
        """Write a small listed file (e.g. parity-inputs/<component>.npz) atomically into OUT."""
        self._claim()
        parts = relpath.split("/")
        rel = self._relpath(self.root.joinpath(*parts[:-1]), parts[-1])
        self._place(rel, lambda dest: atomic_write_bytes(dest, data))
        return FileRecord(rel, hashlib.sha256(data).hexdigest(), len(data))

    def put_file(self, relpath: str, src: Path, move: bool = False) -> FileRecord:
        """Put a file into OUT atomically: renamed when `move` (src on the same file system, e.g.
        under .staging), else copied through a temporary name (a hard link when possible)."""
        self._claim()
        src = Path(src)
        parts = relpath.split("/")
        rel = self._relpath(self.root.joinpath(*parts[:-1]), parts[-1])
        rec = FileRecord(rel, sha256_file(src), src.stat().st_size)
        if move:
            _plain_mode(src)
        self._place(rel, lambda dest: os.replace(src, dest) if move else _atomic_copy(src, dest))
        return rec

    def remove(self, relpaths: list[str]) -> None:
        for p in relpaths:
            self._unlink(p)

    # ---- documents
    def read_manifest(self) -> dict | None:
        manifest, state = self._previous_manifest()
        return manifest if state == "ours" else None

    def read_marker(self) -> dict | None:
        p = self.root / MARKER
        if not p.exists():
            return None
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            data = None
        return data if isinstance(data, dict) else {"files": []}

    def write_json(self, name: str, obj) -> Path:
        return self.write_text(name, json.dumps(obj, indent=2) + "\n")

    def claim(self) -> None:
        """Before OUT changes in a way the store does not journal (the bundle directory, which the
        new manifest lists): the previous documents no longer describe OUT."""
        self._claim()

    def write_text(self, name: str, text: str) -> Path:
        if name == MANIFEST:
            raise ValueError("manifest.json is written by finish(), after every file it lists")
        self._claim()
        return self._write_document(name, text)

    # ---- internals
    def _write_document(self, name: str, content) -> Path:
        rel = self._relpath(self.root, name)
        text = content if isinstance(content, str) else json.dumps(strict_json(content), indent=2, allow_nan=False) + "\n"
        self._written.add(rel)
        atomic_write_text(self.root / rel, text)
        return self.root / rel

    def _claim(self) -> None:
        """Before the first file lands: the previous documents no longer describe OUT. (begin() has
        checked they are ours, unless --force asked to replace them.)"""
        if not self._claimed:
            for name in DOCUMENTS:
                (self.root / name).unlink(missing_ok=True)
            self._claimed = True

    def _place(self, rel: str, write) -> None:
        """Journal first, then write: a crash in between leaves a name the next run removes."""
        self._journal.add(rel)
        self._written.add(rel)
        self._write_marker()
        dest = self.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        crash_point("commit-before-rename")
        write(dest)
        crash_point("commit-after-rename")

    def _write_marker(self) -> None:
        atomic_write_json(self.root / MARKER, {**self._info, "files": sorted(self._journal),
                                               **({"finished": self._finished} if self._finished else {})})

    def record_finished(self, component: str, record: dict, entries: list[dict]) -> None:
        """A component's builds are all in OUT: note them in the marker, so a run killed later resumes
        without rebuilding them (resumable())."""
        self._finished[component] = {"record": record, "entries": entries}
        self._write_marker()

    def resumable(self) -> dict | None:
        """What a run that did not finish left done, as a previous manifest the build cache reads (its
        components finished in OUT, each with its record and build entries); None if nothing."""
        done = (self.recovered or {}).get("finished")
        if not isinstance(done, dict) or not done:
            return None
        comps, builds = {}, []
        for name, item in done.items():
            if isinstance(item, dict) and isinstance(item.get("record"), dict) and isinstance(item.get("entries"), list):
                comps[name] = item["record"]
                builds += [e for e in item["entries"] if isinstance(e, dict)]
        return {"tool": "omni-export", "recipe": {"name": self.recovered.get("recipe")},
                "target": {"name": self.recovered.get("target")}, "components": comps, "builds": builds,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.recovered.get("started") or 0)),
                "resumed": True} if comps else None

    def _relpath(self, directory: Path, name: str) -> str:
        """OUT-relative path of directory/name; refuses anything that would land outside OUT."""
        dest = Path(directory) / _component(name)
        root = self.root.resolve()
        parent = dest.parent.resolve()
        if parent != root and root not in parent.parents:
            raise UsageError(f"refusing to write {dest}: it resolves outside the output directory {root}")
        return (parent / dest.name).relative_to(root).as_posix()

    def _unlink(self, rel: str) -> None:
        try:
            p = self.root / self._relpath(self.root / Path(rel).parent, Path(rel).name)
        except (UsageError, ValueError):
            return                                   # a damaged journal entry: never act outside OUT
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)

    def _previous_manifest(self) -> tuple[dict | None, str]:
        p = self.root / MANIFEST
        if not p.exists():
            return None, "none"
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            return None, "corrupt"
        return (data, "ours") if is_ours(data) else (None, "foreign")

    def _check_owner(self, previous, state, crashed, recipe: str, target: str) -> None:
        where = f"{self.root}"
        if state == "corrupt":
            raise UsageError(f"{where}/manifest.json is not readable JSON; pass --force to replace that build "
                             f"or choose another --out")
        if state == "foreign":
            raise UsageError(f"{where}/manifest.json was not written by omni-export; choose another --out "
                             f"or pass --force")
        held = previous or crashed
        if held is not None:
            prev = (_name(held.get("recipe")), _name(held.get("target")))
            if prev != (recipe, target) and prev != (None, None):
                kind = "a build" if previous else "an unfinished build"
                raise UsageError(f"{where} holds {kind} of {prev[0]} for {prev[1]}; choose another --out or "
                                 f"pass --force to replace it")
            return
        others = sorted(e.name for e in self.root.iterdir() if not e.name.startswith(_SCRATCH_PREFIXES)
                        and not (e.name.startswith(".") and ".tmp-" in e.name))
        if others:
            raise UsageError(f"{where} is not empty and holds no omni-export build (found {others[0]}); "
                             f"choose a new or empty --out, or pass --force (omni-export never removes "
                             f"files it did not write)")

    def _check_scratch_names(self) -> None:
        """OUT has no build of ours, so whatever sits under the names omni-export keeps for its scratch
        files (.staging, .jobs) is someone else's: refused, even with --force, since a run empties them."""
        for name in (STAGING, JOBS):
            p = self.root / name
            if p.is_symlink() or not p.exists():
                continue                     # a link is replaced, never followed (staging_root)
            if not p.is_dir() or any(p.iterdir()):
                raise UsageError(f"{p} holds files omni-export did not write ({self.root} has no omni-export "
                                 f"build, and a run empties {name}); move them or choose another --out")

    def _release_refused(self) -> None:
        """A refused --out keeps nothing of this run: the lock file goes if this run made it."""
        if self._made_lock:
            (self.root / LOCK).unlink(missing_ok=True)
        self._unlock()

    def _check_writable(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"output directory {self.root} is not writable (it exists and is not a "
                             f"directory); choose another --out")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise UsageError(f"output directory {self.root} is not writable ({e.strerror}); "
                             f"choose another --out") from None

    def _remove_scratch(self) -> None:
        _remove_tree(self.root / STAGING)
        hub = self.root / "hub"
        hub_dirs = [p for p in hub.rglob("*") if p.is_dir() and not p.is_symlink()] if hub.is_dir() else []
        for d in (self.root, self.root / REJECTED, self.root / "parity-inputs", self.root / "sources", hub, *hub_dirs):
            if d.is_dir() and not d.is_symlink():
                for p in d.iterdir():
                    if p.name.startswith(".") and ".tmp-" in p.name and p.is_file():
                        p.unlink(missing_ok=True)      # a crashed atomic write


def _remove_tree(d: Path) -> None:
    """Remove a directory of OUT and what it holds; a symlink is removed itself, never followed."""
    if d.is_symlink() or (d.exists() and not d.is_dir()):
        d.unlink(missing_ok=True)
    else:
        shutil.rmtree(d, ignore_errors=True)


def link_or_copy(src: Path, dest: Path) -> None:
    """`dest` as a hard link of `src` where one is allowed, else a copy. ONNX external data (a
    graph's `<name>.onnx.data`) is always copied: onnx refuses to read external data through a file
    with more than one link ("potential hardlink attack"), so a linked one breaks every later
    `onnx.load` of the graph -- the QDQ quantizer's at 0.6B, or a user's of a bundled graph."""
    if not any(Path(p).name.endswith(".data") for p in (src, dest)):      # the store keeps it as f<i>
        try:
            os.link(src, dest)
            return
        except OSError:           # another file system, or links not allowed here
            pass
    shutil.copyfile(src, dest)


def _atomic_copy(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        link_or_copy(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _name(x) -> str | None:
    if isinstance(x, dict):
        x = x.get("name")
    return x if isinstance(x, str) else None


def _component(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UsageError(f"refusing to write {name!r}: an artifact name must be a plain file name")
    return name


def _remove_empty_dirs(d: Path) -> None:
    if d.is_dir() and not d.is_symlink():
        for sub in d.iterdir():
            _remove_empty_dirs(sub)
        _rmdir_if_empty(d)


def _rmdir_if_empty(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _refuse_live_run(root: Path, marker: dict) -> None:
    pid = marker.get("pid")
    if not isinstance(pid, int) or pid == os.getpid() or marker.get("host") != socket.gethostname():
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    except OSError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        cmdline = b"omni"
    if b"omni" not in cmdline:
        return                                         # the pid was reused by something else
    started = time.strftime("%H:%M:%S", time.localtime(marker.get("started") or 0))
    raise UsageError(f"{root} is being written by another omni-export run (pid {pid}, started {started}); "
                     f"wait for it to finish or choose another --out")


def interrupted_message(out: Path, signal_name: str = "SIGINT") -> str:
    """One line for a run stopped by a signal: what was interrupted and what OUT keeps."""
    out = Path(out)
    by = "interrupted" if signal_name == "SIGINT" else f"interrupted by {signal_name}"
    if not (out / MARKER).exists():
        return f"{by} before anything was written; {out} is as it was"
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        marker = {}
    done = marker.get("finished") if isinstance(marker, dict) else None
    done = sorted(done) if isinstance(done, dict) else []
    jobs = kept_jobs(out)
    also = f" and the outputs of {jobs} finished job{'s' if jobs != 1 else ''}" if jobs else ""
    if not done:
        if jobs:
            return f"{by}; {out} is marked incomplete (.incomplete); the next run keeps{also[4:]} and runs the rest"
        return f"{by}; {out} is marked incomplete (.incomplete) and the next run rebuilds it"
    return (f"{by}; {out} is marked incomplete (.incomplete); the next run keeps the finished "
            f"{', '.join(done)}{also} and rebuilds the rest")


def kept_jobs(out: Path) -> int:
    """How many finished jobs' outputs OUT/.jobs keeps for the next run (jobs/results.py)."""
    d = Path(out) / JOBS
    if d.is_symlink() or not d.is_dir():
        return 0
    return sum(1 for p in d.iterdir() if not p.name.startswith(".") and (p / "result.json").is_file())

"""Files to and from a job on another machine (the Ray executor): a job's arguments and result name
files by their absolute paths under the build's roots (OUT, the checkpoint); a node whose file system
does not hold them gets them by content hash, from Ray's object store or from a directory every node
can read and write (`--shared-dir`), written at the same paths before the job runs. The files the
job's result names (an intermediate graph, a lowered artifact) come back the same way and are put at
the driver's paths.

A file is named by (path, sha256, bytes, mtime_ns): a node that already holds it at that path with that
size and mtime (the same file system, or a copy made earlier) is not sent it again. A copy is written
beside its path under a temporary name and renamed into place, with the driver's mtime.

For the tests, OMNI_EXPORT_RAY_NODE_ROOT=DIR gives each node's workers a file system of their own:
every path under the roots is read and written under DIR/<node id>/ instead, as on a cluster whose
nodes share no file system (the job's arguments are mapped there, its result's paths mapped back).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

NODE_ROOT_ENV = "OMNI_EXPORT_RAY_NODE_ROOT"
_hashes: dict[tuple, str] = {}


def sha256_of(p: Path) -> str:
    st = p.stat()
    k = (str(p), st.st_size, st.st_mtime_ns)
    if k not in _hashes:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        _hashes[k] = h.hexdigest()
    return _hashes[k]


def record(p: Path) -> tuple[str, str, int, int]:
    st = p.stat()
    return str(p), sha256_of(p), st.st_size, st.st_mtime_ns


def map_paths(obj, fn):
    """`obj` with every str / Path value passed through fn(str) -> str | None (None: unchanged), inside
    tuples, lists, dicts and dataclasses (rebuilt with dataclasses.replace)."""
    if isinstance(obj, (str, Path)):
        new = fn(str(obj))
        return obj if new is None else type(obj)(new) if isinstance(obj, Path) else new
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(map_paths(x, fn) for x in obj)
    if isinstance(obj, list):
        return type(obj)(map_paths(x, fn) for x in obj) if type(obj) is list else _same_list(obj, fn)
    if isinstance(obj, dict):
        return {k: map_paths(v, fn) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: map_paths(getattr(obj, f.name), fn)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def _same_list(obj: list, fn):
    """A list subclass (runtime.pool.Outputs) keeps its class and attributes."""
    new = obj.__class__.__new__(obj.__class__)
    list.__init__(new, (map_paths(x, fn) for x in obj))
    new.__dict__.update(getattr(obj, "__dict__", {}))
    return new


def paths_in(obj, roots: tuple[str, ...]) -> list[Path]:
    """The existing files and directories `obj` names at or under `roots`."""
    found: list[Path] = []

    def see(s: str):
        if os.path.isabs(s) and any(s == r or s.startswith(r + os.sep) for r in roots) and os.path.exists(s):
            found.append(Path(s))

    map_paths(obj, lambda s: see(s))
    return found


def inputs_of(args, roots: tuple[str, ...], staging: str) -> list[tuple]:
    """The files a job's arguments name, each written whole by a job that has ended: a directory's
    files (the checkpoint, a trace's captured inputs), except OUT itself (roots[0]) and a component's
    work directory (OUT/.staging/work/<component>: other jobs may be writing into them now; a job is
    handed the paths it reads there), which are only made; an artifact's file with the other files of
    its staging directory (a context binary's .bin); any other file with what is saved beside it under
    its name (external data, a rounding report)."""
    files: dict[str, Path] = {}
    work = os.path.join(staging, "work")
    for p in paths_in(args, roots):
        if str(p) == roots[0] or str(p.parent) == work:
            continue
        if p.is_dir():
            group = [q for q in p.rglob("*") if q.is_file()]
        elif str(p).startswith(staging + os.sep) and not str(p).startswith(work + os.sep):
            group = [q for q in p.parent.iterdir() if q.is_file()]
        else:
            group = [q for q in p.parent.iterdir() if q.name == p.name or q.name.startswith(p.name + ".")]
        for q in group:
            files[str(q)] = q
    return [record(q) for q in sorted(files.values())]


def outputs_of(result, roots: tuple[str, ...]) -> list[tuple]:
    """The files a job's result names (with what is saved beside each under its name)."""
    files: dict[str, Path] = {}
    for p in paths_in(result, roots):
        if p.is_file():
            for q in p.parent.iterdir():
                if q.is_file() and (q.name == p.name or q.name.startswith(p.name + ".")):
                    files[str(q)] = q
    return [record(q) for q in sorted(files.values())]


def holds(path: Path, size: int, mtime_ns: int) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_size == size and st.st_mtime_ns == mtime_ns


def place(path: Path, write, mtime_ns: int) -> None:
    """Write `path` through a temporary name (write(tmp)), with the given mtime, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.ship-{os.getpid()}")
    try:
        write(tmp)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class SharedDir:
    """Files by content hash in a directory every node reads and writes (`--shared-dir`)."""

    def __init__(self, root: str):
        self.root = Path(root)

    def put(self, path: Path, sha: str) -> bool:
        """Keep `path` as <root>/<sha256> (a hard link when allowed: artifacts/store.link_or_copy); False: already there."""
        dest = self.root / sha
        if dest.is_file():
            return False

        def write(tmp):
            from ..artifacts.store import link_or_copy

            link_or_copy(path, tmp)

        place(dest, write, path.stat().st_mtime_ns)
        return True

    def get(self, sha: str, path: Path, mtime_ns: int) -> None:
        place(path, lambda tmp: shutil.copyfile(self.root / sha, tmp), mtime_ns)


def check_shared_dir(value: str) -> str:
    """--shared-dir: an existing directory this process can write (one line, exit 2, otherwise)."""
    from ..core import UsageError

    p = Path(value)
    if not p.is_dir():
        raise UsageError(f"--shared-dir {value}: not an existing directory (the path every Ray node reads "
                         f"and writes, mounted alike on each)")
    probe = p / f".write-test-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"--shared-dir {value}: not writable ({e.strerror})") from None
    return str(p.resolve())

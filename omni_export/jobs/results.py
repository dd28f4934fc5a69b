"""The job store: a finished worker job's outputs kept under its content key, so the same job run
again after a kill (SIGTERM, SIGKILL, a crash) is answered from them instead of run.

A job's key (`key()`) is a sha256 over the component's job key (artifacts/cache.BuildCache.job_base:
the checkpoint's content, the recipe and the options that shape the component, the target, the
toolchain versions and every numerics version), the job's id (component / kind / format /
precision), the keys of the jobs it depends on and what its binding chose (a slow runner's sample
indices): the same inputs give the same key, a changed input a new one all the way down.

Layout, inside OUT only: OUT/.jobs/<key>/result.json beside the job's files. A job's entry is made
whole in OUT/.jobs/.tmp-<key>-<pid>/ (files hard-linked, else copied; result.json last) and renamed
to its key in one step, so a half-written entry never counts; one whose files are missing or of
another size is ignored. Answering a job puts its files back at the OUT-relative paths the job wrote
them to (its staging directory, the component's work directory), so the jobs after it see what an
uninterrupted run shows them. The store is emptied when a run finishes, and by --force.

Kept: the intermediate graphs (fp32 ONNX export, fp16, quantized QDQ), a lowered artifact (ONNX,
DLC, context binary, .pte) with how to run it, and a scoring run's outputs (.npz, read without
pickles) -- but no graph with ONNX external data (`_external_data`). Not kept: the traces (they
hold the loaded model), precision repair, attribution and the end-to-end rows.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..artifacts.store import JOBS as STORE

VERSION = 1


def key(base: str, job_id: str, deps: list[str], extra=None, scoring: bool = False) -> str:
    from ..faults import NAN_ENV

    fault = os.environ.get(NAN_ENV) if scoring else None     # the tests' injected NaN outputs change a run's
    return hashlib.sha256(json.dumps([VERSION, base, job_id, deps, extra, *([fault] if fault else [])],
                                     sort_keys=True, default=str).encode()).hexdigest()


def _link(src: Path, dst: Path) -> None:
    from ..artifacts.store import link_or_copy

    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    link_or_copy(src, dst)


class JobStore:
    def __init__(self, out: Path):
        self.out = Path(out)
        self.root = self.out / STORE
        self.saved = self.answered = 0

    # ---- a finished job's outputs in
    def save(self, k: str, job_id: str, kind: str, result) -> bool:
        """Keep `result` (a job's return value) under `k`; False when it is not a kind kept here."""
        packed = _pack(kind, result, self.out)
        if packed is None:
            return False
        meta, files, arrays = packed
        if self.root.is_symlink() or (self.root.exists() and not self.root.is_dir()):
            self.root.unlink()                # a link there is removed, never followed out of OUT
        self.root.mkdir(exist_ok=True)
        final = self.root / k
        if final.is_dir():
            return True
        tmp = self.root / f".tmp-{k}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            listed = []
            for i, rel in enumerate(files):
                src = self.out / rel
                _link(src, tmp / f"f{i}")
                listed.append({"path": rel, "bytes": src.stat().st_size})
            if arrays is not None:
                import numpy as np

                np.savez(tmp / "arrays.npz", **arrays)
            (tmp / "result.json").write_text(json.dumps({"job": job_id, "kind": kind, "files": listed,
                                                             "result": meta}))
            os.rename(tmp, final)                  # whole, or not there
        except FileExistsError:
            shutil.rmtree(tmp, ignore_errors=True)          # another writer kept the same outputs
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.saved += 1
        return True

    # ---- a job answered from it
    def load(self, k: str):
        """The kept result of key `k`, its files back in place; None when there is none (or it is damaged)."""
        d = self.root / k
        if self.root.is_symlink():
            return None
        try:
            entry = json.loads((d / "result.json").read_text())
            files = entry["files"]
            for i, f in enumerate(files):
                if (d / f"f{i}").stat().st_size != f["bytes"]:
                    return None
            for i, f in enumerate(files):
                dest = (self.out / f["path"]).resolve()
                if self.out.resolve() not in dest.parents:
                    return None                                  # never outside OUT
                _link(d / f"f{i}", dest)
            arrays = None
            if (d / "arrays.npz").is_file():
                import numpy as np

                with np.load(d / "arrays.npz", allow_pickle=False) as z:
                    arrays = {n: z[n] for n in z.files}
            result = _unpack(entry["kind"], entry["result"], arrays, self.out)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.answered += 1
        return result

    def clear(self) -> None:
        if self.root.is_symlink():
            self.root.unlink()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------------- what a kind keeps

def _rel(path, out: Path) -> str:
    return Path(path).resolve().relative_to(out.resolve()).as_posix()


def _siblings(path: Path) -> list[Path]:
    """A graph's file and what is saved beside it under its name (external data, a rounding report)."""
    return sorted(p for p in path.parent.iterdir() if p.name == path.name or p.name.startswith(path.name + "."))


def _external_data(files: list[str]) -> bool:
    """Whether a job wrote a graph with ONNX external data (`<name>.onnx.data`: most graphs at 0.6B).
    Such a job is not kept: onnx refuses external data through a file with more than one link, so an
    entry could only copy it, gigabytes per graph (with copies, a resumed 0.6B build filled this
    machine's disk, its output directory at 62 GB). A resumed run exports those graphs again and
    takes their lowered context binaries, DLCs, .pte files and scores from here."""
    return any(str(f).endswith(".data") for f in files)


def _pack(kind: str, result, out: Path):
    """(JSON of the result, OUT-relative files, arrays) or None when the result is not one kept here."""
    from ..exporters.lower import Built
    from ..runtime.pool import Outputs

    try:
        if kind in ("export", "fp16", "quantize") and isinstance(result, dict) and "onnx" in result:
            files = [_rel(p, out) for v in result["onnx"].values() for p in _siblings(Path(v))]
            if _external_data(files):
                return None
            meta = {**result, "onnx": {k: _rel(v, out) for k, v in result["onnx"].items()}}
            return meta, sorted(set(files)), None
        if kind.startswith("lower") and isinstance(result, Built):
            if _external_data([str(f) for f in result.files]):
                return None
            spec = result.runner
            meta = {"files": [_rel(f, out) for f in result.files], "details": result.details,
                    "runner": {"kind": spec.kind, "model": _rel(spec.model, out), "input_names": list(spec.input_names),
                               "output_names": list(spec.output_names), "options": spec.options,
                               "result_key": spec.result_key}}
            json.dumps(meta, allow_nan=True)        # only what JSON keeps exactly
            return meta, meta["files"], None
        if kind in ("score", "score-htp") and isinstance(result, Outputs):
            arrays, names = {}, []
            for i, sample in enumerate(result):
                names.append(list(sample))
                arrays.update({f"{i}/{n}": v for n, v in sample.items()})
            return {"names": names, "wall_s": result.wall_s}, [], arrays
    except (ValueError, TypeError, OSError):
        return None
    return None


def _unpack(kind: str, meta: dict, arrays, out: Path):
    from ..exporters.lower import Built
    from ..runtime.pool import Outputs
    from ..runtime.runners import RunnerSpec

    if kind in ("export", "fp16", "quantize"):
        return {**meta, "onnx": {k: str(out / v) for k, v in meta["onnx"].items()}}
    if kind.startswith("lower"):
        r = meta["runner"]
        spec = RunnerSpec(r["kind"], str(out / r["model"]), tuple(r["input_names"]), tuple(r["output_names"]),
                          r["options"], r["result_key"])
        return Built([out / f for f in meta["files"]], spec, meta["details"])
    return Outputs([{n: arrays[f"{i}/{n}"] for n in names} for i, names in enumerate(meta["names"])],
                   wall_s=meta["wall_s"])

"""Build cache: a build whose inputs have not changed is reused, with its recorded scores.

Every build gets a content key: sha256 over
  - the recipe (name, version) and the component, format, precision and gate threshold;
  - the recipe options that shape this component (RecipeOption.affects), with any option naming a
    file (e.g. --calibration-codes) hashed by content;
  - the target (SoC, HTP arch, placement unit), the graph rewrites and the attribution mode;
  - the checkpoint: every file's sha256 (weights are re-hashed only when their size, mtime or
    inode changed since the previous build recorded them, so an unchanged 4 GB checkpoint costs a
    few stat calls), or, for the embedded demo and --random-weights, the seeded generator's
    identity;
  - the toolchain versions (torch, executorch, onnxruntime(-qnn), QNN, ...) and the versions of
    omni-export's own code that decide the build's output (omni_export/numerics.py, the recipe's and
    the component's versions): an edit that changes no output -- a docstring, the reports, the
    scheduler -- keeps every key, so a rebuild reuses every artifact and score.
The calibration set is not hashed directly: it is captured from the fp32 model's generations,
a deterministic function of the checkpoint, recipe version, options and seeds above (the parity
inputs are byte-stable; tests/test_reproducibility.py), so the key covers it by its causes. Its
sha256 is still recorded per component, and a reused component keeps the one it was built with.

A component is reused when every build planned for it has a recorded build with the same key and
every file those builds and the component list is in place at its recorded size (`omni-export
verify` checks the sha256s). End-to-end parity is reused when every component was. `--force`
rebuilds everything (and records the new keys). The manifest marks each build `cache: {key, hit, built}`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..core import RANDOM_WEIGHTS, variant_base
from .store import listed_files, sha256_file

KEY_VERSION = 2           # 2: numerics versions instead of a digest of omni-export's source
_SMALL = 64 << 20          # non-weight files up to this size are hashed; bigger ones by size + mtime


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def checkpoint_identity(recipe, checkpoint: Path | None, options: dict, previous: dict | None) -> dict:
    """What the weights are, without loading them: {"kind", "digest", "files"}. Weights the loader writes
    itself are keyed by the options the recipe says choose them (Recipe.demo_keys, random_weights_keys)."""
    if options.get(RANDOM_WEIGHTS):
        return {"kind": RANDOM_WEIGHTS, "digest": _digest([options.get(k) for k in recipe.random_weights_keys])}
    if checkpoint is None:
        return {"kind": "demo", "digest": _digest([options.get(k) for k in recipe.demo_keys])}
    known = {(f["path"], f["bytes"], f["mtime_ns"], f["inode"]): f["sha256"]
             for f in ((previous or {}).get("cache") or {}).get("checkpoint", {}).get("files", [])
             if isinstance(f, dict) and {"path", "bytes", "mtime_ns", "inode", "sha256"} <= f.keys()}
    files = []
    root = Path(checkpoint)
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        st = p.stat()                               # follows symlinks (Hugging Face cache blobs)
        rel = p.relative_to(root).as_posix()
        rec = {"path": rel, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
        sha = known.get((rel, st.st_size, st.st_mtime_ns, st.st_ino))
        if sha is None and (p.suffix == ".safetensors" or st.st_size <= _SMALL):
            sha = sha256_file(p)
        rec["sha256"] = sha                         # None: a big non-weight file, keyed by size + mtime
        files.append(rec)
    content = [(f["path"], f["sha256"] or (f["bytes"], f["mtime_ns"])) for f in files]
    return {"kind": "checkpoint", "digest": _digest(content), "files": files}


def _option_value(opt, value):
    """Option values as keyed: a value naming an existing file or directory is keyed by content."""
    if isinstance(value, str) and value and opt.type is str:
        p = Path(value)
        if p.is_file():
            return {"file": sha256_file(p)}
        if p.is_dir():
            return {"dir": [(q.relative_to(p).as_posix(), sha256_file(q)) for q in sorted(p.rglob("*")) if q.is_file()]}
    return value


class BuildCache:
    def __init__(self, opts, previous: dict | None, recipe_options: dict, rewrites, reuse: bool = True):
        from . import manifest as mf

        self.reuse = reuse                        # False (--force): keys are recorded, nothing is reused
        self.previous = previous if previous and previous.get("recipe", {}).get("name") == opts.recipe.name else None
        self.opts = opts
        self.options = recipe_options
        self.checkpoint = checkpoint_identity(opts.recipe, opts.checkpoint, recipe_options, self.previous)
        toolchain = {k: v for k, v in mf.toolchain().items() if k != "omni-export-git"}
        t = opts.target
        self.base = {"key_version": KEY_VERSION, "recipe": [opts.recipe.name, opts.recipe.version],
                     "checkpoint": self.checkpoint["digest"], "toolchain": toolchain,
                     "target": [t.name, t.soc, t.soc_model, t.htp_arch], "rewrites": list(rewrites),
                     "attribution": opts.attribution, "sim_samples": opts.sim_samples,
                     "htp_finalize": opts.htp_finalize, **({"keep_sources": True} if opts.keep_sources else {}),
                     "repair": [opts.repair, opts.repair_steps]}
        self.keys: dict[str, str] = {}            # component -> component key (this run)
        self.hits: set[str] = set()

    # ---- keys
    def _options_for(self, component: str | None) -> dict:
        out = {}
        for o in self.opts.recipe.options:
            affects = o.affects
            if component is None or affects is None or component in affects or variant_base(component) in affects:
                out[o.name] = _option_value(o, self.options.get(o.name))
        return out

    def component_key(self, component: str, builds, thresholds: dict) -> str:
        from ..numerics import for_build

        planned = sorted((b.format.value, b.precision.value, thresholds[b.precision],
                          sorted(for_build(b.format, b.precision).items())) for b in builds)
        key = _digest({**self.base, "component": component, "options": self._options_for(component),
                       "version": self.opts.recipe.component(component).version,
                       "placement": self.opts.target.place(component).unit, "builds": planned})
        self.keys[component] = key
        return key

    def job_base(self, component: str) -> str:
        """What every job of a component's graph depends on (the component key without its planned
        builds, with every numerics version): the root of its jobs' content keys (jobs/results.py)."""
        from ..numerics import VERSIONS

        return _digest({**self.base, "component": component, "options": self._options_for(component),
                        "version": self.opts.recipe.component(component).version,
                        "placement": self.opts.target.place(component).unit, "numerics": VERSIONS})

    def build_key(self, component_key: str, spec, threshold: float) -> str:
        return _digest([component_key, spec.format.value, spec.precision.value, threshold])

    def model_key(self) -> str:
        return _digest({**self.base, "options": self._options_for(None)})

    def e2e_key(self, e2e_runners) -> str:
        return _digest({"model": self.model_key(), "components": sorted(self.keys.items()), "runners": e2e_runners})

    # ---- lookups in the previous build
    def model_components(self) -> tuple[str, ...] | None:
        c = (self.previous or {}).get("cache") or {}
        if self.reuse and c.get("model_key") == self.model_key() and isinstance(c.get("model_components"), list):
            return tuple(c["model_components"])
        return None

    def reuse_component(self, component: str, builds, thresholds: dict, out: Path):
        """(component record, build entries) from the previous build, or None."""
        key = self.component_key(component, builds, thresholds)
        if not self.previous or not self.reuse:
            return None
        record = self.previous.get("components", {}).get(component)
        if not isinstance(record, dict) or (record.get("cache") or {}).get("key") != key:
            return None
        by_key = {(e.get("cache") or {}).get("key"): e for e in self.previous.get("builds", [])
                  if e.get("component") == component}
        entries = []
        for spec in builds:
            e = by_key.get(self.build_key(key, spec, thresholds[spec.precision]))
            if e is None:
                return None
            entries.append(e)
        entries += self._repaired(component, key, builds, thresholds)
        listed = listed_files({"components": {component: record}, "builds": entries})
        for f in listed:
            p = out / f["path"]
            if not p.is_file() or p.stat().st_size != f["bytes"]:
                return None
        self.hits.add(component)
        built = self.previous.get("created")
        record = {**record, "cache": {"key": key, "hit": True, "built": record["cache"].get("built", built)}}
        entries = [{**e, "cache": {**e["cache"], "hit": True, "built": e["cache"].get("built", built)}}
                   for e in entries]
        return record, entries

    def _repaired(self, component: str, key: str, builds, thresholds: dict) -> list[dict]:
        """The previous build's precision-repair results of this component (builds not planned but made
        from a rejected planned one) whose keys still hold."""
        from ..core import BuildSpec, Format, Precision

        out = []
        for e in self.previous.get("builds", []):
            if e.get("component") != component or not str(e.get("precision", "")).endswith("-mixed"):
                continue
            try:
                spec = BuildSpec(self.opts.recipe.name, component, Format(e["format"]), Precision(e["precision"]),
                                 self.opts.target.name)
            except (ValueError, KeyError):
                continue
            base = spec.precision.base
            if base in thresholds and (e.get("cache") or {}).get("key") == self.build_key(key, spec, thresholds[base]):
                out.append(e)
                thresholds.setdefault(spec.precision, thresholds[base])
        return out

    def stamp(self, component: str, record: dict, entries: list[dict], builds, thresholds: dict, created: str) -> None:
        key = self.keys.get(component) or self.component_key(component, builds, thresholds)
        record["cache"] = {"key": key, "hit": False, "built": created}
        by_spec = {(b.format.value, b.precision.value): b for b in builds}
        for e in entries:
            spec = by_spec[(e["format"], e["precision"])]
            e["cache"] = {"key": self.build_key(key, spec, thresholds[spec.precision]), "hit": False,
                          "built": created}

    def reuse_e2e(self, e2e_runners) -> list[dict] | None:
        c = (self.previous or {}).get("cache") or {}
        if self.previous is None or not self.reuse or set(self.keys) - self.hits:
            return None
        if c.get("e2e_key") == self.e2e_key(e2e_runners) and isinstance(self.previous.get("end_to_end"), list):
            return self.previous["end_to_end"]
        return None

    def summary(self, model_components, e2e_runners, e2e_reused: bool) -> dict:
        files = self.checkpoint.get("files")
        return {"key_version": KEY_VERSION, "reuse": self.reuse if self.reuse else "off (--force)",
                "reused_components": sorted(self.hits),
                "built_components": sorted(set(self.keys) - self.hits), "end_to_end_reused": e2e_reused,
                "model_key": self.model_key(), "model_components": list(model_components),
                "e2e_key": self.e2e_key(e2e_runners),
                "checkpoint": {"kind": self.checkpoint["kind"], "digest": self.checkpoint["digest"],
                               **({"files": files} if files is not None else {})}}

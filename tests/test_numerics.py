"""The build cache keys on numerics versions, not on omni-export's source (omni_export/numerics.py):
this test holds them honest. It fails when the demo's byte-stable artifacts (ONNX and .pte of the shared
fp16 build) change while no version that keys them was bumped. The parity inputs are not compared:
their fp32 references change with torch's thread count (one core per pytest-xdist worker, every core
in a lone run), not only with the code.

After a deliberate numerics change: bump the part(s) in numerics.VERSIONS (or the recipe's /
component's version), then rerun this file with OMNI_EXPORT_UPDATE_GOLDEN=1 and commit the golden."""
from __future__ import annotations

import json
import os

import pytest

from conftest import GOLDEN, read_manifest

PATH = GOLDEN / "numerics.json"
TOOLS = ("torch", "executorch", "onnx", "onnxruntime", "onnxruntime-qnn", "numpy")


def current(manifest: dict) -> dict:
    from omni_export.core import Format, Precision
    from omni_export.numerics import for_build

    files = {}
    for b in manifest["builds"]:
        if b["format"] in ("onnx", "pte"):
            versions = for_build(Format(b["format"]), Precision(b["precision"]))
            files[b["name"] + "." + b["format"]] = {"sha256": [f["sha256"] for f in b["files"]], "versions": versions}
    recipe = {"recipe": manifest["recipe"]["version"]}
    from omni_export.recipes import get_recipe

    recipe["components"] = {c: get_recipe(manifest["recipe"]["name"]).component(c).version for c in manifest["components"]}
    return {"toolchain": {k: manifest["toolchain"].get(k) for k in TOOLS}, "recipe": recipe, "files": files}


def test_outputs_change_only_with_a_numerics_version_bump(fp16_build):
    now = current(read_manifest(fp16_build))
    if os.environ.get("OMNI_EXPORT_UPDATE_GOLDEN") == "1":
        PATH.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    golden = json.loads(PATH.read_text())
    if golden["toolchain"] != now["toolchain"]:
        pytest.skip(f"the golden was recorded with {golden['toolchain']}; this toolchain differs: bytes may differ")
    changed = [name for name, f in now["files"].items() if golden["files"].get(name, {}).get("sha256") != f["sha256"]]
    unbumped = [name for name in changed if golden["files"].get(name, {}).get("versions") == now["files"][name]["versions"]
                and golden["recipe"] == now["recipe"]]
    assert not unbumped, (
        f"the bytes of {', '.join(unbumped)} changed but no version keying them was bumped: bump the part whose "
        f"code changed in omni_export/numerics.py (or the recipe's / component's version), then rerun with "
        f"OMNI_EXPORT_UPDATE_GOLDEN=1")
    assert not changed, (f"{', '.join(changed)} changed with a version bump: rerun with OMNI_EXPORT_UPDATE_GOLDEN=1 "
                         f"and commit tests/golden/numerics.json")
    assert now == golden, ("a numerics version or the set of builds changed: rerun with OMNI_EXPORT_UPDATE_GOLDEN=1 "
                           "and commit tests/golden/numerics.json")


def test_no_artifact_records_where_it_was_built(fp16_build):
    """torch's ONNX exporter writes each node's Python stack trace (this machine's source paths and line
    numbers); they are stripped, so an artifact neither leaks its build host's paths nor changes its
    bytes when a line of a model's module moves."""
    from conftest import ROOT

    for b in read_manifest(fp16_build)["builds"]:
        for f in b["files"]:
            assert str(ROOT).encode() not in (fp16_build / f["path"]).read_bytes(), f["path"]

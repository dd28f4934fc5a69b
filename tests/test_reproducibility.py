"""Two builds of the same inputs, in different output directories: the formats the manifest calls
byte-stable have identical sha256; for the others the manifest's `why` is checked against the bytes.

The second build runs its jobs on a Ray cluster of two raylets on this machine (loopback only, one CPU
each), the first on local worker processes: the same job graph on either executor gives the same
verdicts, scores and bytes (issue 33's Ray acceptance; tests/test_ray.py kills a Ray worker). Its nodes
share no file system with the build (jobs/ship.py's NODE_ROOT_ENV: each node's workers read and write
under a root of their own): every file a job reads or writes travels through --shared-dir."""
from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest

from conftest import ALL_FORMATS_FP16, FAST, read_manifest, run_cli
from omni_export.artifacts.reproducibility import BYTE_STABLE


@pytest.fixture(scope="module")
def second_build(tmp_path_factory, tiny_checkpoint, ray_cluster) -> Path:
    from omni_export.jobs.ship import NODE_ROOT_ENV

    root = tmp_path_factory.mktemp("second")
    out, shared = root / "elsewhere", root / "shared"
    shared.mkdir()
    # captured afresh (not read from the capture cache): the parity inputs' bytes must repeat
    run_cli(*ALL_FORMATS_FP16, "--checkpoint", str(tiny_checkpoint), "--out", str(out),
            "--executor", f"ray:{ray_cluster.address}", "--shared-dir", str(shared), check=True,
            env={"OMNI_EXPORT_CAPTURE_CACHE": "off", "OMNI_EXPORT_JOBS": "0", NODE_ROOT_ENV: str(root / "nodes")})
    return out


def test_a_build_on_a_two_node_ray_cluster_equals_the_local_one(fp16_build, second_build, ray_cluster):
    """Every build: the same verdict and the same scores on Ray as on the local executor's workers."""
    local, remote = read_manifest(fp16_build), read_manifest(second_build)
    assert local["jobs"]["executor"] == "local"
    assert remote["jobs"]["executor"] == f"ray:{ray_cluster.address}" and remote["jobs"]["workers"] == 2
    # every file a job read (checkpoint, inputs, graphs) went to its node, every artifact came back, by sha256
    shared = Path(remote["jobs"]["shared_dir"])
    files = remote["jobs"]["files"]
    assert shared == second_build.parent / "shared" and files["files_sent"] > 0 and files["files_back"] > 0
    assert {f["sha256"] for b in remote["builds"] for f in b["files"]} <= {p.name for p in shared.iterdir()}
    assert len(list((second_build.parent / "nodes").iterdir())) == 2           # both nodes ran jobs
    a = {(b["format"], b["precision"]): b for b in local["builds"]}
    b = {(b["format"], b["precision"]): b for b in remote["builds"]}
    assert set(a) == set(b) == {(f, "fp16") for f in ("onnx", "dlc", "ctx", "pte")}
    for k in b:
        assert b[k]["status"] == a[k]["status"] == "accepted", k
        assert b[k]["parity"]["outputs"] == a[k]["parity"]["outputs"], k


def files_by_format(m: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for b in m["builds"]:
        out.setdefault(b["format"], []).extend(b["files"])
    out["parity-inputs"] = [c["parity_inputs"] for c in m["components"].values()]
    return out


def test_manifest_records_seeds_and_byte_stability_per_format(fp16_build):
    m = read_manifest(fp16_build)
    from omni_export.recipes.qwen3_tts import prompts

    assert m["seeds"] == {"python_random": 0, "numpy_global": 0, "torch": 0, "demo_checkpoint": 0,
                          "calibration_generations": [1000 + i for i in range(len(prompts.CALIBRATION))],
                          "heldout_generations": "greedy",
                          "code2wav_calibration": "windows of the calibration generations"}
    assert set(m["reproducibility"]) == {"onnx", "dlc", "ctx", "pte", "parity-inputs"}
    for fmt, entry in m["reproducibility"].items():
        assert (entry["byte_stable"], entry["why"]) == BYTE_STABLE[fmt]


def test_byte_stable_formats_have_identical_sha256(fp16_build, second_build):
    assert {c["capture"]["cache"] for c in read_manifest(second_build)["components"].values()} == {"off"}
    a, b = files_by_format(read_manifest(fp16_build)), files_by_format(read_manifest(second_build))
    stable = [f for f, (ok, _) in BYTE_STABLE.items() if ok]
    assert set(stable) == {"onnx", "pte", "parity-inputs"}
    for fmt in stable:
        assert [(r["path"], r["sha256"]) for r in a[fmt]] == [(r["path"], r["sha256"]) for r in b[fmt]], fmt


def _stored_entries(path: Path) -> dict[str, bytes]:
    """A DLC is a zip of stored entries whose CRC fields are 0 (zipfile refuses to read them)."""
    data = path.read_bytes()
    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            h = info.header_offset
            name_len, extra_len = struct.unpack("<HH", data[h + 26:h + 30])
            start = h + 30 + name_len + extra_len
            out[info.filename] = data[start:start + info.file_size]
    return out


def _without_timestamps(obj):
    if isinstance(obj, dict):
        return {k: _without_timestamps(v) for k, v in obj.items() if k != "timestamp"}
    if isinstance(obj, list):
        return [_without_timestamps(v) for v in obj]
    return obj


def test_dlc_differs_only_in_its_build_time(fp16_build, second_build):
    name = "qwen3-tts-code2wav-fp16-s25-htp.dlc"
    a, b = _stored_entries(fp16_build / name), _stored_entries(second_build / name)
    assert a.keys() == b.keys() and {"model", "model.params", "model.params.bin"} <= a.keys()
    differing = sorted(k for k in a if a[k] != b[k])
    assert differing and all(k.startswith("dlc.metadata") for k in differing), differing
    for k in differing:
        ta, tb = json.loads(a[k]), json.loads(b[k])
        assert _without_timestamps(ta) == _without_timestamps(tb)
        assert ta["header"]["timestamp"] != tb["header"]["timestamp"]   # the builds were > 1 s apart


def test_context_binaries_differ_in_few_bytes_that_change_no_output(fp16_build, second_build):
    from omni_export.artifacts.reproducibility import read_parity_inputs
    from omni_export.runtime.runners import RunnerSpec, run_all

    stem = "qwen3-tts-code2wav-fp16-s25-htp.ctx"
    assert (fp16_build / f"{stem}.onnx").read_bytes() == (second_build / f"{stem}.onnx").read_bytes()
    a, b = (fp16_build / f"{stem}_qnn.bin").read_bytes(), (second_build / f"{stem}_qnn.bin").read_bytes()
    assert len(a) == len(b)
    differing = sum(x != y for x, y in zip(a, b))
    print(f"\n{stem}_qnn.bin: {differing} of {len(a)} bytes differ between two builds")
    assert differing <= len(a) // 50     # a handful of regions, not a different graph (34 B to 16 kB seen)
    m = read_manifest(fp16_build)
    inputs, _ = read_parity_inputs(fp16_build / "parity-inputs" / "code2wav.npz")
    inputs = inputs[-1:]                 # the full-context chunk; one sample keeps the simulator short
    runner = next(b for b in m["builds"] if b["format"] == "ctx")["parity"]["runner"]
    outs = [run_all(RunnerSpec("qnn-htp", str(d / f"{stem}.onnx"), ("codes", "frame_mask"), ("wav",),
                               runner["options"]), inputs) for d in (fp16_build, second_build)]
    for x, y in zip(*outs):
        assert x["wav"].tobytes() == y["wav"].tobytes()


def test_quantized_onnx_is_byte_stable(tmp_path, tiny_checkpoint):
    """Calibration (MinMax over the captured inputs) is deterministic: QDQ ONNX bytes repeat."""
    hashes, captures = [], []
    for d in ("a", "b"):
        out = tmp_path / d
        run_cli("qwen3-tts", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--formats", "onnx",
                "--precision", "w8a16", "--no-attribution", "--gate", "w8a16=0", "-q", *FAST, check=True)
        (b,) = read_manifest(out)["builds"]
        hashes.append(b["files"][0]["sha256"])
        captures.append(read_manifest(out)["components"]["code2wav"]["capture"])
    assert hashes[0] == hashes[1]
    # the second run read the inputs the first kept (or found), under the same key
    assert captures[0]["cache"] in ("stored", "hit") and captures[1] == {"cache": "hit", "key": captures[0]["key"]}

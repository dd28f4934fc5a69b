import json
import os
import stat

import pytest

from omni_export.artifacts.store import MARKER, Store, atomic_write_json, sha256_file
from omni_export.core import UsageError


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "m.json"
    atomic_write_json(p, {"a": 1})
    atomic_write_json(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert [f.name for f in tmp_path.iterdir()] == ["m.json"]   # no temp files left behind


def test_commit_moves_files_and_records_hashes(tmp_path):
    st = Store(tmp_path / "out")
    st.begin("r", "t", force=False)
    stage = st.staging("b1")
    f = stage / "x.onnx"
    f.write_bytes(b"abc")
    digest = sha256_file(f)
    (rec,) = st.commit([f], accepted=True)
    assert rec.path == "x.onnx" and rec.sha256 == digest and rec.bytes == 3
    assert (tmp_path / "out" / "x.onnx").read_bytes() == b"abc" and not f.exists()


def test_rejected_builds_go_under_rejected_and_leave_no_deployable_copy(tmp_path):
    st = Store(tmp_path / "out")
    st.begin("r", "t", force=False)
    a = st.staging("b") / "y.pte"
    a.write_bytes(b"1")
    st.commit([a], accepted=True)
    b = st.staging("b") / "y.pte"
    b.write_bytes(b"2")
    (rec,) = st.commit([b], accepted=False)
    assert rec.path == "rejected/y.pte"
    assert not (tmp_path / "out" / "y.pte").exists()


def test_marker_shows_an_unfinished_run(tmp_path):
    st = Store(tmp_path / "out")
    st.begin("r", "t", force=False)
    assert st.incomplete and (tmp_path / "out" / MARKER).exists()
    st.finish()
    assert not st.incomplete and not (tmp_path / "out" / ".staging").exists()


def test_refuses_another_recipes_build_without_force(tmp_path):
    st = Store(tmp_path / "out")
    st.begin("r1", "t", force=False)
    st.write_json("manifest.json", {"recipe": {"name": "r1"}, "target": {"name": "t"}})
    st.finish()
    with pytest.raises(UsageError, match="--force"):
        Store(tmp_path / "out").begin("r2", "t", force=False)
    Store(tmp_path / "out").begin("r2", "t", force=True)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_output_is_a_usage_error(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(UsageError, match="not writable"):
        Store(d / "out").begin("r", "t", force=False)


def test_output_path_that_is_a_file_is_a_usage_error(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="not writable"):
        Store(f).begin("r", "t", force=False)

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from omni_export.artifacts.store import MARKER, Store, atomic_write_json, is_disk_full, sha256_file
from omni_export.core import UsageError


def _manifest(recipe="r", target="t", files=()):
    return {"tool": "omni-export", "recipe": {"name": recipe}, "target": {"name": target},
            "builds": [{"files": [r.to_json() for r in files]}], "components": {}}


def _build(root, recipe="r", target="t", names=("x.onnx",), accepted=True, content=b"abc"):
    st = Store(root)
    st.begin(recipe, target, force=False)
    recs = []
    for n in names:
        f = st.staging(n) / n
        f.write_bytes(content)
        recs += st.commit([f], accepted=accepted)
    st.write_text("report.md", "r\n")
    st.finish(_manifest(recipe, target, recs))
    return recs


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
    assert "x.onnx" in json.loads((tmp_path / "out" / MARKER).read_text())["files"]   # journalled


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


def test_marker_shows_an_unfinished_run_and_finish_writes_the_manifest_last(tmp_path):
    out = tmp_path / "out"
    st = Store(out)
    st.begin("r", "t", force=False)
    assert st.incomplete and (out / MARKER).exists()
    f = st.staging("b") / "x.onnx"
    f.write_bytes(b"1")
    recs = st.commit([f], accepted=True)
    assert not (out / "manifest.json").exists()
    st.finish(_manifest(files=recs))
    assert not st.incomplete and not (out / ".staging").exists()
    assert json.loads((out / "manifest.json").read_text())["builds"][0]["files"][0]["path"] == "x.onnx"
    with pytest.raises(ValueError):
        st.write_json("manifest.json", {})          # only finish() writes it


def test_a_rerun_removes_the_old_manifest_before_its_first_file_lands(tmp_path):
    out = tmp_path / "out"
    _build(out, content=b"old")
    st = Store(out)
    st.begin("r", "t", force=False)
    assert (out / "manifest.json").exists()          # nothing written yet: the old build stands
    f = st.staging("b") / "x.onnx"
    f.write_bytes(b"new")
    st.commit([f], accepted=True)
    assert not (out / "manifest.json").exists() and not (out / "report.md").exists()
    assert st.incomplete


def test_abort_before_any_write_leaves_the_previous_build_as_it_was(tmp_path):
    out = tmp_path / "out"
    _build(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    st = Store(out)
    st.begin("r", "t", force=False)
    st.staging("b")
    assert st.abort() is False
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_abort_after_a_write_keeps_the_marker(tmp_path):
    out = tmp_path / "out"
    _build(out)
    st = Store(out)
    st.begin("r", "t", force=False)
    f = st.staging("b") / "x.onnx"
    f.write_bytes(b"n")
    st.commit([f], accepted=True)
    assert st.abort() is True and (out / MARKER).exists()


def test_files_of_older_builds_and_crashed_runs_are_removed_others_never(tmp_path):
    out = tmp_path / "out"
    _build(out, names=("a.onnx", "b.pte"))
    # a crashed run that wrote c.dlc (journalled) and never finished
    st = Store(out)
    st.begin("r", "t", force=False)
    f = st.staging("c") / "c.dlc"
    f.write_bytes(b"c")
    st.commit([f], accepted=True)
    (out / "notes.txt").write_text("the user's")
    # the next run builds only a.onnx
    recs = _build(out, names=("a.onnx",))
    assert sorted(p.name for p in out.iterdir()) == [".lock", "a.onnx", "manifest.json", "notes.txt", "report.md"]
    assert [r.path for r in recs] == ["a.onnx"]


def test_recovers_a_crashed_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"pid": 999999999, "files": ["x.onnx"]}))
    (out / "x.onnx").write_bytes(b"partial run")
    (out / ".manifest.json.tmp-12").write_text("{")
    st = Store(out)
    st.begin("r", "t", force=False)
    assert st.recovered is not None and not (out / ".manifest.json.tmp-12").exists()
    st.finish(_manifest())
    assert sorted(p.name for p in out.iterdir()) == [".lock", "manifest.json"]


def test_refuses_a_directory_another_live_run_is_writing(tmp_path):
    import socket
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "omni-export"])
    import time

    for _ in range(100):                                 # its command line is in place once it runs
        if b"omni-export" in Path(f"/proc/{other.pid}/cmdline").read_bytes():
            break
        time.sleep(0.05)
    try:
        (out / MARKER).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(), "files": []}))
        with pytest.raises(UsageError, match=f"being written by another omni-export run \\(pid {other.pid}"):
            Store(out).begin("r", "t", force=True)      # --force does not override a live run
    finally:
        other.kill()
        other.wait()
    Store(out).begin("r", "t", force=False)             # dead now: a crashed run, recovered
    (out / MARKER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "files": []}))
    Store(out).begin("r", "t", force=False)             # our own pid is never "another run"


def test_refuses_another_recipes_build_without_force(tmp_path):
    _build(tmp_path / "out", recipe="r1")
    with pytest.raises(UsageError, match="holds a build of r1 for t; choose another --out or pass --force"):
        Store(tmp_path / "out").begin("r2", "t", force=False)
    Store(tmp_path / "out").begin("r2", "t", force=True)


def test_refuses_a_foreign_non_empty_directory_without_force(tmp_path):
    d = tmp_path / "home"
    d.mkdir()
    (d / "thesis.tex").write_text("x")
    with pytest.raises(UsageError, match="is not empty and holds no omni-export build"):
        Store(d).begin("r", "t", force=False)
    (d / "manifest.json").write_text(json.dumps({"name": "my web app"}))
    with pytest.raises(UsageError, match="manifest.json was not written by omni-export"):
        Store(d).begin("r", "t", force=False)


def test_files_under_the_scratch_names_of_a_directory_with_no_build_survive_force(tmp_path):
    """.staging and .jobs are emptied by a run; in an OUT with no build of ours what sits there is someone
    else's, so even --force refuses (it removed .staging/keep.txt before), and a refused OUT keeps no .lock."""
    for name in (".staging", ".jobs"):
        d = tmp_path / name.strip(".")
        (d / name).mkdir(parents=True)
        (d / name / "keep.txt").write_text("mine")
        for force in (False, True):
            with pytest.raises(UsageError, match=f"{name} holds files omni-export did not write"):
                Store(d).begin("r", "t", force=force)
        assert (d / name / "keep.txt").read_text() == "mine"
        assert sorted(p.name for p in d.iterdir()) == [name]
    empty = tmp_path / "empty"
    (empty / ".staging").mkdir(parents=True)                   # an empty one is taken over
    Store(empty).begin("r", "t", force=False)


def test_refuses_writes_that_would_leave_out(tmp_path):
    st = Store(tmp_path / "out")
    st.begin("r", "t", force=False)
    f = tmp_path / "x.onnx"
    f.write_bytes(b"1")
    for bad in ("../x.onnx", "a/b.onnx", "..", ""):
        with pytest.raises(UsageError, match="plain file name"):
            st.staging(bad)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out" / "rejected").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="resolves outside the output directory"):
        st.commit([f], accepted=False)
    assert list(elsewhere.iterdir()) == [] and f.exists()
    with pytest.raises(UsageError, match="resolves outside"):
        st.put_bytes("rejected/p.npz", b"1")


def test_a_damaged_journal_never_removes_files_outside_out(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"pid": 1, "files": ["../victim.txt", str(victim)]}))
    st = Store(out)
    st.begin("r", "t", force=False)
    st.finish(_manifest())
    assert victim.read_text() == "keep me"


def test_disk_full_is_recognised_through_wrappers():
    inner = OSError(errno.ENOSPC, "No space left on device")
    try:
        try:
            raise inner
        except OSError as e:
            raise RuntimeError("export failed") from e
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert is_disk_full(RuntimeError("write failed: No space left on device"))
    assert not is_disk_full(RuntimeError("shape mismatch"))


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
    with pytest.raises(UsageError, match="not writable"):
        Store(f / "out").begin("r", "t", force=False)


def test_an_unreadable_manifest_in_out_needs_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"tool": "omni-')
    with pytest.raises(UsageError) as e:
        Store(out).begin("r", "t", force=False)
    assert str(e.value) == (f"{out}/manifest.json is not readable JSON; pass --force to replace that build or "
                            f"choose another --out")
    Store(out).begin("r", "t", force=True)


# --------------------------------------------------------------- amending a finished build (AI Hub)

def test_amend_adds_files_and_rewrites_the_manifest_only_over_files_in_place(tmp_path):
    out = tmp_path / "out"
    (x,) = _build(out)
    st = Store(out)
    m = st.amend("hub")
    assert json.loads((out / MARKER).read_text())["mode"] == "hub" and (out / "manifest.json").exists()
    rec = st.put_bytes("hub/b/profile.json", b"{}")
    m["builds"][0]["hub"] = {"files": [{**rec.to_json(), "kind": "profile"}]}
    st.write_manifest(m)                                        # listed file in place: written now
    assert json.loads((out / "manifest.json").read_text())["builds"][0]["hub"]["files"][0]["path"] == "hub/b/profile.json"
    m["builds"][0]["hub"]["files"].append({"path": "hub/b/missing.npz", "sha256": "0" * 64, "bytes": 1})
    with pytest.raises(ValueError, match="not in place: hub/b/missing.npz"):
        st.write_manifest(m)
    m["builds"][0]["hub"]["files"].pop()
    st.finish(m)
    assert not (out / MARKER).exists() and (out / "x.onnx").exists() and (out / "hub/b/profile.json").exists()


def test_an_aborted_amend_removes_only_what_it_put_and_never_listed(tmp_path):
    out = tmp_path / "out"
    _build(out)
    st = Store(out)
    st.amend("hub")
    st.put_bytes("hub/b/outputs.npz", b"1")                     # put, but the manifest never named it
    assert st.abort() is False
    assert not (out / "hub/b/outputs.npz").exists() and not (out / MARKER).exists()
    assert (out / "x.onnx").exists() and (out / "manifest.json").exists() and (out / "report.md").exists()


def test_amend_takes_over_a_killed_amend_and_refuses_an_unfinished_build(tmp_path):
    out = tmp_path / "out"
    _build(out)
    st = Store(out)
    st.amend("hub")
    st.put_bytes("hub/b/outputs.npz", b"1")
    marker = json.loads((out / MARKER).read_text())
    (out / MARKER).write_text(json.dumps({**marker, "pid": 999999999}))     # the process was killed
    again = Store(out)
    m = again.amend("hub")
    assert again.recovered["mode"] == "hub"
    again.finish(m)                                              # its unlisted file is removed
    assert not (out / "hub/b/outputs.npz").exists() and not (out / "hub").exists()
    Store(out).begin("r", "t", force=False)                      # a build run starts (and dies)
    with pytest.raises(UsageError, match="holds an unfinished build"):
        Store(out).amend("hub")

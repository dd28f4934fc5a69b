"""Damaged and hostile manifests read by `report`, `parity`, `diff`, `synth --build` and `hub submit`
(issue 34, item 5 and the containment of item 1): each is exit 2 with one line naming the file and
what is wrong, or runs as usual (exit 0, or 3 for a failed gate or a regression), never a
traceback, never a file read or changed outside the output directory, and report.md / report.html
keep their structure whatever strings the manifest holds.

One real build (text_projection, ONNX fp16 on the tiny checkpoint: a manifest with a build file,
a source ONNX and parity inputs) is made once; every test works on a copy. The commands run
in this process through click's runner; a decoy directory beside the copy is hashed before and
after each run.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import traceback
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli

BUILD = ["qwen3-tts", "--target", "s25-htp", "--formats", "onnx", "--precision", "fp16",
         "--components", "text_projection", "--no-attribution", "--keep-sources", "-q"]
ONNX = "qwen3-tts-text_projection-fp16-s25-htp.onnx"
SOURCE = "sources/qwen3-tts-text_projection-fp32-s25-htp.onnx"
ERROR = "omni-export: error: "
FAKE_HUB_NOTICE = "omni-export: using the FAKE Qualcomm AI Hub"       # printed first by a run on tests/fake_hub.py
# what report.md / report.html must never grow from a manifest's strings
CRAFTED = ["a`b``c", "x | y | z", "line\n## injected heading", "<img src=x onerror=alert(1)>",
           "[click](https://evil.example)", "![i](https://evil.example/i.png)", "\\|", "`", "|",
           "</td></tr></table><script>alert(1)</script>", "\x1b[31mred\x1b[0m", "a\r\nb", "\u202eevil"]


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def small_build(tmp_path_factory, tiny_checkpoint) -> Path:
    out = tmp_path_factory.mktemp("manifest-mutations") / "build"
    run_cli(*BUILD, "--checkpoint", str(tiny_checkpoint), "--out", str(out), check=True)
    return out


@pytest.fixture(scope="module")
def base(small_build) -> dict:
    return json.loads((small_build / "manifest.json").read_text())


def _decoy(root: Path) -> Path:
    """Files a hostile manifest would point at: outside every OUT of the test."""
    d = root / "decoy"
    (d / "samples").mkdir(parents=True, exist_ok=True)
    (d / "secret.onnx").write_bytes(b"not yours")
    (d / "samples" / "x.wav").write_bytes(b"RIFF....WAVE")
    (d / "report.md").write_text("decoy report\n")
    return d


def _digest(d: Path) -> str:
    """Names, kinds and bytes of everything under d (symlinks as their targets, not followed)."""
    h = hashlib.sha256()
    for p in sorted(d.rglob("*")):
        h.update(str(p.relative_to(d)).encode())
        if p.is_symlink():
            h.update(b"L" + os.readlink(p).encode())
        elif p.is_file():
            h.update(b"F" + p.read_bytes())
        else:
            h.update(b"D")
    return h.hexdigest()


@pytest.fixture
def out(tmp_path, small_build) -> Path:
    dest = tmp_path / "out"
    shutil.copytree(small_build, dest, symlinks=True)
    return dest


@pytest.fixture
def decoy(tmp_path) -> Path:
    return _decoy(tmp_path)


def cli(*args):
    from click.testing import CliRunner

    from omni_export.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def outcome(r, exit: int | None = None, allowed=(0, 2)) -> str:
    """The run's one error line ("" when it succeeded); fails on a traceback, an exit code other than
    `exit` (or outside `allowed`), or an error that is not exactly one `omni-export: error:` line on
    stderr."""
    allowed = allowed if exit is None else (exit,)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError("".join(traceback.format_exception(r.exception)))
    assert "Traceback" not in r.output
    assert r.exit_code in allowed, (r.exit_code, r.output[-2000:])
    if r.exit_code != 2:
        return ""
    lines = [x for x in r.stderr.splitlines() if not x.startswith(FAKE_HUB_NOTICE)]
    assert len(lines) == 1 and lines[0].startswith(ERROR), r.stderr
    return lines[0][len(ERROR):]


def write(out: Path, m) -> None:
    (out / "manifest.json").write_text(m if isinstance(m, str) else json.dumps(m, indent=2))


def readers(out: Path, pristine: Path):
    """Every reading command on OUT, as (name, click result); synth stops at the manifest when it is
    damaged (before any model loads), so it only runs where the manifest is expected to be refused."""
    yield "report", cli("report", out)
    yield "parity", cli("parity", out)
    yield "diff", cli("diff", pristine, out)


def synth(out: Path):
    return cli("synth", "qwen3-tts", "--build", out, "--runner", "ort", "--text", "Hi.", "--wav", out.parent / "x.wav")


def all_refuse(out: Path, pristine: Path, *fragments: str, exit: int = 2) -> str:
    """report, parity, diff and synth --build each exit 2 with one line holding every fragment."""
    lines = []
    for name, r in [*readers(out, pristine), ("synth --build", synth(out))]:
        line = outcome(r, exit=exit)
        for f in fragments:
            assert f in line, (name, line)
        lines.append(line)
    return lines[0]


# ------------------------------------------------------------------------------------- plain cases

def test_the_real_manifest_validates_and_every_reader_accepts_it(out, small_build):
    from omni_export.artifacts.manifest import read_manifest, schema_error

    assert schema_error(json.loads((out / "manifest.json").read_text())) is None
    assert read_manifest(out)["builds"][0]["files"][0]["path"] == ONNX
    for name, r in readers(out, small_build):
        assert outcome(r, exit=0) == "", name


def test_a_truncated_manifest_is_named_with_its_line_and_column(out, small_build):
    text = (small_build / "manifest.json").read_text()
    write(out, text[: len(text) // 2])
    line = all_refuse(out, small_build, "manifest.json: not valid JSON at line ", " column ", "truncated?", exit=2)
    assert re.search(r"at line \d+ column \d+: ", line), line
    write(out, text[:-2])                     # cut after the last value: the closing braces missing
    assert "(the text ends early: truncated?)" in outcome(cli("report", out), exit=2)
    write(out, "{\n")
    assert outcome(cli("parity", out), exit=2) == (f"{out}/manifest.json: not valid JSON at line 2 column 1: Expecting "
                                                   f"property name enclosed in double quotes (the text ends early: "
                                                   f"truncated?)")


def test_a_missing_key_is_named_at_its_json_path(out, small_build, base):
    m = copy.deepcopy(base)
    del m["builds"][0]["files"][0]["sha256"]
    write(out, m)
    all_refuse(out, small_build, f"{out}/manifest.json: builds[0].files[0]: the key \"sha256\" is missing", exit=2)
    m = copy.deepcopy(base)
    del m["timings"]
    write(out, m)
    assert outcome(cli("report", out), exit=2).endswith("manifest.json: the key \"timings\" is missing")


def test_a_value_of_the_wrong_type_is_named_at_its_json_path(out, small_build, base):
    m = copy.deepcopy(base)
    m["builds"][0]["files"][0]["sha256"] = 12
    write(out, m)
    all_refuse(out, small_build, "manifest.json: builds[0].files[0].sha256: 12 is not of type 'string'", exit=2)
    m = copy.deepcopy(base)
    m["builds"][0]["parity"]["runner"] = ["not", "a", "runner"]
    write(out, m)
    assert "builds[0].parity.runner: an array of 3 is not of type 'object' or 'null'" in outcome(
        cli("parity", out), exit=2)
    m = copy.deepcopy(base)
    m["components"]["text_projection"]["heldout"]["count"] = "four"
    write(out, m)
    assert "components.text_projection.heldout.count: 'four' is not of type 'integer'" in outcome(
        cli("report", out), exit=2)


def test_a_path_leaving_out_through_dotdot_is_refused_by_every_reader(out, small_build, base, decoy):
    before = _digest(decoy)
    m = copy.deepcopy(base)
    m["builds"][0]["files"][0]["path"] = "../decoy/secret.onnx"
    write(out, m)
    all_refuse(out, small_build, "manifest.json: builds[0].files[0].path '../decoy/secret.onnx' leaves the "
                                 "output directory; a manifest lists files inside its output directory", exit=2)
    m = copy.deepcopy(base)
    m["components"]["text_projection"]["sources"]["fp32"]["path"] = "sources/../../decoy/secret.onnx"
    write(out, m)
    assert "components.text_projection.sources.fp32.path 'sources/../../decoy/secret.onnx' leaves the output " \
           "directory" in outcome(cli("report", out), exit=2)
    assert _digest(decoy) == before


def test_an_absolute_path_is_refused_by_every_reader(out, small_build, base, decoy):
    m = copy.deepcopy(base)
    m["components"]["text_projection"]["parity_inputs"]["path"] = str(decoy / "secret.onnx")
    write(out, m)
    all_refuse(out, small_build, f"components.text_projection.parity_inputs.path '{decoy}/secret.onnx' is an "
                                 f"absolute path", exit=2)


def test_a_symlink_inside_out_pointing_out_is_refused(out, small_build, decoy):
    before = _digest(decoy)
    (out / ONNX).unlink()
    (out / ONNX).symlink_to(decoy / "secret.onnx")
    all_refuse(out, small_build, f"builds[0].files[0].path '{ONNX}' is a symlink to {decoy}/secret.onnx, outside "
                                 f"the output directory", exit=2)
    (out / ONNX).unlink()
    shutil.copy(small_build / ONNX, out / ONNX)
    shutil.rmtree(out / "sources")
    (out / "sources").symlink_to(decoy, target_is_directory=True)      # a directory leading out
    line = outcome(cli("parity", out), exit=2)
    assert f"'{SOURCE}' leaves the output directory through a symlink" in line
    assert _digest(decoy) == before


def test_hub_submit_refuses_a_hostile_manifest_before_touching_out(out, base, decoy, hub_env):
    m = copy.deepcopy(base)
    m["components"]["text_projection"]["sources"]["fp32"]["path"] = "../decoy/secret.onnx"
    write(out, m)
    before, decoy_before = (out / "manifest.json").read_bytes(), _digest(decoy)
    line = outcome(cli("hub", "submit", out, "--timeout", "0"), exit=2)
    assert "components.text_projection.sources.fp32.path '../decoy/secret.onnx' leaves the output directory" in line
    assert (out / "manifest.json").read_bytes() == before and not (out / ".incomplete").exists()
    assert _digest(decoy) == decoy_before
    write(out, json.dumps(base)[:999])
    assert "not valid JSON at line 1 column" in outcome(cli("hub", "submit", out, "--timeout", "0"), exit=2)
    assert "not valid JSON at line 1 column" in outcome(cli("hub", "status", out), exit=2)


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """The fake AI Hub service (tests/fake_hub.py) with a token, as tests/test_hub.py sets it up."""
    import fake_hub

    token = "sentinel-TOKEN-mutations"
    state = tmp_path / "fake-hub"
    fake_hub.write_scenario(state, tokens=[token])
    ini = tmp_path / "client.ini"
    ini.write_text(f"[api]\napi_token = {token}\napi_url = {fake_hub.WEB}\nweb_url = {fake_hub.WEB}\nverbose = False\n")
    for k, v in {"QAIHUB_CLIENT_INI": str(ini), fake_hub.STATE_ENV: str(state), "OMNI_EXPORT_FAKE_HUB": "fake_hub"}.items():
        monkeypatch.setenv(k, v)


def test_other_damage_is_named(out, base):
    text = json.dumps(base, indent=2)
    write(out, text.replace('"tool": "omni-export",', '"tool": "omni-export", "tool": "omni-export",', 1))
    assert outcome(cli("report", out), exit=2).endswith(
        'manifest.json: the key "tool" appears twice in one object (which one holds?)')
    (out / "manifest.json").write_bytes(text.encode()[:500] + b"\xff\xfe" + text.encode()[500:])
    assert "manifest.json: not UTF-8 text (byte 500); the file is damaged" in outcome(cli("report", out), exit=2)
    write(out, "[" * 100_000)
    assert outcome(cli("report", out), exit=2).endswith("manifest.json: nested too deeply to be a manifest")
    write(out, {"tool": "something-else"})
    assert "is not an omni-export manifest with schema_version 1" in outcome(cli("diff", out, out), exit=2)
    m = copy.deepcopy(base)
    m["builds"][0]["parity"]["threshold_db"] = float("nan")                    # bare NaN: not JSON
    write(out, m)
    assert "builds[0].parity.threshold_db: 'nan' is not of type 'number'" in outcome(cli("parity", out), exit=2)


def test_a_manifest_that_is_a_fifo_or_a_device_is_refused_without_reading(out):
    (out / "manifest.json").unlink()
    os.mkfifo(out / "manifest.json")
    assert outcome(cli("report", out), exit=2) == f"manifest {out}/manifest.json is not a regular file"
    (out / "manifest.json").unlink()
    (out / "manifest.json").symlink_to("/dev/zero")
    assert outcome(cli("diff", out, out), exit=2) == f"manifest {out}/manifest.json is not a regular file"


def test_an_older_manifest_with_bare_infinity_is_read(out, base):
    """Manifests written before the strict-JSON change hold bare Infinity / NaN for dB values: they
    are read as the words the writer uses now."""
    m = copy.deepcopy(base)
    m["components"]["text_projection"]["rewrites"][0]["fp32_snr_db"] = float("inf")
    m["builds"][0]["parity"]["outputs"][0]["psnr_db"] = float("inf")
    write(out, m)
    assert "Infinity" in (out / "manifest.json").read_text()
    assert outcome(cli("report", out), exit=0) == ""
    assert outcome(cli("parity", out), exit=0) == ""


def test_a_damaged_regating_record_in_parity_json_is_named(out):
    assert outcome(cli("parity", out, "--gate", "fp16=30"), exit=0) == ""
    doc = json.loads((out / "parity.json").read_text())
    doc["regated"]["gates_db"] = {"fp16": "thirty"}
    (out / "parity.json").write_text(json.dumps(doc))
    line = outcome(cli("report", out), exit=2)
    assert line.endswith(f"parity.json: its \"regated\" record is damaged (gates_db must map precisions to dB, "
                         f"fail_under_db a number or null); `omni-export parity {out}` rewrites it")
    assert outcome(cli("parity", out), exit=0) == ""               # which rewrites it
    assert outcome(cli("report", out), exit=0) == ""


# ------------------------------------------------------------------------------------ crafted strings

def _table_rows_keep_their_cells(text: str) -> None:
    """Every table row of report.md has its header's number of cells (a pipe in a value is escaped)."""
    cells = lambda line: len(re.findall(r"(?<!\\)\|", re.sub(r"\\\\", "", line)))      # noqa: E731
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = cells(line)
        else:
            assert cells(line) == header, line


def _markdown_has_no_markup_from(text: str) -> None:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or []}
    assert not kinds & {"html_inline", "html_block", "link_open", "image"}, kinds
    assert sum(t.type == "heading_open" for t in tokens) == 1
    _table_rows_keep_their_cells(text)


def test_crafted_strings_cannot_break_out_of_report_md_or_report_html(out, base):
    evil = "x`y | z\n## injected <img src=x onerror=alert(1)> [a](https://evil.example) \\"
    m = copy.deepcopy(base)
    m["checkpoint"]["label"] = evil
    m["checkpoint"]["path"] = "/ck`` | </code>\n- item"
    m["host"]["hostname"] = evil
    m["toolchain"]["qnn"] = evil
    m["builds"][0]["parity"]["runner"]["short"] = evil
    m["builds"][0]["parity"]["runner"]["label"] = evil
    m["skipped"] = [{"component": "text_projection", "format": "dlc", "precision": "fp16", "reason": evil}]
    m["end_to_end"] = [{"runner": evil, "precision": "fp16", "verdict": "skipped", "reason": evil}]
    write(out, m)
    assert outcome(cli("report", out), exit=0) == ""
    text = (out / "report.md").read_text()
    _markdown_has_no_markup_from(text)
    assert "\n## injected" not in text and "<img" not in text.replace("\\<img", "")
    assert "`/ck`` | </code> - item`" in text                  # a code span fenced past its backticks
    html = (out / "report.html").read_text()
    assert "<img src=x" not in html and "</code>\n- item" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


@pytest.mark.parametrize("value", CRAFTED)
def test_md_keeps_any_string_in_its_cell_or_code_span(value):
    from markdown_it import MarkdownIt

    from omni_export.reports.markdown import md

    text = f"| a | b |\n|---|---|\n| {md(value)} | b |\n\n- {md(value, code=True)} tail\n"
    assert len(text.splitlines()) == 5
    _markdown_has_no_markup_from("# t\n\n" + text)
    cell, item = [t for t in MarkdownIt("commonmark").enable("table").parse(text) if t.type == "inline"][2::2]
    plain = "".join(" " if not c.isprintable() else c for c in value.replace("\u202e", ""))
    assert "".join(c.content for c in cell.children) == plain.strip()              # the cell shows the value
    assert [(c.type, c.content) for c in item.children] == [("code_inline", plain), ("text", " tail")]


# ------------------------------------------------------------------------------------ property test

HOSTILE_PATHS = ["../../etc/passwd", "/tmp/x", "../decoy/secret.onnx", "{decoy}/secret.onnx",
                 "sources/../../decoy/secret.onnx", "link-out.onnx", "linkdir/secret.onnx", "", ".", "..",
                 "a\x00b", f"{ONNX}/../../decoy/samples/x.wav", "samples/../../decoy/report.md"]
ODD_VALUES = [None, True, 0, -1, 2 ** 70, 1.5, float("nan"), float("inf"), "", "x", [], {}, [{}], {"path": 1}]


def _nodes(obj, path=()):
    yield path, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _nodes(v, (*path, k))


def _set(m, path, value=None, delete=False):
    try:
        for k in path[:-1]:
            m = m[k]
        if delete:
            del m[path[-1]]
        else:
            m[path[-1]] = value
    except (KeyError, IndexError, TypeError):      # an earlier mutation took the path away
        pass


@st.composite
def mutated(draw, base: dict, decoy: Path) -> str:
    """The manifest's text after one mutation (sometimes two)."""
    nodes = [p for p, _ in _nodes(base) if p]
    keys = [p for p in nodes if isinstance(p[-1], str)]
    strings = [p for p, v in _nodes(base) if p and isinstance(v, str)]
    paths = [p for p in strings if p[-1] == "path"]
    numbers = [p for p, v in _nodes(base) if p and isinstance(v, (int, float)) and not isinstance(v, bool)]
    m = copy.deepcopy(base)
    rnd = draw(st.randoms(use_true_random=True))      # uniform over the manifest (no bias to its head)
    pick = rnd.choice
    for _ in range(rnd.choice([1, 1, 2])):
        kind = pick(["delete", "retype", "path", "crafted", "nan", "truncate", "bytes", "twice"])
        if kind == "delete":
            _set(m, pick(keys), delete=True)
        elif kind == "retype":
            _set(m, pick(nodes), draw(st.sampled_from(ODD_VALUES) | st.text(max_size=8)))
        elif kind == "path":
            where = pick(paths) if draw(st.booleans()) else pick(strings)
            _set(m, where, draw(st.sampled_from(HOSTILE_PATHS)).format(decoy=decoy))
        elif kind == "crafted":
            _set(m, pick(strings), draw(st.sampled_from(CRAFTED) | st.text(max_size=12)))
        elif kind == "nan":
            _set(m, pick(numbers), draw(st.sampled_from([float("nan"), float("inf"), -float("inf")])))
        else:
            try:
                text = json.dumps(m, indent=2)
            except ValueError:
                continue
            if kind == "truncate":
                return text[:rnd.randrange(len(text))]
            if kind == "twice":
                return text.replace('"builds": [', '"builds": [], "builds": [', 1)
            at = rnd.randrange(len(text))
            return text[:at] + draw(st.sampled_from(["\x00", "\ufffd", "\\ud800", '"', "}", "NaN", "1e999", "\n"])) + text[at:]
    return json.dumps(m, indent=2)


@pytest.fixture(scope="module")
def arena(tmp_path_factory, small_build):
    """A scratch directory for the property test: OUT copies, the decoy beside them, the pristine
    build as diff's A (read-only)."""
    root = tmp_path_factory.mktemp("arena")
    return root, _decoy(root)


def test_any_mutation_of_a_real_manifest_is_read_or_refused_in_one_line(arena, small_build, base):
    root, decoy = arena
    pristine = _digest(small_build)

    @settings(max_examples=int(os.environ.get("OMNI_EXPORT_FUZZ_EXAMPLES", "100")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
    @given(text=mutated(base, decoy))
    def check(text):
        out = root / "out"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(small_build, out, symlinks=True)
        (out / "link-out.onnx").symlink_to(decoy / "secret.onnx")
        (out / "linkdir").symlink_to(decoy, target_is_directory=True)
        (out / "manifest.json").write_text(text, errors="surrogatepass")
        before, around = _digest(decoy), sorted(p.name for p in root.iterdir())
        for name, r in readers(out, small_build):
            line = outcome(r, allowed=(0, 2) if name == "report" else (0, 2, 3))
            if name == "report" and not line:
                _markdown_has_no_markup_from((out / "report.md").read_text())
                assert "<img src=x" not in (out / "report.html").read_text()
        assert _digest(decoy) == before, "a file outside OUT changed"
        assert sorted(p.name for p in root.iterdir()) == around, "a file appeared beside OUT"

    check()
    assert _digest(small_build) == pristine


def test_every_cut_of_a_manifest_text_is_called_truncated():
    """Wherever a manifest is cut -- inside a string, a number, `true` / `false` / `null`, between values --
    the one-line error says the text ends early. At 257976f a cut at the half of the demo's manifest
    fell inside a literal, and the reason lost its "truncated?"."""
    from omni_export.artifacts.manifest import parse_manifest
    from omni_export.core import UsageError

    text = json.dumps({"a": [True, False, None, -1.5e-3, 12, "x y"], "b": {"c": -7, "d": 0.25, "e": "zz"}}, indent=1)
    for k in range(1, len(text) - 1):
        with pytest.raises(UsageError) as e:
            parse_manifest(text[:k].encode(), "m.json")
        assert str(e.value).endswith("(the text ends early: truncated?)"), (text[:k], str(e.value))

"""AI Hub link jobs (Recipe.links) against the fake service: Spark's prefill and decode DLCs linked
into one context binary with shared weights, each graph of it profiled and scored on the device."""
from __future__ import annotations

import json

import pytest

import fake_hub
from conftest import read_manifest
from test_hub import TOKEN, cli, scenario  # noqa: F401  (fixtures below reuse test_hub's)
from test_hub import hub  # noqa: F401

FAST = ["--prefill-tokens", "8", "--context-length", "32", "--e2e-tokens", "0"]
LINK = "link:prefill+decode/fp16"


@pytest.fixture(scope="module")
def spark_dlc(tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("spark_link") / "out"
    run_cli("spark", "--target", "s25-htp", "--out", str(out), "-p", "fp16", "-f", "dlc", "--no-attribution",
            "--keep-sources", "-q", *FAST, check=True)
    return out


@pytest.fixture
def out(tmp_path, spark_dlc):
    import shutil

    dest = tmp_path / "out"
    shutil.copytree(spark_dlc, dest)
    return dest


def _jobs(hub, kind):
    return [j for j in fake_hub.jobs(hub["state"]).values() if j["kind"] == kind]


def test_prefill_and_decode_dlcs_are_linked_and_each_graph_profiled(hub, out):
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 0, r.output
    m = read_manifest(out)
    builds = {f"{b['component']}/{b['format']}/{b['precision']}": b for b in m["builds"]}
    compiled = {k: next(s for s in b["hub"]["steps"] if s["kind"] == "compile") for k, b in builds.items()}
    # the members' DLCs carry their graph names (as qai_hub's submit_compile_and_link_jobs does)
    for comp in ("prefill", "decode"):
        assert f"--qnn_options context_enable_graphs={comp}" in compiled[f"{comp}/dlc/fp16"]["options"]
    links = _jobs(hub, "link")
    assert len(links) == 1
    assert links[0]["models"] == [compiled["prefill/dlc/fp16"]["target_model"],
                                  compiled["decode/dlc/fp16"]["target_model"]]
    rec = m["hub"]["links"][LINK]
    assert rec["state"] == "done"
    assert [s["kind"] for s in rec["steps"]] == ["link", "inference prefill", "inference decode"]
    link_step = rec["steps"][0]
    assert link_step["id"] == links[0]["id"] and link_step["target_model"] == links[0]["target"]
    # one inference job per graph on the linked binary, the graph selected, profiled
    infs = [j for j in _jobs(hub, "inference") if j["model"] == links[0]["target"]]
    assert sorted(j["opts"]["--qnn_options"] for j in infs) == ["context_enable_graphs=decode",
                                                               "context_enable_graphs=prefill"]
    assert all(j["profile"] for j in infs)
    for g in ("prefill", "decode"):
        graph = rec["graphs"][g]
        assert graph["profile"]["inference_ms"] > 0 and graph["profile"]["layers"] > 0
        assert graph["parity"]["verdict"] == "accepted", graph["parity"]["reason"]
    files = {f["kind"]: f for f in rec["files"]}
    assert {"linked_model", "profile prefill", "profile decode"} <= set(files)
    header = json.loads((out / files["linked_model"]["path"]).read_bytes().split(b"\n")[1])
    assert header["graphs"] == ["decode", "prefill"] and header["runtime"] == "qnn_context_binary"
    s = m["hub"]["summary"]["links"][LINK]
    assert s["state"] == "done" and set(s["graphs"]) == {"prefill", "decode"}
    assert all(g["min_snr_db"] >= 40 and g["verdict"] == "accepted" for g in s["graphs"].values())
    assert LINK in (out / "report.md").read_text()
    import jsonschema

    from test_hub import SCHEMAS
    jsonschema.validate(json.loads((out / "parity.json").read_text()),
                        json.loads((SCHEMAS / "parity.schema.json").read_text()))
    jsonschema.validate(m, json.loads((SCHEMAS / "manifest.schema.json").read_text()))
    # a rerun submits nothing again
    before = len(fake_hub.calls(hub["state"], "create_link_job"))
    assert cli("hub", "submit", str(out)).exit_code == 0
    assert len(fake_hub.calls(hub["state"], "create_link_job")) == before


def test_a_failed_link_job_is_recorded_and_resubmit_retries_it(hub, out):
    scenario(hub, rules=[{"match": {"type": "link"}, "fail": "graph exceeds the HTP context size limit"}])
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 0                              # every graph has a device-accepted build
    assert f"{LINK}: FAILED" in r.stdout
    rec = read_manifest(out)["hub"]["links"][LINK]
    assert rec["state"] == "failed"
    assert rec["steps"][0]["message"] == "graph exceeds the HTP context size limit"
    assert not rec["graphs"] and len(rec["steps"]) == 1                 # no inference on a failed link
    scenario(hub)
    assert cli("hub", "submit", str(out), "--resubmit").exit_code == 0
    rec = read_manifest(out)["hub"]["links"][LINK]
    assert rec["state"] == "done" and rec["history"][0]["steps"][0]["state"] == "failed"
    assert len(_jobs(hub, "link")) == 2


def test_a_link_waits_for_its_members_and_fails_when_one_cannot_compile(hub, out):
    scenario(hub, rules=[{"match": {"type": "compile", "name": "*decode*dlc*"}, "fail": "out of memory"}])
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 3
    rec = read_manifest(out)["hub"]["links"][LINK]
    assert rec["state"] == "failed" and rec["steps"][0]["id"] is None
    assert "the compile job of decode/dlc/fp16 failed" in rec["steps"][0]["message"]
    assert not _jobs(hub, "link")


def test_a_linked_graph_under_the_gate_on_the_device_is_rejected(hub, out):
    scenario(hub, rules=[{"match": {"type": "inference", "name": "*link*"}, "perturb_snr_db": 10}])
    r = cli("hub", "submit", str(out))
    assert r.exit_code == 3
    rec = read_manifest(out)["hub"]["links"][LINK]
    assert {g: r["parity"]["verdict"] for g, r in rec["graphs"].items()} == {"prefill": "rejected",
                                                                            "decode": "rejected"}
    assert "under the gate on the device" in r.stdout


def test_every_link_group_names_components_of_its_recipe():
    from omni_export.recipes import REGISTRY, get_recipe

    groups = [(name, g) for name in REGISTRY for g in get_recipe(name).links]
    assert ("spark", "prefill+decode") in [(n, g.name) for n, g in groups]
    for name, g in groups:
        comps = {c.name for c in get_recipe(name).components}
        assert len(g.components) >= 2 and set(g.components) <= comps, (name, g)


def test_link_plan_leaves_out_a_group_with_a_member_missing():
    from omni_export.core import LinkGroup
    from omni_export.hub.routes import Route, link_plan

    r = Route("prefill/dlc/w8a16", "n", "prefill", "dlc", "w8a16", "qnn_dlc", "npu", "w8a16", graph="prefill")
    routes, left = link_plan([r], (LinkGroup("prefill+decode", ("prefill", "decode")),))
    assert routes == [] and left[0]["key"] == "link:prefill+decode/w8a16"
    assert "decode/dlc/w8a16" in left[0]["reason"]


def test_a_split_talker_links_each_half_and_not_the_whole():
    """--talker-parts 2: each half's prefill and decode DLCs link into one context binary; the
    whole-talker group has no member built and is left out without a complaint."""
    from omni_export.hub.routes import Route, link_plan
    from omni_export.recipes import get_recipe

    routes = [Route(f"{c}/dlc/fp16", "n", c, "dlc", "fp16", "qnn_dlc", "npu", "fp32", graph=c)
              for c in ("talker_prefill_part1", "talker_decode_part1", "talker_prefill_part2", "talker_decode_part2")]
    links, left = link_plan(routes, get_recipe("qwen3-tts").links)
    assert sorted(lr.key for lr in links) == ["link:talker_part1/fp16", "link:talker_part2/fp16"]
    assert left == []
    assert {lr.key: lr.graphs for lr in links}["link:talker_part2/fp16"] == ("talker_prefill_part2", "talker_decode_part2")

"""Precision repair's parts without a build (the build itself: tests/test_pipeline.py's repair test)."""
import pytest

from omni_export.core import Precision, UsageError
from omni_export.jobs import repair as rp


def test_a_repaired_precision_keeps_its_base_gate_and_is_never_asked_for():
    m = Precision.W8A16_MIXED
    assert m.quantized and m.mixed and m.base == Precision.W8A16 and Precision.W8A16.repaired() == m
    assert not Precision.W8A16.mixed and Precision.FP16.base == Precision.FP16
    assert Precision.parse("w8a16") == Precision.W8A16
    with pytest.raises(UsageError, match="not built on request: precision repair"):
        Precision.parse("w8a16-mixed")
    assert all(not p.mixed for p in Precision.requestable()) and len(Precision.requestable()) == 5


def test_blocks_are_kept_worst_first_failures_before_any_score():
    rows = [{"block": "a", "snr_db": 40.0}, {"block": "b", "snr_db": 12.5}, {"block": "c", "snr_db": None,
            "error": "refused"}, {"block": "d", "snr_db": 30.0, "finite": False}, {"block": "e", "snr_db": 25.0},
            {"block": "*", "snr_db": None, "error": "whole job failed"}]
    assert [rows[i]["block"] for i in rp.block_order(rows)] == ["c", "d", "b", "e", "a"]


def test_the_share_still_quantized_counts_every_integer_width_and_no_float():
    assert rp.integer_share({"8": 0.25, "16": 0.5, "32": 0.25}) == 0.75
    assert rp.integer_share({"8": 0.5, "16": 0.25, "fp16": 0.25}) == 0.75      # fp16: kept in float
    assert rp.integer_share({"4": 0.6, "8": 0.4}) == 1.0
    assert rp.integer_share({}) is None


def test_the_search_runs_where_the_rejected_build_was_judged():
    from omni_export.core import BuildSpec, Format

    def b(f, p=Precision.W8A16):
        return BuildSpec("qwen3-tts", "code2wav", f, p, "s25-htp")

    assert rp.search_primary([b(Format.ONNX), b(Format.CTX)], Precision.W8A16, True) == Format.CTX
    assert rp.search_primary([b(Format.ONNX), b(Format.CTX)], Precision.W8A16, False) == Format.ONNX
    assert rp.search_primary([b(Format.PTE)], Precision.W8A16, True) is None
    rejected = [{"precision": "w8a16", "format": "ctx", "status": "rejected"}]
    failed = [{"precision": "w8a16", "format": "ctx", "status": "rejected", "error": "lowering failed: ..."}]
    assert rp.wants_repair(rejected, Precision.W8A16, Format.CTX)
    assert not rp.wants_repair(failed, Precision.W8A16, Format.CTX)        # diagnosed, not repaired
    assert not rp.wants_repair(rejected, Precision.W8A16, Format.ONNX)


def test_a_repaired_build_goes_to_ai_hub_as_built_with_options_its_compile_parser_takes(tmp_path):
    """AI Hub never re-quantizes a repaired build (its float islands live in its QDQ graph), even with
    quantize_on="hub"; its compile options pass the fake hub's parser of AI Hub's documented options."""
    import fake_hub

    from omni_export.hub.routes import plan
    from omni_export.targets import get_target

    build = {"component": "code2wav", "format": "ctx", "precision": "w8a16-mixed", "status": "accepted",
             "name": "qwen3-tts-code2wav-w8a16-mixed-s25-htp"}
    plain = {**build, "precision": "w8a16", "name": "qwen3-tts-code2wav-w8a16-s25-htp"}
    src = {"path": "sources/x.onnx", "sha256": "0" * 64}
    manifest = {"builds": [build, plain], "components": {"code2wav": {"sources": {
        "w8a16-mixed": src, "w8a16": src, "fp32": src}}}}
    routes, left = plan(manifest, get_target("s25-htp"), quantize_on="hub")
    by = {r.precision: r for r in routes}
    assert not left and by["w8a16-mixed"].upload == "w8a16-mixed" and by["w8a16-mixed"].quantize is None
    assert by["w8a16"].upload == "fp32" and by["w8a16"].quantize == ("INT8", "INT16")
    assert "precision repair" in by["w8a16-mixed"].quantized_by
    server = fake_hub.Server(tmp_path)
    qairt = next(f["api_version"] for f in server.scenario["frameworks"])
    opts = server._options(by["w8a16-mixed"].compile_options(qairt), fake_hub.COMPILE_OPTIONS)
    assert opts["--target_runtime"] == "qnn_context_binary" and "--quantize_full_type" not in opts


def test_attribution_records_blocks_on_read_only_inputs_without_a_warning():
    """The held-out inputs attribution reads are memory-mapped, read only: torch warned on stderr on
    every 0.6B build ('The given NumPy array is not writable')."""
    import warnings

    import numpy as np
    import torch

    from omni_export.blocks import Block, BlockChain

    class Double(Block):
        def forward(self, x):
            return x * 2

    chain = BlockChain(["x"], ["y"], [("double", Double().named(["x"], ["y"]))])
    x = np.arange(4, dtype=np.float32)
    x.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = chain.record({"x": x})
    assert [r[0] for r in rows] == ["double"] and torch.equal(rows[0][3]["y"], torch.arange(4.0) * 2)
    assert not x.flags.writeable and x[1] == 1          # the caller's array is untouched


class _Layers:
    """A tiny transformer-like graph: each layer of a module list makes one output (a layer's new key),
    a final norm the last one."""

    @staticmethod
    def export(path):
        import torch
        from torch import nn

        from omni_export.exporters.onnx import export

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
                self.norm = nn.LayerNorm(8)

            def forward(self, x):
                keys = []
                for layer in self.layers:
                    x = layer(x)
                    keys.append(x * 2.0)
                return (self.norm(x), *keys)

        names = ["hidden", "new_key_0", "new_key_1", "new_key_2"]
        program = torch.export.export(Net().eval(), (torch.randn(1, 4, 8),))
        return export(program, path, ["x"], names)


def test_outputs_map_to_the_module_list_element_that_makes_them_and_its_nodes(tmp_path):
    from omni_export.exporters.onnx import block_nodes, output_scopes, scope_nodes

    src = _Layers.export(tmp_path / "net.onnx")
    assert output_scopes(src) == {"hidden": "norm", "new_key_0": "layers.0", "new_key_1": "layers.1",
                                  "new_key_2": "layers.2"}
    nested, top = scope_nodes(src), block_nodes(src)
    assert set(top) <= set(nested) and all(nested[b] == top[b] for b in top)     # the first level: block_nodes'
    assert nested["layers.1"] and not set(nested["layers.1"]) & set(nested["layers.2"])


def test_a_heavy_graph_without_a_block_chain_is_repaired_by_its_rejected_outputs(tmp_path):
    """Past HEAVY_BYTES, a graph that is not a BlockChain has no per-block attribution (the 0.6B talker
    prefill): its rejected build's per-output scores rank the modules that make them. Its linears are
    per tensor: the first step quantizes them per output channel with nothing in float; the next step
    keeps in float the modules the estimate from step 1's own scores needs, per channel still; a step
    whose scores no set of modules can lift stops the search with the estimate."""
    from omni_export.core import BuildSpec, Format
    from omni_export.jobs.component import HEAVY_BYTES, ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from synthetic import stub_run

    src = _Layers.export(tmp_path / "net.onnx")

    specs = [BuildSpec("qwen3-tts", "talker_prefill", Format.CTX, Precision.W8A16, "s25-htp")]
    g = JobGraph()
    cj = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g)
    cj.plan()
    cj.info = {"block_chain": False, "weight_bytes": HEAVY_BYTES}
    cj.states["talker_prefill/export"] = {"onnx": {"fp32": str(src)}}
    outs = [{"name": "hidden", "snr_db": 41.0}, {"name": "new_key_0", "snr_db": 35.0},
            {"name": "new_key_1", "snr_db": 26.4}, {"name": "new_key_2", "snr_db": 31.0}]
    cj.entries[0] = {"component": "talker_prefill", "format": "ctx", "precision": "w8a16", "status": "rejected",
                     "parity": {"outputs": outs}}
    # the simulator scores 2 of 4 held-out samples: the steps run on those the ONNX build scored worst
    cj.slow, cj.per_sample["w8a16"] = [0, 3], [(None, 40.0), (None, 25.0), (None, 38.0), (None, 27.0)]
    assert cj._maybe_repair()
    search = cj.repair["w8a16"]
    assert search["ranked_by"] == "outputs" and search["runner"] == "qnn-htp"
    # graph order layers.0..2, norm; layers.1 adds nearly all the noise of the worst output, layers.2
    # and the norm none (their outputs are cleaner than layers.1's)
    assert search["outputs"][:2] == [{"block": "layers.0", "snr_db": 35.0, "outputs": ["new_key_0"]},
                                     {"block": "layers.1", "snr_db": 26.4, "outputs": ["new_key_1"]}]
    assert search["order"] == ["layers.1", "layers.0", "layers.2", "norm"]
    assert search["estimate"]["worst"] == "layers.1" and not search["estimate"]["futile"]
    step = g.jobs["talker_prefill/repair/w8a16/1"]
    assert step.label == "talker_prefill: repair w8a16, step 1: linears per output channel" and search["per_channel"]
    g.jobs["talker_prefill/export"].result = {"onnx": {"fp32": str(src)}}
    args = step.bind(g.jobs)[1]
    assert args[3] == [] and args[7] is True              # no module raised, linears per channel
    assert args[-1] is None                               # compiled at the run's --htp-optimization
    assert args[6] == [1, 3] and search["_indices"] == [1, 3]
    assert step.memory > 0                                # a heavy graph's step holds its estimate on the memory gate
    assert "attribute" not in " ".join(g.jobs)            # no per-block attribution was asked for

    import numpy as np

    names = ["hidden", "new_key_0", "new_key_1", "new_key_2"]
    refs = [{n: np.random.default_rng(i).standard_normal((1, 4, 8)).astype(np.float32) for n in names}
            for i in range(2)]
    cj.info.update({"output_names": names, "logits": ()})
    cj._heldout = lambda samples: (refs, None)

    def finish(job, keys_db, weight_bits=None):
        """The step ran: its outputs are the fp32 references scaled so each output scores keys_db."""
        outs = [{n: (r * (1 + 10 ** (-keys_db.get(n, 80.0) / 20))).astype(np.float32) for n, r in sample.items()}
                for sample in refs]
        job.state, job.started, job.ended = "done", 1.0, 2.0
        job.result = {"outputs": outs, "weight_bits": weight_bits or {"8": 1.0}, "kept_nodes": 0}
        job.done(job)

    # step 1 (per channel): new_key_1 still 27 dB; layers.0 and layers.1 add the noise
    finish(step, {"new_key_0": 33.0, "new_key_1": 27.0, "new_key_2": 27.0, "hidden": 27.0})
    assert search["steps"][0]["kept_float"] == [] and search["steps"][0]["scheme"] == "linears per output channel"
    step2 = g.jobs["talker_prefill/repair/w8a16/2"]
    assert step2.bind(g.jobs)[1][3] == ["layers.1"] and step2.bind(g.jobs)[1][7:9] == (True, "int16")
    assert "step 2: layers.1 at 16-bit weights (linears per channel)" in step2.label
    assert search["estimates"][0]["after_step"] == 1 and not search["estimates"][0]["futile"]
    # step 2 passes: the result says what it kept and its scheme
    finish(step2, {}, {"8": 0.75, "16": 0.25})
    assert search["result"]["weights_16bit"] == ["layers.1"] and search["result"]["kept_float"] == []
    assert search["result"]["integer_share"] == 1.0 and search["result"]["base_share"] == 0.75
    assert search["result"]["scheme"] == "linears per output channel"

    # the same search whose step 2 passes only with every weight raised to 16 bits: no w8a16-mixed build
    g4 = JobGraph()
    wide = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g4)
    wide.plan()
    wide.info, wide.entries, wide.states, wide._heldout = cj.info, cj.entries, cj.states, cj._heldout
    wide.slow, wide.per_sample = cj.slow, cj.per_sample
    assert wide._maybe_repair()
    g4.jobs["talker_prefill/export"].result = {"onnx": {"fp32": str(src)}}
    finish(g4.jobs["talker_prefill/repair/w8a16/1"], {"new_key_0": 33.0, "new_key_1": 27.0, "new_key_2": 27.0,
                                                      "hidden": 27.0})
    finish(g4.jobs["talker_prefill/repair/w8a16/2"], {}, {"16": 1.0})
    w = wide.repair["w8a16"]
    assert w["result"] is None and w["steps"][1]["verdict"] == "accepted" and w["steps"][1]["base_share"] == 0
    assert w["stopped"] == ("step 2 passes only with every weight at 16 bits (layers.1): no weight left at 8 bits, "
                            "not a w8a16 build")

    # a step whose simulator process died every time (a native crash) at QNN's fast graph preparation
    # (--htp-optimization 1, the default): the same step runs again at QNN's default preparation (2), and
    # so does every later step; a death there too stops the search
    from omni_export.exporters.qnn_diagnose import FALLBACK_FINALIZE
    from omni_export.jobs.errors import WorkerDied

    def crashed_search():
        g5 = JobGraph()
        crash = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g5)
        crash.plan()
        crash.info, crash.entries, crash.states, crash._heldout = cj.info, cj.entries, cj.states, cj._heldout
        crash.slow, crash.per_sample = cj.slow, cj.per_sample
        assert crash._maybe_repair() and str(crash.run.opts.htp_finalize) == "1"
        g5.jobs["talker_prefill/export"].result = {"onnx": {"fp32": str(src)}}
        dead = g5.jobs["talker_prefill/repair/w8a16/1"]
        dead.state, dead.started, dead.ended, dead.error = "failed", 1.0, 2.0, WorkerDied("its worker process died 2 times")
        dead.done(dead)
        c = crash.repair["w8a16"]
        again = g5.jobs["talker_prefill/repair/w8a16/1/htp-optimization-2"]
        assert FALLBACK_FINALIZE == "2" and again.label.endswith("(--htp-optimization 2)")
        assert again.bind(g5.jobs)[1][3] == [] and again.bind(g5.jobs)[1][-1] == "2"
        assert c["steps"] == [] and "stopped" not in c and c["htp_optimization_why"].startswith("step 1 crashed")
        return g5, crash, c, again

    g5, crash, c, again = crashed_search()
    again.state, again.started, again.ended, again.error = "failed", 3.0, 4.0, WorkerDied("its worker process died 2 times")
    again.done(again)
    assert c["result"] is None and c["steps"][0]["error"] == "WorkerDied: its worker process died 2 times"
    assert c["steps"][0]["htp_optimization"] == "2" and c["stopped"] == f"step 1 failed: {c['steps'][0]['error']}"
    # the step at mode 2 runs: its row says the mode, and the next step compiles at it too
    g6, crash, c, again = crashed_search()
    finish(again, {"new_key_0": 33.0, "new_key_1": 27.0, "new_key_2": 27.0, "hidden": 27.0})
    assert c["steps"][0]["htp_optimization"] == "2" and c["steps"][0]["verdict"] == "rejected"
    nxt = g6.jobs["talker_prefill/repair/w8a16/2/htp-optimization-2"]
    assert nxt.bind(g6.jobs)[1][3] == ["layers.1"] and nxt.bind(g6.jobs)[1][-1] == "2"

    # the same search whose step 1 leaves a loss spread over the layers: no half of them can lift it
    g3 = JobGraph()
    spread = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g3)
    spread.plan()
    spread.info, spread.entries, spread.states, spread._heldout = cj.info, cj.entries, cj.states, cj._heldout
    assert spread._maybe_repair()
    g3.jobs["talker_prefill/export"].result = {"onnx": {"fp32": str(src)}}
    cj, search = spread, spread.repair["w8a16"]
    finish(g3.jobs["talker_prefill/repair/w8a16/1"], {"new_key_0": 24.0, "new_key_1": 21.0, "new_key_2": 19.2,
                                                      "hidden": 19.2})
    assert "talker_prefill/repair/w8a16/2" not in g3.jobs and search["result"] is None
    assert search["stopped"].endswith("under the 30 dB gate, and more than that raises most of the graph: "
                                      "stopped after step 1") and "step 1's per-output scores" in search["stopped"]

    # a graph the ranking cannot read: that search stops with the reason, the build goes on
    (tmp_path / "bad.onnx").write_bytes(b"not an onnx graph")
    g2 = JobGraph()
    bad = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g2)
    bad.plan()
    bad.info, bad.entries = cj.info, cj.entries
    bad.states["talker_prefill/export"] = {"onnx": {"fp32": str(tmp_path / "bad.onnx")}}
    assert not bad._maybe_repair()
    assert bad.repair["w8a16"]["stopped"] == "its fp32 ONNX could not be read to map its outputs to modules"


def test_repair_starts_once_the_onnx_and_the_search_runners_build_are_judged_not_the_dlc(tmp_path):
    """The search scores on the context binary's runner and ranks by the rejected builds' scores: it
    starts once the ONNX and the context binary are judged. The DLC shares the context binary's run;
    at 0.6B the talker prefill's repair waited 480 s for its DLC's lowering."""
    from omni_export.core import BuildSpec, Format
    from omni_export.jobs.component import HEAVY_BYTES, ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from synthetic import stub_run

    src = _Layers.export(tmp_path / "net.onnx")
    specs = [BuildSpec("qwen3-tts", "talker_prefill", f, Precision.W8A16, "s25-htp")
             for f in (Format.ONNX, Format.DLC, Format.CTX)]
    outs = [{"name": "new_key_0", "snr_db": 35.0}, {"name": "new_key_1", "snr_db": 26.4}]

    def entry(fmt):
        return {"component": "talker_prefill", "format": fmt, "precision": "w8a16", "status": "rejected",
                "parity": {"outputs": outs}}

    def jobs(entries):
        g = JobGraph()
        cj = ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g)
        cj.plan()
        cj.info = {"block_chain": False, "weight_bytes": HEAVY_BYTES}
        cj.states["talker_prefill/export"] = {"onnx": {"fp32": str(src)}}
        cj.entries = entries
        cj.slow, cj.per_sample["w8a16"] = [0, 1], [(None, 27.0), (None, 26.0)]
        return cj, g

    cj, g = jobs([entry("onnx"), None, entry("ctx")])           # the DLC not judged yet
    assert cj._maybe_repair() and "talker_prefill/repair/w8a16/1" in g.jobs
    cj, g = jobs([entry("onnx"), entry("dlc"), None])           # the context binary not judged yet
    assert not cj._maybe_repair() and "w8a16" not in cj.repair
    cj, g = jobs([None, entry("dlc"), entry("ctx")])            # nor the ONNX
    assert not cj._maybe_repair() and "w8a16" not in cj.repair


def test_a_qnn_score_waits_for_the_onnx_score_that_picks_its_samples(tmp_path):
    """The simulator scores the held-out samples the ONNX build of the same precision scored worst on
    ORT CPU: a context binary's score job depends on that ONNX score (a DLC shares the context
    binary's run), and nothing else waits for it."""
    from omni_export.core import BuildSpec, Format
    from omni_export.jobs.component import ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from synthetic import stub_run

    specs = [BuildSpec("qwen3-tts", "talker_prefill", f, p, "s25-htp")
             for f in (Format.ONNX, Format.DLC, Format.CTX, Format.PTE) for p in (Precision.FP16, Precision.W8A16)]
    g = JobGraph()
    ComponentJobs(stub_run(tmp_path), "talker_prefill", specs, g).plan()
    for p in ("fp16", "w8a16"):
        onnx = f"talker_prefill/score/onnx/{p}"
        assert onnx in g.jobs[f"talker_prefill/score/ctx/{p}"].deps
        assert g.jobs[f"talker_prefill/score/dlc/{p}"].kind == "score-shared"
        assert onnx not in g.jobs[f"talker_prefill/score/pte/{p}"].deps
        assert not any(d.startswith("talker_prefill/score/") for d in g.jobs[onnx].deps)


# the 0.6B talker prefill's w8a16 context binary (random weights, 4d07593): each layer's new_key SNR
PREFILL_KEYS_DB = [39.6, 35.5, 33.4, 32.3, 31.7, 30.7, 30.4, 29.7, 29.4, 29.1, 28.9, 28.7, 28.5, 28.2, 28.1, 27.7,
                   27.6, 27.1, 27.3, 27.1, 27.5, 26.9, 26.8, 26.8, 26.4, 26.5, 26.6, 26.7]


def test_to_reach_takes_the_fewest_modules_the_estimate_needs_and_stops_when_half_the_graph_is_not_enough():
    rows = [{"block": f"decoder.layers.{i}", "snr_db": db} for i, db in enumerate(PREFILL_KEYS_DB)]
    rows.append({"block": "codec_head", "snr_db": 26.5})
    sel, finding = rp.to_reach(rows, 30.0)
    # 8 of 29 modules lift 26.4 dB over 30.25 (gate + the 0.25 dB margin), the largest adders first
    assert [rows[i]["block"] for i in sel[:2]] == ["decoder.layers.17", "decoder.layers.24"] and len(sel) == 8
    assert not finding["futile"] and 30.25 <= finding["estimate_db"] < 31.0
    # those already kept are not taken again; fewer are needed once they are
    sel2, _ = rp.to_reach(rows, 30.0, kept=set(sel[:4]))
    assert not set(sel2) & set(sel[:4])
    # a gate half the graph cannot reach: futile, with the estimate at that half
    sel3, finding3 = rp.to_reach(rows, 40.0)
    assert finding3["futile"] and len(sel3) == int(rp.MAX_RAISED_SHARE * len(rows)) and finding3["estimate_db"] < 40.0
    # a module that failed or gave NaN/Inf is taken first, alone
    broken = rows[:3] + [{"block": "x", "snr_db": None, "finite": False}]
    assert rp.to_reach(broken, 30.0)[0] == [3]


def test_an_accumulated_loss_no_few_modules_can_lift_is_said_without_running_a_step():
    rows = [{"block": f"decoder.layers.{i}", "snr_db": db} for i, db in enumerate(PREFILL_KEYS_DB)]
    rows.append({"block": "codec_head", "snr_db": 26.5})
    order, finding = rp.by_added_noise(rows, 30.0, 4)
    assert finding["futile"] and finding["worst"] == "decoder.layers.24" and finding["worst_db"] == 26.4
    # in noise power the layers add about the same: the four largest adders (layer 17's jump from
    # 27.6 to 27.1 dB first) remove ~1.8 dB of the 3.6 the gate needs
    assert finding["kept"] == ["decoder.layers.17", "decoder.layers.24", "decoder.layers.2", "decoder.layers.5"]
    assert 27.5 < finding["estimate_db"] < 29.0
    assert rows[order[0]]["block"] == "decoder.layers.17" and len(order) == len(rows)
    # one module that adds most of the noise (an outlier layer): keeping it can pass, so the steps run
    spike = [dict(r) for r in rows[:5]]
    spike[3]["snr_db"], spike[4]["snr_db"] = 22.0, 21.9
    order, finding = rp.by_added_noise(spike, 30.0, 4)
    assert not finding["futile"] and order[0] == 3 and finding["worst"] == "decoder.layers.4"
    # a module that failed or gave NaN/Inf goes first, and no estimate is made
    order, finding = rp.by_added_noise(rows[:3] + [{"block": "x", "snr_db": None, "finite": False}], 30.0, 4)
    assert order[0] == 3 and finding == {"futile": False}


@pytest.mark.parametrize("per_channel,precision,wide", [(False, Precision.W8A16, 16), (True, Precision.W8A16, 16),
                                                         (True, Precision.W4A16, 8)])
def test_wide_weights_quantize_the_named_layers_weights_wider_and_nothing_in_float(tmp_path, per_channel,
                                                                                   precision, wide):
    """Precision repair's integer raise: layers.1's linear keeps every node quantized, its weight at
    int16 over w8a16 (int8 over w4a16: `w4a16-mixed` mixes 4- and 8-bit weights), per output channel when
    the linears are lowered as Conv; the other layers' at the base width."""
    import numpy as np
    import onnx

    from omni_export.exporters import onnx as ox

    src = _Layers.export(tmp_path / "net.onnx")
    nodes = ox.scope_nodes(src)["layers.1"]
    calib = [{"x": np.random.default_rng(i).standard_normal((1, 4, 8)).astype(np.float32)} for i in range(4)]
    q = ox.quantize_qdq(src, tmp_path / "q.onnx", calib, precision, per_channel_linears=per_channel,
                        wide_weights=nodes, wide_bits=wide)
    model = onnx.load(str(q))
    inits = {i.name: i for i in model.graph.initializer}
    dq_of = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    widths = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Conv") and n.input[1] in dq_of:
            w = inits[dq_of[n.input[1]].input[0]]
            widths[n.name] = w.data_type
            if n.op_type == "Conv":
                assert len(inits[dq_of[n.input[1]].input[1]].dims) == 1     # a scale per output channel
    wide_type = {16: onnx.TensorProto.INT16, 8: onnx.TensorProto.INT8}[wide]
    base_type = onnx.TensorProto.INT4 if precision == Precision.W4A16 else onnx.TensorProto.UINT8
    raised = [k for k, t in widths.items() if t == wide_type]
    assert len(widths) == 3 and len(raised) == 1 and any(raised[0].startswith(n) for n in nodes)
    assert all(t == base_type for k, t in widths.items() if k not in raised)
    bits = ox.weight_bits(q)
    base = "4" if precision == Precision.W4A16 else "8"
    assert set(bits) == {base, str(wide)} and bits[str(wide)] > 0
    with pytest.raises(ValueError, match="8 or 16 bits"):
        ox.wide_overrides(src, nodes, 4)


def test_a_weighted_op_of_the_root_module_is_a_block_of_its_own(tmp_path):
    """A tied LM head multiplies by the embedding's transpose in the model's own forward, outside every
    child module (Spark's decode: `hidden @ lm_head.t()`): it is a block named by its op, so sensitivity
    ranks it and a repair step can raise it; the root's glue (a reshape) is in no block."""
    import torch
    from torch import nn

    from omni_export.exporters.onnx import block_nodes, export, scope_nodes

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Parameter(torch.randn(40, 8))
            self.layer = nn.Linear(8, 8)

        def forward(self, x):
            h = self.layer(x).reshape(1, 4, 8)
            return torch.matmul(h, self.emb.t())

    program = torch.export.export(Tied().eval(), (torch.randn(1, 4, 8),))
    src = export(program, tmp_path / "tied.onnx", ["x"], ["logits"])
    top, nested = block_nodes(src), scope_nodes(src)
    heads = [b for b in top if b != "layer"]
    assert "layer" in top and len(heads) == 1 and heads[0].startswith("matmul"), top
    assert len(top[heads[0]]) == 1 and nested[heads[0]] == top[heads[0]]
    import onnx

    ops = {n.name: n.op_type for n in onnx.load(str(src)).graph.node}
    assert ops[top[heads[0]][0]] == "MatMul"
    assert not any(ops[n] == "Reshape" for nodes in top.values() for n in nodes)


def test_a_block_ranked_search_stops_when_its_gains_so_far_cannot_reach_the_gate_within_the_budget():
    """One more block per step: after two steps, the steps left at the mean gain so far must be able to
    reach the gate. Real searches: the 0.6B code2wav_n2 (26.0, 26.9, then 27.6, 28.8 dB: rejected at
    step 4) stops after step 2; the demo Code2Wav (27.2, 29.1, then 30.5 dB accepted) goes on."""
    from omni_export.jobs.component import _block_projection

    def steps(*dbs):
        return [{"step": i + 1, "snr_db": db} for i, db in enumerate(dbs)]

    assert _block_projection(steps(26.0), 4, 30.0) is None                 # one step: no gain to go by
    stop = _block_projection(steps(26.0, 26.9), 4, 30.0)
    assert stop == ("stopped after step 2: at the 0.9 dB a step has gained so far, the 2 step(s) left "
                    "(--repair-steps) would reach about 28.7 dB, under the 30 dB gate")
    assert _block_projection(steps(27.2, 29.1), 4, 30.0) is None
    assert _block_projection(steps(26.0, 26.9), 8, 30.0) is None          # a larger budget can get there
    assert _block_projection(steps(26.0, 25.0), 6, 30.0).startswith("stopped after step 2: at the -1.0 dB")
    assert _block_projection(steps(26.0, None), 4, 30.0) is None          # a failed step stops on its own

"""A QNN compile that fails names the node QNN refused, its op type and shapes, what may avoid it,
and attribution lowers exactly that node's block (qnn_diagnose.py). Real QNN EP compiles of tiny
ONNX graphs with CPU fallback disabled; no model is built."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from markupsafe import escape
from onnx import TensorProto, helper

from omni_export import qnn_ep
from omni_export.exporters.qnn_diagnose import QnnCompileError, avoid, parse_log, precision_notes

BLOCKS = ["rvq", "pre_conv", "pre_transformer"]


def _graph(path: Path, op: str, shape: tuple, out_type=TensorProto.FLOAT, unnamed: bool = False, **attrs) -> Path:
    """x -> Relu (block 0) -> `op` (block 1), node names and name scopes as the torch exporter writes them
    (`unnamed`: the `op` node without a name, as a quantizer's inserted nodes can be)."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="node_relu"),
             helper.make_node(op, ["h"], ["y"], name="" if unnamed else f"node_{op.lower()}_1", **attrs)]
    for n, scopes in zip(nodes, (["", "blocks.0", "relu"], ["", "blocks.1", "blocks.1.head", op.lower()])):
        n.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", out_type, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _compile(tmp_path: Path, src: Path, rewrites=()) -> QnnCompileError:
    """A context-binary compile as Lowering.build runs it (CPU fallback disabled), its error diagnosed."""
    from omni_export.exporters.lower import Lowering
    from omni_export.targets import get_target

    target = get_target("s25-htp")
    lw = Lowering(None, target, tmp_path / "work", rewrites=rewrites)
    opts = qnn_ep.provider_options(target.soc_model, target.htp_arch, fp16=True)
    with pytest.raises(QnnCompileError) as info:
        with lw._diagnosed(src, opts):
            qnn_ep.compile_context(src, tmp_path / "m.ctx.onnx", opts)
    return info.value


@pytest.fixture(scope="module")
def argmax_error(tmp_path_factory) -> QnnCompileError:
    """ArgMax with select_last_index=1: the QNN EP has an ArgMax builder, the HTP backend's validation
    refuses this configuration; the session fails with "graph nodes ... assigned to the default CPU EP"
    and nothing else."""
    tmp = tmp_path_factory.mktemp("argmax")
    return _compile(tmp, _graph(tmp / "m.onnx", "ArgMax", (2, 4), TensorProto.INT64, axis=1, select_last_index=1))


def test_a_node_the_htp_rejects_is_named_with_its_op_type_shapes_and_reason(argmax_error):
    """The diagnosis reads QNN's verbose log and the graph: node, op type, shapes, QNN's reason."""
    e = argmax_error
    msg = str(e)
    assert msg.startswith("QNN could not compile node 'node_argmax_1' (ArgMax in blocks.1) "
                          "(float32[2, 4] -> int64[2, 1]) [op config validation]: "), msg
    assert "select_last_index=0" in msg and "no omni-export rewrite replaces ArgMax" in msg
    d = e.diagnosis
    assert (d["node"], d["op_type"], d["block_index"], d["class"]) == ("node_argmax_1", "ArgMax", 1, "op config validation")
    assert "fallback to CPU EP has been explicitly disabled" in d["error"]          # what ORT said
    assert "\n" not in msg


def test_an_op_the_htp_has_none_of_names_the_node_and_a_rewrite_that_replaces_it(tmp_path):
    """An op type QNN has no builder for is the other compile failure. The node has no name here (the
    1.7B Code2Wav's failure said "unnamed op"): the one unnamed node of that type is named by its output.
    A Sin would name sin_poly (off for this target by default), an activation act_barrier (on: said so)."""
    e = _compile(tmp_path, _graph(tmp_path / "m.onnx", "Det", (2, 3, 3), unnamed=True))
    assert str(e).startswith("QNN could not compile node 'unnamed Det -> y' (Det in blocks.1) (float32[2, 3, 3] -> "
                             "float32[2]) [unsupported op]: QNN has no Det op for the HTP"), str(e)
    assert avoid("Sin") == "the sin_poly rewrite replaces Sin (--rewrites sin_poly)"
    assert avoid("Sigmoid", ("pow_mul", "act_barrier")) == \
        "the act_barrier rewrite replaces Sigmoid and was on; its ops still failed"


def test_the_build_says_it_the_block_alone_is_attributed_and_the_report_shows_it(tmp_path, argmax_error):
    """Through the component's jobs: the failed lowering's reason is the diagnosis with the block's name,
    the manifest keeps it, attribution is planned for that block alone, and report.md / report.html
    show the same reason."""
    from omni_export.core import BuildSpec, Format, Precision
    from omni_export.jobs.component import ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from omni_export.reports import write_reports
    from omni_export.reports.markdown import summary
    from synthetic import build, manifest, stub_run, write_run

    specs = [BuildSpec("qwen3-tts", "code2wav", Format.CTX, p, "s25-htp") for p in (Precision.FP16, Precision.W8A16)]
    g = JobGraph()
    cj = ComponentJobs(stub_run(tmp_path), "code2wav", specs, g)
    cj.plan()
    cj.info = {"block_chain": True, "block_names": BLOCKS}
    job = g.jobs["code2wav/lower/ctx/w8a16"]
    job.state, job.error, job.started, job.ended = "failed", argmax_error, 1.0, 2.0
    job.done(job)
    e = cj.entries[1]
    assert e["status"] == "rejected" and e["diagnosis"]["block"] == "pre_conv"
    reason = e["parity"]["reason"]
    assert reason.startswith("lowering failed: QNN could not compile node 'node_argmax_1' (ArgMax in block pre_conv)")
    # w8a16's builds are all judged: its attribution starts now, while fp16's build is still to come
    assert cj.entries[0] is None and "code2wav/attribute/w8a16" in g.jobs
    assert not cj._maybe_attribute()                  # once per precision

    cj.entries[0] = {**build("ctx", "fp16", 50.0, 30.0), "precision": "fp16"}          # fp16 compiled and passed
    attribute = g.jobs["code2wav/attribute/w8a16"]
    assert attribute.bind(g.jobs)[1][-2:] == ("pre_conv", ()) and attribute.label.endswith("block pre_conv")
    precision_notes([x for x in cj.entries])
    assert e["parity"]["reason"].endswith("; at fp16 the same graph compiled: that precision avoids it")

    m = manifest([cj.entries[0], {**build("ctx", "w8a16", None, 30.0, error=e["parity"]["reason"]),
                                  "diagnosis": e["diagnosis"]}])
    import jsonschema

    schema = Path(__file__).resolve().parents[1] / "omni_export" / "schemas" / "manifest.schema.json"
    jsonschema.validate(json.loads(json.dumps(m)), json.loads(schema.read_text()))
    out = write_run(tmp_path / "out", m)
    write_reports(out, m)
    shown = e["parity"]["reason"]
    assert str(escape(shown)) in (out / "report.html").read_text()
    assert "node\\_argmax\\_1" in summary(m) or "node_argmax_1" in summary(m)


def test_a_finalize_failure_with_a_likely_block_attributes_on_cpu_and_that_block_on_the_htp(tmp_path):
    """The ONNX build scored low on ORT and the context binary failed to finalize with a likely block
    (Code2Wav w8a16 at 0.6B): attribution ranks the blocks on ORT CPU and lowers only that block on the
    HTP simulator, not every block (291 s at 0.6B)."""
    from omni_export.core import BuildSpec, Format, Precision
    from omni_export.jobs.component import ComponentJobs
    from omni_export.jobs.graph import JobGraph
    from synthetic import build, stub_run

    specs = [BuildSpec("qwen3-tts", "code2wav", f, Precision.W8A16, "s25-htp") for f in (Format.ONNX, Format.CTX)]
    g = JobGraph()
    cj = ComponentJobs(stub_run(tmp_path), "code2wav", specs, g)
    cj.plan()
    cj.info = {"block_chain": True, "block_names": BLOCKS}
    cj.entries[0] = build("onnx", "w8a16", 23.0, 30.0)
    cj.entries[1] = {**build("ctx", "w8a16", None, 30.0, error="lowering failed: MEM_ALLOC"),
                     "diagnosis": {"node": "up", "likely": True, "likely_block": "pre_transformer"}}
    assert cj._maybe_attribute()
    job = g.jobs["code2wav/attribute/w8a16"]
    args = job.bind(g.jobs)[1]
    assert args[3] is True and args[-1] == ("pre_transformer",) and args[-2] is None
    assert "(ORT CPU; pre_transformer on the target's runner)" in job.label
    cj.entries[1]["diagnosis"] = {}                 # not located: every block on the simulator, as before
    g.jobs.pop("code2wav/attribute/w8a16")
    assert cj._maybe_attribute()
    assert g.jobs["code2wav/attribute/w8a16"].bind(g.jobs)[1][3] is False


def test_the_log_parser_reads_each_failure_class():
    log = ("\x1b[1;31m2026 [E:onnxruntime:, qnn_execution_provider.cc:2453 GetCapabilityImpl] Unsupported nodes in "
           "QNN EP: { name: a/Det, type: Det }, { name: b/Foo, type: Foo }, \x1b[m\n")
    assert [(x["node"], x["op_type"], x["class"]) for x in parse_log(log)] == [
        ("a/Det", "Det", "unsupported op"), ("b/Foo", "Foo", "unsupported op")]
    fin = ("[E:onnxruntime:, qnn_model.cc:1 FinalizeGraphs] Failed to finalize QNN graph. Error code: 1002 "
           "QNN_COMMON_ERROR_MEM_ALLOC on node_conv_7\n")
    [x] = parse_log(fin)
    assert x["class"] == "finalize" and x["node"] is None and "node_conv_7" in x["errors"][0]
    assert parse_log("[I:onnxruntime:] nothing wrong\n") == []
    # recorded from the demo Code2Wav's w4a16 context binary before bddc24b (a 4-bit LayerNorm gamma):
    # a QDQ unit lists its DequantizeLinear nodes first; the refused op is the unit's own
    qdq = ("[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 5 nodes in "
           "OrtNodeUnit (LayerNormalization) :\n"
           "\tOperator type: DequantizeLinear Node name: transpose_13_DequantizeLinear Node index: 723\n"
           "\tOperator type: DequantizeLinear Node name: blocks.3.block.norm.weight_DequantizeLinear Node index: 26\n"
           "\tOperator type: LayerNormalization Node name: node_layer_norm Node index: 724\n"
           "\tOperator type: QuantizeLinear Node name: layer_norm_QuantizeLinear Node index: 725\n"
           "\tREASON : Failed to add node.\n\n"
           "[W:onnxruntime:, qnn_model_wrapper.cc:565 CreateQnnNode] QNN.backendValidateOpConfig() failed for node "
           "`node_layer_norm` of type `LayerNorm` with error code 3110\n")
    assert parse_log(qdq) == [{"node": "node_layer_norm", "op_type": "LayerNormalization", "class": "op config validation",
                               "reason": "Failed to add node: QNN's HTP backend refused this LayerNorm op config "
                                         "(error 3110)"}]


def test_a_simulator_run_failure_says_so_and_other_runners_keep_their_words():
    from omni_export.exporters.qnn_diagnose import run_failure

    assert run_failure("RuntimeError: QNN graph execute failed", "qnn-htp") == (
        "runner failed: the HTP simulator could not run the compiled graph [simulator run]: "
        "RuntimeError: QNN graph execute failed")
    assert run_failure("RuntimeError: x", "ort-cpu") == "runner failed: RuntimeError: x"


def test_a_component_whose_htp_builds_failed_is_not_told_to_add_them():
    """The HTP caveat said "Add dlc or ctx to --formats" under a ctx build QNN failed to compile."""
    from omni_export.reports.view import build_rows, caveats
    from synthetic import build, manifest

    m = manifest([build("onnx", "w8a16", 35.0, 30.0), build("ctx", "w8a16", None, 30.0, error="lowering failed: x")])
    [said] = caveats(m, build_rows(m))
    assert said.startswith("Nothing of code2wav ran on the HTP") and said.endswith(
        "Its dlc / ctx builds failed before they could be scored: see their reasons.")
    m = manifest([build("onnx", "w8a16", 35.0, 30.0)])
    assert caveats(m, build_rows(m))[0].endswith("Add dlc or ctx to --formats to score on the HTP simulator.")


def test_a_finalize_failure_names_the_graphs_largest_activation_as_its_likely_node(tmp_path):
    """QNN's finalize names no op, even in its verbose log (checked on this graph: a Conv over 200000
    samples fails with QNN_COMMON_ERROR_MEM_ALLOC after ~20 s of compile, too slow for the suite; the
    error below is the one it raised). The suspect is the largest activation, said as likely; the
    build's attribution still lowers every block (likely_block, not block)."""
    from omni_export.exporters.qnn_diagnose import compile_failure, named

    src = _graph(tmp_path / "m.onnx", "Sin", (1, 96, 1, 200000))
    said = ("[ONNXRuntimeError] : 11 : EP_FAIL : Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC: "
            "Memory allocation related error., Code: 1002")
    e = compile_failure(RuntimeError(said), src, qnn_ep.provider_options("69", "79", fp16=True))
    assert str(e) == ("QNN could not finalize the graph [finalize]: QNN_COMMON_ERROR_MEM_ALLOC; likely node 'node_relu' "
                      "(Relu in blocks.0) (float32[1, 96, 1, 200000] -> float32[1, 96, 1, 200000]), the graph's largest "
                      "activation (73.2 MiB); a shorter time axis (a smaller streaming chunk) or a split graph may fit")
    d = named(e, BLOCKS)
    assert d["likely_block"] == "rvq" and "block" not in d


def test_a_simulator_run_that_died_at_the_fast_preparation_says_what_ran_such_a_graph():
    """A build whose simulator process died (a native crash, jobs/errors.WorkerDied) at --htp-optimization 1
    says that QNN's default preparation ran such a graph (the 0.6B code2wav_n2 mixed graph segfaulted at 1,
    ran at 2); at 2 or on ORT CPU there is no such hint."""
    from omni_export.exporters.qnn_diagnose import CRASH_HINT, run_failure

    died = "WorkerDied: its worker process died 2 times (signal 11 (SIGSEGV), signal 11 (SIGSEGV))"
    assert run_failure(died, "qnn-htp", "1").endswith(f"{died} ({CRASH_HINT})")
    assert CRASH_HINT not in run_failure(died, "qnn-htp", "2")
    assert CRASH_HINT not in run_failure(died, "ort-cpu", "1")
    assert CRASH_HINT not in run_failure("RuntimeError: no such graph", "qnn-htp", "1")

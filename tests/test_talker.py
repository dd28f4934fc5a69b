"""Talker + code predictor: our fp32 graphs driven by our host loop against upstream qwen_tts."""
import json
from collections import Counter

import numpy as np
import pytest
import torch

from conftest import GOLDEN
from omni_export.core import UsageError
from omni_export.parity.metrics import snr
from omni_export.recipes import get_recipe
from omni_export.recipes.qwen3_tts import checkpoint as ck
from omni_export.recipes.qwen3_tts import model as M
from omni_export.runtime.graphs import EagerGraphs
from omni_export.recipes.qwen3_tts.prompt import Request
from omni_export.weights import write_safetensors

META = json.loads((GOLDEN / "qwen3_tts" / "meta.json").read_text())["talker"]


def _load(tmp_path, name, **options):
    case = META[name]
    d = ck.write_checkpoint(tmp_path / name, seed=case["seed"], size=case["size"], kind=case["kind"])
    g = np.load(GOLDEN / "qwen3_tts" / f"{name}.npz")
    from safetensors.numpy import load_file

    st = load_file(d / "model.safetensors")
    st["talker.codec_head.weight"][2150] = st["talker.codec_head.weight"][int(g["eos_row"])] * np.float32(1.3)
    write_safetensors(d / "model.safetensors", st)
    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    return M.load(d, {**opts, **options}, tmp_path), case, g


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    yield


@pytest.mark.parametrize("name", sorted(META))
@pytest.mark.parametrize("predictor", ["frame", "step"])
def test_greedy_codes_equal_upstream(tmp_path, name, predictor):
    _greedy_codes_equal_upstream(tmp_path, name, predictor)


@pytest.mark.parametrize("name", sorted(META))
def test_split_talker_codes_equal_upstream(tmp_path, name):
    """--talker-parts 2: the host runs each talker call as two graphs (residual stream between)."""
    model = _greedy_codes_equal_upstream(tmp_path, name, "frame", **{"talker-parts": 2})
    comps = model.components()
    assert "talker_decode" not in comps and {"talker_prefill_part1", "talker_decode_part2"} <= set(comps)


def _greedy_codes_equal_upstream(tmp_path, name, predictor, **options):
    model, case, g = _load(tmp_path, name, **options)
    graphs = EagerGraphs(model)
    for i, r in enumerate(case["requests"]):
        req = Request(text_ids=g[f"text_ids_{i}"].tolist(), speaker=r.get("speaker"), language=r["language"],
                      non_streaming=r["non_streaming"],
                      instruct_ids=g[f"instruct_ids_{i}"].tolist() if f"instruct_ids_{i}" in g else None,
                      speaker_embedding=g["spk_embedding"] if "spk_embedding" in g else None)
        opts = model.gen_options(greedy=True, predictor=predictor, max_frames=case["max_new_tokens"] - 1)
        gen, _ = model.synthesize(graphs, req, opts, with_audio=False)
        np.testing.assert_array_equal(gen.codes, g[f"codes_{i}"], err_msg=f"{name} request {i} ({r})")
    return model


def test_eos_and_max_frames_paths_are_both_covered():
    frames = [f for case in META.values() for f in case["frames"]]
    assert min(frames) < max(frames) == 11        # some runs stop on EOS, others at max_new_tokens


def test_text_ids_come_from_our_tokenizer_like_upstreams(tmp_path):
    model, case, g = _load(tmp_path, "talker_cv_tiny")
    assert model.template(case["requests"][0]["text"]) == g["text_ids_0"].tolist()


def test_speaker_encoder_and_log_mel_match_upstream(tmp_path):
    """Upstream's 281-frame mel in the graph's 938-frame window; other lengths: test_speaker_lengths.py."""
    from omni_export.recipes.qwen3_tts.speaker import log_mel, window

    model, _, g = _load(tmp_path, "talker_base_tiny17")
    wav = M.reference_voice(int(g["ref_wav_seed"]))
    ours = log_mel(wav)
    assert np.abs(ours - g["mel"]).max() < 1e-4
    emb = EagerGraphs(model)("speaker_encoder", window(g["mel"], model.speaker_frames))["embedding"]
    assert snr(g["spk_embedding"], emb.reshape(-1)) > 100


def test_fused_frame_and_step_graphs_sample_the_same_codes(tmp_path):
    """Same Gumbel noise: the fused graph and the 15 step calls pick identical codes."""
    model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    graphs = EagerGraphs(model)
    req = model.requests("heldout")[0]
    a, _ = model.synthesize(graphs, req, model.gen_options(seed=5, predictor="frame", max_frames=8), with_audio=False)
    b, _ = model.synthesize(graphs, req, model.gen_options(seed=5, predictor="step", max_frames=8), with_audio=False)
    np.testing.assert_array_equal(a.codes, b.codes)
    c, _ = model.synthesize(graphs, req, model.gen_options(seed=6, predictor="frame", max_frames=8), with_audio=False)
    assert not np.array_equal(a.codes, c.codes)        # the seed reaches the sampler


def test_fused_frame_executorch_variant_picks_the_same_codes(tmp_path):
    """The .pte form of the fused frame (selection from slices / maximum / clamp / linear, RMS mean
    and grouped-query attention in XNNPACK's ops) computes the same codes, embedding and margins:
    greedy, and sampled with noise large enough that the top-k filter decides picks (a form that
    ignored top-k would differ: `unfiltered`). The eager modules are untouched by it."""
    from omni_export.recipes.qwen3_tts.talker import _Xnnpack

    model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    frame = model.graph("predictor_frame").module
    variant = frame.executorch_variant()
    unfiltered = type(frame)(frame.core, top_k=model.cfg.predictor.vocab_size).eval()
    rng = np.random.default_rng(0)
    h, v = model.cfg.talker.hidden_size, model.cfg.predictor.vocab_size
    mattered = 0
    for scale in (0.0, 0.0, 0.9, 0.9, 8.0, 8.0, 8.0, 8.0):
        args = (torch.tensor(rng.standard_normal((1, 1, h)), dtype=torch.float32),
                torch.tensor([[int(rng.integers(0, v))]], dtype=torch.int32),
                torch.tensor(scale * rng.gumbel(size=(1, 15, v)), dtype=torch.float32))
        with torch.no_grad():
            a, b = frame(*args), variant(*args)
            mattered += not torch.equal(unfiltered(*args)[0], a[0])
        assert not _Xnnpack.on
        torch.testing.assert_close(b[0], a[0], rtol=0, atol=0)
        torch.testing.assert_close(b[1], a[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b[2], a[2], rtol=1e-4, atol=1e-4)
    assert mattered >= 2


def test_step_graphs_lower_to_one_xnnpack_delegate_in_fp16(tmp_path):
    """The talker decode graph's and the text projection's .pte forms (xnnpack.py: RMS mean as matmul,
    GQA as bmm, SiLU as x*sigmoid(x)) compute what the graphs do and lower as one XNNPACK delegate each;
    traced as written the step split into one partition per refused op (226 at 0.6B, quadratic
    lowering) and the text projection into 3 (F.silu on fp16 is an fp32 island between casts)."""
    import copy

    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from omni_export.exporters.executorch import _CastIO, release_lowering_caches

    model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)

    def delegates(module, args) -> int:
        ep = torch.export.export(_CastIO(copy.deepcopy(module).half(), torch.float16).eval(), args)
        lowered = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).exported_program()
        n = sum(1 for node in lowered.graph.nodes if "executorch_call_delegate" in str(node.target))
        del ep, lowered
        release_lowering_caches()
        return n

    def refused(module, args) -> Counter:
        """Ops of an fp16 trace that XNNPACK does not take (counted without lowering: a plain step's
        lowering is slow); dtype casts include the fp32 I/O's."""
        ep = torch.export.export(_CastIO(copy.deepcopy(module).half(), torch.float16).eval(), args)
        return Counter(str(n.target) for n in ep.run_decompositions().graph.nodes if n.op == "call_function"
                       and str(n.target).startswith(("aten.mean.dim", "aten.expand", "aten._to_copy")))

    for name in ("talker_decode", "text_projection"):
        g = model.graph(name)
        args = tuple(torch.randn(*s.shape) if s.dtype == "float32" else torch.zeros(*s.shape, dtype=torch.int64)
                     for s in g.inputs)
        with torch.no_grad():
            ref, out = g.module(*args), g.module.executorch_variant()(*args)
        for a, b in zip(ref if isinstance(ref, tuple) else (ref,), out if isinstance(out, tuple) else (out,)):
            assert snr(a.numpy(), b.numpy()) > 100
        assert delegates(g.module.executorch_variant(), args) == 1, name
        plain, form = refused(g.module, args), refused(g.module.executorch_variant(), args)
        assert plain - form, (name, plain, form)       # what the forms take away


def test_level_partitions_are_convex_and_few():
    """One pass: a node behind an unsupported op that reads a partition lands in a later
    partition; an unsupported op reading only inputs opens none."""
    import torch.fx as fx

    from omni_export.exporters.executorch import level_partitions

    g = fx.Graph()
    x = g.placeholder("x")
    gather = g.call_function(torch.neg, (x,))          # unsupported, reads an input only
    a = g.call_function(torch.relu, (gather,))
    b = g.call_function(torch.sigmoid, (a,))
    cut = g.call_function(torch.argmax, (b,))          # unsupported, reads a partition
    c = g.call_function(torch.relu, (cut,))
    d = g.call_function(torch.add, (c, b))
    g.output(d)
    parts = level_partitions(g, {a, b, c, d})
    assert parts[a] == parts[b] == 0 and parts[c] == parts[d] == 1


def test_sampling_never_leaves_the_top_k(tmp_path):
    """Logits outside the top k sit below every noisy score: Gumbel noise cannot lift them (with
    the old floor of min(logits) - 1, this flat distribution picked outside the top k 131 times
    in 200)."""
    from omni_export.recipes.qwen3_tts.host import gumbel, pick

    rng = np.random.default_rng(1)
    for _ in range(200):
        logits = rng.standard_normal(2048).astype(np.float32) * 0.3
        code = pick(logits, gumbel(rng, (2048,)) * np.float32(0.9), 50)
        assert logits[code] >= np.sort(logits)[-50]


def test_mrope_collapses_to_1d_rope_in_our_graphs(tmp_path):
    """Our talker takes host cos/sin; the table equals upstream's MRoPE with identical rows
    (checked in the goldens above): here, that positions shift RoPE as 1-D rotations do."""
    from omni_export.recipes.qwen3_tts.host import Talker, GenOptions

    t = Talker(None, 1, 1, 16, 1e6, GenOptions(context=8))
    cos, sin = t._rope(np.arange(4))
    assert cos.shape == (1, 4, 16) and np.allclose(cos[0, 0], 1) and np.allclose(sin[0, 0], 0)


def test_config_saved_by_upstream_parses(tmp_path):
    from omni_export.recipes.qwen3_tts.config import parse

    raw = json.loads((GOLDEN / "qwen3_tts" / "upstream_saved" / "config.json").read_text())
    cfg = parse(raw, tmp_path / "config.json")
    assert cfg.tts_model_type == "custom_voice" and cfg.talker.num_code_groups == 16
    assert cfg.talker.spk_id["ryan"] == 3061 and not cfg.has_projection


def test_missing_talker_field_is_named(tmp_path):
    d = ck.write_checkpoint(tmp_path / "c", seed=0)
    raw = json.loads((d / "config.json").read_text())
    del raw["talker_config"]["head_dim"]
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UsageError, match="missing 'head_dim'"):
        ck.read_model_config(d)


def test_unknown_speaker_and_language_list_the_valid_ones(tmp_path):
    from omni_export.recipes.qwen3_tts import prompt

    model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    ids = model.template("hi")
    with pytest.raises(UsageError, match="unknown speaker 'bob'; valid: aiden"):
        prompt.codec_prefix(model.cfg, Request(ids, speaker="bob"))
    with pytest.raises(UsageError, match="unknown language 'klingon'"):
        prompt.codec_prefix(model.cfg, Request(ids, language="klingon"))


class _Noisy:
    """Graph outputs with a relative error, like an fp16 graph's (~1e-3 at 60 dB)."""

    def __init__(self, graphs, eps: float, seed: int):
        self.graphs, self.eps, self.rng = graphs, eps, np.random.default_rng(seed)

    def __call__(self, name, inputs):
        out = self.graphs(name, inputs)
        return {k: (v * (1 + self.eps * self.rng.standard_normal(v.shape))).astype(v.dtype)
                if v.dtype.kind == "f" else v for k, v in out.items()}


@pytest.mark.parametrize("size", ["tiny", "tiny-1.7b"])
def test_demo_decisions_survive_fp16_sized_errors_random_heads_do_not(tmp_path, size):
    """The embedded demo's heads are tied to embedding rows (demo.make_decisive), so free-running
    codes measure the export rather than near-tie luck; the golden fixtures keep i.i.d. heads."""
    from omni_export.recipes.qwen3_tts import e2e

    def agreement(decisive: bool) -> float:
        d = ck.write_checkpoint(tmp_path / f"{size}-{decisive}", size=size, decisive=decisive)
        m = M.load(d, {"e2e-frames": 24}, tmp_path)
        eager = EagerGraphs(m)
        ref = e2e._free_running(m, eager)
        noisy = e2e._free_running(m, _Noisy(eager, 2e-3, seed=1))
        return float(np.mean([e2e.agreement(r, n)[0] for (r, _), (n, _) in zip(ref, noisy)]))

    assert agreement(True) == 1.0
    assert agreement(False) < 0.99            # why the demo needs decisive heads (58-64 % measured)


def test_short_calibration_generations_give_code2wav_windows_with_left_context(tmp_path):
    """--calibration-frames 4 (the real-size default): every prompt generates 4 frames, and
    Code2Wav still calibrates on windows carrying left context (the generations are joined);
    windowed one by one, no window could hold more than 4 real frames."""
    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    assert M.load(None, opts, tmp_path / "a").capture_frames() == (M.CALIBRATION_FRAMES, M.HELDOUT_FRAMES)
    model = M.load(None, {**opts, "calibration-frames": 4}, tmp_path / "b")
    assert model.capture_frames() == (4, 4)
    assert "4 frames each" in model.samples("talker_decode", "calibration").source
    wins = model.samples("code2wav", "calibration").inputs
    assert len(wins) >= 4 and max(float(w["frame_mask"].sum()) for w in wins) > 4


def test_weights_are_held_only_while_a_component_is_built(tmp_path):
    """Between components the loaded model holds no weights: the capture's modules and host tables
    are gone once it returns, a graph holds its own component's weights only, and dropping the graph
    drops them (the 0.6B build otherwise holds all 4 GB fp32 for the whole run)."""
    import gc

    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    model = M.load(None, {**opts, "calibration-frames": 2}, tmp_path)
    assert model.tensors.held() == [] and model.speech.tensors.held() == []
    model.samples("talker_decode", "calibration")
    gc.collect()
    assert model.tensors.held() == [] and model.speech.tensors.held() == []
    g = model.graph("talker_decode")
    held = model.tensors.held()
    assert "talker.model.layers.0.self_attn.q_proj.weight" in held
    assert not [n for n in held if "text_embedding" in n or "code_predictor" in n]
    p = model.graph("predictor_prefill")
    d = model.graph("predictor_decode")
    assert p.module.core is d.module.core          # the predictor's graphs share one set of weights
    del g, p, d
    gc.collect()
    assert model.tensors.held() == []
    assert model.tables.text.shape[0] == model.cfg.talker.text_vocab_size   # read again on request


def test_talker_halves_compose_to_the_whole_step(tmp_path):
    """Part 1 then part 2 of a split talker give the whole step's outputs (same ops, same order),
    their K/V named by global layer; each half holds only its own layers' weights."""
    d = ck.write_checkpoint(tmp_path / "ck", seed=5)
    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    whole = M.load(d, {**opts, "talker-parts": 1}, tmp_path)
    split = M.load(d, {**opts, "talker-parts": 2}, tmp_path)
    layers = whole.cfg.talker.num_hidden_layers
    assert whole.talker_parts == 1 and split.talker_parts == 2 and layers >= 2
    rng = np.random.default_rng(0)
    for name in ("talker_prefill", "talker_decode"):
        g = whole.graph(name)
        inputs = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in g.inputs}
        inputs["attn_mask"][...] = 0.0
        ref = EagerGraphs(whole)(name, inputs)
        p1, p2 = split.graph(f"{name}_part1"), split.graph(f"{name}_part2")
        assert [s.name for s in p2.inputs][:1] == ["residual"] and [s.name for s in p1.outputs][:1] == ["residual"]
        assert {s.name for s in p1.outputs} | {s.name for s in p2.outputs} == {"residual"} | set(ref)
        n1 = sum(x.numel() for x in p1.module.parameters())
        n2 = sum(x.numel() for x in p2.module.parameters())
        assert n1 + n2 == sum(x.numel() for x in g.module.parameters()) and 0 < n1 < n2
        eager = EagerGraphs(split)
        a = eager(f"{name}_part1", {k: v for k, v in inputs.items() if k in {s.name for s in p1.inputs}})
        b = eager(f"{name}_part2", {"residual": a["residual"],
                                    **{k: v for k, v in inputs.items() if k in {s.name for s in p2.inputs}}})
        got = {**a, **b}
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-6, atol=1e-6, err_msg=f"{name} {k}")


def test_talker_parts_default_by_size_and_checked(tmp_path):
    opts = {o.name: o.default for o in get_recipe("qwen3-tts").options}
    d = ck.write_checkpoint(tmp_path / "ck", seed=5)
    assert M.load(d, opts, tmp_path).talker_parts == 1          # tiny: far below TALKER_PART_BYTES
    from omni_export.recipes.qwen3_tts.demo import geometry

    by_size = {size: M.Qwen3TTS(tmp_path, None, {}, cfg=geometry(size)).talker_parts for size in ("0.6b", "1.7b")}
    assert by_size == {"0.6b": 1, "1.7b": 2}                    # published shapes: 0.8 / 2.6 GiB of fp16 layers
    assert M.Qwen3TTS(tmp_path, None, {"talker-parts": 1}, cfg=geometry("1.7b")).talker_parts == 1
    with pytest.raises(UsageError, match="--talker-parts must be 1 or 2"):
        M.load(d, {**opts, "talker-parts": 3}, tmp_path)


def test_asking_for_the_whole_talker_of_a_split_checkpoint_names_its_halves():
    from pathlib import Path

    from omni_export.pipeline import RunOptions, plan
    from omni_export.targets import get_target

    available = ("text_projection", "talker_prefill_part1", "talker_prefill_part2", "talker_decode_part1",
                 "talker_decode_part2", "code2wav")
    with pytest.raises(UsageError, match=r"no talker_decode; .*split in two here, as the recipe's options chose: "
                                         r"--components talker_decode_part1,talker_decode_part2\)"):
        plan(RunOptions(get_recipe("qwen3-tts"), get_target("s25-htp"), Path("unused"),
                        components=("talker_decode",)), available)


def test_predictor_tables_and_heads_are_2d_constants_and_go_8_bit(tmp_path):
    """The predictor's 15 tables and heads, stacked [15, V, D] and sliced by the step, were Gathers of a
    3-D constant that the w8a16 graphs kept at 16 bits with one scale (the demo's predictor graphs had
    1-6 % of their weight bytes at 8 bits). As rows of flat [15 V, D] tables (the decode step) and
    constants per step (the prefill's head), the heads and tables are 2-D: MatMul weights and row-scaled
    8-bit tables. The decode gathers its head HEAD_ROWS rows at a time (QNN 2.51's HTP simulator
    segfaults gathering 2048 x 1024 rows of such a table)."""
    import onnx
    from onnx import shape_inference

    from conftest import GEOMETRY, builds_by, read_manifest, run_cli
    from omni_export.recipes.qwen3_tts.talker import HEAD_ROWS

    out = tmp_path / "out"
    proc = run_cli("qwen3-tts", "--target", "s25-htp", "--out", str(out), "--precision", "w8a16", "--formats", "onnx",
                   "--components", "predictor_prefill,predictor_decode", "--no-attribution", "--repair", "off",
                   *GEOMETRY, "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = builds_by(read_manifest(out))
    for g in ("predictor_prefill", "predictor_decode"):
        build = b[(g, "onnx", "w8a16")]
        assert build["status"] == "accepted", (g, build["parity"])
        assert build["details"]["weight_bits"]["8"] >= 0.9, (g, build["details"]["weight_bits"])
    m = shape_inference.infer_shapes(onnx.load(str(out / b[("predictor_decode", "onnx", "w8a16")]["files"][0]["path"])))
    dims = {i.name: list(i.dims) for i in m.graph.initializer}
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.value_info}
    producer = {o: n for n in m.graph.node for o in n.output}
    heads = [n for n in m.graph.node if n.op_type == "Gather" and producer[n.input[0]].input[0] == "core.heads_quantized_rows8"]
    assert dims["core.heads_quantized_rows8"][0] == dims["core.tables_quantized_rows8"][0] == 15 * 2048
    rows = [shapes[n.input[1]] for n in heads]          # 1024 rows ran on the simulator, 2048 crashed it
    assert HEAD_ROWS <= 1024 and all(len(r) == 1 and r[0] <= 1024 for r in rows) and sum(r[0] for r in rows) == 2048, rows


def test_fused_frame_margin_needs_no_second_topk(tmp_path):
    """The frame's decision margin (best noisy score minus the second best) is a maximum and a
    maximum with the winner's slot masked, not a top-2: the HTP runs TopK in float, 89 % of the demo
    frame's w8a16 simulated cycles with the top-2. Same codes and margins as top-2, ties give 0, and
    the traced pick holds one TopK (the top-k filter's threshold)."""
    model = M.load(None, {o.name: o.default for o in get_recipe("qwen3-tts").options}, tmp_path)
    frame = model.graph("predictor_frame").module
    v = model.cfg.predictor.vocab_size
    gen = torch.Generator().manual_seed(0)
    for case in range(6):
        logits = torch.randn(1, v, generator=gen)
        noise = torch.zeros(1, v) if case < 2 else 2.0 * torch.randn(1, v, generator=gen)
        if case % 2:                                   # two equal best scores
            j, k = torch.topk(logits, 2).indices[0].tolist()      # both inside the top k
            logits[0, k], noise[0, j], noise[0, k] = logits[0, j], 50.0, 50.0
        code, margin = frame._pick(logits, noise)
        top = torch.topk(logits, frame.top_k).values[..., -1:]
        scores = torch.where(logits >= top, logits + noise, (logits + noise).min() - 1.0)
        best2 = torch.topk(scores, 2).values
        assert code.item() == int(torch.argmax(scores))
        torch.testing.assert_close(margin, best2[..., :1] - best2[..., 1:], rtol=0, atol=1e-6)
        if case % 2:
            assert margin.item() == 0.0
    ep = torch.export.export(_Pick(frame), (torch.randn(1, v), torch.zeros(1, v)))
    assert [str(n.target) for n in ep.graph.nodes].count("aten.topk.default") == 1


class _Pick(torch.nn.Module):
    def __init__(self, frame):
        super().__init__()
        self.frame = frame

    def forward(self, logits, noise):
        return self.frame._pick(logits, noise)

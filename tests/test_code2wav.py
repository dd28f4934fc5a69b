"""Code2Wav: our export-friendly module against upstream qwen_tts goldens, and its loader."""
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import GOLDEN
from omni_export.core import UsageError
from omni_export.parity.metrics import snr
from omni_export.recipes.qwen3_tts import checkpoint as ck
from omni_export.recipes.qwen3_tts import host
from omni_export.recipes.qwen3_tts.modules import build_code2wav
from omni_export.weights import write_safetensors

CASES = ["code2wav_tiny", "code2wav_tiny_short"]


def golden(name):
    g = np.load(GOLDEN / "qwen3_tts" / f"{name}.npz")
    return {k: g[k] for k in g.files}


def load(tmp_path, seed):
    return ck.load_speech_tokenizer(ck.write_checkpoint(tmp_path / f"ck{seed}", seed=seed))


@pytest.mark.parametrize("name", CASES)
def test_full_decode_matches_upstream(tmp_path, name):
    g = golden(name)
    st = load(tmp_path, int(g["seed"]))
    frames = g["codes"].shape[-1]
    m = build_code2wav(st.config, st.tensors, frames)
    with torch.no_grad():
        wav = m(torch.from_numpy(g["codes"]), torch.ones(1, frames)).numpy()
    assert snr(g["full"], wav) >= 80


@pytest.mark.parametrize("name", CASES)
def test_streaming_chunk_graph_matches_upstream_chunked_decode(tmp_path, name):
    g = golden(name)
    st = load(tmp_path, int(g["seed"]))
    left, chunk = int(g["left"]), int(g["chunk"])
    m = build_code2wav(st.config, st.tensors, left + chunk, chunk)     # the build's cropped graph

    def run(inputs):
        with torch.no_grad():
            return m(torch.from_numpy(inputs["codes"]), torch.from_numpy(inputs["frame_mask"])).numpy()

    wav = host.stream_decode(g["codes"][0].T, run, left, chunk, st.config.samples_per_frame)
    assert wav.shape == g["chunked"].reshape(-1).shape
    assert snr(g["chunked"].reshape(-1), wav) >= 60


def test_windows_follow_upstream_context_rule():
    codes = np.arange(30 * 2).reshape(30, 2)
    wins = list(host.windows(codes, left=5, chunk=4, samples_per_frame=10))
    assert len(wins) == 8                                   # ceil(30 / 4)
    assert wins[0].frame_mask.sum() == 4                    # no context for the first chunk
    assert wins[1].frame_mask.sum() == 8                    # 4 frames of context (start - L <= 0)
    assert wins[2].frame_mask.sum() == 9                    # full context from then on
    assert wins[-1].frame_mask.sum() == 5 + 2               # last chunk: 2 real frames
    assert (wins[2].codes[0, :, :9].T == codes[3:12]).all()
    assert [w.samples for w in wins] == [40] * 7 + [20]


def test_cropped_chunk_graph_is_exact_and_its_crop_is_tight(tmp_path):
    """The graph keeps only the samples that reach the N new frames: its output equals the uncropped
    graph's last N*S samples on every window (first, partial-context and last chunks), the conv
    decoder runs on ~N + 10 frames, and one sample less at the last blocks changes the output."""
    st = load(tmp_path, 3)
    c, left, chunk, s = st.config, 25, 12, st.config.samples_per_frame
    full = build_code2wav(c, st.tensors, left + chunk)
    crop = build_code2wav(c, st.tensors, left + chunk, chunk)
    blocks = dict(zip(crop.block_names, crop.blocks))
    assert blocks["upsample.0"].keep == chunk + 10                 # frames after the transformer
    assert blocks["decoder.4"].keep < (left + chunk) * 640 / 3     # the largest tensors: > 3x shorter
    codes = np.random.default_rng(0).integers(0, c.codebook_size, (40, 16))
    wins = list(host.windows(codes, left, chunk, s))
    refs = []
    for w in wins:
        with torch.no_grad():
            ref = full(torch.from_numpy(w.codes), torch.from_numpy(w.frame_mask)).numpy()[..., left * s:]
            out = crop(torch.from_numpy(w.codes), torch.from_numpy(w.frame_mask)).numpy()
        assert out.shape == (1, 1, chunk * s)
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
        refs.append(ref)
    for name in ("decoder.4", "decoder.out"):
        blocks[name].keep -= 1
        with torch.no_grad():
            out = crop(torch.from_numpy(wins[-2].codes), torch.from_numpy(wins[-2].frame_mask)).numpy()
        blocks[name].keep += 1
        assert np.abs(out - refs[-2]).max() > 1e-5, name          # fails the check above


def test_padding_frames_cannot_change_real_output(tmp_path):
    """The mask makes padded frames invisible: any codes there give the same real samples."""
    st = load(tmp_path, 0)
    m = build_code2wav(st.config, st.tensors, 6)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2048, (1, 16, 6)).astype(np.int32)
    mask = np.array([[0, 0, 1, 1, 1, 1]], np.float32)
    other = codes.copy()
    other[:, :, :2] = rng.integers(0, 2048, (1, 16, 2))
    with torch.no_grad():
        a = m(torch.from_numpy(codes), torch.from_numpy(mask)).numpy()[..., 2 * 1920:]
        b = m(torch.from_numpy(other), torch.from_numpy(mask)).numpy()[..., 2 * 1920:]
    assert np.array_equal(a, b)


def test_real_geometry_config_and_tensor_table():
    c = ck.REAL_CODE2WAV
    t = ck.code2wav_tensors(c)
    assert c.samples_per_frame == 1920
    assert t["pre_transformer.layers.0.self_attn.q_proj.weight"].shape == (1024, 512)
    assert t["decoder.6.conv.weight"].shape == (1, 96, 7)
    assert t["quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum"].shape == (2048, 256)
    n_params = sum(int(np.prod(d.shape)) for d in t.values())
    assert 100e6 < n_params < 130e6      # the 12 Hz decoder is ~114M parameters


def test_our_tensor_names_are_exactly_upstreams():
    """The decoder.* names upstream's save_pretrained wrote are the ones our table declares."""
    saved = json.loads((GOLDEN / "qwen3_tts" / "upstream_saved" / "tensors.json").read_text())[
        "speech_tokenizer/model.safetensors"]
    cfg = json.loads((GOLDEN / "qwen3_tts" / "upstream_saved" / "speech_tokenizer" / "config.json").read_text())
    c = ck.Code2WavConfig.from_dict(cfg["decoder_config"], "golden")
    ours = {"decoder." + k: list(v.shape) for k, v in ck.code2wav_tensors(c).items()}
    theirs = {k: v for k, v in saved.items() if k.startswith("decoder.")}
    assert ours == theirs


def test_missing_tensor_and_wrong_shape_are_named(tmp_path):
    d = ck.write_checkpoint(tmp_path / "c", seed=0)
    from safetensors.numpy import load_file

    path = d / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(path)
    bad = dict(tensors)
    del bad["decoder.pre_conv.conv.weight"]
    write_safetensors(path, bad)
    with pytest.raises(UsageError, match="'decoder.pre_conv.conv.weight' is missing"):
        ck.load_speech_tokenizer(d)
    bad = dict(tensors)
    bad["decoder.pre_conv.conv.bias"] = np.zeros(7, np.float32)
    write_safetensors(path, bad)
    with pytest.raises(UsageError, match=r"'decoder.pre_conv.conv.bias' has shape \[7\]"):
        ck.load_speech_tokenizer(d)


def test_missing_speech_tokenizer_and_wrong_model_type(tmp_path):
    d = ck.write_checkpoint(tmp_path / "c", seed=0)
    shutil.rmtree(d / "speech_tokenizer")
    with pytest.raises(UsageError, match="missing speech_tokenizer"):
        ck.load_speech_tokenizer(d)
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UsageError, match="model_type is 'llama'"):
        ck.check_root_config(d)


def test_the_stitched_stream_along_a_schedule_equals_the_full_decode(tiny_checkpoint, one_thread):
    """--chunk-schedule: a 1-frame first chunk, then 2 and 4, then steady chunks of 8, each through its own
    cropped graph, pushed frame by frame as generation would: the first audio leaves after the first
    frame, and the stitched stream equals the whole utterance decoded at once (fp32: 119.2 dB, float
    rounding) when the left context covers the decoder's reach: layers x (window - 1) frames of
    sliding-window attention plus ~12 frames of causal convolutions. With less it is not the full
    decode (54.9 dB at half the reach). The tiny decoder's window is cut to 4 frames (2 layers: 6 frames
    of attention reach) so that 24 frames exceed the reach; docs/streaming.md has the real sizes."""
    import dataclasses

    st = ck.load_speech_tokenizer(tiny_checkpoint)
    c = dataclasses.replace(st.config, sliding_window=4)
    reach = c.num_hidden_layers * (c.sliding_window - 1) + 12
    codes = host.synthetic_codes(24, 16, c.codebook_size, seed=3)
    with torch.no_grad():
        full = build_code2wav(c, st.tensors, 24)(torch.from_numpy(codes.T[None].copy()), torch.ones(1, 24))
    full = full.numpy().reshape(-1)

    def stream(left):
        graphs = {}

        def run(x, n):
            graphs.setdefault(n, build_code2wav(c, st.tensors, left + n, n))
            with torch.no_grad():
                return graphs[n](torch.from_numpy(x["codes"]), torch.from_numpy(x["frame_mask"])).numpy()

        s = host.ChunkStream(run, left, 8, c.samples_per_frame, (1, 2, 4))
        pieces = [s.push(frame) for frame in codes]
        return pieces, np.concatenate([p for ps in pieces for p in ps] + s.finish()), sorted(graphs)

    pieces, wav, shapes = stream(reach)
    assert shapes == [1, 2, 4, 8]
    assert [len(p) for p in pieces[:4]] == [1, 0, 1, 0]                # audio after frames 1 and 3
    assert len(pieces[0][0]) == c.samples_per_frame
    assert wav.shape == full.shape and snr(full, wav) >= 100
    assert snr(full, stream(reach // 2)[1]) < 60


def test_executorch_form_is_the_same_function(tmp_path):
    """Code2Wav's .pte form (recipes/qwen3_tts/xnnpack.py: means as matmuls, grouped attention as bmm,
    SiLU as x * sigmoid(x), the frame mask's repeats as matmuls with ones) computes what the chunk
    graph computes, padded frames included; the eager module keeps its plain forms after it ran."""
    from omni_export.recipes.qwen3_tts.xnnpack import Forms

    st = load(tmp_path, 0)
    m = build_code2wav(st.config, st.tensors, 7, 2)
    codes = torch.from_numpy(host.synthetic_codes(7, 16, st.config.codebook_size, seed=1).T[None].copy())
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]], dtype=torch.float32)      # a first chunk: 2 padded frames
    with torch.no_grad():
        ref, form = m(codes, mask), m.executorch_variant()(codes, mask)
    assert not Forms.on
    assert snr(ref.numpy(), form.numpy()) > 100


def test_fp16_gelu_form_stays_within_an_fp16_step():
    """XNNPACK has no fp16 GELU: the fp16 form is GELU's tanh form as x * sigmoid(...). Computed in
    fp16 it stays within 2.0e-3 of the erf form of its input (one fp16 step near 2; PyTorch's own fp16
    GELU: 1.0e-3; x * sigmoid(1.702 x), the other common form, is 2e-2 off); in fp32 the form keeps
    F.gelu (XNNPACK takes it)."""
    from omni_export.recipes.qwen3_tts.xnnpack import Forms, gelu

    x = torch.linspace(-12, 12, 48001).half()
    exact = torch.nn.functional.gelu(x.double())
    Forms.on = True
    try:
        form = gelu(x).double()
        assert torch.equal(gelu(x.float()), torch.nn.functional.gelu(x.float()))
    finally:
        Forms.on = False
    assert (form - exact).abs().max() <= 2.0e-3
    assert not torch.equal(form, torch.nn.functional.gelu(x).double())     # the form did run


def test_fp16_pte_is_one_xnnpack_delegate_after_the_codebook_lookup(fp16_build):
    """Code2Wav's fp16 .pte: the codebook gather and its sum stay on portable kernels, everything after
    them is one XNNPACK delegate (in the plain forms, 23: each RMS / layer-norm mean, GQA repeat, fp16
    SiLU / GELU and mask repeat split the graph). The manifest records it for every .pte."""
    from conftest import read_manifest

    pte = {b["component"]: b["details"] for b in read_manifest(fp16_build)["builds"] if b["format"] == "pte"}
    assert pte["code2wav"]["xnnpack_delegates"] <= 2 and pte["code2wav"]["portable_ops"] < 25, pte["code2wav"]

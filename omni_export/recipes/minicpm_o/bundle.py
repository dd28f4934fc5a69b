"""What a MiniCPM-o bundle carries beyond its graphs (artifacts/bundle.py): the voice path's host data
(the embedding tables the host gathers rows from, the NSF source's linear layer, config) and its rules
(condition building, KV layout and update, sampling, the codes -> mel -> wav chain: flow-encoder
windows, the DiT Euler schedule with CFG, HiFT with its host source and iSTFT), as
`synth minicpm-o --bundle` runs them.

Bundle layout (paths relative to the bundle):
  model/config.json                  the checkpoint's (tts_config: sizes, special ids, sampling defaults)
  model/host_tables.safetensors      text_embedding [num_text_tokens, H] (tts.emb_text), code_embedding
                                     [V, H] (tts.emb_code.0), in the checkpoint's dtype; with HiFT:
                                     hift_source_weight [1, K + 1] / hift_source_bias [1] (m_source.l_linear)

The LLM that produces the hidden states is not part of the voice path and not bundled: the app feeds
its last hidden states and the spoken token ids (synth's --hidden-states / --text-ids).
"""
from __future__ import annotations

from pathlib import Path

from ...core import UsageError

MODEL_DIR = "model"
TABLES = f"{MODEL_DIR}/host_tables.safetensors"
INDEX = "model.safetensors.index.json"
SOURCES = {"text_embedding": "tts.emb_text.weight", "code_embedding": "tts.emb_code.0.weight"}
HIFT_SOURCES = {"hift_source_weight": "m_source.l_linear.weight", "hift_source_bias": "m_source.l_linear.bias"}
BUNDLED_OPTIONS = ("prefill-tokens", "context-length", "flow-tokens", "mel-frames", "flow-steps")
SPEECH_CODES_PER_S = 25


def host(m: dict, out: Path):
    """artifacts.bundle.Bundle for MiniCPM-o build `m`, read from the checkpoint (and token2wav
    directory) the build recorded, weight files checked against the manifest's sha256."""
    from ...artifacts.bundle import Bundle, source_checkpoint
    from . import checkpoint as ck
    from .host import MASKED, REPETITION_WINDOW
    from .recipe import RECIPE
    from .token2wav import CFG_RATE, FREQ_DIM, TIME_SCALE, t_span

    path = Path(m["checkpoint"]["path"])
    files = _table_files(path)
    path = source_checkpoint(m, out, ("config.json", *sorted(set(files.values()))))
    cfg = ck.read_config(path)
    opts = (m.get("options") or {}).get("recipe_options", {})
    defaults = {x.name: x.default for x in RECIPE.options}
    o = {k: int(opts[k]) if opts.get(k) is not None else defaults[k] for k in BUNDLED_OPTIONS}
    comps = m.get("components") or {}
    conf = (m.get("checkpoint") or {}).get("config") or {}
    hift = conf.get("hift") if "hift" in comps else None
    hift_file = _hift_file(m, out) if hift else None
    tables, write_tables = _tables(path, files, hift_file)
    c, p, n, steps, frames = cfg, int(o["prefill-tokens"]), int(o["flow-tokens"]), int(o["flow-steps"]), \
        int(o["mel-frames"])
    up = int(hift["hop"] * _prod(hift["upsample_rates"])) if hift else 480
    rate = int(hift["sampling_rate"]) if hift else 24000
    host_rt = {
        "sample_rate": rate, "codes_per_second": SPEECH_CODES_PER_S, "options": o,
        "model_config": {"config": f"{MODEL_DIR}/config.json"},
        "tables": {"file": TABLES, "tensors": tables},
        "special_ids": {"text_eos": c.text_eos_token_id, "audio_bos": c.audio_bos_token_id, "eos_code": c.eos_code},
        "condition": {
            "graph": "tts_condition", "inputs": "the app's LLM: last hidden states [T, llm_dim] of the spoken tokens "
                                                f"(llm_dim {c.llm_dim}) and those tokens' ids [T]",
            "rule": f"blocks of {p} tokens: tts_condition(llm_hidden, text_embedding[ids]) (both zero-padded to the "
                    "block), real rows kept; then the rows text_embedding[text_eos] and text_embedding[audio_bos]: "
                    "T + 2 condition rows at positions 0..T+1"},
        "sampling": {"temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p,
                     "repetition_penalty": c.repetition_penalty, "repetition_window": REPETITION_WINDOW,
                     "min_new_tokens": 50, "max_codes": 200,
                     "rule": "logits / temperature; codes among the last repetition_window generated ones penalised "
                             "(negative logits x penalty^count, positive / penalty^count); top-k, then top-p (the "
                             "smallest set reaching top_p); eos_code masked for the first min_new_tokens codes; a "
                             "seeded numpy default_rng draws; greedy: argmax",
                     "source": "config.json tts_config (min_new_tokens, max_codes: synth's defaults)"},
        "kv_cache": {"layers": c.num_hidden_layers, "kv_heads": c.num_key_value_heads, "head_dim": c.head_dim,
                     "context": int(o["context-length"]), "dtype": "float32",
                     "layout": f"past_key_{{i}} / past_value_{{i}}: [1, {c.num_key_value_heads}, {o['context-length']}, "
                               f"{c.head_dim}] per layer i; slot = position",
                     "bytes": 2 * c.num_hidden_layers * c.num_key_value_heads * int(o["context-length"]) * c.head_dim * 4,
                     "update": f"tts_prefill takes the condition rows in blocks of {p} (the last zero-padded), "
                               "tts_decode one code_embedding row per step; each returns new_key_{i} / new_value_{i} "
                               "[1, kv_heads, n, head_dim]; the host writes the real rows into slots pos..pos+n-1 and "
                               f"advances pos; attn_mask [1, 1, n, C + n] is 0 over slots < pos and causal over the "
                               f"new rows, {MASKED:g} elsewhere; cos/sin are RoPE (theta {c.rope_theta:g}, "
                               "rotate-half) at the rows' positions; generation stops at eos_code, max codes or a "
                               "full context"},
        "token2wav": {
            "flow_encoder": {"graph": "flow_encoder_chunk", "tokens": n, "mel_frames_per_token": 2,
                             "config": conf.get("flow_encoder"),
                             "rule": f"codes (each clamped to the encoder's vocabulary - 1) in windows of {n} tokens, "
                                     "zero-padded, token_mask 1 on real ones; each window alone (no context across "
                                     "windows); mu = the first 2 x real tokens frames"},
            "dit": {"graph": "dit_step", "frames": frames, "steps": steps, "cfg_rate": CFG_RATE,
                    "t_span": [round(float(t), 9) for t in t_span(steps)], "config": conf.get("dit"),
                    "rule": f"one window of {frames} mel frames: codes beyond {frames // 2} are dropped; x0 = seeded "
                            "standard normal [1, mels, M]; mu, cond, mask zero beyond the real frames; per step k: "
                            "v = dit_step(x, mu, spks, cond, mask, t_freq(t_span[k])); v = (1 + cfg_rate) v[0] - "
                            "cfg_rate v[1]; x += (t_span[k+1] - t_span[k]) v; mel = x over the real frames",
                    "t_freq": f"float64 [cos(a), sin(a)] with a = {TIME_SCALE:g} t exp(-ln(10000) i / {FREQ_DIM // 2}), "
                              f"i < {FREQ_DIM // 2}, cast to float32 [1, {FREQ_DIM}]"},
            "speaker": {"spks": "no voice prompt: 0.3 x a seeded standard normal [1, mels] stands in for campplus' "
                                "projected speaker embedding (drawn after x0 from the same generator)",
                        "cond": "zeros (no prompt mel)",
                        "not_bundled": "campplus.onnx and a reference voice's prompt mel / speech tokens: a voice "
                                       "prompt is not supported by synth minicpm-o yet"},
            "vocoder": ({"graphs": ["hift_f0", "hift"], "samples_per_mel_frame": up, "config": hift,
                         "placement": "hift_f0 at fp32 on the CPU (its f0 is integrated into the source phase; fp16 "
                                      "rounding drifts it), hift on the target's unit",
                         "rule": "mel padded to the window by repeating its last frame; f0 = hift_f0(mel); host NSF "
                                 "source in float64: harmonics k = 1..K+1 of f0, phase = 2 pi x linearly upsampled "
                                 "running sum of (k f0 / sample_rate mod 1) x U, sine 0.1 sin(phase) where f0 > 10 Hz, "
                                 "plus seeded noise (std 0.003 voiced, 0.1/3 unvoiced), source = tanh(hift_source_weight "
                                 "@ sine + hift_source_bias), reflect-padded by n_fft / 2; (magnitude, phase) = "
                                 "hift(mel, source); iSTFT (periodic hann, centred) in float64, clamp to "
                                 "+-audio_limit; keep real frames x U samples"}
                        if hift else None)},
        "loop": ["condition rows from the LLM hidden states and ids (tts_condition) + text_eos, audio_bos rows",
                 "tts_prefill over the condition; sample the first code from the last real row's logits",
                 "per code (40 ms): tts_decode(code_embedding[code]) at the next position -> the next code; stop at "
                 "eos_code, max codes or a full context",
                 "codes -> mu (flow_encoder_chunk windows) -> mel (dit_step Euler steps with CFG, seeded noise)",
                 "mel -> wav: hift_f0 (fp32, CPU), host NSF source, hift, host iSTFT"
                 + ("" if hift else " (not in this bundle: no accepted HiFT graphs)")],
    }

    readme = "\n".join([
        "## Host loop (MiniCPM-o voice path)", "",
        f"The app's LLM gives its last hidden states and the spoken token ids; `{TABLES}` holds the text and code "
        f"embedding rows the host gathers. One code is 40 ms of speech ({SPEECH_CODES_PER_S} Hz). Codes become a "
        f"50 Hz mel through `flow_encoder_chunk` ({n}-token windows) and {steps} `dit_step` Euler steps with CFG "
        f"{CFG_RATE:g}" + (f", then {rate} Hz audio through `hift_f0` (fp32, CPU), the host's NSF source, `hift` and "
                            "the host's iSTFT" if hift else "") +
        ". The KV cache, sampling, the step schedule and the vocoder's host work are in `runtime.json` under `host`.",
        "", "Try it on this machine (no checkpoint, no build directory; without --hidden-states a seeded "
        "synthetic utterance):", "",
        "```sh", "omni-export synth minicpm-o --bundle THIS_DIR --greedy --codes-out codes.npy --mel-out mel.npy"
        + (" --wav out.wav" if hift else ""), "```"])
    return Bundle(host=host_rt, copies=[(f"{MODEL_DIR}/config.json", path / "config.json", "model config")],
                  blobs=[(TABLES, write_tables, "host embedding tables")], readme=readme,
                  note="a voice prompt (campplus.onnx for the speaker embedding, a reference's prompt mel and speech "
                       "tokens): the host's speaker vector is a seeded stand-in and cond is zeros, as in synth minicpm-o"
                       + ("" if hift else "; the HiFT vocoder's graphs are not in this build, so the bundle stops at "
                                          "the mel (no wav)"))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def _table_files(path: Path) -> dict[str, str]:
    """{tensor name: the weight file (relative to the checkpoint) that holds it}."""
    from .checkpoint import read_json

    if (path / INDEX).is_file():
        wm = read_json(path / INDEX, "weight index").get("weight_map")
        if not isinstance(wm, dict) or any(not isinstance(wm.get(n), str) for n in SOURCES.values()):
            raise UsageError(f"{path / INDEX}: its weight_map does not name the files of "
                             f"{', '.join(SOURCES.values())}")
        return {n: wm[n] for n in SOURCES.values()}
    return {n: "model.safetensors" for n in SOURCES.values()}


def _hift_file(m: dict, out: Path) -> Path:
    """token2wav's hift.safetensors beside the flow the build recorded, checked like the weights."""
    from ...artifacts.store import sha256_file
    from .hift import hift_path

    flow = Path(m["checkpoint"]["config"]["token2wav"])
    f = hift_path(flow.parent) if flow.parent.is_dir() else None
    if f is None:
        raise UsageError(f"{out}: its token2wav directory {flow.parent} has no hift.safetensors any more; the bundle "
                         f"takes the vocoder's source layer from it (restore it there, or rebuild)")
    root = Path(m["checkpoint"]["path"]).resolve()
    rec = {w["path"]: w.get("sha256") for w in m["checkpoint"].get("weights", [])}
    rel = f.resolve().relative_to(root).as_posix() if root in f.resolve().parents else None
    if rel and rec.get(rel) and sha256_file(f) != rec[rel]:
        raise UsageError(f"{f} is not the file {out} was built from (its sha256 differs from manifest.json's); rebuild")
    return f


def _tables(path: Path, files: dict, hift_file: Path | None):
    """(runtime.json's description of the host tables, a writer of them) in the checkpoint's dtype."""
    from ...weights import read_header

    desc, uses = {}, {"text_embedding": "rows of the spoken token ids (tts_condition's text_embeds) and of "
                                        "text_eos / audio_bos (the condition's last two rows)",
                      "code_embedding": "the row of the last code: tts_decode's inputs_embeds",
                      "hift_source_weight": "the NSF source's l_linear weight [1, harmonics + 1] (host, float64)",
                      "hift_source_bias": "the NSF source's l_linear bias [1]"}
    for k, name in SOURCES.items():
        h = read_header(path / files[name])[name]
        desc[k] = {"shape": list(h["shape"]), "dtype": h["dtype"], "use": uses[k], "source": name}
    hift = None
    if hift_file is not None:
        from .hift import load_hift

        hift = load_hift(hift_file)[1]
        for k, name in HIFT_SOURCES.items():
            desc[k] = {"shape": list(hift[name].shape), "dtype": "F32", "use": uses[k], "source": name}

    def write(dest: Path) -> None:
        from safetensors import safe_open
        from safetensors.torch import save_file

        out = {}
        for k, name in SOURCES.items():
            with safe_open(str(path / files[name]), "pt") as f:
                out[k] = f.get_tensor(name).contiguous()
        for k, name in HIFT_SOURCES.items() if hift is not None else ():
            out[k] = hift[name].float().contiguous()
        save_file(out, str(dest))
    return desc, write


# ------------------------------------------------------------------------------------ synth --bundle

def load_bundle(root: Path, rt: dict):
    """model.MiniCPMO from a bundle: tts_config from model/config.json, the host tables, the graphs'
    sizes from runtime.json, and the token2wav geometry its host rules need."""
    from safetensors import safe_open

    from . import checkpoint as ck
    from .flow_encoder import EncoderConfig
    from .hift import HiFTConfig
    from .host import Tables
    from .model import MiniCPMO
    from .recipe import RECIPE
    from .token2wav import DiTConfig

    h = rt["host"]
    cfg = ck.read_config(root / MODEL_DIR)
    path = root / h["tables"]["file"]
    try:
        with safe_open(str(path), "pt") as f:
            got = {k: f.get_tensor(k).float() for k in f.keys()}
    except Exception as e:         # the library raises plain Exceptions for malformed files
        raise UsageError(f"{path}: not a readable safetensors file of the host tables ({str(e)[:200]})") from None
    for k, want in h["tables"]["tensors"].items():
        if k not in got or list(got[k].shape) != list(want["shape"]):
            raise UsageError(f"{path}: {k} is {list(got[k].shape) if k in got else 'missing'}, runtime.json says "
                             f"{want['shape']}")
    if list(got["text_embedding"].shape) != [cfg.num_text_tokens, cfg.hidden_size] or \
            list(got["code_embedding"].shape) != [cfg.num_audio_tokens, cfg.hidden_size]:
        raise UsageError(f"{path}: the tables do not fit {root / MODEL_DIR / 'config.json'}'s tts_config")
    options = {**{o.name: o.default for o in RECIPE.options}, **h["options"], "random-weights": False}
    model = MiniCPMO(root / MODEL_DIR, options, cfg, {})
    model.__dict__["tables"] = Tables(got["text_embedding"].numpy(), got["code_embedding"].numpy())
    t2w, graphs = h["token2wav"], rt["graphs"]
    if "flow_encoder_chunk" in graphs and t2w["flow_encoder"]["config"]:
        model.encoder = (EncoderConfig(**t2w["flow_encoder"]["config"]), None)
    if "dit_step" in graphs and t2w["dit"]["config"]:
        model.dit = (DiTConfig(**t2w["dit"]["config"]), None)
    voc = t2w.get("vocoder")
    if voc and {"hift_f0", "hift"} <= set(graphs):
        hc = HiFTConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in voc["config"].items()})
        model.hift = (hc, {HIFT_SOURCES[k]: got[k] for k in HIFT_SOURCES})
    model.info = {"path": str(root), "label": f"bundle of {rt['checkpoint']['label']}"}
    return model


def synth(kw: dict) -> dict:
    """`synth minicpm-o --bundle DIR`: (hidden states, ids) -> codes -> mel -> wav from the bundle alone:
    its runtime.json (checked: schema, paths, sha256), its graphs and host data; the loop is synth's own."""
    from ...runtime.synth import open_bundle
    from .synth import _run

    root, rt, graphs = open_bundle(kw, "minicpm-o")
    return _run(load_bundle(root, rt), None, {**kw, "runner": "bundle"}, f"the bundle {root}", graphs=graphs)

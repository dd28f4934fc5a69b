"""What a Qwen3-TTS bundle carries beyond its graphs (artifacts/bundle.py): the host loop's data
(embedding tables the host gathers from, config, tokenizer, generation defaults) and its rules
(prompt template, KV layout and update, sampling, Code2Wav streaming), as `synth --bundle` runs them.

Bundle layout (paths relative to the bundle):
  model/config.json, model/speech_tokenizer/config.json, model/generation_config.json (if any)
  model/<tokenizer files>            tokenizer.json, or vocab.json + merges.txt (+ tokenizer_config.json)
  model/host_tables.safetensors      text_embedding [text vocab, Tw], codec_embedding [3072, Ht],
                                     predictor_codec_embedding [15, 2048, Ht], in the checkpoint's dtype
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ...core import UsageError

MODEL_DIR = "model"
TABLES = f"{MODEL_DIR}/host_tables.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")
# host table name in the bundle -> the checkpoint tensor it is (predictor tables stacked)
TABLE_SOURCES = {"text_embedding": "talker.model.text_embedding.weight",
                 "codec_embedding": "talker.model.codec_embedding.weight",
                 "predictor_codec_embedding": "talker.code_predictor.model.codec_embedding.{j}.weight"}
BUNDLED_OPTIONS = ("prefill-tokens", "context-length", "chunk-frames", "left-context", "chunk-schedule",
                   "speaker-frames")


def host(m: dict, out: Path):
    """artifacts.bundle.Bundle for build `m`: the checkpoint's host data, read from the checkpoint the
    build recorded (its model.safetensors checked against the manifest's sha256)."""
    from ...artifacts.bundle import Bundle, source_checkpoint
    from . import checkpoint as ck
    from ...core import variant_name
    from .model import parse_schedule
    from .prompt import ASSISTANT_TEMPLATE, INSTRUCT_TEMPLATE
    from .synth import _gen_kwargs

    path = source_checkpoint(m, out, ("config.json", "model.safetensors"))
    cfg = ck.read_model_config(path)
    c2w, raw = ck.read_code2wav_config(path)
    rate = raw.get("output_sample_rate", 24000)
    opts = {**(m.get("options") or {}).get("recipe_options", {})}
    comps = m.get("components") or {}
    split_talker = any(c.endswith("_part1") for c in comps)
    copies = [(f"{MODEL_DIR}/config.json", path / "config.json", "model config"),
              (f"{MODEL_DIR}/speech_tokenizer/config.json", path / "speech_tokenizer" / "config.json",
               "speech tokenizer config")]
    if (path / "generation_config.json").is_file():
        copies.append((f"{MODEL_DIR}/generation_config.json", path / "generation_config.json", "generation config"))
    tok = [n for n in TOKENIZER_FILES if (path / n).is_file()]
    copies += [(f"{MODEL_DIR}/{n}", path / n, "tokenizer") for n in tok]
    split = _split(path) if tok else None
    gen = _gen_kwargs(SimpleNamespace(path=path, options=opts), {})[0]
    t, p = cfg.talker, cfg.predictor
    tables, write_tables = _tables(path, cfg)
    sampling = {"do_sample": not gen["greedy"], "temperature": gen["temperature"], "top_k": gen["top_k"],
                "top_p": gen["top_p"], "repetition_penalty": gen["repetition_penalty"],
                "subtalker_dosample": not gen["sub_greedy"], "subtalker_temperature": gen["sub_temperature"],
                "subtalker_top_k": gen["sub_top_k"], "subtalker_top_p": gen["sub_top_p"],
                "max_new_tokens": gen["max_frames"] + 1, "min_new_tokens": 2,
                "suppressed_codes": f"[{t.vocab_size - 1024}, {t.vocab_size}) except codec_eos",
                "source": "generation_config.json, else upstream's defaults (synth --help)"}
    context = int(opts.get("context-length") or 1024)
    chunk = int(opts.get("chunk-frames") or 0)
    schedule = tuple(min(n, chunk) for n in parse_schedule(opts.get("chunk-schedule")))
    host_rt = {
        "sample_rate": int(rate), "samples_per_frame": c2w.samples_per_frame,
        "frame_ms": round(1000 * c2w.samples_per_frame / rate, 3),
        "options": {k: opts.get(k) for k in BUNDLED_OPTIONS} | {"talker-parts": 2 if split_talker else 1},
        "tokenizer": {"files": [f"{MODEL_DIR}/{n}" for n in tok], "template": ASSISTANT_TEMPLATE,
                      "instruct_template": INSTRUCT_TEMPLATE, **({"text_split": split} if split else {})},
        "model_config": {k: rel for k, (rel, _, _) in zip(("config", "speech_tokenizer", "generation_config"), copies)
                         if rel.endswith("config.json") and "tokenizer_config" not in rel},
        "tables": {"file": TABLES, "tensors": tables},
        "tts_model_type": cfg.tts_model_type,
        "speakers": dict(t.spk_id or {}), "languages": dict(t.codec_language_id or {}),
        "special_ids": {"tts_bos": cfg.tts_bos_token_id, "tts_eos": cfg.tts_eos_token_id,
                        "tts_pad": cfg.tts_pad_token_id, "codec_pad": t.codec_pad_id, "codec_bos": t.codec_bos_id,
                        "codec_eos": t.codec_eos_token_id, "codec_think": t.codec_think_id,
                        "codec_nothink": t.codec_nothink_id, "codec_think_bos": t.codec_think_bos_id,
                        "codec_think_eos": t.codec_think_eos_id},
        "sampling": sampling,
        "kv_cache": {
            "talker": {"layers": t.num_hidden_layers, "kv_heads": t.num_key_value_heads, "head_dim": t.head_dim,
                       "context": context, "dtype": "float32",
                       "layout": f"past_key_{{i}} / past_value_{{i}}: [1, {t.num_key_value_heads}, {context}, "
                                 f"{t.head_dim}] per layer i (a split talker: part1 takes layers below its split, "
                                 f"part2 the rest, with global numbers)",
                       "update": "a call feeds n rows at positions pos..pos+n-1 (prefill: blocks of prefill-tokens "
                                 "rows, the last block padded by repeating its last row; decode: 1 row) and returns "
                                 "new_key_{i} / new_value_{i} [1, kv_heads, n, head_dim]; the host writes the real "
                                 "rows into slots pos..pos+n-1 and advances pos; attn_mask [1, 1, n, context + n] is "
                                 "0 over slots < pos and causal over the new rows, -100 elsewhere; cos/sin are RoPE "
                                 f"(theta {t.rope_theta}) at the rows' positions; generation stops when pos reaches "
                                 "the context"},
            "predictor": {"layers": p.num_hidden_layers, "kv_heads": p.num_key_value_heads, "head_dim": p.head_dim,
                          "slots": 17, "layout": "past_key_{i} / past_value_{i}: [1, kv_heads, 17, head_dim]",
                          "update": "reset every frame: predictor_prefill's two new positions go to slots 0..1, step "
                                    "s (1..14) writes slot s + 1; the fused predictor_frame graph keeps its cache "
                                    "inside"}},
        "streaming": {"graph": "code2wav", "chunk_frames": chunk, "left_context_frames": int(opts.get("left-context") or 0),
                      "schedule": list(schedule),
                      "chunk_graphs": {str(n): ("code2wav" if n == chunk else variant_name("code2wav", "N", n))
                                       for n in sorted({chunk, *schedule})},
                      "rule": "upstream's chunked_decode: chunk k has schedule[k] new frames (then chunk_frames for "
                              "ever) and runs chunk_graphs[its size]; each call decodes a window of left_context + "
                              "its new frames (codes [1, 16, L + n], frame_mask 1 on real frames); the first chunks "
                              "have less context; keep the graph's last n * samples_per_frame output samples, of "
                              "which the first m * samples_per_frame for a last chunk of m < n frames"},
        "loop": ["text ids = tokenizer(template with the text); prompt rows = text_projection(text_embedding[ids]) "
                 "plus codec_embedding rows of the speaker / language / think ids (prompt.py builds them as "
                 "upstream's generate)",
                 "talker_prefill over the prompt rows -> logits, hidden; sample code 0 (repetition penalty, "
                 "suppressed codes, then temperature / top-k / top-p)",
                 "per frame: predictor_frame(hidden, code 0, Gumbel noise) -> codes 1..15 and the summed 16-codebook "
                 "embedding (or predictor_prefill + 14 predictor_decode steps, summing codec_embedding and "
                 "predictor_codec_embedding rows on the host)",
                 "talker_decode(embedding + the next trailing text row, or tts_pad's) -> the next code 0; stop at "
                 "codec_eos, max_new_tokens or a full context",
                 "code2wav over the codes in streaming chunks -> 24 kHz samples"],
    }
    readme = "\n".join([
        "## Host loop (Qwen3-TTS)", "",
        f"Text is tokenized with the files under `{MODEL_DIR}/` and templated as `host.tokenizer.template`; "
        f"`{TABLES}` holds the embedding tables the host gathers rows from. One {host_rt['frame_ms']:g} ms frame is one talker "
        f"step plus one code-predictor frame; `code2wav` turns {host_rt['streaming']['chunk_frames']} frames "
        f"(with {host_rt['streaming']['left_context_frames']} of left context) into "
        f"{host_rt['sample_rate']} Hz audio. The KV caches, the sampling defaults and the streaming rule are in "
        "`runtime.json` under `host`.", "",
        "Try it on this machine (no checkpoint, no build directory):", "",
        "```sh", "omni-export synth qwen3-tts --bundle THIS_DIR --text \"Hello there.\" --wav hello.wav", "```",
        "", f"Speakers: {', '.join(sorted(host_rt['speakers'])) or 'none (pass a reference voice)'}; languages: "
            f"auto, {', '.join(sorted(k for k in host_rt['languages'] if 'dialect' not in k))}."])
    return Bundle(host=host_rt, copies=copies, blobs=[(TABLES, write_tables, "host embedding tables")], readme=readme,
                  note="" if cfg.tts_model_type != "base" else
                  "Base checkpoints: the reference voice's log-mel is computed on the host (speaker.py); its "
                  "parameters are not in runtime.json yet")


def _split(path: Path) -> str:
    from ...text_tokenizer import load

    return load(path, "auto").split


def _tables(path: Path, cfg):
    """(runtime.json's description of the host tables, a writer of them) in the checkpoint's dtype:
    the fp32 the host computes in is an exact widening of it."""
    from ...weights import read_header

    header = read_header(path / "model.safetensors")
    q1 = cfg.predictor.num_code_groups - 1
    dtypes = {k: header[v.format(j=0)]["dtype"] for k, v in TABLE_SOURCES.items()}
    shapes = {"text_embedding": [cfg.talker.text_vocab_size, cfg.talker.text_hidden_size],
              "codec_embedding": [cfg.talker.vocab_size, cfg.talker.hidden_size],
              "predictor_codec_embedding": [q1, cfg.predictor.vocab_size, cfg.talker.hidden_size]}
    uses = {"text_embedding": "rows of the text ids, fed to text_projection (input text_embeds)",
            "codec_embedding": "talker codec rows: prompt codec ids and code 0 of each frame",
            "predictor_codec_embedding": "[g - 1] holds codebook g's rows (g = 1..15); with codec_embedding[code 0] "
                                         "their sum is the next talker input (the step-graph predictor)"}
    desc = {k: {"shape": shapes[k], "dtype": dtypes[k], "use": uses[k]} for k in TABLE_SOURCES}

    def write(dest: Path) -> None:
        """The tables as stored (no conversion: the checkpoint's bytes); its sha256 was checked."""
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            out = {"text_embedding": f.get_tensor(TABLE_SOURCES["text_embedding"]),
                   "codec_embedding": f.get_tensor(TABLE_SOURCES["codec_embedding"]),
                   "predictor_codec_embedding": torch.stack(
                       [f.get_tensor(TABLE_SOURCES["predictor_codec_embedding"].format(j=j)) for j in range(q1)])}
        save_file({k: v.contiguous() for k, v in out.items()}, str(dest))
    return desc, write


def read_tables(bundle: Path, rt: dict):
    """model.HostTables from the bundle's host_tables.safetensors (widened to fp32)."""
    from safetensors import safe_open

    from .model import HostTables

    path = bundle / rt["host"]["tables"]["file"]
    want = rt["host"]["tables"]["tensors"]
    try:
        with safe_open(str(path), "pt") as f:
            got = {k: f.get_tensor(k).float().numpy() for k in ("text_embedding", "codec_embedding",
                                                                "predictor_codec_embedding")}
    except Exception as e:         # the library raises plain Exceptions for malformed files
        raise UsageError(f"{path}: not a readable safetensors file of the host tables ({str(e)[:200]})") from None
    for k, a in got.items():
        if list(a.shape) != list(want.get(k, {}).get("shape", a.shape)):
            raise UsageError(f"{path}: {k} has shape {list(a.shape)}, runtime.json says {want[k]['shape']}")
    return HostTables(got["text_embedding"], got["codec_embedding"], got["predictor_codec_embedding"])


# ------------------------------------------------------------------------------------ synth --bundle

def synth(kw: dict) -> dict:
    """`synth qwen3-tts --bundle DIR`: text (or ids, or codes) -> WAV from the bundle alone: its
    runtime.json (checked: schema, paths, sha256), its graphs and its host data; the host loop is
    synth's own (synth._run over graphs.BuildGraphs.from_bundle)."""
    from ...runtime.synth import open_bundle
    from .synth import _run

    root, rt, graphs = open_bundle(kw, "qwen3-tts")
    model = load_bundle(root, rt)
    kept = (rt["host"].get("tokenizer") or {}).get("text_split")
    if kept and (kw.get("text_split") or "auto") == "auto" and (kw.get("text") or kw.get("instruct") or kw.get("ref_text")):
        kw = {**kw, "text_split": kept}      # the split the build's graphs were judged with, as runtime.json says
    return _run(model, root, {**kw, "runner": "bundle"}, f"the bundle {root}", graphs=graphs)


def load_bundle(root: Path, rt: dict):
    """model.Qwen3TTS from a bundle: config, speech tokenizer config and tokenizer from model/, the
    host tables from host_tables.safetensors, the graphs' recipe options from runtime.json."""
    from . import checkpoint as ck
    from .model import Qwen3TTS
    from .recipe import RECIPE

    d = root / MODEL_DIR
    options = {**{o.name: o.default for o in RECIPE.options}, **rt["host"]["options"], "random-weights": False}
    model = Qwen3TTS(d, None, options)
    model.cfg = ck.read_model_config(d)
    c2w, raw = ck.read_code2wav_config(d)
    model.speech = ck.SpeechTokenizer(d / "speech_tokenizer", c2w, int(rt["host"]["sample_rate"]), {})
    model.__dict__["tables"] = read_tables(root, rt)
    model.info = {"path": str(root), "label": f"bundle of {rt['checkpoint']['label']}",
                  "tts_model_type": model.cfg.tts_model_type}
    return model

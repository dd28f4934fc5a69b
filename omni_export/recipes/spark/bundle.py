"""What a Spark-X2.5 bundle carries beyond its graphs (artifacts/bundle.py): the host loop's data (the
token embedding table the host gathers rows from, config, generation config, tokenizer) and its rules
(prompt template, the two KV layouts and how they advance, per-layer-type RoPE and masks, sampling,
stop ids), as `synth spark --bundle` runs them.

Bundle layout (paths relative to the bundle):
  model/config.json, model/generation_config.json (if any)
  model/<tokenizer files>            tokenizer.json, or vocab.json + merges.txt (+ tokenizer_config.json)
  model/host_tables.safetensors      embedding [V, H] (model.embedding.weight, in the checkpoint's dtype;
                                     tied: the graphs hold the same matrix as their LM head)
"""
from __future__ import annotations

import json
from pathlib import Path

from ...core import UsageError

MODEL_DIR = "model"
TABLES = f"{MODEL_DIR}/host_tables.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json")
EMBEDDING = "model.embedding.weight"
TEMPLATE = "{prompt}"           # synth tokenises the prompt as given: no chat template is applied
GENERATION_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens")
BUNDLED_OPTIONS = ("prefill-tokens", "context-length")


def host(m: dict, out: Path):
    """artifacts.bundle.Bundle for Spark build `m`, read from the checkpoint the build recorded (its
    model.safetensors checked against the manifest's sha256)."""
    from ...artifacts.bundle import Bundle, source_checkpoint
    from ...weights import read_header
    from .config import FULL, SLIDING, read_config
    from .host import MASK
    from .recipe import RECIPE

    path = source_checkpoint(m, out, ("config.json", "model.safetensors"))
    cfg = read_config(path)
    opts = (m.get("options") or {}).get("recipe_options", {})
    defaults = {x.name: x.default for x in RECIPE.options}
    n, context = (int(opts.get(k) or defaults[k]) for k in BUNDLED_OPTIONS)
    tok = [f for f in TOKENIZER_FILES if (path / f).is_file()]
    copies = [(f"{MODEL_DIR}/config.json", path / "config.json", "model config")]
    gen = _generation_config(path)
    if gen is not None:
        copies.append((f"{MODEL_DIR}/generation_config.json", path / "generation_config.json", "generation config"))
    copies += [(f"{MODEL_DIR}/{f}", path / f, "tokenizer") for f in tok]
    dtype = read_header(path / "model.safetensors")[EMBEDDING]["dtype"]
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else \
        ([cfg.eos_token_id] if isinstance(cfg.eos_token_id, int) else [])
    kv, hd, w, ls, lf = cfg.num_key_value_heads, cfg.head_dim, cfg.sliding_window, cfg.sliding_layers, cfg.full_layers
    per_slot = 2 * kv * hd * 4              # key + value rows, float32
    host_rt = {
        "options": {"prefill-tokens": n, "context-length": context},
        "tokenizer": {"files": [f"{MODEL_DIR}/{f}" for f in tok], "template": TEMPLATE, "text_split": "qwen2",
                      "chat_template": "not applied: the prompt text is tokenised as given (synth spark), so the "
                                       "app applies the checkpoint's chat template, if it wants one, before "
                                       "tokenising"},
        "model_config": {"config": f"{MODEL_DIR}/config.json",
                         **({"generation_config": f"{MODEL_DIR}/generation_config.json"} if gen is not None else {})},
        "tables": {"file": TABLES, "tensors": {"embedding": {
            "shape": [cfg.vocab_size, cfg.hidden_size], "dtype": dtype,
            "use": "rows of the token ids are the graphs' inputs_embeds (widened to float32); the padding row of "
                   "a prefill block is pad_token_id's row (the block's last real token's when there is none)"}}},
        "special_ids": {"eos": eos, "pad": cfg.pad_token_id if isinstance(cfg.pad_token_id, int) else None,
                        "bos": cfg.bos_token_id if isinstance(cfg.bos_token_id, int) else None},
        "sampling": {"mode": "greedy", "rule": "the next token is argmax(logits) of the last real row; generation "
                                               "stops after an eos id (it is kept) or max tokens",
                     "generation_config": {k: gen[k] for k in GENERATION_KEYS if k in (gen or {})},
                     "source": "generation_config.json as shipped; synth spark decodes greedily whatever it says"},
        "kv_cache": {
            "layers": cfg.num_hidden_layers, "layer_types": list(cfg.layer_types), "sliding_layers": list(ls),
            "full_layers": list(lf), "kv_heads": kv, "head_dim": hd, "dtype": "float32",
            "sliding": {"inputs": "swa_key_{j} / swa_value_{j}", "shape": [1, kv, w, hd], "slots": w,
                        "layer": "j-th entry of sliding_layers",
                        "rule": f"a ring buffer of W = {w} slots: position p lives in slot p mod W; the host keeps "
                                "ring_pos[s], the position slot s holds (-1: empty); a query at position q may read "
                                "slot s when ring_pos[s] >= 0 and q - ring_pos[s] < W"},
            "full": {"inputs": "full_key_{j} / full_value_{j}", "shape": [1, kv, context, hd], "slots": context,
                     "layer": "j-th entry of full_layers", "rule": "slot = position; slots >= pos are masked"},
            "bytes": per_slot * (len(ls) * w + len(lf) * context),
            "update": "each call feeds n rows at positions pos..pos+n-1 (prefill: blocks of prefill-tokens rows, "
                      "the last block padded; decode: 1 row) and returns new_swa_* / new_full_* [1, kv, n, head_dim]; "
                      "the host writes only the real rows (full: slot = position; sliding: slot = position mod W, "
                      "ring_pos updated) and advances pos; no recomputed window ever crosses the graph boundary",
            "masks": f"additive, {MASK:g} where not allowed, 0 where allowed; mask_full [1, 1, n, C + n]: 0 over "
                     "slots < pos and causal over the n new rows; mask_swa [1, 1, n, W + n]: ring slots by the "
                     "rule above, new rows causal within the window",
            "rope": {"full": {"theta": cfg.rope_theta(FULL), "rotary_dim": cfg.rotary_dim(FULL),
                              "inputs": "cos_full / sin_full [1, n, rotary_dim]"},
                     "sliding": {"theta": cfg.rope_theta(SLIDING), "rotary_dim": cfg.rotary_dim(SLIDING),
                                 "inputs": "cos_swa / sin_swa [1, n, rotary_dim]"},
                     "rule": "NeoX (rotate-half) RoPE tables at the rows' positions, float32"},
            "context": context, "prefill_tokens": n},
        "loop": ["ids = tokenizer(template with the prompt); the prompt and the tokens to generate must fit "
                 "the context (prompt + max tokens - 1 positions)",
                 "prefill: blocks of prefill-tokens ids (embedding rows, the last block padded) through the "
                 "prefill graph; write each block's new K/V; the last real row's logits pick the first token",
                 "decode: the token's embedding row through the decode graph at position pos; write its K/V; "
                 "argmax of its logits is the next token",
                 "stop after an eos id or max tokens; detokenise the generated ids"],
    }

    def write_tables(dest: Path) -> None:
        """The embedding as stored (the checkpoint's dtype; its sha256 was checked)."""
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            save_file({"embedding": f.get_tensor(EMBEDDING).contiguous()}, str(dest))

    readme = "\n".join([
        "## Host loop (Spark-X2.5)", "",
        f"The prompt is tokenised as given with the files under `{MODEL_DIR}/` (no chat template); `{TABLES}` holds "
        f"the embedding rows the host feeds as `inputs_embeds`. Prefill runs blocks of {n} tokens, decode one "
        f"token per call. Each sliding-attention layer keeps a {w}-slot ring buffer (position p in slot p mod {w}), "
        f"each full-attention layer a {context}-slot cache ({host_rt['kv_cache']['bytes']:,} bytes of float32 K/V "
        "in all); the graphs return only the new tokens' K/V and the host writes them. Masks, RoPE tables per "
        "layer type, stop ids and sampling are in `runtime.json` under `host`.", "",
        "Try it on this machine (no checkpoint, no build directory):", "",
        "```sh", "omni-export synth spark --bundle THIS_DIR --prompt \"Hi\" --max-tokens 16", "```"])
    return Bundle(host=host_rt, copies=copies, blobs=[(TABLES, write_tables, "host embedding table")], readme=readme)


def _generation_config(path: Path) -> dict | None:
    from ...weights import read_side_file

    f = path / "generation_config.json"
    if not f.is_file():
        return None
    try:
        raw = json.loads(read_side_file(f, "generation config"))
    except ValueError as e:
        raise UsageError(f"{f}: not valid JSON ({str(e)[:200]})") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{f}: expected a JSON object")
    return raw


# ------------------------------------------------------------------------------------ synth --bundle

def load_bundle(root: Path, rt: dict):
    """model.Spark from a bundle: config and tokenizer from model/, the embedding from
    host_tables.safetensors (widened to float32), the graphs' sizes from runtime.json."""
    from safetensors import safe_open

    from .config import read_config
    from .model import Spark
    from .recipe import RECIPE

    d = root / MODEL_DIR
    cfg = read_config(d)
    path = root / rt["host"]["tables"]["file"]
    want = rt["host"]["tables"]["tensors"]["embedding"]["shape"]
    try:
        with safe_open(str(path), "pt") as f:
            emb = f.get_tensor("embedding").float()
    except Exception as e:         # the library raises plain Exceptions for malformed files
        raise UsageError(f"{path}: not a readable safetensors file of the host table ({str(e)[:200]})") from None
    if list(emb.shape) != list(want) or list(want) != [cfg.vocab_size, cfg.hidden_size]:
        raise UsageError(f"{path}: embedding has shape {list(emb.shape)}, runtime.json says {want} and config.json "
                         f"[{cfg.vocab_size}, {cfg.hidden_size}]")
    options = {**{o.name: o.default for o in RECIPE.options}, **rt["host"]["options"], "random-weights": False}
    model = Spark(d, options, cfg, {EMBEDDING: emb})
    model.info = {"path": str(root), "label": f"bundle of {rt['checkpoint']['label']}"}
    return model


def synth(kw: dict) -> dict:
    """`synth spark --bundle DIR`: prompt -> tokens from the bundle alone: its runtime.json (checked:
    schema, paths, sha256), its graphs and its host data; the loop is synth's own."""
    from ...runtime.synth import open_bundle
    from .synth import _run

    root, rt, graphs = open_bundle(kw, "spark")
    return _run(load_bundle(root, rt), None, {**kw, "runner": "bundle"}, f"the bundle {root}", graphs=graphs)

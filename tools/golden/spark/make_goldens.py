"""Golden outputs for the spark recipe from the released Spark-X2.5 modeling code, for tests/golden/spark/.

The reference is the checkpoint repo's own `modeling_spark.py` + `configuration_spark.py` (the remote
code `trust_remote_code` would run; Spark2_5ForCausalLM), which you pass with --upstream DIR. They
need transformers 4.57 (their mask helpers take the 4.5x keyword names), in their own venv:

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 transformers==4.57.3 safetensors numpy tokenizers
    PYTHONPATH=. /tmp/refvenv/bin/python tools/golden/spark/make_goldens.py --upstream DIR

What it does:
  1. writes the tiny seeded checkpoint with omni-export's own writer (numpy + safetensors; the same
     seed gives the same bytes in the tests);
  2. loads it with upstream's Spark2_5ForCausalLM.from_pretrained and fails unless every tensor
     was used and none was missing (proves our layout is upstream's);
  3. saves upstream's logits for every position of a held-out prompt that is longer than the
     sliding window (so the sliding masks matter), and upstream's greedy continuation from
     model.generate (its own DynamicCache with sliding-window layers);
  4. writes meta.json: versions and the sha256 of the two upstream files.
Only small arrays and JSON are written (tests/golden/spark/). omni-export never imports upstream code.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "golden" / "spark"
PROMPT = "Explain what a sliding-window attention layer does and why it saves memory on long inputs."
PROMPT_TOKENS = 40
GREEDY_TOKENS = 24


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True, help="directory holding modeling_spark.py and configuration_spark.py")
    args = ap.parse_args()
    up = Path(args.upstream).resolve()
    sys.path.insert(0, str(up.parent))
    pkg = importlib.import_module(f"{up.name}.modeling_spark")
    cfg_mod = importlib.import_module(f"{up.name}.configuration_spark")

    import torch
    import transformers

    sys.path.insert(0, str(ROOT))
    from omni_export.recipes.spark import checkpoint as ck
    from omni_export.text_tokenizer import load as load_tokenizer

    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = ck.write_checkpoint(Path(tmp) / "tiny", seed=0)
        cfg = cfg_mod.Spark2_5Config.from_pretrained(str(d))
        model, info = pkg.Spark2_5ForCausalLM.from_pretrained(str(d), config=cfg, dtype=torch.float32,
                                                               output_loading_info=True)
        bad = {k: list(v) for k, v in info.items() if v}
        if bad:
            raise SystemExit(f"upstream did not load our layout cleanly: {bad}")
        model.eval()
        ids = load_tokenizer(d).encode(PROMPT)[:PROMPT_TOKENS]
        assert len(ids) == PROMPT_TOKENS > cfg.sliding_window
        x = torch.tensor([ids])
        with torch.no_grad():
            logits = model(x, use_cache=False).logits[0].float().numpy()
            gen = model.generate(x, max_new_tokens=GREEDY_TOKENS, do_sample=False, use_cache=True,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):].numpy()
            # the same continuation recomputed without a cache (whole sequence each step)
            seq = list(ids)
            for _ in range(GREEDY_TOKENS):
                seq.append(int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        if seq[len(ids):] != gen.tolist():
            raise SystemExit("upstream's cached and uncached greedy decodes differ; not a usable golden")
    np.save(OUT / "prompt_ids.npy", np.asarray(ids, np.int64))
    np.save(OUT / "logits.npy", logits.astype(np.float32))
    np.save(OUT / "greedy.npy", gen.astype(np.int64))
    meta = {"reference": "Spark2_5ForCausalLM from the checkpoint repo's modeling_spark.py (trust_remote_code code)",
            "upstream_sha256": {f: hashlib.sha256((up / f).read_bytes()).hexdigest()
                                for f in ("modeling_spark.py", "configuration_spark.py")},
            "transformers": transformers.__version__, "torch": torch.__version__,
            "checkpoint": "omni_export.recipes.spark.checkpoint.write_checkpoint(seed=0) (tiny)",
            "prompt": PROMPT, "prompt_tokens": PROMPT_TOKENS, "greedy_tokens": GREEDY_TOKENS,
            "loading_info": {k: list(v) for k, v in info.items()}}
    (OUT / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps({k: meta[k] for k in ("upstream_sha256", "transformers")}, indent=2))
    print("greedy", gen.tolist())


if __name__ == "__main__":
    main()

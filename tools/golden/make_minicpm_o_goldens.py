"""Golden outputs of MiniCPM-o 4.5's TTS head on omni-export's tiny seeded checkpoint, computed with the
classes upstream's MiniCPMTTS instantiates, in a venv of their own (torch 2.13, transformers):

  backbone   transformers.LlamaModel(LlamaConfig(hidden_size, intermediate_size, num_attention_heads,
             num_hidden_layers, num_key_value_heads, max_position_embeddings)), loaded from tts.model.*
  code head  torch.nn.utils.parametrizations.weight_norm(nn.Linear(H, num_audio_tokens, bias=False)),
             loaded from tts.head_code.0.parametrizations.weight.original0/1
  condition  emb_text(ids) + F.normalize(linear2(relu(linear1(hidden))), p=2, dim=-1), then
             emb_text(text_eos), emb_text(audio_bos)   (projector_type "mlp", hidden_text_merge)
  loop       as MiniCPMTTS.generate: prefill the condition at positions 0..L-1, then one emb_code[0]
             row per step at the next position with the returned cache; greedy.

MiniCPMTTS itself lives in the model repository's remote code (trust_remote_code), which cannot be
downloaded here, so its module is not imported; the computation above is what its __init__ and
generate do with these classes. omni-export is not imported: the checkpoint is read from disk.

  python3 -m venv /tmp/mcref && /tmp/mcref/bin/pip install torch==2.13.0 transformers safetensors numpy
  .venv/bin/python -c "from omni_export.recipes.minicpm_o import checkpoint as ck; from pathlib import Path; \
      ck.write_checkpoint(Path('/tmp/mc-golden-ckpt'), seed=0)"
  /tmp/mcref/bin/python tools/golden/make_minicpm_o_goldens.py /tmp/mc-golden-ckpt tests/golden/minicpm_o
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaModel

STEPS, LOGIT_STEPS, TOKENS, SEED = 12, 4, 23, 7


def main(ckpt: Path, dest: Path) -> None:
    c = json.loads((ckpt / "config.json").read_text())["tts_config"]
    raw = load_file(str(ckpt / "model.safetensors"))
    llama = LlamaModel(LlamaConfig(hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
                                   num_attention_heads=c["num_attention_heads"], num_hidden_layers=c["num_hidden_layers"],
                                   num_key_value_heads=c["num_key_value_heads"],
                                   max_position_embeddings=c["max_position_embeddings"])).eval()
    state = {k[len("tts.model."):]: v for k, v in raw.items() if k.startswith("tts.model.")}
    missing = llama.load_state_dict(state, strict=False).missing_keys
    assert missing == ["embed_tokens.weight"], missing        # unused by MiniCPMTTS (inputs_embeds only)
    head = torch.nn.utils.parametrizations.weight_norm(
        torch.nn.Linear(c["hidden_size"], c["num_audio_tokens"], bias=False), name="weight")
    head.parametrizations.weight.original0.data = raw["tts.head_code.0.parametrizations.weight.original0"]
    head.parametrizations.weight.original1.data = raw["tts.head_code.0.parametrizations.weight.original1"]
    rng = np.random.default_rng(SEED)
    hidden = (rng.standard_normal((TOKENS, c["llm_dim"])) * np.exp(rng.normal(0, 0.5, c["llm_dim"]))).astype(np.float32)
    ids = rng.integers(0, 151643, TOKENS).astype(np.int64)
    p = "tts.projector_semantic."
    with torch.no_grad():
        x = torch.relu(F.linear(torch.from_numpy(hidden), raw[p + "linear1.weight"], raw[p + "linear1.bias"]))
        x = F.linear(x, raw[p + "linear2.weight"], raw[p + "linear2.bias"])
        emb = raw["tts.emb_text.weight"]
        cond = emb[torch.from_numpy(ids)] + F.normalize(x, p=2, dim=-1)
        cond = torch.cat([cond, emb[[c["text_eos_token_id"], c["audio_bos_token_id"]]]])
        out = llama(inputs_embeds=cond[None], position_ids=torch.arange(len(cond))[None], use_cache=True)
        codes, logits = [], []
        for t in range(STEPS):
            lg = head(out.last_hidden_state)[0, -1]
            logits.append(lg.numpy())
            codes.append(int(lg.argmax()))
            out = llama(inputs_embeds=raw["tts.emb_code.0.weight"][[codes[-1]]][None],
                        position_ids=torch.tensor([[len(cond) + t]]), past_key_values=out.past_key_values,
                        use_cache=True)
    out_dir = Path(dest)
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "tts_hidden.npy", hidden)
    np.save(out_dir / "tts_ids.npy", ids)
    np.save(out_dir / "tts_condition.npy", cond.numpy())
    np.save(out_dir / "tts_codes.npy", np.array(codes, np.int64))
    np.save(out_dir / "tts_logits.npy", np.stack(logits[:LOGIT_STEPS]))
    (out_dir / "meta.json").write_text(json.dumps({
        "checkpoint": "omni-export tiny seeded checkpoint, seed 0 (checkpoint.write_checkpoint)",
        "torch": torch.__version__, "transformers": transformers.__version__, "steps": STEPS,
        "logit_steps": LOGIT_STEPS, "utterance_seed": SEED, "tokens": TOKENS}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

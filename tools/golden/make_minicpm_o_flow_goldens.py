"""Golden outputs of token2wav's flow encoder on omni-export's tiny seeded flow, computed with upstream's
own UpsampleConformerEncoderV2 (PyPI stepaudio2-minicpmo 0.1.1, cosyvoice2/transformer/) plus the
input_embedding and encoder_proj of CausalMaskedDiffWithXvec.inference, on one unpadded utterance.
The stepaudio2 package's __init__ (which imports the whole token2wav stack) is bypassed with a
namespace stub; only the encoder's own modules are imported.

  /tmp/mcref/bin/python tools/golden/make_minicpm_o_flow_goldens.py /tmp/mc-golden-ckpt tests/golden/minicpm_o
"""
import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

TOKENS, SEED = 20, 13


def upstream_encoder_class():
    where = importlib.util.find_spec("stepaudio2").submodule_search_locations[0]
    stub = types.ModuleType("stepaudio2")
    stub.__path__ = [where]
    sys.modules["stepaudio2"] = stub
    from stepaudio2.cosyvoice2.transformer.upsample_encoder_v2 import UpsampleConformerEncoderV2
    return UpsampleConformerEncoderV2


def main(ckpt: Path, dest: Path) -> None:
    raw = load_file(str(ckpt / "assets" / "token2wav" / "flow.safetensors"))
    enc = {k[len("encoder."):]: v for k, v in raw.items() if k.startswith("encoder.")}
    vocab, size = raw["input_embedding.weight"].shape
    heads = enc["encoders.0.self_attn.pos_bias_u"].shape[0]
    blocks = len({k.split(".")[1] for k in enc if k.startswith("encoders.")})
    up_blocks = len({k.split(".")[1] for k in enc if k.startswith("up_encoders.")})
    encoder = upstream_encoder_class()(
        input_size=size, output_size=size, pre_lookahead_len=enc["pre_lookahead_layer.conv1.weight"].shape[2] - 1,
        num_blocks=blocks, num_up_blocks=up_blocks, up_stride=2, up_scale_factor=2, attention_heads=heads,
        linear_units=enc["encoders.0.feed_forward.w_1.weight"].shape[0], dropout_rate=0.0,
        positional_dropout_rate=0.0, attention_dropout_rate=0.0).eval()
    encoder.load_state_dict(enc, strict=True)
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, vocab, TOKENS).astype(np.int64)
    with torch.no_grad():
        t = torch.from_numpy(tokens)[None]
        x = torch.nn.functional.embedding(t, raw["input_embedding.weight"])     # mask is all ones: one utterance
        h, _ = encoder(x, torch.tensor([TOKENS]))
        mu = torch.nn.functional.linear(h, raw["encoder_proj.weight"], raw["encoder_proj.bias"]).transpose(1, 2)
    dest.mkdir(parents=True, exist_ok=True)
    np.save(dest / "flow_tokens.npy", tokens)
    np.save(dest / "flow_mu.npy", mu.numpy())
    meta = json.loads((dest / "meta.json").read_text()) if (dest / "meta.json").exists() else {}
    from importlib.metadata import version

    meta["flow_encoder"] = {"upstream": f"stepaudio2-minicpmo {version('stepaudio2-minicpmo')} "
                                        "cosyvoice2/transformer/upsample_encoder_v2.py UpsampleConformerEncoderV2",
                            "tokens": TOKENS, "seed": SEED}
    (dest / "meta.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

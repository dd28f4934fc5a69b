"""Golden outputs of token2wav's DiT flow-matching estimator on omni-export's tiny seeded flow
(assets/token2wav/flow.safetensors of the tiny checkpoint), computed with upstream's own DiT class
(Step-Audio2 as MiniCPM-o ships it: PyPI stepaudio2-minicpmo 0.1.1, cosyvoice2/flow/decoder_dit.py),
in a venv of its own. decoder_dit.py is loaded by file path: the package's __init__ imports the
whole token2wav stack (onnxruntime, s3tokenizer, torchaudio), none of which the estimator needs.
The Euler loop is CausalConditionalCFM.solve_euler's (CFG pair in the batch, rate 0.7, cosine t).

  /tmp/mcref/bin/pip install einops && /tmp/mcref/bin/pip install --no-deps stepaudio2-minicpmo==0.1.1
  /tmp/mcref/bin/python tools/golden/make_minicpm_o_dit_goldens.py /tmp/mc-golden-ckpt tests/golden/minicpm_o
"""
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

M, STEPS, SEED, CFG = 32, 10, 11, 0.7


def upstream_dit():
    spec = importlib.util.find_spec("stepaudio2")
    path = Path(spec.submodule_search_locations[0]) / "cosyvoice2" / "flow" / "decoder_dit.py"
    mod_spec = importlib.util.spec_from_file_location("decoder_dit", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.DiT


def main(ckpt: Path, dest: Path) -> None:
    raw = load_file(str(ckpt / "assets" / "token2wav" / "flow.safetensors"))
    state = {k[len("decoder.estimator."):]: v for k, v in raw.items() if k.startswith("decoder.estimator.")}
    hidden, cin = state["in_proj.weight"].shape
    depth = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    hd = state["blocks.0.attn.q_norm.weight"].shape[0]
    heads = state["blocks.0.attn.to_q.weight"].shape[0] // hd
    mlp_ratio = state["blocks.0.mlp.fc1.weight"].shape[0] / hidden
    out = state["final_layer.linear.weight"].shape[0]
    dit = upstream_dit()(in_channels=cin, out_channels=out, mlp_ratio=mlp_ratio, depth=depth, num_heads=heads,
                         head_dim=hd, hidden_size=hidden).eval()
    dit.load_state_dict(state, strict=True)
    rng = np.random.default_rng(SEED)
    noise = rng.standard_normal((1, out, M)).astype(np.float32)
    mu = (np.linspace(-2, -8, out)[:, None] + rng.standard_normal((out, M)))[None].astype(np.float32)
    cond = np.zeros_like(mu)
    cond[..., :8] = mu[..., :8] + 0.3 * rng.standard_normal((1, out, 8))
    spks = (0.3 * rng.standard_normal((1, out))).astype(np.float32)
    mask = np.ones((1, 1, M), np.float32)
    mask[..., M - 4:] = 0
    t_span = 1 - torch.cos(torch.linspace(0, 1, STEPS + 1) * 0.5 * torch.pi)
    T = lambda a: torch.from_numpy(a)      # noqa: E731
    with torch.no_grad():
        x, t, dt = T(noise), t_span[0:1], t_span[1] - t_span[0]
        mask_in, mu_in = torch.cat([T(mask)] * 2), torch.cat([T(mu), torch.zeros_like(T(mu))])
        spks_in, cond_in = torch.cat([T(spks), torch.zeros_like(T(spks))]), torch.cat([T(cond), torch.zeros_like(T(cond))])
        velocities = []
        for step in range(1, STEPS + 1):
            v = dit(torch.cat([x, x]), mask_in, mu_in, torch.cat([t, t]), spks_in, cond_in)
            velocities.append(v.numpy())
            v_c, v_u = v.split([1, 1])
            x = x + dt * ((1.0 + CFG) * v_c - CFG * v_u)
            t = t + dt
            if step < STEPS:
                dt = t_span[step + 1] - t
    dest.mkdir(parents=True, exist_ok=True)
    for name, a in {"noise": noise, "mu": mu, "cond": cond, "spks": spks, "mask": mask,
                    "velocity0": velocities[0], "velocity3": velocities[3], "mel": x.numpy()}.items():
        np.save(dest / f"dit_{name}.npy", a)
    meta = json.loads((dest / "meta.json").read_text()) if (dest / "meta.json").exists() else {}
    from importlib.metadata import version

    meta["dit"] = {"upstream": f"stepaudio2-minicpmo {version('stepaudio2-minicpmo')} cosyvoice2/flow/decoder_dit.py DiT",
                   "frames": M, "steps": STEPS, "cfg_rate": CFG, "seed": SEED, "torch": torch.__version__}
    (dest / "meta.json").write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

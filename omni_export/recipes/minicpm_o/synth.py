"""`omni-export synth minicpm-o`: LLM hidden states -> 25 Hz speech codes (-> mel -> 24 kHz WAV) through the
fp32 graphs or a build's graphs. Only click and the standard library load with the module (the CLI lists it
without importing torch); the work happens in `run`.
"""
from __future__ import annotations

from pathlib import Path

import click

from ...runtime.synth import graph_options, options_and_checkpoint
from .recipe import RECIPE

HELP = """Generate MiniCPM-o 4.5 speech from an LLM's hidden states: codes (one codebook, 25 Hz), mel and a
24 kHz WAV, through the fp32 graphs or the exported graphs of a build (--build OUT --runner ort|htp|pte), or from a bundle alone
(--bundle DIR).

\b
  omni-export synth minicpm-o --checkpoint DIR --hidden-states h.npy --text-ids ids.npy --codes-out c.npy
  omni-export synth minicpm-o --build artifacts/minicpm-o-s25-htp --runner htp --wav out.wav
      (no --hidden-states: a seeded synthetic utterance, for the demo)
  omni-export synth minicpm-o --bundle artifacts/minicpm-o-s25-htp/bundle --greedy --codes-out c.npy

--hidden-states is the LLM's last hidden states [tokens, llm_dim] for the spoken tokens (.npy),
--text-ids their token ids ([tokens] .npy or comma-separated). Sampling follows the checkpoint's
tts_config (temperature 0.8, top-k 25, top-p 0.85, repetition penalty 1.05; EOS masked for the first
--min-new-tokens codes); --greedy picks the best code. --mel-out runs the codes on through token2wav's
flow encoder and DiT solver (no voice prompt; up to --mel-frames / 2 codes) and saves the 50 Hz mel;
--wav runs that mel through the HiFT vocoder (hift_f0, the host's NSF source, hift, the host's
iSTFT) and writes 16-bit PCM at 24 kHz.
"""


def options() -> list:
    o = click.Option
    return [
        *graph_options("config, host tables"),
        o(["--hidden-states"], type=click.Path(), default=None, help="LLM last hidden states [tokens, llm_dim] (.npy)"),
        o(["--text-ids"], default=None, help="spoken token ids: a [tokens] .npy or comma-separated integers"),
        o(["--demo-seed"], type=int, default=0, show_default=True,
          help="without --hidden-states: seed of the synthetic utterance"),
        o(["--max-codes"], type=int, default=200, show_default=True, help="stop after this many codes (25 per second of speech: 200 = 8 s)"),
        o(["--min-new-tokens"], type=int, default=50, show_default=True, help="EOS is masked before this many codes"),
        o(["--greedy"], is_flag=True, help="no sampling"),
        o(["--seed"], type=int, default=0, show_default=True,
          help="seed of the sampler, the flow's noise and the vocoder's noise source (same seed, same output)"),
        o(["--temperature"], type=float, default=None, help="sampling temperature [default: tts_config's]"),
        o(["--top-k"], type=int, default=None, help="sample among the k best codes [default: tts_config's]"),
        o(["--top-p"], type=float, default=None, help="nucleus sampling mass [default: tts_config's]"),
        o(["--repetition-penalty"], type=float, default=None,
          help="penalty on codes already generated [default: tts_config's]"),
        o(["--codes-out"], type=click.Path(), default=None, help="save the generated codes [n] (.npy, int64)"),
        o(["--mel-out"], type=click.Path(), default=None,
          help="also run token2wav's flow encoder and DiT solver and save the mel [80, frames] (.npy)"),
        o(["--wav"], type=click.Path(), default=None,
          help="also run the mel through token2wav's HiFT vocoder and write a 24 kHz 16-bit WAV"),
        o(["--json", "as_json"], is_flag=True, help="print a JSON summary"),
    ]


def run(**kw) -> dict:
    """Returns a summary; raises UsageError for bad input."""
    import tempfile

    from ...runtime.synth import check_output_file, checkpoint_name, npy_path
    from . import model as M

    for key, option in (("codes_out", "--codes-out"), ("mel_out", "--mel-out"), ("wav", "--wav")):
        if kw.get(key):      # before any work: a FIFO, directory or device there is refused now
            check_output_file(kw[key] if key == "wav" else npy_path(kw[key]), option)
    if kw.get("bundle"):
        from .bundle import synth

        return synth(kw)
    build = Path(kw["build"]) if kw.get("build") else None
    opts, ckpt = _options_and_checkpoint(build, kw.get("checkpoint"))
    with tempfile.TemporaryDirectory(prefix="omni-export-synth-") as scratch:
        return _run(M.load(Path(ckpt) if ckpt else None, opts, Path(scratch)), build, kw, checkpoint_name(ckpt))


def _run(model, build, kw, name: str, graphs=None) -> dict:
    """`graphs`: a bundle's (bundle.synth), else the build's on --runner, else the eager modules."""
    import numpy as np

    from ...artifacts.manifest import read_manifest
    from ...core import UsageError
    from ...runtime.graphs import BuildGraphs, EagerGraphs

    if kw["max_codes"] < 1 or kw["min_new_tokens"] < 0:
        raise UsageError("--max-codes must be >= 1 and --min-new-tokens >= 0")
    utt = _utterance(model, kw, name)
    built = graphs is not None or build is not None
    graphs = graphs or (BuildGraphs(build, kw["runner"], kw.get("precision"), manifest=read_manifest(build)) if build
                        else EagerGraphs(model))
    pick = lambda k, d: kw[k] if kw.get(k) is not None else d      # noqa: E731
    c = model.cfg
    opts = model.gen_options(greedy=bool(kw.get("greedy")), seed=kw.get("seed") or 0, max_codes=kw["max_codes"],
                             min_new_tokens=kw["min_new_tokens"], temperature=pick("temperature", c.temperature),
                             top_k=pick("top_k", c.top_k), top_p=pick("top_p", c.top_p),
                             repetition_penalty=pick("repetition_penalty", c.repetition_penalty))
    mel = wav = None
    if kw.get("wav") and "hift" not in model.components():
        raise UsageError("--wav needs token2wav's HiFT vocoder (hift.safetensors beside flow.safetensors; convert "
                         "hift.pt, pickles are never read)")
    try:
        gen = model.synthesize(graphs, utt, opts)
        if kw.get("mel_out") or kw.get("wav"):
            if not all(g in model.components() for g in ("flow_encoder_chunk", "dit_step")):
                raise UsageError("--mel-out / --wav need the token2wav flow (flow.safetensors with the encoder and DiT)")
            if not len(gen.codes):
                raise UsageError("no speech codes were generated (EOS first); nothing to vocode")
            mel = model.token2wav_mel(graphs, gen.codes, kw.get("seed") or 0)
            if kw.get("wav"):
                wav = model.vocode(graphs, mel, kw.get("seed") or 0)
            mel = mel[0]
    finally:
        if built:
            graphs.close()
    from ...modeling.audio import write_wav
    from ...runtime.synth import npy_path, save_output

    if kw.get("codes_out"):
        save_output(npy_path(kw["codes_out"]), "--codes-out", lambda p: np.save(p, gen.codes.astype(np.int64)))
    if mel is not None and kw.get("mel_out"):
        save_output(npy_path(kw["mel_out"]), "--mel-out", lambda p: np.save(p, mel.astype(np.float32)))
    if wav is not None:
        save_output(Path(kw["wav"]), "--wav", lambda p: write_wav(p, wav, model.hift[0].sampling_rate))
    where = f"{build or kw['bundle']} on {kw['runner']} ({', '.join(sorted(set(graphs.precision.values())))})" \
        if built else "fp32 eager"
    if built and graphs.placed:
        where += "; " + ", ".join(f"{g} at fp32 on the CPU" for g in sorted(graphs.placed))
    return {"codes": int(len(gen.codes)), "seconds": round(len(gen.codes) / 25.0, 3), "stopped": gen.stopped,
            "utterance": utt.name, "graphs": where, "checkpoint": str(model.path), "label": model.info["label"],
            "codes_out": kw.get("codes_out"), "mel_out": kw.get("mel_out"),
            "mel_frames": int(mel.shape[-1]) if mel is not None else None, "wav": kw.get("wav"),
            "wav_seconds": round(len(wav) / model.hift[0].sampling_rate, 3) if wav is not None else None}


def _utterance(model, kw, name: str):
    import numpy as np

    from ...core import UsageError
    from .model import read_utterance, synthetic_utterance

    if not kw.get("hidden_states"):
        if kw.get("text_ids"):
            raise UsageError("--text-ids needs --hidden-states (the LLM hidden states of the same tokens)")
        return synthetic_utterance(model.cfg, 3000 + int(kw.get("demo_seed") or 0), 24)
    hidden = Path(kw["hidden_states"])
    ids = kw.get("text_ids")
    if not ids:
        raise UsageError("--hidden-states needs --text-ids (the spoken token ids, one per hidden-state row)")
    from ...runtime.synth import check_ids

    vocab = model.cfg.num_text_tokens
    if ids.endswith(".npy"):
        from .model import _npy

        values = _npy(Path(ids), "--text-ids")
        if not np.issubdtype(values.dtype, np.integer):
            raise UsageError(f"--text-ids {ids}: token ids must be integers, got dtype {values.dtype}")
        check_ids(values.reshape(-1), vocab, "--text-ids", name)
        return read_utterance(hidden, Path(ids), model.cfg, "--hidden-states/--text-ids")
    try:
        values = [int(t) for t in ids.replace(" ", "").split(",") if t]
    except ValueError:
        raise UsageError("--text-ids takes a .npy file or comma-separated integers") from None
    check_ids(values, vocab, "--text-ids", name)     # before int64: 10**30 is out of range, not an OverflowError
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "ids.npy"
        np.save(f, np.array(values, np.int64))
        try:
            return read_utterance(hidden, f, model.cfg, "--hidden-states/--text-ids")
        except UsageError as e:     # name the list, not the temporary file that carried it
            raise UsageError(str(e).replace(f"--text-ids {f}", "--text-ids (the comma-separated ids)")) from None


def _options_and_checkpoint(build: Path | None, checkpoint: str | None):
    opts, ckpt, m = options_and_checkpoint(RECIPE, build, checkpoint)
    if m is not None:
        opts["calibration-hidden"] = None
        opts["token2wav"] = m["checkpoint"].get("config", {}).get("token2wav") and str(
            Path(m["checkpoint"]["config"]["token2wav"]).parent)
    return opts, ckpt



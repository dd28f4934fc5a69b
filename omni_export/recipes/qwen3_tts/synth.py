"""`omni-export synth qwen3-tts`: text -> codes -> WAV through the fp32 modules or a build's graphs.

Only click and the standard library are imported at module load (the CLI lists this command
without importing torch); the work happens in `run`.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from ...modeling.audio import read_wav, write_wav
from ...runtime.synth import (check_ids, check_output_file, checkpoint_name, context_hint, graph_options, npy_path,
                              options_and_checkpoint, save_output)
from .recipe import RECIPE

HELP = """Synthesise speech with a Qwen3-TTS checkpoint, through the fp32 reference modules or through
the exported graphs of a build (--build OUT --runner ort|htp|pte), or from a bundle alone (--bundle DIR).

\b
  omni-export synth qwen3-tts --checkpoint DIR --text "Hello there." --speaker ryan --wav out.wav
  omni-export synth qwen3-tts --build artifacts/qwen3-tts-s25-htp --runner htp --text "Hi." --wav hi.wav
  omni-export synth qwen3-tts --bundle artifacts/qwen3-tts-s25-htp/bundle --text "Hi." --wav hi.wav
  omni-export synth qwen3-tts --checkpoint DIR --text-ids 151644,77091,198,... --greedy --codes-out c.npy
  omni-export synth qwen3-tts --checkpoint DIR --codes c.npy --wav out.wav        (decode only)
  omni-export synth qwen3-tts --checkpoint BASE --ref-audio me.wav --ref-text "What me.wav says." \
      --text "Hello there." --wav out.wav                          (in-context voice cloning)

Base checkpoints clone the voice of --ref-audio as upstream's generate_voice_clone does. With
--ref-text (the reference's transcript) in context: the reference's codes (the speech tokenizer's
encoder, at most --encoder-frames of the build: 10 s by default) and its transcript lead the prompt,
the talker continues them, and --wav holds only the new speech. Without --ref-text, by its x-vector
alone (upstream's x_vector_only_mode). With no --ref-audio a synthetic voice stands in.

Sampling follows the checkpoint's generation_config.json as upstream's generate does: each key
(in brackets in the options below) unless its flag is given, else upstream's default
(temperature 0.9, top-k 50, top-p 1.0, repetition penalty 1.05, the same for the code predictor,
at most 2048 new tokens); min 2 tokens, codes 2048..3071 except EOS suppressed. --greedy turns
sampling off for the talker and the code predictor and keeps the rest.
"""

POSITIVE = click.FloatRange(min=0, min_open=True, max=1e6)
PROBABILITY = click.FloatRange(min=0, min_open=True, max=1)
# generation_config.json: the keys upstream's generate reads (name -> (GenOptions field, default)),
# and transformers' bookkeeping keys that say nothing about sampling
SAMPLING_KEYS = {"temperature": ("temperature", 0.9), "top_k": ("top_k", 50), "top_p": ("top_p", 1.0),
                 "repetition_penalty": ("repetition_penalty", 1.05),
                 "subtalker_temperature": ("sub_temperature", 0.9), "subtalker_top_k": ("sub_top_k", 50),
                 "subtalker_top_p": ("sub_top_p", 1.0)}
OTHER_KEYS = ("do_sample", "subtalker_dosample", "max_new_tokens")
BOOKKEEPING = ("transformers_version", "_from_model_config", "bos_token_id", "eos_token_id", "pad_token_id")
MAX_NEW_TOKENS = 2048              # upstream's hard default when generation_config.json has none


def _ids(text: str | None, option: str = "--text-ids") -> list[int] | None:
    if not text:
        return None
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        from ...core import UsageError

        raise UsageError(f"{option} takes comma-separated integers") from None


def options() -> list:
    o = click.Option
    return [
        *graph_options("tokenizer, tables"),
        o(["--text", "-t"], default=None, help="text to speak (tokenised with the checkpoint's tokenizer)"),
        o(["--text-ids"], default=None,
          help="ids of the templated assistant text, exactly what upstream's generate receives (no tokenizer needed)"),
        o(["--text-split"], type=click.Choice(["auto", "qwen2", "mistral"]), default="auto", show_default=True,
          help="how --text / --instruct are cut before BPE: auto as upstream (qwen-tts 0.1.1 loads the tokenizer "
               "with transformers 4.57.3's fix_mistral_regex: the Mistral-style split when the base vocabulary "
               "exceeds 100000 and config.json's transformers_version is missing or above 4.57.2 and below 5.0; "
               "docs/upstream.md has the whole rule), qwen2 (the checkpoint's own split) or mistral; the --json "
               "summary shows it and the text_ids fed"),
        o(["--speaker", "-s"], default=None, help="CustomVoice speaker (e.g. ryan, vivian); default: the first"),
        o(["--language", "-l"], default="auto", show_default=True, help="language or auto"),
        o(["--instruct"], default=None, help="voice / style instruction (VoiceDesign; CustomVoice 1.7B)"),
        o(["--instruct-ids"], default=None, help="ids of the templated instruction"),
        o(["--ref-audio"], type=click.Path(exists=True, dir_okay=False), default=None,
          help="Base checkpoints: reference voice WAV; its x-vector is upstream's over the whole reference, "
               "which may be at most --speaker-frames log-mel frames (the build's; 938 = 10 s by default)"),
        o(["--ref-text"], default=None,
          help="Base checkpoints: the transcript of --ref-audio; clones in context (the reference's codes and this "
               "text lead the prompt, as upstream's default voice cloning); without it, by x-vector only"),
        o(["--text-mode"], type=click.Choice(["auto", "streaming", "non-streaming"]), default="auto", show_default=True,
          help="non-streaming puts all text in the prompt; auto follows upstream (non-streaming for "
               "CustomVoice / VoiceDesign, streaming for Base)"),
        o(["--max-frames"], type=int, default=None, help="stop after this many 80 ms frames [default: context]"),
        o(["--greedy"], is_flag=True, help="no sampling (talker and predictor) [do_sample false]"),
        o(["--seed"], type=int, default=0, show_default=True, help="seed of the samplers (same seed, same codes)"),
        o(["--temperature"], type=POSITIVE, default=None, help="talker temperature [temperature]"),
        o(["--top-k"], type=click.IntRange(min=1), default=None, help="talker top-k [top_k]"),
        o(["--top-p"], type=PROBABILITY, default=None, help="talker top-p, in (0, 1] [top_p]"),
        o(["--repetition-penalty"], type=POSITIVE, default=None,
          help="talker repetition penalty on its generated codes [repetition_penalty]"),
        o(["--sub-greedy"], is_flag=True, help="no sampling in the code predictor [subtalker_dosample false]"),
        o(["--sub-temperature"], type=POSITIVE, default=None, help="code predictor temperature [subtalker_temperature]"),
        o(["--sub-top-k"], type=click.IntRange(min=1), default=None, help="code predictor top-k [subtalker_top_k]"),
        o(["--sub-top-p"], type=PROBABILITY, default=None,
          help="code predictor top-p [subtalker_top_p]; below 1 the step graphs run (the frame graph has no top-p)"),
        o(["--predictor"], type=click.Choice(["frame", "step"]), default=None,
          help="fused frame graph (1 call per frame) or the step graphs (15 calls); default: the frame "
               "graph, or the step graphs when the build has no frame graph for --runner (its .pte is opt-in)"),
        o(["--codes"], type=click.Path(exists=True, dir_okay=False), default=None,
          help="decode these codes [frames, 16] (.npy) instead of generating"),
        o(["--codes-out"], type=click.Path(), default=None, help="save the generated codes [frames, 16] (.npy)"),
        o(["--wav"], type=click.Path(), default=None, help="write 24 kHz 16-bit WAV here"),
        o(["--json", "as_json"], is_flag=True, help="print a JSON summary"),
        o(["--record-latency"], is_flag=True, default=False,
          help="with --build: record this run's timing (--json's ttfa_ms, rtf, latency) in the build's manifest.json, "
               "where `omni-export latency` and the report take the host work per frame from; the newest run per "
               "runner and precision is kept"),
    ]


def run(**kw) -> dict:
    """Returns a summary; raises UsageError for bad input."""
    import tempfile

    from . import model as M

    if kw.get("wav"):
        check_output_file(kw["wav"], "--wav")
    if kw.get("codes_out"):
        check_output_file(npy_path(kw["codes_out"]), "--codes-out")
    _ids(kw.get("text_ids"), "--text-ids")          # their syntax before the checkpoint loads
    _ids(kw.get("instruct_ids"), "--instruct-ids")
    if kw.get("record_latency") and not kw.get("build"):
        from ...core import UsageError

        raise UsageError("--record-latency records into a build's manifest.json: pass --build OUT")
    if kw.get("bundle"):
        from .bundle import synth

        return synth(kw)
    build = Path(kw["build"]) if kw.get("build") else None
    opts, ckpt = _options_and_checkpoint(build, kw.get("checkpoint"))
    with tempfile.TemporaryDirectory(prefix="omni-export-synth-") as scratch:   # the demo checkpoint, if any
        summary = _run(M.load(Path(ckpt) if ckpt else None, opts, Path(scratch)), build, kw, checkpoint_name(ckpt))
    return summary          # --record-latency: the CLI records it (cli.py _record_latency; hub/latency.py)


def _run(model, build, kw, name: str, graphs=None) -> dict:
    """`graphs`: a bundle's (bundle.synth), else the build's on --runner, else the eager modules."""
    import numpy as np

    from ...artifacts.manifest import read_manifest
    from ...runtime.graphs import BuildGraphs, EagerGraphs
    from .host import frame_cannot_honour
    from .latency import Latency

    # Every input is checked before a graph runs: codes, ids, the prompt's length, the voice.
    codes = _read_codes(Path(kw["codes"]), model) if kw.get("codes") else None
    req, voice, split = (None, None, None) if codes is not None else _request(model, kw, build, name)
    graphs = graphs or (BuildGraphs(build, kw["runner"], kw.get("precision"), manifest=read_manifest(build)) if build
                        else EagerGraphs(model))
    graphs = clock = Latency(graphs, model)      # every call timed: --json's ttfa_ms, rtf, latency
    chosen, notes = kw.get("predictor"), []
    try:
        if codes is not None:
            gen = None
        else:
            if voice is not None:
                _check_window(graphs, build)
                req.speaker_embedding = model.speaker_embedding(graphs, voice)
                if req.ref_ids is not None:
                    req.ref_codes = model.reference_codes(graphs, voice)
            if build and not kw.get("predictor"):
                kw = {**kw, "predictor": "frame" if "predictor_frame" in graphs.specs else "step"}
            gen_kw, notes = _gen_kwargs(model, kw)
            gaps = frame_cannot_honour(model.gen_options(**gen_kw))
            if gaps and gen_kw["predictor"] == "frame" and not chosen:
                gen_kw["predictor"] = kw["predictor"] = "step"
                notes.append(f"the code predictor runs as step graphs: the fused frame graph cannot sample "
                             f"with {', '.join(gaps)}")
            clock.start(gen_kw["predictor"], stream=getattr(req, "ref_codes", None) is None)
            gen, _ = model.synthesize(graphs, req, model.gen_options(**gen_kw), with_audio=False,
                                      on_frame=clock.frame)
            codes = gen.codes
        if req is not None and req.ref_codes is not None:    # upstream decodes the reference with them
            wav = model.decode_continuation(graphs, req.ref_codes, codes)
        else:
            wav = clock.decode(codes)           # the stream's chunks, along --chunk-schedule
    finally:
        if build:
            graphs.close()
    if kw.get("codes_out"):
        save_output(npy_path(kw["codes_out"]), "--codes-out", lambda p: np.save(p, codes.astype(np.int64)))
    if kw.get("wav"):
        save_output(Path(kw["wav"]), "--wav", lambda p: write_wav(p, wav, model.speech.sample_rate))
    where = f"{build} on {kw['runner']} ({', '.join(sorted(set(graphs.precision.values())))})" if build else "fp32 eager"
    return {"frames": int(len(codes)), "seconds": round(len(wav) / model.speech.sample_rate, 3),
            "stopped": gen.stopped if gen else "decoded given codes", "graphs": where,
            "checkpoint": str(model.path), "label": model.info["label"],
            **({"predictor": kw.get("predictor") or "frame"} if gen else {}),
            **({"text_ids": [int(i) for i in req.text_ids]} if req else {}),
            **({"instruct_ids": [int(i) for i in req.instruct_ids]} if req and req.instruct_ids else {}),
            **({"text_split": split[0], "text_split_reason": split[1]} if split else {}),
            **({"voice_clone": "in-context" if req.ref_ids else "x-vector"} if voice is not None else {}),
            **({"ref_ids": [int(i) for i in req.ref_ids], "ref_frames": int(len(req.ref_codes))}
               if req is not None and req.ref_ids else {}),
            "codes_out": kw.get("codes_out"), "wav": kw.get("wav"), **({"notes": notes} if notes else {}),
            **clock.summary(len(wav) / model.speech.sample_rate, where)}


def _check_window(graphs, build) -> None:
    """A build whose speaker encoder has no length input (recipe version < 4) pools over its whole
    fixed window: its x-vector of any other length is not upstream's."""
    from ...core import UsageError

    spec = getattr(graphs, "specs", {}).get("speaker_encoder")
    if spec is not None and "length" not in spec.input_names:
        raise UsageError(f"--build {build}: its speaker_encoder pools a fixed window of frames (built before it took "
                         f"the reference's length), so its x-vector is not upstream's; rebuild it")


def _options_and_checkpoint(build: Path | None, checkpoint: str | None):
    opts, ckpt, m = options_and_checkpoint(RECIPE, build, checkpoint)
    comps = (m or {}).get("components") or {}
    if any(c.endswith("_part1") for c in comps):     # the talker as the build split it (--talker-parts)
        opts["talker-parts"] = 2
    elif "talker_decode" in comps or "talker_prefill" in comps:
        opts["talker-parts"] = 1
    return opts, ckpt


def _request(model, kw, build, name: str):
    """The request, every id checked against the text vocabulary and its prompt against the talker's
    context, before any graph runs; the reference voice's samples (Base checkpoints), or None; and
    the tokenizer's split and why (--text / --instruct), or None."""
    import numpy as np

    from ...core import UsageError
    from ...text_tokenizer import MissingTokenizer, load as load_tokenizer
    from .prompt import Request, instruct_ids, ref_ids

    cfg = model.cfg
    vocab = cfg.talker.text_vocab_size
    text_option, ins_option = "--text-ids", "--instruct-ids"
    ids = _ids(kw.get("text_ids"), text_option)
    ins = _ids(kw.get("instruct_ids"), ins_option)
    if ids is None and not kw.get("text"):
        raise UsageError("give --text, --text-ids or --codes")
    ref_text = kw.get("ref_text")
    if ref_text is not None:
        if not kw.get("ref_audio"):
            raise UsageError("--ref-text is the transcript of --ref-audio: give the reference WAV too")
        if cfg.tts_model_type != "base":
            raise UsageError(f"--ref-text (in-context cloning) needs a Base checkpoint; this one is "
                             f"{cfg.tts_model_type}")
        if not ref_text.strip():
            raise UsageError("--ref-text is empty; give the transcript of --ref-audio, or omit it to clone by "
                             "x-vector only")
        if model.speech_encoder_config is None:
            raise UsageError(f"--ref-text: {name} has no speech tokenizer encoder (speech_tokenizer/config.json "
                             f"without encoder_config): it clones by x-vector only; omit --ref-text")
    tokenize = ids is None or (ins is None and kw.get("instruct")) or ref_text is not None
    if not tokenize and (kw.get("text_split") or "auto") != "auto":
        raise UsageError("--text-split applies to --text and --instruct; --text-ids and --instruct-ids are fed as given")
    split = None
    try:
        if tokenize:     # upstream's split rule (or the one asked for), for --text and --instruct alike
            model.tokenizer = load_tokenizer(model.path, kw.get("text_split") or "auto")
            split = (model.tokenizer.split, model.tokenizer.split_reason)
        if ids is None:
            text_option = "--text"
            ids = model.template(kw["text"])
        if ins is None and kw.get("instruct"):
            ins_option = "--instruct"
            ins = instruct_ids(model.tokenizer, kw["instruct"])
        refs = ref_ids(model.tokenizer, ref_text) if ref_text is not None else None
    except MissingTokenizer as e:      # its hint fits a build; synth has a way around the tokenizer
        if ref_text is not None and ids is not None and not kw.get("instruct"):
            raise UsageError(f"{e}; --ref-text needs it") from None
        way = "--text-ids instead of --text" if ids is None else "--instruct-ids instead of --instruct"
        raise UsageError(f"{e}, or pass {way}") from None
    for given, option in ((ids, text_option), (ins or [], ins_option), (refs or [], "--ref-text")):
        check_ids(given, vocab, option, name, tokenized=option in ("--text", "--instruct"))
    if ins and cfg.tts_model_type == "custom_voice" and "0b6" in cfg.tts_model_size:
        ins = None   # upstream's wrapper drops instructions for the 0.6B CustomVoice model
    speaker = kw.get("speaker")
    if cfg.tts_model_type == "custom_voice" and not speaker:
        speaker = sorted(cfg.talker.spk_id)[0]
    mode = kw.get("text_mode") or "auto"
    non_streaming = cfg.tts_model_type != "base" if mode == "auto" else mode == "non-streaming"
    req = Request(text_ids=ids, speaker=speaker, language=kw.get("language") or "auto", instruct_ids=ins,
                  non_streaming=non_streaming)
    voice = None
    if cfg.tts_model_type == "base":
        voice = model.default_voice()
        if kw.get("ref_audio"):
            from .speaker import check_reference, shortest

            voice = read_wav(Path(kw["ref_audio"]), model.speech.sample_rate)
            check_reference(len(voice), model.speaker_frames, shortest(cfg.speaker_encoder), model.speech.sample_rate,
                            f"--ref-audio {kw['ref_audio']}", context_hint(RECIPE, build, "speaker-frames"))
            if refs is not None:        # its codes come from the encoder graph; their count is known now
                from .speech_encoder import check_reference as check_encoder_window

                n = check_encoder_window(len(voice), model.encoder_frames, model.speech.config.samples_per_frame,
                                         model.speech.sample_rate, f"--ref-audio {kw['ref_audio']}",
                                         context_hint(RECIPE, build, "encoder-frames"))
                req.ref_ids, req.ref_codes = refs, np.zeros((n, cfg.predictor.num_code_groups), np.int64)
    elif kw.get("ref_audio"):
        raise UsageError(f"--ref-audio needs a Base checkpoint; this one is {cfg.tts_model_type}")
    _check_context(model, req, text_option, ins_option if ins else None, build)
    return req, voice, split


def _check_context(model, req, text_option: str, ins_option: str | None, build) -> None:
    """The talker positions the prompt needs, and (streaming) the text fed after it, against the
    context (--context-length: the build's, or the recipe's default without --build). Counted by
    building the prompt with 1-wide stand-in rows: its rules, none of its work."""
    import dataclasses

    import numpy as np

    from ...core import UsageError
    from .prompt import build as build_prompt

    def stand_in(ids):
        return np.zeros((len(ids), 1), np.float32)

    voice = np.zeros(1, np.float32) if model.cfg.tts_model_type == "base" else None
    pr = build_prompt(model.cfg, dataclasses.replace(req, speaker_embedding=voice), stand_in, stand_in, stand_in)
    need, context = len(pr.embeds) + len(pr.trailing), int(model.options["context-length"])
    if need <= context:
        return
    given = f"{text_option}: {len(req.text_ids)} tokens"
    if req.ref_ids:
        given += f", --ref-text: {len(req.ref_ids)} tokens and --ref-audio: {len(req.ref_codes)} frames"
    if ins_option:
        given += f" and {ins_option}: {len(req.instruct_ids)} tokens"
    raise UsageError(f"{given} need {need} talker positions with the prompt; the context holds {context} "
                     f"(--context-length); shorten the text, or {context_hint(RECIPE, build)}")


def _gen_kwargs(model, kw) -> tuple[dict, list[str]]:
    """GenOptions fields from the flags, else the checkpoint's generation_config.json, else
    upstream's defaults; and notes (keys upstream reads that nothing here knows)."""
    from ...core import UsageError

    gc, p = {}, model.path / "generation_config.json"
    if p.exists() or p.is_symlink():
        from ...weights import read_side_file

        try:
            gc = json.loads(read_side_file(p, "generation config"))
        except (ValueError, RecursionError) as e:
            raise UsageError(f"generation config {p}: not valid JSON ({str(e)[:200]})") from None
        if not isinstance(gc, dict):
            raise UsageError(f"generation config {p}: expected a JSON object")

    def value(key: str, kind, ok, rule: str):
        v = gc[key]
        if kind is bool:
            good = isinstance(v, bool)
        else:
            good = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or float(v).is_integer())
        if not good or not ok(v):
            raise UsageError(f"generation config {p}: {key} is {json.dumps(v)[:40]}; expected {rule}")
        return kind(v)

    rules = {"temperature": (float, lambda v: 0 < v <= 1e6, "a number > 0"),
             "top_k": (int, lambda v: v >= 1, "an integer >= 1"),
             "top_p": (float, lambda v: 0 < v <= 1, "a number in (0, 1]"),
             "repetition_penalty": (float, lambda v: 0 < v <= 1e6, "a number > 0"),
             "max_new_tokens": (int, lambda v: v >= 1, "an integer >= 1"),
             "do_sample": (bool, lambda v: True, "true or false")}
    out = {}
    for key, (field, default) in SAMPLING_KEYS.items():
        rule = rules[key.removeprefix("subtalker_")]
        out[field] = kw[field] if kw.get(field) is not None else value(key, *rule) if key in gc else default
    do_sample = value("do_sample", *rules["do_sample"]) if "do_sample" in gc else True
    sub_sample = value("subtalker_dosample", *rules["do_sample"]) if "subtalker_dosample" in gc else True
    max_new = value("max_new_tokens", *rules["max_new_tokens"]) if "max_new_tokens" in gc else MAX_NEW_TOKENS
    unknown = sorted(k for k in gc if k not in SAMPLING_KEYS and k not in OTHER_KEYS and k not in BOOKKEEPING)
    notes = [f"{p}: ignored keys {', '.join(unknown)} (omni-export follows {', '.join([*SAMPLING_KEYS, *OTHER_KEYS])})"] \
        if unknown else []
    max_frames = kw.get("max_frames") or min(max_new - 1, int(model.options["context-length"]))
    return {**out, "greedy": bool(kw.get("greedy")) or not do_sample,
            "sub_greedy": bool(kw.get("sub_greedy")) or not sub_sample, "seed": kw.get("seed") or 0,
            "max_frames": max(max_frames, 1), "predictor": kw.get("predictor") or "frame"}, notes


def _read_codes(path: Path, model):
    import numpy as np

    from .model import load_code_sequences

    c = model.speech.config
    return load_code_sequences(path, c.num_quantizers, c.codebook_size, "--codes")[0].astype(np.int64)


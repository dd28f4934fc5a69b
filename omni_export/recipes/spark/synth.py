"""`omni-export synth spark`: generate text greedily through the fp32 graphs or a build's graphs.

Only click and the standard library are imported at module load; the work happens in `run`.
"""
from __future__ import annotations

from pathlib import Path

import click

from ...runtime.synth import graph_options, options_and_checkpoint
from .recipe import RECIPE

HELP = """Generate text with a Spark-X2.5 checkpoint (greedy), through the fp32 reference graphs or the
exported prefill + decode graphs of a build (--build OUT --runner ort|htp|pte), or from a bundle alone
(--bundle DIR).

\b
  omni-export synth spark --checkpoint DIR --prompt "Plan a trip to Kyoto." --max-tokens 64
  omni-export synth spark --build artifacts/spark-s25-htp --runner htp --prompt "Hi" --max-tokens 16
  omni-export synth spark --bundle artifacts/spark-s25-htp/bundle --prompt "Hi" --max-tokens 16
  omni-export synth spark --checkpoint DIR --prompt-ids 9707,11,1879 --max-tokens 8 --json

The prompt is tokenised as given (no chat template is applied); generation stops at the config's
eos_token_id or after --max-tokens. The build's (or bundle's) own --prefill-tokens / --context-length apply.
"""


def options() -> list:
    o = click.Option
    return [
        *graph_options("tokenizer, embedding table"),
        o(["--prompt", "-t"], default=None, help="prompt text (tokenised with the checkpoint's tokenizer)"),
        o(["--prompt-ids"], default=None, help="comma-separated prompt token ids instead of --prompt"),
        o(["--max-tokens", "-n"], type=int, default=32, show_default=True, help="tokens to generate at most"),
        o(["--ignore-eos"], is_flag=True, help="do not stop at the end-of-sequence token"),
        o(["--json", "as_json"], is_flag=True, help="print a JSON summary"),
    ]


def run(**kw) -> dict:
    import tempfile

    from ...core import UsageError
    from ...runtime.synth import checkpoint_name
    from . import model as M

    if kw.get("max_tokens") is None or kw["max_tokens"] < 1:
        raise UsageError(f"--max-tokens must be >= 1 (got {kw.get('max_tokens')})")
    if kw.get("bundle"):
        from .bundle import synth

        return synth(kw)
    build = Path(kw["build"]) if kw.get("build") else None
    opts, ckpt, _ = options_and_checkpoint(RECIPE, build, kw.get("checkpoint"))
    with tempfile.TemporaryDirectory(prefix="omni-export-synth-") as scratch:
        return _run(M.load(Path(ckpt) if ckpt else None, opts, Path(scratch)), build, kw, checkpoint_name(ckpt))


def _run(model, build, kw, name: str, graphs=None) -> dict:
    """`graphs`: a bundle's (bundle.synth), else the build's on --runner, else the eager modules."""
    from ...artifacts.manifest import read_manifest
    from ...runtime.graphs import BuildGraphs, EagerGraphs

    ids = _prompt(model, kw, build, name)
    built = graphs is not None or build is not None
    graphs = graphs or (BuildGraphs(build, kw["runner"], kw.get("precision"), manifest=read_manifest(build)) if build
                        else EagerGraphs(model))
    try:
        gen = model.generate(graphs, ids, int(kw["max_tokens"]), stop=not kw.get("ignore_eos"))
    finally:
        if built:
            graphs.close()
    where = (f"{build or kw['bundle']} on {kw['runner']} ({', '.join(sorted(set(graphs.precision.values())))})"
             if built else "fp32 eager")
    stopped = "eos" if gen.tokens and gen.tokens[-1] in model.stop_ids and not kw.get("ignore_eos") else "max-tokens"
    return {"text": model.tokenizer.decode(gen.tokens), "tokens": ",".join(map(str, gen.tokens)),
            "prompt_tokens": len(ids), "generated": len(gen.tokens), "stopped": stopped, "graphs": where,
            "checkpoint": str(model.path), "label": model.info["label"]}


def _prompt(model, kw, build, name: str) -> list[int]:
    """The prompt's ids, each checked against the vocabulary and, with --max-tokens, their length
    against the context, before any graph runs."""
    from ...core import UsageError
    from ...text_tokenizer import MissingTokenizer
    from ...runtime.synth import check_ids, context_hint

    if kw.get("prompt_ids"):
        option = "--prompt-ids"
        try:
            ids = [int(t) for t in kw["prompt_ids"].replace(" ", "").split(",") if t]
        except ValueError:
            raise UsageError("--prompt-ids takes comma-separated integers") from None
        check_ids(ids, model.cfg.vocab_size, option, name)
    elif kw.get("prompt"):
        option = "--prompt"
        try:
            ids = model.encode(kw["prompt"])
        except MissingTokenizer as e:      # its hint fits a build; synth has a way around the tokenizer
            raise UsageError(f"{e}, or pass --prompt-ids instead of --prompt") from None
    else:
        raise UsageError("give --prompt or --prompt-ids")
    need, context = len(ids) + int(kw["max_tokens"]) - 1, model.context    # the last token is never fed back
    if ids and need > context:
        raise UsageError(f"{option}: {len(ids)} tokens and --max-tokens {kw['max_tokens']} need {need} positions; "
                         f"the context holds {context} (--context-length); shorten the prompt, lower --max-tokens, "
                         f"or {context_hint(RECIPE, build)}")
    return ids

"""What every recipe's `omni-export synth` shares: messages naming the checkpoint, token-id checks,
output files checked before any work and written as one-line errors, and the context-size hint.

Only the standard library is imported at module load (the CLI lists synth commands without torch).
"""
from __future__ import annotations

from pathlib import Path


def checkpoint_name(given) -> str:
    """The checkpoint as messages name it: the demo one is written to a scratch directory that is gone
    by the time the message is read."""
    return str(given) if given else "the demo checkpoint"


def check_ids(ids, vocab: int, option: str, checkpoint: str, tokenized: bool = False) -> None:
    """Token ids against a vocabulary of `vocab` entries, before any work: a negative id would wrap
    around to the table's end unseen, one past it be an IndexError deep in the first graph call.
    `tokenized`: the checkpoint's tokenizer made them from `option`'s text (then the files disagree)."""
    from ..core import UsageError

    bad = next((int(i) for i in ids if not 0 <= int(i) < vocab), None)
    if bad is None:
        return
    if tokenized:
        raise UsageError(f"{checkpoint}: the tokenizer gives id {bad} for {option} but the text vocabulary is "
                         f"0..{vocab - 1}; tokenizer and weights do not belong together")
    raise UsageError(f"{option}: {bad} is outside the text vocabulary 0..{vocab - 1} of {checkpoint}")


def check_output_file(path, option: str) -> Path:
    """An output file's path before any work (a FIFO would block the write forever, a directory or
    device fail it or swallow it after minutes of generation): a regular file or nothing yet, under
    a directory that exists or can be made. Returns the path."""
    import os
    import stat

    from ..core import UsageError

    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise UsageError(f"{option} {path} cannot be written ({e.strerror})") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(f"{option} {path} is a directory; pass a file path")
    if mode is not None and not stat.S_ISREG(mode):
        raise UsageError(f"{option} {path} is not a regular file (a FIFO, device or socket); pass a file path")
    parent = next((d for d in path.absolute().parents if d.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a directory")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: {parent} is not writable")
    return path


def npy_path(path) -> Path:
    """Where numpy.save writes `path` (it adds .npy to a name without it)."""
    return Path(str(path) if str(path).endswith(".npy") else f"{path}.npy")


def save_output(path, option: str, write) -> None:
    """`write(path)`, an OSError (disk full, a path made unwritable meanwhile) as one line."""
    from ..core import UsageError

    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as e:
        raise UsageError(f"{option} {path} cannot be written ({e.strerror or e})") from None


def context_hint(recipe, build, option: str = "context-length") -> str:
    """How to get a larger context (or another static size, `option`): synth runs the build's (or,
    without --build, the recipe's default). `recipe`: its page (core.Recipe)."""
    top = next(o.range[1] for o in recipe.options if o.name == option)
    if build:
        return f"rebuild {build} with a larger --{option} (at most {top})"
    return f"build with a larger --{option} (at most {top}) and synth --build it"


def open_bundle(kw: dict, recipe: str):
    """(bundle directory, its checked runtime.json, its graphs) for `synth RECIPE --bundle DIR`: the
    bundle alone (--build / --checkpoint refused), runtime.json checked (schema, paths, sha256), and a
    bundle of `recipe` with its host data. UsageError (one line) otherwise."""
    from ..artifacts.bundle import read_runtime
    from ..core import UsageError
    from .graphs import BuildGraphs

    for flag in ("build", "checkpoint"):
        if kw.get(flag):
            raise UsageError(f"--bundle runs from the bundle alone; drop --{flag}")
    root = Path(kw["bundle"])
    rt = read_runtime(root)
    if rt["recipe"]["name"] != recipe or not rt.get("host"):
        raise UsageError(f"--bundle {root} is a bundle of {rt['recipe']['name']}, not {recipe}")
    return root, rt, BuildGraphs.from_bundle(root, rt)


def graph_options(bundle_holds: str) -> list:
    """The click options every `omni-export synth RECIPE` starts with: where the model and its graphs come
    from (--checkpoint, --build, --bundle: `bundle_holds` says what the recipe's bundle holds beside its
    runtime.json and graphs) and which built graphs run (--runner, --precision)."""
    import click

    o = click.Option
    return [
        o(["--checkpoint", "-c"], type=click.Path(), default=None,
          help="checkpoint directory or Hugging Face repository ORG/NAME[@REVISION]; default: "
               "the build's checkpoint with --build, else the demo checkpoint"),
        o(["--build", "-b"], type=click.Path(), default=None, help="use the graphs of this build directory"),
        o(["--bundle"], type=click.Path(), default=None,
          help=f"run a bundle (`omni-export bundle`) alone, no checkpoint and no build: its runtime.json, "
               f"{bundle_holds} and graphs, each graph on its format's runtime (context binary: the HTP simulator; "
               f"ONNX: ONNX Runtime CPU; .pte: ExecuTorch); --runner and --precision do not apply"),
        o(["--runner", "-r"], type=click.Choice(["ort", "htp", "pte"]), default="ort", show_default=True,
          help="with --build: ONNX Runtime CPU, the HTP simulator (context binaries) or ExecuTorch"),
        o(["--precision", "-p"], default=None, help="with --build: which precision's graphs (default: the first accepted)"),
    ]


def options_and_checkpoint(recipe, build: Path | None, checkpoint: str | None):
    """(options, checkpoint, manifest) a synth run of `recipe` loads its model with: the recipe's defaults,
    and with --build the options that build was made with (its manifest, which must be this recipe's) and
    its checkpoint unless --checkpoint names one; manifest is None without --build."""
    from ..core import RANDOM_WEIGHTS

    opts = {o.name: o.default for o in recipe.options}
    if build is None:
        from ..hf import resolve_checkpoint

        return opts, resolve_checkpoint(checkpoint), None
    from ..artifacts.manifest import read_manifest
    from ..core import UsageError

    if not (build / "manifest.json").exists():
        raise UsageError(f"--build {build}: no manifest.json (not an omni-export build directory)")
    m = read_manifest(build)             # damaged, or listing a file outside the build: one line
    if m.get("recipe", {}).get("name") != recipe.name:
        raise UsageError(f"--build {build} is a build of {m.get('recipe', {}).get('name')}, not {recipe.name}")
    opts.update({k: v for k, v in m["options"]["recipe_options"].items() if v is not None})
    opts[RANDOM_WEIGHTS] = False
    return opts, checkpoint or m["checkpoint"]["path"], m

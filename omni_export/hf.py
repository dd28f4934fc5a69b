"""Checkpoints by name: `--checkpoint ORG/NAME[@REVISION]`, resolved through `huggingface_hub`.

A value that is an existing path is a directory, as before. Otherwise a Hugging Face repository id
(`Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice`, optionally `@main`, `@v1.0` or a commit) is fetched with
`snapshot_download` into the Hugging Face cache (HF_HOME / HF_HUB_CACHE as the user set them), and only
the files a loader reads: safetensors weights, JSON configs, tokenizer text files. Never a pickle
(`*.bin`, `*.pt`, `*.pth`, `*.ckpt`), whatever the repository holds. HF_HUB_OFFLINE=1 reads the cache
only. Every failure is one line naming the repository and what to do; the output directory is not
created before the checkpoint is resolved.
"""
from __future__ import annotations

import re
from pathlib import Path

from .core import UsageError

# what the loaders read (official layouts of Qwen3-TTS, MiniCPM-o 4.5's voice path, Spark); fnmatch
# patterns, `*` crossing `/`: speech_tokenizer/model.safetensors matches "*.safetensors"
ALLOW = ("*.safetensors", "*.json", "*.txt", "*.model", "*.tiktoken")
NEVER = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle", "*.npy", "*.npz")
_REPO = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95})"
                   r"(?:@(?P<rev>[A-Za-z0-9][A-Za-z0-9._/-]{0,199}))?$")


def parse_repo(text: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when `text` names a Hugging Face repository, else None."""
    m = _REPO.match(text)
    if not m or ".." in text:
        return None
    return m["repo"], m["rev"]


def resolve_checkpoint(text: str | None, option: str = "--checkpoint") -> str | None:
    """A local directory for `text`: the path itself when it exists (or is not a repository id: the
    loader says what is wrong with it), else the repository's snapshot in the Hugging Face cache."""
    if text is None or Path(text).exists():
        return text
    parsed = parse_repo(str(text))
    if parsed is None:
        return text
    repo, rev = parsed
    return str(_snapshot(repo, rev, option, text))


def _snapshot(repo: str, rev: str | None, option: str, text: str) -> Path:
    from huggingface_hub import constants, errors, snapshot_download

    fetch = (f"hf download {repo}" + (f" --revision {rev}" if rev else "")
             + " --include " + " ".join(f"'{p}'" for p in ALLOW))
    try:
        path = Path(snapshot_download(repo, revision=rev, allow_patterns=list(ALLOW), ignore_patterns=list(NEVER)))
    except errors.GatedRepoError:
        raise UsageError(f"{option} {text}: {repo} is gated; accept its terms on huggingface.co and log in "
                         f"with `hf auth login`") from None
    except errors.RepositoryNotFoundError:
        raise UsageError(f"{option} {text}: no such Hugging Face repository (or it is private: log in with "
                         f"`hf auth login`), and no such local directory") from None
    except errors.RevisionNotFoundError:
        raise UsageError(f"{option} {text}: {repo} has no revision {rev!r}") from None
    except errors.LocalEntryNotFoundError:
        where, then = f"{option} {text}: not in the Hugging Face cache ({constants.HF_HUB_CACHE})", (
            f"download it where there is network with `{fetch}`, or pass its directory")
        if constants.HF_HUB_OFFLINE:
            raise UsageError(f"{where} and HF_HUB_OFFLINE is set; {then}") from None
        raise UsageError(f"{where} and the Hugging Face Hub could not be reached; {then}") from None
    except (errors.HfHubHTTPError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{option} {text}: fetching from the Hugging Face Hub failed ({first}); "
                         f"retry, or `{fetch}` and pass its directory") from None
    if not any(path.glob("*.safetensors")) and not any(path.glob("*/*.safetensors")):
        raise UsageError(f"{option} {text}: the repository has no .safetensors weights (omni-export never "
                         f"loads pickled .bin/.pt files); convert them to safetensors first")
    return path

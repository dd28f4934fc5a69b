"""A checkpoint's Qwen2-style byte-level BPE tokenizer, loaded without transformers.

Prefers `tokenizer.json` (the fast tokenizer file, loaded as data by the `tokenizers` library);
otherwise builds the same pipeline as transformers' Qwen2TokenizerFast from `vocab.json` +
`merges.txt` + the added tokens of `tokenizer_config.json`: NFC normalisation, Qwen2's split
regex, byte-level mapping, BPE, special tokens matched before BPE. Nothing in these files is code.
"""
from __future__ import annotations

import json
from pathlib import Path

from .core import UsageError

# Qwen2's pre-tokenizer split pattern (public; transformers' PRETOKENIZE_REGEX for Qwen2).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


class MissingTokenizer(UsageError):
    """The checkpoint has no tokenizer files. The message names the files; a caller with a way
    around them (synth's --text-ids, --prompt-ids) adds it: a build has none to offer."""


class TextTokenizer:
    def __init__(self, tok):
        self._tok = tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load(directory: Path) -> TextTokenizer:
    from tokenizers import Tokenizer

    from .weights import check_side_file

    directory = Path(directory)
    fast = directory / "tokenizer.json"
    if fast.exists() or fast.is_symlink():
        check_side_file(fast, "tokenizer file")
        try:
            return TextTokenizer(Tokenizer.from_file(str(fast)))
        except Exception as e:  # the library raises plain Exceptions for malformed files
            raise UsageError(f"{fast}: not a readable tokenizer file ({e})") from None
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.exists() and merges.exists()):
        raise MissingTokenizer(f"{directory}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt); "
                               f"copy them from the checkpoint's release")
    for f in (vocab, merges, directory / "tokenizer_config.json"):
        if f.exists() or f.is_symlink():
            check_side_file(f, "tokenizer file")
    return TextTokenizer(_from_bpe_files(vocab, merges, directory / "tokenizer_config.json"))


def _from_bpe_files(vocab: Path, merges: Path, config: Path):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    try:
        bpe = models.BPE.from_file(str(vocab), str(merges), unk_token=None, fuse_unk=False,
                                   byte_fallback=False)
    except Exception as e:
        raise UsageError(f"{vocab.parent}: vocab.json / merges.txt unreadable ({e})") from None
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    added = _added_tokens(config)
    if added:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for _, t in sorted(added)])
        for i, t in added:
            if tok.token_to_id(t) != i:
                raise UsageError(f"{config}: added token {t!r} has id {i} but the vocab puts it at "
                                 f"{tok.token_to_id(t)}")
    return tok


def _added_tokens(config: Path) -> list[tuple[int, str]]:
    if not config.exists():
        return []
    from .weights import read_side_file

    try:
        cfg = json.loads(read_side_file(config, "tokenizer file"))
        return [(int(i), d["content"]) for i, d in (cfg.get("added_tokens_decoder") or {}).items()]
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise UsageError(f"{config}: malformed added_tokens_decoder ({str(e)[:200]})") from None

"""A checkpoint's Qwen2-style byte-level BPE tokenizer, loaded without transformers.

Prefers `tokenizer.json` (the fast tokenizer file, loaded as data by the `tokenizers` library);
otherwise builds the same pipeline as transformers' Qwen2TokenizerFast from `vocab.json` +
`merges.txt` + the added tokens of `tokenizer_config.json`: NFC normalisation, Qwen2's split
regex, byte-level mapping, BPE, special tokens matched before BPE. Nothing in these files is code.

The split can be the one transformers 4.57.3 puts in when a tokenizer is loaded with
`fix_mistral_regex=True`, as qwen-tts 0.1.1 loads its processor: `load(dir, split="auto")` follows
that rule (`upstream_split`), "qwen2" keeps the checkpoint's own split, "mistral" forces the other.
The patterns' Unicode classes (\\p{L}, \\p{Lu}, \\p{M}, ...) are matched by the `tokenizers` library's
regex engine, the one transformers hands them to; nothing here matches them with Python's `re`.
"""
from __future__ import annotations

import json
from pathlib import Path

from .core import UsageError

# Qwen2's pre-tokenizer split pattern (public; transformers' PRETOKENIZE_REGEX for Qwen2).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
# The split transformers 4.57.3 puts first in the pre-tokenizer sequence when it patches a tokenizer
# (tokenization_utils_base.PreTrainedTokenizerBase._patch_mistral_regex): letter runs cut before an
# upper-case letter that follows lower-case ones, combining marks (\p{M}) inside words, no contraction
# alternatives, slashes kept after a line break that ends a punctuation run.
MISTRAL_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                 r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                 r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = ("auto", "qwen2", "mistral")
# transformers 4.57.3 looks only at fast tokenizers whose base vocabulary (without added tokens) is
# larger than this, and leaves local checkpoints of these model types patched even when old
MISTRAL_CHECK_VOCAB = 100000
MISTRAL_MODEL_TYPES = ["mistral", "mistral3", "voxtral", "ministral", "pixtral"]


class MissingTokenizer(UsageError):
    """The checkpoint has no tokenizer files. The message names the files; a caller with a way
    around them (synth's --text-ids, --prompt-ids) adds it: a build has none to offer."""


class TextTokenizer:
    """`split`: "qwen2" (the checkpoint's own split) or "mistral"; `split_reason`: why, in words."""

    def __init__(self, tok, split: str = "qwen2", split_reason: str = "the checkpoint's own split"):
        self._tok = tok
        self.split, self.split_reason = split, split_reason

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def load(directory: Path, split: str = "qwen2") -> TextTokenizer:
    """`split`: "qwen2" keeps the checkpoint's split (as transformers loads it without the patch);
    "mistral" replaces it with MISTRAL_SPLIT; "auto" decides as upstream qwen-tts does
    (`upstream_split`)."""
    if split not in SPLITS:
        raise UsageError(f"text split {split!r}: one of {', '.join(SPLITS)}")
    return _with_split(_load(Path(directory)), Path(directory), split)


def _load(directory: Path):
    from tokenizers import Tokenizer

    from .weights import check_side_file

    fast = directory / "tokenizer.json"
    if fast.exists() or fast.is_symlink():
        check_side_file(fast, "tokenizer file")
        try:
            return Tokenizer.from_file(str(fast))
        except Exception as e:  # the library raises plain Exceptions for malformed files
            raise UsageError(f"{fast}: not a readable tokenizer file ({e})") from None
    vocab, merges = directory / "vocab.json", directory / "merges.txt"
    if not (vocab.exists() and merges.exists()):
        raise MissingTokenizer(f"{directory}: no tokenizer files (tokenizer.json, or vocab.json + merges.txt); "
                               f"copy them from the checkpoint's release")
    for f in (vocab, merges, directory / "tokenizer_config.json"):
        if f.exists() or f.is_symlink():
            check_side_file(f, "tokenizer file")
    return _from_bpe_files(vocab, merges, directory / "tokenizer_config.json")


def _with_split(tok, directory: Path, split: str) -> TextTokenizer:
    from tokenizers import Regex, pre_tokenizers

    reason = f"asked for ({split})"
    if split == "auto":
        split, reason = upstream_split(directory, tok.get_vocab_size(with_added_tokens=False),
                                       tok.pre_tokenizer is not None)
    if split == "mistral":       # as transformers patches it: the sequence's first pre-tokenizer replaced
        pre = tok.pre_tokenizer
        if not isinstance(pre, pre_tokenizers.Sequence):
            raise UsageError(f"{directory}: the tokenizer's pre-tokenizer is not a sequence, so the Mistral-style "
                             f"split cannot replace its first element (transformers 4.57.3 fails here too)")
        pre[0] = pre_tokenizers.Split(pattern=Regex(MISTRAL_SPLIT), behavior="isolated")
    return TextTokenizer(tok, split, reason)


def upstream_split(directory: Path, base_vocab: int, has_pre_tokenizer: bool = True) -> tuple[str, str]:
    """The split upstream's processor ends with for a checkpoint directory, and why: qwen-tts 0.1.1
    loads it with `fix_mistral_regex=True`, and transformers 4.57.3 (PreTrainedTokenizerBase.
    _from_pretrained -> _patch_mistral_regex, for a local directory) then takes the Mistral-style
    split when the fast tokenizer's base vocabulary exceeds 100000 and it has a pre-tokenizer, and the
    directory has a config.json whose `transformers_version` is missing or empty, or above 4.57.2 and
    below 5.0.0 (PEP 440 order: 4.57.2.post1, 4.57.3.dev0 and 5.0.0rc1 count), or at most 4.57.2
    with a `model_type` that is missing or one of MISTRAL_MODEL_TYPES. Otherwise the checkpoint's
    own split ("qwen2"). (Given a hub repo id instead of a directory, transformers patches only repos
    whose hub tags name a mistralai base model: Qwen's repos loaded by id keep "qwen2".)"""
    from packaging import version

    from .weights import read_side_file

    if base_vocab <= MISTRAL_CHECK_VOCAB or not has_pre_tokenizer:
        what = f"base vocabulary {base_vocab} <= {MISTRAL_CHECK_VOCAB}" if has_pre_tokenizer else "no pre-tokenizer"
        return "qwen2", f"{what}: transformers 4.57.3 does not patch the split"
    path = Path(directory) / "config.json"
    if not (path.exists() or path.is_symlink()):
        return "qwen2", "no config.json: transformers 4.57.3 does not patch the split of a local directory without one"
    try:
        cfg = json.loads(read_side_file(path, "tokenizer file"))
        v, model_type = cfg.get("transformers_version"), cfg.get("model_type")
    except (ValueError, AttributeError, RecursionError) as e:
        raise UsageError(f"{path}: not a JSON object ({str(e)[:200]}); upstream's tokenizer loading reads "
                         f"its transformers_version") from None
    patched = "upstream's processor (fix_mistral_regex=True) takes the Mistral-style split"
    if not v:
        return "mistral", f"config.json names no transformers_version: {patched}"
    try:
        parsed = version.parse(v)
    except (version.InvalidVersion, TypeError):
        raise UsageError(f"{path}: transformers_version {v!r} is not a version; upstream's tokenizer loading "
                         f"fails on it (--text-split qwen2|mistral chooses the split)") from None
    if parsed <= version.parse("4.57.2"):
        if model_type is not None and model_type not in MISTRAL_MODEL_TYPES:
            return "qwen2", f"config.json transformers_version {v} <= 4.57.2, model_type {model_type}: not patched"
        return "mistral", (f"config.json transformers_version {v} <= 4.57.2 but model_type {model_type}: "
                           f"{patched}")
    if parsed >= version.parse("5.0.0"):
        return "qwen2", f"config.json transformers_version {v} >= 5.0.0: not patched"
    return "mistral", f"config.json transformers_version {v}, after 4.57.2 and before 5.0.0: {patched}"


def split_pieces(text: str, split: str) -> list[str]:
    """`text` NFC-normalised and cut by QWEN2_SPLIT ("qwen2") or MISTRAL_SPLIT ("mistral"), as the
    tokenizer's first pre-tokenizer cuts it before byte-level mapping and BPE."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    pattern = {"qwen2": QWEN2_SPLIT, "mistral": MISTRAL_SPLIT}[split]
    cut = pre_tokenizers.Split(pattern=Regex(pattern), behavior="isolated", invert=False)
    return [p for p, _ in cut.pre_tokenize_str(normalizers.NFC().normalize_str(text))]


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

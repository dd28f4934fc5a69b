"""Goldens for the text split rule of upstream qwen_tts (issue 39 item 1), from the real libraries.

qwen-tts 0.1.1 loads its processor with `AutoProcessor.from_pretrained(dir, fix_mistral_regex=True)`;
transformers 4.57.3 then (PreTrainedTokenizerBase._from_pretrained -> _patch_mistral_regex) swaps the
first pre-tokenizer of the checkpoint's fast tokenizer for a Mistral-style split under conditions on
the base vocabulary size and config.json. This script runs that code on checkpoint directories
written by `write_tokenizer_dir` below (a real-size-style byte-level BPE: 151643 base tokens, Qwen's
special-token ids) and records, in tests/golden/qwen3_tts/text_split.json:

  - `rule`: for config.json variants (none, no version, versions around 4.57.2 / 5.0, model types)
    and base vocabularies at the 100000 boundary, which split upstream's processor ended with;
  - `texts`: for varied strings (CamelCase, acronyms, contractions, digits, URLs, emoji, CJK,
    Devanagari, Thai, newlines, ...), the split pieces of the NFC-normalised text under each rule and
    the templated ids upstream's processor gives (`<|im_start|>assistant\\n{text}<|im_end|>\\n
    <|im_start|>assistant\\n`), for the vocab.json + merges.txt layout and the tokenizer.json layout.

Own venv, no torch (qwen_tts's processor and config modules are loaded by file path, so its
package __init__, which imports torch, never runs):

    python3 -m venv /tmp/tsplit-ref
    /tmp/tsplit-ref/bin/pip install transformers==4.57.3
    /tmp/tsplit-ref/bin/pip install --no-deps qwen-tts==0.1.1
    /tmp/tsplit-ref/bin/python tools/golden/make_tokenizer_split_goldens.py

`write_tokenizer_dir` and TEXTS use only the standard library: tests/test_tokenizer_split.py
imports this file to write the same directories.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "qwen3_tts" / "text_split.json"

QWEN_BASE_VOCAB = 151643                     # Qwen2/Qwen3's byte-level BPE vocabulary without added tokens
# Qwen3-TTS's added tokens the prompt uses, at their ids (base vocabulary + offset); the offsets between
# them hold stand-ins, so the added tokens are contiguous as in the released tokenizer_config.json
SPECIALS = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>", 28: "<tts_pad>", 29: "<tts_text_bos>",
            30: "<tts_text_eod>", 31: "<tts_text_bos_single>"}
SPECIALS = {k: SPECIALS.get(k, f"<|extra_{k}|>") for k in range(32)}
TEMPLATE = "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"

# Strings whose pieces differ between the two splits, and some where they do not.
TEXTS = {
    "plain": "Hello world, this is a plain sentence.",
    "camelcase": "CamelCase, iPhone, McDonald and JavaScript's getElementById",
    "acronyms": "NASA, the FBI and XMLHttpRequest; the USA's GDP grew. HTTPServer PDFs",
    "contractions": "I'm sure they'll say we've done it, don't you? IT'S HERE, WE'LL GO",
    "contractions_glued": "'twas 'tis 'sup I'mma it'sa we'd've rock'n'roll O'Neil x'Ll",
    "apostrophes_curly": "It\u2019s \u2018quoted\u2019 and they\u2019re here",
    "digits": "Call 555-0123 at 10:45 on 2024-03-15, pay $1,234.56 or 3.14159; \u0661\u0662\u0663 \u096a\u096b \u216b \u00bd x\u00b2",
    "url": "Visit https://www.example.com/path/to/Page?q=1&lang=en#top or http://a.b/c//d/ now",
    "slashes_newline": "end.\n/path and a/b//c ///\n//x",
    "emoji": "I love it \U0001F600\U0001F44D\U0001F3FD and \U0001F468\u200D\U0001F469\u200D\U0001F467 families \u2764\uFE0F a\u2764\uFE0Fb",
    "cjk": "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u4eec\u4eca\u5929\u53bb\u5317\u4eac\u3002",
    "japanese": "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u30ab\u30bf\u30ab\u30ca\u3001\uff21\uff22\uff23\u3067\u3059\u3002",
    "korean": "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "devanagari": "\u0928\u092e\u0938\u094d\u0924\u0947, \u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902? \u092e\u0948\u0902 \u0920\u0940\u0915 \u0939\u0942\u0901\u0964",
    "thai": "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e22\u0e34\u0e19\u0e14\u0e35\u0e17\u0e35\u0e48\u0e44\u0e14\u0e49\u0e23\u0e39\u0e49\u0e08\u0e31\u0e01",
    "arabic": "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064e\u062a\u064e\u0628\u064e",
    "greek_cyrillic": "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u039a\u0395\u03a6\u0391\u039b\u0391\u0399\u0391 and \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0422\u0415\u041a\u0421\u0422 \u041c\u043e\u0441\u043a\u0432\u0430",
    "accents_combining": "na\u00efve cafe\u0301 re\u0301sume\u0301 A\u030angstro\u0308m q\u0307 Z\u0335algo",
    "titlecase_modifier": "\u01c5emal \u01c8ubljana \u02bbOkina \u02b0aspirated mod\u02e2 \u3005\u3005",
    "newlines": "line one\nline two\r\n\nLine Three\n\n  indented\n\tTabbed\n",
    "spaces": "  leading spaces and\ttabs   trailing  ",
    "mixed": "GPT-4o vs. Qwen3-TTS: 12Hz codecs, v0.1.1 (2026) \u2014 \u00abOK\u00bb \u201cfine\u201d\u2026",
}

# config.json variants: (name, config.json content or None for no file, base vocabulary)
RULE_CASES = [
    ("no config.json", None, QWEN_BASE_VOCAB),
    ("no transformers_version", {"model_type": "qwen3_tts"}, QWEN_BASE_VOCAB),
    ("empty transformers_version", {"model_type": "qwen3_tts", "transformers_version": ""}, QWEN_BASE_VOCAB),
    ("4.51.3", {"model_type": "qwen3_tts", "transformers_version": "4.51.3"}, QWEN_BASE_VOCAB),
    ("4.57.2", {"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, QWEN_BASE_VOCAB),
    ("4.57.2 without model_type", {"transformers_version": "4.57.2"}, QWEN_BASE_VOCAB),
    ("4.57.2 model_type mistral", {"model_type": "mistral", "transformers_version": "4.57.2"}, QWEN_BASE_VOCAB),
    ("4.57.2 model_type pixtral", {"model_type": "pixtral", "transformers_version": "4.57.2"}, QWEN_BASE_VOCAB),
    ("4.57.2.post1", {"model_type": "qwen3_tts", "transformers_version": "4.57.2.post1"}, QWEN_BASE_VOCAB),
    ("4.57.3.dev0", {"model_type": "qwen3_tts", "transformers_version": "4.57.3.dev0"}, QWEN_BASE_VOCAB),
    ("4.57.3", {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, QWEN_BASE_VOCAB),
    ("4.60.0", {"model_type": "qwen3_tts", "transformers_version": "4.60.0"}, QWEN_BASE_VOCAB),
    ("5.0.0.dev0", {"model_type": "qwen3_tts", "transformers_version": "5.0.0.dev0"}, QWEN_BASE_VOCAB),
    ("5.0.0rc1", {"model_type": "qwen3_tts", "transformers_version": "5.0.0rc1"}, QWEN_BASE_VOCAB),
    ("5.0.0", {"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, QWEN_BASE_VOCAB),
    ("5.2.1", {"model_type": "qwen3_tts", "transformers_version": "5.2.1"}, QWEN_BASE_VOCAB),
    ("4.57.3, base vocab 100000", {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, 100000),
    ("4.57.3, base vocab 100001", {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, 100001),
]
PROBE = "CamelCase \u0928\u092e\u0938\u094d\u0924\u0947 'sup"


# ----------------------------------------------------------------------- the checkpoint directory

def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet), in its usual order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _targets(text: str) -> list[str]:
    """The strings of `text` that the merges make single tokens: each run of letters and marks
    (Unicode categories L*, M*) with the one character before it when that is neither a letter, a
    digit nor a line break (the shape of a word piece under either split), then each
    whitespace-led chunk (spaces glued to the following non-space run)."""
    import unicodedata

    def wordish(ch: str) -> bool:
        return unicodedata.category(ch)[0] in "LM"

    runs, i = [], 0
    while i < len(text):
        if not wordish(text[i]):
            i += 1
            continue
        j = i
        while j < len(text) and wordish(text[j]):
            j += 1
        prev = text[i - 1] if i else ""
        lead = prev if prev and unicodedata.category(prev)[0] != "N" and prev not in "\r\n" else ""
        runs.append(lead + text[i:j])
        i = j
    return runs + re.findall(r"\s*\S+|\s+", text)


def _bpe(symbols: list[str], ranks: dict) -> list[str]:
    """Byte-level BPE on one piece: merge the adjacent pair of lowest rank (leftmost on ties) until
    none is in `ranks`."""
    while len(symbols) > 1:
        best = min(((ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks), default=None)
        if best is None:
            break
        i = best[1]
        symbols = [*symbols[:i], symbols[i] + symbols[i + 1], *symbols[i + 2:]]
    return symbols


def _merges() -> list[tuple[str, str]]:
    """Merges over TEXTS and the template words that make each target string (`_targets`) one token:
    while BPE with the merges so far leaves a target in pieces, the first two pieces' merge is added
    (last in rank, so the targets made before stay single tokens). They cross case changes,
    apostrophes, combining marks and slashes, so a split that cuts a target gives other ids than one
    that keeps it."""
    alphabet = byte_alphabet()
    ranks: dict[tuple[str, str], int] = {}
    for text in [*TEXTS.values(), "assistant", "user"]:
        for target in _targets(text):
            symbols = [alphabet[b] for b in target.encode("utf-8")]
            pieces = _bpe(symbols, ranks)
            while len(pieces) > 1:
                ranks[(pieces[0], pieces[1])] = len(ranks)
                pieces = _bpe(symbols, ranks)
    return list(ranks)


def write_tokenizer_dir(directory: Path, *, base_vocab: int = QWEN_BASE_VOCAB, fast_file: bool = False,
                        config: dict | None = None) -> Path:
    """vocab.json + merges.txt + tokenizer_config.json (Qwen2Tokenizer), and tokenizer.json when
    `fast_file` (the same tokenizer in the fast file's format, Qwen2's split). The vocabulary is the
    256 byte symbols, the merges' tokens, filler tokens no text can produce up to `base_vocab`, then
    Qwen's added tokens at base_vocab + offset. `config`: written as config.json when given."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    alphabet = byte_alphabet()
    vocab: dict[str, int] = {}
    for ch in alphabet.values():
        vocab[ch] = len(vocab)
    merges = _merges()
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    if len(vocab) > base_vocab:
        raise ValueError(f"base_vocab {base_vocab} < the {len(vocab)} tokens the merges need")
    for i in range(base_vocab - len(vocab)):
        vocab[f"\u27e8fill {i}\u27e9"] = len(vocab)
    added = {str(base_vocab + k): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                   "single_word": False, "special": True} for k, t in SPECIALS.items()}
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                          encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}, indent=1, ensure_ascii=False), encoding="utf-8")
    if fast_file:
        qwen2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
        fast = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": int(i), **{k: v for k, v in d.items() if k != "special"}, "special": True}
                             for i, d in added.items()],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": qwen2}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                               "use_regex": False},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]},
        }
        (directory / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False), encoding="utf-8")
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


# ----------------------------------------------------------------------- upstream's processor

def _upstream_processor_class():
    """qwen_tts's Qwen3TTSProcessor and Qwen3TTSConfig, registered as Qwen3TTSModel.from_pretrained
    registers them, loaded from their files (the package __init__ imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("qwen_tts")
    models = Path(spec.submodule_search_locations[0]) / "core" / "models"
    loaded = {}
    for name in ("configuration_qwen3_tts", "processing_qwen3_tts"):
        s = importlib.util.spec_from_file_location(f"_qwen_tts_{name}", models / f"{name}.py")
        m = importlib.util.module_from_spec(s)
        s.loader.exec_module(m)
        loaded[name] = m
    from transformers import AutoConfig, AutoProcessor

    config_cls = loaded["configuration_qwen3_tts"].Qwen3TTSConfig
    processor_cls = loaded["processing_qwen3_tts"].Qwen3TTSProcessor
    AutoConfig.register("qwen3_tts", config_cls)
    AutoProcessor.register(config_cls, processor_cls)
    return processor_cls


def _load(directory: Path, processor_cls):
    """As qwen-tts 0.1.1 loads it: AutoProcessor.from_pretrained(dir, fix_mistral_regex=True). Where
    config.json cannot name the processor (no file, another model_type) the processor class is asked
    directly with the same arguments (AutoProcessor would hand them to it)."""
    from transformers import AutoProcessor

    cfg = directory / "config.json"
    if cfg.exists() and json.loads(cfg.read_text()).get("model_type") == "qwen3_tts":
        return AutoProcessor.from_pretrained(str(directory), fix_mistral_regex=True), "AutoProcessor"
    return processor_cls.from_pretrained(str(directory), fix_mistral_regex=True), "Qwen3TTSProcessor"


def _pattern(processor) -> str:
    first = processor.tokenizer.backend_tokenizer.pre_tokenizer[0]
    return json.loads(first.__getstate__())["pattern"]["Regex"]


def _split_of(processor) -> str:
    pattern = _pattern(processor)
    if pattern.startswith("(?i:'s"):
        return "qwen2"
    if pattern.startswith(r"[^\r\n\p{L}\p{N}]?[\p{Lu}"):
        return "mistral"
    return "other: " + pattern


def _ids(processor, text: str) -> list[int]:
    return processor(text=TEMPLATE.format(text=text), padding=True)["input_ids"][0]


def main() -> None:
    import tempfile

    import tokenizers
    import transformers

    processor_cls = _upstream_processor_class()
    out = {"generated_by": "tools/golden/make_tokenizer_split_goldens.py",
           "upstream": {"qwen-tts": "0.1.1", "transformers": transformers.__version__,
                        "tokenizers": tokenizers.__version__},
           "template": TEMPLATE, "base_vocab": QWEN_BASE_VOCAB, "patterns": {}, "rule": [], "texts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for layout in ("vocab.json", "tokenizer.json"):
            for name, config, base in RULE_CASES:
                d = write_tokenizer_dir(tmp / f"{layout}-{len(out['rule'])}", base_vocab=base,
                                        fast_file=layout == "tokenizer.json", config=config)
                proc, how = _load(d, processor_cls)
                out["rule"].append({"case": name, "layout": layout, "config": config, "base_vocab": base,
                                    "loaded_by": how, "split": _split_of(proc), "probe_ids": _ids(proc, PROBE)})
        out["probe"] = PROBE
        for layout in ("vocab.json", "tokenizer.json"):
            for split, version in (("qwen2", "4.57.2"), ("mistral", "4.57.3")):
                d = write_tokenizer_dir(tmp / f"texts-{layout}-{split}", fast_file=layout == "tokenizer.json",
                                        config={"model_type": "qwen3_tts", "transformers_version": version})
                proc, _ = _load(d, processor_cls)
                assert _split_of(proc) == split, (layout, split, _split_of(proc))
                assert out["patterns"].setdefault(split, _pattern(proc)) == _pattern(proc)
                backend = proc.tokenizer.backend_tokenizer
                for key, text in TEXTS.items():
                    entry = out["texts"].setdefault(key, {"text": text})
                    pieces = [p for p, _ in backend.pre_tokenizer[0].pre_tokenize_str(
                        backend.normalizer.normalize_str(text))]
                    if layout == "vocab.json":
                        entry[f"{split}_pieces"] = pieces
                        entry[f"{split}_ids"] = _ids(proc, text)
                    else:   # the fast file gives the same: recorded once, checked here
                        assert entry[f"{split}_pieces"] == pieces and entry[f"{split}_ids"] == _ids(proc, text), key
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(_compact(out) + "\n", encoding="utf-8")
    differ = sum(e["qwen2_ids"] != e["mistral_ids"] for e in out["texts"].values())
    print(f"wrote {OUT}: {len(out['rule'])} rule cases, {len(out['texts'])} texts ({differ} tokenize differently)",
          file=sys.stderr)


def _compact(out: dict) -> str:
    """JSON with one line per rule case and per text entry (the id lists stay on their line)."""
    def obj(d: dict, indent: str) -> str:
        inner = ",\n".join(f"{indent} {json.dumps(k, ensure_ascii=False)}: {json.dumps(v, ensure_ascii=False)}"
                           for k, v in d.items())
        return "{\n" + inner + f"\n{indent}}}"

    parts = []
    for k, v in out.items():
        if k == "rule":
            body = "[\n" + ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in v) + "\n ]"
        elif k == "texts":
            body = "{\n" + ",\n".join(f"  {json.dumps(key)}: {obj(e, '  ')}" for key, e in v.items()) + "\n }"
        else:
            body = json.dumps(v, ensure_ascii=False)
        parts.append(f" {json.dumps(k)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}"


if __name__ == "__main__":
    main()

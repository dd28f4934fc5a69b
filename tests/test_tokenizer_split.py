"""The text split rule of upstream qwen_tts (issue 39 item 1).

qwen-tts 0.1.1 loads its processor with `fix_mistral_regex=True`; transformers 4.57.3 then swaps the
Qwen2 split of a checkpoint's fast tokenizer for a Mistral-style one when the base vocabulary exceeds
100000 and config.json's transformers_version is missing, above 4.57.2 and below 5.0, or old with a
missing or Mistral model_type. omni_export.text_tokenizer follows that rule (`load(dir, "auto")`),
and `synth qwen3-tts` uses it, with `--text-split qwen2|mistral` to override.

Goldens: tests/golden/qwen3_tts/text_split.json, written by tools/golden/make_tokenizer_split_goldens.py
with upstream's own processor (transformers 4.57.3, tokenizers 0.22.2, qwen-tts 0.1.1) on directories
that script's `write_tokenizer_dir` writes (a real-size-style byte-level BPE, 151643 base tokens);
these tests write the same directories. The hand-written table below is derived from the two
patterns themselves and checked against the library here (and against the goldens' pieces)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import golden_tool, run_cli
from omni_export import text_tokenizer as tt
from omni_export.core import UsageError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "qwen3_tts" / "text_split.json").read_text(encoding="utf-8"))


W = golden_tool("make_tokenizer_split_goldens")
TEMPLATE = GOLDEN["template"]
V4573 = {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict:
    """The goldens' checkpoint directories: vocab.json + merges.txt, and with tokenizer.json too."""
    root = tmp_path_factory.mktemp("tokenizer-split")
    return {"vocab.json": W.write_tokenizer_dir(root / "slow", config=V4573),
            "tokenizer.json": W.write_tokenizer_dir(root / "fast", fast_file=True, config=V4573)}


# ------------------------------------------------------------------------------- the patterns

def test_the_patterns_are_the_ones_transformers_4_57_3_installs():
    """Read back from the tokenizers upstream's processor ended with (the converter's Qwen2 split;
    the split _patch_mistral_regex puts first)."""
    assert GOLDEN["upstream"]["transformers"] == "4.57.3"
    assert tt.QWEN2_SPLIT == GOLDEN["patterns"]["qwen2"]
    assert tt.MISTRAL_SPLIT == GOLDEN["patterns"]["mistral"]


# Derived from the patterns: Qwen2 cuts letter runs (\p{L}+) only at non-letters and takes 's 't 're
# 've 'm 'll 'd first (any case); Mistral's letter pieces are [Lu Lt Lm Lo M]*[Ll Lm Lo M]+ or
# [Lu Lt Lm Lo M]+[Ll Lm Lo M]*, so a run is cut before an upper-case letter that follows lower-case
# ones, marks (\p{M}) stay inside, and a ' before letters is just the optional leading character.
# Punctuation runs take trailing line breaks (and, in Mistral's, slashes after them).
BY_HAND = [
    # text, Qwen2 pieces, Mistral pieces
    ("CamelCase", ["CamelCase"], ["Camel", "Case"]),
    ("an iPhone", ["an", " iPhone"], ["an", " i", "Phone"]),
    ("getElementById", ["getElementById"], ["get", "Element", "By", "Id"]),
    ("XMLHttpRequest", ["XMLHttpRequest"], ["XMLHttp", "Request"]),
    ("McDonald", ["McDonald"], ["Mc", "Donald"]),
    ("abcDEF", ["abcDEF"], ["abc", "DEF"]),
    ("NASA PDFs HTTPServer", ["NASA", " PDFs", " HTTPServer"], ["NASA", " PDFs", " HTTPServer"]),
    ("USA's GDP", ["USA", "'s", " GDP"], ["USA", "'s", " GDP"]),
    ("don't, IT'S, we'll", ["don", "'t", ",", " IT", "'S", ",", " we", "'ll"],
     ["don", "'t", ",", " IT", "'S", ",", " we", "'ll"]),
    ("'tis I'mma it'sa", ["'t", "is", " I", "'m", "ma", " it", "'s", "a"], ["'tis", " I", "'mma", " it", "'sa"]),
    ("we'd've", ["we", "'d", "'ve"], ["we", "'d", "'ve"]),
    ("it\u2019s", ["it", "\u2019s"], ["it", "\u2019s"]),
    ("2024-03", ["2", "0", "2", "4", "-", "0", "3"], ["2", "0", "2", "4", "-", "0", "3"]),
    ("GPT-4o", ["GPT", "-", "4", "o"], ["GPT", "-", "4", "o"]),
    # any \p{N} stands alone, and a space before one is a piece of its own
    ("\u0968\u0966 \u00bd", ["\u0968", "\u0966", " ", "\u00bd"], ["\u0968", "\u0966", " ", "\u00bd"]),
    ("a/b//c", ["a", "/b", "//", "c"], ["a", "/b", "//", "c"]),
    ("https://x.io/a", ["https", "://", "x", ".io", "/a"], ["https", "://", "x", ".io", "/a"]),
    ("end.\n/path", ["end", ".\n", "/path"], ["end", ".\n/", "path"]),
    ("\U0001F600\U0001F44D\U0001F3FD ok", ["\U0001F600\U0001F44D\U0001F3FD", " ok"],
     ["\U0001F600\U0001F44D\U0001F3FD", " ok"]),
    ("a\u2764\uFE0Fb", ["a", "\u2764\uFE0F", "b"], ["a", "\u2764\uFE0Fb"]),
    # a full-width comma is the one non-letter a letter piece may start with
    ("\u4f60\u597d\uff0c\u4e16\u754c\u3002", ["\u4f60\u597d", "\uff0c\u4e16\u754c", "\u3002"],
     ["\u4f60\u597d", "\uff0c\u4e16\u754c", "\u3002"]),
    # Devanagari: letters are Lo, the virama and vowel signs are marks (Mn / Mc)
    ("\u0928\u092e\u0938\u094d\u0924\u0947", ["\u0928\u092e\u0938", "\u094d\u0924", "\u0947"],
     ["\u0928\u092e\u0938\u094d\u0924\u0947"]),
    # Thai: consonants Lo, above / below vowels and tone marks Mn
    ("\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", ["\u0e2a\u0e27", "\u0e31\u0e2a\u0e14", "\u0e35"],
     ["\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35"]),
    # NFC first: e + U+0301 composes to one letter; q + U+0307 has no composed form and stays a mark
    ("cafe\u0301 q\u0307", ["caf\u00e9", " q", "\u0307"], ["caf\u00e9", " q\u0307"]),
    ("\u01c5emal \u02b0a", ["\u01c5emal", " \u02b0a"], ["\u01c5emal", " \u02b0a"]),
    ("line one\n\nLine Two\r\n", ["line", " one", "\n\n", "Line", " Two", "\r\n"],
     ["line", " one", "\n\n", "Line", " Two", "\r\n"]),
    ("  x  ", [" ", " x", "  "], [" ", " x", "  "]),
    ("ok!\n\nNext", ["ok", "!\n\n", "Next"], ["ok", "!\n\n", "Next"]),
]


@pytest.mark.parametrize("text, qwen2, mistral", BY_HAND, ids=[t[0][:16] for t in BY_HAND])
def test_the_splits_cut_as_their_patterns_say(text, qwen2, mistral):
    assert tt.split_pieces(text, "qwen2") == qwen2
    assert tt.split_pieces(text, "mistral") == mistral


@pytest.mark.parametrize("key", sorted(GOLDEN["texts"]))
def test_the_splits_cut_as_upstreams_tokenizer_cuts(key):
    """The pieces of the NFC-normalised text under each split, as the tokenizer upstream's processor
    built cut them (tokenizers 0.22.2; here the installed version)."""
    entry = GOLDEN["texts"][key]
    for split in ("qwen2", "mistral"):
        assert tt.split_pieces(entry["text"], split) == entry[f"{split}_pieces"], split


def test_the_goldens_cover_every_string_class_and_tell_the_splits_apart():
    texts = GOLDEN["texts"]
    for key in ("camelcase", "acronyms", "contractions_glued", "slashes_newline", "emoji", "devanagari",
                "thai", "arabic", "accents_combining"):
        assert texts[key]["qwen2_ids"] != texts[key]["mistral_ids"], key
    for key in ("plain", "contractions", "digits", "url", "cjk", "japanese", "korean", "newlines", "spaces"):
        assert texts[key]["qwen2_ids"] == texts[key]["mistral_ids"], key


# ------------------------------------------------------------------------------- ids

@pytest.mark.parametrize("layout", ["vocab.json", "tokenizer.json"])
def test_templated_ids_are_upstream_processors_for_either_split(layout, dirs):
    """Upstream's Qwen3TTSProcessor on `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`,
    config.json at 4.57.2 (Qwen2's split) and at 4.57.3 (Mistral-style), against load(dir, split)."""
    toks = {split: tt.load(dirs[layout], split) for split in ("qwen2", "mistral")}
    assert tt.load(dirs[layout], "auto").split == "mistral"          # this directory's config says 4.57.3
    for key, entry in GOLDEN["texts"].items():
        for split, tok in toks.items():
            assert tok.encode(TEMPLATE.format(text=entry["text"])) == entry[f"{split}_ids"], (key, split)


def test_load_keeps_the_checkpoints_split_unless_asked(dirs):
    """Callers that do not ask (Spark-TTS, whose upstream loads its tokenizer without fix_mistral_regex)
    keep the checkpoint's own split whatever config.json says."""
    tok = tt.load(dirs["vocab.json"])
    assert tok.split == "qwen2"
    text = GOLDEN["texts"]["camelcase"]
    assert tok.encode(TEMPLATE.format(text=text["text"])) == text["qwen2_ids"]


# ------------------------------------------------------------------------------- the rule

def _rule_cases():
    seen, out = set(), []
    for r in GOLDEN["rule"]:
        assert r["split"] in ("qwen2", "mistral"), r
        key = (r["case"], r["split"])
        if r["case"] not in seen:
            seen.add(r["case"])
            out.append(r)
        else:           # both layouts: the same decision
            assert key in {(o["case"], o["split"]) for o in out}, r
    return out


RULE = _rule_cases()


@pytest.mark.parametrize("case", RULE, ids=[r["case"] for r in RULE])
def test_the_rule_decides_as_transformers_4_57_3_with_fix_mistral_regex(case, tmp_path):
    if case["config"] is not None:
        (tmp_path / "config.json").write_text(json.dumps(case["config"]))
    split, why = tt.upstream_split(tmp_path, case["base_vocab"])
    assert split == case["split"], why
    assert why


@pytest.mark.parametrize("layout", ["vocab.json", "tokenizer.json"])
def test_auto_gives_upstreams_ids_end_to_end(layout, tmp_path):
    """load(dir, "auto") on directories differing only in config.json and the base vocabulary gives
    the ids upstream's processor gave on each (a probe that the two splits tokenize differently)."""
    wanted = {(r["case"], r["layout"]): r for r in GOLDEN["rule"]}
    cases = ["no config.json", "no transformers_version", "4.57.2", "4.57.3", "5.0.0rc1", "5.0.0",
             "4.57.3, base vocab 100000", "4.57.3, base vocab 100001"]
    made = {}
    for name in cases:
        r = wanted[(name, layout)]
        d = made.get(r["base_vocab"])
        if d is None:
            d = made[r["base_vocab"]] = W.write_tokenizer_dir(tmp_path / str(r["base_vocab"]),
                                                              base_vocab=r["base_vocab"],
                                                              fast_file=layout == "tokenizer.json")
        (d / "config.json").unlink(missing_ok=True)
        if r["config"] is not None:
            (d / "config.json").write_text(json.dumps(r["config"]))
        tok = tt.load(d, "auto")
        assert tok.split == r["split"], (name, tok.split_reason)
        assert tok.encode(TEMPLATE.format(text=GOLDEN["probe"])) == r["probe_ids"], name


@pytest.mark.parametrize("config, message", [
    ({"model_type": "qwen3_tts", "transformers_version": "latest"}, "transformers_version 'latest' is not a version"),
    ({"model_type": "qwen3_tts", "transformers_version": 4.57}, "transformers_version 4.57 is not a version"),
    ([1, 2], "not a JSON object"),
])
def test_a_config_upstream_cannot_read_is_refused_not_guessed(config, message, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match=message):
        tt.upstream_split(tmp_path, W.QWEN_BASE_VOCAB)
    assert tt.upstream_split(tmp_path, 1000)[0] == "qwen2"     # transformers does not read it then


def test_the_mistral_split_replaces_the_first_pre_tokenizer_or_is_refused(tmp_path):
    d = W.write_tokenizer_dir(tmp_path, base_vocab=2000, fast_file=True)
    fast = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    fast["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                             "use_regex": True}
    (d / "tokenizer.json").write_text(json.dumps(fast, ensure_ascii=False), encoding="utf-8")
    assert tt.load(d, "auto").split == "qwen2"                 # 2000 base tokens: not patched
    with pytest.raises(UsageError, match="not a sequence"):
        tt.load(d, "mistral")
    with pytest.raises(UsageError, match="text split 'camel'"):
        tt.load(d, "camel")


# ------------------------------------------------------------------------------- synth --json

def _synth(ck, *args):
    return run_cli("synth", "qwen3-tts", "--checkpoint", str(ck), "--greedy", "--max-frames", "1", "--json",
                   *args, timeout=120)


@pytest.mark.parametrize("asked, split", [(None, "qwen2"), ("mistral", "mistral"), ("qwen2", "qwen2")])
def test_synth_json_shows_the_split_and_the_templated_ids_it_fed(asked, split, tiny_checkpoint):
    from omni_export.recipes.qwen3_tts.prompt import template_ids

    text = "CamelCase \u0928\u092e\u0938\u094d\u0924\u0947 'sup"
    proc = _synth(tiny_checkpoint, "--text", text, *(["--text-split", asked] if asked else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["text_split"] == split
    if asked is None:        # the tiny checkpoint's base vocabulary is far below 100000
        assert "base vocabulary" in s["text_split_reason"]
    assert s["text_ids"] == template_ids(tt.load(tiny_checkpoint, split), text)


def test_synth_text_split_with_ids_given_is_refused(tiny_checkpoint):
    proc = _synth(tiny_checkpoint, "--text-ids", "268,263,10,72,105,269,10,268,263,10", "--text-split", "mistral")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "omni-export: error: --text-split applies to --text and --instruct; --text-ids and --instruct-ids "
        "are fed as given")

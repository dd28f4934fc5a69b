"""Goldens for `synth --text` on a checkpoint written by upstream with a real-size-style BPE (issue 39,
acceptance 2): upstream's templated ids and greedy codes for every string class of the split goldens.

Runs in the venv of make_goldens.py (tools/golden/README.md):

    /tmp/refvenv/bin/python tools/golden/make_text_codes_goldens.py

The checkpoint (`write_checkpoint`, also used by tests/test_text_codes.py to write the same bytes): the
tiny CustomVoice geometry of omni-export's seeded writer with the text side at real size -- a text
embedding of Qwen's 151936 rows, tts_pad / tts_bos / tts_eos at Qwen's ids 151671-151673 -- and the
real-size-style byte-level BPE of make_tokenizer_split_goldens.py (151643 base tokens, Qwen's special-token
ids; vocab.json + merges.txt). Upstream's model class loads those tensors and its `save_pretrained` writes
the checkpoint again; its config.json (transformers_version 4.57.3) is kept as
tests/golden/qwen3_tts/text_codes_config.json, and the tensors it wrote are checked equal to ours.

Upstream then runs as a user runs it, on that directory: the processor loaded as
`Qwen3TTSModel.from_pretrained` loads it (`AutoProcessor.from_pretrained(dir, fix_mistral_regex=True)`:
the Mistral-style split, since config.json says 4.57.3), the model's generation defaults from its
generation_config.json, and `Qwen3TTSModel.generate_custom_voice(text, speaker, language="Auto",
do_sample=False, subtalker_dosample=False, max_new_tokens=MAX_NEW_TOKENS)` for each string of
make_tokenizer_split_goldens.TEXTS. Recorded per string: the input_ids generate received and the codes it
returned [frames, 16] (the speech tokenizer's decode is not run: the codes are what is compared). Writes
tests/golden/qwen3_tts/text_codes.json and text_codes_config.json.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "tests" / "golden" / "qwen3_tts"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from make_tokenizer_split_goldens import QWEN_BASE_VOCAB, SPECIALS, TEXTS, write_tokenizer_dir  # noqa: E402

SEED = 23
TEXT_VOCAB = 151936                  # Qwen3-TTS's text_vocab_size (the embedding's rows; ids past the tokens unused)
SPEAKER = "ryan"
MAX_NEW_TOKENS = 6
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _special(name: str) -> int:
    return QWEN_BASE_VOCAB + next(k for k, t in SPECIALS.items() if t == name)


def geometry():
    """The tiny CustomVoice geometry with the text side at real size."""
    from omni_export.recipes.qwen3_tts import demo

    cfg = demo.geometry("tiny", "custom_voice")
    return replace(cfg, talker=replace(cfg.talker, text_vocab_size=TEXT_VOCAB),
                   tts_pad_token_id=_special("<tts_pad>"), tts_bos_token_id=_special("<tts_text_bos>"),
                   tts_eos_token_id=_special("<tts_text_eod>"))


def write_checkpoint(directory: Path) -> Path:
    """Our seeded checkpoint: the speech tokenizer of write_checkpoint(seed=SEED), the talker of
    geometry() (seeded, i.i.d. heads), the real-size-style BPE. Pure numpy + safetensors + json."""
    from omni_export.recipes.qwen3_tts import checkpoint as ck
    from omni_export.recipes.qwen3_tts import demo

    directory = Path(directory)
    ck.write_checkpoint(directory, seed=SEED)
    marker = {ck.DEMO_MARKER: {"seed": SEED, "label": "text codes golden, random weights", "size": "tiny",
                               "kind": "custom_voice", "heads": "random"}}
    demo.write_talker(directory, geometry(), SEED + 1, marker)
    write_tokenizer_dir(directory)                   # no config: config.json stays the model's
    return directory


class _Decode:
    """Stands in for the speech tokenizer: generate_custom_voice decodes the codes at the end."""

    def decode(self, items):
        import numpy as np

        return [np.zeros(1, np.float32) for _ in items], 24000


def main() -> None:
    from make_goldens import stub_torchaudio
    from make_speaker_goldens import upstream_model

    stub_torchaudio()
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoProcessor

    from make_tokenizer_split_goldens import _split_of
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.processing_qwen3_tts import Qwen3TTSProcessor
    from qwen_tts.inference.qwen3_tts_model import Qwen3TTSModel

    meta = {"generated_by": "tools/golden/make_text_codes_goldens.py",
            "upstream": {"qwen-tts": "0.1.1", "torch": torch.__version__, "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__},
            "seed": SEED, "text_vocab_size": TEXT_VOCAB, "base_vocab": QWEN_BASE_VOCAB, "speaker": SPEAKER,
            "language": "Auto", "max_new_tokens": MAX_NEW_TOKENS,
            "call": "Qwen3TTSModel.generate_custom_voice(text, speaker, language='Auto', do_sample=False, "
                    "subtalker_dosample=False, max_new_tokens=MAX_NEW_TOKENS)"}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        ours = write_checkpoint(tmp / "ours")
        st = load_file(ours / "model.safetensors")
        saved = tmp / "upstream_saved"
        upstream_model(ours, st).save_pretrained(saved)
        for f in (*TOKENIZER_FILES, "generation_config.json"):
            shutil.copy(ours / f, saved / f)
        written = load_file(saved / "model.safetensors")
        assert set(written) == set(st), sorted(set(written) ^ set(st))
        meta["tensors_equal_ours"] = all(np.array_equal(written[k], st[k]) for k in st)
        try:
            model = upstream_model(saved, written)
            meta["upstream_config_json"] = "read back with upstream's Qwen3TTSConfig"
        except TypeError as e:
            model = upstream_model(ours, written)
            meta["upstream_config_json"] = f"upstream's Qwen3TTSConfig cannot read it back ({e}); built from ours"
        # as Qwen3TTSModel.from_pretrained does, on the upstream-written directory; where AutoProcessor
        # cannot read its config.json (see upstream_config_json), the class it would pick is asked directly
        # with the same arguments (the split rule reads config.json itself either way)
        AutoConfig.register("qwen3_tts", Qwen3TTSConfig)
        AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor)
        try:
            processor = AutoProcessor.from_pretrained(str(saved), fix_mistral_regex=True)
            meta["processor"] = "AutoProcessor.from_pretrained(dir, fix_mistral_regex=True)"
        except TypeError as e:
            processor = Qwen3TTSProcessor.from_pretrained(str(saved), fix_mistral_regex=True)
            meta["processor"] = (f"Qwen3TTSProcessor.from_pretrained(dir, fix_mistral_regex=True) (AutoProcessor "
                                 f"fails on the config.json: {e})")
        meta["split"] = _split_of(processor)
        assert meta["split"] == "mistral", meta["split"]
        model.speech_tokenizer = _Decode()
        tts = Qwen3TTSModel(model=model, processor=processor,
                            generate_defaults=json.loads((saved / "generation_config.json").read_text()))
        seen = []
        inner = model.generate

        def recording(**kw):
            codes, hidden = inner(**kw)
            seen.append((kw["input_ids"][0][0].tolist(), codes[0].numpy().astype(int).tolist()))
            return codes, hidden

        model.generate = recording
        texts = {}
        for key, text in TEXTS.items():
            with torch.no_grad():
                tts.generate_custom_voice(text, speaker=SPEAKER, language="Auto", do_sample=False,
                                          subtalker_dosample=False, max_new_tokens=MAX_NEW_TOKENS)
            ids, codes = seen.pop()
            texts[key] = {"text": text, "ids": ids, "codes": codes}
        (OUT / "text_codes_config.json").write_text((saved / "config.json").read_text())
    out = {**meta, "texts": texts}
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in texts.items())
    head = json.dumps(meta, indent=1, ensure_ascii=False)[:-2]
    (OUT / "text_codes.json").write_text(f"{head},\n \"texts\": {{\n{body}\n }}\n}}\n", encoding="utf-8")
    assert json.loads((OUT / "text_codes.json").read_text(encoding="utf-8")) == out
    frames = [len(v["codes"]) for v in texts.values()]
    print(f"wrote {OUT / 'text_codes.json'}: {len(texts)} texts, frames {min(frames)}-{max(frames)}, "
          f"split {meta['split']}, tensors equal ours: {meta['tensors_equal_ours']}", file=sys.stderr)


if __name__ == "__main__":
    main()

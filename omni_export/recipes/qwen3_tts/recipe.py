"""Qwen3-TTS 12 Hz: the recipe page. Data only; the loader (model.py) is imported when a run starts.

Symbols in shapes: Q codebooks (16), L left-context frames, N chunk frames, S samples per frame
(1920 at 24 kHz).
"""
from ...core import Component, Precision, Recipe, RecipeOption, TensorSpec

CODE2WAV = Component(
    name="code2wav",
    doc="speech tokenizer decoder (Code2Wav vocoder), one static streaming chunk: L frames of "
        "left context + N new frames; the host keeps the last N*S samples",
    inputs=(
        TensorSpec("codes", (1, "Q", "L+N"), "int32", "16 codebooks per frame, oldest frame first"),
        TensorSpec("frame_mask", (1, "L+N"), "float32",
                   "1 for real frames, 0 for padding (the first chunks have less than L frames of context)"),
    ),
    outputs=(TensorSpec("wav", (1, 1, "(L+N)*S"), "float32", "24 kHz waveform in [-1, 1]"),),
    gates_db={Precision.FP16: 40.0, Precision.W8A16: 30.0, Precision.W8A8: 30.0},
    requires=("speech_tokenizer",),
    audio_outputs={"wav": 24000},
)

RECIPE = Recipe(
    name="qwen3-tts",
    doc="Qwen3-TTS 12Hz (0.6B / 1.7B; CustomVoice, Base, VoiceDesign)",
    components=(CODE2WAV,),
    loader="omni_export.recipes.qwen3_tts.model:load",
    tiny="omni_export.recipes.qwen3_tts.checkpoint:write_checkpoint",
    options=(
        RecipeOption("chunk-frames", int, 12, "Code2Wav: new frames per streaming chunk (N); 12 frames = 0.96 s"),
        RecipeOption("left-context", int, 25, "Code2Wav: frames of left context per chunk (L; upstream uses 25)"),
        RecipeOption("calibration-codes", str, None,
                     "Code2Wav: .npy of real code sequences [frames, 16] (or a directory of them) "
                     "to calibrate on; default: the recipe's own (see the manifest's calibration source)"),
    ),
    version="1",
)

"""TinyVoc's page: one vocoder graph, codes in, waveform out. Data only (no torch)."""
from ...core import Component, Precision, Recipe, RecipeOption, TensorSpec as T

VOCODER = Component(
    name="vocoder",
    doc="codes [1, N] -> 16 kHz waveform [1, N*Hop]",
    inputs=(T("codes", (1, "N"), "int32", "codec codes"),),
    outputs=(T("wav", (1, "N*Hop"), "float32", "waveform in [-1, 1]"),),
    gates_db={Precision.FP16: 40.0},
    audio_outputs={"wav": 16000},
    role="vocoder",
)

RECIPE = Recipe(
    name="tinyvoc",
    doc="TinyVoc vocoder: codes to waveform (a test family)",
    components=(VOCODER,),
    loader="omni_export.recipes.tinyvoc.model:load",
    tiny="omni_export.recipes.tinyvoc.model:write_checkpoint",
    end_to_end="omni_export.recipes.tinyvoc.model:end_to_end",
    options=(RecipeOption("frames", int, 8, "vocoder: codes per call (N)", range=(1, 64)),),
)

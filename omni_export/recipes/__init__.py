"""Recipe registry: name -> the module holding its RECIPE page (imported on demand).

Adding a model family: a folder under recipes/ with a recipe.py defining RECIPE, and one line here.
"""
from __future__ import annotations

import importlib

from ..core import Recipe, UsageError

REGISTRY: dict[str, str] = {
    "qwen3-tts": "omni_export.recipes.qwen3_tts.recipe",
    "minicpm-o": "omni_export.recipes.minicpm_o.recipe",
    "spark": "omni_export.recipes.spark.recipe",
}


def get_recipe(name: str) -> Recipe:
    try:
        module = REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown recipe '{name}'; valid: {', '.join(REGISTRY)}") from None
    return importlib.import_module(module).RECIPE


def load_callable(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)

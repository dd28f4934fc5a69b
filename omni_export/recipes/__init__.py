"""Recipe registry: name -> the module holding its RECIPE page (imported on demand).

Adding a model family: a folder under recipes/ with a recipe.py defining RECIPE, and one line here.
"""
from __future__ import annotations

import importlib

from ..core import Recipe, RecipeModel, UsageError, check_model

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


def load_model(recipe: Recipe, checkpoint, options: dict, scratch) -> RecipeModel:
    """The recipe's loader on `checkpoint` (None: its demo checkpoint, written under `scratch`), checked
    against the RecipeModel interface."""
    model = load_callable(recipe.loader)(checkpoint, options, scratch)
    check_model(recipe.name, recipe.loader, model)
    return model


def load_callable(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def bundle_host(manifest: dict, out):
    """What the recipe of build OUT (`manifest`) adds to its ship bundle (artifacts.bundle.Bundle):
    its host loop's data when it declares a `bundle` hook, else a note saying what is not bundled yet."""
    from ..artifacts.bundle import Bundle

    recipe = get_recipe(manifest["recipe"]["name"])
    if recipe.bundle:
        return load_callable(recipe.bundle)(manifest, out)
    return Bundle(note=f"{recipe.name} bundles hold its graphs and their evidence; its host loop's data (tokenizer, "
                       f"KV layout, sampling) is not bundled yet")

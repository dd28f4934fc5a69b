"""Every registered recipe has a tiny seeded checkpoint, and its loader builds every component."""
import numpy as np
import pytest

from omni_export.recipes import REGISTRY, get_recipe, load_callable, load_model
from omni_export.targets import REWRITE_NAMES


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_recipe_has_tiny_fixture_and_every_component_builds(tmp_path, name):
    recipe = get_recipe(name)
    assert recipe.tiny, f"recipe {name} declares no tiny checkpoint writer"
    ckpt = load_callable(recipe.tiny)(tmp_path / "tiny")
    options = {o.name: o.default for o in recipe.options}
    model = load_model(recipe, ckpt, options, tmp_path)
    from omni_export.core import resolve_specs

    available = model.components()
    assert available
    for comp in (c for c in recipe.components if c.name in available):
        graph = model.graph(comp.name)
        sizes = model.sizes()
        assert [s.name for s in graph.inputs] == [s.name for s in resolve_specs(comp.inputs, sizes)]
        assert [s.name for s in graph.outputs] == [s.name for s in resolve_specs(comp.outputs, sizes)]
        held = model.samples(comp.name, "heldout").inputs
        calib = model.samples(comp.name, "calibration").inputs
        assert held and len(calib) >= 4
        from omni_export.trace import trace
        from omni_export.core import Samples

        t = trace(graph, Samples(calib, "c"), Samples(held, "h"))
        for out in t.reference:
            for spec in graph.outputs:
                assert out[spec.name].shape == spec.shape and np.isfinite(out[spec.name]).all()


def test_rewrite_names_listed_for_the_cli_are_the_real_ones():
    from omni_export.exporters.rewrites import REWRITES

    assert set(REWRITE_NAMES) == set(REWRITES)

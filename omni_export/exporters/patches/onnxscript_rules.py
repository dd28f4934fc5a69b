"""onnxscript's default rewrite rules without the multi-output ones (used by exporters/onnx.py export)."""
from __future__ import annotations

import contextlib

PINNED = {"onnxscript": "0.7.2"}
TARGETS = ("onnxscript.rewriter:_DEFAULT_REWRITE_RULES",)


@contextlib.contextmanager
def linear_rewrites():
    """The exporter's graph optimizer without its rewrite rules of more than one output node.

    onnxscript matches such a pattern (its one default: `SlicesSplit`, two Slices of one tensor's
    halves -> Split) by listing every node of the graph for every candidate node, so the rewrite pass
    grows with the square of the graph: exporting the 0.6B fused predictor frame (6012 FX nodes) took
    97.0 s with it and 24.3 s without (idle, single runs). The rule never fires on our graphs (its
    check wants an explicit end on the second Slice, which torch does not export): the demo's graphs
    export to the same bytes. Every other rule, the constant folding and the fusions run as before."""
    from onnxscript import rewriter

    saved = rewriter._DEFAULT_REWRITE_RULES
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in saved if _single_output(r))
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = saved


def _single_output(rule) -> bool:
    pattern = getattr(rule, "_target_pattern", None)
    return pattern is None or pattern.has_single_output_node

"""fp16 .pte numerics under fp16 accumulation, per component and per block, before / after the short sums.

    python benchmarks/fp16_sums.py --size 0.6b --components text_projection,predictor_decode,talker_decode
    python benchmarks/fp16_sums.py --size 0.6b --components code2wav --blocks decoder.0,decoder.1

Loads the recipe's model (random weights at the published shapes, written under --work), captures its
held-out inputs as a build does, and scores against the fp32 module:
  - the fp16 program an fp16 .pte is exported from, `before` (every product one sum, as up to 8a8dd9b)
    and `after` (exporters.executorch.fp16_program: short sums, omni_export/halfsums.py),
  - each run plainly (torch's fp16 products sum in fp32, as XNNPACK on this AVX2 host) and under
    exporters.fp16acc.Fp16Accumulation (fp16 sums, as XNNPACK on phones and AVX512-FP16 hosts),
  - whole graph (min over outputs and samples) and per block: each decoder layer / Code2Wav block fed
    the fp32 activations in front of it (--layers, --blocks), as `omni-export`'s attribution does.
Writes benchmarks/results/fp16sums-<size>-<time>-<sha>.json. Slow: the emulation runs one pass per
summed term (the 0.6B talker decode step ~1 min per sample on one idle core).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def long_sums():
    """The forms as they were before the short sums: every product one sum (SUM_TERMS unbounded)."""
    from omni_export import halfsums
    from omni_export.recipes.qwen3_tts import talker, xnnpack

    old = halfsums.SUM_TERMS, talker.SUM_TERMS, xnnpack.SUM_TERMS
    halfsums.SUM_TERMS = talker.SUM_TERMS = xnnpack.SUM_TERMS = 1 << 30
    try:
        yield
    finally:
        halfsums.SUM_TERMS, talker.SUM_TERMS, xnnpack.SUM_TERMS = old


def fp16_module(module):
    from omni_export.exporters.executorch import fp16_program

    variant = getattr(module, "executorch_variant", None)
    prog, _ = fp16_program(variant() if callable(variant) else module)
    return prog


def scores(ref_fn, prog, inputs: list[tuple], emulate: bool) -> float:
    """min SNR (dB) over float outputs and samples of prog against ref_fn."""
    import torch

    from omni_export.exporters.fp16acc import Fp16Accumulation
    from omni_export.parity.metrics import snr

    worst = float("inf")
    for args in inputs:
        with torch.no_grad():
            ref = ref_fn(*args)
            with Fp16Accumulation() if emulate else contextlib.nullcontext():
                out = prog(*args)
        ref = ref if isinstance(ref, tuple) else (ref,)
        out = out if isinstance(out, tuple) else (out,)
        for r, o in zip(ref, out):
            if r.is_floating_point():
                worst = min(worst, snr(r.float().numpy(), o.float().numpy()))
    return round(worst, 2)


def four(ref_fn, module, inputs, emulate_only=False) -> dict:
    row = {}
    for form in ("before", "after"):
        with long_sums() if form == "before" else contextlib.nullcontext():    # traced and run so
            prog = fp16_module(module)
            row[form] = {"fp16_sums": scores(ref_fn, prog, inputs, True)}
            if not emulate_only:
                row[form]["fp32_sums"] = scores(ref_fn, prog, inputs, False)
    return row


def layer_inputs(module, inputs: list[tuple], layers: list[int]) -> dict[int, list[tuple]]:
    """fp32 args of decoder layers `layers` of `module` over `inputs` (forward pre-hooks)."""
    import torch

    from omni_export.recipes.qwen3_tts.talker import Decoder

    dec = next(m for m in module.modules() if isinstance(m, Decoder))
    got = {i: [] for i in layers}
    def keep(i, args):                  # without the trailing Nones (no cache: a prefill)
        args = list(args)
        while args and args[-1] is None:
            args.pop()
        got[i].append(tuple(args))

    hooks = [dec.layers[i].register_forward_pre_hook(lambda m, a, i=i: keep(i, a))
             for i in layers if i < len(dec.layers)]
    with torch.no_grad():
        for args in inputs:
            module(*args)
    for h in hooks:
        h.remove()
    return {i: v for i, v in got.items() if v}, dec


def run(args) -> dict:
    import numpy as np
    import torch

    from omni_export.recipes.qwen3_tts import model as M
    from omni_export.recipes.qwen3_tts.checkpoint import write_real_shape
    from omni_export.recipes.qwen3_tts.talker import _XnnpackForms

    torch.set_num_threads(1)
    ck = Path(args.work) / f"random-{args.size}"
    if not (ck / "config.json").exists():
        write_real_shape(ck, args.size)
    model = M.load(ck, dict(args.option), Path(args.work) / "scratch")
    out = {}
    for comp in args.components:
        t0 = time.time()
        g = model.graph(comp)
        names = [s.name for s in g.inputs]
        if args.random_codes and comp.startswith("code2wav"):
            rng = np.random.default_rng(0)
            codes, mask = g.inputs
            samples = [{codes.name: rng.integers(0, 2048, codes.shape).astype(np.int32),
                        mask.name: np.ones(mask.shape, np.float32)} for _ in range(args.samples)]
        else:
            samples = model.samples(comp, "heldout").inputs[:args.samples]
        inputs = [tuple(torch.from_numpy(np.array(s[n])) for n in names) for s in samples]
        row = {"samples": len(inputs), "blocks": {}}
        if not args.no_graph:
            row["graph"] = four(g.module, g.module, inputs)
        if comp.startswith(("talker", "predictor")) and args.layers:
            got, dec = layer_inputs(g.module, inputs, args.layers)
            for i, ins in got.items():
                layer = dec.layers[i]

                class One(torch.nn.Module):
                    def __init__(self, inner):
                        super().__init__()
                        self.inner = inner

                    def forward(self, *a):
                        return self.inner(*a)

                    def executorch_variant(self):
                        return _XnnpackForms(self).eval()

                row["blocks"][f"layer {i}"] = four(layer, One(layer).eval(), ins, emulate_only=True)
                print(comp, f"layer {i}", row["blocks"][f"layer {i}"], flush=True)
        if comp.startswith("code2wav") and args.blocks:
            for s in inputs[:1]:
                for name, block, ins, outs in g.module.record(dict(zip(names, s))):
                    if name in args.blocks:
                        a = tuple(ins[n] for n in block.inputs)
                        if args.crop and getattr(block, "out", None) is None and hasattr(block, "keep"):
                            # the last --crop input samples (a window: per-sample figures, less time)
                            block.keep = min(block.keep or a[0].shape[-1], args.crop)
                            row["blocks_cropped_to"] = args.crop
                        row["blocks"][name] = four(block, block, [a], emulate_only=True)
                        print(comp, name, row["blocks"][name], flush=True)
        row["s"] = round(time.time() - t0, 1)
        out[comp] = row
        print(comp, row.get("graph"), f"{row['s']} s", flush=True)
    return out


def main(argv=None) -> int:
    from benchmarks.provenance import collect
    from benchmarks.run import write_result

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="0.6b", choices=("0.6b", "1.7b"))
    p.add_argument("--components", type=lambda s: s.split(","), required=True)
    p.add_argument("--samples", type=int, default=2, help="held-out samples per graph (default 2)")
    p.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="decoder layers to score alone (e.g. 0,13,27)")
    p.add_argument("--blocks", type=lambda s: s.split(","), default=[], help="Code2Wav blocks to score alone")
    p.add_argument("--random-codes", action="store_true",
                   help="Code2Wav fed seeded random codes (every frame real) instead of captured windows: "
                        "no talker generation, no talker weights read")
    p.add_argument("--option", action="append", default=[], type=lambda s: (s.split("=")[0], int(s.split("=")[1])),
                   help="integer recipe option NAME=VALUE (e.g. chunk-frames=1: a shorter Code2Wav chunk)")
    p.add_argument("--no-graph", action="store_true", help="blocks only (Code2Wav's whole chunk: long)")
    p.add_argument("--crop", type=int, default=None,
                   help="Code2Wav blocks with a time crop (upsample.*, decoder.1..): keep only the last N "
                        "input samples (the same window for fp32 and fp16)")
    p.add_argument("--work", default=str(ROOT / "benchmarks" / ".work"))
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args(argv)
    prov = collect(argv if argv is not None else sys.argv[1:], vars(args))
    data = {"schema": 1, "benchmark": "fp16sums", "size": args.size, "provenance": prov,
            "what": "min SNR dB vs fp32; before/after the short sums; fp16_sums = emulated fp16 accumulation "
                    "(phones, AVX512-FP16), fp32_sums = torch's own (this host's XNNPACK)",
            "components": run(args)}
    print(write_result(Path(args.results), "fp16sums", args.size, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

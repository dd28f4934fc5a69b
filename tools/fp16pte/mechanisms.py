"""Per mechanism: which fp16 products, summed in fp16, cost each 0.6B component its dB (docs/fp16-pte.md).

    python tools/fp16pte/mechanisms.py talker_decode none,all,linear,rms,attn 2

Writes a random-weights 0.6B checkpoint under /tmp/fp16pte/ckpt; scores the fp16 program as it was
exported before the short sums (run at 32490fd) with only the named products under
exporters.fp16acc's fp16 summation. At later commits the forms split their sums: patch
halfsums.SUM_TERMS and talker.SUM_TERMS as benchmarks/fp16_sums.long_sums does to see the old ones."""
import json, sys, time, resource
from pathlib import Path
import numpy as np, torch
from omni_export.recipes.qwen3_tts import model as M
from omni_export.recipes.qwen3_tts.checkpoint import write_real_shape
from omni_export.exporters.executorch import _CastIO, _copy, _fp16_safe
from omni_export.exporters import fp16acc
from omni_export.parity.metrics import snr

torch.set_num_threads(1)
ck = Path("/tmp/fp16pte/ckpt")
if not (ck / "config.json").exists():
    write_real_shape(ck, "0.6b")
comps = sys.argv[1].split(",")
cats = sys.argv[2].split(",") if len(sys.argv) > 2 else ["none", "all"]
nsamp = int(sys.argv[3]) if len(sys.argv) > 3 else 2
model = M.load(ck, {}, Path("/tmp/fp16pte/scratch"))

def category(func, args):
    if func is torch.ops.aten.convolution.default: return "conv"
    if func is torch.ops.aten.bmm.default: return "attn"
    b = args[1] if func is torch.ops.aten.mm.default else args[2]
    return "rms" if b.shape[-1] == 1 else "linear"

class Sel(fp16acc.Fp16Accumulation):
    def __init__(self, cats): super().__init__(); self.cats = cats
    def _emulated(self, func, args, kwargs):
        if func not in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default, torch.ops.aten.convolution.default):
            return None
        if "all" not in self.cats and category(func, args) not in self.cats: return None
        return fp16acc.Fp16Accumulation._emulated(func, args, kwargs)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self._emulated(func, args, kwargs)
        if out is None: return func(*args, **kwargs)
        self.count[func.__name__] = self.count.get(func.__name__, 0) + 1
        return out

res = {}
for comp in comps:
    g = model.graph(comp)
    samples = model.samples(comp, "heldout").inputs[:nsamp]
    mod = g.module
    var = getattr(mod, "executorch_variant", None)
    var = var() if callable(var) else mod
    names = [s.name for s in g.inputs]
    outn = [s.name for s in g.outputs]
    args0 = tuple(torch.from_numpy(np.array(samples[0][n])) for n in names)
    m16 = _CastIO(_copy(var, torch.float16), torch.float16).eval()
    with torch.no_grad():
        ep = _fp16_safe(torch.export.export(m16, args0)).module()
    for cat in cats:
        t = time.time(); worst = None; per = {}
        for s in samples:
            a = tuple(torch.from_numpy(np.array(s[n])) for n in names)
            with torch.no_grad():
                ref = mod(*a); ref = ref if isinstance(ref, tuple) else (ref,)
                if cat == "none":
                    out = ep(*a)
                else:
                    with Sel(cat.split("+")): out = ep(*a)
            out = out if isinstance(out, tuple) else (out,)
            for n, r, o in zip(outn, ref, out):
                if not r.is_floating_point(): continue
                d = snr(r.float().numpy(), o.float().numpy())
                per[n] = min(per.get(n, 1e9), d)
        worst = min(per, key=per.get)
        res[f"{comp}:{cat}"] = {"min_db": round(per[worst], 2), "output": worst, "s": round(time.time()-t, 1)}
        print(comp, cat, res[f"{comp}:{cat}"], "maxrss GiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/2**20, flush=True)
print(json.dumps(res))

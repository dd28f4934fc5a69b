import sys, json
from pathlib import Path
from omni_export.recipes.spark import checkpoint as ck
from omni_export.weights import TensorDecl
gain_res = float(sys.argv[2]); emb = float(sys.argv[3])
orig = ck.tensor_table
def table(c):
    t = orig(c)
    L = c.num_hidden_layers
    for k, d in list(t.items()):
        if k.endswith(("out_proj.weight", "down_proj.weight")):
            t[k] = TensorDecl(d.shape, ("normal", d.init[1] / 1.5 * gain_res))
        if k == "model.embedding.weight":
            t[k] = TensorDecl(d.shape, ("normal", emb))
    return t
ck.tensor_table = table
ck.write_checkpoint(Path(sys.argv[1]))
# greedy copy rate on the calibration prompts via fp32 eager graphs
from omni_export.recipes.spark import model as sm
from omni_export.recipes.qwen3_tts.graphs import EagerGraphs
m = sm.load(Path(sys.argv[1]), {"prefill-tokens": 16, "context-length": 96}, Path("/tmp/sp/scr"))
copies = tot = 0; distinct = set(); margins = []
for ids in m.prompt_ids("heldout", 24):
    g = m.generate(EagerGraphs(m), ids, 24, stop=False)
    toks = list(g.tokens) if hasattr(g, "tokens") else list(g)
    seq = ids + toks
    for a, b in zip(seq[len(ids)-1:-1], toks):
        copies += a == b; tot += 1
    distinct |= set(toks)
print(json.dumps({"copy_rate": copies / max(tot, 1), "distinct_generated": len(distinct), "tokens": tot}))
import numpy as np
mg = []
for ids in m.prompt_ids("heldout", 24)[:2]:
    g = m.generate(EagerGraphs(m), ids, 24, stop=False)
    for l in g.logits:
        s = np.sort(np.asarray(l))[::-1]; mg.append(float(s[0] - s[1]))
print("median top1 margin", np.median(mg), "min", np.min(mg))

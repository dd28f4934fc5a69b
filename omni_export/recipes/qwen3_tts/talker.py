"""Export-friendly talker and code-predictor graphs (Qwen3-style decoders with KV caches as I/O).

RoPE: upstream's talker uses interleaved MRoPE, but during TTS its three position rows are always
identical (built by expanding one row), and MRoPE only *selects* cos/sin values per row, so it is
exactly 1-D NeoX RoPE (theta from the config, position = token index); the code predictor uses
plain 1-D RoPE. The host computes cos/sin for the talker; the predictor's 17 positions are a
constant table inside its graphs.

Graphs (all static shapes; C = context slots, P = prefill tokens, V = 2048 predictor vocab):
  talker_prefill   embeds [1,P,Ht], cos/sin [1,P,hd], mask [1,1,P,C+P], past K/V [1,kv,C,hd] x layers
                   -> logits [1,P,3072], hidden [1,P,Ht] (post-norm), new K/V [1,kv,P,hd] x layers
  talker_decode    the same with P = 1
  talker_*_part1/2 a talker graph split in two halves (--talker-parts 2): part 1 takes the
                   embeddings and the first half's K/V and returns the residual stream [1,P,Ht];
                   part 2 takes it and the other K/V and returns logits and hidden
  predictor_prefill  past_hidden [1,1,Ht], code0 [1,1] -> logits [1,V], new K/V [1,kv,2,hd]
  predictor_decode   code [1,1], step [1] (1..14), past K/V [1,kv,17,hd] -> logits [1,V], new K/V [1,kv,1,hd]
  predictor_frame    past_hidden, code0, noise [1,Q-1,V] -> codes [1,Q-1], embedding [1,1,Ht],
                     margins [1,Q-1] (all Q-1 steps unrolled, top-k + Gumbel-max sampling inside;
                     noise = 0 is greedy; margins = gap between the two best scores of each step)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import attend
from ...halfsums import SUM_TERMS, linear as short_linear, spans
from ...modeling.rope import rope_table
from .config import DecoderGeometry, ModelConfig, talker_split
from .xnnpack import Forms, XnnpackForms, mean_last, silu

PREDICTOR_SLOTS = 17


# The recipe's XNNPACK forms (xnnpack.py), under the names this module's graphs and tests use.
_Xnnpack = Forms
_XnnpackForms = XnnpackForms


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    @property
    def mean_width(self) -> int:            # XnnpackForms' 1/n rows
        return self.weight.shape[0]

    def forward(self, x):
        return self.weight * (x / torch.sqrt(mean_last(x * x) + self.eps))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, g: DecoderGeometry):
        super().__init__()
        self.h, self.kv, self.hd = g.num_attention_heads, g.num_key_value_heads, g.head_dim
        self.q_proj = nn.Linear(g.hidden_size, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(g.hidden_size, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(g.hidden_size, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, g.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, g.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, g.rms_norm_eps)

    def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
        """x [1,P,H]; cos/sin [1,P,hd]; mask [1,1,P,K] additive over [past slots, new tokens]."""
        b, p, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, p, self.h, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).reshape(b, p, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).reshape(b, p, self.kv, self.hd).transpose(1, 2)
        if _Xnnpack.on:                     # a view, not unsqueeze_copy (which XNNPACK does not take)
            cos, sin = cos.reshape(b, 1, p, self.hd), sin.reshape(b, 1, p, self.hd)
        else:
            cos, sin = cos[:, None], sin[:, None]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = self._attend(q, k, v, mask, past_k, past_v)
        return self.o_proj(out.transpose(1, 2).reshape(b, p, self.h * self.hd)), k, v

    def _attend(self, q, k, v, mask, past_k, past_v):
        """The cache read in place (omni_export/attention.py); traced for XNNPACK, the products are
        3-D bmm."""
        return attend(q, k, v, mask, past_k, past_v, bmm=_Xnnpack.on)


class DecoderLayer(nn.Module):
    def __init__(self, g: DecoderGeometry):
        super().__init__()
        self.self_attn = Attention(g)
        self.input_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(g.hidden_size, g.rms_norm_eps)
        self.gate_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.up_proj = nn.Linear(g.hidden_size, g.intermediate_size, bias=False)
        self.down_proj = nn.Linear(g.intermediate_size, g.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, past_k=None, past_v=None):
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + a
        h = self.post_attention_layernorm(x)
        gate = self.gate_proj(h)
        # x * sigmoid(x) as such for XNNPACK: F.silu on fp16 decomposes to an fp32 one between casts
        act = silu(gate)
        return x + self.down_proj(act * self.up_proj(h)), k, v


class Decoder(nn.Module):
    """Layers + final norm; returns (post-norm hidden, new keys, new values). `layers` < all of
    them and `norm=False`: a slice of the stack (a split talker's half), returning the residual
    stream un-normed."""

    def __init__(self, g: DecoderGeometry, layers: int | None = None, norm: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(g) for _ in range(g.num_hidden_layers if layers is None else layers))
        self.norm = RMSNorm(g.hidden_size, g.rms_norm_eps) if norm else None

    def forward(self, x, cos, sin, mask, past=None):
        keys, vals = [], []
        for i, layer in enumerate(self.layers):
            pk, pv = (past[2 * i], past[2 * i + 1]) if past is not None else (None, None)
            x, k, v = layer(x, cos, sin, mask, pk, pv)
            keys.append(k)
            vals.append(v)
        return (self.norm(x) if self.norm is not None else x), keys, vals


def load_decoder(g: DecoderGeometry, tensors: dict, prefix: str, layers: range | None = None,
                 norm: bool = True) -> Decoder:
    """Official names: {prefix}layers.{i}.self_attn.*, .mlp.{gate,up,down}_proj, norms; {prefix}norm.
    Built on the meta device and assigned the loaded tensors: no copy, no random init, and graphs
    built from the same tensors (talker prefill and decode) share their weights in memory.
    `layers`: official layer numbers to load (default all); `norm`: load the final norm."""
    layers = range(g.num_hidden_layers) if layers is None else layers
    with torch.device("meta"):
        dec = Decoder(g, len(layers), norm)
    state = {}
    for name, _ in dec.named_parameters():
        official = name.replace("gate_proj", "mlp.gate_proj").replace("up_proj", "mlp.up_proj") \
                       .replace("down_proj", "mlp.down_proj")
        if official.startswith("layers."):
            j, rest = official[len("layers."):].split(".", 1)
            official = f"layers.{layers[int(j)]}.{rest}"
        state[name] = tensors[prefix + official]
    dec.load_state_dict(state, strict=True, assign=True)
    return dec


def _linear(tensors: dict, weight: str, bias: str | None = None) -> nn.Linear:
    w = tensors[weight]
    with torch.device("meta"):
        lin = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    lin.load_state_dict({"weight": w, **({"bias": tensors[bias]} if bias else {})}, assign=True)
    return lin


def _interleave(keys, vals):
    out = []
    for k, v in zip(keys, vals):
        out += [k, v]
    return out


# ------------------------------------------------------------------------------------------ talker

class TextProjection(nn.Module):
    """talker.text_projection: fc1 -> SiLU -> fc2 (both with bias), text width -> talker width."""

    def __init__(self, tensors: dict):
        super().__init__()
        p = "talker.text_projection."
        self.linear_fc1 = _linear(tensors, p + "linear_fc1.weight", p + "linear_fc1.bias")
        self.linear_fc2 = _linear(tensors, p + "linear_fc2.weight", p + "linear_fc2.bias")

    def executorch_variant(self) -> nn.Module:
        """SiLU as x * sigmoid(x) (xnnpack.py): F.silu on fp16 is an fp32 island between two casts
        XNNPACK does not take, 3 delegates for a two-layer graph."""
        return _XnnpackForms(self).eval()

    def forward(self, text_embeds):
        return self.linear_fc2(silu(self.linear_fc1(text_embeds)))


class TalkerStep(nn.Module):
    """talker_prefill (P tokens) and talker_decode (P = 1): one graph class, two static shapes."""

    def __init__(self, c: ModelConfig, tensors: dict):
        super().__init__()
        self.decoder = load_decoder(c.talker, tensors, "talker.model.")
        self.codec_head = _linear(tensors, "talker.codec_head.weight")

    def executorch_variant(self) -> nn.Module:
        return _XnnpackForms(self).eval()

    def forward(self, inputs_embeds, cos, sin, attn_mask, *past):
        hidden, keys, vals = self.decoder(inputs_embeds, cos, sin, attn_mask, past)
        return (self.codec_head(hidden), hidden, *_interleave(keys, vals))


class TalkerPart(nn.Module):
    """One half of a split talker step (--talker-parts 2): part 1 runs layers 0..s-1 on the input
    embeddings and returns the residual stream; part 2 runs layers s..L-1 on it, then the final
    norm and the codec head. Part 1 then part 2 computes exactly what TalkerStep computes."""

    def __init__(self, c: ModelConfig, tensors: dict, part: int):
        super().__init__()
        s, n = talker_split(c.talker.num_hidden_layers), c.talker.num_hidden_layers
        self.part = part
        self.decoder = load_decoder(c.talker, tensors, "talker.model.", range(0, s) if part == 1 else range(s, n),
                                    norm=part == 2)
        self.codec_head = _linear(tensors, "talker.codec_head.weight") if part == 2 else None

    def executorch_variant(self) -> nn.Module:
        return _XnnpackForms(self).eval()

    def forward(self, x, cos, sin, attn_mask, *past):
        hidden, keys, vals = self.decoder(x, cos, sin, attn_mask, past)
        if self.codec_head is None:
            return (hidden, *_interleave(keys, vals))
        return (self.codec_head(hidden), hidden, *_interleave(keys, vals))


# --------------------------------------------------------------------------------------- predictor

class PredictorCore(nn.Module):
    """Weights shared by the three predictor graphs: decoder, projection, tables, heads, RoPE."""

    def __init__(self, c: ModelConfig, tensors: dict):
        super().__init__()
        p, q = c.predictor, c.predictor.num_code_groups
        self.decoder = load_decoder(p, tensors, "talker.code_predictor.model.")
        self.proj = None
        if c.has_projection:
            m = "talker.code_predictor.small_to_mtp_projection."
            self.proj = _linear(tensors, m + "weight", m + "bias")
        # code0 is embedded with the talker's codec table; group g >= 1 with predictor table g - 1.
        self.register_buffer("talker_table", tensors["talker.model.codec_embedding.weight"].clone())
        # Predictor table j and head j are rows j*V .. (j+1)*V of a flat [(Q-1)*V, width] buffer,
        # and each is also a buffer of its own over the same memory (`table{j}`, `head{j}`). The
        # decode step picks its table and head by its step input: a Gather of rows of a 2-D table.
        # The prefill and the frame take fixed steps: each table and head is then a constant of its
        # own (a MatMul weight, a 2-D table). Stacked [Q-1, V, width] and sliced per step, they were
        # Gathers of a 3-D constant, which the QDQ graph keeps at 16 bits with one scale (and which
        # QNN 2.51's HTP simulator crashed on at 0.6B once it was 8-bit with a scale per row).
        v = p.vocab_size
        for name, key in (("table", "talker.code_predictor.model.codec_embedding.{}.weight"),
                          ("head", "talker.code_predictor.lm_head.{}.weight")):
            flat = torch.cat([tensors[key.format(j)] for j in range(q - 1)])
            self.register_buffer(name + "s", flat)
            for j in range(q - 1):
                self.register_buffer(f"{name}{j}", flat[j * v:(j + 1) * v])
        cos, sin = rope_table(PREDICTOR_SLOTS, p.head_dim, p.rope_theta)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        self.vocab, self.groups = p.vocab_size, q

    def project(self, x):
        return self.proj(x) if self.proj is not None else x

    def embed(self, group: int, code):
        """Unprojected embedding of `code` [1,1] (int) for code group `group` (static)."""
        table = self.talker_table if group == 0 else getattr(self, f"table{group - 1}")
        return F.embedding(code.long(), table)


def _head(hidden, head, gathered: bool = False):
    """hidden @ head^T; traced for an fp16 XNNPACK program, in short sums. A constant head is a linear
    (in ONNX a MatMul with its own 8-bit weight); a `gathered` one (the decode step's, rows of the flat
    heads) a MatMul with the gathered head transposed: as a linear it exports as a Gemm whose weight is
    a 16-bit activation, which QNN 2.51's HTP refuses (error 3110)."""
    if _Xnnpack.on and hidden.dtype == torch.float16 and hidden.shape[-1] > SUM_TERMS:
        return short_linear(hidden, head)
    return torch.matmul(hidden, head.T) if gathered else F.linear(hidden, head)


class PredictorPrefill(nn.Module):
    def __init__(self, core: PredictorCore):
        super().__init__()
        self.core = core

    def executorch_variant(self) -> nn.Module:
        return _XnnpackForms(self).eval()

    def forward(self, past_hidden, code0):
        c = self.core
        x = c.project(torch.cat([past_hidden, c.embed(0, code0)], dim=1))
        mask = torch.tensor([[0.0, -100.0], [0.0, 0.0]], dtype=x.dtype)[None, None]
        hidden, keys, vals = c.decoder(x, c.cos[None, :2], c.sin[None, :2], mask)
        return (_head(hidden[:, 1], c.head0), *_interleave(keys, vals))


# Rows of the decode step's head gathered at once. QNN 2.51's HTP simulator crashed (a segfault in its
# graph execution) gathering 2048 rows x 1024 columns of an 8-bit table with a scale per row (the
# 0.6B head; 3072-row tables too), and ran 1024 rows of a 30720-row table.
HEAD_ROWS = 1024


class PredictorDecode(nn.Module):
    """One predictor step s in 1..Q-2: code c_s at position s + 1, head s, table s - 1."""

    def __init__(self, core: PredictorCore):
        super().__init__()
        self.core = core
        self.register_buffer("slots", torch.arange(PREDICTOR_SLOTS, dtype=torch.int32))
        self.register_buffer("rows", torch.arange(core.vocab))

    def executorch_variant(self) -> nn.Module:
        return _XnnpackForms(self).eval()

    def forward(self, code, step, *past):
        c = self.core
        x = c.project(F.embedding(code.long() + (step.long() - 1) * c.vocab, c.tables))   # table step - 1
        pos = (step + 1).long()
        cos = torch.index_select(c.cos, 0, pos)[None]
        sin = torch.index_select(c.sin, 0, pos)[None]
        valid = (self.slots <= step).float()                        # past slots 0..step
        mask = torch.cat([(1.0 - valid) * -100.0, torch.zeros(1)]).to(x.dtype)[None, None, None]
        hidden, keys, vals = c.decoder(x, cos, sin, mask, past)
        first = step.long() * c.vocab                                                  # head step's rows
        logits = [_head(hidden[:, 0], torch.index_select(c.heads, 0, first + self.rows[a:b]), gathered=True)
                  for a, b in spans(c.vocab, HEAD_ROWS)]
        return (torch.cat(logits, dim=-1), *_interleave(keys, vals))


class PredictorFrame(nn.Module):
    """All Q-1 predictor steps of one frame in one graph, sampling inside.

    Sampling is Gumbel-max over the top-k logits: argmax(topk_mask(logits) + noise), with noise =
    temperature * Gumbel(0, 1) drawn by the host (zeros: greedy). That samples softmax(logits / T)
    restricted to the top k, as upstream's TopK -> Temperature -> multinomial does.
    """

    def __init__(self, core: PredictorCore, top_k: int = 50):
        super().__init__()
        self.core = core
        self.top_k = top_k
        self.register_buffer("rows", torch.arange(core.vocab), persistent=False)

    def executorch_variant(self) -> nn.Module:
        """The same function in ops XNNPACK delegates, so the whole frame lowers to one XNNPACK
        partition holding one copy of the weights (see `_XnnpackFrame`)."""
        return _XnnpackFrame(self).eval()

    def _pick(self, logits, noise):
        """(code, decision margin): the margin is the gap between the two best noisy scores.

        The margin is a maximum, then the maximum with the winner's slot masked, not a second
        top-k: the HTP runs TopK in float whatever its input (~3.3 M simulated cycles over 2048
        scores, plus ~1-9 M to dequantize them), a quantized ArgMax / ReduceMax in ~3-30 k. With
        the top-2 the sampling was 89 % of the demo frame's w8a16 cycles. Ties give 0, as top-2."""
        top = torch.topk(logits, self.top_k, dim=-1).values
        noisy = logits + noise
        # Outside the top k: below every noisy score (as host.pick), so sampling stays in the top k;
        # the floor stays within the scores' own range (a far floor would cost w8a16 its resolution).
        floor = noisy.min(dim=-1, keepdim=True).values - 1.0
        scores = torch.where(logits >= top[..., -1:], noisy, floor)
        code = torch.argmax(scores, dim=-1, keepdim=True)
        best = scores.max(dim=-1, keepdim=True).values
        second = torch.where(self.rows[None] == code, floor, scores).max(dim=-1, keepdim=True).values
        return code, best - second

    def forward(self, past_hidden, code0, noise):
        c = self.core
        x = c.project(torch.cat([past_hidden, c.embed(0, code0)], dim=1))
        keys, vals = None, None
        embs = [c.embed(0, code0)]
        codes, margins = [], []
        for s in range(c.groups - 1):
            n = x.shape[1] if s == 0 else 1
            pos0 = 0 if s == 0 else s + 1
            cos, sin = c.cos[None, pos0:pos0 + n], c.sin[None, pos0:pos0 + n]
            total = pos0 + n
            mask = torch.triu(torch.full((total, total), -100.0, dtype=x.dtype), diagonal=1)[None, None, pos0:total]
            past = None if keys is None else _interleave(keys, vals)
            hidden, k_new, v_new = c.decoder(x, cos, sin, mask, past)
            keys = k_new if keys is None else [torch.cat([a, b], 2) for a, b in zip(keys, k_new)]
            vals = v_new if vals is None else [torch.cat([a, b], 2) for a, b in zip(vals, v_new)]
            logits = F.linear(hidden[:, -1], getattr(c, f"head{s}"))
            code, margin = self._pick(logits, noise[:, s])
            codes.append(code)
            margins.append(margin)
            e = c.embed(s + 1, code)
            embs.append(e)
            x = c.project(e)
        # One reduction over the 16 rows, as upstream sums them.
        return (torch.cat(codes, dim=1).to(torch.int32), torch.cat(embs, dim=1).sum(dim=1, keepdim=True),
                torch.cat(margins, dim=1))


class _XnnpackFrame(_XnnpackForms):
    """`PredictorFrame` for ExecuTorch: with top-k, argmax and an embedding gather between the
    steps, XNNPACK delegates each step separately and ExecuTorch copies the shared decoder weights
    into every partition (21 GiB RssAnon at 0.6B before it was stopped). Here the selection uses
    only slices, maximum, clamp and linear:

      x >= t is clamp((x - t) * big + 1, 0, 1), exact for values further apart than 1 / big
      (1e-30 in fp32, 1e-4 in fp16); the k-th largest logit is found by multisection on the count
      of logits >= a threshold (SELECT_ROUNDS rounds of SELECT_WAYS thresholds: a 2^-48 fraction
      of the logits' range); the chosen code is a one-hot row whose index and embedding are
      matmuls with arange(V) and the table. The codes equal `PredictorFrame`'s except where two
      scores tie exactly (the one-hot then has two rows; argmax takes the first).
    The decoder is the same module; its RMS mean and grouped-query attention are traced in their
    XNNPACK forms (`_Xnnpack`)."""

    def __init__(self, frame: PredictorFrame):
        super().__init__(frame.core)
        c = frame.core
        self.top_k = frame.top_k
        self.register_buffer("ones", torch.ones(1, c.vocab))
        self.register_buffer("ones_w", torch.ones(1, SELECT_WAYS))
        self.register_buffer("index", torch.arange(c.vocab, dtype=torch.float32)[None])
        self.register_buffer("ways", torch.arange(SELECT_WAYS, dtype=torch.float32)[:, None])
        # per-step tables transposed, as constants of their own: a transpose in the graph makes a
        # computed weight, which XNNPACK's linear does not take (the heads are the core's `head{s}`)
        for s in range(c.groups - 1):
            self.register_buffer(f"table{s}", getattr(c, f"table{s}").T.contiguous())

    def _pick(self, logits, noise, table):
        dt = logits.dtype
        big = 1e30 if dt == torch.float32 else 1e4
        # constants in the logits' dtype without a cast op when it is already theirs (a cast makes
        # a linear's weight a computed tensor, which XNNPACK does not take)
        ones, ones_w, ways, index = (t if t.dtype == dt else t.to(dt)
                                     for t in (self.ones, self.ones_w, self.ways, self.index))

        def ge(x, t):
            return torch.clamp((x - t) * big + 1.0, 0.0, 1.0)

        both = _amax(torch.cat([logits, -logits], dim=0))          # [[max], [-min]]
        lo = -both[1:]
        if self.top_k < logits.shape[-1]:
            width = both[:1] + 1.0 - lo
            for _ in range(SELECT_ROUNDS):
                width = width * (1.0 / SELECT_WAYS)
                t = lo + ways * width                               # [W, 1] thresholds
                at_least_k = torch.clamp(F.linear(ge(logits, t), ones) - (self.top_k - 1.0), 0.0, 1.0)
                lo = lo + (F.linear(at_least_k.transpose(0, 1), ones_w) - 1.0) * width
            keep = ge(logits, lo)
        else:
            keep = torch.ones_like(logits)
        noisy = logits + noise
        lowest = -_amax(-noisy)
        scores = noisy * keep + (lowest - 1.0) * (1.0 - keep)      # as PredictorFrame._pick's floor
        best = _amax(scores)
        hot = ge(scores, best)
        second = _amax(scores - hot * big)
        return F.linear(hot, index), best - second, F.linear(hot, table).reshape(1, 1, -1)

    def run(self, past_hidden, code0, noise):
        c = self.inner
        total = c.embed(0, code0)
        x = c.project(torch.cat([past_hidden, total], dim=1))
        keys = vals = None
        codes, margins = [], []
        for s in range(c.groups - 1):
            n = x.shape[1] if s == 0 else 1
            pos0 = 0 if s == 0 else s + 1
            end = pos0 + n
            mask = torch.triu(torch.full((end, end), -100.0, dtype=x.dtype), diagonal=1)[None, None, pos0:end]
            past = None if keys is None else _interleave(keys, vals)
            hidden, k_new, v_new = c.decoder(x, c.cos[None, pos0:end], c.sin[None, pos0:end], mask, past)
            keys = k_new if keys is None else [torch.cat([a, b], 2) for a, b in zip(keys, k_new)]
            vals = v_new if vals is None else [torch.cat([a, b], 2) for a, b in zip(vals, v_new)]
            logits = F.linear(hidden[:, -1:], getattr(c, f"head{s}")).reshape(1, -1)
            code, margin, e = self._pick(logits, noise[:, s], getattr(self, f"table{s}"))
            codes.append(code)
            margins.append(margin)
            total = total + e
            x = c.project(e)
        return torch.round(torch.cat(codes, dim=1)).to(torch.int32), total, torch.cat(margins, dim=1)


SELECT_WAYS, SELECT_ROUNDS = 16, 12      # 16^12 = 2^48: the k-th-largest search's resolution


def _amax(x):
    """max over the last dim, kept: pairwise maximum of halves (XNNPACK has no max reduction)."""
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        m = torch.maximum(x[..., :h], x[..., h:2 * h])
        x = m if x.shape[-1] % 2 == 0 else torch.cat([m, x[..., 2 * h:]], dim=-1)
    return x

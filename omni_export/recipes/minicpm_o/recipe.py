"""MiniCPM-o 4.5 voice path, TTS head: the recipe page. Data only; the loader (model.py) is imported
when a run starts.

What this relies on (checked against OpenBMB's MiniCPM-o 4.5 modeling code: MiniCPMTTS in
modeling_minicpmo / its tts module, MiniCPMTTSConfig, and the condition building in
MiniCPMO.generate / streaming paths; corroborated by independent ports that load the official
checkpoint):
  config.json: model_type "minicpmo"; tts_config {llm_dim 4096, hidden_size 768, intermediate_size
    3072, num_attention_heads 12, num_key_value_heads 12, num_hidden_layers 20, num_audio_tokens
    6562 (the last is EOS), num_text_tokens 152064, num_vq 1, audio_bos_token_id 151687,
    text_eos_token_id 151692, projector_type "mlp", normalize_projected_hidden true,
    backbone_model "llama", condition_type "hidden_text_merge"}; RMS eps / RoPE theta are
    LlamaConfig's defaults (1e-6, 10000).
  tensors: tts.emb_text.weight [152064, 768]; tts.projector_semantic.linear{1,2}.{weight,bias}
    (llm_dim -> 768 -> 768, ReLU between: MultiModalProjector); tts.model.layers.N.{self_attn.
    {q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm}.weight,
    tts.model.norm.weight (LlamaModel); tts.emb_code.0.weight [6562, 768];
    tts.head_code.0.parametrizations.weight.original0 (g [6562, 1]) / original1 (v [6562, 768])
    (torch weight_norm, dim 0: folded here to W = g v / ||v||).
  condition: emb_text(ids) + normalize(projector_semantic(llm_hidden)) per LLM token, then
    emb_text(text_eos), emb_text(audio_bos); positions 0..L-1; the last logits give code 0; each
    step feeds emb_code[0](previous code).

token2wav (Step-Audio2 flow as MiniCPM-o ships it; read in PyPI stepaudio2-minicpmo 0.1.1 /
minicpmo-utils 1.0.7: cosyvoice2/flow/{flow,flow_matching,decoder_dit}.py,
cosyvoice2/transformer/upsample_encoder_v2.py, token2wav.py):
  assets: flow.pt (pickle; converted once to flow.safetensors, same state-dict names), flow.yaml
    (hyperpyyaml, never executed: geometry is read from tensor shapes), hift.pt, campplus.onnx,
    speech_tokenizer_v2_25hz.onnx.
  flow tensors: input_embedding.weight [6561, 512]; encoder.{embed,up_embed}.out.{0,1} (Linear,
    LayerNorm), encoder.pre_lookahead_layer.conv{1,2}, encoder.{encoders,up_encoders}.N.{self_attn.
    linear_{q,k,v,out,pos}, self_attn.pos_bias_{u,v}, feed_forward.w_{1,2}, norm_{mha,ff}},
    encoder.up_layer.conv, encoder.after_norm, encoder_proj [80, 512]; decoder.estimator.{t_embedder.
    mlp.{0,2}, in_proj, blocks.N.{attn.{to_q,to_k,to_v,q_norm,k_norm,proj}, mlp.fc{1,2}, conv.block.
    {1,3,6}, adaLN_modulation.1}, final_layer.{adaLN_modulation.1,linear}}.
  solver: 10 Euler steps, t = 1 - cos(pi/2 s), CFG rate 0.7 with (mu, spks, cond) zeroed for the
    unconditional half; mu = encoder_proj(encoder(tokens)), 2 mel frames per token (50 Hz).

Where gathers run: emb_text (152064 x 768, 233 MB in fp16) stays on the host; only the gathered rows
enter `tts_condition`. emb_code (6562 x 768) is gathered on the host too (one row per step).

Shape symbols: H TTS hidden, Hl LLM hidden, L layers, KV heads, HD head dim, V codes (6562), P tokens
per prefill / condition call, C KV cache slots; Mel mel bins (80), M mel frames per DiT call, N speech
tokens per flow-encoder window.

token2wav (token2wav.py, flow_encoder.py, dit.py, hift.py, vocoder.py): the flow encoder window, the DiT
estimator step and the HiFT vocoder (hift_f0: mel -> f0; hift: mel + host NSF source -> magnitude / phase;
the source's float64 phase integral and the iSTFT run on the host). Up samples per mel frame (480),
NFFT / Hop / Bins the iSTFT's (16 / 4 / 9).
"""
from ...core import Component, Precision, RealTime, Recipe, RecipeOption, TensorSpec as T

F32 = "float32"
_GATES = {Precision.FP16: 40.0, Precision.W8A16: 30.0, Precision.W8A8: 30.0}


def _kv(prefix: str, slots, doc: str) -> tuple[T, T]:
    return (T(f"{prefix}_key_{{i}}", (1, "KV", slots, "HD"), F32, doc, repeat="L"),
            T(f"{prefix}_value_{{i}}", (1, "KV", slots, "HD"), F32, doc, repeat="L"))


def _step(name: str, p, doc: str) -> Component:
    return Component(
        name=name, doc=doc,
        inputs=(T("inputs_embeds", (1, p, "H"), F32, "condition rows (prefill) or emb_code row of the last code"),
                T("cos", (1, p, "HD"), F32, "RoPE cos for these positions (host)"),
                T("sin", (1, p, "HD"), F32, "RoPE sin"),
                T("attn_mask", (1, 1, p, f"C+{p}"), F32, "additive mask over [cache slots, new tokens]"),
                *_kv("past", "C", "cache slot per position; slots >= position are masked")),
        outputs=(T("logits", (1, p, "V"), F32, "code logits (weight-normed head, folded)"),
                 *_kv("new", p, "the new tokens' K/V only; the host writes them to the cache")),
        gates_db=_GATES, logits=("logits",), requires=("tts",))


COMPONENTS = (
    Component(
        name="tts_condition",
        doc="LLM hidden + gathered emb_text rows -> TTS condition (MLP projector, L2-normalised)",
        inputs=(T("llm_hidden", (1, "P", "Hl"), F32, "the LLM's last hidden states for P spoken tokens"),
                T("text_embeds", (1, "P", "H"), F32, "tts.emb_text rows of the same tokens (host gather)")),
        outputs=(T("condition", (1, "P", "H"), F32),),
        gates_db=_GATES, requires=("tts",)),
    _step("tts_prefill", "P", "TTS Llama backbone + code head over P condition rows, C-slot KV cache"),
    _step("tts_decode", 1, "TTS Llama backbone + code head, one code per 40 ms (25 Hz), C-slot KV cache"),
    Component(
        name="flow_encoder_chunk",
        doc="token2wav flow encoder: N speech tokens (the last 3 lookahead) -> mu at 50 Hz (upsampling conformer)",
        inputs=(T("tokens", (1, "N"), "int32", "speech codes from the TTS head (padding: any code, masked)"),
                T("token_mask", (1, "N"), F32, "1 for real tokens, 0 for padding")),
        outputs=(T("mu", (1, "Mel", "2*N"), F32, "the flow-matching condition, 2 mel frames per token"),),
        gates_db=_GATES, requires=("token2wav",)),
    Component(
        name="dit_step",
        doc="token2wav flow matching: one DiT estimator call on the CFG pair over M mel frames (host: Euler loop, CFG mix)",
        inputs=(T("x", (1, "Mel", "M"), F32, "current sample (step 0: the noise, drawn by the host)"),
                T("mu", (1, "Mel", "M"), F32, "flow encoder output"),
                T("spks", (1, "Mel"), F32, "projected speaker embedding"),
                T("cond", (1, "Mel", "M"), F32, "prompt mel, zeros after the prompt"),
                T("mask", (1, 1, "M"), F32, "1 for real frames, 0 for padding"),
                T("t_freq", (1, 256), F32, "sinusoidal features of 1000 t (host, float64)")),
        outputs=(T("velocity", (2, "Mel", "M"), F32, "row 0 conditional, row 1 unconditional"),),
        gates_db=_GATES, requires=("token2wav",)),
    Component(
        name="hift_f0",
        doc="token2wav HiFT vocoder, F0 predictor: mel -> f0 per 50 Hz frame (the host integrates its phase in float64)",
        inputs=(T("mel", (1, "Mel", "M"), F32, "50 Hz log-mel (the flow's output)"),),
        outputs=(T("f0", (1, "M"), F32, "fundamental frequency in Hz (voiced above 10 Hz)"),),
        gates_db=_GATES, requires=("token2wav",),
        fp32_on_cpu="the host integrates f0 into the NSF harmonics' phase over the window, so fp16's "
                    "2^-11 rounding of f0 drifts the waveform's phase (five small convs at 50 Hz)", role="vocoder"),
    Component(
        name="hift",
        doc="token2wav HiFT vocoder: mel + NSF source -> iSTFT magnitude and phase (host: source, iSTFT in float64)",
        inputs=(T("mel", (1, "Mel", "M"), F32, "50 Hz log-mel (the flow's output)"),
                T("source", (1, 1, "M*Up+NFFT"), F32,
                  "NSF excitation at 24 kHz (host: float64 harmonic phase integral of hift_f0's f0, seeded "
                  "noise, l_linear + tanh), reflect-padded by NFFT/2 each side")),
        outputs=(T("magnitude", (1, "Bins", "M*Up//Hop+1"), F32, "iSTFT magnitude, exp(min(x, ln 100))"),
                 T("phase", (1, "Bins", "M*Up//Hop+1"), F32, "iSTFT phase, sin(x) as upstream")),
        gates_db=_GATES, requires=("token2wav",), role="vocoder"),
)

RECIPE = Recipe(
    name="minicpm-o",
    doc="MiniCPM-o 4.5 voice path: TTS head (condition, Llama prefill / decode) and token2wav's flow encoder, DiT step "
        "and HiFT vocoder",
    components=COMPONENTS,
    loader="omni_export.recipes.minicpm_o.model:load",
    tiny="omni_export.recipes.minicpm_o.checkpoint:write_checkpoint",
    end_to_end="omni_export.recipes.minicpm_o.e2e:run",
    synth="omni_export.recipes.minicpm_o.synth",
    bundle="omni_export.recipes.minicpm_o.bundle:host",
    options=(
        RecipeOption("prefill-tokens", int, 32, "tts_condition / tts_prefill: tokens per call (P)", range=(1, 4096)),
        RecipeOption("context-length", int, 1024, "TTS backbone: KV cache slots (C): condition + codes", range=(8, 32768)),
        RecipeOption("e2e-codes", int, 24,
                     "end-to-end parity: codes generated per held-out utterance through the built graphs "
                     "(0 skips end-to-end parity)", range=(0, 4096)),
        RecipeOption("calibration-hidden", str, None,
                     "real LLM hidden states to calibrate on: a directory of NAME.npy [tokens, llm_dim] "
                     "float arrays, each with NAME.ids.npy [tokens] (the spoken token ids); default: "
                     "seeded synthetic hidden states"),
        RecipeOption("flow-tokens", int, 100, "flow_encoder_chunk: speech tokens per window (N; 25 Hz, 100 = 4 s)", range=(1, 2000)),
        RecipeOption("mel-frames", int, 200, "dit_step, hift_f0, hift: mel frames per call (M; 50 Hz, so 200 = 4 s)", range=(1, 4000)),
        RecipeOption("flow-steps", int, 10, "token2wav: Euler steps of the flow-matching solver (upstream: 10)", range=(1, 100)),
        RecipeOption("token2wav", str, None,
                     "token2wav directory holding flow.safetensors and hift.safetensors (flow.pt / hift.pt "
                     "converted; pickles are never read); "
                     "default: CHECKPOINT/assets/token2wav"),
        RecipeOption("random-weights", bool, False,
                     "ignore --checkpoint; write a seeded checkpoint at MiniCPM-o 4.5's TTS shapes (measuring only)"),
    ),
    version="1",
    realtime=RealTime(
        unit="code", unit_ms=40.0, calls=(("tts_decode", "1"),),
        doc="per 40 ms of speech (one 25 Hz code): one tts_decode step", call_names={"tts_decode": "step"}),
)

"""Qwen3-TTS 12 Hz: the recipe page. Data only; the loader (model.py) is imported when a run starts.

Shape symbols: Ht talker hidden, Tw text-embedding width, Lt / KVt / HDt talker layers, KV heads,
head dim (Lt1 / Lt2: the layers of each half of a split talker, --talker-parts 2); Lp / KVp / HDp
the same for the code predictor; V predictor vocab (2048), Vt talker codec vocab (3072), Q code
groups (16); P prefill tokens, C context slots; L / N Code2Wav left-context and chunk frames, S
samples per frame (1920); F the speaker encoder's window: the most log-mel frames of a reference;
E the speech encoder's window in codec frames (12.5 Hz) and R = E * S its samples.

Where embedding gathers run, and why: the text embedding table (151936 x 2048, 0.6 GB in bf16) stays
on the host and only the gathered rows enter `text_projection`, so no NPU graph carries a table
it reads a few rows of per utterance. The talker's codec table (3072 x Ht) is small and lives both
on the host (prompt rows) and inside the predictor graphs (code0 and the 15 residual tables), so
`predictor_frame` returns the summed embedding the next talker step needs in the same call.
"""
from ...core import Component, LinkGroup, Precision, RealTime, Recipe, RecipeOption, RowSum, TensorSpec as T

F32, I32 = "float32", "int32"
_LM_GATES = {Precision.FP16: 40.0, Precision.W8A16: 30.0, Precision.W8A8: 30.0}


def _kv(prefix: str, heads: str, slots: str, hd: str, layers: str, doc: str, first: str | None = None) -> tuple[T, T]:
    return (T(f"{prefix}_key_{{i}}", (1, heads, slots, hd), F32, doc, repeat=layers, repeat_from=first),
            T(f"{prefix}_value_{{i}}", (1, heads, slots, hd), F32, doc, repeat=layers, repeat_from=first))


def _talker(name: str, p: str, doc: str, part: int = 0) -> Component:
    """The talker graph over P tokens (`part` 0), or one of its two halves (`part` 1: layers
    0..Lt1-1, embeddings in, residual stream out; `part` 2: layers Lt1..Lt-1, residual stream in,
    final norm and codec head). Each half's K/V keep their global layer numbers."""
    layers, first = {0: ("Lt", None), 1: ("Lt1", None), 2: ("Lt2", "Lt1")}[part]
    x_in = (T("residual", (1, p, "Ht"), F32, "residual stream after the first half's layers") if part == 2 else
            T("inputs_embeds", (1, p, "Ht"), F32, "summed input embeddings (host)"))
    head = ((T("residual", (1, p, "Ht"), F32, "residual stream after layer Lt1-1 (the second half's input)"),)
            if part == 1 else
            (T("logits", (1, p, "Vt"), F32, "codec logits"),
             T("hidden", (1, p, "Ht"), F32, "post-norm hidden state (the predictor's input)")))
    return Component(
        name=name, doc=doc,
        inputs=(x_in,
                T("cos", (1, p, "HDt"), F32, "RoPE cos for these positions (host)"),
                T("sin", (1, p, "HDt"), F32, "RoPE sin"),
                T("attn_mask", (1, 1, p, f"C+{p}"), F32, "additive mask over [cache slots, new tokens]"),
                *_kv("past", "KVt", "C", "HDt", layers, "cache slot per position; slots >= position are masked",
                     first)),
        outputs=(*head,
                 *_kv("new", "KVt", p, "HDt", layers, "the new tokens' K/V only; the host writes them to the cache",
                      first)),
        gates_db=_LM_GATES, logits=() if part == 1 else ("logits",), requires=("talker",))


# --chunk-schedule's default: the first chunk after 2 frames, then --chunk-frames (docs/streaming.md)
CHUNK_SCHEDULE = "2"


# A talker split in two (--talker-parts 2, the default when its fp16 weights pass model.TALKER_PART_BYTES):
# HTP contexts have a size limit (split big graphs), and compiling one 28-layer 1.7B talker context
# binary held 11.2 GiB in the compiler.
_HALF = {1: "first half of the talker's layers (embeddings in, residual stream out)",
         2: "second half of the talker's layers, final norm and codec head"}
TALKER_PARTS = tuple(f"talker_{k}_part{i}" for k in ("prefill", "decode") for i in (1, 2))


COMPONENTS = (
    Component(
        name="text_projection", doc="text MLP (fc1 -> SiLU -> fc2) over P gathered text-embedding rows",
        inputs=(T("text_embeds", (1, "P", "Tw"), F32, "rows of talker.model.text_embedding (host gather)"),),
        outputs=(T("projected", (1, "P", "Ht"), F32),),
        gates_db=_LM_GATES, requires=("talker",),
        version="2"),       # 2: the .pte's SiLU as x * sigmoid(x) (one XNNPACK delegate, was 3)
    _talker("talker_prefill", "P", "talker over P prompt tokens with a C-slot KV cache"),
    _talker("talker_decode", 1, "talker, one token per 80 ms frame, C-slot KV cache"),
    *(_talker(f"talker_prefill_part{i}", "P", f"talker_prefill, {_HALF[i]} (--talker-parts 2)", i) for i in (1, 2)),
    *(_talker(f"talker_decode_part{i}", 1, f"talker_decode, {_HALF[i]} (--talker-parts 2)", i) for i in (1, 2)),
    Component(
        name="predictor_prefill", doc="code predictor on [past_hidden, emb(code0)] -> logits of code 1",
        inputs=(T("past_hidden", (1, 1, "Ht"), F32), T("code0", (1, 1), I32)),
        outputs=(T("logits", (1, "V"), F32), *_kv("new", "KVp", 2, "HDp", "Lp", "K/V of positions 0, 1")),
        # 2: tables and heads as 2-D constants, per step or rows of a flat table (talker.PredictorCore)
        gates_db=_LM_GATES, logits=("logits",), requires=("predictor",), version="2"),
    Component(
        name="predictor_decode", doc="code predictor step s (1..14): code s -> logits of code s+1; 17-slot KV",
        inputs=(T("code", (1, 1), I32), T("step", (1,), I32, "s in 1..Q-2: selects table s-1 and head s"),
                *_kv("past", "KVp", 17, "HDp", "Lp", "slots 0..s hold positions 0..s")),
        outputs=(T("logits", (1, "V"), F32), *_kv("new", "KVp", 1, "HDp", "Lp", "K/V of position s+1")),
        # 2: tables and heads as 2-D constants, per step or rows of a flat table (talker.PredictorCore)
        gates_db=_LM_GATES, logits=("logits",), requires=("predictor",), version="2"),
    Component(
        name="predictor_frame",
        doc="fused frame: all 15 predictor steps, top-k + Gumbel-max sampling inside, summed embedding out",
        inputs=(T("past_hidden", (1, 1, "Ht"), F32), T("code0", (1, 1), I32),
                T("noise", (1, "Q-1", "V"), F32, "temperature * Gumbel noise per step (zeros: greedy)")),
        outputs=(T("codes", (1, "Q-1"), I32, "codes 1..15"),
                 T("embedding", (1, 1, "Ht"), F32, "sum of the 16 codebook embeddings: the next talker input"),
                 T("margins", (1, "Q-1"), F32, "gap between the two best scores at each step")),
        # Codes are discrete: gated on agreement with fp32. A flip where fp32's two best codes were
        # a near tie (margin < 0.05) is not a defect (the frame's later steps then follow another,
        # equally likely, code), so agreement counts frames up to a decided flip; see metrics.py.
        # The embedding is the next talker input: gated in dB against the codebook sum of the build's
        # own codes (the checkpoint's tables, as the host sums them for the step graphs) and against
        # fp32's up to the first code that differs (a frame that went another way legitimately).
        gates_db=_LM_GATES, gated_outputs=("codes", "embedding", "embedding_own_codes"), agreement_min=0.99,
        tie_margins={"codes": "margins"},
        row_sums={"embedding": RowSum(("code0", "codes"), own="embedding_own_codes", words=("codebook", "code"))},
        # At real sizes (past 256 MB) the simulator scores 4 held-out frames, where ORT CPU scored
        # worst (2 for other graphs): nothing else runs the frame on the HTP there. 0.6B at b0be2a1e:
        # 39.3 s (fp16) and 188.3 s (w8a16) per sample on the simulator, so 4 double the frame's 457.6 s.
        sim_samples=4,
        requires=("predictor",), version="3",                 # 2: as the step graphs'
        # 3: the margin as a maximum with the winner masked, not a second TopK (float on the HTP)
        # synth checks these (host.frame_cannot_honour) and runs the step graphs instead
        limits={"subtalker_top_k": "traced with top-k 50 (host.FRAME_TOP_K); another top-k needs the step graphs",
                "subtalker_top_p": "no top-p inside the graph; subtalker_top_p < 1 needs the step graphs"},
        # The .pte is traced from an equivalent form (talker._XnnpackFrame: selection in slices,
        # maximum, clamp and linear) that XNNPACK takes whole, so the program is one partition with
        # one copy of the weights; ExecuTorch's Python passes over its ~7500 nodes still take ~6 min
        # at the tiny size, so it is opt-in.
        opt_in_formats={"pte": "one XNNPACK partition of ~7500 nodes (15 unrolled steps): ExecuTorch's "
                               "lowering takes ~6 min even at the tiny size; the step graphs have .pte "
                               "builds"}),
    Component(
        name="code2wav",
        doc="speech tokenizer decoder (Code2Wav vocoder), one static streaming chunk: L frames of "
            "left context + N new frames in, the N new frames' samples out (the conv decoder crops its time axis "
            "to what reaches them: exact)",
        inputs=(T("codes", (1, "Q", "L+N"), I32, "16 codebooks per frame, oldest frame first"),
                T("frame_mask", (1, "L+N"), F32,
                  "1 for real frames, 0 for padding (the first chunks have less than L frames of context)")),
        outputs=(T("wav", (1, 1, "N*S"), F32, "24 kHz waveform in [-1, 1] of the N new frames"),),
        gates_db=_LM_GATES, requires=("speech_tokenizer",), audio_outputs={"wav": 24000},
        # Where XNNPACK sums fp16 products in fp16 (phones' CPUs) the chunk's many products compound
        limits={"fp16 .pte on CPUs that sum fp16 products in fp16 (phones)":
                "36.9 dB at 0.6B on such a CPU's runtime (37.1 emulated) with sums of <= 128 terms (25.6 dB before), "
                "under the 40 dB gate: no single block (each >= 51.4 dB alone), the chain of 10 blocks compounds; "
                "run Code2Wav on the GPU or at fp32 on the CPU (docs/fp16-pte.md)"},
        # --chunk-schedule: one more graph per chunk size other than N (code2wav_n1: N = 1), scored alone
        variants="N", role="vocoder",
        version="2"),       # 2: the .pte traced in XNNPACK forms (one delegate); the graph's class is Code2Wav
    Component(
        name="speaker_encoder",
        doc="ECAPA-TDNN x-vector of a reference of L log-mel frames, L up to F (Base checkpoints): reflect pads "
            "around frame L-1, means, deviations and the attention softmax over the L frames, as upstream over L",
        inputs=(T("mel", (1, "F", 128), F32, "log-mel, 24 kHz, hop 256 (host); frames L.. are zeros, never read"),
                T("length", (1,), I32, "L, the reference's frames: from the largest reflect pad + 1 to F")),
        outputs=(T("embedding", (1, "Ht"), F32),),
        gates_db=_LM_GATES, requires=("speaker_encoder",), version="2"),
    Component(
        name="speech_encoder",
        doc="12 Hz speech tokenizer's encoder (Base checkpoints; in-context cloning): a reference of up to E "
            "codec frames, zero-padded to R samples, and its length -> upstream's codes of the reference",
        inputs=(T("wav", (1, "R"), F32, "24 kHz reference (host); samples past its length are zeros"),
                T("length", (1,), I32, "the reference's samples, 1 to R")),
        outputs=(T("codes", (1, "E", "Q"), I32, "16 codes per frame; frames from ceil(length / S) on are padding"),
                 T("margins", (1, "E", "Q"), F32, "gap between the two nearest codewords' distances at each "
                                                  "residual level")),
        # Codes are discrete: gated on agreement with fp32, frame by frame over the residual levels
        # (each level quantizes what the previous left); a flip where fp32's two nearest codewords were
        # within TIE_MARGIN of each other is excused, as the predictor frame's (metrics.tie_aware).
        gates_db=_LM_GATES, gated_outputs=("codes",), agreement_min=0.99, tie_margins={"codes": "margins"},
        requires=("speech_encoder",)),
)

RECIPE = Recipe(
    name="qwen3-tts",
    doc="Qwen3-TTS 12Hz (0.6B / 1.7B; CustomVoice, Base, VoiceDesign)",
    components=COMPONENTS,
    loader="omni_export.recipes.qwen3_tts.model:load",
    tiny="omni_export.recipes.qwen3_tts.checkpoint:write_checkpoint",
    end_to_end="omni_export.recipes.qwen3_tts.e2e:run",
    end_to_end_merge="omni_export.recipes.qwen3_tts.e2e:merge",
    synth="omni_export.recipes.qwen3_tts.synth",
    bundle="omni_export.recipes.qwen3_tts.bundle:host",
    # prefill and decode graphs of the same weights: one context binary each on AI Hub (link jobs)
    links=(LinkGroup("talker", ("talker_prefill", "talker_decode"), "the talker's prefill and per-frame step"),
           *(LinkGroup(f"talker_part{i}", (f"talker_prefill_part{i}", f"talker_decode_part{i}"),
                       f"the talker's prefill and step, {_HALF[i].split(' (')[0]}") for i in (1, 2)),
           LinkGroup("predictor", ("predictor_prefill", "predictor_decode"), "the code predictor's prefill and step")),
    demo_keys=("variant",),
    random_weights_keys=("size", "variant"),
    options=(
        RecipeOption("prefill-tokens", int, 32, "talker_prefill: tokens per prefill call (P)", range=(1, 4096)),
        RecipeOption("context-length", int, 1024, "talker: KV cache slots (C): prompt + frames", range=(8, 32768)),
        RecipeOption("talker-parts", int, None,
                     "talker graphs per call: 1 (one graph of all layers) or 2 (two halves, the residual "
                     "stream passed between them: HTP contexts have a size limit, and compiling a context binary "
                     "needs memory in proportion to its weights); default: 2 when the talker's fp16 "
                     "weights pass 2 GiB (1.7B), else 1", affects=("talker_prefill", "talker_decode", *TALKER_PARTS), range=(1, 2)),
        RecipeOption("chunk-frames", int, 12, "Code2Wav: new frames per streaming chunk (N); 12 frames = 0.96 s",
                     affects=("code2wav",), range=(1, 250)),
        RecipeOption("chunk-schedule", str, CHUNK_SCHEDULE,
                     "Code2Wav: new frames of the stream's first chunks, in order (e.g. 1,2,4,8,16); after them every "
                     "chunk has --chunk-frames (sizes above it are capped at it). Each other size is one more Code2Wav "
                     "graph, code2wav_n<size>, built and gated like code2wav; 'none': every chunk has --chunk-frames "
                     "(the first audio then waits for --chunk-frames frames). docs/streaming.md",
                     affects=()),
        RecipeOption("left-context", int, 25, "Code2Wav: frames of left context per chunk (L; upstream uses 25). "
                     "Only the transformer sees all L + N frames: the conv decoder after it is cropped to the "
                     "N new frames plus its ~10-frame reach, so L costs little",
                     affects=("code2wav",), range=(0, 250)),
        RecipeOption("speaker-frames", int, 938,
                     "speaker encoder: maximum log-mel frames of a reference (F; 938 = 10 s at hop 256). The graph "
                     "takes a zero-padded window of F frames and the valid length, and gives upstream's x-vector "
                     "of any reference from its largest reflect pad + 1 frames (5 at upstream's geometry) to F; a longer "
                     "one is an error, never cropped",
                     range=(16, 6000)),
        RecipeOption("encoder-frames", int, 125,
                     "speech encoder (in-context cloning, Base): maximum 12.5 Hz codec frames of a reference (E; "
                     "125 = 10 s). The graph takes a zero-padded window of E x 1920 samples and the valid length and "
                     "gives upstream's codes of any reference up to it; a longer one is an error, never cropped",
                     affects=("speech_encoder",), range=(1, 750)),
        RecipeOption("speaker-calibration", str, None,
                     "Base: a directory of real speech WAVs (PCM, any rate: resampled to 24 kHz) that the calibration "
                     "prompts clone (the first 18 in name order): the speaker encoder, the speech encoder and the talker "
                     "are calibrated on them instead of synthetic voices; each is cut to the encoders' windows. The "
                     "held-out references stay synthetic", affects=None),
        RecipeOption("e2e-frames", int, 12,
                     "end-to-end parity: frames synthesised per held-out prompt through the built graphs "
                     "(every frame runs each graph on its runner; 0 skips end-to-end parity)", affects=(), range=(0, 2048)),
        RecipeOption("calibration-frames", int, None,
                     "frames generated per calibration prompt (18 prompts) and per held-out prompt; default "
                     "24 / 24 on small checkpoints, 4 / 12 at real sizes (hidden >= 512: eager fp32 frames are slow "
                     "there, and 16 calls per graph are kept either way)", affects=None, range=(1, 512)),
        RecipeOption("calibration-codes", str, None,
                     "Code2Wav: .npy of real code sequences [frames, 16] (or a directory of them) to "
                     "calibrate on instead of the codes the recipe generates from its prompt set", affects=("code2wav",)),
        RecipeOption("random-weights", bool, False,
                     "ignore --checkpoint; write a seeded checkpoint at the real shapes of --size (measuring only)"),
        RecipeOption("size", str, "0.6b", "with --random-weights: 0.6b or 1.7b"),
        RecipeOption("variant", str, "custom_voice",
                     "with --random-weights or the demo: custom_voice, base or voice_design"),
    ),
    # 4: Base captures use references of varied length (the speaker encoder's window); 5: half of the
    # Base calibration prompts and one held-out prompt clone in context (the speech encoder's inputs)
    version="5",
    # One 80 ms frame of audio (12.5 Hz codes): one talker step, one predictor frame (codes 1..15),
    # and 1/N of a Code2Wav chunk of N frames.
    realtime=RealTime(
        unit="frame", unit_ms=80.0,
        calls=(("talker_decode", "1"), ("predictor_frame", "1"), ("code2wav", "1/chunk_frames")),
        alternatives={"predictor_frame": (("predictor_prefill", "1"), ("predictor_decode", "14")),
                      "talker_decode": (("talker_decode_part1", "1"), ("talker_decode_part2", "1")),
                      "talker_prefill": (("talker_prefill_part1", "1"), ("talker_prefill_part2", "1"))},
        doc="per 80 ms frame: one talker_decode, one predictor_frame (or its prefill + 14 steps); "
            "Code2Wav once per chunk of N frames",
        call_names={"code2wav": "chunk", "talker_decode": "step", "talker_decode_part1": "step",
                    "talker_decode_part2": "step", "predictor_frame": "frame",
                    "predictor_prefill": "prefill", "predictor_decode": "step", "text_projection": "call",
                    "talker_prefill": "prefill"},
        # before the first audio: the prompt (text projection, talker prefill), then the frames of the
        # first chunk of --chunk-schedule (host.generate: the prefill gives frame 1's code 0, each later
        # frame one talker step) and that chunk's Code2Wav graph
        prompt=(("text_projection", "1"), ("talker_prefill", "1")),
        first_audio="omni_export.recipes.qwen3_tts.latency:first_audio"),
)

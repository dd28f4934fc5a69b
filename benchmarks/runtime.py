"""Runtime benchmark (runs in the worker process run.py starts): exported fp32 graphs on the local
runners (ONNX Runtime CPU, ExecuTorch XNNPACK) against torch eager on the same inputs.

Everything comes from the project's own code: the loader writes the checkpoint (the demo, or
random weights at real shapes), the host generation loop captures real graph inputs from a greedy
fp32 run of a held-out prompt, `Qwen3TTS.graph` gives each component's module, `trace` and
`Lowering.build` export it exactly as a build does, `open_runner` loads it, and the predictor
arms are `host.predictor_frame` itself (prefill + 14 step calls, or one fused call).
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import timing as tm
from .timing import Arm

CASES = ("talker", "predictor", "code2wav")
RUNNERS = (("ort", "onnx", "ort-cpu fp32 (ONNX)"), ("pte", "pte", "executorch fp32 (.pte, XNNPACK)"))
LABEL = {k: label for k, _, label in RUNNERS}
EAGER = "torch eager fp32"
FUSED_MIN_SPEEDUP, FUSED_VS_EAGER_MIN, FLOOR_MAX = 1.5, 2.0, 1.25      # the budgets


class Log:
    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", file=sys.stderr, flush=True)


log = Log()


# ------------------------------------------------------------------------------------ threads

def fix_threads(n: int) -> dict:
    """One thread count for every runtime; each knob is read back (rule 3: is it connected?)."""
    import torch
    from executorch.extension.pybindings import portable_lib as et

    torch.set_num_threads(n)
    et._unsafe_reset_threadpool(n)
    return {"requested": n, "torch": torch.get_num_threads(), "executorch_xnnpack": et._threadpool_get_thread_count(),
            "onnxruntime_intra_op": n, "onnxruntime_inter_op": 1, "read_bandwidth_workers": n}


# ------------------------------------------------------------------------------ model and inputs

def load_model(size: str, work: Path, overrides: dict):
    """The demo checkpoint (tiny) or random weights at real shapes, through the recipe's loader."""
    from omni_export.recipes.qwen3_tts import model as q
    from omni_export.recipes.qwen3_tts.recipe import RECIPE

    options = {o.name: o.default for o in RECIPE.options}
    options["talker-parts"] = 1        # the talker step is timed whole, against its bandwidth floor
    options.update(overrides)
    if size != "tiny":
        options.update({"random-weights": True, "size": size})
    return q.load(None, options, work), options


def capture_inputs(model, frames: int):
    """Greedy fp32 generation of the first held-out prompt through the step predictor graphs,
    recording every graph call: the real inputs each arm is timed on."""
    from omni_export.runtime.graphs import Capture, EagerGraphs

    eager = EagerGraphs(model)
    cap = Capture(eager)
    req = model.requests("heldout")[0]
    model.synthesize(cap, req, model.gen_options(greedy=True, predictor="step", max_frames=frames),
                     with_audio=False)
    return eager, cap.calls


def code2wav_inputs(model, count: int) -> list[dict]:
    """Full-context streaming windows over seeded synthetic codes (host.windows, as the build does)."""
    from omni_export.recipes.qwen3_tts import host

    c = model.speech.config
    codes = host.synthetic_codes(model.left + model.chunk * (count + 1), c.num_quantizers, c.codebook_size, seed=7)
    wins = [w.inputs() for w in host.windows(codes, model.left, model.chunk, c.samples_per_frame)]
    full = [w for w in wins if w["frame_mask"].all()]
    return (full or wins)[-count:]


# ------------------------------------------------------------------------------------- exports

class Exported:
    """One component traced once and lowered to fp32 ONNX and .pte by the pipeline's Lowering."""

    def __init__(self, eager, name: str, samples: list[dict], target, work: Path, threads: int):
        from omni_export.core import Samples
        from omni_export.exporters.lower import Lowering
        from omni_export.trace import trace

        self.name, self.threads, self.work = name, threads, work / name
        self.graph = eager.graph(name)
        self.traced = trace(self.graph, None, Samples(samples, "benchmark capture"))
        self.lowering = Lowering(self.traced, target, self.work / "lowering", rewrites=target.rewrites)
        self.target = target
        self.files: dict[str, dict] = {}
        self.runners: dict = {}
        self.errors: dict[str, dict] = {}

    def open(self, kind: str, fmt_name: str) -> None:
        """Lower and load one format; a failure is recorded under its runner kind, never raised."""
        from omni_export.core import BuildSpec, Format, Precision
        from omni_export.runtime.runners import open_runner
        from omni_export.recipes.qwen3_tts.recipe import RECIPE

        fmt = Format.parse(fmt_name)
        spec = BuildSpec(RECIPE.name, self.name, fmt, Precision.FP32, self.target.name)
        t0 = time.monotonic()
        try:
            log(f"{self.name}: export {fmt_name} fp32")
            (self.work / "staging").mkdir(parents=True, exist_ok=True)
            built = self.lowering.build(spec, self.work / "staging")
            t1 = time.monotonic()
            runner = open_runner(built.runner, threads=self.threads)
            self.runners[kind] = runner
            self.files[kind] = {"files": [{"name": f.name, "bytes": f.stat().st_size} for f in built.files],
                                "export_s": round(t1 - t0, 2), "load_s": round(time.monotonic() - t1, 2),
                                "runner": built.runner.to_json()}
            if kind == "ort":
                so = runner.session.get_session_options()
                self.files[kind]["session_threads"] = {"intra_op": so.intra_op_num_threads,
                                                       "inter_op": so.inter_op_num_threads}
        except Exception as e:
            self.errors[kind] = _error(e)
            log(f"{self.name}: {fmt_name} failed: {type(e).__name__}: {e}")

    def close(self) -> None:
        for r in self.runners.values():
            r.close()
        self.runners = {}
        self.lowering = self.traced = None
        shutil.rmtree(self.work, ignore_errors=True)
        gc.collect()


def open_all(eager, names_samples: dict, target, work: Path, cfg: dict) -> dict[str, Exported]:
    out = {}
    for name, samples in names_samples.items():
        ex = Exported(eager, name, samples, target, work, cfg["threads"])
        for kind, fmt, _ in RUNNERS:
            if f"{name}:{kind}" in cfg.get("skip", ()):
                ex.errors[kind] = {"error": f"skipped: --skip {name}:{kind}"}
            elif kind in cfg["runners"]:
                ex.open(kind, fmt)
        out[name] = ex
    return out


def graph_arms(ex: Exported, samples: list[dict], eager, cfg: dict) -> dict[str, Arm]:
    """One arm per selected runner and one for torch eager, each calling the graph on sample i."""
    arms = {}
    for kind in cfg["runners"]:
        arms[kind] = (Arm(LABEL[kind], lambda i, r=ex.runners[kind]: r.run(samples[i])) if kind in ex.runners
                      else _unavailable(LABEL[kind], ex.errors.get(kind)))
    arms["eager"] = Arm(EAGER, lambda i: eager(ex.name, samples[i]))
    return arms


def runner_ratios(arms: dict[str, Arm]) -> list[dict]:
    out = [tm.ratio(f"eager / {arms[k].name}", arms["eager"], arms[k], "how many times faster than torch eager")
           for k in arms if k != "eager"]
    if "ort" in arms and "pte" in arms:
        out.append(tm.ratio("pte / ort", arms["pte"], arms["ort"], "how many times faster ONNX Runtime is than .pte"))
    return out


class RunnerGraphs:
    """The host's GraphSet protocol (name, inputs) -> outputs over one runner kind's sessions."""

    def __init__(self, exported: dict[str, Exported], kind: str):
        self.exported, self.kind = exported, kind

    def available(self, names: tuple[str, ...]) -> bool:
        return all(self.kind in self.exported[n].runners for n in names)

    def __call__(self, name: str, inputs: dict) -> dict:
        return self.exported[name].runners[self.kind].run(inputs)


def _error(e: BaseException) -> dict:
    return {"error": f"{type(e).__name__}: {e}"[:500], "traceback_tail": traceback.format_exc()[-2000:]}


def _unavailable(name: str, errors: dict) -> Arm:
    """An arm whose graph could not be built: it stays in the result, with the reason."""
    def fail(i):
        raise RuntimeError(f"not built: {errors}")
    return Arm(name, fail)


# ---------------------------------------------------------------------------------- bandwidth

def bandwidth_arms(mib: int, workers: int) -> tuple[list[Arm], dict]:
    """Memory read rate, two ways, each over `mib` MiB of fp32 read once per call (GB/s, higher is
    better): `torch.mv` over a [rows, 4096] matrix -- the talker step's own access pattern, weights
    streamed through a matrix-vector product -- at torch's thread count, and numpy's max over an
    array split across `workers` threads (numpy releases the GIL in reductions). The floor of a pass
    uses the faster of the two. numpy's float32 *sum*, used before, is compute-bound (pairwise
    summation): 6.3 GB/s on one thread of this host, against 12-13 GB/s for np.max, torch.sum or a
    GEMV, which made the floor twice too slow and the step-over-floor ratios look twice too good."""
    import torch

    cols = 4096
    w = torch.ones(max(1, mib * 2**20 // 4 // cols), cols)
    x = torch.ones(cols)
    a = np.ones(mib * 2**20 // 4, np.float32)
    parts = np.array_split(a, workers)
    pool = ThreadPoolExecutor(workers) if workers > 1 else None

    def gemv(_):
        return float(torch.mv(w, x)[0])

    def npmax(_):
        if pool is None:
            return float(a.max())
        return max(pool.map(lambda p: float(p.max()), parts))

    info = {"array_bytes": a.nbytes, "workers": {"torch.mv": torch.get_num_threads(), "np.max": workers},
            "method": "per pass, the faster of torch.mv over an fp32 [rows, 4096] matrix and numpy's max over "
                      "an fp32 array split across threads, each reading every byte once"}
    arms = [Arm(f"memory read ({name})", call, unit="GB/s", better=tm.HIGHER_IS_BETTER,
                value=lambda s, n=nbytes: n / s / 1e9)
            for name, call, nbytes in (("torch.mv", gemv, w.numel() * 4), ("np.max", npmax, a.nbytes))]
    return arms, info


def floor_arm(name: str, reads: list[Arm], nbytes: int) -> Arm:
    """Per pass: nbytes / the fastest read rate measured in that pass, in ms (paired with the same
    pass's step); a pass where no read arm ran is None."""
    arm = Arm(name, None, errors=[e for r in reads for e in r.errors])
    for rates in zip(*(r.per_pass for r in reads)):
        ok = [g for g in rates if g is not None]
        arm.per_pass.append(nbytes / (max(ok) * 1e9) * 1e3 if ok else None)
    return arm


def module_bytes(module) -> int:
    """Bytes of the distinct parameters and buffers a module reads (shared storage counted once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


# ------------------------------------------------------------------------------------- cases

def _measure(arms: list[Arm], cfg: dict, samples: int) -> dict:
    for arm in arms:
        if arm.call is not None:
            tm.warm(arm, cfg["warmup"], cfg["min_pass_s"], cfg["max_calls_per_pass"])
    orders = tm.run_passes([a for a in arms if a.call is not None], cfg["passes"], samples)
    return {"pass_orders": orders[:3] + (["..."] if len(orders) > 3 else [])}


def case_talker(model, eager, calls, target, work, cfg) -> dict:
    samples = calls["talker_decode"][: cfg["samples"]]
    ex = open_all(eager, {"talker_decode": samples}, target, work, cfg)["talker_decode"]
    try:
        arms = graph_arms(ex, samples, eager, cfg)
        bw, bw_info = bandwidth_arms(cfg["bandwidth_mib"], cfg["threads"])
        weights = module_bytes(ex.graph.module)
        kv = sum(np.asarray(v).nbytes for k, v in samples[0].items() if k.startswith("past_"))
        run = _measure([*arms.values(), *bw], cfg, len(samples))
        floor = floor_arm("bandwidth floor (weights)", bw, weights)
        floor_kv = floor_arm("bandwidth floor (weights + KV cache)", bw, weights + kv)
        ratios = []
        for a in arms.values():
            ratios.append(tm.ratio(f"talker step / floor: {a.name}", a, floor,
                                   "step time over the weight-read floor (1.0 = reads its weights at the "
                                   "measured rate)", None if a.name == EAGER else ("<=", FLOOR_MAX)))
            ratios.append(tm.ratio(f"talker step / floor incl. KV: {a.name}", a, floor_kv,
                                   "step time over the floor counting the KV cache it reads too"))
        ratios += runner_ratios(arms)
        from .provenance import last_level_cache_bytes

        llc = last_level_cache_bytes()
        return {"graph": "talker_decode", "inputs": _shapes(samples[0]), "samples": len(samples),
                "weight_bytes": weights, "kv_cache_bytes_read": kv, "bandwidth": bw_info,
                "last_level_cache_bytes": llc,
                # a step sweeps all its weights in the same order every call: past the cache's size, each
                # sweep evicts what the next one needs first, so at most llc / weights of it can be a hit
                "cache_share_max": None if llc is None else round(min(1.0, llc / weights), 4),
                "floor_meaningful": llc is None or weights > 4 * llc,
                "floor_note": "the floor assumes every weight byte comes from DRAM; meaningful when the weights "
                              "are more than 4x the last-level cache (at most a quarter could be served from "
                              "it); weights that fit in the caches (the tiny demo) make the ratio meaningless",
                "exports": ex.files, "export_errors": ex.errors, **run,
                "arms": {a.name: tm.arm_json(a) for a in [*arms.values(), *bw, floor, floor_kv]}, "ratios": ratios}
    finally:
        ex.close()


def case_predictor(model, eager, calls, target, work, cfg) -> dict:
    from omni_export.recipes.qwen3_tts import host

    cfgm = model.cfg
    q1, vocab = cfgm.predictor.num_code_groups - 1, cfgm.predictor.vocab_size
    starts = calls["predictor_prefill"][: cfg["samples"]]
    noise = np.zeros((q1, vocab), np.float32)                                  # zeros: greedy
    # a fresh [1, Q-1, V] array per sample: noise[None] would be a view with a 0 stride, which the
    # .pte export refuses ("0 in strides is not supported for ExecuTorch")
    frame_samples = [{**s, "noise": np.zeros((1, q1, vocab), np.float32)} for s in starts]
    ex = open_all(eager, {"predictor_prefill": starts, "predictor_decode": calls["predictor_decode"][:2],
                          "predictor_frame": frame_samples}, target, work, cfg)
    try:
        graphsets = {LABEL[k]: RunnerGraphs(ex, k) for k in cfg["runners"]}
        graphsets[EAGER] = eager

        def frame(graphs, mode):
            opts = host.GenOptions(greedy=True, predictor=mode)
            return lambda i: host.predictor_frame(graphs, cfgm, starts[i]["past_hidden"],
                                                  int(starts[i]["code0"].reshape(-1)[0]), noise, opts, model.tables)

        arms, agreement, needs = {}, {}, {"step": ("predictor_prefill", "predictor_decode"),
                                          "frame": ("predictor_frame",)}
        for label, g in graphsets.items():
            ok = {m: not isinstance(g, RunnerGraphs) or g.available(n) for m, n in needs.items()}
            for mode, what in (("step", "prefill + 14 step calls"), ("frame", "1 fused call")):
                name = f"{label}: {what}"
                arms[(label, mode)] = Arm(name, frame(g, mode)) if ok[mode] else _unavailable(
                    name, {n: ex[n].errors for n in needs[mode] if ex[n].errors})
            if all(ok.values()):
                agreement[label] = _agreement(frame(g, "step"), frame(g, "frame"), len(starts))
        for label, g in graphsets.items():          # and every runner's fused codes against eager's steps
            if label in agreement:
                agreement[label]["fused_frames_equal_eager_step"] = _agreement(
                    frame(eager, "step"), frame(g, "frame"), len(starts))["frames_equal"]
        run = _measure(list(arms.values()), cfg, len(starts))
        ratios = []
        for label in graphsets:
            step, fused = arms[(label, "step")], arms[(label, "frame")]
            ratios.append(tm.ratio(f"step path / fused frame: {label}", step, fused,
                                   "how many times faster one fused call is than prefill + 14 step calls, same runner",
                                   None if label == EAGER else (">=", FUSED_MIN_SPEEDUP)))
        for label in graphsets:
            if label == EAGER:
                continue
            fused = arms[(label, "frame")]
            ratios.append(tm.ratio(f"eager fused module / fused frame: {label}", arms[(EAGER, "frame")], fused,
                                   "the same fused module in torch eager over the exported graph",
                                   (">=", FUSED_VS_EAGER_MIN)))
            ratios.append(tm.ratio(f"eager step path / fused frame: {label}", arms[(EAGER, "step")], fused,
                                   "torch eager step by step (the upstream way) over the exported fused graph"))
        return {"graphs": ["predictor_prefill", "predictor_decode", "predictor_frame"],
                "inputs": _shapes(frame_samples[0]), "samples": len(starts),
                "host_loop": "omni_export.recipes.qwen3_tts.host.predictor_frame, greedy (noise = 0)",
                "exports": {n: e.files for n, e in ex.items()}, "export_errors": {n: e.errors for n, e in ex.items()},
                "agreement": agreement, **run,
                "arms": {a.name: tm.arm_json(a) for a in arms.values()}, "ratios": ratios}
    finally:
        for e in ex.values():
            e.close()


def _agreement(step, fused, n: int) -> dict:
    """Codes of the step path and of the fused graph on the same inputs, frame by frame."""
    rows = []
    for i in range(n):
        (cs, es), (cf, ef) = step(i), fused(i)
        diff = [s for s, (a, b) in enumerate(zip(cs, cf)) if a != b]
        rows.append({"equal": not diff, "first_differing_step": diff[0] + 1 if diff else None,
                     "embedding_max_abs_diff": float(np.max(np.abs(np.asarray(es) - np.asarray(ef))))})
    return {"frames": n, "frames_equal": sum(r["equal"] for r in rows), "per_frame": rows}


def case_code2wav(model, eager, calls, target, work, cfg) -> dict:
    samples = code2wav_inputs(model, cfg["samples"])
    ex = open_all(eager, {"code2wav": samples}, target, work, cfg)["code2wav"]
    try:
        arms = graph_arms(ex, samples, eager, cfg)
        run = _measure(list(arms.values()), cfg, len(samples))
        return {"graph": "code2wav", "inputs": _shapes(samples[0]), "samples": len(samples),
                "left_context": model.left, "chunk_frames": model.chunk,
                "weight_bytes": module_bytes(ex.graph.module), "exports": ex.files, "export_errors": ex.errors,
                **run, "arms": {a.name: tm.arm_json(a) for a in arms.values()}, "ratios": runner_ratios(arms)}
    finally:
        ex.close()


def _shapes(sample: dict) -> dict:
    return {k: [list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in sample.items()}


CASE_FUNCS = {"talker": case_talker, "predictor": case_predictor, "code2wav": case_code2wav}
BUDGET_PREFIXES = ("talker step / floor: ", "step path / fused frame: ", "eager fused module / fused frame: ")


def budgets(cases: dict) -> list[dict]:
    """The issue's three runtime budget rows, one per runner, copied from the cases' ratios."""
    rows = []
    for case in cases.values():
        for r in case.get("ratios", []):
            if r.get("budget") is not None and r["name"].startswith(BUDGET_PREFIXES):
                rows.append({k: r[k] for k in ("name", "ratio_of_medians", "per_pass", "budget", "meets_budget",
                                               "meets_budget_every_pass", "verdict", "not_a_ranking", "quotable")
                             if k in r})
    return rows


# ------------------------------------------------------------------------------------- worker

def worker(args, out_path: Path) -> int:
    """Measure every requested case, writing the result after each one (a crash keeps the rest)."""
    import warnings

    for category in (FutureWarning, DeprecationWarning):     # library noise would bury a real stderr tail
        warnings.filterwarnings("ignore", category=category)
    from omni_export.targets import get_target

    cfg = {"passes": 0 if args.dry_run else args.passes, "warmup": args.warmup, "min_pass_s": args.min_pass_ms / 1e3,
           "max_calls_per_pass": args.max_calls_per_pass, "samples": args.samples,
           "bandwidth_mib": args.bandwidth_mib, "threads": args.threads, "runners": args.runners,
           "skip": sorted(args.skip)}
    result = {"config": cfg, "threads": fix_threads(args.threads), "cases": {}, "failures": [],
              "dry_run": args.dry_run}
    work = Path(args.work) / f"runtime-{args.size}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def save():
        result["budgets"] = budgets(result["cases"])
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out_path)

    try:
        try:
            t0 = time.monotonic()
            log(f"load checkpoint ({args.size})")
            model, options = load_model(args.size, work / "checkpoint", dict(args.option))
            result["checkpoint"] = {**model.info, "recipe_options": options}
            result["load_s"] = round(time.monotonic() - t0, 2)
            log("capture inputs: greedy fp32 generation of a held-out prompt")
            t0 = time.monotonic()
            eager, calls = capture_inputs(model, args.samples + 1)
            result["capture_s"] = round(time.monotonic() - t0, 2)
            result["target"] = {"name": args.target, "rewrites": list(get_target(args.target).rewrites)}
        except Exception as e:
            result["failures"].append({"case": "setup (load checkpoint, capture inputs)", **_error(e)})
            save()
            raise
        save()
        for name in args.cases:
            log(f"case {name}")
            t0 = time.monotonic()
            try:
                result["cases"][name] = CASE_FUNCS[name](model, eager, calls, get_target(args.target), work, cfg)
                result["cases"][name]["case_s"] = round(time.monotonic() - t0, 2)
            except Exception as e:
                result["failures"].append({"case": name, **_error(e)})
                log(f"case {name} failed: {type(e).__name__}: {e}")
            gc.collect()
            save()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if not result["failures"] else 1

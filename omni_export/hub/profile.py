"""AI Hub profiles (InferenceJob.download_profile()) -> the per-graph figures the report shows.

The dict is the client's: {"execution_summary": {"estimated_inference_time": µs,
"estimated_inference_peak_memory": bytes, "first_load_time": µs, "warm_load_time": µs,
"inference_memory_peak_range": (lo, hi) bytes, "all_inference_times": [µs, ...], ...},
"execution_detail": [{"name", "type", "compute_unit": "NPU" | "GPU" | "CPU", "execution_time"? µs}]}.
Missing metrics (None in the client's dict) stay None here. Per op, the slowest ones are kept with their
time (`slowest_ops`): where a graph's device time goes (the study found a fifth of every sliding-window
layer lost to one boundary copy this way).
"""
from __future__ import annotations

import statistics

UNITS = ("NPU", "GPU", "CPU")
MB = 1024 * 1024
SLOWEST = 10          # ops kept per profile, slowest first (the whole profile stays in hub/<build>/profile.json)


def summarize(profile: dict) -> dict:
    es = profile.get("execution_summary") or {}
    layers = profile.get("execution_detail") or []
    units = {u: 0 for u in UNITS}
    for layer in layers:
        unit = str(layer.get("compute_unit", "")).upper()
        units[unit] = units.get(unit, 0) + 1
    times = [t for t in es.get("all_inference_times") or [] if isinstance(t, (int, float))]
    peak_range = es.get("inference_memory_peak_range")
    return {
        "inference_ms": _ms(es.get("estimated_inference_time")),
        "inference_ms_min": _ms(min(times)) if times else None,
        "inference_ms_median": _ms(statistics.median(times)) if times else None,
        "inference_ms_max": _ms(max(times)) if times else None,
        "iterations": len(times) or None,
        "peak_memory_mb": _mb(es.get("estimated_inference_peak_memory")),
        "peak_memory_range_mb": [_mb(peak_range[0]), _mb(peak_range[1])] if peak_range else None,
        "first_load_ms": _ms(es.get("first_load_time")),
        "warm_load_ms": _ms(es.get("warm_load_time")),
        "compute_units": units,
        "layers": len(layers),
        "slowest_ops": slowest(layers),
    }


def slowest(layers: list, n: int = SLOWEST) -> list[dict]:
    """The `n` ops with the longest execution_time (µs in the profile), as {name, type, compute_unit, ms},
    slowest first; ops the profile gives no time are left out."""
    timed = [x for x in layers if isinstance(x.get("execution_time"), (int, float))]
    timed.sort(key=lambda x: -x["execution_time"])
    return [{"name": str(x.get("name", "")), "type": str(x.get("type", "")),
             "compute_unit": str(x.get("compute_unit", "")).upper(), "ms": _ms(x["execution_time"])}
            for x in timed[:n]]


def split(units: dict) -> str:
    """'NPU 412 · CPU 3' (units with no layer left out)."""
    parts = [f"{u} {n}" for u, n in units.items() if n]
    return " · ".join(parts) or "—"


def _ms(us) -> float | None:
    return round(float(us) / 1000.0, 3) if isinstance(us, (int, float)) else None


def _mb(b) -> float | None:
    return round(float(b) / MB, 2) if isinstance(b, (int, float)) else None

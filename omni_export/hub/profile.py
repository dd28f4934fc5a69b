"""AI Hub profiles (InferenceJob.download_profile()) -> the per-graph figures the report shows.

The dict is the client's: {"execution_summary": {"estimated_inference_time": µs,
"estimated_inference_peak_memory": bytes, "first_load_time": µs, "warm_load_time": µs,
"inference_memory_peak_range": (lo, hi) bytes, "all_inference_times": [µs, ...], ...},
"execution_detail": [{"name", "type", "compute_unit": "NPU" | "GPU" | "CPU", "execution_time"?}]}.
Missing metrics (None in the client's dict) stay None here.
"""
from __future__ import annotations

import statistics

UNITS = ("NPU", "GPU", "CPU")
MB = 1024 * 1024


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
    }


def split(units: dict) -> str:
    """'NPU 412 · CPU 3' (units with no layer left out)."""
    parts = [f"{u} {n}" for u, n in units.items() if n]
    return " · ".join(parts) or "—"


def _ms(us) -> float | None:
    return round(float(us) / 1000.0, 3) if isinstance(us, (int, float)) else None


def _mb(b) -> float | None:
    return round(float(b) / MB, 2) if isinstance(b, (int, float)) else None

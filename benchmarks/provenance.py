"""Provenance for every result file (MEASURING.md rule 2): which source, toolchain, host and options."""
from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Environment variables that change how many threads run or which kernels numpy / torch pick.
ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE",
            "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY", "PYTHONHASHSEED")


def _mem_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def last_level_cache_bytes() -> int | None:
    """Size of cpu0's highest-level cache (sysfs); weights smaller than this are not read from DRAM."""
    best = None
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((d / "level").read_text()), (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        n = int(size.rstrip("KMG")) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        if best is None or level > best[0]:
            best = (level, n)
    return best[1] if best else None


def machine_state() -> dict:
    """What else the machine was doing: load average and available memory, at one moment."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": list(os.getloadavg()),
            "mem_available_bytes": avail}


def collect(argv: list[str], options: dict) -> dict:
    """Provenance of this run; the toolchain comes from the same function the manifest uses."""
    from omni_export.artifacts import manifest as mf

    return {
        "git_sha": mf.git_sha(),
        "source_root": str(ROOT),
        "toolchain": mf.toolchain(),
        "host": {**mf.host(), "mem_total_bytes": _mem_total_bytes(),
                 "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
                 "last_level_cache_bytes": last_level_cache_bytes(),
                 "kernel": platform.release()},
        "python": sys.executable,
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
        "command_line": [sys.executable, str(Path(sys.argv[0]).resolve()), *argv],
        "options": options,
        "machine_at_start": machine_state(),
    }

"""Keep the libraries' chatter for their developers off our users' terminals, and nothing else.

Measured on the demo command (README), before this: every run printed, between its progress lines,
  - torchao (imported by ExecuTorch): "Failed to load .../torchao/_C_mxfp8...so" and "..._C_cutlass_90a...
    .so" -- CUDA-only kernels on a CPU build, never used here; a Python logger warning;
  - torch's pytree: "<enum 'KernelPreference'> is an Enum subclass ... deprecated" (torchao's call);
  - ExecuTorch's runtime, on the first XNNPACK method it loads: five "[cpuinfo_utils.cpp:..] Reading
    file /sys/devices/soc0/image_version / Failed to open midr file ..." lines (an Arm-only CPU probe,
    logged through Python's sys.stderr).
Anything else those libraries print still reaches the terminal.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import Iterator

# loggers whose warnings say nothing a user of the exporter can act on
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
# native stderr lines from ExecuTorch's runtime that say nothing about the model or its outputs
RUNTIME_NOISE = ("[cpuinfo_utils.cpp:",)


def quiet_library_logs() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def filtered_stderr(noise: tuple[str, ...] = RUNTIME_NOISE) -> Iterator[None]:
    """Everything written to stderr inside the block -- by native code to fd 2 and through Python's
    sys.stderr (ExecuTorch's runtime logs through the latter) -- goes to a temporary file; on exit
    every line not starting with one of `noise` is written back to stderr, in order. Keep the block
    short: the CLI's progress spinner is held until it ends. Without a real fd 2, nothing changes."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        captured = os.fdopen(os.dup(tmp.fileno()), "w", buffering=1, errors="replace",
                             encoding=getattr(python_stderr, "encoding", None) or "utf-8")
        sys.stderr = captured
        try:
            yield
        finally:
            sys.stderr = python_stderr
            with contextlib.suppress(Exception):
                captured.close()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True)
                    if not line.lstrip().startswith(tuple(n.encode() for n in noise))]
            if kept:
                with contextlib.suppress(Exception):
                    python_stderr.flush()
                os.write(2, b"".join(kept))

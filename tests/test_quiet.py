"""Library chatter stays off the user's terminal; everything else written to stderr still arrives."""
import subprocess
import sys

from conftest import ROOT

SCRIPT = r"""
import os, sys
from omni_export.quiet import filtered_stderr
os.write(2, b"before\n")
with filtered_stderr(("[noise.cpp:",)):
    os.write(2, b"[noise.cpp:1] native probe\n")
    os.write(2, b"native kept\n")
    sys.stderr.write("[noise.cpp:2] through Python\n")
    sys.stderr.write("python kept\n")
    os.write(2, b"[")                      # a line written in pieces, as ExecuTorch's logger does
    os.write(2, b"noise.cpp:3] pieces\n")
os.write(2, b"after\n")
"""


def test_filtered_stderr_drops_only_the_noise_lines_and_keeps_order():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, check=True)
    assert proc.stderr.splitlines() == ["before", "native kept", "python kept", "after"]


def test_library_loggers_are_quieted_at_error():
    import logging

    from omni_export.quiet import QUIET_LOGGERS, quiet_library_logs

    quiet_library_logs()
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.ERROR for n in QUIET_LOGGERS)

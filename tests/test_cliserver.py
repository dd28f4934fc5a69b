"""The tests' forking CLI server (tests/cliserver.py) gives what a new interpreter gives."""
from __future__ import annotations

from conftest import run_cli


def test_a_forked_run_says_what_a_fresh_interpreter_says():
    for args in (["list"], ["nosuch"], ["qwen3-tts", "--precision", "int3"], ["verify", "/nonexistent"]):
        forked, fresh = run_cli(*args), run_cli(*args, fresh=True)
        assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout), args
        assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:], args

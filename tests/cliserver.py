"""The tests' CLI runs without paying the interpreter's start-up each time.

Every `omni-export` build in the suite started a new interpreter that imported torch, torch.export,
ExecuTorch's exir and the ONNX exporter's op registry again: ~8 s of CPU per run before any work,
over ~100 runs per suite. This server is one process per pytest worker that imports them once, then
forks a child for each run. The child is a separate process like `python -m omni_export.cli`: its
own working directory, environment, stdout and stderr (files), exit code (or -signal, as
subprocess reports it), killed with its process group on a timeout. Nothing runs in the server
after the imports, so it forks with one Python thread (checked; with more it is not used).

Tests that check what a fresh interpreter prints (import-time library chatter) or that signal
the CLI themselves start it with subprocess as before (`run_cli(..., fresh=True)`, tests/test_crash.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

PRELOAD = ("torch", "torch.export", "torch.onnx", "executorch.exir",
           "executorch.backends.xnnpack.partition.xnnpack_partitioner", "onnx", "omni_export.cli")


def _serve(rfd: int, wfd: int) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    # no Python thread but this one (torch's import starts one idle native thread; a forked child
    # makes its own intra-op pool: 2 threads busy on a matmul, measured at b9a7116)
    ok = threading.active_count() == 1
    rd, wr = os.fdopen(rfd, "r"), os.fdopen(wfd, "w")
    wr.write(json.dumps({"ready": ok}) + "\n")
    wr.flush()
    for line in rd:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req)
        try:
            os.setpgid(pid, pid)             # its own group (the child sets it too): a kill takes its children
        except OSError:
            pass
        wr.write(json.dumps({"pid": pid}) + "\n")
        wr.flush()
        _, status = os.waitpid(pid, 0)
        wr.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")
        wr.flush()


def _child(req: dict) -> None:
    code = 1
    try:
        os.setpgid(0, 0)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path in ((1, req["out"]), (2, req["err"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = [req["argv0"], *req["args"]]
        import signal

        signal.signal(signal.SIGINT, signal.default_int_handler)
        from omni_export.cli import main

        try:
            main(req["args"], prog_name="python -m omni_export.cli")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class Server:
    """One forking server; `run` is subprocess.run(..., capture_output=True, text=True) for the CLI."""

    def __init__(self):
        r1, w1 = os.pipe()
        r2, w2 = os.pipe()
        code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import cliserver; cliserver._serve({r1}, {w2})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(r1, w2), cwd=os.getcwd(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r1)
        os.close(w2)
        self.wr, self.rd = os.fdopen(w1, "w"), os.fdopen(r2, "r")
        self.lock = threading.Lock()
        line = self.rd.readline()
        self.ok = bool(line) and json.loads(line)["ready"]

    def run(self, args, cwd, env, timeout: float, kill_after: float | None = None) -> subprocess.CompletedProcess:
        """`kill_after`: SIGKILL the run after that many seconds (returncode -9), if it has not ended."""
        import select
        import signal

        with self.lock, tempfile.TemporaryDirectory() as tmp:
            out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
            argv0 = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "omni_export", "cli.py")
            self.wr.write(json.dumps({"args": list(args), "cwd": str(cwd), "env": dict(env), "out": out,
                                      "err": err, "argv0": argv0}) + "\n")
            self.wr.flush()
            pid = json.loads(self.rd.readline())["pid"]
            ready, _, _ = select.select([self.rd], [], [], min(timeout, kill_after or timeout))
            if not ready and kill_after is not None and kill_after < timeout:
                os.killpg(pid, signal.SIGKILL)
            elif not ready:
                os.killpg(pid, signal.SIGKILL)
                self.rd.readline()
                raise subprocess.TimeoutExpired(["omni-export", *args], timeout)
            code = json.loads(self.rd.readline())["code"]
            with open(out, errors="replace") as o, open(err, errors="replace") as e:
                return subprocess.CompletedProcess([sys.executable, "-m", "omni_export.cli", *args], code,
                                                   o.read(), e.read())

    def close(self) -> None:
        self.wr.close()
        self.proc.wait(timeout=30)

"""A scoring run as a job worker makes it (jobs/work.py), and what a spawned process of the build
does first: die with its parent, name its role in the stage log."""
from __future__ import annotations

import os

from .runners import RunnerSpec, run_all


class Outputs(list):
    """A scoring job's outputs, one dict per sample, with the job's own seconds (`wall_s`: opening
    the artifact and running every sample), which a caller waiting on the job cannot see."""

    def __init__(self, items=(), wall_s: float | None = None):
        super().__init__(items)
        self.wall_s = wall_s


def run_job(spec: RunnerSpec, inputs: list[dict]) -> Outputs:
    """One scoring run; with a stage log kept (OMNI_EXPORT_STAGE_LOG), a `job` line records where
    the scoring time goes: open (session / compile) and run seconds per runner and file."""
    import time

    path = os.environ.get("OMNI_EXPORT_STAGE_LOG")
    times: dict = {}
    t0 = time.time()
    ok = False
    try:
        out = Outputs(run_all(spec, inputs, times), wall_s=round(time.time() - t0, 3))
        ok = True
        return out
    finally:
        if path:
            import json

            with open(path, "a") as f:
                f.write(json.dumps({"t": time.time(), "event": "job", "pid": os.getpid(), "runner": spec.short,
                                    "model": os.path.basename(spec.model), "samples": len(inputs), "ok": ok,
                                    "wall_s": round(time.time() - t0, 3), **times}) + "\n")


def exit_with_parent(poll_s: float = 1.0) -> None:
    """In a spawned worker: exit when the process that spawned it is gone. A parent killed outright (the
    kernel's OOM killer, kill -9) runs no cleanup, and its pool workers went on computing (GiBs of a
    quantizer or a simulator run) as orphans."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def mark_process(role: str) -> None:
    """Name this process's role in the stage log (OMNI_EXPORT_STAGE_LOG), when one is kept: the
    benchmark harness attributes CPU and memory per role (build process, scoring worker, QNN
    compile child ...) from these lines."""
    import json
    import time

    path = os.environ.get("OMNI_EXPORT_STAGE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"t": time.time(), "event": "process", "pid": os.getpid(), "role": role}) + "\n")


def init_child(role: str) -> None:
    """Initializer of a spawned child doing one step of the build (a QNN compile, a quantization)."""
    from ..quiet import quiet_library_logs

    exit_with_parent()
    mark_process(role)
    quiet_library_logs()

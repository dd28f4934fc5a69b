"""The Ray executor: the same jobs as the local executor, as Ray tasks on a cluster.

    omni-export qwen3-tts --target s25-htp --executor ray:auto        # a cluster this machine is part of
    omni-export qwen3-tts --target s25-htp --executor ray:HOST:6379   # join one by address
    omni-export qwen3-tts --target s25-htp --executor ray             # start Ray on this machine alone

Each job is one task: one CPU, and for a step of a graph past 256 MB of weights its memory estimate
as Ray's `memory` resource, so a node never runs more of them than it has room for. A `fresh` job
runs in a worker process that exits after it (`max_calls=1`). A task whose worker dies (killed,
out of memory) is run again by Ray (`max_retries`); an exception the job raises is its failure, not
retried. Jobs read and write files under the output directory and the checkpoint: every node must
see them at the same paths (one machine, or a shared filesystem mounted alike on every node).
Ray is imported only here (`pip install 'omni-export[ray]'`).
"""
from __future__ import annotations

import concurrent.futures as cf

from ..core import UsageError

RETRIES = 3
_ready = False


def _task(fn, args, threads: int):
    """In a Ray worker: set the worker up once (quiet libraries, `threads` math threads), run the job."""
    global _ready
    from .local import call, init_worker

    if not _ready:
        init_worker(threads, "ray job worker")
        _ready = True
    return call(fn, args)


def _fresh_task(fn, args, threads: int):
    """_task in a worker process that exits after it (max_calls=1)."""
    return _task(fn, args, threads)


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None):
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'omni-export[ray]'") from None
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False,
                         runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UsageError(f"--executor ray{':' + address if address else ''}: cannot reach a Ray cluster "
                                 f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = max(1, workers or cpus)
        self.threads = 1
        self._remote = ray.remote(_task)
        self._fresh = ray.remote(max_calls=1)(_fresh_task)
        self._refs: set = set()

    def describe(self) -> dict:
        r = self._ray
        return {"executor": self.name, "workers": self.slots, "nodes": len([n for n in r.nodes() if n.get("Alive")])}

    def submit(self, job, fn, args) -> cf.Future:
        options = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": False}
        if job.memory:
            options["memory"] = int(job.memory)
        remote = self._fresh if job.fresh else self._remote
        ref = remote.options(**options).remote(fn, args, self.threads)
        self._refs.add(ref)
        fut = ref.future()
        fut.add_done_callback(lambda _f, ref=ref: self._refs.discard(ref))
        return fut

    def close(self, abort: bool = False) -> None:
        if abort:
            for ref in list(self._refs):
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:       # already finished or gone: nothing to stop
                    pass
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

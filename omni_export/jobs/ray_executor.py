"""The Ray executor: the same jobs as the local executor, as Ray tasks on a cluster.

    omni-export qwen3-tts --target s25-htp --executor ray:auto        # a cluster this machine is part of
    omni-export qwen3-tts --target s25-htp --executor ray:HOST:6379   # join one by address
    omni-export qwen3-tts --target s25-htp --executor ray             # start Ray on this machine alone

Each job is one task: one CPU, and for a step of a graph past 256 MB of weights its memory estimate
as Ray's `memory` resource, so a node never runs more of them than it has room for. A `fresh` job
runs in a worker process that exits after it (`max_calls=1`). A task whose worker dies (killed,
out of memory) is run again by Ray (`max_retries`); an exception the job raises is its failure, not
retried. A job's files (what its arguments and result name under OUT and the checkpoint) travel by
content hash through Ray's object store, or through `--shared-dir` (a directory every node reads and
writes) when given; a node already holding a file at its path is not sent it (jobs/ship.py). End-to-end
rows read the whole OUT: they run on the build's own node. Ray is imported only here
(`pip install 'omni-export[ray]'`).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
from pathlib import Path

from ..core import UsageError

RETRIES = 3
_ready = False


def died(error: BaseException) -> BaseException:
    """A task whose worker process died on every one of Ray's runs (WorkerCrashedError) as the local
    executor says it: WorkerDied, which the build answers the same way whichever executor ran the job
    (a repair step that crashed the HTP simulator runs again at --htp-optimization 2)."""
    from ray.exceptions import WorkerCrashedError

    from .errors import WorkerDied

    if isinstance(error, WorkerCrashedError):
        return WorkerDied(f"its worker process died {RETRIES + 1} times (Ray: {str(error).splitlines()[0][:200]}), "
                          f"a new process each time: killed, or crashed in native code")
    return error


def _task(fn, args, threads: int):
    """In a Ray worker: set the worker up once (quiet libraries, `threads` math threads), run the job."""
    global _ready
    from .local import call, init_worker

    if not _ready:
        init_worker(threads, "ray job worker")
        _ready = True
    return call(fn, args)


def _fresh_task(fn, args, threads: int, ship: dict | None = None):
    """_shipped_task in a worker process that exits after it (max_calls=1)."""
    return _shipped_task(fn, args, threads, ship)


def _shipped_task(fn, args, threads: int, ship: dict | None = None):
    """In a Ray worker: the job's input files in place (unless this node holds them), the job, and the
    files its result names sent back: (JobResult, [(path, sha256, bytes, mtime_ns, data | None)])."""
    if ship is None:
        return _task(fn, args, threads), []
    import ray

    from . import ship as sh

    roots = tuple(ship["roots"])
    base = ship.get("node_root")
    if base:                                    # tests: this node's own file system (ship.NODE_ROOT_ENV)
        base = os.path.join(base, ray.get_runtime_context().get_node_id())
    local = (lambda s: base + s) if base else (lambda s: s)
    shared = sh.SharedDir(ship["shared_dir"]) if ship.get("shared_dir") else None
    for path, sha, size, mtime, ref in ship["inputs"]:
        dest = Path(local(path))
        if not sh.holds(dest, size, mtime):
            if shared is not None:
                shared.get(sha, dest, mtime)
            else:
                data = ray.get(ref)
                sh.place(dest, lambda tmp, data=data: tmp.write_bytes(data), mtime)
    for d in ship["dirs"]:
        Path(local(d)).mkdir(parents=True, exist_ok=True)
    under = lambda s: local(s) if any(s == r or s.startswith(r + os.sep) for r in roots) else None
    result = _task(fn, sh.map_paths(args, under) if base else args, threads)
    local_roots = tuple(local(r) for r in roots)
    outs = []
    for path, sha, size, mtime in sh.outputs_of(result.value, local_roots):
        if shared is not None:
            shared.put(Path(path), sha)
        data = None if shared is not None else Path(path).read_bytes()
        outs.append((path[len(base):] if base else path, sha, size, mtime, data))
    if base:
        result.value = sh.map_paths(result.value, lambda s: s[len(base):] if s.startswith(base + os.sep) else None)
    return result, outs


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None, shared_dir: str | None = None,
                 roots: tuple[str, ...] = ()):
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
        self._remote = ray.remote(_shipped_task)
        self._fresh = ray.remote(max_calls=1)(_fresh_task)
        self._refs: set = set()
        self.shared_dir = shared_dir               # --shared-dir: files by content hash there, not in the object store
        self.roots = tuple(os.path.abspath(r) for r in roots)      # OUT, then the checkpoint
        self._puts: dict[str, object] = {}         # sha256 -> its object in the object store
        self._node = ray.get_runtime_context().get_node_id()
        self.shipped = {"files_sent": 0, "bytes_sent": 0, "files_back": 0, "bytes_back": 0}

    def describe(self) -> dict:
        r = self._ray
        return {"executor": self.name, "workers": self.slots, "nodes": len([n for n in r.nodes() if n.get("Alive")]),
                "files_through": self.shared_dir or "object store"}

    def _ship(self, args) -> dict:
        """What a job needs sent to its node: its input files (by content), the directories it writes."""
        from . import ship as sh

        staging = os.path.join(self.roots[0], ".staging") if self.roots else ""
        inputs = []
        for path, sha, size, mtime in sh.inputs_of(args, self.roots, staging):
            ref, new = None, False
            if self.shared_dir:
                new = sh.SharedDir(self.shared_dir).put(Path(path), sha)
            else:
                new = sha not in self._puts
                if new:
                    self._puts[sha] = self._ray.put(Path(path).read_bytes())
                ref = self._puts[sha]
            self.shipped["files_sent"] += new
            self.shipped["bytes_sent"] += size if new else 0
            inputs.append((path, sha, size, mtime, ref))
        dirs = sorted({str(p) for p in sh.paths_in(args, self.roots) if p.is_dir()} | set(self.roots))
        return {"roots": self.roots, "inputs": inputs, "dirs": dirs, "shared_dir": self.shared_dir,
                "node_root": os.environ.get(sh.NODE_ROOT_ENV) or None}

    def submit(self, job, fn, args) -> cf.Future:
        options = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": False}
        if job.memory:
            options["memory"] = int(job.memory)
        ship = None
        if job.kind == "e2e":           # reads the whole OUT: on this node
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self._node, soft=False)
        elif self.roots:
            ship = self._ship(args)
        remote = self._fresh if job.fresh else self._remote
        ref = remote.options(**options).remote(fn, args, self.threads, ship)
        self._refs.add(ref)
        out: cf.Future = cf.Future()

        def landed(f, ref=ref):
            self._refs.discard(ref)
            try:
                result, files = f.result()
                self._receive(files)
            except BaseException as e:         # the job's failure, or its files not landing
                out.set_exception(died(e))
            else:
                out.set_result(result)

        ref.future().add_done_callback(landed)
        return out

    def _receive(self, files) -> None:
        """The files a job's result names, put at this machine's paths unless they are there already."""
        from . import ship as sh

        for path, sha, size, mtime, data in files:
            dest = Path(path)
            if sh.holds(dest, size, mtime):
                continue
            if data is None:
                sh.SharedDir(self.shared_dir).get(sha, dest, mtime)
            else:
                sh.place(dest, lambda tmp, data=data: tmp.write_bytes(data), mtime)
            self.shipped["files_back"] += 1
            self.shipped["bytes_back"] += size

    def close(self, abort: bool = False) -> None:
        if abort:
            for ref in list(self._refs):
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:       # already finished or gone: nothing to stop
                    pass
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

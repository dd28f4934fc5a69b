"""One build's AI Hub jobs as a resumable state machine: [quantize] -> compile -> inference.

`step()` makes one move: submit the next job, or poll the current one once. Every move is saved
(manifest.json, atomically, through the Store) before the next one, so a kill at any point is
resumed by the next run:
  - a job with an id is polled, never resubmitted;
  - a job whose unique name was reserved but whose id never came back (killed mid-submission, or
    a 5xx after AI Hub created it) is looked up by that name first, and submitted only if AI Hub
    has no job of that name;
  - a FAILED job's message is recorded and the build stays failed until `--resubmit`, which
    resubmits from the failed job on (earlier successful jobs are kept: a failed inference reruns
    on the compiled model) and keeps the failed attempt under "history".
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..artifacts.inputs import checked, read_samples
from . import device as dev
from .client import ATTEMPTS, Hub, HubError, Transient
from .profile import summarize
from .records import DIR, build_state, now
from .routes import Route


@dataclass
class Context:
    """What every build's jobs share: the client, the store, the manifest, the pins, how to save."""
    hub: Hub
    store: object                       # artifacts.store.Store, amending
    manifest: dict
    device: object                      # client.DeviceInfo
    qairt: str
    recipe: object                      # core.Recipe (component logits, margins)
    save: Callable[[], None]
    _inputs: dict = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.store.root

    @property
    def section(self) -> dict:
        return self.manifest["hub"]

    def inputs(self, component: str, kind: str = "parity") -> tuple[list[dict], list[dict]]:
        """(inputs, references) of a component, hash-checked, read once."""
        if (component, kind) not in self._inputs:
            info = self.manifest["components"][component]
            rec = info.get("parity_inputs") if kind == "parity" else info.get("calibration_inputs")
            path = checked(self.root, rec, f"{'held-out' if kind == 'parity' else 'calibration'} inputs of {component}")
            self._inputs[(component, kind)] = read_samples(path)
        return self._inputs[(component, kind)]

    def input_names(self, component: str) -> list[str]:
        return [s["name"] for s in self.manifest["components"][component]["inputs"]]


class BuildJobs:
    def __init__(self, ctx: Context, route: Route, build: dict, resubmit: bool = False):
        self.ctx, self.route, self.build = ctx, route, build
        self.rec = build.setdefault("hub", {"steps": [], "history": [], "files": []})
        self.rec["route"] = {**route.to_json(), "device": ctx.device.name, "qairt_version": ctx.qairt}
        if resubmit and build_state(self.rec) == "failed":
            self._reset_from_failure()
        self.rec["state"] = build_state(self.rec)
        self._jobs: dict[str, object] = {}
        self._fresh: set[str] = set()              # step names reserved by this process

    # ---- state
    @property
    def state(self) -> str:
        return build_state(self.rec)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def _step(self, kind: str) -> dict | None:
        return next((s for s in self.rec["steps"] if s["kind"] == kind), None)

    def _save(self) -> None:
        self.rec["state"] = build_state(self.rec)
        self.ctx.save()

    def _reset_from_failure(self) -> None:
        steps = self.rec["steps"]
        i = next(i for i, s in enumerate(steps) if s["state"] == "failed")
        self.rec["history"].append({"moved": now(), "steps": steps[i:]})
        self.rec["steps"] = steps[:i]
        for k in ("parity", "profile"):
            self.rec.pop(k, None)

    # ---- moves
    def step(self) -> None:
        """Submit the next job, or poll the current one once."""
        for kind in self.route.steps:
            s = self._step(kind)
            if s is None:
                return self._submit(kind, self._new_step(kind))
            if s["state"] == "success":
                continue
            if s["state"] == "failed":
                return None
            if not s.get("id"):
                return self._submit(kind, s)       # reserved, never confirmed: look it up first
            return self._poll(kind, s)
        return None

    def _new_step(self, kind: str) -> dict:
        attempt = 1 + sum(1 for h in self.rec["history"] for s in h["steps"] if s["kind"] == kind)
        s = {"kind": kind, "name": f"omni-export {self.route.name} {self.route.format} {kind} "
                                   f"{uuid.uuid4().hex[:8]}",
             "id": None, "url": None, "options": self._options(kind), "state": "reserved", "status": None,
             "message": None, "submitted": None, "finished": None, "attempt": attempt}
        self.rec["steps"].append(s)
        self._fresh.add(s["name"])
        self._save()                               # the name is on disk before AI Hub sees it
        return s

    def _options(self, kind: str) -> str:
        if kind == "compile":
            return self.route.compile_options(self.ctx.qairt)
        if kind == "inference":
            return self.route.inference_options(self.ctx.qairt)
        w, a = self.route.quantize
        return f"weights_dtype={w} activations_dtype={a}"

    def _submit(self, kind: str, s: dict) -> None:
        """Submit under the reserved name. A name this process did not reserve (an earlier run was
        killed mid-submission) or a transient error is first looked up on AI Hub."""
        hub = self.ctx.hub
        delay = hub.retry_seconds
        look_up = s["name"] not in self._fresh
        for attempt in range(1, ATTEMPTS + 1):
            try:
                found = hub.find_job(s["name"], kind.split()[0]) if look_up else None
                if found is not None:                  # created earlier: record it, poll it later
                    s.update({"id": found.job_id, "url": found.url, "state": "submitted", "submitted": now(),
                              "message": "found on AI Hub by its name (its creation response was lost)"})
                    return self._save()
                job = hub.call(f"submit {kind} job", self._submitter(kind, s), retry=False)
                break
            except Transient as e:
                look_up = True                     # AI Hub may have created it before failing
                s["message"] = f"{e}; will check whether AI Hub created it"
                self._save()
                if attempt == ATTEMPTS:
                    return self._fail(s, f"not submitted: {e}")
                time.sleep(delay)
                delay *= 2
            except (HubError, ValueError, OSError) as e:
                return self._fail(s, f"not submitted: {e}")
        self._jobs[kind] = job
        s.update({"id": job.job_id, "url": job.url, "state": "submitted", "submitted": now(), "message": None})
        self._save()                               # the id and URL are on disk before anything else

    def _submitter(self, kind: str, s: dict) -> Callable:
        hub, m, r, ctx = self.ctx.hub, self.ctx.hub.m, self.route, self.ctx
        device = hub.Device(ctx.device)
        if kind == "quantize":
            model = self._source_model()
            data = self._dataset("calibration")
            w, a = r.quantize
            return lambda: hub.client.submit_quantize_job(model, data, weights_dtype=m.QuantizeDtype[w],
                                                          activations_dtype=m.QuantizeDtype[a], name=s["name"])
        if kind == "compile":
            q = self._step("quantize")
            model = self._model(q["target_model"]) if q else self._source_model()
            return lambda: hub.client.submit_compile_job(model, device=device, name=s["name"], options=s["options"])
        model = self._model(self._step("compile")["target_model"])
        inputs = self._dataset("parity")
        return lambda: hub.client.submit_inference_job(model, device=device, inputs=inputs, name=s["name"],
                                                       options=s["options"], profile=True)

    def _poll(self, kind: str, s: dict) -> None:
        hub = self.ctx.hub
        try:
            job = self._jobs.get(kind) or hub.get_job(s["id"])
            self._jobs[kind] = job
            status = hub.status(job)
        except Transient as e:
            message = f"status check: {e}; will retry"
            if s.get("message") != message:            # recorded once, not at every failed poll
                s["message"] = message
                self._save()
            return None
        except HubError as e:
            return self._fail(s, str(e))
        if not status.finished:
            if s["state"] != "running" or s.get("status") != status.code or s.get("message"):
                s.update({"state": "running", "status": status.code, "message": None})
                self._save()
            return None
        if status.failure:
            s["status"] = status.code
            return self._fail(s, hub.redact(status.message or "AI Hub reported FAILED without a message"))
        try:
            self._complete(kind, job, s)
        except Transient as e:
            s["message"] = f"downloading results: {e}; will retry"
            return self._save()
        except (HubError, OSError, ValueError) as e:
            return self._fail(s, f"results: {e}")
        s.update({"state": "success", "status": status.code, "finished": now(), "message": None})
        self._save()

    def _fail(self, s: dict, message: str) -> None:
        s.update({"state": "failed", "message": self.ctx.hub.redact(message), "finished": now()})
        self._save()

    # ---- results
    @property
    def _dir(self) -> str:
        return f"{DIR}/{self.route.name}-{self.route.format}"

    def _keep(self, kind: str, record) -> None:
        """Record a result file (replacing an earlier one of the same kind)."""
        files = [f for f in self.rec.setdefault("files", []) if f.get("kind") != kind]
        self.rec["files"] = files + [{**record.to_json(), "kind": kind}]

    def _complete(self, kind: str, job, s: dict) -> None:
        hub, store = self.ctx.hub, self.ctx.store
        if kind in ("quantize", "compile"):
            target = hub.call(f"{kind} target model", job.get_target_model)
            if target is None:
                raise HubError(f"the {kind} job succeeded but has no target model")
            s["target_model"] = target.model_id
            if kind == "compile":
                self._keep("compiled_model", self._download(target))
            return
        profile = hub.call("download profile", job.download_profile)
        text = json.dumps(profile, indent=1, default=list) + "\n"
        self._keep("profile", store.put_bytes(f"{self._dir}/profile.json", text.encode()))
        self.rec["profile"] = summarize(profile)
        entries = hub.call("download output data", job.download_output_data)
        self.rec["parity"] = self._score(entries)

    def _score(self, entries) -> dict:
        r, ctx = self.route, self.ctx
        threshold = float(self.build["parity"]["threshold_db"])
        runner = {"kind": "device", "short": f"device {r.compute_unit}",
                  "label": f"{ctx.device.name} via {ctx.hub.label} ({r.runtime}, --compute_unit "
                           f"{r.compute_unit}, QAIRT {ctx.qairt})"}
        return score_device(ctx, r.component, entries, threshold, runner, keep=lambda outs: self._keep(
            "outputs", ctx.store.put_bytes(f"{self._dir}/outputs.npz", dev.outputs_npz(outs))),
            precision=self.build["precision"])

    def _download(self, model):
        """The compiled model, kept under hub/ (what the device ran)."""
        staging = self.ctx.store.staging(f"hub-{self.route.name}-{self.route.format}")
        path = Path(self.ctx.hub.call("download the compiled model", model.download, str(staging / "model")))
        return self.ctx.store.put_file(f"{self._dir}/{path.name}", path, move=True)

    # ---- uploads (shared by the builds of a directory)
    def _source_model(self):
        r, ctx = self.route, self.ctx
        src = ctx.manifest["components"][r.component]["sources"].get(r.upload)
        path = checked(ctx.root, src, f"{r.upload} source ONNX of {r.component}")
        models = ctx.section["uploads"]["models"]
        if src["sha256"] in models:
            try:
                return ctx.hub.call("get uploaded model", ctx.hub.client.get_model, models[src["sha256"]])
            except HubError:
                pass                                   # gone on AI Hub's side: upload again
        model = ctx.hub.call(f"upload {path.name}", ctx.hub.client.upload_model, str(path), name=path.name)
        models[src["sha256"]] = model.model_id
        ctx.save()
        return model

    def _model(self, model_id: str):
        return self.ctx.hub.call("get model", self.ctx.hub.client.get_model, model_id)

    def _dataset(self, kind: str, component: str | None = None):
        """The held-out (or calibration) inputs of the component as an AI Hub dataset, uploaded once."""
        ctx = self.ctx
        component = component or self.route.component
        known = ctx.section["uploads"]["datasets"]
        key = f"{component}/{kind}"
        if key in known:
            try:
                ds = ctx.hub.call("get dataset", ctx.hub.client.get_dataset, known[key])
                if not ds.is_expired():
                    return ds
            except HubError:
                pass
        inputs, _ = ctx.inputs(component, kind)
        what = "held-out" if kind == "parity" else "calibration"
        ds = ctx.hub.call(f"upload {what} inputs", ctx.hub.client.upload_dataset,
                          dev.dataset(inputs, ctx.input_names(component)), name=f"omni-export {component} {what}")
        known[key] = ds.dataset_id
        ctx.save()
        return ds


class LinkJobs(BuildJobs):
    """A link group's jobs at one precision: link (the members' compiled DLCs -> one context binary
    with shared weights) -> one inference job per graph (selected with context_enable_graphs),
    profiled and scored against the member build's gate. The record is manifest["hub"]["links"][key];
    the link waits for every member's compile job, and fails (recorded, with the reason) when one
    of them failed."""

    def __init__(self, ctx: Context, route, builds: dict, resubmit: bool = False):
        self.ctx, self.route, self.builds = ctx, route, builds
        self.build = None
        links = ctx.section.setdefault("links", {})
        self.rec = links.setdefault(route.key, {"steps": [], "history": [], "files": [], "graphs": {}})
        self.rec["route"] = {**route.to_json(), "device": ctx.device.name, "qairt_version": ctx.qairt}
        if resubmit and link_state(self.rec) == "failed":
            self._reset_from_failure()
            self.rec["graphs"] = {}
        self.rec["state"] = link_state(self.rec)
        self._jobs: dict[str, object] = {}
        self._fresh: set[str] = set()

    @property
    def state(self) -> str:
        return link_state(self.rec)

    def _save(self) -> None:
        self.rec["state"] = link_state(self.rec)
        self.ctx.save()

    def step(self) -> None:
        if self._step("link") is None:
            models, waiting = [], False
            for key in self.route.members:
                compile_ = next((s for s in (self.builds[key].get("hub") or {}).get("steps", [])
                                 if s["kind"] == "compile"), None)
                if compile_ is not None and compile_["state"] == "failed":
                    s = self._new_step("link")
                    self._fresh.discard(s["name"])
                    return self._fail(s, f"not submitted: the compile job of {key} failed")
                if compile_ is None or compile_["state"] != "success" or not compile_.get("target_model"):
                    waiting = True
                else:
                    models.append(compile_["target_model"])
            if waiting:
                return None
            self.rec["inputs"] = dict(zip(self.route.members, models))
        return super().step()

    def _options(self, kind: str) -> str:
        if kind == "link":
            return self.route.options()
        return self.route.inference_options(kind.split(" ", 1)[1], self.ctx.qairt)

    def _submitter(self, kind: str, s: dict) -> Callable:
        hub, ctx = self.ctx.hub, self.ctx
        device = hub.Device(ctx.device)
        if kind == "link":
            models = [self._model(self.rec["inputs"][k]) for k in self.route.members]
            return lambda: hub.client.submit_link_job(models, device=device, name=s["name"], options=s["options"])
        graph = kind.split(" ", 1)[1]
        model = self._model(self._step("link")["target_model"])
        inputs = self._dataset("parity", graph)
        return lambda: hub.client.submit_inference_job(model, device=device, inputs=inputs, name=s["name"],
                                                       options=s["options"], profile=True)

    def _complete(self, kind: str, job, s: dict) -> None:
        hub, store = self.ctx.hub, self.ctx.store
        if kind == "link":
            target = hub.call("link target model", job.get_target_model)
            if target is None:
                raise HubError("the link job succeeded but has no target model")
            s["target_model"] = target.model_id
            rec = self._download(target)
            self._keep("linked_model", rec)
            members = sum(f["bytes"] for k in self.route.members
                          for f in (self.builds[k].get("hub") or {}).get("files", []) if f.get("kind") == "compiled_model")
            self.rec["linked_bytes"] = {"linked": rec.bytes, "members_compiled": members}
            return
        graph = kind.split(" ", 1)[1]
        profile = hub.call("download profile", job.download_profile)
        text = json.dumps(profile, indent=1, default=list) + "\n"
        self._keep(f"profile {graph}", store.put_bytes(f"{self._dir}/{graph}-profile.json", text.encode()))
        entries = hub.call("download output data", job.download_output_data)
        self.rec["graphs"][graph] = {"profile": summarize(profile), "parity": self._score_graph(graph, entries)}

    def _score_graph(self, graph: str, entries) -> dict:
        ctx = self.ctx
        member = self.builds[self.route.members[self.route.graphs.index(graph)]]
        threshold = float(member["parity"]["threshold_db"])
        runner = {"kind": "device", "short": "device npu",
                  "label": f"{ctx.device.name} via {ctx.hub.label} (graph {graph} of the linked qnn_context_binary, "
                           f"--compute_unit npu, QAIRT {ctx.qairt})"}
        return score_device(ctx, graph, entries, threshold, runner, precision=member["precision"])


def link_state(rec: dict) -> str:
    """pending, running, done (every graph scored), failed (a job failed or could not be submitted)."""
    steps = rec.get("steps") or []
    if any(s["state"] == "failed" for s in steps):
        return "failed"
    graphs = (rec.get("route") or {}).get("graphs") or []
    if graphs and all((rec.get("graphs") or {}).get(g, {}).get("parity") for g in graphs):
        return "done"
    return "running" if any(s.get("id") for s in steps) else "pending"


def score_device(ctx, component: str, entries, threshold: float, runner: dict, keep=None,
                 precision: str | None = None) -> dict:
    """Parity of one graph's device outputs (an inference job's output data) against the recorded
    fp32 references; `keep(outputs)` stores them first when given."""
    info = ctx.manifest["components"][component]
    inputs, refs = ctx.inputs(component)
    if entries is None:
        return {"runner": runner, "threshold_db": threshold, "verdict": "rejected", "outputs": [],
                "reason": "the inference job returned no output data"}
    try:
        outs, how = dev.per_sample(entries, [o["name"] for o in info["outputs"]], len(inputs))
    except ValueError as e:
        return {"runner": runner, "threshold_db": threshold, "verdict": "rejected", "outputs": [],
                "reason": f"device outputs unusable: {e}"}
    if keep is not None:
        keep(outs)
    parity = dev.score(ctx.recipe.component(component), info, refs, outs, threshold, precision, inputs)
    return {"runner": runner, **parity, "outputs_matched": how}

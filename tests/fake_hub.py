"""A fake Qualcomm AI Hub *service* behind the real qai-hub 0.56 client.

`install()` replaces every function of `qai_hub.public_rest_api` (the client's HTTP layer) and
returns the real `qai_hub` module. Everything above that layer is the real client: its argument
checks, device checks, dataset checks, option handling (`options.strip()`), error mapping (401 ->
UserError "Failed to authenticate", 5xx -> InternalError, 4xx -> UserError), JobStatus, Job,
Model and Dataset classes and its profile-dict conversion. No function reaches the network: the
ones the fake does not implement raise, and so does the session factory.

Used in-process (tests call `install()`) and in subprocesses: `OMNI_EXPORT_FAKE_HUB=fake_hub`
makes omni_export.hub.client import this file (see its docstring).

State lives in the directory $FAKE_HUB_STATE, so a killed run and its rerun see the same jobs:
  scenario.json  written by tests: {"tokens": [accepted tokens], "devices": [...], "frameworks":
                 [...], "rules": [...]} (missing keys take the defaults below)
  db.json        models, datasets, jobs, counters (under a file lock)
  calls.jsonl    one line per API call: {"fn": name, ...} (tests count submissions with it)
  blobs/         uploaded models, datasets, job outputs

Rules (each a dict; every rule whose "match" fits applies, later keys win):
  match: {"type": compile|quantize|inference|link, "name": fnmatch glob on the job name}
  polls: status polls a job spends in its in-progress states (default 2)
  hang: true            never finishes (until the rule is removed from scenario.json)
  fail: "message"       finishes FAILED with this message ("{token}" is replaced by the caller's
                        token: a careless service echoing credentials, to test redaction)
  http: [503, ...]      the job-creating call answers these statuses first, one per call
  http_after_create: true   ... after creating the job (the response is lost, the job exists)
  perturb_snr_db: x     float outputs get seeded noise at x dB SNR (a broken device build)
  inference_time_us: n  the profile's estimated_inference_time (default: 25 µs per ONNX node,
                        x2 on GPU, x6 on CPU), shared among the profile's ops (one per ONNX node) by
                        OP_WEIGHTS: a MatMul or Conv takes 8 times an elementwise op's time
  cpu_layers: k         k layers of the profile on the CPU (fallback)
Top-level "offline": [endpoint names] makes those calls fail with a connection error (the
network is down for them), e.g. ["get_device_list"] or ["get_job"].
Top-level "kill_after_create": "inference" (or another kind) ends the calling process with
os._exit(137) right after the first such job is created, before its id is returned (a kill
mid-submission; fires once).

Link jobs (submit_link_job): every input model must be a ready QNN DLC (a compile job's target);
each becomes a graph of the linked QNN context binary, named by the `--qnn_options
context_enable_graphs=NAME` its compile job was given (the convention of qai_hub's
submit_compile_and_link_jobs), else by the model's name; duplicate graph names fail the job. An
inference job on a linked binary with more than one graph must select one with `--qnn_options
context_enable_graphs=NAME` (as the client's docstring says), else it fails; it runs that graph.

What the fake computes: outputs by running the uploaded ONNX (or, after a quantize job, a QDQ
model made with ONNX Runtime's static quantization on the uploaded calibration set) on ONNX
Runtime CPU in fp32; `--quantize_full_type float16` rounds the outputs to fp16. It cannot know
device numerics, real QAIRT behaviour, timings or memory: those come from the rules or the
formulas above.
"""
from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import json
import os
import shlex
import shutil
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

STATE_ENV = "FAKE_HUB_STATE"
POLL_SECONDS = 0.01       # omni_export.hub.client reads these from the module
RETRY_SECONDS = 0.01
WEB = "https://fake-aihub.invalid"

DEVICES = [
    {"name": "Samsung Galaxy S25 (Family)", "os": "15",
     "attributes": ["chipset:qualcomm-snapdragon-8-elite-for-galaxy", "format:phone", "framework:onnx",
                    "framework:qnn", "framework:tflite", "hexagon:v79", "os:android", "vendor:samsung"]},
    {"name": "Samsung Galaxy S24 (Family)", "os": "14",
     "attributes": ["chipset:qualcomm-snapdragon-8gen3", "format:phone", "framework:onnx", "framework:qnn",
                    "framework:tflite", "hexagon:v75", "os:android", "vendor:samsung"]},
    {"name": "Samsung Galaxy S23 (Family)", "os": "14",
     "attributes": ["chipset:qualcomm-snapdragon-8gen2", "format:phone", "framework:onnx", "framework:qnn",
                    "framework:tflite", "hexagon:v73", "os:android", "vendor:samsung"]},
]
FRAMEWORKS = [{"name": "QAIRT", "api_version": "2.41", "api_tags": ["default"], "full_version": "2.41.0.251128"},
              {"name": "QAIRT", "api_version": "2.51", "api_tags": ["latest"], "full_version": "2.51.0.260101"}]

RUNTIMES = {"tflite": "MODEL_TYPE_TFLITE", "onnx": "MODEL_TYPE_ONNX", "qnn_dlc": "MODEL_TYPE_QNN_DLC",
            "qnn_context_binary": "MODEL_TYPE_QNN_CONTEXT_BINARY", "precompiled_qnn_onnx": "MODEL_TYPE_ONNX",
            "qnn_lib_aarch64_android": "MODEL_TYPE_QNN_LIB_AARCH64_ANDROID"}
UNITS = {"all", "npu", "gpu", "cpu"}
# The fake's share of a profile's time per op type (others 1): the heavy ops are its slowest ops
OP_WEIGHTS = {"MatMul": 8, "Gemm": 8, "Conv": 8, "ConvTranspose": 8}
# flag -> None for a switch, a set of values, or a callable validating the value (AI Hub docs).
COMPILE_OPTIONS = {
    "--target_runtime": set(RUNTIMES), "--compute_unit": "units", "--qairt_version": "qairt",
    "--quantize_full_type": {"int8", "int16", "w8a16", "w4a8", "w4a16", "float16"},
    "--quantize_io": None, "--quantize_io_type": {"int8", "uint8", "int16", "uint16"},
    "--truncate_64bit_io": None, "--truncate_64bit_tensors": None, "--output_names": "any",
    "--force_channel_last_input": "any", "--force_channel_last_output": "any", "--qnn_options": "any",
}
INFERENCE_OPTIONS = {
    "--compute_unit": "units", "--qairt_version": "qairt", "--max_profiler_iterations": "int",
    "--max_profiler_time": "int", "--dequantize_outputs": None, "--qnn_options": "any",
    "--onnx_execution_providers": "any", "--tflite_delegates": "any",
}
LINK_OPTIONS = {"--qnn_options": "any"}
IN_PROGRESS = {"compile": ["JOB_STATE_CREATED", "JOB_STATE_OPTIMIZING_MODEL"],
               "link": ["JOB_STATE_CREATED", "JOB_STATE_LINKING_MODELS"],
               "quantize": ["JOB_STATE_CREATED", "JOB_STATE_QUANTIZING_MODEL"],
               "inference": ["JOB_STATE_CREATED", "JOB_STATE_PROVISIONING_DEVICE", "JOB_STATE_MEASURING_PERFORMANCE"]}


def install():
    """Patch qai_hub's HTTP layer with this fake service; return the (real) qai_hub module."""
    import qai_hub
    from qai_hub import public_rest_api as api

    state = os.environ.get(STATE_ENV)
    if not state:
        raise RuntimeError(f"the fake AI Hub needs {STATE_ENV} (a directory for its state)")
    server = Server(Path(state))
    if getattr(api, "_omni_export_fake", None) is not None:
        api._omni_export_fake.root = server.root          # re-installed: point at the new state
        return qai_hub
    for name, value in list(vars(api).items()):
        if callable(value) and getattr(value, "__module__", "") == api.__name__ and not isinstance(value, type):
            setattr(api, name, _refuse(name))
    api.create_session = _refuse("create_session")
    for name in IMPLEMENTED:
        setattr(api, name, _endpoint(server, name))
    api._omni_export_fake = server
    return qai_hub


def _refuse(name):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"fake AI Hub: {name} is not implemented (and nothing here may reach the network)")
    return refuse


def _endpoint(server: "Server", name: str):
    def call(config, *args, **kwargs):
        return server.handle(name, config, *args, **kwargs)
    call.__name__ = name
    return call


IMPLEMENTED = ("get_device_list", "get_framework_list", "create_and_upload_model", "get_model", "download_model",
               "create_and_upload_dataset", "get_dataset", "download_dataset", "create_compile_job",
               "create_quantize_job", "create_inference_job", "create_link_job", "get_job", "get_job_results",
               "get_job_summary_list", "get_auth_user")


class Server:
    def __init__(self, root: Path):
        self.root = root

    # ---- plumbing
    @property
    def scenario(self) -> dict:
        p = self.root / "scenario.json"
        s = json.loads(p.read_text()) if p.exists() else {}
        s.setdefault("devices", DEVICES)
        s.setdefault("frameworks", FRAMEWORKS)
        s.setdefault("rules", [])
        return s

    @contextlib.contextmanager
    def _db(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "db.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = self.root / "db.json"
            db = json.loads(p.read_text()) if p.exists() else {"counter": 0, "models": {}, "datasets": {},
                                                                   "jobs": {}, "http_used": {}}
            try:
                yield db
            finally:             # a scripted error after a creation must not lose the created job
                tmp = p.with_suffix(".tmp")
                tmp.write_text(json.dumps(db))
                os.replace(tmp, p)

    def handle(self, endpoint: str, config, /, *args, **kwargs):
        from qai_hub.public_rest_api import APIException

        token = getattr(config, "api_token", None)
        name = endpoint
        with open(self.root / "calls.jsonl", "a") as f:
            f.write(json.dumps({"fn": name, "time": time.time(), "pid": os.getpid()}) + "\n")
        if name in self.scenario.get("offline", []):
            import requests

            raise requests.exceptions.ConnectionError(f"fake network down ({name})")
        tokens = self.scenario.get("tokens")
        if not token or (tokens is not None and token not in tokens):
            raise APIException(status_code=401, url=f"{WEB}/api/v1/")
        with self._db() as db:
            result = getattr(self, name)(db, token, *args, **kwargs)
        self._maybe_die(name)
        return result

    def _maybe_die(self, name: str) -> None:
        """Rule {"kill_after_create": "compile" | "quantize" | "inference"}: end this process like a
        SIGKILL right after AI Hub created such a job, before its id reaches the caller (the rule
        fires once; scenario["killed"] records it)."""
        kind = name.removeprefix("create_").removesuffix("_job")
        p = self.root / "scenario.json"
        s = json.loads(p.read_text()) if p.exists() else {}
        if name.startswith("create_") and s.get("kill_after_create") == kind and not s.get("killed"):
            s["killed"] = kind
            p.write_text(json.dumps(s, indent=1))
            os._exit(137)

    def _new_id(self, db, prefix: str) -> str:
        db["counter"] += 1
        return f"{prefix}{db['counter']:07d}fk"

    def _matching(self, kind: str, name: str) -> list[tuple[int, dict]]:
        return [(i, r) for i, r in enumerate(self.scenario["rules"])
                if r.get("match", {}).get("type", kind) == kind
                and fnmatch.fnmatch(name, r.get("match", {}).get("name", "*"))]

    def _rules(self, kind: str, name: str) -> dict:
        out = {"polls": 2}
        for _, r in self._matching(kind, name):
            out.update({k: v for k, v in r.items() if k != "match"})
        return out

    def _http_error(self, db, kind: str, name: str, after: bool) -> None:
        """Answer a job-creating call with a scripted HTTP status (5xx), once per listed status
        (counted per rule across processes)."""
        from qai_hub.public_rest_api import APIException

        for i, r in self._matching(kind, name):
            if not r.get("http") or bool(r.get("http_after_create")) != after:
                continue
            key = f"{i}:{kind}"
            used = db["http_used"].get(key, 0)
            if used < len(r["http"]):
                db["http_used"][key] = used + 1
                raise APIException(status_code=int(r["http"][used]), url=f"{WEB}/api/v1/jobs/")

    @staticmethod
    def _bad(message: str):
        from qai_hub.public_rest_api import APIException

        return APIException(json.dumps({"detail": message}), status_code=400, url=f"{WEB}/api/v1/jobs/")

    @staticmethod
    def _missing(kind: str, obj_id: str):
        from qai_hub.public_rest_api import APIException

        return APIException(f"{kind} ID '{obj_id}' could not be found. It may not exist or you may not "
                            f"have permission to view it.", status_code=404, url=f"{WEB}/api/v1/")

    # ---- devices, frameworks, user
    def get_auth_user(self, db, token):
        from qai_hub import public_api_pb2 as pb

        return pb.User(email="fake@fake-aihub.invalid")

    def get_device_list(self, db, token, name="", os="", attributes=None, select=False):
        from qai_hub import public_api_pb2 as pb

        found = [d for d in self.scenario["devices"]
                 if (not name or d["name"] == name) and (not os or d["os"] == os)
                 and all(a in d["attributes"] for a in attributes or [])]
        if select:
            found = sorted(found, key=lambda d: d["os"])[-1:]
        return pb.DeviceList(devices=[pb.Device(name=d["name"], os=d["os"], attributes=d["attributes"])
                                      for d in found], total_query_count=len(found))

    def get_framework_list(self, db, token):
        from qai_hub import public_api_pb2 as pb

        return pb.FrameworkList(frameworks=[pb.Framework(**f) for f in self.scenario["frameworks"]])

    # ---- models
    def create_and_upload_model(self, db, token, path, model_type, name=None, project_id=None, verbose=None,
                                is_directory=False, **_):
        from qai_hub import public_api_pb2 as pb

        mid = self._new_id(db, "m")
        dest = self.root / "blobs" / f"{mid}{Path(path).suffix}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        db["models"][mid] = {"id": mid, "name": name or Path(path).name, "type": int(model_type),
                             "file": str(dest), "onnx": str(dest) if Path(path).suffix == ".onnx" else None,
                             "producer": None, "created": int(time.time()), "ready": True}
        return pb.CreateUpdateResponse(id=mid, creation_time=_ts(time.time()))

    def _model_pb(self, db, mid: str):
        from qai_hub import public_api_pb2 as pb

        m = db["models"].get(mid)
        if m is None:
            raise self._missing("Model", mid)
        model = pb.Model(model_id=mid, name=m["name"], model_type=m["type"], creation_time=_ts(m["created"]),
                         file_upload_complete=m["ready"], producer_id=m["producer"] or "")
        if m.get("onnx") and m["ready"]:
            ins, outs = _onnx_io(m["onnx"], m.get("io_fp16", False))
            model.input_spec.CopyFrom(_tensor_list(ins))
            model.output_spec.CopyFrom(_tensor_list(outs))
        if m.get("qairt"):
            model.metadata.entries[pb.MODEL_METADATA_KEY_QAIRT_SDK_VERSION] = m["qairt"]
        return model

    def get_model(self, db, token, model_id):
        return self._model_pb(db, model_id)

    def download_model(self, db, token, model_id, file_path, verbose=None, extract_model=False, **_):
        m = db["models"].get(model_id)
        if m is None:
            raise self._missing("Model", model_id)
        ext = {"MODEL_TYPE_QNN_DLC": ".dlc", "MODEL_TYPE_QNN_CONTEXT_BINARY": ".bin",
               "MODEL_TYPE_ONNX": ".onnx.zip"}.get(_type_name(m["type"]), ".bin")
        dest = str(file_path) if str(file_path).endswith(ext) else str(file_path) + ext
        if m["producer"]:          # a compiled model: the fake cannot compile, it says so inside
            header = json.dumps({"fake_ai_hub": "not a real compiled model", "runtime": m.get("runtime"),
                                 "source_model": m.get("source"), "qairt": m.get("qairt"),
                                 "graphs": sorted(m.get("graphs") or {}) or None}).encode()
            if ext == ".onnx.zip":
                with zipfile.ZipFile(dest, "w") as z:
                    z.writestr("model/FAKE_AI_HUB.json", header)
                    z.write(m["onnx"], "model/model.onnx")
            else:
                Path(dest).write_bytes(b"FAKE-AI-HUB\n" + header + b"\n")
        else:
            shutil.copyfile(m["file"], dest)
        return dest

    # ---- datasets
    def create_and_upload_dataset(self, db, token, path, name, permanent=False, project_id=None, verbose=None, **_):
        import h5py
        from qai_hub import public_api_pb2 as pb
        from qai_hub.util.dataset_entries_converters import h5_to_dataset_entries

        with h5py.File(path, "r") as h5f:
            entries = h5_to_dataset_entries(h5f)
        did = self._new_id(db, "d")
        self._store_entries(did, entries)
        now = time.time()
        db["datasets"][did] = {"id": did, "name": name, "created": int(now), "expires": int(now + 30 * 86400),
                               "names": list(entries)}
        return pb.CreateUpdateResponse(id=did, creation_time=_ts(now), expiration_time=_ts(now + 30 * 86400))

    def _store_entries(self, did: str, entries: dict) -> None:
        arrays = {f"{k:04d}.{i}": np.asarray(a) for k, (n, xs) in enumerate(entries.items()) for i, a in enumerate(xs)}
        path = self.root / "blobs" / f"{did}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **arrays)
        (self.root / "blobs" / f"{did}.names.json").write_text(json.dumps(list(entries)))

    def _entries(self, did: str) -> dict:
        names = json.loads((self.root / "blobs" / f"{did}.names.json").read_text())
        with np.load(self.root / "blobs" / f"{did}.npz") as z:
            keys = sorted(z.files)
            out = {}
            for k, n in enumerate(names):
                ks = sorted((x for x in keys if x.startswith(f"{k:04d}.")), key=lambda x: int(x.split(".")[1]))
                out[n] = [z[x] for x in ks]
        return out

    def get_dataset(self, db, token, dataset_id):
        from qai_hub import public_api_pb2 as pb

        d = db["datasets"].get(dataset_id)
        if d is None:
            raise self._missing("Dataset", dataset_id)
        return pb.Dataset(dataset_id=dataset_id, name=d["name"], creation_time=_ts(d["created"]),
                          expiration_time=_ts(d["expires"]), file_upload_complete=True)

    def download_dataset(self, db, token, dataset_id, file_path, verbose=None, **_):
        import h5py
        from qai_hub.util.dataset_entries_converters import dataset_entries_to_h5

        if dataset_id not in db["datasets"]:
            raise self._missing("Dataset", dataset_id)
        with h5py.File(file_path, "w") as h5f:
            dataset_entries_to_h5(self._entries(dataset_id), h5f)
        return file_path

    # ---- jobs
    def _options(self, text: str, table: dict) -> dict:
        try:
            words = shlex.split(text)
        except ValueError as e:
            raise self._bad(f"could not parse options: {e}") from None
        out, i = {}, 0
        while i < len(words):
            flag = words[i]
            if flag not in table:
                raise self._bad(f"unrecognized option {flag}")
            kind = table[flag]
            if kind is None:
                out[flag] = True
                i += 1
                continue
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise self._bad(f"option {flag} expects a value")
            value = words[i + 1]
            self._check_value(flag, kind, value)
            out[flag] = value
            i += 2
        return out

    def _check_value(self, flag: str, kind, value: str) -> None:
        offered = {f["api_version"] for f in self.scenario["frameworks"]} | {"latest", "default"}
        if kind == "any":
            return
        if kind == "int":
            allowed, ok = ["an integer"], value.isdigit()
        elif kind == "units":
            allowed, ok = sorted(UNITS), set(value.split(",")) <= UNITS
        elif kind == "qairt":
            allowed, ok = sorted(offered), value in offered
        else:
            allowed, ok = sorted(kind), value in kind
        if not ok:
            raise self._bad(f"invalid value '{value}' for {flag}; expected one of: {', '.join(allowed)}")

    def _job(self, db, kind: str, name: str, **fields) -> str:
        jid = self._new_id(db, "j")
        db["jobs"][jid] = {"id": jid, "kind": kind, "name": name, "created": int(time.time()), "polls": 0,
                           "state": "JOB_STATE_CREATED", "message": "", **fields}
        return jid

    def create_compile_job(self, db, token, compile_job_pb, project_id=None):
        from qai_hub import public_api_pb2 as pb

        name = compile_job_pb.name
        self._http_error(db, "compile", name, after=False)
        mid = compile_job_pb.model.model_id
        if mid not in db["models"]:
            raise self._missing("Model", mid)
        opts = self._options(compile_job_pb.options, COMPILE_OPTIONS)
        runtime = opts.get("--target_runtime", "tflite")
        device = compile_job_pb.devices.devices[0]
        target = self._new_id(db, "m")
        jid = self._job(db, "compile", name, model=mid, options=compile_job_pb.options, opts=opts,
                        device={"name": device.name, "os": device.os}, target=target, runtime=runtime,
                        token=token)
        src = db["models"][mid]
        db["models"][target] = {"id": target, "name": name, "type": pb.ModelType.Value(RUNTIMES[runtime]),
                                "file": None, "onnx": src.get("onnx"), "producer": jid, "created": int(time.time()),
                                "ready": False, "runtime": runtime, "source": mid,
                                "fp16": opts.get("--quantize_full_type") == "float16",
                                "io_fp16": opts.get("--quantize_full_type") == "float16" and "--quantize_io" in opts,
                                "qairt": opts.get("--qairt_version"), "compute_unit": opts.get("--compute_unit"),
                                "graph": _graph_option(opts.get("--qnn_options"))}
        self._http_error(db, "compile", name, after=True)
        return pb.CreateUpdateResponse(id=jid, creation_time=_ts(time.time()))

    def create_quantize_job(self, db, token, quantize_job_pb, project_id=None):
        from qai_hub import public_api_pb2 as pb

        name = quantize_job_pb.name
        self._http_error(db, "quantize", name, after=False)
        mid, did = quantize_job_pb.model.model_id, quantize_job_pb.calibration_dataset.dataset_id
        if mid not in db["models"]:
            raise self._missing("Model", mid)
        if did not in db["datasets"]:
            raise self._missing("Dataset", did)
        if quantize_job_pb.options.strip():
            raise self._bad(f"unrecognized quantize options {quantize_job_pb.options!r}")
        target = self._new_id(db, "m")
        jid = self._job(db, "quantize", name, model=mid, dataset=did, target=target, token=token,
                        weights=pb.QuantizeDtype.Name(quantize_job_pb.weights_dtype),
                        activations=pb.QuantizeDtype.Name(quantize_job_pb.activations_dtype),
                        options=quantize_job_pb.options)
        db["models"][target] = {"id": target, "name": name, "type": pb.ModelType.Value("MODEL_TYPE_ONNX"),
                                "file": None, "onnx": None, "producer": jid, "created": int(time.time()),
                                "ready": False}
        self._http_error(db, "quantize", name, after=True)
        return pb.CreateUpdateResponse(id=jid, creation_time=_ts(time.time()))

    def create_inference_job(self, db, token, inference_job_pb, project_id=None):
        from qai_hub import public_api_pb2 as pb

        name = inference_job_pb.name
        self._http_error(db, "inference", name, after=False)
        mid = inference_job_pb.model.model_id
        m = db["models"].get(mid)
        if m is None:
            raise self._missing("Model", mid)
        if not m["ready"]:
            raise self._bad(f"model {mid} is not ready: its compile job has not finished")
        did = inference_job_pb.dataset.dataset_id
        if did and did not in db["datasets"]:
            raise self._missing("Dataset", did)
        opts = self._options(inference_job_pb.options, INFERENCE_OPTIONS)
        jid = self._job(db, "inference", name, model=mid, dataset=did or None, options=inference_job_pb.options,
                        opts=opts, device={"name": inference_job_pb.device.name, "os": inference_job_pb.device.os},
                        profile=bool(inference_job_pb.is_profiling_on), token=token)
        self._http_error(db, "inference", name, after=True)
        return pb.CreateUpdateResponse(id=jid, creation_time=_ts(time.time()))

    def create_link_job(self, db, token, link_job_pb, project_id=None):
        from qai_hub import public_api_pb2 as pb

        name = link_job_pb.name
        self._http_error(db, "link", name, after=False)
        mids = [m.model_id for m in link_job_pb.models.models]
        if not mids:
            raise self._bad("a link job takes at least one model")
        for mid in mids:
            m = db["models"].get(mid)
            if m is None:
                raise self._missing("Model", mid)
            if _type_name(m["type"]) != "MODEL_TYPE_QNN_DLC":
                raise self._bad(f"model {mid} is not a QNN DLC model; a link job links QNN DLC models")
            if not m["ready"]:
                raise self._bad(f"model {mid} is not ready: its compile job has not finished")
        opts = self._options(link_job_pb.options, LINK_OPTIONS)
        target = self._new_id(db, "m")
        device = {"name": link_job_pb.device.name, "os": link_job_pb.device.os}
        jid = self._job(db, "link", name, models=mids, options=link_job_pb.options, opts=opts, device=device,
                        target=target, token=token)
        db["models"][target] = {"id": target, "name": name, "type": pb.ModelType.Value("MODEL_TYPE_QNN_CONTEXT_BINARY"),
                                "file": None, "onnx": None, "producer": jid, "created": int(time.time()),
                                "ready": False, "runtime": "qnn_context_binary", "source": mids,
                                "qairt": db["models"][mids[0]].get("qairt"), "compute_unit": "npu"}
        self._http_error(db, "link", name, after=True)
        return pb.CreateUpdateResponse(id=jid, creation_time=_ts(time.time()))

    def get_job(self, db, token, job_id):
        j = db["jobs"].get(job_id)
        if j is None:
            raise self._missing("Job", job_id)
        self._advance(db, j)
        return self._job_pb(db, j)

    def _advance(self, db, j: dict) -> None:
        if j["state"] in ("JOB_STATE_DONE", "JOB_STATE_FAILED"):
            return
        rules = self._rules(j["kind"], j["name"])
        stages = IN_PROGRESS[j["kind"]]
        j["polls"] += 1
        if rules.get("hang") or j["polls"] <= int(rules["polls"]):
            j["state"] = stages[min(j["polls"], len(stages) - 1)]
            return
        if rules.get("fail"):
            return self._finish(j, "JOB_STATE_FAILED", str(rules["fail"]).replace("{token}", j.get("token") or ""))
        try:
            getattr(self, f"_run_{j['kind']}")(db, j, rules)
        except Exception as e:  # the fake's own execution failed: a FAILED job, as a service would report
            return self._finish(j, "JOB_STATE_FAILED", f"{type(e).__name__}: {e}"[:400])
        self._finish(j, "JOB_STATE_DONE", "")

    @staticmethod
    def _finish(j: dict, state: str, message: str) -> None:
        j.update({"state": state, "message": message, "finished": int(time.time())})

    def _run_compile(self, db, j: dict, rules: dict) -> None:
        import onnx

        src = db["models"][j["model"]]
        if not src.get("onnx"):
            raise ValueError("the fake compiles ONNX models only")
        onnx.checker.check_model(src["onnx"])
        db["models"][j["target"]]["ready"] = True

    def _run_link(self, db, j: dict, rules: dict) -> None:
        graphs = {}
        for mid in j["models"]:
            m = db["models"][mid]
            name = m.get("graph") or m["name"]
            if name in graphs:
                raise ValueError(f"two input models define the graph '{name}'; graph names must be unique")
            graphs[name] = {"onnx": m["onnx"], "fp16": m.get("fp16", False), "io_fp16": m.get("io_fp16", False),
                            "source": mid}
        db["models"][j["target"]].update({"ready": True, "graphs": graphs})

    def _run_quantize(self, db, j: dict, rules: dict) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

        src = db["models"][j["model"]]["onnx"]
        entries = self._entries(j["dataset"])
        samples = [dict(zip(entries, xs)) for xs in zip(*entries.values())]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(samples)

            def get_next(self):
                return next(self.it, None)

        act = QuantType.QUInt16 if j["activations"] == "QUANTIZE_DTYPE_INT16" else QuantType.QUInt8
        out = self.root / "blobs" / f"{j['target']}.qdq.onnx"
        quantize_static(src, str(out), Reader(), quant_format=QuantFormat.QDQ, activation_type=act,
                        weight_type=QuantType.QUInt8, per_channel=True,
                        extra_options={"UseQDQContribOps": act == QuantType.QUInt16})
        db["models"][j["target"]].update({"ready": True, "onnx": str(out), "file": str(out)})

    @staticmethod
    def _graph_of(model: dict, j: dict) -> dict:
        """The model an inference job runs: a linked binary's graph selected by context_enable_graphs."""
        graphs = model.get("graphs")
        if not graphs:
            return model
        want = _graph_option(j.get("opts", {}).get("--qnn_options"))
        if want is None and len(graphs) == 1:
            want = next(iter(graphs))
        if want is None:
            raise ValueError(f"the context binary holds {len(graphs)} graphs ({', '.join(graphs)}); select one "
                             f"with --qnn_options context_enable_graphs=<graph name>")
        if want not in graphs:
            raise ValueError(f"the context binary has no graph '{want}' (it holds {', '.join(graphs)})")
        return {**model, **graphs[want]}

    def _run_inference(self, db, j: dict, rules: dict) -> None:
        import onnxruntime as ort

        model = self._graph_of(db["models"][j["model"]], j)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(model["onnx"], so, providers=["CPUExecutionProvider"])
        outputs = {}
        if j["dataset"]:
            entries = self._entries(j["dataset"])
            names = [i.name for i in sess.get_inputs()]
            if list(entries) != names:
                raise ValueError(f"the dataset has inputs {list(entries)}; the model takes {names}")
            count = len(next(iter(entries.values())))
            results = [sess.run(None, {n: entries[n][k] for n in names}) for k in range(count)]
            rng = np.random.default_rng(zlib.crc32(j["id"].encode()))
            for o, out_meta in enumerate(sess.get_outputs()):
                outputs[out_meta.name] = [self._device_output(r[o], model, rules, rng) for r in results]
            did = self._new_id(db, "d")
            self._store_entries(did, outputs)
            now = time.time()
            db["datasets"][did] = {"id": did, "name": f"{j['name']} outputs", "created": int(now),
                                   "expires": int(now + 30 * 86400), "names": list(outputs)}
            j["output_dataset"] = did
        j["profile_data"] = self._profile(model, j, rules)

    @staticmethod
    def _device_output(a, model: dict, rules: dict, rng) -> np.ndarray:
        a = np.asarray(a)
        if not np.issubdtype(a.dtype, np.floating):
            return a
        if model.get("fp16"):
            a = a.astype(np.float16).astype(a.dtype)
        snr = rules.get("perturb_snr_db")
        if snr is not None:
            rms = float(np.sqrt(np.mean(a.astype(np.float64) ** 2))) or 1.0
            a = (a + rng.standard_normal(a.shape) * rms * 10 ** (-float(snr) / 20)).astype(a.dtype)
        return a.astype(np.float16) if model.get("io_fp16") else a

    def _profile(self, model: dict, j: dict, rules: dict) -> dict:
        import onnx

        graph = onnx.load(model["onnx"], load_external_data=False).graph
        unit = (j.get("opts", {}).get("--compute_unit") or model.get("compute_unit") or "npu").split(",")[0].upper()
        unit = "NPU" if unit == "ALL" else unit
        factor = {"NPU": 1, "GPU": 2, "CPU": 6}[unit]
        total = int(rules.get("inference_time_us") or 25 * len(graph.node) * factor)
        cpu_layers = int(rules.get("cpu_layers", 0))
        size = Path(model["onnx"]).stat().st_size
        weights = [OP_WEIGHTS.get(n.op_type, 1) for n in graph.node]
        layers = [{"name": n.name or f"{n.op_type}_{i}", "type": n.op_type,
                   "unit": "CPU" if i < cpu_layers else unit,
                   "time": max(1, total * w // max(1, sum(weights)))} for i, (n, w) in enumerate(zip(graph.node, weights))]
        return {"time": total, "all": [int(total * f) for f in (0.97, 1.0, 1.0, 1.02, 1.08)],
                "peak": int(size * 1.5 + 4 * 2**20), "load": 180_000 + size // 50, "layers": layers}

    def _job_pb(self, db, j: dict):
        from qai_hub import public_api_pb2 as pb

        state = pb.JobState.Value(j["state"])
        if j["kind"] == "link":
            models = pb.ModelList(models=[self._model_pb(db, m) for m in j["models"]],
                                  total_query_count=len(j["models"]))
            job = pb.LinkJob(link_job_id=j["id"], name=j["name"], job_state=state, failure_reason=j["message"],
                             creation_time=_ts(j["created"]), options=j["options"], models=models,
                             device=pb.Device(name=j["device"]["name"], os=j["device"]["os"]))
            job.target_model.CopyFrom(self._model_pb(db, j["target"]))
            return pb.Job(link_job=job)
        common = {"name": j["name"], "job_state": state, "failure_reason": j["message"],
                  "creation_time": _ts(j["created"]), "model": self._model_pb(db, j["model"])}
        if j["kind"] == "compile":
            dev = pb.Device(name=j["device"]["name"], os=j["device"]["os"])
            job = pb.CompileJob(compile_job_id=j["id"], options=j["options"], device=dev,
                                devices=pb.DeviceList(devices=[dev]), **common)
            job.target_model.CopyFrom(self._model_pb(db, j["target"]))
            return pb.Job(compile_job=job)
        if j["kind"] == "quantize":
            job = pb.QuantizeJob(quantize_job_id=j["id"], options=j["options"],
                                 weights_dtype=pb.QuantizeDtype.Value(j["weights"]),
                                 activations_dtype=pb.QuantizeDtype.Value(j["activations"]), **common)
            job.calibration_dataset.CopyFrom(self.get_dataset(db, None, j["dataset"]))
            job.target_model.CopyFrom(self._model_pb(db, j["target"]))
            return pb.Job(quantize_job=job)
        job = pb.InferenceJob(inference_job_id=j["id"], options=j["options"], is_profiling_on=j["profile"],
                              device=pb.Device(name=j["device"]["name"], os=j["device"]["os"]), **common)
        if j.get("dataset"):
            job.dataset.CopyFrom(self.get_dataset(db, None, j["dataset"]))
        if j["state"] == "JOB_STATE_DONE":
            job.execution_time = j["profile_data"]["time"]
            ran = self._graph_of(db["models"][j["model"]], j)
            ins, _ = _onnx_io(ran["onnx"], ran.get("io_fp16", False))
            job.tensor_type_list.CopyFrom(_tensor_list(ins))
        return pb.Job(inference_job=job)

    def get_job_results(self, db, token, job_id):
        from qai_hub import public_api_pb2 as pb

        j = db["jobs"].get(job_id)
        if j is None:
            raise self._missing("Job", job_id)
        if j["kind"] != "inference" or j["state"] != "JOB_STATE_DONE":
            return pb.JobResult()
        p = j["profile_data"]
        detail = pb.ProfileDetail(major_version=1, minor_version=2, execution_time=p["time"],
                                  after_execution_peak_memory=p["peak"], cold_load_time=p["load"],
                                  warm_load_time=p["load"] // 3, compile_time=p["load"] * 2,
                                  after_cold_load_peak_memory=p["peak"], after_warm_load_peak_memory=p["peak"],
                                  after_compile_peak_memory=p["peak"], all_execution_times=p["all"])
        detail.execution_memory.peak.CopyFrom(pb.Range(lower=int(p["peak"] * 0.9), upper=p["peak"]))
        detail.execution_memory.increase.CopyFrom(pb.Range(lower=int(p["peak"] * 0.5), upper=int(p["peak"] * 0.6)))
        for layer in p["layers"]:
            detail.layer_details.append(pb.LayerDetail(name=layer["name"], layer_type_name=layer["type"],
                                                       compute_unit=pb.ComputeUnit.Value(f"COMPUTE_UNIT_{layer['unit']}"),
                                                       execution_time=layer["time"]))
        result = pb.InferenceJobResult(inference_job_id=job_id, output_dataset_id=j.get("output_dataset") or "")
        result.detail.CopyFrom(detail)
        return pb.JobResult(inference_job_result=result)

    def get_job_summary_list(self, db, token, offset=0, limit=None, states=None, job_type=0, creator=None,
                             project_id=None):
        from qai_hub import public_api_pb2 as pb

        kinds = {pb.JobType.Value("JOB_TYPE_COMPILE"): "compile", pb.JobType.Value("JOB_TYPE_QUANTIZE"): "quantize",
                 pb.JobType.Value("JOB_TYPE_INFERENCE"): "inference", pb.JobType.Value("JOB_TYPE_LINK"): "link"}
        want = kinds.get(job_type)
        jobs = sorted((j for j in db["jobs"].values() if want is None or j["kind"] == want),
                      key=lambda j: j["id"], reverse=True)[offset:offset + (limit or 50)]
        out = pb.JobSummaryList(total_query_count=len(jobs))
        for j in jobs:
            common = {"job_id": j["id"], "name": j["name"], "job_state": pb.JobState.Value(j["state"]),
                      "creation_time": _ts(j["created"])}
            if j["kind"] == "compile":
                out.job_summaries.append(pb.JobSummary(compile_job_summary=pb.CompileJobSummary(
                    device_name=j["device"]["name"], **common)))
            elif j["kind"] == "quantize":
                out.job_summaries.append(pb.JobSummary(quantize_job_summary=pb.QuantizeJobSummary(**common)))
            elif j["kind"] == "link":
                out.job_summaries.append(pb.JobSummary(link_job_summary=pb.LinkJobSummary(
                    device_name=j["device"]["name"], **common)))
            else:
                out.job_summaries.append(pb.JobSummary(inference_job_summary=pb.InferenceJobSummary(
                    device_name=j["device"]["name"], is_profiling_on=j["profile"], **common)))
        return out


def _graph_option(qnn_options: str | None) -> str | None:
    """NAME from --qnn_options "context_enable_graphs=NAME" (other QNN options are ignored)."""
    for item in (qnn_options or "").replace(";", " ").replace(",", " ").split():
        if item.startswith("context_enable_graphs="):
            return item.split("=", 1)[1]
    return None


def _ts(seconds: float):
    from google.protobuf.timestamp_pb2 import Timestamp

    return Timestamp(seconds=int(seconds))


def _type_name(value: int) -> str:
    from qai_hub import public_api_pb2 as pb

    return pb.ModelType.Name(value)


def _onnx_io(path: str, io_fp16: bool = False) -> tuple[list, list]:
    import onnx

    g = onnx.load(path, load_external_data=False).graph
    names = {1: "float32", 10: "float16", 6: "int32", 7: "int64", 9: "bool", 2: "uint8", 3: "int8", 5: "int16", 4: "uint16"}
    inits = {i.name for i in g.initializer}

    def spec(v):
        t = v.type.tensor_type
        dtype = names.get(t.elem_type, "float32")
        if io_fp16 and dtype == "float32":
            dtype = "float16"
        return v.name, tuple(int(d.dim_value) for d in t.shape.dim), dtype

    return [spec(v) for v in g.input if v.name not in inits], [spec(v) for v in g.output]


def _tensor_list(specs: list):
    from qai_hub import api_utils

    return api_utils.input_shapes_to_tensor_type_list_pb({n: (shape, dtype) for n, shape, dtype in specs})


def calls(state: Path, fn: str | None = None) -> list[dict]:
    """The API calls the fake served (tests count submissions with it)."""
    p = Path(state) / "calls.jsonl"
    rows = [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
    return [r for r in rows if fn is None or r["fn"] == fn]


def jobs(state: Path) -> dict:
    p = Path(state) / "db.json"
    return json.loads(p.read_text())["jobs"] if p.exists() else {}


def write_scenario(state: Path, **scenario) -> Path:
    state = Path(state)
    state.mkdir(parents=True, exist_ok=True)
    p = state / "scenario.json"
    p.write_text(json.dumps(scenario, indent=1))
    return p

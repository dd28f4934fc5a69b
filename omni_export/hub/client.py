"""The one place that talks to Qualcomm AI Hub: a thin layer over the `qai_hub` client.

Credentials are the client's own: ~/.qai_hub/client.ini, or the file QAIHUB_CLIENT_INI names
(`qai-hub configure --api_token TOKEN` writes it). We never copy the token anywhere; we read it
from the client's config only to blank it out of every message we record or print.

Test seam: OMNI_EXPORT_FAKE_HUB=NAME makes `load()` import tests/NAME.py from the source checkout
instead of using AI Hub (NAME.install() returns a qai_hub module whose HTTP layer is fake). It is
honoured only for a plain module name, from the tests/ folder beside this package's own
pyproject.toml: an installed omni-export has no such folder, so production can never pick it up.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import UsageError

FAKE_ENV = "OMNI_EXPORT_FAKE_HUB"
POLL_SECONDS = 15.0          # between status polls of running jobs (the client's own wait polls every 10 s)
RETRY_SECONDS = 20.0         # first back-off after a 5xx / connection error; doubles, 3 attempts
ATTEMPTS = 3
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class HubUsageError(UsageError):
    """Missing or rejected token, unknown device, bad option: one line, exit 2."""


class HubError(Exception):
    """AI Hub failed a request after retries (the message is already redacted)."""


class Transient(HubError):
    """A 5xx, a connection error or rate limiting that outlived its retries."""


def _fake_module(name: str):
    if not _NAME.match(name):
        raise HubUsageError(f"{FAKE_ENV}={name!r} is not a module name under tests/")
    repo = Path(__file__).resolve().parents[2]
    pyproject = repo / "pyproject.toml"
    path = repo / "tests" / f"{name}.py"
    if not (pyproject.is_file() and 'name = "omni-export"' in pyproject.read_text() and path.is_file()):
        raise HubUsageError(f"{FAKE_ENV} is set but {path} is not a test module of an omni-export "
                            f"source checkout; unset it to use Qualcomm AI Hub")
    spec = importlib.util.spec_from_file_location(f"omni_export_fake_hub_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """(qai_hub module, label, (poll s, retry s)): the real client, or the client in front of a fake
    service named by OMNI_EXPORT_FAKE_HUB in a source checkout (which also sets the pace)."""
    fake = os.environ.get(FAKE_ENV)
    if fake:
        module = _fake_module(fake)
        print(f"omni-export: using the FAKE Qualcomm AI Hub from tests/{fake}.py ({FAKE_ENV})", file=sys.stderr)
        pace = (float(getattr(module, "POLL_SECONDS", POLL_SECONDS)), float(getattr(module, "RETRY_SECONDS", RETRY_SECONDS)))
        return module.install(), f"FAKE AI Hub (tests/{fake}.py; qai-hub client, fake service)", pace
    try:
        import qai_hub
    except ImportError:
        raise HubUsageError("the qai-hub client is not installed: pip install 'qai-hub>=0.56,<0.57'") from None
    return qai_hub, f"Qualcomm AI Hub (qai-hub {qai_hub.__version__})", (POLL_SECONDS, RETRY_SECONDS)


class Redactor:
    """Blanks the API token (and anything shaped like an auth header) out of text."""

    PATTERNS = (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?token\s+)[^\s'\",]+"),
                re.compile(r"(?i)(api_token['\"]?\s*[:=]\s*['\"]?)[^\s'\",]+"))

    def __init__(self):
        self.secrets: list[str] = []

    def add(self, secret: str | None) -> None:
        if secret and len(secret) >= 4 and secret not in self.secrets:
            self.secrets.append(secret)

    def __call__(self, text) -> str:
        text = str(text)
        for s in self.secrets:
            text = text.replace(s, "***")
        for p in self.PATTERNS:
            text = p.sub(r"\1***", text)
        return text


@dataclass
class DeviceInfo:
    name: str
    os: str
    attributes: list

    @property
    def chipset(self) -> str:
        return next((a.split(":", 1)[1] for a in self.attributes if a.startswith("chipset:")), "")

    def to_json(self) -> dict:
        return {"name": self.name, "os": self.os, "chipset": self.chipset, "attributes": sorted(self.attributes)}


class Hub:
    """A connected client: every call routes the client's prints to stderr, retries transient
    failures of idempotent calls, and turns errors into HubUsageError / HubError with the token
    blanked out."""

    def __init__(self, module=None, label: str | None = None, pace: tuple[float, float] | None = None):
        if module is None:
            module, label, pace = load()
        self.m, self.label = module, label
        self.fake = label.startswith("FAKE")
        self.redact = Redactor()
        self.poll_seconds, self.retry_seconds = pace or (POLL_SECONDS, RETRY_SECONDS)
        self.client = None
        self.web_url = ""
        rate_limited = getattr(getattr(module, "client", None), "RateLimitedError", module.InternalError)
        self._transient = (module.InternalError, rate_limited, ConnectionError)
        self.config_path = module.api_utils.get_config_path() if hasattr(module, "api_utils") else "client.ini"

    # ---- connection and credentials
    def connect(self) -> "Hub":
        """Load the client's configuration and prove the token works (one devices call)."""
        m = self.m
        with self._quiet():
            self.client = m.Client()
            try:
                config = self.client.config
            except m.Error:
                raise HubUsageError(self._no_token()) from None
            if not getattr(config, "api_token", None):
                raise HubUsageError(self._no_token())
            self.redact.add(config.api_token)
            self.web_url = getattr(config, "web_url", "") or ""
            config.verbose = False
            try:
                self.client.get_devices(name="__omni-export-token-check__")
            except m.UserError as e:
                if "authenticate" in str(e).lower() or "token" in str(e).lower():
                    raise HubUsageError(self._rejected()) from None
                raise HubUsageError(self._one_line(e)) from None
            except m.Error as e:
                raise HubUsageError(f"cannot reach Qualcomm AI Hub: {self._one_line(e)}") from None
        return self

    def _account_url(self) -> str:
        api = getattr(self.m, "public_rest_api", None)
        base = self.web_url or getattr(api, "DEFAULT_HUB_WEB_URL", "https://workbench.aihub.qualcomm.com")
        return base.rstrip("/") + "/account/"

    def _no_token(self) -> str:
        return (f"no Qualcomm AI Hub token configured (looked in {self.config_path}): run "
                f"`qai-hub configure --api_token YOUR_TOKEN` (token from {self._account_url()}) or point "
                f"QAIHUB_CLIENT_INI at a client.ini with an [api] api_token")

    def _rejected(self) -> str:
        return (f"Qualcomm AI Hub rejected the API token in {self.config_path}: copy a valid one from "
                f"{self._account_url()} and run `qai-hub configure --api_token YOUR_TOKEN`")

    def _one_line(self, e: BaseException) -> str:
        """The client boxes and wraps its messages (at spaces and after hyphens): unwrap them."""
        text = ""
        for ln in (ln.strip(" |┌┐└┘─") for ln in str(e).splitlines()):
            if ln:
                text += ln if not text or text.endswith("-") else " " + ln
        return self.redact(text or type(e).__name__)[:500]

    @contextlib.contextmanager
    def _quiet(self):
        """The client prints progress and deprecation notes on stdout: keep stdout for our reports."""
        with contextlib.redirect_stdout(sys.stderr):
            yield

    # ---- calls
    def call(self, what: str, fn, *args, retry: bool = True, **kwargs):
        """Run one client call; retry transient failures of idempotent calls; redact errors."""
        m = self.m
        delay = self.retry_seconds
        for attempt in range(1, ATTEMPTS + 1):
            try:
                with self._quiet():
                    return fn(*args, **kwargs)
            except self._transient as e:
                if not retry or attempt == ATTEMPTS:
                    raise Transient(f"{what}: {self._one_line(e)}") from None
                time.sleep(delay)
                delay *= 2
            except m.UserError as e:
                raise HubError(f"{what}: {self._one_line(e)}") from None
            except m.Error as e:
                raise HubError(f"{what}: {self._one_line(e)}") from None
            except TimeoutError as e:
                raise HubError(f"{what}: {self._one_line(e)}") from None

    def devices(self, name: str = "", attributes: list | None = None) -> list[DeviceInfo]:
        ds = self.call("list devices", self.client.get_devices, name=name, attributes=attributes or [])
        return [DeviceInfo(d.name, d.os, list(d.attributes)) for d in ds]

    def device(self, name: str) -> DeviceInfo:
        """The newest-OS device AI Hub has under this exact name, or a usage error naming close ones."""
        found = self.devices(name=name)
        if found:
            return sorted(found, key=lambda d: _version_key(d.os))[-1]
        every = sorted({d.name for d in self.devices()})
        close = [n for n in every if any(w.lower() in n.lower() for w in name.split() if len(w) > 2)][:6]
        hint = f"; similar: {', '.join(close)}" if close else ""
        raise HubUsageError(f"AI Hub has no device named '{name}'{hint} (omni-export hub devices lists them)")

    def frameworks(self) -> list:
        return self.call("list QAIRT versions", self.client.get_frameworks)

    def Device(self, info: DeviceInfo):
        return self.m.Device(info.name, info.os)

    def status(self, job):
        """The job's JobStatus now (no waiting)."""
        return self.call(f"status of job {job.job_id}", job.get_status)

    def get_job(self, job_id: str):
        return self.call(f"get job {job_id}", self.client.get_job, job_id)

    def find_job(self, name: str, job_type: str):
        """The summary (job_id, url, status) of a job we submitted under this unique name (after a
        crash or a lost response on submission), or None when AI Hub has no such job."""
        jt = {"compile": self.m.JobType.COMPILE, "quantize": self.m.JobType.QUANTIZE,
              "inference": self.m.JobType.INFERENCE, "link": self.m.JobType.LINK}[job_type]
        for s in self.call("list recent jobs", self.client.get_job_summaries, limit=100, type=jt):
            if s.name == name:
                return s
        return None


def _version_key(text: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.\-]", text or "0"))

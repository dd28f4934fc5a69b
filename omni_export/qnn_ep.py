"""ONNX Runtime's QNN execution provider (the onnxruntime-qnn plugin wheel), offline on x86.

Creating a session compiles the graph for the HTP of one SoC and, with the options below, writes
a DLC or a context binary; running it executes on the HTP functional simulator in the wheel.
CPU fallback is always disabled: a node QNN cannot take fails the session instead of hiding on CPU.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path

_lock = threading.Lock()
_registered = False


def _register():
    global _registered
    import onnxruntime as ort
    import onnxruntime_qnn as oq

    with _lock:
        if not _registered:
            # 4 = fatal only: on x86 the simulator EP logs "Failed to create HTP power config id" at
            # error level on every session, which is harmless; real failures raise exceptions
            ort.set_default_logger_severity(4)
            ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
            _registered = True
    return ort, oq


def qnn_version() -> str | None:
    try:
        from onnxruntime_qnn import build_and_package_info as info
    except ImportError:
        return None
    return getattr(info, "qnn_version", None)


# QNN HTP graph finalization (the prepare step of every context binary and simulator session):
# "1" is QNN's fast preparation, "2" (QNN's default) and "3" search longer for a faster graph.
# Measured on the 0.6B fused predictor frame (fp16, one core): 23 s at "1", 450 s at QNN's default.
FINALIZE_MODES = ("1", "2", "3")
DEFAULT_FINALIZE = "1"


def provider_options(soc_model: str, htp_arch: str, *, fp16: bool, finalize: str | None = None) -> dict:
    """QNN EP options for the HTP; `finalize` sets htp_graph_finalization_optimization_mode (None:
    QNN's default)."""
    opts = {"backend_type": "htp", "soc_model": str(soc_model), "htp_arch": str(htp_arch)}
    if fp16:
        opts["enable_htp_fp16_precision"] = "1"
    if finalize is not None:
        if str(finalize) not in FINALIZE_MODES:
            raise ValueError(f"HTP finalization mode {finalize!r}; valid: {', '.join(FINALIZE_MODES)}")
        opts["htp_graph_finalization_optimization_mode"] = str(finalize)
    return opts


def session(model: Path | bytes, options: dict, config: dict | None = None, log_severity: int = 4):
    """An InferenceSession on the QNN EP only (no CPU fallback); `model` is a path or ONNX bytes.
    Severity 4 (fatal) by default: on x86 the simulator logs a harmless "Failed to create HTP power
    config id" error for every session; real failures raise."""
    ort, _ = _register()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        raise RuntimeError("the QNN execution provider found no device (onnxruntime-qnn not usable here)")
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    so.add_provider_for_devices(devices, dict(options))
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    with native_stdout_silenced():
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model), sess_options=so)


@contextlib.contextmanager
def native_stdout_silenced():
    """Point file descriptor 1 at /dev/null while QNN's HTP library loads: it printf()s a
    "# LIBNATIVE: ... thread-local behavior" line on every load, straight past Python, into the
    user's terminal (or into their --json output). Our own output goes through sys.stdout, which
    is flushed first; errors still raise."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):      # no real fd 1 (embedded, closed)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _compile_source(model: Path) -> Path | bytes:
    """Compile from the model's bytes when its weights are inline: ONNX Runtime then names the QNN
    graph from the model's content, not from its path, so the same model compiled in another
    directory gives the same graph name (and the same EPContext wrapper bytes)."""
    return model if model.with_name(model.name + ".data").exists() else model.read_bytes()


def compile_dlc(model: Path, out_dir: Path, options: dict) -> Path:
    """Serialise the QNN graph of `model` to a .dlc (via libQnnIr) in out_dir; return its path."""
    _, oq = _register()
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.dlc"))
    opts = dict(options, dump_qnn_ir_dlc="1", dump_qnn_ir_dlc_dir=str(out_dir),
                qnn_ir_backend_path=os.path.join(oq.LIB_DIR_FULL_PATH, "libQnnIr.so"))
    sess = session(_compile_source(model), opts)
    del sess
    new = sorted(set(out_dir.glob("*.dlc")) - before)
    if len(new) != 1:
        raise RuntimeError(f"expected one QNN graph in the DLC dump, found {len(new)} "
                           f"(the graph was split into partitions: some op is not supported by QNN)")
    return new[0]


def compile_context(model: Path, ctx_onnx: Path, options: dict) -> tuple[Path, Path]:
    """Compile a context binary; returns (EPContext .onnx wrapper, *_qnn.bin binary)."""
    ctx_onnx.parent.mkdir(parents=True, exist_ok=True)
    cfg = {"ep.context_enable": "1", "ep.context_file_path": str(ctx_onnx), "ep.context_embed_mode": "0"}
    sess = session(_compile_source(model), options, cfg)
    del sess
    bins = sorted(ctx_onnx.parent.glob(ctx_onnx.stem + "*.bin"))
    if not ctx_onnx.exists() or len(bins) != 1:
        raise RuntimeError(f"QNN context generation wrote {ctx_onnx.exists()=} and {len(bins)} binaries")
    return ctx_onnx, bins[0]

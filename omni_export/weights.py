"""Safetensors-only weight loading, validated against a recipe's tensor table; seeded tiny writers.

A recipe declares the tensors it needs as a table {official name: TensorDecl(shape, init)}. The same
table drives loading (missing / wrong-shape tensors are named in the error) and the seeded
checkpoints written for the demo and the tests. Pickles are never loaded.
"""
from __future__ import annotations

import json
import math
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterable, Mapping

import numpy as np

from .core import UsageError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
              "BOOL": np.bool_}


@dataclass(frozen=True)
class TensorDecl:
    shape: tuple[int, ...]
    init: tuple = ("normal", 0.02)   # ("normal", std) | ("ones",) | ("zeros",) | ("const", v) | ("uniform", lo, hi)
    required: bool = True


TensorTable = Mapping[str, TensorDecl]


def refuse_pickles(directory: Path, stem: str = "model") -> None:
    """Refuse a directory whose weights are only pickles (model.bin, pytorch_model.bin, *.pt ...)."""
    if (directory / f"{stem}.safetensors").exists():
        return
    pickles = sorted(p for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES) if directory.is_dir() else []
    if pickles:
        raise UsageError(
            f"{pickles[0]} is a pickle checkpoint; omni-export never unpickles (a pickle can run code). "
            f"Convert it to safetensors (e.g. save_pretrained(..., safe_serialization=True))")


def require_regular_file(path: Path, what: str) -> None:
    """Refuse FIFOs, devices and directories before opening (a FIFO would block forever)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        kind = "a broken symlink" if path.is_symlink() else "missing"
        raise UsageError(f"{what} {path} is {kind}") from None
    except OSError as e:
        raise UsageError(f"{what} {path} cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} {path} is not a regular file")


# Bounds of a checkpoint's side files (docs/errors.md): a Qwen2 tokenizer.json is ~7 MB, vocab.json
# ~3 MB, merges.txt ~2 MB; the largest published tokenizer.json we know of is ~34 MB.
SIDE_FILE_BYTES = {"tokenizer file": 64 << 20, "generation config": 1 << 20, "reference audio": 256 << 20}


def check_side_file(path: Path, what: str) -> int:
    """A checkpoint's side file (tokenizer, generation config) or a user's input file, before
    anything opens it: a regular file (a FIFO would hang the reader, /dev/zero grow it without
    bound) within its kind's size bound (SIDE_FILE_BYTES). Returns its size."""
    require_regular_file(path, what)
    size = path.stat().st_size
    limit = SIDE_FILE_BYTES[what]
    if size > limit:
        raise UsageError(f"{what} {path} is {size} bytes; a {what} is at most {limit >> 20} MiB")
    return size


def read_side_file(path: Path, what: str) -> bytes:
    """check_side_file, then its bytes (read to the bound: a file that grows is still refused)."""
    check_side_file(path, what)
    limit = SIDE_FILE_BYTES[what]
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UsageError(f"{what} {path} cannot be read ({e.strerror})") from None
    if len(data) > limit:
        raise UsageError(f"{what} {path} is larger than {limit >> 20} MiB")
    return data


def _sniff_pickle(path: Path, head: bytes) -> None:
    """Called once the file has failed to parse as safetensors: name a pickle if it looks like one."""
    if head[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05") or head[:4] == b"PK\x03\x04":
        raise UsageError(f"{path} is a pickle / torch.save archive named .safetensors; omni-export never "
                         f"unpickles (a pickle can run code). Convert it to real safetensors")


def read_header(path: Path) -> dict:
    """Parse a safetensors header with our own checks, so a corrupt file gives our error."""
    require_regular_file(path, "weight file")
    raw = b""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n <= 1 or n > min(size - 8, 100 * 2**20):
                raise ValueError(f"header length {n} does not fit the file ({size} bytes)")
            header = json.loads(f.read(n), object_pairs_hook=_unique_keys)
    except (OSError, ValueError, RecursionError) as e:
        _sniff_pickle(path, raw)
        raise UsageError(f"{path}: not a readable safetensors file ({_first_line(e)}); truncated or "
                         f"corrupted download?") from None
    if not isinstance(header, dict):
        raise UsageError(f"{path}: safetensors header is not a JSON object")
    data_len = size - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_entry(path, name, info, data_len)
    return header


def _unique_keys(pairs: list) -> dict:
    """A JSON object whose keys are unique: a safetensors header naming one tensor twice (which
    entry would a reader take?) is refused, as the safetensors library does."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the header names '{_shown(key)}' twice")
        seen[key] = value
    return seen


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def _shown(value) -> str:
    """A header-supplied string as it may appear in a one-line error: control characters escaped, capped."""
    text = str(value)
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_entry(path: Path, name: str, info, data_len: int) -> None:
    name = _shown(name)
    try:
        begin, end = info["data_offsets"]
        shape = info["shape"]
        dtype = info["dtype"]
        ok = (all(type(v) is int for v in (begin, end)) and isinstance(shape, list)
              and all(type(d) is int and d >= 0 for d in shape) and isinstance(dtype, str))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise UsageError(f"{path}: malformed entry for tensor '{name}' in the header")
    itemsize = 2 if dtype == "BF16" else (np.dtype(_ST_DTYPES[dtype]).itemsize if _ST_DTYPES.get(dtype) else None)
    if itemsize is None:
        raise UsageError(f"{path}: tensor '{name}' has unsupported dtype {_shown(dtype)}")
    if not (0 <= begin <= end <= data_len) or end - begin != itemsize * math.prod(shape):
        raise UsageError(f"{path}: tensor '{name}' lies outside the file or has the wrong size "
                         f"(truncated or corrupted download?)")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def load_tensors(path: Path, table: TensorTable, *, prefix: str = "", check_finite: bool = True,
                 lazy: bool = False) -> Mapping:
    """Load the tensors `table` declares (names relative to `prefix`) as fp32 torch tensors.

    lazy: every tensor is read and checked now, one at a time, and none is kept; the result is a
    LazyTensors that reads each again (as fp32) when asked for, so that only the tensors a caller
    still holds take memory."""
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"missing weight file {path}")
    header = read_header(path)
    missing = [n for n, d in table.items() if d.required and prefix + n not in header]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{path}: tensor '{prefix + missing[0]}' is missing{more}; "
                         f"is this the right checkpoint for this recipe?")
    for name, decl in table.items():
        full = prefix + name
        if full in header and tuple(header[full]["shape"]) != tuple(decl.shape):
            raise UsageError(f"{path}: tensor '{full}' has shape {list(header[full]['shape'])}, expected "
                             f"{list(decl.shape)} from the config")
    present = [n for n in table if prefix + n in header]
    for n in present:
        if header[prefix + n]["dtype"] not in FLOAT_DTYPES:
            raise UsageError(f"{path}: tensor '{prefix + n}' is stored as {_shown(header[prefix + n]['dtype'])}; "
                             f"weights are read as floating point ({', '.join(FLOAT_DTYPES)}) and never cast "
                             f"from integers or booleans (a quantized checkpoint? pass the full-precision one)")
    try:
        if lazy:
            if check_finite:
                _check_finite(path, present, prefix)
            return LazyTensors(path, present, prefix)
        return _read_tensors(path, present, prefix, check_finite)
    except UsageError:
        raise
    except Exception as e:   # the safetensors library's own checks (offsets, metadata, dtype)
        raise UsageError(f"{path}: not a valid safetensors file ({_first_line(e)})") from None


def _read_tensors(path: Path, names: list[str], prefix: str, check_finite: bool) -> dict:
    import torch
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in names:
            t = f.get_tensor(prefix + name).to(torch.float32)
            if check_finite:
                _require_finite(path, prefix + name, t)
            out[name] = t
    return out


def _require_finite(path: Path, full: str, t) -> None:
    import torch

    if t.is_floating_point() and not torch.isfinite(t).all():
        bad = int((~torch.isfinite(t)).sum())
        raise UsageError(f"{path}: tensor '{full}' holds {bad} NaN/Inf values; the checkpoint is corrupt")


def _check_finite(path: Path, names: list[str], prefix: str) -> None:
    """Every tensor finite, checked in the file's dtype, one tensor in memory at a time."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        for name in names:
            _require_finite(path, prefix + name, f.get_tensor(prefix + name))


class LazyTensors(Mapping):
    """name -> fp32 torch tensor, read from a safetensors file when asked for.

    A tensor whose memory someone still holds (a module's weight -- also when the module wrapped it in
    an nn.Parameter --, a host table) is handed out again over the same memory, not read twice; one
    nobody holds is gone and is read again on the next request. A model's components can so be built
    one at a time with only that component's weights in memory. Nothing here keeps a tensor alive:
    the cache holds weak references to the tensors' storage."""

    def __init__(self, path: Path, names: Iterable[str], prefix: str = ""):
        self.path, self.prefix = Path(path), prefix
        self._names = tuple(names)
        self._known = frozenset(self._names)
        self._live: dict = {}        # name -> (StorageWeakRef, shape, stride, storage offset)

    def __getitem__(self, name: str):
        import torch

        t = self._alive(name)
        if t is not None:
            return t
        if name not in self._known:
            raise KeyError(name)
        from safetensors import safe_open
        from torch.multiprocessing.reductions import StorageWeakRef

        t = _mapped_fp32(self.path, self.prefix + name)
        if t is None:
            with safe_open(str(self.path), framework="pt") as f:
                t = f.get_tensor(self.prefix + name).to(torch.float32)
        self._live[name] = (StorageWeakRef(t.untyped_storage()), t.shape, t.stride(), t.storage_offset())
        return t

    def _alive(self, name: str):
        import torch

        entry = self._live.get(name)
        if entry is None:
            return None
        ref, shape, stride, offset = entry
        storage = None if ref.expired() else torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        if storage is None:
            del self._live[name]
            return None
        return torch.empty(0, dtype=torch.float32).set_(storage, offset, shape, stride)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name) -> bool:
        return name in self._known

    def held(self) -> list[str]:
        """Names of the tensors whose memory someone holds now (what this checkpoint costs)."""
        return sorted(n for n, (ref, *_) in list(self._live.items()) if not ref.expired())


# Tensors from this size up are handed out memory-mapped (below: small tables, norms, biases).
MAP_MIN_BYTES = 1 << 20


def _mapped_fp32(path: Path, full: str):
    """An fp32 tensor over file pages, or None (small tensors, spilling switched off).

    An F32 tensor maps the checkpoint itself; any other float dtype (the official checkpoints are
    BF16) is converted once and appended to a scratch file of fp32 copies (`Fp32Spill`), which is
    mapped instead. Either way the weights a built graph holds are page cache the kernel can drop
    and read again, not anonymous memory: at 1.7B the talker's 5.6 GB of fp32 weights sat in the
    build process beside every QNN compile child and simulator worker. The mapping is private
    (copy-on-write): a module that writes into a weight gets its own pages, the file is unchanged."""
    import os

    if os.environ.get("OMNI_EXPORT_WEIGHT_SPILL", "").lower() in ("off", "0", "no"):
        return None
    info = _header_cached(path).get(full)
    if info is None or info["dtype"] not in ("F32", "F16", "BF16"):
        return None
    numel = math.prod(info["shape"])
    if numel * 4 < MAP_MIN_BYTES:
        return None
    if info["dtype"] == "F32":
        return _map(path, _data_start(path) + info["data_offsets"][0], info["shape"])
    return SPILL.get(path, full, info["shape"])


_headers: dict = {}


def _header_cached(path: Path) -> dict:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _headers:
        _headers[key] = read_header(path)
    return _headers[key]


def _data_start(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def _map(source, offset: int, shape):
    """fp32 tensor over a private (copy-on-write) mapping of `source` (a path or an open file)."""
    import torch

    arr = np.memmap(source, dtype=np.float32, mode="c", offset=offset, shape=tuple(shape))
    return torch.from_numpy(arr)


CAST_BUFFER = 1 << 18        # elements per buffered cast into the spill file


class Fp32Spill:
    """fp32 copies of checkpoint tensors, appended once to a scratch file and mapped copy-on-write on
    every request. The file is unlinked as soon as it is created (in a fresh temporary directory, or
    under $OMNI_EXPORT_WEIGHT_SPILL) and lives only as this process's open file: nothing is left
    behind, even by a build the kernel kills. A tensor read again after its holders let go maps the
    same bytes: converted once."""

    def __init__(self):
        self._fh = None
        self._index: dict = {}      # (checkpoint, mtime, size, name) -> offset

    def get(self, path: Path, full: str, shape):
        import torch
        from safetensors import safe_open

        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size, full)
        if key not in self._index:
            info = _header_cached(path)[full]
            if info["dtype"] in ("BF16", "F16"):
                self._index[key] = self._convert(path, _data_start(path) + info["data_offsets"][0], info["dtype"],
                                                 math.prod(info["shape"]))
            else:
                with safe_open(str(path), framework="pt") as f:
                    t = f.get_tensor(full).to(torch.float32).contiguous()
                self._index[key] = self._append(t.numpy())
                del t
        return _map(self._file(), self._index[key], shape)

    def _convert(self, path: Path, offset: int, dtype: str, n: int) -> int:
        """Append the `n` BF16 / F16 values at `offset` of `path` as fp32, converted from one file's
        pages to the other's by numpy's buffered casts: no anonymous copy of the tensor at any size
        (converting it whole held the 1.7B text embedding's 0.62 GB of BF16 and its 1.24 GB of fp32
        in memory at once). BF16 is the top half of an fp32: a 16-bit shift, exact; F16 widens exactly."""
        f = self._file()
        start = f.seek(0, 2)
        start += -start % 64
        f.truncate(start + 4 * n)
        if n:
            wide = np.uint32 if dtype == "BF16" else np.float32
            dst = np.memmap(f, dtype=wide, mode="r+", offset=start, shape=(n,))
            src = np.memmap(path, dtype=np.uint16 if dtype == "BF16" else np.float16, mode="r", offset=offset,
                            shape=(n,))
            old = np.setbufsize(CAST_BUFFER)            # cast in 1 MB pieces, not numpy's 8192 elements
            try:
                if dtype == "BF16":
                    np.left_shift(src, 16, out=dst, dtype=np.uint32)
                else:
                    np.copyto(dst, src)
            finally:
                np.setbufsize(old)
            dst.flush()
            del dst, src
        return start

    def _file(self):
        import os
        import tempfile

        if self._fh is None:
            where = os.environ.get("OMNI_EXPORT_WEIGHT_SPILL") or None
            if where:
                Path(where).mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="omni-export-fp32-", suffix=".f32", dir=where)
            self._fh = os.fdopen(fd, "r+b")
            os.unlink(name)
        return self._fh

    def _append(self, arr: np.ndarray) -> int:
        f = self._file()
        offset = f.seek(0, 2)
        pad = -offset % 64
        if pad:
            f.write(b"\0" * pad)
            offset += pad
        f.write(memoryview(arr).cast("B"))
        f.flush()
        return offset

    def bytes(self) -> int:
        import os

        return os.fstat(self._fh.fileno()).st_size if self._fh is not None else 0


SPILL = Fp32Spill()


def seeded_tensors(table: TensorTable, seed: int) -> dict[str, np.ndarray]:
    """Deterministic random tensors for a table (numpy's PCG64 is stable across versions)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(table):
        decl = table[name]
        kind, *args = decl.init
        if kind == "normal":
            a = rng.standard_normal(decl.shape) * args[0]
        elif kind == "uniform":
            a = rng.uniform(args[0], args[1], decl.shape)
        elif kind == "ones":
            a = np.ones(decl.shape)
        elif kind == "zeros":
            a = np.zeros(decl.shape)
        elif kind == "const":
            a = np.full(decl.shape, args[0])
        else:
            raise ValueError(f"unknown init {decl.init} for {name}")
        out[name] = np.ascontiguousarray(a, dtype=np.float32)
    return out


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray], metadata: dict | None = None) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(dict(tensors), str(tmp), metadata={"format": "pt", **(metadata or {})})
    tmp.replace(path)


def prefixed(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {prefix + k: v for k, v in tensors.items()}


def names(table: TensorTable) -> Iterable[str]:
    return sorted(table)

import json
import struct

import numpy as np
import pytest

from omni_export.core import UsageError
from omni_export.weights import TensorDecl, load_tensors, read_header, refuse_pickles, seeded_tensors, write_safetensors

TABLE = {"a.weight": TensorDecl((4, 3)), "a.bias": TensorDecl((4,), ("zeros",)),
         "opt": TensorDecl((2,), required=False)}


def write(tmp_path, tensors):
    p = tmp_path / "model.safetensors"
    write_safetensors(p, tensors)
    return p


def test_seeded_tensors_are_deterministic_and_follow_init():
    a, b = seeded_tensors(TABLE, 3), seeded_tensors(TABLE, 3)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["a.weight"], seeded_tensors(TABLE, 4)["a.weight"])
    assert (a["a.bias"] == 0).all()


def test_loads_declared_tensors_with_prefix(tmp_path):
    t = seeded_tensors(TABLE, 0)
    p = write(tmp_path, {"decoder." + k: v for k, v in t.items()})
    out = load_tensors(p, TABLE, prefix="decoder.")
    assert np.array_equal(out["a.weight"].numpy(), t["a.weight"])


def test_missing_tensor_is_named(tmp_path):
    p = write(tmp_path, {"a.weight": np.zeros((4, 3), np.float32)})
    with pytest.raises(UsageError, match="'a.bias' is missing"):
        load_tensors(p, TABLE)


def test_optional_tensor_may_be_absent(tmp_path):
    t = seeded_tensors(TABLE, 0)
    del t["opt"]
    assert "opt" not in load_tensors(write(tmp_path, t), TABLE)


def test_wrong_shape_is_named_with_both_shapes(tmp_path):
    t = seeded_tensors(TABLE, 0)
    t["a.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(UsageError, match=r"'a.weight' has shape \[3, 4\], expected \[4, 3\]"):
        load_tensors(write(tmp_path, t), TABLE)


def test_nan_weights_are_refused(tmp_path):
    t = seeded_tensors(TABLE, 0)
    t["a.weight"][1, 1] = np.nan
    with pytest.raises(UsageError, match="NaN/Inf"):
        load_tensors(write(tmp_path, t), TABLE)


def test_truncated_file_is_our_error(tmp_path):
    p = write(tmp_path, seeded_tensors(TABLE, 0))
    data = p.read_bytes()
    p.write_bytes(data[:-7])
    with pytest.raises(UsageError, match="truncated or corrupted"):
        load_tensors(p, TABLE)


def test_garbage_header_is_our_error(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", 12) + b"not json!!!!" + b"\0" * 10)
    with pytest.raises(UsageError, match="not a readable safetensors"):
        read_header(p)
    p.write_bytes(b"\x01")
    with pytest.raises(UsageError, match="not a readable safetensors"):
        read_header(p)
    p.write_bytes(struct.pack("<Q", 2) + json.dumps([1]).encode()[:2])
    with pytest.raises(UsageError):
        read_header(p)


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(UsageError, match="never unpickles"):
        refuse_pickles(tmp_path)


def test_lazy_tensors_read_on_request_and_keep_nothing(tmp_path):
    import gc

    t = seeded_tensors(TABLE, 0)
    lazy = load_tensors(write(tmp_path, {"decoder." + k: v for k, v in t.items()}), TABLE, prefix="decoder.",
                        lazy=True)
    assert sorted(lazy) == sorted(TABLE) and "a.weight" in lazy and "nope" not in lazy
    assert lazy.held() == []                       # validated at load, nothing kept
    w = lazy["a.weight"]
    assert np.array_equal(w.numpy(), t["a.weight"]) and w.dtype.is_floating_point
    assert lazy["a.weight"].data_ptr() == w.data_ptr()     # held: handed out again, not read twice
    assert lazy.held() == ["a.weight"]
    import torch

    p = torch.nn.Parameter(w)                      # a module's weight wraps it: still the same memory
    del w
    gc.collect()
    assert lazy.held() == ["a.weight"] and lazy["a.weight"].data_ptr() == p.data_ptr()
    del p
    gc.collect()
    assert lazy.held() == []                       # nobody holds it: gone, and read again on request
    assert np.array_equal(lazy["a.weight"].numpy(), t["a.weight"])
    with pytest.raises(KeyError):
        lazy["nope"]


def test_lazy_load_still_refuses_nan_weights_at_load(tmp_path):
    t = seeded_tensors(TABLE, 0)
    t["a.bias"][2] = np.inf
    with pytest.raises(UsageError, match="'a.bias' holds 1 NaN/Inf"):
        load_tensors(write(tmp_path, t), TABLE, lazy=True)


def _mapped_file(t) -> str:
    """The file /proc/self/maps names for the mapping holding tensor `t`'s first byte ("" if anonymous)."""
    addr = t.data_ptr()
    for line in open("/proc/self/maps"):
        parts = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if lo <= addr < hi:
            return parts[5].strip() if len(parts) > 5 else ""
    return ""


def test_lazy_weights_are_file_pages_not_anonymous_memory(tmp_path, monkeypatch):
    """Big tensors come back as fp32 over file pages: a BF16 checkpoint's converted once into the
    spill file, an F32 checkpoint's mapped in place. Touching them adds page cache, not RssAnon;
    values are the exact fp32 conversion; writing into one leaves the files unchanged."""
    import torch
    from safetensors.torch import save_file

    from omni_export import weights as W

    monkeypatch.setenv("OMNI_EXPORT_WEIGHT_SPILL", str(tmp_path / "spill"))
    monkeypatch.setattr(W, "SPILL", W.Fp32Spill())
    g = torch.Generator().manual_seed(0)
    bf = torch.randn(2048, 4096, generator=g).to(torch.bfloat16)           # 32 MB as fp32
    f32 = torch.randn(4096, 1024, generator=g)                              # 16 MB
    save_file({"a": bf, "b": f32, "norm": torch.ones(64, dtype=torch.bfloat16)}, str(tmp_path / "m.safetensors"))
    before = (tmp_path / "m.safetensors").read_bytes()
    lazy = W.LazyTensors(tmp_path / "m.safetensors", ["a", "b", "norm"])
    a, b, norm = lazy["a"], lazy["b"], lazy["norm"]
    assert float(a.sum()) == float(bf.float().sum()) and float(b.sum()) == float(f32.sum())
    # each big tensor's memory is a mapping of a file -- the (unlinked) spill file for BF16, the
    # checkpoint itself for F32 -- not anonymous memory. (This process's RssAnon delta measured it
    # before; other threads of a pytest worker moved it by a tensor's size.)
    assert _mapped_file(a).startswith(str(tmp_path / "spill" / "omni-export-fp32-"))
    assert _mapped_file(b) == str(tmp_path / "m.safetensors")
    assert torch.equal(a, bf.float()) and torch.equal(b, f32) and norm.dtype == torch.float32
    assert W.SPILL.bytes() == 2048 * 4096 * 4         # only the BF16 tensor was converted and spilled
    a.mul_(2)                                         # copy-on-write: the module's own pages
    assert torch.equal(lazy["a"], a)                  # the live tensor is handed out again
    del a
    assert torch.equal(lazy["a"], bf.float())         # read again: the unchanged spilled bytes
    assert W.SPILL.bytes() == 2048 * 4096 * 4         # ... not converted a second time
    assert (tmp_path / "m.safetensors").read_bytes() == before
    assert not any((tmp_path / "spill").iterdir())    # the spill file is unlinked: a killed build leaves nothing
    monkeypatch.setenv("OMNI_EXPORT_WEIGHT_SPILL", "off")
    again = W.LazyTensors(tmp_path / "m.safetensors", ["a"])["a"]
    assert torch.equal(again, bf.float())
    # off: converted into anonymous memory as before (a mapping of no file; an RssAnon delta is
    # not a fair measure here: the allocator may hand back pages freed a moment ago)
    assert not _mapped_file(again).startswith("/")       # "" or "[heap]": no file behind it

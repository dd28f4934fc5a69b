"""fp16 .pte products as short sums (omni_export/halfsums.py, docs/fp16-pte.md).

Phones' XNNPACK (and AVX512-FP16 hosts') sums fp16 products in fp16; this host's sums them in fp32
(omni_export/cpu.py), so the loss is shown under the emulation (exporters/fp16acc.py, which scores
the 0.6B text projection as the AVX512-FP16 Xeon's real runtime did) and the split program is run
on this host's real ExecuTorch runtime and checked to stay one XNNPACK delegate."""
import contextlib

import pytest
import torch
from torch import nn

from omni_export.exporters.fp16acc import Fp16Accumulation, sequential_mm
from omni_export.parity.metrics import snr


class LongSums(nn.Module):
    """The talker's RMS mean (its XNNPACK matmul form), a linear and a convolution whose outputs sum
    1024 and 896 products: long enough that fp16 accumulators lose ~10 dB at tiny widths."""

    def __init__(self):
        super().__init__()
        from omni_export.recipes.qwen3_tts.talker import RMSNorm

        self.norm = RMSNorm(1024, 1e-6)
        self.fc = nn.Linear(1024, 128)
        self.conv = nn.Conv1d(128, 8, 7)

    def forward(self, x):                                   # [1, T, 1024] -> [1, 8, T - 6]
        return self.conv(self.fc(self.norm(x)).transpose(1, 2))


@pytest.fixture(scope="module")
def long_sums():
    from omni_export.recipes.qwen3_tts.talker import _XnnpackForms

    torch.manual_seed(0)
    m = _XnnpackForms(LongSums()).eval()
    with torch.no_grad():
        m.inner.norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(1, 12, 1024) * 4
        return m, x, m(x)


def test_the_emulation_sums_in_fp16_term_by_term():
    a = torch.tensor([[2048.0, 1.0, 1.0]], dtype=torch.float16)
    b = torch.ones(3, 1, dtype=torch.float16)
    assert sequential_mm(a, b).item() == 2048.0           # 2049 rounds to 2048 twice
    assert (a.float() @ b.float()).item() == 2050.0


def test_split_sums_hold_where_fp16_accumulation_loses(long_sums):
    from omni_export.exporters.executorch import _CastIO, _copy, fp16_program

    m, x, ref = long_sums
    plain = _CastIO(_copy(m, torch.float16), torch.float16).eval()
    split, details = fp16_program(m)
    assert details == {"terms_per_sum": 128, "layers_split": 2}
    with torch.no_grad(), Fp16Accumulation() as acc:
        lost, kept = plain(x), split(x)
    assert acc.count
    # seeds 0 and 1: 43.3 / 44.4 dB in one sum per output, 51.4 / 51.2 dB in sums of <= 128 terms
    assert snr(ref.numpy(), lost.numpy()) < 46
    assert snr(ref.numpy(), kept.numpy()) > 49


def test_split_sums_lower_to_one_delegate_and_run(long_sums):
    """On this host's real runtime the split program computes the same values: as the fp32 module where
    XNNPACK sums fp16 products in fp32 (> 55 dB), as the emulated fp16 accumulators where it sums them
    in fp16 (an AVX512-FP16 host: 51.2 dB on an Intel Xeon, seed 1; > 49 as above)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from omni_export.exporters.executorch import fp16_program, release_lowering_caches

    m, x, ref = long_sums
    split, _ = fp16_program(m)
    try:
        lowered = to_edge_transform_and_lower(torch.export.export(split, (x,)), partitioner=[XnnpackPartitioner()])
        nodes = lowered.exported_program().graph.nodes
        assert sum("executorch_call_delegate" in str(n.target) for n in nodes) == 1
        program = Runtime.get().load_program(lowered.to_executorch().buffer)
        out = program.load_method("forward").execute([x])[0]
    finally:
        release_lowering_caches()
    from omni_export.cpu import cpu_facts

    assert snr(ref.numpy(), out.numpy()) > (49 if cpu_facts()["xnnpack_fp16_accumulation"] == "fp16" else 55)


def test_fp16_convolution_weights_are_stored_as_fp16():
    """ExecuTorch 1.5.1's XNNPACK convolution visitor serializes fp16 filters as fp32 (twice the bytes in
    the .pte and in the lowering's memory); within conv_weights_keep_fp16 a convolution's fp16 filter
    and bias are stored as they are, a transposed one's still as fp32 (XNNPACK's deconvolution refuses
    fp16 filters), and the program loads and computes the same outputs."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    from omni_export.exporters.executorch import release_lowering_caches
    from omni_export.exporters.patches.xnnpack_preprocess import conv_weights_keep_fp16

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(64, 256, 1), nn.Conv1d(256, 256, 3, groups=2), nn.ConvTranspose1d(256, 16, 4, 2))
    m = m.half().eval()
    x = torch.randn(1, 64, 20, dtype=torch.float16)
    weights = [p.numel() for p in m.parameters()]
    deconv = sum(p.numel() for p in m[2].parameters())
    outs, sizes = [], []
    try:
        for keep in (False, True):
            ep = torch.export.export(m, (x,))
            with conv_weights_keep_fp16() if keep else contextlib.nullcontext():
                buf = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
            sizes.append(len(buf))
            outs.append(Runtime.get().load_program(buf).load_method("forward").execute([x])[0])
    finally:
        release_lowering_caches()
    fp16_bytes = 2 * (sum(weights) - deconv)
    # the convolutions' filters shrink by their fp16 size; the transposed one's stay
    assert abs((sizes[0] - sizes[1]) - fp16_bytes) < 0.02 * fp16_bytes, (sizes, fp16_bytes)
    assert torch.equal(outs[0], outs[1])

"""Shared FX provenance: same history, same program, none of the deep copies."""
import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from omni_export.core import Precision
from omni_export.exporters import executorch as et
from omni_export.exporters.patches.fx_passes import shared_provenance


class _Net(nn.Module):
    """Conv, norm, an op XNNPACK leaves out (sin: more than one partition) and a linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)
        h = torch.sin(self.norm(h)) * h
        return self.proj(torch.relu(h))


def _node_with_history():
    torch.manual_seed(0)
    ep = torch.export.export(_Net().eval(), (torch.randn(1, 4, 6),))
    ep = ep.run_decompositions({})
    node = next(n for n in ep.graph.nodes if n.meta.get("from_node"))
    return node


def test_history_is_shared_not_copied_and_reads_the_same():
    node = _node_with_history()
    plain = fx_traceback.NodeSource(node, "p")
    with shared_provenance():
        shared = fx_traceback.NodeSource(node, "p")
    assert shared.from_node[0] is node.meta["from_node"][0]          # shared
    assert plain.from_node[0] is not node.meta["from_node"][0]       # torch's own: a deep copy
    assert shared.from_node is not node.meta["from_node"]            # but a list of its own
    assert shared.to_dict() == plain.to_dict()                       # the same history
    assert node.meta["from_node"] and node.meta["from_node"][0].to_dict() == plain.from_node[0].to_dict()


def test_torch_constructor_is_back_after_the_block_and_nesting_keeps_it_until_the_outer_exit():
    original = fx_traceback.NodeSource.__init__
    with shared_provenance():
        with shared_provenance():
            assert fx_traceback.NodeSource.__init__ is not original
        assert fx_traceback.NodeSource.__init__ is not original
    assert fx_traceback.NodeSource.__init__ is original
    try:
        with shared_provenance():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert fx_traceback.NodeSource.__init__ is original


def test_pte_is_byte_identical_with_and_without_the_fast_passes(tmp_path):
    torch.manual_seed(0)
    module = _Net().eval()
    example = (torch.randn(1, 4, 6),)
    et._export_pte(module, example, tmp_path / "plain.pte", Precision.FP16)      # torch's provenance
    et.release_lowering_caches()
    et.export_pte(module, example, tmp_path / "shared.pte", Precision.FP16)      # fast_passes
    plain, shared = (tmp_path / "plain.pte").read_bytes(), (tmp_path / "shared.pte").read_bytes()
    assert len(plain) > 1000
    assert plain == shared


def test_cia_ops_are_collected_once_per_registration_state_and_torch_gets_its_function_back():
    import torch._export.utils as export_utils
    import torch.export.exported_program as exported_program

    from omni_export.exporters.patches import fx_passes as fxmeta

    import torch.export.decomp_utils as decomp_utils

    modules = (export_utils, exported_program, decomp_utils)
    original = export_utils._collect_all_valid_cia_ops
    assert all(m._collect_all_valid_cia_ops is original for m in modules)
    walks = []
    lib = None

    def counted():
        walks.append(1)
        return original()

    export_utils._collect_all_valid_cia_ops = counted
    try:
        with fxmeta.cached_cia_ops():
            assert exported_program._collect_all_valid_cia_ops is not counted
            first = exported_program._collect_all_valid_cia_ops()
            assert exported_program._collect_all_valid_cia_ops() is first and len(walks) == 1
            assert first == original()
            lib = torch.library.Library("omni_fxmeta_test", "DEF")       # a new op: a new walk
            lib.define("twice(Tensor x) -> Tensor")
            lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
            walks.clear()
            again = exported_program._collect_all_valid_cia_ops()
            assert len(walks) == 1 and any("omni_fxmeta_test" in str(op) for op in again)
        assert export_utils._collect_all_valid_cia_ops is counted
    finally:
        for m in modules:
            m._collect_all_valid_cia_ops = original
        if lib is not None:
            lib._destroy()


def test_signature_maps_are_computed_once_per_state_and_follow_every_in_place_change():
    from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

    from omni_export.exporters.patches.fx_passes import memo_signature_maps

    original = ExportGraphSignature.__dict__["inputs_to_buffers"]
    ep = torch.export.export(_Net().eval(), (torch.randn(1, 4, 6),))
    sig = ep.graph_signature
    plain = dict(sig.inputs_to_parameters)
    with memo_signature_maps():
        first = sig.inputs_to_parameters
        assert dict(first) == plain and sig.inputs_to_parameters is first          # answered from the memo
        spec = next(s for s in sig.input_specs if s.kind == InputKind.PARAMETER)
        spec.arg.name = "renamed"                                                   # TensorArgument in place
        assert "renamed" in sig.inputs_to_parameters
        spec.kind = InputKind.BUFFER                                                # InputSpec in place
        spec.persistent = True
        assert "renamed" not in sig.inputs_to_parameters and sig.inputs_to_buffers["renamed"] == spec.target
        sig.input_specs.insert(0, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument("c0"), "c0_target"))
        assert sig.inputs_to_lifted_tensor_constants["c0"] == "c0_target"          # the list grew
        sig.input_specs.pop(0)
        assert "c0" not in sig.inputs_to_lifted_tensor_constants
        with memo_signature_maps():                                                 # nests
            assert ExportGraphSignature.__dict__["inputs_to_buffers"] is not original
    assert ExportGraphSignature.__dict__["inputs_to_buffers"] is original
    assert "__setattr__" not in InputSpec.__dict__ and "__setattr__" not in TensorArgument.__dict__


class _Stack(torch.nn.Module):
    """Linears past halfsums.SUM_TERMS (split in fp16), a conv, concatenation and a residual."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(300, 64)
        self.conv = nn.Conv1d(64, 64, 3, padding=1)
        self.down = nn.Linear(128, 16)

    def forward(self, x):
        h = torch.relu(self.up(x))
        c = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.down(torch.cat([h, c], dim=-1)) + x[..., :16]


def test_pte_is_byte_identical_with_and_without_skipping_idle_retraces_and_decompositions(tmp_path):
    from omni_export.exporters.patches import fx_passes

    torch.manual_seed(1)
    example = (torch.randn(1, 5, 300),)
    for p in (Precision.FP16, Precision.W8A16):
        module = _Stack().eval()
        with fx_passes.fast_passes():
            et._export_pte(module, example, tmp_path / f"plain-{p.value}.pte", p, [example])
        et.release_lowering_caches()
        before, decomposed = dict(fx_passes.retraces), dict(fx_passes.decompositions)
        et.export_pte(module, example, tmp_path / f"skip-{p.value}.pte", p, [example])
        assert fx_passes.retraces["skipped"] > before["skipped"]               # some retraces were idle
        assert fx_passes.retraces["run"] > before["run"]                       # and some were not
        # and so were some of to_edge_transform_and_lower's decompositions (skip_idle_decompositions)
        assert fx_passes.decompositions["skipped"] > decomposed["skipped"]
        assert fx_passes.decompositions["run"] > decomposed["run"]
        assert (tmp_path / f"plain-{p.value}.pte").read_bytes() == (tmp_path / f"skip-{p.value}.pte").read_bytes()


def test_a_pass_working_in_its_hooks_or_on_a_changed_graph_is_retraced():
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass, _ExportPassBase
    from executorch.exir import to_edge

    from omni_export.exporters.patches import fx_passes

    class Idle(ExportPass):
        pass

    class Doubling(ExportPass):            # works during the retrace: never skipped
        def call_operator(self, op, args, kwargs, meta):
            if op == exir_ops.edge.aten.relu.default:
                return super().call_operator(exir_ops.edge.aten.abs.default, args, kwargs, meta)
            return super().call_operator(op, args, kwargs, meta)

    gm = to_edge(torch.export.export(torch.nn.ReLU(), (torch.randn(3),))).exported_program().graph_module
    original = _ExportPassBase.call
    with fx_passes.skip_idle_retraces():
        first = Idle()(gm).graph_module                     # nothing retraced yet: retraced
        assert first is not gm
        assert Idle()(first).graph_module is first          # as the last retrace left it: returned as is
        changed = Doubling()(first).graph_module
        assert changed is not first
        assert [n.target for n in changed.graph.nodes if n.op == "call_function"] == [exir_ops.edge.aten.abs.default]
        next(n for n in changed.graph.nodes if n.op == "call_function").name = "renamed"
        assert Idle()(changed).graph_module is not changed  # edited since: retraced
    assert _ExportPassBase.call is original


def test_a_program_with_an_op_of_the_table_or_not_made_in_the_block_is_decomposed():
    from torch.export import ExportedProgram

    from omni_export.exporters.patches import fx_passes

    class Net(nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x) + 1

    ep = torch.export.export(Net(), (torch.randn(3),))
    outside = ep.run_decompositions({})
    original = ExportedProgram.run_decompositions
    silu = torch.ops.aten.silu.default
    with fx_passes.skip_idle_decompositions():
        first = outside.run_decompositions({})           # not made in the block: decomposed
        assert first is not outside
        assert first.run_decompositions({}) is first     # made here, nothing to decompose: as it is
        assert silu in {n.target for n in first.graph.nodes}
        table = {silu: torch._decomp.decomposition_table[silu]}
        lowered = first.run_decompositions(table)          # silu is in the table: decomposed
        assert lowered is not first and silu not in {n.target for n in lowered.graph.nodes}
    assert ExportedProgram.run_decompositions is original

"""Five fixed costs of torch's and ExecuTorch's graph passes, removed without changing what they produce.

1. FX node provenance without the quadratic copy.

Every pass that retraces a graph (torch.export's decompositions, each of ExecuTorch's edge and
XNNPACK passes, run once per delegated partition) gives each new node `meta["from_node"]`:
a NodeSource for the node it came from, which in torch 2.13 *deep-copies* that node's whole
from_node history. The history grows by one level per pass, so the copying grows with the square
of the pass count: lowering the demo Code2Wav graph (677 nodes, 23 XNNPACK partitions, ~17 passes
each) spent 23 of 125 profiled seconds in those deep copies.

NodeSource objects are never changed after they are made (torch and ExecuTorch only read them,
to name a node's origin and to find debug handles), so sharing the older levels instead of
copying them records the same history. `shared_provenance()` does that for the span of a build;
the lowered program is byte-for-byte the one made without it (tests/test_fxmeta.py).

2. The CompositeImplicitAutograd op set, collected once. Every run_decompositions (torch.export's,
to_edge's, one per XNNPACK partition, the ONNX exporter's) walks every registered operator of every
namespace to list the CIA ops it may keep: ~0.3 s a call, whatever the graph's size, and much of the
lowering time of a small graph (a 3-layer fp16 .pte, the third lowering in a process, single runs:
8.4 -> 6.7 s). torch does not cache it because a custom op registered later adds to the set; `cached_cia_ops()` keys its cache on the dispatcher's
CIA registrations and the op namespaces, so a new registration is a new walk.

3. The graph signature's name maps, made once per signature state. ExportGraphSignature's
`inputs_to_parameters` / `inputs_to_buffers` / `inputs_to_lifted_tensor_constants` build a new dict
from every input spec on each access, and torch's `is_param` / `is_buffer` / `is_lifted_tensor_constant`
(read by XNNPACK's partitioner, GEMM configs, node visitors and layout pass once or more per node) ask
for one each time: quadratic in the graph's size. The 0.6B talker decode step's fp16 .pte (its
linears split into 128-term sums: ~2000 weight inputs) spent 71 of 406 profiled seconds there.
`memo_signature_maps()` answers them from a cache keyed on the signature's spec objects and a
generation counter bumped by every field write of an InputSpec or TensorArgument (torch and ExecuTorch
rename, retarget and re-kind specs in place), so a changed signature is a new computation.

4. No retrace of a graph a retrace just made. Most of ExecuTorch's XNNPACK passes edit the graph where
their pattern occurs and then retrace the whole program through ExportPass (every node re-run on fake
tensors), whether they found their pattern or not: a talker graph has no batch norm, upsampling,
PReLU or 1-d convolution, and its partition was retraced for each of those passes. `skip_idle_retraces()`
returns the graph as it is when the pass's retrace would be the identity: the pass retraces with
ExportPass's own hooks (it overrides none of `call_operator`, `placeholder`, ...: those passes work
during the retrace, and always retrace) and the graph is the one the last retrace produced (the same
nodes, names, targets, arguments and input metadata: `_fingerprint`).

5. No decomposition of a program with nothing to decompose. ExecuTorch's to_edge_transform_and_lower
runs torch's run_decompositions three times over a program an XNNPACK partitioner takes (to
functionalize it, with the partitioner's ops kept, then with the default table after the kept ops
are renamed) and each call retraces every node on fake tensors, whether any node's op is in the table
or not: the three were 35 % of the profiled samples of the 0.6B talker decode's fp16 .pte lowering. A
program that a run_decompositions of the block made is functional already; `skip_idle_decompositions()`
returns it as is when none of its call_function targets is in the table (ExecuTorch's own test for
skipping its second pass, `contains_any_call_fn_target_op`), and the .pte is byte-for-byte the same.
What it saves depends on the graph: the demo's small graphs skip one or two of the calls, but the 0.6B
talker decode's fp16 lowering went only from 344.9 to 336.4 s (one run each, one host:
docs/benchmarks.md, 4c8d28c), so most of those samples were calls that do decompose.

`fast_passes()` applies 1-3 for the span of a build (ONNX export and ExecuTorch lowering);
ExecuTorch's lowering adds `skip_idle_retraces()` and `skip_idle_decompositions()`
(exporters/executorch.py).
"""
from __future__ import annotations

import contextlib
import threading

import torch

PINNED = {"torch": "2.13.0", "executorch": "1.5.1"}
TARGETS = ("torch.fx.traceback:NodeSource.__init__",
           "torch.export.graph_signature:ExportGraphSignature.inputs_to_parameters",
           "torch.export.graph_signature:ExportGraphSignature.inputs_to_buffers",
           "torch.export.graph_signature:ExportGraphSignature.inputs_to_lifted_tensor_constants",
           "torch._export.utils:_collect_all_valid_cia_ops",
           "torch.export.exported_program:_collect_all_valid_cia_ops",
           "torch.export.decomp_utils:_collect_all_valid_cia_ops",
           "executorch.exir.pass_base:_ExportPassBase.call",
           "torch.export.exported_program:ExportedProgram.run_decompositions")

_lock = threading.Lock()
_depths: dict[str, int] = {}
_original = None


@contextlib.contextmanager
def _nested(name: str, install, restore):
    """A patch's block: install() when the first block of `name` enters, restore() when the last exits."""
    with _lock:
        if not _depths.get(name):
            install()
        _depths[name] = _depths.get(name, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _depths[name] -= 1
            if not _depths[name]:
                restore()


def _init_sharing_history(self, node, pass_name="", action=None):
    history = node.meta.get("from_node") if node is not None else None
    if not history:
        _original(self, node, pass_name, action)
        return
    node.meta["from_node"] = []          # the original deep-copies this; hand it nothing to copy
    try:
        _original(self, node, pass_name, action)
    finally:
        node.meta["from_node"] = history
    self.from_node = list(history)       # a new list of the same (never-mutated) NodeSources


@contextlib.contextmanager
def shared_provenance():
    """Within the block, NodeSource shares its node's from_node history instead of deep-copying it.
    Nests; restores torch's own constructor when the outermost block exits."""
    from torch.fx.traceback import NodeSource

    def install():
        global _original
        _original, NodeSource.__init__ = NodeSource.__init__, _init_sharing_history

    def restore():
        global _original
        NodeSource.__init__, _original = _original, None

    with _nested("provenance", install, restore):
        yield


_cia_cache: dict = {}


def _collect_cia_ops_cached():
    key = (len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
           tuple(torch.ops._dir))
    ops = _cia_cache.get(key)
    if ops is None:
        _cia_cache.clear()
        ops = _cia_cache[key] = _cia_original()
    return ops


_cia_original = None


@contextlib.contextmanager
def cached_cia_ops():
    """Within the block, torch._export.utils._collect_all_valid_cia_ops answers from a cache keyed on
    the dispatcher's registrations. Nests; restores torch's function when the outermost block exits."""
    def install():
        global _cia_original
        _cia_original = _cia_modules()[0]._collect_all_valid_cia_ops
        for m in _cia_modules():          # each imported the function by name
            m._collect_all_valid_cia_ops = _collect_cia_ops_cached

    def restore():
        global _cia_original
        for m in _cia_modules():
            m._collect_all_valid_cia_ops = _cia_original
        _cia_original = None
        _cia_cache.clear()

    with _nested("cia", install, restore):
        yield


def _cia_modules() -> list:
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    return [export_utils, exported_program, decomp_utils]


SIGNATURE_MAPS = ("inputs_to_parameters", "inputs_to_buffers", "inputs_to_lifted_tensor_constants")
_sig_generation = 0          # bumped by every field write of an InputSpec / TensorArgument in the block
_sig_memo: dict = {}         # id(signature) -> {map name: (generation, specs, answer)}
_sig_originals: dict = {}


def _counting_setattr(self, name, value):
    global _sig_generation
    _sig_generation += 1
    object.__setattr__(self, name, value)


def _memoised(name: str, compute):
    def get(self):
        specs = tuple(self.input_specs)
        entry = _sig_memo.setdefault(id(self), {}).get(name)
        # the same generation and the same spec objects (or equal ones: `==` on the dataclasses) give
        # the same map; the entry keeps its specs alive, so an id reused by a new signature cannot match
        # different specs by identity
        if entry is not None and entry[0] == _sig_generation and entry[1] == specs:
            return entry[2]
        answer = compute(self)
        _sig_memo[id(self)][name] = (_sig_generation, specs, answer)
        return answer
    return property(get)


@contextlib.contextmanager
def memo_signature_maps():
    """Within the block, ExportGraphSignature's input name maps are computed once per signature state.
    Nests; restores torch's properties and InputSpec / TensorArgument's attribute setting when the
    outermost block exits."""
    from torch.export.graph_signature import ExportGraphSignature, InputSpec, TensorArgument

    def install():
        for cls in (InputSpec, TensorArgument):
            _sig_originals[cls] = cls.__dict__.get("__setattr__")
            cls.__setattr__ = _counting_setattr
        for name in SIGNATURE_MAPS:
            prop = _sig_originals[name] = ExportGraphSignature.__dict__[name]
            setattr(ExportGraphSignature, name, _memoised(name, prop.fget))

    def restore():
        for name in SIGNATURE_MAPS:
            setattr(ExportGraphSignature, name, _sig_originals.pop(name))
        for cls in (InputSpec, TensorArgument):
            own = _sig_originals.pop(cls)
            if own is None:
                del cls.__setattr__
            else:
                cls.__setattr__ = own
        _sig_memo.clear()

    with _nested("signature", install, restore):
        yield


def _arg_key(a):
    if isinstance(a, torch.fx.Node):
        return ("%", a.name)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg_key(x) for x in a))
    if isinstance(a, dict):
        return ("{", tuple((k, _arg_key(v)) for k, v in a.items()))
    if a is None or isinstance(a, (bool, int, float, str)):
        return (type(a).__name__, a)          # 1, 1.0 and True are different arguments (NaN never matches)
    if isinstance(a, torch.Tensor):
        return ("tensor", id(a))              # the same object; its repr elides values
    return (type(a).__name__, repr(a))        # dtypes, devices, memory formats, slices


def _val_key(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype, tuple(v.stride()), v.device.type)
    return ("other", repr(v))


def _fingerprint(gm) -> tuple:
    """What a retrace's output depends on: every node's kind, name, target and arguments, and the
    metadata of the inputs it starts from."""
    return tuple((n.op, n.name, n.target, _arg_key(n.args), _arg_key(n.kwargs),
                  _val_key(n.meta.get("val")) if n.op == "placeholder" else None) for n in gm.graph.nodes)


_retrace_original = None
_last_retrace: tuple | None = None       # the fingerprint of the last retrace's output
_hooks_of: dict = {}                     # pass class -> whether it retraces with ExportPass's own hooks
retraces = {"run": 0, "skipped": 0}


def _own_hooks(cls) -> bool:
    from executorch.exir.pass_base import ExportPass, _ExportPassBase

    if cls not in _hooks_of:
        hooks = {name for base in (_ExportPassBase, ExportPass) for name, v in vars(base).items()
                 if not name.startswith("__") and name not in ("call", "_abc_impl")}   # methods, nested classes
        mine = [k for k in cls.__mro__ if k not in (ExportPass, _ExportPassBase) and issubclass(k, _ExportPassBase)]
        _hooks_of[cls] = not any(h in vars(k) for k in mine for h in hooks)
    return _hooks_of[cls]


def _call_skipping_idle(self, graph_module):
    global _last_retrace
    from torch.fx.passes.infra.pass_base import PassResult

    if _last_retrace is not None and _own_hooks(type(self)) and _fingerprint(graph_module) == _last_retrace:
        retraces["skipped"] += 1
        return PassResult(graph_module, True)
    result = _retrace_original(self, graph_module)
    retraces["run"] += 1
    _last_retrace = _fingerprint(result.graph_module)
    return result


@contextlib.contextmanager
def skip_idle_retraces():
    """Within the block, an ExportPass retrace that would reproduce its input returns it (see 4. above).
    Nests; restores ExecuTorch's method when the outermost block exits."""
    from executorch.exir.pass_base import _ExportPassBase

    def install():
        global _retrace_original
        _retrace_original, _ExportPassBase.call = _ExportPassBase.call, _call_skipping_idle

    def restore():
        global _retrace_original, _last_retrace
        _ExportPassBase.call = _retrace_original
        _retrace_original = _last_retrace = None

    with _nested("retrace", install, restore):
        yield


_decomp_original = None
_decomposed: "weakref.WeakSet | None" = None   # programs a run_decompositions in the block returned
decompositions = {"run": 0, "skipped": 0}


def _run_decompositions_skipping_idle(self, decomp_table=None, *args, **kwargs):
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    if decomp_table is not None and self in _decomposed \
            and not contains_any_call_fn_target_op(self.graph_module, list(decomp_table.keys())):
        decompositions["skipped"] += 1
        return self
    out = _decomp_original(self, decomp_table, *args, **kwargs)
    decompositions["run"] += 1
    _decomposed.add(out)
    return out


@contextlib.contextmanager
def skip_idle_decompositions():
    """Within the block, run_decompositions over a program a run_decompositions of the block made
    (functional, in inference IR) returns that program when none of its call_function targets is in the
    table (see 5. above). Nests; restores torch's method when the outermost block exits."""
    import weakref

    from torch.export import ExportedProgram

    def install():
        global _decomp_original, _decomposed
        _decomposed = weakref.WeakSet()
        _decomp_original, ExportedProgram.run_decompositions = \
            ExportedProgram.run_decompositions, _run_decompositions_skipping_idle

    def restore():
        global _decomp_original, _decomposed
        ExportedProgram.run_decompositions = _decomp_original
        _decomp_original = _decomposed = None

    with _nested("decompositions", install, restore):
        yield


@contextlib.contextmanager
def fast_passes():
    """shared_provenance(), cached_cia_ops() and memo_signature_maps() together."""
    with shared_provenance(), cached_cia_ops(), memo_signature_maps():
        yield

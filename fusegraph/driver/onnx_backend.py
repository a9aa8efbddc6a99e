"""fusegraph as an `onnx.backend.base.Backend`, so ONNX's own backend test suite can drive it.

`prepare` parses the model (unsupported ops and attributes surface there, as
`UnsupportedOpError` / `ParseError`), and the returned rep runs it on the NumPy reference
target (or, for `GpuFusegraphBackend`, the gpu target), all through `fusegraph.api`. fusegraph
compiles for fixed shapes, so a rep specializes the program to what it is run with, once per
distinct specialization:

- input shapes: the first program uses the model's declared shapes; a run with other shapes (or
  a model with symbolic dimensions) parses again with those shapes;
- shape-setting input values: a value that must be known at compile time (a Reshape target,
  Slice bounds, reduction axes, resize scales) but is fed as a graph input, as ONNX's node tests
  do, raises `DynamicValueError` naming that input; the rep then fixes the input to the value it
  is run with (as an initializer) and parses again. Such inputs are tensors of a few integers in
  practice, so specializing on them costs one parse per distinct value;
- sequence and optional inputs: a fed sequence (a list of arrays) binds its length and its
  elements' shapes, an empty optional (None) its absence (`fusegraph/onnx/structure.py`); a
  sequence output comes back as a list, an empty optional as None.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from fusegraph import api
from fusegraph.errors import DynamicValueError, InputError
from fusegraph.onnx.structure import element_name

Key = tuple[tuple[Any, ...], ...]
Dims = dict[str, "list[int] | None"]


class FusegraphRep(BackendRep):
    """A prepared model: one compiled program per distinct specialization it has been run with."""

    #: the target the specializations are compiled for
    target = "ref"

    def __init__(self, model: onnx.ModelProto, fixed: Sequence[str] = (), fused: bool = False) -> None:
        self.model = model
        self.fused = fused
        initializers = {t.name for t in model.graph.initializer}
        self.inputs = [i for i in model.graph.input if i.name not in initializers]
        self.input_names = [i.name for i in self.inputs]
        self.output_names = [o.name for o in model.graph.output]
        #: inputs whose values (not only shapes) the programs are specialized to
        self.fixed: set[str] = set(fixed)
        self._programs: dict[Key, api.Compiled] = {}

    def specialize(self, dims: Mapping[str, Sequence[int]]) -> api.Compiled:
        """Parse the program for input shapes `dims` (every input, by name) and keep it."""
        key = self._key({}, dims)
        if key not in self._programs:
            self._programs[key] = self._parse(self.model, dims)
        return self._programs[key]

    def _parse(self, model: onnx.ModelProto, dims: Mapping[str, Sequence[int] | None]) -> api.Compiled:
        """Parse, fuse when asked, and compile for the rep's target (kernels keep their default
        configs: tuning would cost more than a conformance case runs)."""
        program = api.parse_onnx(model, input_dims=dims)
        if self.fused:
            api.fuse(program)
        return api.compile(program, self.target, tune=False)

    def declared_dims(self, overrides: Mapping[str, Sequence[int]] | None = None) -> dict[str, list[int]]:
        """The model's input shapes, unknown dimensions read as 1 (a run with real shapes re-specializes)."""
        dims = {}
        for value_info in self.inputs:
            shape = value_info.type.tensor_type.shape.dim
            dims[value_info.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in shape]
        dims.update({k: list(v) for k, v in (overrides or {}).items()})
        return dims

    def _value(self, name: str, x: Any) -> Any:
        """A fed value as the rep holds it: an array, a list of arrays for a sequence input, or
        None for an empty optional input."""
        t = next((i.type for i in self.inputs if i.name == name), None)
        optional = t is not None and t.HasField("optional_type")
        if optional:
            t = t.optional_type.elem_type
        if x is None and optional:
            return None
        if t is None or not t.HasField("sequence_type"):
            return np.asarray(x)
        if not isinstance(x, (list, tuple)):
            raise InputError(f"input {name!r} is a sequence: feed a list of arrays, got {type(x).__name__}")
        return [np.asarray(e) for e in x]

    def structured(self) -> bool:
        """Whether an input is a sequence or an optional, whose structure only a fed value gives."""
        return any(not i.type.HasField("tensor_type") for i in self.inputs)

    def flatten(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], Dims]:
        """The program's input arrays and the dims binding them (`onnx/structure.py`): a fed
        sequence is its elements, an empty optional (None) nothing."""
        arrays: dict[str, np.ndarray] = {}
        dims: Dims = {}
        for name in self.input_names:
            value = feeds[name]
            parts = [] if value is None else [(name, value)] if isinstance(value, np.ndarray) else \
                [(element_name(name, k), x) for k, x in enumerate(value)]
            dims[name] = None if value is None else list(value.shape) if isinstance(value, np.ndarray) else [len(value)]
            for n, x in parts:
                arrays[n] = x
                dims[n] = list(x.shape)
        return arrays, dims

    def _key(self, arrays: Mapping[str, np.ndarray], dims: Dims) -> Key:
        return tuple((n, None if d is None else tuple(int(x) for x in d),
                      *((arrays[n].dtype.str, arrays[n].tobytes()) if n in self.fixed else ()))
                     for n, d in dims.items())

    def program_for(self, arrays: Mapping[str, np.ndarray], dims: Dims) -> api.Compiled:
        """The program specialized to the fed `arrays` bound by `dims`, parsing it on first use."""
        while (key := self._key(arrays, dims)) not in self._programs:
            model = self.model
            if self.fixed:
                model = onnx.ModelProto()
                model.CopyFrom(self.model)
                model.graph.initializer.extend(numpy_helper.from_array(arrays[n], n) for n in sorted(self.fixed))
            try:
                self._programs[key] = self._parse(model, {n: d for n, d in dims.items() if n not in self.fixed})
            except DynamicValueError as e:
                new = set(e.inputs) & set(self.input_names) - self.fixed  # a sequence's elements stay inputs
                if not new:
                    raise
                self.fixed |= new
        return self._programs[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run with inputs given as a list (graph input order), a dict by name, or one array;
        a sequence is a list of arrays, an empty optional None."""
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, Mapping):
            feeds = {k: self._value(k, v) for k, v in inputs.items()}
        else:
            values = list(inputs)
            if len(values) != len(self.input_names):
                raise InputError(f"got {len(values)} inputs, the model expects {len(self.input_names)}: "
                                 f"{', '.join(self.input_names)}")
            feeds = {n: self._value(n, v) for n, v in zip(self.input_names, values)}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {', '.join(map(repr, missing))}")
        arrays, dims = self.flatten(feeds)
        program = self.program_for(arrays, dims)
        results = api.run(program, {n: arrays[n] for n in program.input_shapes})
        structure = program.source_program.meta.get("structured_outputs", {})

        def output(name: str) -> Any:
            if name not in structure:
                return results[name]
            length = structure[name]
            return None if length is None else [results[element_name(name, k)] for k in range(length)]

        return namedtupledict("Outputs", self.output_names)(*map(output, self.output_names))


class FusegraphBackend(Backend):
    """The ONNX backend API over fusegraph's NumPy reference target (CPU only)."""

    #: run the fused program (after the whole pass pipeline) instead of the imported one
    fused = False
    #: the rep class, so that a backend for another target only changes how a program is made
    rep_class: type[FusegraphRep] = FusegraphRep

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except AttributeError:
            return False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> FusegraphRep:
        """Check and parse `model`; `input_dims={name: dims}` may fix symbolic input dimensions."""
        if not cls.supports_device(device):
            raise RuntimeError(f"fusegraph's reference backend runs on the CPU only, not on {device!r}")
        super().prepare(model, device, **kwargs)
        return cls._rep(model, kwargs.get("input_dims"))

    @classmethod
    def _rep(cls, model: onnx.ModelProto, input_dims: Mapping[str, Sequence[int]] | None = None) -> FusegraphRep:
        """A rep with its first program parsed, so that what fusegraph declines surfaces now."""
        rep = cls.rep_class(model, fused=cls.fused)
        if rep.structured():
            return rep  # parsed at the first run, whose fed values give the structure
        try:
            rep.specialize(rep.declared_dims(input_dims))
        except DynamicValueError as e:
            if not e.inputs:
                raise
            rep.fixed |= set(e.inputs)  # specialized to their values at run time
        return rep

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: wrap it in a model whose inputs are the node's present inputs.

        The node is checked (by the base class); the model around it is not, since outputs
        without `outputs_info` have no declared type.
        """
        if not cls.supports_device(device):
            raise RuntimeError(f"fusegraph's reference backend runs on the CPU only, not on {device!r}")
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        names = [n for n in node.input if n]
        arrays = [np.asarray(inputs[n]) for n in names] if isinstance(inputs, Mapping) else [np.asarray(x) for x in inputs]
        if len(arrays) != len(names):
            raise InputError(f"node {node.op_type} has {len(names)} inputs, got {len(arrays)} values")
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                        for n, a in zip(names, arrays)]
        graph_outputs = []
        for k, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and k < len(outputs_info):
                dtype, shape = outputs_info[k]
                graph_outputs.append(onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(onnx.helper.make_empty_tensor_value_info(name))
        graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_operatorsetid("", opset)])
        return cls._rep(model).run(arrays)


prepare = FusegraphBackend.prepare
run_model = FusegraphBackend.run_model
run_node = FusegraphBackend.run_node
supports_device = FusegraphBackend.supports_device


class FusedFusegraphBackend(FusegraphBackend):
    """The same backend running fused programs: the conformance suite then checks the passes."""

    fused = True


class GpuFusegraphRep(FusegraphRep):
    """A rep whose specializations are compiled for the gpu target (one CompiledProgram each).

    Each run first fills every intermediate and output buffer with NaN (`poison`): an element no
    kernel writes then differs from the expected output instead of passing with a stale value
    left by an earlier run.
    """

    target = "gpu"

    def program_for(self, arrays: Mapping[str, np.ndarray], dims: Dims) -> Any:
        compiled = super().program_for(arrays, dims)
        compiled.poison()
        return compiled


class GpuFusegraphBackend(FusegraphBackend):
    """The backend running the gpu target's kernels: on a CUDA GPU when one is present,
    otherwise under Triton's interpreter on the CPU (the target decides, not the device name).

    `compile` runs the whole pass pipeline itself. Kernels are not autotuned: each runs with its
    default config, which is what matters for correctness and keeps a case's compile time to code
    generation. A fused group without a GPU template raises `CodegenError` from `prepare`.
    """

    rep_class = GpuFusegraphRep

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type in (DeviceType.CPU, DeviceType.CUDA)
        except AttributeError:
            return False

"""Product operands read by the tensor memory accelerator (TMA) of Hopper and later GPUs.

Without it every thread of a product kernel issues 16-byte asynchronous copies for its share of
each operand tile, with their address arithmetic and masks; the TMA copies a whole tile, masks
included (zeros outside the tensor), on one thread's request, so the warps keep their issue
slots and registers for the tensor cores. It reads only a tile of a strided 2-d tensor: an
operand qualifies when its address over the tile is `base + stride * outer + inner`, with the
tile's two variables as `outer` and `inner` (in either order) and a base that depends on the
program alone (the batch index `gz`), all 16-byte aligned (every buffer is:
`compiled_program.INPUT_ALIGNMENT`).

The descriptor of each such operand is made in the kernel (`tl.make_tensor_descriptor`), which
needs 128 bytes of global scratch per program and descriptor: Triton asks the allocator set
by `triton.set_allocator` at each launch (`compiled_program.ensure_allocator`). It is made after a dependent
launch's wait, since a kernel launched early may get the scratch its predecessor still uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusegraph.ir.index_expr import Const, Expr, Sum, Var, to_source
from fusegraph.targets.gpu.device import current_device
from fusegraph.targets.gpu.errors import switch_setting

TMA_ENV = "FUSEGRAPH_TMA"
TMA_CAPABILITY = 90  # sm_90 (Hopper) has the tensor memory accelerator
ALIGNMENT = 16  # bytes: a descriptor's base address and its row stride


def tma_wanted(interpret: bool) -> bool:
    """Whether product kernels read eligible operands through tensor descriptors: only under
    `FUSEGRAPH_TMA=1`, on a GPU of compute capability 9.0 and later (a build without a GPU
    targets the H200) or under the interpreter (how the tests run it).

    Off by default: on an H100 under Triton 3.6 every transformer GEMM of bench/gemm.py ran
    slower with them (1.26-1.56x cuBLAS's time against 1.08-1.32x with pointer loads,
    bench/results/gemm-tma-h100.md): each program makes its two descriptors in global memory
    before its first copy, and at 6 to 48 k chunks per tile that is not won back. A persistent
    schedule, which makes them once per multiprocessor, did beat pointer loads on the fc1 shapes
    (bench/results/gemm-schedules-h100.md); this is its operand half."""
    setting = switch_setting(TMA_ENV, "tensor-memory-accelerator loads wherever an operand allows", "none, the default")
    return setting == "1" and (interpret or current_device().capability >= TMA_CAPABILITY)


@dataclass(frozen=True)
class TmaOperand:
    """A tile operand as a 2-d tensor: `rows` x `cols` elements, `stride` elements from one row
    to the next, starting at element offset `base` (over program scalars) of its buffer. The
    tile's `outer` variable walks rows and `inner` the contiguous columns."""

    base: Expr
    outer: str
    inner: str
    rows: int
    cols: int
    stride: int

    def descriptor(self, name: str, arg: str, block: tuple[str, str]) -> str:
        """The line making this operand's descriptor `name` over pointer `arg` with tile `block`."""
        base = to_source(self.base, {"gz": "gz"})
        ptr = arg if base == "0" else f"{arg} + {base}"
        return (f"{name} = tl.make_tensor_descriptor({ptr}, shape=[{self.rows}, {self.cols}], "
                f"strides=[{self.stride}, 1], block_shape=[{block[0]}, {block[1]}])")


def tma_operand(addr: Expr, tile_vars: tuple[str, str], itemsize: int) -> TmaOperand | None:
    """`addr` (the element offset an operand tile reads, over its two tile variables and the
    program's `gz`) as a 2-d tensor, or None where the TMA cannot read it."""
    const, terms = (addr.const, dict(addr.terms)) if isinstance(addr, Sum) else (0, {addr: 1})
    coeff: dict[str, int] = {}
    extent: dict[str, int] = {}
    for atom, c in terms.items():
        if not isinstance(atom, Var) or atom.name not in (*tile_vars, "gz") or atom.name in coeff:
            return None
        coeff[atom.name], extent[atom.name] = c, atom.extent
    inner = [v for v in tile_vars if coeff.get(v) == 1]
    if len(inner) != 1:
        return None
    outer = next(v for v in tile_vars if v != inner[0])
    stride = coeff.get(outer, 0)
    base_terms = [(Var("gz", extent["gz"]), coeff["gz"])] if "gz" in coeff else []
    aligned = all(x * itemsize % ALIGNMENT == 0 for x in (const, coeff.get("gz", 0), stride))
    if not aligned or stride <= 0 or extent[inner[0]] * itemsize < ALIGNMENT:
        return None
    return TmaOperand(Sum(const, base_terms) if base_terms else Const(const), outer, inner[0],
                      extent[outer], extent[inner[0]], stride)

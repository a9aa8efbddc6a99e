"""Every operator, defined once. Importing this package registers them all."""

from fusegraph.ops import anchors, attention, fused, gather, movement, pointwise, reduce, source, views  # noqa: F401
from fusegraph.ops.base import REGISTRY, Op, OpKind, make_op

__all__ = ["REGISTRY", "Op", "OpKind", "make_op"]

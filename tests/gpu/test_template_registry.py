"""Templates register the op families they lower (targets/gpu/templates/registry.py): every op
with a family finds its template, the flat template's families find an emitter per op, and an
op without one is named in the error."""

from __future__ import annotations

import pytest

import fusegraph.targets.gpu.codegen  # noqa: F401  (imports every template, which registers itself)
from fusegraph.ops.base import REGISTRY, Op, OpKind
from fusegraph.targets.gpu.errors import CodegenError
from fusegraph.targets.gpu.templates.flat import anchored_flat_kernel
from fusegraph.targets.gpu.templates.gemm import gemm_kernel
from fusegraph.targets.gpu.templates.registry import EMITTERS, emitter_for, template_for


def test_every_family_has_a_template_and_every_flat_anchor_an_emitter():
    for cls in REGISTRY.values():
        if not cls.family:
            continue
        template = template_for(cls)  # the lookups read class traits only
        if template is anchored_flat_kernel:
            assert cls in EMITTERS, cls.name
    assert template_for(REGISTRY["convolution"]) is gemm_kernel


def test_an_op_without_a_template_is_named():
    class Unlowered(Op):
        name = "unlowered_op"
        kind = OpKind.ANCHOR
        family = "window"

    with pytest.raises(CodegenError, match="unlowered_op"):
        emitter_for(Unlowered())
    Unlowered.family = "no_such_family"
    with pytest.raises(CodegenError, match="unlowered_op"):
        template_for(Unlowered())

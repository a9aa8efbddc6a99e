"""Deterministic random parameters for zoo models.

Why random: nothing may be downloaded, and a compiler's tests need numbers that exercise every
weight (constant weights hide a transposed or misindexed weight). Why deterministic: two loads
of the same zoo name must give the same model, so failures reproduce and results can be compared
across runs and machines. Each tensor gets its own stream, seeded from the model name AND the
tensor name, so one tensor's values never depend on how many tensors came before it.

Scales (per kind of parameter slot):
  conv_weight / gemm_weight  N(0, gain^2 / fan_in)  -- see `fusegraph.zoo` for the gains chosen
  conv_bias / gemm_bias      N(0, 0.01^2)
  bn_scale                   U(0.5, 1.5)
  bn_bias                    N(0, 0.1^2)
  bn_mean                    N(0, 0.1^2)
  bn_var                     U(0.5, 1.5)    (positive, away from 0: no blow-up through 1/sqrt(var))
  channel_scale (a Mul)      U(0.5, 1.5)    (caffe2-style affine after BN in the light models)
  channel_shift (an Add)     N(0, 0.1^2)
  norm_scale / norm_bias     U(0.5, 1.5) / N(0, 0.1^2)   (LayerNormalization's affine)
  embedding                  N(0, 1)        (token tables: a LayerNorm follows the lookup anyway)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

#: Every kind of parameter this module knows how to make.
KINDS = (
    "conv_weight", "conv_bias", "gemm_weight", "gemm_bias",
    "bn_scale", "bn_bias", "bn_mean", "bn_var", "channel_scale", "channel_shift",
    "norm_scale", "norm_bias", "embedding",
)


def _seed_words(text: str) -> list[int]:
    """Four 32-bit words from SHA-256: stable across Python runs (unlike `hash()`)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]


def rng_for(model_seed: str, tensor_name: str) -> np.random.Generator:
    """The random stream of one tensor of one model."""
    return np.random.default_rng(_seed_words(model_seed) + _seed_words(tensor_name))


def make(kind: str, dims: Sequence[int], *, model_seed: str, tensor_name: str,
         fan_in: int | None = None, gain: float = 1.0, dtype: str = "float32") -> np.ndarray:
    """One parameter tensor of `kind` with shape `dims`, reproducible from the two seeds."""
    if kind not in KINDS:
        raise ValueError(f"unknown parameter kind {kind!r}; known: {', '.join(KINDS)}")
    shape = tuple(int(d) for d in dims)
    rng = rng_for(model_seed, tensor_name)
    if kind in ("conv_weight", "gemm_weight"):
        if not fan_in or fan_in <= 0:
            raise ValueError(f"{tensor_name}: {kind} needs a positive fan_in, got {fan_in!r}")
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(gain / math.sqrt(fan_in))  # in place: VGG-19 has a 100M-element weight
    elif kind in ("conv_bias", "gemm_bias"):
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(0.01)
    elif kind == "embedding":
        out = rng.standard_normal(shape, dtype=np.float32)
    elif kind in ("bn_bias", "bn_mean", "channel_shift", "norm_bias"):
        out = rng.standard_normal(shape, dtype=np.float32)
        out *= np.float32(0.1)
    else:  # bn_scale, bn_var, channel_scale, norm_scale
        out = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return out.astype(np.dtype(dtype), copy=False)

"""Run-time inputs for the command line: `--input-dim` parsing, .npy files and random inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from fusegraph.errors import FusegraphError, InputError
from fusegraph.ir.shape import Shape


def parse_input_dims(specs: Sequence[str] | None) -> dict[str, list[int]]:
    """`name:1,3,640,640` (repeatable) -> {name: [1, 3, 640, 640]}; the name may contain ':'."""
    out: dict[str, list[int]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            out[name] = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise FusegraphError(f"--input-dim {spec!r}: expected NAME:D0,D1,... (e.g. images:1,3,640,640)") from None
    return out


def random_inputs(shapes: Mapping[str, Shape], seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh random inputs: floats uniform in [0, 1) (the range of normalized images), integers in
    [0, 10), booleans 50/50."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        dt = shape.dtype.numpy
        if shape.dtype.is_float:
            out[name] = rng.random(shape.lens).astype(dt)
        elif shape.dtype.is_integer:
            out[name] = rng.integers(0, 10, shape.lens).astype(dt)
        else:
            out[name] = rng.random(shape.lens) < 0.5
    return out


def load_inputs(specs: Sequence[str] | None, shapes: Mapping[str, Shape], seed: int) -> dict[str, np.ndarray]:
    """Inputs from `--input name=file.npy` where given, random ones for the rest."""
    given: dict[str, np.ndarray] = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep:
            raise InputError(f"--input {spec!r}: expected NAME=FILE.npy")
        if name not in shapes:
            raise InputError(f"--input names unknown input {name!r}; the program expects: {', '.join(shapes)}")
        try:
            loaded = np.load(Path(path), allow_pickle=False)
        except Exception as e:  # noqa: BLE001  (a corrupt file raises ValueError, EOFError, TokenError, ...)
            reason = " ".join(str(e).split())
            raise InputError(f"--input {name}: cannot read {path}: {type(e).__name__}: {reason}") from None
        if not isinstance(loaded, np.ndarray):
            loaded.close()
            raise InputError(f"--input {name}: {path} is an .npz archive, not one .npy array")
        given[name] = loaded
    rest = random_inputs({k: v for k, v in shapes.items() if k not in given}, seed)
    return {**rest, **given}

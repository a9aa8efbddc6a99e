"""Run-time inputs for the command line: `--input-dim` parsing, .npy files and random inputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

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


Ranges = Mapping[str, Sequence[int]]


def input_ranges(program: Any) -> dict[str, tuple[int, int]]:
    """The [low, high) value range of each integer input that the model declares.

    Token ids must lie inside the vocabulary and masks in {0, 1}, which nothing in a graph's
    types says; a zoo model states it in its metadata (`fusegraph.input_ranges`, JSON
    {input: [low, high]}), which the importer keeps in `program.meta["input_ranges"]`.
    """
    text = getattr(program, "meta", {}).get("input_ranges")
    if not text:
        return {}
    return {name: (int(lo), int(hi)) for name, (lo, hi) in json.loads(text).items()}


def random_inputs(shapes: Mapping[str, Shape], seed: int = 0, ranges: Ranges | None = None) -> dict[str, np.ndarray]:
    """Fresh random inputs: floats uniform in [0, 1) (the range of normalized images), integers in
    their declared range (`input_ranges`) or else in [0, 10), booleans 50/50."""
    rng = np.random.default_rng(seed)
    ranges = ranges or {}
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        dt = shape.dtype.numpy
        if shape.dtype.is_float:
            out[name] = rng.random(shape.lens).astype(dt)
        elif shape.dtype.is_integer:
            lo, hi = ranges.get(name, (0, 10))
            out[name] = rng.integers(lo, hi, shape.lens).astype(dt)
        else:
            out[name] = rng.random(shape.lens) < 0.5
    return out


def load_inputs(specs: Sequence[str] | None, shapes: Mapping[str, Shape], seed: int,
                ranges: Ranges | None = None) -> dict[str, np.ndarray]:
    """Inputs from `--input name=file.npy` where given, random ones (within `ranges`) for the rest."""
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
    rest = random_inputs({k: v for k, v in shapes.items() if k not in given}, seed, ranges)
    return {**rest, **given}

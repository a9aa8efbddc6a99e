"""`fusegraph perf`'s launch line says which kernels start early (dependent launch) and how many
of those prefetch their weights, since their times measured alone then overlap in a run."""

from __future__ import annotations

from types import SimpleNamespace

from fusegraph.driver.perf import early_launches, launch_note


def compiled_of(*kernels: tuple[bool, list[str]]) -> SimpleNamespace:
    return SimpleNamespace(kernels=[SimpleNamespace(src=SimpleNamespace(dependent_launch=d, before_wait=b))
                                    for d, b in kernels])


def test_plain_kernels_add_nothing():
    plain = compiled_of((False, []), (False, ["    prefetch"]))
    assert early_launches(plain) == 0 and launch_note(plain) == ""


def test_dependent_launches_and_their_prefetches_are_counted():
    mixed = compiled_of((True, ["    prefetch"]), (True, []), (True, ["    prefetch"]), (False, ["    prefetch"]))
    assert early_launches(mixed) == 3
    assert launch_note(mixed) == ("; 3 with dependent launch, each started while the one before it runs, "
                                  "2 of them prefetching their weights first")

"""Test-session setup.

Without an NVIDIA GPU the gpu target's kernels run under Triton's interpreter, which must be
switched on before Triton is first imported (its standard library is defined at import):
so it is set here, before any test module can import torch or triton.
"""

import os

from tests.helpers import has_gpu

if not has_gpu() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config):
    """Register the gpu conformance table here, in the process that prints the session summary:
    under pytest-xdist the tests run in workers and only their reports reach this process."""
    from conformance.summary import register_gpu_summary

    register_gpu_summary(config)

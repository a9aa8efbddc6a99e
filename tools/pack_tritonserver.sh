#!/usr/bin/env bash
# Pack the Triton server of the installed nvidia-pytriton wheel for the lent GPU machine, where
# nothing installs from a registry and the working tree that travels is limited to 64 MiB (the
# wheel's server files are about 145 MB): the server binary, the Python backend, the caches, the
# backend stub of the GPU machine's Python (3.12 by default) and the bundled libraries but the
# 31 MB libpython of the 3.13 stub, xz-compressed to about 25 MB in .work/ (git-ignored).
#   bash tools/pack_tritonserver.sh [PYTHON_VERSION]      # from the repository root, ~2 min
# On the GPU machine (carry .work), tools/gpu_check.sh's serve_bench step unpacks it.
set -euo pipefail
version=${1:-3.12}
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
test -x "$site/pytriton/tritonserver/bin/tritonserver" || { echo "no nvidia-pytriton wheel in .venv" >&2; exit 2; }
mkdir -p .work
tar cf - -C "$site" --exclude='libpython3-*' --exclude='__pycache__' pytriton/tritonserver/bin \
    pytriton/tritonserver/backends pytriton/tritonserver/caches "pytriton/tritonserver/python_backend_stubs/$version" \
    nvidia_pytriton.libs | xz -9 -T0 > .work/tritonserver.tar.xz
ls -l .work/tritonserver.tar.xz

#!/usr/bin/env bash
# install-libtorch.sh: make a libtorch available to scripts/build-worker.sh.
#  - If a pip torch is importable (GPU machines), its bundled libtorch is used
#    as is: nothing to install (build-worker.sh reads headers, libs and the
#    CXX11 ABI flag from the wheel).
#  - Else, on Debian/Ubuntu, install what building and running the worker
#    needs, and nothing else:
#      libtorch-dev         libtorch 1.13 (CPU): the headers, and libtorch1.13,
#                           whose libtorch_cpu.so itself links OpenCV and
#                           FFmpeg: on a fresh Debian 12 it brings 279 of the
#                           344 packages (822 of 1229 MB) by itself
#      libgloo-dev          the gloo headers that c10d's ProcessGroupGloo.hpp
#                           includes (Debian ships them apart), for
#                           data-parallel training on CPU
#      libopenblas0-openmp  Debian's default reference BLAS makes fp32
#                           matmul about 14x slower
#      g++                  the compiler (cgo needs its gcc too)
#    python3-torch (the PyTorch baseline of the benchmarks) is not among
#    them: scripts/install-bench-tools.sh installs it for `make bench`.
#    apt prints one line per phase; its own output is in build/logs/apt-libtorch.log.
set -euo pipefail

ok() { printf '  \342\234\223 %s\n' "$*"; }
bad() { printf '  \342\234\227 %s\n' "$*" >&2; }

for py in ${PYTHON:-} python3 /usr/bin/python3; do
  [[ -z "$py" ]] && continue
  if info=$("$py" - 2>/dev/null <<'PY'
import os, torch
d = os.path.dirname(torch.__file__)
if not d.startswith("/usr/lib/python3/") and os.path.isdir(os.path.join(d, "include", "torch")):
    print(torch.__version__, "cuda" if torch.cuda.is_available() else "cpu", d)
PY
  ) && [[ -n "$info" ]]; then
    ok "pip torch found ($info) via $py: build-worker.sh will use its libtorch (PYTHON=$py)"
    exit 0
  fi
done

if ! command -v apt-get >/dev/null; then
  bad "no pip torch and no apt-get: install a torch wheel (pip install torch) or set LIBTORCH=/path/to/libtorch"
  exit 1
fi
# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
apt_install libtorch libtorch-dev libgloo-dev libopenblas0-openmp g++ || {
  bad "could not install libtorch-dev (see above)"
  exit 1
}
sudo=""
[[ $(id -u) != 0 ]] && sudo="sudo"
# Prefer the OpenMP OpenBLAS over the reference BLAS for libblas.so.3.
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
alt=/usr/lib/$multiarch/openblas-openmp/libblas.so.3
if [[ -f $alt ]]; then
  $sudo update-alternatives --set "libblas.so.3-$multiarch" "$alt" >/dev/null 2>&1 || true
fi
ok "libtorch-dev $(dpkg-query -W -f='${Version}' libtorch-dev)"
ok "BLAS: $(readlink -f "/usr/lib/$multiarch/libblas.so.3")"

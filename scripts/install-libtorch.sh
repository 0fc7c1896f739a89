#!/usr/bin/env bash
# install-libtorch.sh: make a libtorch available to scripts/build-worker.sh.
#  - If a pip torch is importable (GPU machines), its bundled libtorch is used
#    as is: nothing to install (build-worker.sh reads headers, libs and the
#    CXX11 ABI flag from the wheel).
#  - Else, on Debian/Ubuntu, install libtorch-dev (libtorch 1.13, CPU) with
#    libopenblas0-openmp: Debian's default reference BLAS makes fp32 matmul
#    about 14x slower. python3-torch (the same libtorch) is installed too, for
#    scripts/bench-worker's PyTorch-eager baseline.
#    libgloo-dev supplies the gloo headers that c10d's ProcessGroupGloo.hpp
#    includes (Debian ships them apart), for data-parallel training on CPU.
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
sudo=""
[[ $(id -u) != 0 ]] && sudo="sudo"
pkgs=(libtorch-dev libgloo-dev libopenblas0-openmp python3-torch g++)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Prefer the OpenMP OpenBLAS over the reference BLAS for libblas.so.3.
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
alt=/usr/lib/$multiarch/openblas-openmp/libblas.so.3
if [[ -f $alt ]]; then
  $sudo update-alternatives --set "libblas.so.3-$multiarch" "$alt" >/dev/null 2>&1 || true
fi
ok "libtorch-dev $(dpkg-query -W -f='${Version}' libtorch-dev)"
ok "BLAS: $(readlink -f /usr/lib/$multiarch/libblas.so.3)"

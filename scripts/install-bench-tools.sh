#!/usr/bin/env bash
# install-bench-tools.sh: what only `make bench` needs beyond the demo's
# libtorch and worker: PyTorch, for the baselines that scripts/bench-worker
# (training step vs PyTorch eager) and scripts/bench-sample (sampling vs a
# PyTorch KV-cache loop) measure in the same run.
#  - If ${PYTHON:-/usr/bin/python3} imports torch already (Debian's or a pip
#    torch), nothing is installed.
#  - Else, on Debian/Ubuntu, python3-torch: the same libtorch 1.13 as
#    libtorch-dev, so both sides of each ratio run the same kernels: 24
#    packages, 28 MB to download, 171 MB on disk, on top of the demo's.
# apt prints one line per phase; its own output is in build/logs/apt-bench-tools.log.
set -euo pipefail

ok() { printf '  \342\234\223 %s\n' "$*"; }
bad() { printf '  \342\234\227 %s\n' "$*" >&2; }

py=${PYTHON:-/usr/bin/python3}
version() { "$py" -c 'import torch; import os; print(torch.__version__, "in", os.path.dirname(torch.__file__))' 2>/dev/null; }

if v=$(version); then
  ok "PyTorch baseline: torch $v ($py)"
  exit 0
fi
# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
rc=0
apt_install bench-tools python3-torch || rc=$?
if ((rc == 2)); then
  bad "$py cannot import torch and there is no apt-get: install torch for $py (or set PYTHON) for the benchmarks' PyTorch baselines"
  exit 1
elif ((rc != 0)); then
  bad "could not install python3-torch (see above): the benchmarks' PyTorch baselines need it"
  exit 1
fi
if v=$(version); then
  ok "PyTorch baseline: torch $v ($py)"
else
  bad "python3-torch is installed but $py cannot import torch (set PYTHON to the python that has it)"
  exit 1
fi

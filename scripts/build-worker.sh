#!/usr/bin/env bash
# build-worker.sh: build the libtorch worker (internal/worker/csrc) as a shared
# library, build/worker/libortrain_worker.so, against whichever libtorch is
# present: $LIBTORCH (a directory with include/ and lib/), a pip torch wheel
# importable by ${PYTHON:-python3}, or Debian's libtorch-dev. Incremental:
# only translation units whose sources, headers or flags changed are rebuilt.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
src=$root/internal/worker/csrc
out=${ORTRAIN_BUILD_DIR:-$root/build/worker}
py=${PYTHON:-python3}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
mkdir -p "$out/obj"

ok() { printf '  \342\234\223 %s\n' "$*"; }
bad() { printf '  \342\234\227 %s\n' "$*" >&2; }

# find_libtorch sets inc (include flags), libdir, abi (0/1 or empty) and origin.
find_libtorch() {
  if [[ -n "${LIBTORCH:-}" ]]; then
    inc="-I$LIBTORCH/include -I$LIBTORCH/include/torch/csrc/api/include"
    libdir=$LIBTORCH/lib
    abi=${CXX11_ABI:-}
    origin="LIBTORCH=$LIBTORCH"
    return 0
  fi
  local wheel
  if wheel=$("$py" - 2>/dev/null <<'PY'
import os, torch
d = os.path.dirname(torch.__file__)
if not d.startswith("/usr/lib/python3/") and os.path.isdir(os.path.join(d, "include", "torch")) and os.path.isdir(os.path.join(d, "lib")):
    print(d, int(torch.compiled_with_cxx11_abi()), torch.__version__)
PY
  ) && [[ -n "$wheel" ]]; then
    read -r tdir abi tver <<<"$wheel"
    inc="-I$tdir/include -I$tdir/include/torch/csrc/api/include"
    libdir=$tdir/lib
    origin="pip torch $tver ($tdir)"
    return 0
  fi
  if [[ -f /usr/include/torch/csrc/api/include/torch/version.h ]]; then
    local multiarch
    multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
    inc="-I/usr/include/torch/csrc/api/include"
    libdir=/usr/lib/$multiarch
    abi=""
    origin="Debian libtorch-dev ($(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo unknown))"
    return 0
  fi
  return 1
}

echo "ortrain worker build"
if ! find_libtorch; then
  bad "libtorch: not found; run scripts/install-libtorch.sh (or set LIBTORCH=/path/to/libtorch)"
  exit 1
fi
ok "libtorch: $origin"

cxxflags="-O2 -fno-math-errno -g0 -std=c++17 -fPIC -Wall -Wno-unused-parameter $inc"
[[ -n "$abi" ]] && cxxflags="$cxxflags -D_GLIBCXX_USE_CXX11_ABI=$abi"
libs="-L$libdir -Wl,-rpath,$libdir -ltorch_cpu -lc10"
cuda="no"
if [[ -f "$libdir/libtorch_cuda.so" ]]; then
  libs="$libs -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed"
  cuda="yes"
fi
[[ -f "$libdir/libtorch.so" ]] && libs="$libs -Wl,--no-as-needed -ltorch -Wl,--as-needed"
ok "CUDA support in libtorch: $cuda"

stamp="$out/flags"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$cxxflags $libs" ]]; then
  rm -f "$out"/obj/*.o
  echo "$cxxflags $libs" >"$stamp"
fi

headers=("$src"/*.h)
pids=()
for cpp in "$src"/*.cpp; do
  obj=$out/obj/$(basename "${cpp%.cpp}").o
  stale=0
  [[ ! -f "$obj" || "$cpp" -nt "$obj" ]] && stale=1
  for h in "${headers[@]}"; do [[ "$h" -nt "$obj" ]] && stale=1; done
  [[ $stale == 0 ]] && continue
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
  echo "  compiling $(basename "$cpp")"
  # shellcheck disable=SC2086
  g++ $cxxflags -c "$cpp" -o "$obj.tmp" && mv "$obj.tmp" "$obj" &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [[ $fail != 0 ]]; then
  bad "compile failed"
  exit 1
fi

lib=$out/libortrain_worker.so
if [[ ! -f "$lib" ]] || [[ -n "$(find "$out/obj" -name '*.o' -newer "$lib")" ]]; then
  # shellcheck disable=SC2086
  g++ -shared -o "$lib.tmp" "$out"/obj/*.o $libs && mv "$lib.tmp" "$lib"
fi
abi_version=$(grep -m1 'define ORT_ABI_VERSION' "$src/worker_abi.h" | awk '{print $3}')
ok "worker ABI version $abi_version"
ok "library: $lib"

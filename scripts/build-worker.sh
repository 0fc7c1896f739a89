#!/usr/bin/env bash
# build-worker.sh: build the libtorch worker (internal/worker/csrc) as a shared
# library, build/worker/libortrain_worker.so, against whichever libtorch is
# present: $LIBTORCH (a directory with include/ and lib/), a pip torch wheel
# importable by ${PYTHON:-python3}, or Debian's libtorch-dev, with ${CXX:-g++}.
# The language standard is C++17 unless the libtorch headers demand C++20
# (recent 2.x). Incremental: only translation units whose sources, headers or
# flags changed are rebuilt.
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
    local pkg ver=""
    for pkg in libtorch-dev libtorch-cuda-dev; do
      ver=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) && [[ -n $ver ]] && break
    done
    origin="Debian $pkg (${ver:-version unknown})"
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

cxx=${CXX:-g++}
base="-O2 -fno-math-errno -g0 -fPIC -Wall -Wno-unused-parameter $inc"
[[ -n "$abi" ]] && base="$base -D_GLIBCXX_USE_CXX11_ABI=$abi"

# The headers' own version (torch/version.h moved under torch/headeronly in
# 2.x; the preprocessor finds it either way).
# shellcheck disable=SC2086
read -r tmaj tmin tpatch < <(printf '#include <torch/version.h>\nTORCH_VERSION_MAJOR TORCH_VERSION_MINOR TORCH_VERSION_PATCH\n' |
  "$cxx" $inc -E -P -x c++ - 2>/dev/null | tail -n 1) || true
tver="$tmaj.$tmin.$tpatch"
if [[ ! $tver =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  bad "libtorch headers: cannot read torch/version.h with $cxx $inc"
  exit 1
fi
cxxver=$("$cxx" -dumpfullversion 2>/dev/null || "$cxx" -dumpversion)

# The language standard follows the headers: C++17, which libtorch 1.13 was
# built with, unless they demand more (recent ATen stops with "#error C++20
# or later"). One probe per headers, compiler and flags, cached like the
# c10d probe below.
std_key="$base|$cxx $cxxver|libtorch $tver"
std_cache=$out/std
if [[ -f "$std_cache" && "$(head -1 "$std_cache")" == "$std_key" ]]; then
  std=$(sed -n 2p "$std_cache")
  std_note=$(sed -n 3p "$std_cache")
else
  std="" std_note="" std_err=""
  for s in c++17 c++20; do
    # shellcheck disable=SC2086
    if err=$(printf '#include <ATen/ATen.h>\n' | "$cxx" $base -std=$s -Wfatal-errors -fsyntax-only -x c++ - 2>&1); then
      std=$s
      break
    fi
    [[ -z $std_err ]] && std_err=$(grep -m1 'error' <<<"$err" || printf '%s' "${err%%$'\n'*}")
  done
  if [[ -z $std ]]; then
    bad "libtorch $tver headers do not compile with $cxx $cxxver as C++17 or C++20: ${std_err:-no message}"
    exit 1
  fi
  [[ $std != c++17 ]] && std_note="the headers reject C++17: ${std_err#*error: }"
  printf '%s\n%s\n%s\n' "$std_key" "$std" "$std_note" >"$std_cache"
fi
ok "C++ standard: $std ($cxx $cxxver, libtorch $tver headers${std_note:+; $std_note})"
cxxflags="-std=$std $base"
libs="-L$libdir -Wl,-rpath,$libdir -ltorch_cpu -lc10"
cuda="no"
if [[ -f "$libdir/libtorch_cuda.so" ]]; then
  libs="$libs -Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed"
  cuda="yes"
fi
[[ -f "$libdir/libtorch.so" ]] && libs="$libs -Wl,--no-as-needed -ltorch -Wl,--as-needed"
ok "CUDA support in libtorch: $cuda"

# c10d backends for data-parallel training (csrc/dist.cpp): each is compiled
# in when libtorch exports it and its headers parse (Gloo needs the gloo
# headers: libgloo-dev on Debian; NCCL needs nccl.h and the CUDA runtime
# headers: a CUDA toolkit or pip's nvidia-* wheels). The probe is cached per
# libtorch and flags, with why a backend is missing, so the build says so.
c10d_key="$cxxflags $libs|$cxx $cxxver|libtorch $tver"
c10d_cache=$out/c10d
if [[ -f "$c10d_cache" && "$(head -1 "$c10d_cache")" == "$c10d_key" ]]; then
  c10d_flags=$(sed -n 2p "$c10d_cache")
  c10d_note=$(sed -n 3p "$c10d_cache")
  c10d_why=$(sed -n 4p "$c10d_cache")
else
  exports() { # $1: symbol substring; the rest: libraries to search
    local sym=$1 f
    shift
    for f in "$@"; do [[ -f "$f" ]] && nm -DC --defined-only "$f" 2>/dev/null | grep -F "$sym" >/dev/null && return 0; done
    return 1
  }
  parse_err="" # the first error of the last failed parses
  parses() { # $1: header under torch/csrc/distributed/c10d; the rest: flags
    local h=$1 err
    shift
    # shellcheck disable=SC2086
    if err=$(printf '#include <torch/csrc/distributed/c10d/%s>\n' "$h" | "$cxx" $cxxflags "$@" -Wfatal-errors -fsyntax-only -x c++ - 2>&1); then
      return 0
    fi
    parse_err=$(grep -m1 'error' <<<"$err" || printf '%s' "${err%%$'\n'*}")
    return 1
  }
  c10d_flags="" c10d_note="" c10d_why=""
  if ! exports 'c10d::ProcessGroupGloo::ProcessGroupGloo(' "$libdir/libtorch_cpu.so"; then
    c10d_why="gloo: $libdir/libtorch_cpu.so has no c10d::ProcessGroupGloo (libtorch built without Gloo)"
  elif ! parses ProcessGroupGloo.hpp -DUSE_C10D_GLOO; then
    c10d_why="gloo: ProcessGroupGloo.hpp does not compile (gloo headers: libgloo-dev on Debian): $parse_err"
  else
    c10d_flags="-DUSE_C10D_GLOO" c10d_note="gloo"
  fi
  if [[ $cuda == yes ]]; then
    nccl_inc=""
    for d in "$libdir/../../nvidia/nccl/include" "$libdir/../../nvidia/cuda_runtime/include" \
      "${CUDA_HOME:-/usr/local/cuda}/include"; do
      [[ -d "$d" ]] && nccl_inc="$nccl_inc -I$(cd "$d" && pwd)"
    done
    # shellcheck disable=SC2086
    if ! exports 'c10d::ProcessGroupNCCL::ProcessGroupNCCL(' "$libdir/libtorch_cuda.so" "$libdir/libtorch_cuda_cpp.so"; then
      c10d_why="$c10d_why${c10d_why:+; }nccl: libtorch_cuda has no c10d::ProcessGroupNCCL"
    elif ! parses ProcessGroupNCCL.hpp -DUSE_C10D_NCCL $nccl_inc; then
      c10d_why="$c10d_why${c10d_why:+; }nccl: ProcessGroupNCCL.hpp does not compile (nccl.h and the CUDA runtime headers): $parse_err"
    else
      c10d_flags="$c10d_flags -DUSE_C10D_NCCL $nccl_inc" c10d_note="$c10d_note nccl"
    fi
  fi
  printf '%s\n%s\n%s\n%s\n' "$c10d_key" "$c10d_flags" "$c10d_note" "$c10d_why" >"$c10d_cache"
fi
c10d_note=${c10d_note# }
ok "c10d backends: ${c10d_note:-none (data-parallel training unavailable)}"
if [[ -n $c10d_why ]]; then bad "c10d backends missing: $c10d_why"; fi
cxxflags="$cxxflags $c10d_flags"

stamp="$out/flags"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$cxxflags $libs" ]]; then
  rm -f "$out"/obj/*.o
  echo "$cxxflags $libs" >"$stamp"
fi

# An object whose source is gone (a file renamed or split) would be linked
# in beside its successor: drop it, and relink.
relink=""
for obj in "$out"/obj/*.o; do
  [[ -e "$obj" ]] || continue
  if [[ ! -f "$src/$(basename "${obj%.o}").cpp" ]]; then
    rm -f "$obj"
    relink=1
  fi
done

# The stale translation units are listed first, so the progress lines can
# count them.
headers=("$src"/*.h)
stale=()
for cpp in "$src"/*.cpp; do
  obj=$out/obj/$(basename "${cpp%.cpp}").o
  if [[ ! -f "$obj" || "$cpp" -nt "$obj" ]]; then
    stale+=("$cpp")
    continue
  fi
  for h in "${headers[@]}"; do
    if [[ "$h" -nt "$obj" ]]; then
      stale+=("$cpp")
      break
    fi
  done
done
pids=()
i=0
for cpp in "${stale[@]}"; do
  i=$((i + 1))
  obj=$out/obj/$(basename "${cpp%.cpp}").o
  while (( $(jobs -rp | wc -l) >= jobs )); do wait -n || true; done
  echo "  compiling $(basename "$cpp") ($i of ${#stale[@]})"
  # shellcheck disable=SC2086
  "$cxx" $cxxflags -c "$cpp" -o "$obj.tmp" && mv "$obj.tmp" "$obj" &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
if [[ $fail != 0 ]]; then
  bad "compile failed"
  exit 1
fi

lib=$out/libortrain_worker.so
if [[ ! -f "$lib" || -n $relink ]] || [[ -n "$(find "$out/obj" -name '*.o' -newer "$lib")" ]]; then
  # shellcheck disable=SC2086
  "$cxx" -shared -o "$lib.tmp" "$out"/obj/*.o $libs && mv "$lib.tmp" "$lib"
fi
abi_version=$(grep -m1 'define ORT_ABI_VERSION' "$src/worker_abi.h" | awk '{print $3}')
ok "worker ABI version $abi_version"
ok "library: $lib"

#!/usr/bin/env bash
# forky-root.sh: a Debian forky (testing) root with libtorch 2.x, for building
# and testing the worker on a newer libtorch than the host's (issue 24).
# The variables below make other roots with it as well (another suite,
# contrib/non-free, other packages, local .debs): scripts/check-cuda-build
# makes a trixie root with CUDA libtorch that way.
#
#   scripts/forky-root.sh create          build the root unless it is there
#   scripts/forky-root.sh save            write the cache tarball from the root
#   scripts/forky-root.sh run [--copy] [--] [CMD [ARG...]]
#                                         run CMD (default: an interactive
#                                         bash) in the root, repo mounted
#   scripts/forky-root.sh shell           the same as `run` with no CMD
#   scripts/forky-root.sh info            versions and sizes
#   scripts/forky-root.sh delete          remove the root (not the cache)
#
# `run` creates the root first when it is missing. The root is built from
# the cache tarball when one exists, otherwise with debootstrap (bookworm's
# debootstrap has no forky script; the sid one is used) and apt, in about
# 2-3 minutes. Needs root (chroot, mounts) and, for debootstrap, the
# debootstrap package.
#
# Environment:
#   ORTRAIN_FORKY_ROOT     the root            (/var/cache/ortrain-forky)
#   ORTRAIN_FORKY_CACHE    the cache tarball   (~/.cache/ortrain/forky-root.tar.zst)
#   ORTRAIN_FORKY_MIRROR   Debian mirror       (http://deb.debian.org/debian)
#   ORTRAIN_FORKY_SUITE    suite               (forky)
#   ORTRAIN_FORKY_COMPONENTS  archive components in the root's sources.list
#                          (main); e.g. "main contrib non-free"
#   ORTRAIN_FORKY_BASE_PACKAGES  the packages installed at creation, in
#                          place of the default list below (libtorch-dev ...)
#   ORTRAIN_FORKY_PACKAGES extra packages to install at creation
#   ORTRAIN_FORKY_DEBS     local .deb files (paths, space-separated) installed
#                          at creation in the same apt transaction as the
#                          packages, so they can satisfy dependencies (a dummy
#                          in place of a package that downloads from outside
#                          Debian); apt holds them afterwards
#   ORTRAIN_FORKY_APT_ARCHIVES  a host directory used as the root's
#                          /var/cache/apt/archives during creation and kept:
#                          a creation that failed, or one after `delete`,
#                          downloads nothing twice (unset: no such cache)
#   ORTRAIN_FORKY_NAME     names the build directory of `run` without --copy,
#                          build/NAME/worker (forky)
#   ORTRAIN_FORKY_NO_CHECK_GPG=1  debootstrap without checking the Release
#                          signature (only when the host keyring lacks the
#                          key that signs the suite)
#
# How `run` works: the script execs (unshare) into a new mount namespace,
# mounts /proc, /sys, /dev and the bind mounts below in it, then execs
# chroot and the command: the command ends up with the script's own PID, so
# signals (Ctrl-C, timeout's TERM) and the exit status are the command's.
# The mounts exist only in that namespace, so the kernel removes them when
# the command and whatever it started have exited, however they end (no
# unmount step, no trap, nothing visible from the host):
#   - the repository at the same path as on the host (read-write), or with
#     --copy a snapshot of it (without build/ and bin/) in /tmp/wt, made
#     afresh on each run;
#   - the host's Go ($(go env GOROOT), read-only) and module cache
#     ($(go env GOMODCACHE)); the build cache is the root's own
#     (/var/cache/go-build) since cgo objects are built with forky's gcc.
# Inside, ORTRAIN_BUILD_DIR is build/forky/worker (build/$ORTRAIN_FORKY_NAME/
# worker when that is set; so the host's
# build/worker is never overwritten) and ORTRAIN_WORKER_LIB points at the
# library there; other ORTRAIN_* variables, GOFLAGS, JOBS and TERM are
# passed through. Example:
#
#   scripts/forky-root.sh run -- sh -c 'scripts/build-worker.sh && go test ./internal/worker/'
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
root=${ORTRAIN_FORKY_ROOT:-/var/cache/ortrain-forky}
root=${root%/}
cache=${ORTRAIN_FORKY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ortrain/forky-root.tar.zst}
mirror=${ORTRAIN_FORKY_MIRROR:-http://deb.debian.org/debian}
suite=${ORTRAIN_FORKY_SUITE:-forky}
components=${ORTRAIN_FORKY_COMPONENTS:-main}
name=${ORTRAIN_FORKY_NAME:-forky}
archives=${ORTRAIN_FORKY_APT_ARCHIVES:-}
marker=etc/ortrain-forky-root
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || {
  echo "forky-root: ORTRAIN_FORKY_NAME must be a plain name, not '$name'" >&2
  exit 2
}

# What the worker build and the Hugging Face reference need. libtorch2.14
# wants libblas.so.3/liblapack.so.3: OpenBLAS (OpenMP flavour, the same
# libgomp as libtorch) instead of the reference BLAS apt would pick.
# ca-certificates: Go module downloads; git: the Makefile's version string.
# python3-openai: the real `openai` client against ortrain's gateway and
# serve-engine (the agent tests).
packages=(
  libtorch-dev python3-torch
  python3-transformers python3-tokenizers python3-safetensors python3-jinja2
  python3-numpy g++ make binutils libgloo-dev libopenblas0-openmp
  ca-certificates git python3-openai
)
# shellcheck disable=SC2206
[[ -n ${ORTRAIN_FORKY_BASE_PACKAGES:-} ]] && packages=(${ORTRAIN_FORKY_BASE_PACKAGES})
# shellcheck disable=SC2206
packages+=(${ORTRAIN_FORKY_PACKAGES:-})
# shellcheck disable=SC2206
debs=(${ORTRAIN_FORKY_DEBS:-})

say() { printf 'forky-root: %s\n' "$*" >&2; }
die() {
  say "$*"
  exit 1
}

need_root() {
  [[ $(id -u) == 0 ]] || die "needs root (chroot and mounts); run it with sudo"
}

# mounted_under DIR: whether any mount point of this namespace is DIR or
# below it (the last guard before rm -rf).
mounted_under() {
  awk -v d="$1" '{ if ($5 == d || index($5, d "/") == 1) found = 1 } END { exit !found }' /proc/self/mountinfo
}

remove_tree() {
  local d=$1
  [[ -e "$d" ]] || return 0
  mounted_under "$d" && die "something is mounted under $d; not removing it"
  rm -rf --one-file-system "$d"
}

# in_root [--exec] DIR [--repo MODE] -- CMD...: runs CMD chrooted in DIR
# in a new mount namespace; with --exec this shell becomes CMD. MODE: none,
# bind or copy.
in_root() {
  local exec=""
  if [[ $1 == --exec ]]; then
    exec=exec
    shift
  fi
  local dir=$1 mode=none apt_archives=""
  shift
  if [[ ${1:-} == --repo ]]; then
    mode=$2
    shift 2
  fi
  if [[ ${1:-} == --apt-archives ]]; then
    apt_archives=$2
    shift 2
  fi
  [[ ${1:-} == -- ]] && shift

  local goroot="" gomodcache="" gobin=""
  if [[ $mode != none ]] && gobin=$(command -v go 2>/dev/null); then
    goroot=$("$gobin" env GOROOT)
    gomodcache=$("$gobin" env GOMODCACHE)
  fi
  local workdir=/ build_dir=""
  case $mode in
    bind) workdir=$repo build_dir=$repo/build/$name/worker ;;
    copy) workdir=/tmp/wt build_dir=/tmp/wt/build/worker ;;
  esac

  # The environment inside: a clean one, plus what the caller set for us.
  local envs=(
    HOME=/root LANG=C.UTF-8 LC_ALL=C.UTF-8
    "PATH=${goroot:+$goroot/bin:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    DEBIAN_FRONTEND=noninteractive TERM="${TERM:-dumb}"
  )
  if [[ -n $goroot ]]; then
    envs+=(GOROOT="$goroot" GOMODCACHE="$gomodcache" GOCACHE=/var/cache/go-build
      GOTOOLCHAIN=local GOFLAGS="$("$gobin" env GOFLAGS)" GOPROXY="$("$gobin" env GOPROXY)"
      GOSUMDB="$("$gobin" env GOSUMDB)")
  fi
  local v
  while IFS= read -r v; do
    case $v in
      ORTRAIN_FORKY_*) ;;
      ORTRAIN_*=* | JOBS=* | PYTHON=* | CXX11_ABI=*) envs+=("$v") ;;
    esac
  done < <(env)
  if [[ -n $build_dir ]]; then
    envs+=(ORTRAIN_BUILD_DIR="$build_dir" ORTRAIN_WORKER_LIB="$build_dir/libortrain_worker.so")
  fi

  cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  mkdir -p "$dir/proc" "$dir/sys" "$dir/dev" "$dir/tmp" "$dir/var/cache/go-build"
  chmod 1777 "$dir/tmp"
  [[ $mode == bind ]] && mkdir -p "$dir$repo"
  [[ -n $goroot ]] && mkdir -p "$dir$goroot" "$dir$gomodcache" "$gomodcache"
  [[ -n $apt_archives ]] && mkdir -p "$dir/var/cache/apt/archives" "$apt_archives/partial"

  # The setup runs in the new mount namespace: the mounts below exist only
  # there and go away with it.
  local setup='
set -euo pipefail
dir=$1 mode=$2 repo=$3 goroot=$4 gomodcache=$5 workdir=$6 apt_archives=$7
shift 7
mount -t proc -o nosuid,nodev,noexec proc "$dir/proc"
mount --rbind /sys "$dir/sys"
mount --rbind /dev "$dir/dev"
if [[ $mode == bind ]]; then
  mount --bind "$repo" "$dir$repo"
elif [[ $mode == copy ]]; then
  rm -rf --one-file-system "$dir/tmp/wt"
  mkdir -p "$dir/tmp/wt"
  tar -C "$repo" --exclude=./build --exclude=./bin -cf - . | tar -C "$dir/tmp/wt" -xf -
fi
if [[ -n $goroot ]]; then
  mount --bind "$goroot" "$dir$goroot"
  mount -o remount,bind,ro "$dir$goroot"
  mount --bind "$gomodcache" "$dir$gomodcache"
fi
if [[ -n $apt_archives ]]; then
  mount --bind "$apt_archives" "$dir/var/cache/apt/archives"
fi
exec chroot "$dir" /usr/bin/env -i "$@"
'
  # With a command, cd into the work directory first (env -i has no cwd
  # option, so a tiny shell does it).
  local cmd=("$@")
  ((${#cmd[@]})) || cmd=(bash -l)
  $exec unshare --mount --propagation private -- \
    bash -c "$setup" setup "$dir" "$mode" "$repo" "$goroot" "$gomodcache" "$workdir" "$apt_archives" \
    "${envs[@]}" /bin/sh -c 'cd "$0" && exec "$@"' "$workdir" "${cmd[@]}"
}

# build_root: debootstrap + apt into $root.new, then rename it to $root.
build_root() {
  local tmp=$root.new t0=$SECONDS keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  command -v debootstrap >/dev/null 2>&1 ||
    die "debootstrap is missing: apt-get update && apt-get install -y debootstrap"
  local script=/usr/share/debootstrap/scripts/$suite
  [[ -e $script ]] || script=/usr/share/debootstrap/scripts/sid
  remove_tree "$tmp"
  mkdir -p "$tmp"
  trap 'say "failed; removing $tmp"; remove_tree "$tmp"' EXIT

  local gpg=(--keyring="$keyring")
  [[ ${ORTRAIN_FORKY_NO_CHECK_GPG:-} == 1 ]] && gpg=(--no-check-gpg)
  local log=$tmp.debootstrap.log
  say "debootstrap $suite from $mirror (log: $log)"
  if ! debootstrap --variant=minbase "${gpg[@]}" "$suite" "$tmp" "$mirror" "$script" >"$log" 2>&1; then
    tail -n 20 "$log" | sed 's/^/    | /' >&2
    grep -q -i 'signature\|gpgv\|keyring' "$log" &&
      say "if the host keyring lacks the key that signs $suite, rerun with ORTRAIN_FORKY_NO_CHECK_GPG=1"
    die "debootstrap failed"
  fi
  say "debootstrap: $((SECONDS - t0)) s"

  # apt: testing's Release can be past its Valid-Until on a stale mirror;
  # no recommends, no translations. dpkg: no docs, man pages or locales,
  # and no fsync per file (the root is disposable).
  cat >"$tmp/etc/apt/apt.conf.d/90ortrain" <<'EOF'
Acquire::Check-Valid-Until "false";
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
EOF
  cat >"$tmp/etc/dpkg/dpkg.cfg.d/90ortrain" <<'EOF'
force-unsafe-io
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-exclude=/usr/share/lintian/*
EOF
  printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
  chmod 755 "$tmp/usr/sbin/policy-rc.d"
  echo "deb $mirror $suite $components" >"$tmp/etc/apt/sources.list"

  # Local .deb files go to /var/cache/ortrain-debs in the root; apt takes
  # them as candidates in the same transaction as the archive's packages.
  local local_debs=() held=() d p
  if ((${#debs[@]})); then
    mkdir -p "$tmp/var/cache/ortrain-debs"
    for d in "${debs[@]}"; do
      [[ -f $d ]] || die "ORTRAIN_FORKY_DEBS: no such file: $d"
      p=$(dpkg-deb -f "$d" Package) || die "ORTRAIN_FORKY_DEBS: not a .deb: $d"
      cp "$d" "$tmp/var/cache/ortrain-debs/"
      local_debs+=("/var/cache/ortrain-debs/$(basename "$d")")
      held+=("$p")
    done
  fi
  local apt_opts=() clean="apt-get clean"
  if [[ -n $archives ]]; then
    mkdir -p "$archives"
    archives=$(cd "$archives" && pwd)
    apt_opts=(--apt-archives "$archives")
    clean=true
  fi

  local t1=$SECONDS
  log=$tmp.apt.log
  say "apt-get install ${local_debs[*]:+${local_debs[*]} }${packages[*]} (log: $log)"
  if ! in_root "$tmp" "${apt_opts[@]}" -- /bin/sh -c "apt-get update && apt-get install -y ${local_debs[*]:+${local_debs[*]} }${packages[*]}${held[*]:+ && apt-mark hold ${held[*]}} && $clean" >"$log" 2>&1; then
    tail -n 20 "$log" | sed 's/^/    | /' >&2
    die "apt-get failed"
  fi
  say "apt: $((SECONDS - t1)) s"
  # Package lists (~100 MB) are dropped: `apt-get update` brings them back.
  rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin \
    "$tmp"/usr/share/doc/*/[!c]* "$tmp"/usr/share/man/* "$tmp"/usr/share/locale/* "$tmp"/usr/share/info/*
  mkdir -p "$tmp/var/lib/apt/lists/partial"
  {
    local comp=""
    [[ $components != main ]] && comp=" ($components)"
    echo "built $(date -u +%FT%TZ) from $mirror $suite$comp by scripts/forky-root.sh"
    echo "packages: ${packages[*]}"
    if ((${#held[@]})); then echo "local packages (held): ${debs[*]##*/}"; fi
    # shellcheck disable=SC2016
    in_root "$tmp" -- dpkg-query -W -f='${Package} ${Version}\n' libtorch-dev 'libtorch2*' python3-torch \
      python3-transformers python3-tokenizers python3-safetensors python3-jinja2 g++ libgloo-dev libc6 \
      "${packages[@]}" "${held[@]}" 2>/dev/null | awk 'NF > 1' | sort -u || true
  } >"$tmp/$marker"
  rm -f "$tmp.debootstrap.log" "$tmp.apt.log"
  mv "$tmp" "$root"
  trap - EXIT
  say "root ready at $root in $((SECONDS - t0)) s ($(du -sh --one-file-system "$root" | cut -f1))"
}

# add_missing_packages installs the listed packages a finished root (an
# older one, or one unpacked from an older cache) lacks, so a package added
# to the list reaches every root without rebuilding it.
add_missing_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    in_root "$root" -- dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  local t0=$SECONDS log=$root.apt.log
  say "the root lacks ${missing[*]}: apt-get install (log: $log)"
  if ! in_root "$root" -- /bin/sh -c "apt-get update && apt-get install -y ${missing[*]} && apt-get clean" >"$log" 2>&1; then
    tail -20 "$log" >&2
    die "apt-get install ${missing[*]} failed"
  fi
  rm -rf "$root"/var/lib/apt/lists/* && mkdir -p "$root/var/lib/apt/lists/partial"
  rm -f "$log"
  say "installed ${missing[*]} in $((SECONDS - t0)) s"
}

unpack_cache() {
  local tmp=$root.new t0=$SECONDS
  remove_tree "$tmp"
  mkdir -p "$tmp"
  trap 'say "failed; removing $tmp"; remove_tree "$tmp"' EXIT
  say "unpacking $cache"
  zstd -dc -T0 "$cache" | tar -C "$tmp" --numeric-owner -xpf -
  [[ -f $tmp/$marker ]] || die "$cache holds no forky root ($marker is missing)"
  mv "$tmp" "$root"
  trap - EXIT
  say "root ready at $root in $((SECONDS - t0)) s"
}

create() {
  need_root
  if [[ -f $root/$marker ]]; then
    add_missing_packages
    return 0
  fi
  [[ -e $root ]] && die "$root exists but is not a finished root; run: $0 delete"
  mkdir -p "$(dirname "$root")"
  if [[ -f $cache ]]; then
    unpack_cache
  else
    build_root
  fi
}

save() {
  need_root
  [[ -f $root/$marker ]] || die "no root at $root; run: $0 create"
  mounted_under "$root" && die "something is mounted under $root"
  local t0=$SECONDS
  mkdir -p "$(dirname "$cache")"
  # The Go build cache, /tmp and the repo's mount point are left out.
  tar -C "$root" --numeric-owner --one-file-system \
    --exclude=./var/cache/go-build --exclude='./tmp/*' --exclude=".${repo}" -cf - . |
    zstd -q -T0 -10 -o "$cache.tmp" -f
  mv "$cache.tmp" "$cache"
  say "cache written: $cache ($(du -h "$cache" | cut -f1), $((SECONDS - t0)) s)"
}

info() {
  [[ -f $root/$marker ]] || die "no root at $root"
  cat "$root/$marker"
  echo "size: $(du -sh --one-file-system --exclude="$root/var/cache/go-build" "$root" | cut -f1)"
  [[ -f $cache ]] && echo "cache: $cache ($(du -h "$cache" | cut -f1))"
  return 0
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  create) create ;;
  save) save ;;
  info) info ;;
  delete)
    need_root
    remove_tree "$root"
    remove_tree "$root.new"
    ;;
  run | shell)
    mode=bind
    while [[ $# -gt 0 ]]; do
      case $1 in
        --copy) mode=copy ;;
        --) shift && break ;;
        *) break ;;
      esac
      shift
    done
    [[ $cmd == shell ]] && set --
    create
    in_root --exec "$root" --repo "$mode" -- "$@"
    ;;
  *) usage ;;
esac

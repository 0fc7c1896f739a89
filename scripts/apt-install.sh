# shellcheck shell=bash
# apt-install.sh: sourced by scripts/install-*.sh, not run on its own.
#
#   apt_install NAME PKG...
#
# installs whichever of PKG... are missing with apt-get (no recommends) and
# prints one line per phase on stdout: what, how big, how long:
#
#   apt: updating package lists ... 4 s
#   apt: downloading 177 packages for libtorch-dev g++ (245 MB) ... 38 s
#   apt: installing 177 packages (1,043 MB on disk) ... 71 s
#
# apt's own output goes to build/logs/apt-NAME.log (ORTRAIN_APT_LOG_DIR
# overrides the directory); when a phase fails, the end of that log is shown
# on stderr with its path. Returns 0 (printing nothing when every PKG is
# already installed), 1 when apt-get fails, 2 when there is no apt-get.

apt_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
apt_log=/dev/null

# apt_missing PKG...: the PKGs that dpkg does not have installed, one a line.
apt_missing() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

# apt_phase LABEL CMD...: runs CMD with its output in $apt_log, printing
# "apt: LABEL ... N s" as one line.
apt_phase() {
  local label=$1 t0=$SECONDS rc=0
  shift
  printf '  apt: %s ... ' "$label"
  echo "== $label: $*" >>"$apt_log"
  "$@" >>"$apt_log" 2>&1 || rc=$?
  if ((rc == 0)); then
    printf '%d s\n' $((SECONDS - t0))
    return 0
  fi
  printf 'failed after %d s\n' $((SECONDS - t0))
  {
    echo "  apt-get exited with status $rc; the end of its log ($apt_log):"
    tail -n 15 "$apt_log" | sed 's/^/    | /'
  } >&2
  return 1
}

apt_install() {
  local name=$1
  shift
  local missing=()
  mapfile -t missing < <(apt_missing "$@")
  ((${#missing[@]})) || return 0
  command -v apt-get >/dev/null 2>&1 || return 2

  local as=() logdir plan n need disk
  [[ $(id -u) != 0 ]] && as=(sudo)
  logdir=${ORTRAIN_APT_LOG_DIR:-$apt_root/build/logs}
  mkdir -p "$logdir"
  apt_log=$logdir/apt-$name.log
  : >"$apt_log"
  # DEBIAN_FRONTEND goes through env because sudo drops the caller's
  # environment; the lock timeout waits out a fresh machine's
  # unattended-upgrades instead of failing at once.
  local apt=("${as[@]}" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get
    -o DPkg::Lock::Timeout=300 --no-install-recommends)

  apt_phase "updating package lists" "${apt[@]}" update || return 1
  # The plan from apt's own summary (--assume-no stops before anything is
  # downloaded): "0 upgraded, 177 newly installed, ...", "Need to get 245 MB
  # of archives." ("12.0 MB/245 MB" when some are cached), "After this
  # operation, 1043 MB of additional disk space will be used."
  plan=$("${apt[@]}" --assume-no install "${missing[@]}" 2>&1)
  printf '%s\n' "== plan: ${missing[*]}" "$plan" >>"$apt_log"
  n=$(sed -n 's/^\([0-9]*\) upgraded, \([0-9]*\) newly installed.*/\1 \2/p' <<<"$plan" | awk '{print $1 + $2}')
  if [[ ${n:-0} == 0 ]]; then
    {
      echo "  apt-get cannot install ${missing[*]}; its plan ($apt_log):"
      tail -n 15 <<<"$plan" | sed 's/^/    | /'
    } >&2
    return 1
  fi
  need=$(sed -n 's/^Need to get \([^ /]* [kMG]*B\).* of archives\.$/\1/p' <<<"$plan")
  disk=$(sed -n 's/^After this operation, \([^ ]* [kMG]*B\) of additional disk space will be used\.$/\1/p' <<<"$plan")
  apt_phase "downloading $n packages for ${missing[*]} (${need:-size unknown})" \
    "${apt[@]}" -y --download-only install "${missing[@]}" || return 1
  apt_phase "installing $n packages (${disk:-size unknown} on disk)" \
    "${apt[@]}" -y install "${missing[@]}" || return 1
}

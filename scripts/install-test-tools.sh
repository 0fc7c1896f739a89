#!/usr/bin/env bash
# install-test-tools.sh: tools the tests use beyond Go and libtorch.
#  - Chromium (Debian package `chromium`): internal/cli's report test loads
#    the HTML report in headless Chromium. Where it cannot be installed the
#    test skips with a message, except when CI is set: there it fails.
# Never fails setup: a machine without apt-get (or offline) still gets the
# worker and the demo; the message says what is missing.
# ORTRAIN_SKIP_TEST_TOOLS=1 skips this script. apt prints one line per
# phase; its own output is in build/logs/apt-test-tools.log.
set -uo pipefail

ok() { printf '  \342\234\223 %s\n' "$*"; }
warn() { printf '  ! %s\n' "$*" >&2; }

if [[ -n "${ORTRAIN_SKIP_TEST_TOOLS:-}" ]]; then
  ok "test tools skipped (ORTRAIN_SKIP_TEST_TOOLS is set)"
  exit 0
fi

find_chromium() {
  local b
  for b in chromium chromium-browser google-chrome google-chrome-stable chrome headless_shell; do
    if command -v "$b" >/dev/null 2>&1; then
      command -v "$b"
      return 0
    fi
  done
  return 1
}

if path=$(find_chromium); then
  ok "chromium: $path ($("$path" --version 2>/dev/null | head -n1))"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  warn "no Chromium and no apt-get: install Chromium or Chrome for the report test (it skips without one unless CI is set)"
  exit 0
fi
# shellcheck source=scripts/apt-install.sh
. "$(dirname "$0")/apt-install.sh"
if ! apt_install test-tools chromium; then
  warn "apt-get could not install chromium: the report test will skip (or fail where CI is set)"
  exit 0
fi
if path=$(find_chromium); then
  ok "chromium: $path ($("$path" --version 2>/dev/null | head -n1))"
else
  warn "chromium installed but not on PATH"
fi

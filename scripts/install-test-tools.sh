#!/usr/bin/env bash
# install-test-tools.sh: tools the tests use beyond Go and libtorch.
#  - Chromium (Debian package `chromium`): internal/cli's report test loads
#    the HTML report in headless Chromium. Where it cannot be installed the
#    test skips with a message, except when CI is set: there it fails.
#  - Real client libraries and agent CLIs from npm (scripts/test-clients:
#    the Anthropic SDK, the MCP SDK, OpenAI's Codex CLI, Anthropic's Claude
#    Agent SDK), pinned by package-lock.json and installed with `npm ci` into
#    build/test-clients, where the agent and gateway tests find them (they
#    download nothing at run time). Needs nodejs and npm; tests that need
#    them skip without, except when CI is set.
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

install_test_clients() {
  local src dst
  src="$(cd "$(dirname "$0")" && pwd)/test-clients"
  dst="$(cd "$(dirname "$0")/.." && pwd)/build/test-clients"
  if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    warn "no node/npm: the tests with real npm clients (Anthropic SDK, MCP SDK, Codex CLI, Claude Agent SDK) will skip (or fail where CI is set)"
    return 0
  fi
  if [[ -f $dst/package-lock.json ]] && cmp -s "$src/package-lock.json" "$dst/package-lock.json" && [[ -d $dst/node_modules ]]; then
    ok "npm test clients: $dst (up to date)"
    return 0
  fi
  mkdir -p "$dst/../logs"
  cp "$src/package.json" "$src/package-lock.json" "$dst/" 2>/dev/null || { mkdir -p "$dst" && cp "$src/package.json" "$src/package-lock.json" "$dst/"; }
  if (cd "$dst" && npm ci --no-audit --no-fund --loglevel=error >"$dst/../logs/npm-test-clients.log" 2>&1); then
    ok "npm test clients: $dst (node $(node --version))"
  else
    warn "npm ci failed (see build/logs/npm-test-clients.log): the tests with real npm clients will skip (or fail where CI is set)"
  fi
}
install_test_clients

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

#!/usr/bin/env bash
# codex-agent.sh: run OpenAI's Codex CLI (npm @openai/codex, tested with
# 0.171.0), unchanged, as an ortrain command agent: one `codex exec` per
# rollout, against ortrain's gateway (Responses API) and the env's MCP server.
#
#   agent:
#     command: [bash, docs/examples/agents/codex-agent.sh]
#
# ortrain sets OPENAI_BASE_URL (.../rollouts/ID/v1), OPENAI_API_KEY (the
# rollout's key), ORTRAIN_MODEL, ORTRAIN_TASK (JSON) and ORTRAIN_MCP_URL. The
# script writes a throwaway CODEX_HOME whose config.toml points a custom model
# provider (wire_api "responses") at OPENAI_BASE_URL and an MCP server named
# "env" (streamable HTTP, bearer = the rollout key) at ORTRAIN_MCP_URL, then
# runs the task's system and user messages as one prompt: no approvals (the
# env's tools are pre-approved), no network for shell commands, nothing
# contacted but those two URLs (plugins, apps, analytics and update checks
# off). Codex's own output goes to stderr; stdout stays empty (ortrain reads a
# {"reward": ...} last line there, and the env's verdict gives the reward).
#
# Needs: python3 (to read ORTRAIN_TASK) and the codex binary: ORTRAIN_CODEX_BIN,
# else `codex` on PATH (e.g. build/test-clients/node_modules/.bin/codex, or the
# native binary node_modules/@openai/codex-linux-x64/vendor/<triple>/bin/codex).
#
# Optional knobs:
#   ORTRAIN_AGENT_BUILTIN_TOOLS      Codex's own tools beside the env's: unset or 0,
#                                    none (the MCP tools, plus Codex's small
#                                    MCP-resource/view_image/request_user_input
#                                    tools, which cannot be switched off; a
#                                    ~5k-token prompt with Qwen3's tokenizer);
#                                    "shell", its shell tool (sandbox
#                                    workspace-write, no network); 1, its
#                                    default set (shell, sub-agents, goals,
#                                    bundled skills: ~10k tokens, Codex as
#                                    shipped)
#   ORTRAIN_CODEX_INSTRUCTIONS_FILE  replaces Codex's ~17k-char base prompt
#   ORTRAIN_CODEX_CONTEXT_WINDOW     the model's context window in tokens
#   ORTRAIN_CODEX_ARGS               more `codex exec` arguments (split on spaces)
set -euo pipefail

: "${OPENAI_BASE_URL:?set by ortrain}" "${OPENAI_API_KEY:?set by ortrain}"
: "${ORTRAIN_MODEL:?set by ortrain}" "${ORTRAIN_TASK:?set by ortrain}"
codex_bin=${ORTRAIN_CODEX_BIN:-codex}
command -v "$codex_bin" >/dev/null || { echo "codex-agent: $codex_bin not found (set ORTRAIN_CODEX_BIN)" >&2; exit 127; }

# The prompt: the task's system and user messages, in order (content is a
# string or a list of {type: text, text} parts).
prompt=$(python3 -c '
import json, os
task = json.loads(os.environ["ORTRAIN_TASK"])
def text(c):
    return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))
print("\n\n".join(text(m.get("content")) for m in task.get("messages", []) if m.get("role") in ("system", "developer", "user")))
')
[ -n "$prompt" ] || { echo "codex-agent: ORTRAIN_TASK has no system or user message" >&2; exit 2; }

CODEX_HOME=$(mktemp -d "${TMPDIR:-/tmp}/ortrain-codex-home.XXXXXX")
export CODEX_HOME
trap 'rm -rf "$CODEX_HOME"' EXIT
trap 'exit 143' TERM INT

# A TOML basic string (JSON string escapes are valid TOML ones).
toml() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1], ensure_ascii=False))' "$1"; }

# Codex's own tools (features.*): web search and image generation are
# hosted tools the policy cannot run; plugins, apps and the shell snapshot
# would reach beyond loopback or source the user's shell files.
shell_tool=false sandbox=read-only codex_defaults=false
case ${ORTRAIN_AGENT_BUILTIN_TOOLS:-0} in
  0) ;;
  shell) shell_tool=true sandbox=workspace-write ;;
  1) shell_tool=true sandbox=workspace-write codex_defaults=true ;;
  *) echo "codex-agent: ORTRAIN_AGENT_BUILTIN_TOOLS is ${ORTRAIN_AGENT_BUILTIN_TOOLS}: want 0, shell or 1" >&2; exit 2 ;;
esac

{
  # Top-level keys first: every key after a [table] header belongs to it.
  if [ -n "${ORTRAIN_CODEX_INSTRUCTIONS_FILE:-}" ]; then
    echo "model_instructions_file = $(toml "$(realpath "$ORTRAIN_CODEX_INSTRUCTIONS_FILE")")"
  fi
  if [ -n "${ORTRAIN_CODEX_CONTEXT_WINDOW:-}" ]; then
    echo "model_context_window = $((ORTRAIN_CODEX_CONTEXT_WINDOW))"
  fi
  cat <<TOML
model = $(toml "$ORTRAIN_MODEL")
model_provider = "ortrain"
approval_policy = "never"
sandbox_mode = "$sandbox"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.ortrain]
name = "ortrain"
base_url = $(toml "$OPENAI_BASE_URL")
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 2
stream_max_retries = 2

[sandbox_workspace_write]
network_access = false

[analytics]
enabled = false

[history]
persistence = "none"

[features]
plugins = false
apps = false
remote_plugin = false
shell_snapshot = false
image_generation = false
shell_tool = $shell_tool
TOML
  if [ "$codex_defaults" = false ]; then
    # Sub-agents, goals and the bundled skills: ~14k chars of prompt.
    cat <<TOML
goals = false
skill_search = false

[agents]
enabled = false

[skills.bundled]
enabled = false
TOML
  fi
  if [ -n "${ORTRAIN_MCP_URL:-}" ]; then
    # default_tools_approval_mode: with approval_policy "never", Codex
    # refuses every MCP call that it would ask about (any tool without
    # readOnlyHint); "approve" pre-approves the env's tools.
    cat <<TOML

[mcp_servers.env]
url = $(toml "$ORTRAIN_MCP_URL")
bearer_token_env_var = "OPENAI_API_KEY"
required = true
default_tools_approval_mode = "approve"
startup_timeout_sec = 30
tool_timeout_sec = 600
TOML
  fi
} >"$CODEX_HOME/config.toml"

# Codex's output goes to stderr (and to a log the status is judged from);
# stdout stays empty. No `timeout` here: it would move codex into a process
# group of its own, out of reach of ortrain, which ends the agent's whole
# group at rollout.episode_timeout.
log="$CODEX_HOME/exec.log"
set +e
# shellcheck disable=SC2086 # ORTRAIN_CODEX_ARGS is a list of words
"$codex_bin" exec --skip-git-repo-check --ephemeral --color never ${ORTRAIN_CODEX_ARGS:-} \
  -C "$PWD" -- "$prompt" </dev/null 2>&1 | tee -- "$log" >&2
rc=${PIPESTATUS[0]}
set -e
# The policy's reply hit its token budget (grpo.max_completion_length caps
# every call): the Responses API answers status "incomplete" and codex exec
# stops with an error. The episode ended there on the policy's account, as
# ortrain's own loop ends a truncated one, so it is not the agent failing.
if [ "$rc" -ne 0 ] && [ "$(grep '^ERROR: ' "$log" | tail -n 1)" = "ERROR: Incomplete response returned, reason: max_output_tokens" ]; then
  echo "codex-agent: the policy's reply reached its token budget; the episode ends here" >&2
  rc=0
fi
exit "$rc"

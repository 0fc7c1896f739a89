#!/usr/bin/env node
// claude-agent.js: run Anthropic's Claude Agent SDK (npm
// @anthropic-ai/claude-agent-sdk, tested with 0.3.332, which drives its
// bundled native Claude Code binary) as an ortrain command agent: one
// query() per rollout, against ortrain's gateway (Messages API) and the env's
// MCP server.
//
//   agent:
//     command: [node, docs/examples/agents/claude-agent.js]
//
// with NODE_PATH naming the node_modules that hold the SDK (e.g.
// NODE_PATH=build/test-clients/node_modules, made absolute), or
// ORTRAIN_CLAUDE_SDK naming the package's directory or its sdk.mjs.
//
// ortrain sets ANTHROPIC_BASE_URL (.../rollouts/ID; the SDK appends
// /v1/messages), ANTHROPIC_API_KEY (the rollout's key), ORTRAIN_MODEL,
// ORTRAIN_TASK (JSON) and ORTRAIN_MCP_URL. Without ANTHROPIC_* they are
// derived from OPENAI_BASE_URL (less its /v1) and OPENAI_API_KEY. The env's
// MCP server is given to Claude Code as the HTTP server "env" (bearer = the
// rollout key); its tools (mcp__env__*) are pre-approved (permission mode
// dontAsk: whatever is not allowed is refused, nothing ever prompts; it works
// as root, where bypassPermissions is refused). The prompt is the task's
// system and user messages, in order. Claude Code's config, session files and
// caches go to a throwaway HOME / CLAUDE_CONFIG_DIR, and non-essential traffic
// (telemetry, title generation, /api/hello, update checks) is off, so nothing
// but the gateway and the MCP server is contacted. Everything is logged to
// stderr; stdout stays empty (ortrain reads a {"reward": ...} last line
// there, and the env's verdict gives the reward).
//
// Optional knobs:
//   ORTRAIN_AGENT_BUILTIN_TOOLS  Claude Code built-in tools to keep, comma
//                                separated (e.g. "Bash,Read,Edit,Write"), or 1
//                                for its default set; default none: the
//                                env's MCP tools only
//   ORTRAIN_CLAUDE_MAX_TURNS     model turns before the episode stops (default 30)
//   ORTRAIN_CLAUDE_BIN           another Claude Code executable
'use strict';

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { pathToFileURL } = require('node:url');

function log(...parts) {
  process.stderr.write('claude-agent: ' + parts.join(' ') + '\n');
}

function need(name) {
  const v = process.env[name];
  if (!v) {
    log(name, 'is not set (ortrain sets it)');
    process.exit(2);
  }
  return v;
}

// The SDK is ESM only: resolve it (NODE_PATH applies to require.resolve)
// and import it by file URL.
async function loadSDK() {
  let target = process.env.ORTRAIN_CLAUDE_SDK;
  if (target && fs.statSync(target).isDirectory()) target = path.join(target, 'sdk.mjs');
  if (!target) {
    try {
      target = require.resolve('@anthropic-ai/claude-agent-sdk');
    } catch (err) {
      log('cannot find @anthropic-ai/claude-agent-sdk: set NODE_PATH to its node_modules or ORTRAIN_CLAUDE_SDK');
      process.exit(127);
    }
  }
  return import(pathToFileURL(path.resolve(target)).href);
}

function text(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content.map((p) => (p && typeof p.text === 'string' ? p.text : '')).join('');
}

function builtinTools() {
  const v = (process.env.ORTRAIN_AGENT_BUILTIN_TOOLS || '').trim();
  if (v === '' || v === '0') return [];
  if (v === '1') return undefined; // Claude Code's default set
  return v.split(',').map((s) => s.trim()).filter(Boolean);
}

async function main() {
  const model = need('ORTRAIN_MODEL');
  const task = JSON.parse(need('ORTRAIN_TASK'));
  const baseURL = process.env.ANTHROPIC_BASE_URL || need('OPENAI_BASE_URL').replace(/\/v1\/?$/, '');
  const key = process.env.ANTHROPIC_API_KEY || need('OPENAI_API_KEY');
  const mcpURL = process.env.ORTRAIN_MCP_URL;

  const prompt = (task.messages || [])
    .filter((m) => m.role === 'system' || m.role === 'developer' || m.role === 'user')
    .map((m) => text(m.content))
    .filter(Boolean)
    .join('\n\n');
  if (!prompt) {
    log('ORTRAIN_TASK has no system or user message');
    process.exit(2);
  }

  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'ortrain-claude-home-'));
  const cleanup = () => fs.rmSync(home, { recursive: true, force: true });
  process.on('exit', cleanup);
  const abort = new AbortController();
  for (const sig of ['SIGTERM', 'SIGINT']) {
    process.on(sig, () => {
      log('got', sig, ', stopping');
      abort.abort();
      setTimeout(() => process.exit(143), 3000).unref();
    });
  }

  const env = { ...process.env };
  Object.assign(env, {
    ANTHROPIC_BASE_URL: baseURL,
    ANTHROPIC_API_KEY: key,
    HOME: home,
    CLAUDE_CONFIG_DIR: path.join(home, '.claude'),
    // Telemetry, error reporting, title generation, /api/hello, update and
    // feature-flag checks: all off (they go to *.anthropic.com otherwise).
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    DISABLE_AUTOUPDATER: '1',
    // MCP tools in the request's tools, not deferred behind ToolSearch.
    ENABLE_TOOL_SEARCH: 'false',
    CLAUDE_AGENT_SDK_CLIENT_APP: 'ortrain-claude-agent/1',
  });

  const tools = builtinTools();
  const allowedTools = [...(tools || [])];
  const mcpServers = {};
  if (mcpURL) {
    mcpServers.env = { type: 'http', url: mcpURL, headers: { Authorization: 'Bearer ' + key } };
    allowedTools.push('mcp__env');
  }
  const options = {
    model,
    cwd: process.cwd(),
    env,
    abortController: abort,
    maxTurns: Number(process.env.ORTRAIN_CLAUDE_MAX_TURNS || 30),
    permissionMode: 'dontAsk',
    allowedTools,
    mcpServers,
    mcpServersDelivery: 'initialize', // keeps the key off the command line
    strictMcpConfig: true,
    settingSources: [],
    persistSession: false,
    stderr: (d) => process.stderr.write('[claude] ' + d),
  };
  if (tools !== undefined) options.tools = tools;
  if (process.env.ORTRAIN_CLAUDE_BIN) options.pathToClaudeCodeExecutable = process.env.ORTRAIN_CLAUDE_BIN;

  const { query } = await loadSDK();
  let result;
  try {
    for await (const msg of query({ prompt, options })) {
      result = report(msg) || result;
    }
  } catch (err) {
    // The SDK throws after yielding an error result.
    if (!policyEnded(result)) throw err;
  }
  if (policyEnded(result)) {
    log('the episode ended on the policy\'s account:', result.api_error || result.subtype);
    return;
  }
  if (!result || result.subtype !== 'success' || result.is_error) process.exitCode = 1;
}

// policyEnded reports whether the episode ended on the policy's account,
// which is not the agent failing: out of turns, or the policy's reply
// reached its token budget (grpo.max_completion_length caps every call;
// Claude Code asks it to go on a few times, then stops with api_error
// max_output_tokens), as ortrain's own loop ends a truncated episode.
function policyEnded(result) {
  return !!result && (result.subtype === 'error_max_turns' || result.api_error === 'max_output_tokens');
}

// report logs one SDK message to stderr and returns it if it is the result.
function report(msg) {
  switch (msg.type) {
    case 'system':
      if (msg.subtype === 'init') {
        log('session', msg.session_id, 'model', msg.model, 'tools', JSON.stringify(msg.tools),
          'mcp', JSON.stringify(msg.mcp_servers));
      }
      break;
    case 'assistant':
      for (const c of msg.message.content || []) {
        if (c.type === 'text') log('assistant:', JSON.stringify(c.text).slice(0, 500));
        else if (c.type === 'tool_use') log('tool_use:', c.name, JSON.stringify(c.input).slice(0, 500));
      }
      break;
    case 'user':
      for (const c of (Array.isArray(msg.message.content) ? msg.message.content : [])) {
        if (c.type === 'tool_result') {
          log('tool_result' + (c.is_error ? ' (error):' : ':'), JSON.stringify(c.content).slice(0, 500));
        }
      }
      break;
    case 'result':
      log('result:', msg.subtype, 'turns', msg.num_turns, 'stop', msg.stop_reason);
      return msg;
  }
  return undefined;
}

main().catch((err) => {
  log('error:', err && err.stack ? err.stack : String(err));
  process.exit(1);
});

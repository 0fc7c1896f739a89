// Drives an MCP server with the official TypeScript SDK's client over
// streamable HTTP, as a user's agent would, and prints what it saw as one
// JSON line. Usage: node mcp_client.js URL KEY CALLS_JSON
//   KEY: the bearer key ("" for none).
//   CALLS_JSON: [{"name": ..., "arguments": {...}}, ...], called in order;
//     an argument value "$digit" becomes the first digit of the previous
//     call's text (the lockbox code the env just told the agent).
// The SDK's CommonJS build is found through NODE_PATH.
'use strict';
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = require('@modelcontextprotocol/sdk/client/streamableHttp.js');

// Every wait has a deadline: the Go test also kills the process.
setTimeout(() => { console.error('mcp_client.js: timed out'); process.exit(2); }, 30000).unref();

function textOf(result) {
  return (result.content || []).filter(c => c.type === 'text').map(c => c.text).join('\n');
}

async function main() {
  const [url, key, callsJSON] = process.argv.slice(2);
  const calls = JSON.parse(callsJSON || '[]');
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  const errors = [];
  transport.onerror = e => errors.push(String((e && e.message) || e));
  const client = new Client({ name: 'ortrain-test', version: '0' });
  await client.connect(transport);
  const out = {
    protocolVersion: transport.protocolVersion,
    sessionId: transport.sessionId || '',
    server: client.getServerVersion(),
    tools: (await client.listTools()).tools,
    calls: [],
  };
  let previous = '';
  for (const c of calls) {
    const args = {};
    for (const [k, v] of Object.entries(c.arguments || {})) {
      args[k] = v === '$digit' ? ((previous.match(/[0-9]/) || [''])[0]) : v;
    }
    try {
      const result = await client.callTool({ name: c.name, arguments: args });
      previous = textOf(result);
      out.calls.push({ result });
    } catch (e) {
      out.calls.push({ error: String((e && e.message) || e) });
    }
  }
  if (out.sessionId) {
    await transport.terminateSession(); // DELETE: throws unless 2xx or 405
    out.terminated = true;
  }
  await client.close();
  out.transportErrors = errors;
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch(e => { console.error((e && e.stack) || e); process.exit(1); });

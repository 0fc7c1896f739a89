// The official Anthropic TypeScript SDK (@anthropic-ai/sdk, pinned in
// scripts/test-clients) against the gateway, as an agent uses it. Run by
// TestMessagesFromAnthropicClient:
//
//   node anthropic_client.js BASE_URL API_KEY
//
// BASE_URL is the rollout's base without /v1 (the SDK appends
// /v1/messages). It prints one JSON object of what the SDK returned; the Go
// test checks it and the recorded calls. Any unexpected failure exits 1.
'use strict';

const Anthropic = require('@anthropic-ai/sdk');

const [baseURL, apiKey] = process.argv.slice(2);

const weatherTool = {
  name: 'get_weather',
  description: 'Current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

async function main() {
  const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
  const out = {};

  // Plain, with system blocks carrying cache_control.
  out.plain = await client.messages.create({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: 'Hello' }],
  });

  // Streamed: the SDK accumulates the events into the final message.
  const stream = client.messages.stream({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'Hello again' }],
  });
  out.streamEvents = [];
  stream.on('streamEvent', (event) => out.streamEvents.push(event.type));
  let streamedText = '';
  stream.on('text', (delta) => { streamedText += delta; });
  out.streamed = await stream.finalMessage();
  out.streamedText = streamedText;

  // A tool round trip: the reply goes back as the assistant turn, the
  // result as a tool_result block.
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const params = { model: 'claude-sonnet-4-5', max_tokens: 128, system: 'You answer weather questions.', tools: [weatherTool] };
  out.tool1 = await client.messages.create({ ...params, messages });
  const use = out.tool1.content.find((b) => b.type === 'tool_use');
  if (!use) throw new Error('no tool_use block in ' + JSON.stringify(out.tool1));
  messages.push({ role: 'assistant', content: out.tool1.content });
  messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '22C, sunny' }] });
  out.tool2 = await client.messages.create({ ...params, messages });

  // The beta surface (POST /v1/messages?beta=true, what the Claude Agent
  // SDK calls) with a beta header, streamed.
  const betaStream = client.beta.messages.stream({
    model: 'claude-sonnet-4-5',
    max_tokens: 64,
    betas: ['interleaved-thinking-2025-05-14'],
    messages: [{ role: 'user', content: 'Hello beta' }],
  });
  out.beta = await betaStream.finalMessage();

  out.count = await client.messages.countTokens({
    model: 'claude-sonnet-4-5',
    messages: [{ role: 'user', content: 'Hello' }],
  });

  // A refused request surfaces as the SDK's typed error.
  try {
    await client.messages.create({
      model: 'claude-sonnet-4-5',
      max_tokens: 64,
      messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'https://example.com/a.png' } }] }],
    });
    throw new Error('the image request was not refused');
  } catch (err) {
    if (!(err instanceof Anthropic.BadRequestError)) throw err;
    out.error = { status: err.status, type: err.error?.error?.type, message: err.error?.error?.message };
  }

  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});

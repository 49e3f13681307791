// A Jinja2 interpreter for chat templates, rendering the way Hugging Face transformers does
// (jinja2 with trim_blocks and lstrip_blocks, loop controls, tojson as json.dumps with
// ensure_ascii=False, raise_exception and strftime_now globals). Values follow Python semantics
// (str() of lists and dicts, True/None spelling, code-point string indexing).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::text::jinja {

struct Node;

// Bounds on one render, so that a template that loops without end or grows strings without bound
// fails with an InputError naming the bound instead of hanging or exhausting memory. The Qwen3
// template costs 53 steps per plain message (~70 ns a step), so the default fits the largest request
// body the server accepts (8 MiB: at most ~270K messages) with tool calls; a loop without end stops
// after ~15 s (~300 ns a loop step).
struct RenderLimits {
  uint64_t steps = 50'000'000;  // expressions evaluated, statements executed, bytes/64 of strings built
};

// The longest string a render builds: the output, any value, any printed value.
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;

class Template {
 public:
  // Parses `source`; syntax errors -> InputError "NAME line L, column C: ...".
  explicit Template(std::string source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the keys of `globals` (a JSON object) as variables. Errors (including the template's
  // raise_exception and a bound of `limits` or kMaxStringBytes exceeded) -> InputError with line and column.
  std::string render(const nlohmann::ordered_json& globals, const RenderLimits& limits = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_, name_;
  std::shared_ptr<Node> root_;
};

}  // namespace lily::text::jinja

// A Jinja2 interpreter for chat templates, rendering the way Hugging Face transformers does
// (jinja2 with trim_blocks and lstrip_blocks, loop controls, tojson as json.dumps with
// ensure_ascii=False, raise_exception and strftime_now globals). Values follow Python semantics
// (str() of lists and dicts, True/None spelling, code-point string indexing).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::text::jinja {

struct Node;

class Template {
 public:
  // Parses `source`; syntax errors -> InputError "NAME line L, column C: ...".
  explicit Template(std::string source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the keys of `globals` (a JSON object) as variables. Errors (including the template's
  // raise_exception) -> InputError with line and column.
  std::string render(const nlohmann::ordered_json& globals) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_, name_;
  std::shared_ptr<Node> root_;
};

}  // namespace lily::text::jinja

#include "server/structured.h"

#include "core/error.h"
#include "runtime/grammar_constraint.h"
#include "runtime/reasoning_budget.h"

namespace lily::server {

using json = nlohmann::ordered_json;

Structured::Structured(std::shared_ptr<const text::Tokenizer> tok, int32_t n_ids, std::vector<int32_t> stop_ids,
                       std::shared_ptr<const ChatFormat> chat, size_t max_grammars, size_t max_bytes)
    : tok_(std::move(tok)), n_ids_(n_ids), stop_ids_(std::move(stop_ids)), chat_(std::move(chat)), max_grammars_(max_grammars),
      max_bytes_(max_bytes) {}

std::shared_ptr<const text::TokenVocabulary> Structured::vocab() {
  std::lock_guard lk(mu_);
  if (!vocab_) vocab_ = text::TokenVocabulary::from_tokenizer(*tok_, n_ids_);
  return vocab_;
}

std::shared_ptr<text::TokenGrammar> Structured::grammar(const std::string& key, const std::function<text::Grammar()>& build) {
  {
    std::lock_guard lk(mu_);
    for (auto it = grammars_.begin(); it != grammars_.end(); ++it)
      if (it->first == key) {
        grammars_.splice(grammars_.begin(), grammars_, it);
        trim();
        return grammars_.front().second;
      }
  }
  auto v = vocab();
  auto g = std::make_shared<text::TokenGrammar>(build(), v, stop_ids_);
  std::lock_guard lk(mu_);
  grammars_.emplace_front(key, g);
  trim();
  return g;
}

// Drops the least recently used grammars past max_grammars_ or max_bytes_ (the newest is kept). Masks
// are cached as requests run, so the bytes are counted again at each use.
void Structured::trim() {
  size_t bytes = 0, n = 0;
  for (auto it = grammars_.begin(); it != grammars_.end();) {
    const size_t b = it->second->stats().bytes;
    if (n > 0 && (n + 1 > max_grammars_ || bytes + b > max_bytes_)) {
      it = grammars_.erase(it);
      continue;
    }
    bytes += b;
    ++n;
    ++it;
  }
}

std::pair<size_t, size_t> Structured::kept() {
  std::lock_guard lk(mu_);
  size_t bytes = 0;
  for (auto& [k, g] : grammars_) bytes += g->stats().bytes;
  return {grammars_.size(), bytes};
}

std::shared_ptr<TokenConstraint> Structured::json_output(const json& schema, const std::string& where, text::ReasoningMode mode,
                                                         int64_t max_tokens) {
  const std::string key = "json\n" + std::to_string(int(mode)) + "\n" + schema.dump();
  auto g = grammar(key, [&] { return text::json_output_grammar(schema, where, mode); });
  return std::make_shared<GrammarConstraint>(g, max_tokens);
}

std::shared_ptr<TokenConstraint> Structured::tool_calls(const json& tools, const std::string& only, int max_calls,
                                                        text::ReasoningMode mode, int64_t max_tokens,
                                                        const std::string& schema_where) {
  text::ToolCallGrammarOptions o;
  o.schema_where = schema_where;
  o.syntax = syntax();
  o.tools = tools;
  o.only = only;
  o.max_calls = std::max(1, max_calls);
  o.reasoning = mode;
  const std::string key = "tools\n" + std::to_string(int(mode)) + "\n" + std::to_string(int(o.syntax)) + "\n" + only + "\n" +
                          std::to_string(o.max_calls) + "\n" + tools.dump();
  auto g = grammar(key, [&] { return text::tool_call_grammar(o); });
  return std::make_shared<GrammarConstraint>(g, max_tokens);
}

std::shared_ptr<TokenConstraint> Structured::thinking_budget(std::shared_ptr<TokenConstraint> inner, int64_t budget,
                                                             bool start_in_reasoning) {
  auto close = tok_->token_id("</think>");
  if (!close || *close >= n_ids_) return inner;  // a model without a think token: nothing to force
  ReasoningBudgetOptions o;
  o.budget = budget;
  o.close_id = *close;
  o.start_in_reasoning = start_in_reasoning;
  o.vocab = vocab();
  return std::make_shared<ReasoningBudget>(o, std::move(inner));
}

text::ToolCallSyntax Structured::syntax() {
  std::lock_guard lk(mu_);
  if (syntax_ < 0) {
    syntax_ = int(text::ToolCallSyntax::Json);
    if (chat_) {
      const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
      const json msgs = json::parse(R"([{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
          "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}])");
      try {
        if (chat_->render(msgs, tools, json::object(), false).find("<function=f>") != std::string::npos)
          syntax_ = int(text::ToolCallSyntax::Xml);
      } catch (const std::exception&) {
        // a template that cannot render a tool call: the JSON form
      }
    }
  }
  return text::ToolCallSyntax(syntax_);
}

}  // namespace lily::server

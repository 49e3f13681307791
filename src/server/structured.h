// Token constraints for structured outputs (a JSON schema, any JSON object) and forced tool calls,
// shared by every API: the tokenizer's vocabulary is decoded once, compiled grammars (with their mask
// caches) are kept by what they were built from, so a repeated schema starts warm. The kept grammars are
// bounded in number and in bytes: past either bound the least recently used are dropped (a request
// still holding one keeps it until it ends).
#pragma once
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/constraint.h"
#include "server/chat_format.h"
#include "text/output_grammar.h"
#include "text/token_grammar.h"
#include "text/tokenizer.h"

namespace lily::server {

class Structured {
 public:
  // `n_ids`: the model's vocabulary; `stop_ids`: where a finished document may end.
  Structured(std::shared_ptr<const text::Tokenizer> tok, int32_t n_ids, std::vector<int32_t> stop_ids,
             std::shared_ptr<const ChatFormat> chat, size_t max_grammars = 32, size_t max_bytes = size_t(256) << 20);

  // A JSON document after the reasoning block: matching `schema`, or any object when it is null.
  // InputError naming `where` when the schema is malformed.
  std::shared_ptr<TokenConstraint> json_output(const nlohmann::ordered_json& schema, const std::string& where,
                                               text::ReasoningMode mode, int64_t max_tokens);
  // One to `max_calls` calls of `tools` (OpenAI shape; `only`: that function), in the template's syntax.
  // `schema_where` names a tool's schema in errors ({}: the tool's index).
  std::shared_ptr<TokenConstraint> tool_calls(const nlohmann::ordered_json& tools, const std::string& only, int max_calls,
                                              text::ReasoningMode mode, int64_t max_tokens, const std::string& schema_where);
  // `inner` (may be null) with a thinking budget: </think> forced after `budget` reasoning tokens.
  std::shared_ptr<TokenConstraint> thinking_budget(std::shared_ptr<TokenConstraint> inner, int64_t budget, bool start_in_reasoning);

  // The tool-call markup the chat template writes (probed once by rendering a call).
  text::ToolCallSyntax syntax();

  // The kept grammars: how many, and the bytes they hold.
  std::pair<size_t, size_t> kept();

 private:
  std::shared_ptr<const text::TokenVocabulary> vocab();
  std::shared_ptr<text::TokenGrammar> grammar(const std::string& key, const std::function<text::Grammar()>& build);
  void trim();  // with mu_ held

  std::shared_ptr<const text::Tokenizer> tok_;
  int32_t n_ids_;
  std::vector<int32_t> stop_ids_;
  std::shared_ptr<const ChatFormat> chat_;
  size_t max_grammars_, max_bytes_;
  std::mutex mu_;
  std::shared_ptr<const text::TokenVocabulary> vocab_;
  std::list<std::pair<std::string, std::shared_ptr<text::TokenGrammar>>> grammars_;  // most recent first
  int syntax_ = -1;
};

}  // namespace lily::server

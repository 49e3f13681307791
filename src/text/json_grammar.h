// JSON Schema -> grammar (structured outputs). Supported: type (one or a list), object properties in
// their declared order with required / optional ones, additionalProperties false / true / a schema
// (absent: false, as strict structured outputs do; extra keys are plain strings other than the declared
// names), array items / prefixItems / minItems / maxItems, enum, const, string minLength / maxLength (in
// characters), number, integer, boolean, null, nullable, anyOf / oneOf (as alternatives), allOf (merged),
// $ref to "#", "#/$defs/..." or "#/definitions/..." (recursion allowed). Keywords that a grammar cannot
// enforce are not enforced (pattern, format, numeric bounds, uniqueItems). Whitespace between tokens is
// limited to nothing, one space, or a newline and up to 16 spaces; numbers to 16 integer digits, 16
// fraction digits and 3 exponent digits; \u escapes of surrogates are not produced (such characters
// appear as UTF-8). Malformed schemas -> InputError naming the schema location.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/grammar.h"

namespace lily::text {

class JsonGrammarBuilder {
 public:
  explicit JsonGrammarBuilder(Grammar& g);
  // A rule for a JSON value matching `schema` (`where` names it in errors, e.g. "response_format.schema").
  Grammar::RuleId schema(const nlohmann::ordered_json& schema, const std::string& where);
  Grammar::RuleId any_value();
  Grammar::RuleId any_object();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// A grammar whose language is the JSON documents matching `schema` (no whitespace around the value).
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const std::string& where);
// Any JSON object (response_format json_object).
Grammar json_object_grammar();

}  // namespace lily::text

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace lily::cli {
namespace {

Register reg_tokenize("tokenize", "Turn text into token ids with a model's tokenizer.json", [](CLI::App& app) {
  struct Opts {
    std::string tokenizer, text, text_file;
    bool json = false, no_special = false, pieces = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--tokenizer,--model", o->tokenizer, "Directory with tokenizer.json (or the file itself)")->required();
  auto* t = app.add_option("--text", o->text, "Text to tokenize");
  auto* f = app.add_option("--text-file", o->text_file, "File whose bytes are tokenized");
  t->excludes(f);
  app.add_flag("--json", o->json, "Print {\"ids\": [...]}");
  app.add_flag("--no-special", o->no_special, "Treat special tokens written in the text as plain text");
  app.add_flag("--pieces", o->pieces, "Also print each token's vocabulary string");
  return [o, t, f]() -> int {
    if (t->count() == 0 && f->count() == 0) fail("tokenize: give --text or --text-file");
    std::string text = o->text;
    if (f->count()) {
      std::ifstream in(o->text_file, std::ios::binary);
      if (!in) fail("--text-file: cannot open {}", o->text_file);
      std::ostringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    }
    auto tok = text::Tokenizer::load(o->tokenizer);
    auto ids = tok->encode(text, !o->no_special);
    if (o->json) {
      nlohmann::json j = {{"ids", ids}};
      if (o->pieces) {
        auto arr = nlohmann::json::array();
        for (auto id : ids) arr.push_back(tok->token_string(id));
        j["pieces"] = arr;
      }
      fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      return 0;
    }
    std::string out;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k) out += o->pieces ? "\n" : ",";
      out += std::to_string(ids[k]);
      if (o->pieces) out += "\t" + nlohmann::json(tok->token_string(ids[k])).dump();
    }
    fmt::print("{}\n", out);
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli

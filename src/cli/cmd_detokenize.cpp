#include <fmt/format.h>

#include "cli/registry.h"
#include "core/error.h"
#include "text/tokenizer.h"

namespace lily::cli {
namespace {

Register reg_detokenize("detokenize", "Turn token ids back into text", [](CLI::App& app) {
  struct Opts {
    std::string tokenizer, ids;
    bool skip_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--tokenizer,--model", o->tokenizer, "Directory with tokenizer.json (or the file itself)")->required();
  app.add_option("--ids", o->ids, "Token ids, e.g. 9707,1879")->required();
  app.add_flag("--skip-special", o->skip_special, "Leave out special tokens");
  return [o]() -> int {
    auto ids = parse_ids(o->ids, "--ids");
    auto tok = text::Tokenizer::load(o->tokenizer);
    std::string text = tok->decode(ids, o->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  };
});

}  // namespace
}  // namespace lily::cli

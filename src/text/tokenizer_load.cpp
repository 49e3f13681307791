// Tokenizer::load and Tokenizer::from_json: tokenizer.json (model, added tokens, normalizer,
// pre-tokenizer, decoder) and tokenizer_config.json (named tokens) into a Tokenizer::Impl.
#include <algorithm>
#include <functional>

#include "core/error.h"
#include "core/mapped_file.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace lily::text {

using json = nlohmann::json;
using detail::NormForm;
using detail::PreTokStep;
using detail::SplitBehavior;

namespace {

std::string read_file(const std::filesystem::path& p) { return read_text_file(p.string()); }

}  // namespace

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path file = path, dir = path;
  if (fs::is_directory(path)) file = path / "tokenizer.json";
  else dir = path.parent_path();
  if (!fs::exists(file)) fail("tokenizer: {} not found", file.string());
  json tok, cfg;
  try {
    tok = json::parse(read_file(file));
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
  auto cfg_file = dir / "tokenizer_config.json";
  if (fs::exists(cfg_file)) {
    try {
      cfg = json::parse(read_file(cfg_file));
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", cfg_file.string(), e.what());
    }
  }
  return from_json(tok, cfg, file.string());
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json(const json& tok, const json& cfg, const std::string& where) {
  auto im = std::make_unique<Impl>();
  im->where = where;
  auto field = [&](const json& obj, const char* name, const std::string& path) -> const json& {
    if (!obj.is_object() || !obj.contains(name)) fail("{}: missing field {}.{}", where, path, name);
    return obj.at(name);
  };
  auto get_str = [&](const json& v, const std::string& path) -> std::string {
    if (!v.is_string()) fail("{}: {} must be a string", where, path);
    return v.get<std::string>();
  };
  if (!tok.is_object()) fail("{}: top level must be a JSON object", where);

  // model
  const json& model = field(tok, "model", "");
  if (model.contains("type") && !(model["type"].is_string() && model["type"] == "BPE"))
    fail("{}: model.type {} is not supported (only BPE)", where, model["type"].dump());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      fail("{}: model.{} is not supported", where, k);
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
    fail("{}: model.byte_fallback is not supported (byte-level BPE only)", where);
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    im->ignore_merges = model["ignore_merges"].get<bool>();
  const json& vocab = field(model, "vocab", "model");
  if (!vocab.is_object()) fail("{}: model.vocab must be an object", where);
  // Ids index tables sized max_id + 1: a stray huge id would ask for gigabytes, so ids are bounded
  // absolutely and relative to the number of tokens.
  constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;
  int32_t max_id = -1;
  std::string max_token;
  auto check_id = [&](int64_t id, const std::string& token, const std::string& path) {
    if (id > kMaxTokenId)
      fail("{}: {} (token \"{}\") has id {}, beyond the largest supported id {}", where, path, token, id, kMaxTokenId);
    if (id > max_id) max_id = int32_t(id), max_token = token;
  };
  im->vocab.reserve(vocab.size() + 1024);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      fail("{}: model.vocab[\"{}\"] must be a non-negative integer id", where, it.key());
    check_id(it.value().get<int64_t>(), it.key(), "model.vocab");
    im->vocab.emplace(it.key(), int32_t(it.value().get<int64_t>()));
  }
  const json* added = tok.contains("added_tokens") ? &tok["added_tokens"] : nullptr;
  if (added && !added->is_null() && !added->is_array()) fail("{}: added_tokens must be an array", where);
  if (added && added->is_array()) {
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      std::string path = fmt::format("added_tokens[{}]", i);
      AddedToken t;
      const json& idv = field(a, "id", path);
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0)
        fail("{}: {}.id must be a non-negative integer", where, path);
      t.content = get_str(field(a, "content", path), path + ".content");
      check_id(idv.get<int64_t>(), t.content, path + ".id");
      t.id = int32_t(idv.get<int64_t>());
      if (t.content.empty()) fail("{}: {}.content is empty", where, path);
      if (!utf8_valid(t.content)) fail("{}: {}.content is not valid UTF-8", where, path);
      auto flag = [&](const char* n, bool def) {
        if (!a.contains(n) || a[n].is_null()) return def;
        if (!a[n].is_boolean()) fail("{}: {}.{} must be true or false", where, path, n);
        return a[n].get<bool>();
      };
      t.special = flag("special", false);
      t.normalized = flag("normalized", !t.special);
      t.lstrip = flag("lstrip", false);
      t.rstrip = flag("rstrip", false);
      t.single_word = flag("single_word", false);
      im->added.push_back(std::move(t));
    }
  }
  size_t entries = vocab.size() + im->added.size();
  if (max_id >= 0 && size_t(max_id) >= 4 * entries + 1024)
    fail("{}: token \"{}\" has id {}, but there are only {} tokens (ids this sparse suggest a corrupt file)", where,
         max_token, max_id, entries);
  size_t n = size_t(max_id + 1);
  im->id_str.assign(n, {});
  im->id_bytes.assign(n, {});
  im->id_special.assign(n, 0);
  im->id_known.assign(n, 0);
  const auto& bm = detail::byte_map();
  for (auto& [s, id] : im->vocab) {
    im->id_str[id] = s;
    std::string bytes;
    for (size_t i = 0; i < s.size();) {
      size_t st = i;
      int byte = bm.byte_of(next_cp(s, i));
      if (byte >= 0) bytes += char(byte);
      else bytes.append(s, st, i - st);
    }
    im->id_bytes[id] = std::move(bytes);
    im->id_known[id] = 1;
  }
  for (auto& a : im->added) {
    im->id_str[a.id] = a.content;
    im->id_bytes[a.id] = a.content;
    im->id_special[a.id] = a.special;
    im->id_known[a.id] = 1;
    im->vocab.emplace(a.content, a.id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = im->vocab.find(bm.to_str[b]);
    if (it == im->vocab.end())
      fail("{}: model.vocab lacks the byte-level token for byte 0x{:02X} (\"{}\"); only byte-level BPE is supported", where, b,
           bm.to_str[b]);
    im->byte_id[b] = it->second;
  }
  const json& merges = field(model, "merges", "model");
  if (!merges.is_array()) fail("{}: model.merges must be an array", where);
  im->merges.reserve(merges.size() * 2);
  std::string a, b, ab;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    if (m.is_string()) {
      auto s = m.get<std::string>();
      auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        fail("{}: model.merges[{}] \"{}\" is not two tokens separated by one space", where, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", where, r);
    }
    ab.assign(a).append(b);
    auto ia = im->vocab.find(a), ib = im->vocab.find(b), iab = im->vocab.find(ab);
    if (ia == im->vocab.end() || ib == im->vocab.end() || iab == im->vocab.end())
      fail("{}: model.merges[{}] (\"{}\" + \"{}\") uses a token missing from model.vocab", where, r, a, b);
    im->merges.emplace(Impl::key(ia->second, ib->second), std::pair<int32_t, int32_t>{int32_t(r), iab->second});
  }
  for (size_t k = 0; k < im->added.size(); ++k) im->added_by_first[uint8_t(im->added[k].content[0])].push_back(int(k));
  for (auto& v : im->added_by_first)
    std::stable_sort(v.begin(), v.end(), [&](int x, int y) { return im->added[x].content.size() > im->added[y].content.size(); });

  // normalizer
  std::function<void(const json&, const std::string&)> add_norm = [&](const json& nj, const std::string& path) {
    if (nj.is_null()) return;
    std::string type = get_str(field(nj, "type", path), path + ".type");
    if (type == "NFC") im->norm.push_back(NormForm::NFC);
    else if (type == "NFD") im->norm.push_back(NormForm::NFD);
    else if (type == "NFKC") im->norm.push_back(NormForm::NFKC);
    else if (type == "NFKD") im->norm.push_back(NormForm::NFKD);
    else if (type == "Sequence") {
      const json& l = field(nj, "normalizers", path);
      if (!l.is_array()) fail("{}: {}.normalizers must be an array", where, path);
      for (size_t i = 0; i < l.size(); ++i) add_norm(l[i], fmt::format("{}.normalizers[{}]", path, i));
    } else {
      fail("{}: {}.type \"{}\" is not supported (NFC, NFD, NFKC, NFKD, Sequence)", where, path, type);
    }
  };
  if (tok.contains("normalizer")) add_norm(tok["normalizer"], "normalizer");

  // pre-tokenizer
  std::function<void(const json&, const std::string&)> add_pre = [&](const json& pj, const std::string& path) {
    if (pj.is_null()) return;
    std::string type = get_str(field(pj, "type", path), path + ".type");
    PreTokStep st{};
    if (type == "Sequence") {
      const json& l = field(pj, "pretokenizers", path);
      if (!l.is_array()) fail("{}: {}.pretokenizers must be an array", where, path);
      for (size_t i = 0; i < l.size(); ++i) add_pre(l[i], fmt::format("{}.pretokenizers[{}]", path, i));
      return;
    } else if (type == "Split") {
      st.kind = PreTokStep::Split;
      const json& pat = field(pj, "pattern", path);
      std::string re;
      if (pat.is_object() && pat.contains("Regex")) re = detail::adapt_regex(get_str(pat["Regex"], path + ".pattern.Regex"));
      else if (pat.is_object() && pat.contains("String")) re = detail::regex_quote(get_str(pat["String"], path + ".pattern.String"));
      else fail("{}: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where, path);
      st.re = detail::compile_regex(re, where + ": " + path + ".pattern");
      std::string beh = get_str(field(pj, "behavior", path), path + ".behavior");
      if (beh == "Isolated") st.behavior = SplitBehavior::Isolated;
      else if (beh == "Removed") st.behavior = SplitBehavior::Removed;
      else if (beh == "MergedWithPrevious") st.behavior = SplitBehavior::MergedWithPrevious;
      else if (beh == "MergedWithNext") st.behavior = SplitBehavior::MergedWithNext;
      else if (beh == "Contiguous") st.behavior = SplitBehavior::Contiguous;
      else fail("{}: {}.behavior \"{}\" is not a known split behaviour", where, path, beh);
      if (pj.contains("invert") && pj["invert"].is_boolean()) st.invert = pj["invert"].get<bool>();
    } else if (type == "ByteLevel") {
      st.kind = PreTokStep::ByteLevel;
      if (pj.contains("add_prefix_space") && pj["add_prefix_space"].is_boolean())
        st.add_prefix_space = pj["add_prefix_space"].get<bool>();
      bool use_regex = !pj.contains("use_regex") || (pj["use_regex"].is_boolean() && pj["use_regex"].get<bool>());
      if (use_regex) st.re = detail::compile_regex(detail::adapt_regex(detail::kGpt2Regex), where + ": " + path);
    } else if (type == "Digits") {
      st.kind = PreTokStep::Digits;
      st.individual_digits = pj.contains("individual_digits") && pj["individual_digits"].is_boolean() &&
                             pj["individual_digits"].get<bool>();
    } else {
      fail("{}: {}.type \"{}\" is not supported (Split, ByteLevel, Digits, Sequence)", where, path, type);
    }
    im->pretok.push_back(std::move(st));
  };
  if (tok.contains("pre_tokenizer")) add_pre(tok["pre_tokenizer"], "pre_tokenizer");
  if (tok.contains("decoder") && tok["decoder"].is_object()) {
    const json& d = tok["decoder"];
    if (d.contains("type") && d["type"].is_string() && d["type"] != "ByteLevel")
      fail("{}: decoder.type {} is not supported (ByteLevel)", where, d["type"].dump());
  }

  // named tokens
  if (cfg.is_object()) {
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!cfg.contains(name)) continue;
      const json& v = cfg[name];
      if (v.is_string()) im->cfg_tokens[name] = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        im->cfg_tokens[name] = v["content"].get<std::string>();
    }
  }
  auto find = [&](const std::string& s) -> int32_t {
    auto it = im->vocab.find(s);
    return it == im->vocab.end() ? -1 : it->second;
  };
  im->im_end = find("<|im_end|>");
  im->im_start = find("<|im_start|>");
  im->endoftext = find("<|endoftext|>");
  im->eos = im->cfg_tokens.count("eos_token") ? find(im->cfg_tokens["eos_token"]) : -1;
  if (im->eos < 0) im->eos = im->im_end >= 0 ? im->im_end : im->endoftext;
  im->pad = im->cfg_tokens.count("pad_token") ? find(im->cfg_tokens["pad_token"]) : -1;
  if (im->pad < 0) im->pad = im->endoftext;
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(im)));
}

}  // namespace lily::text

// Bad input: every case ends in an InputError naming the cause, and `lily` exits with code 2.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "runtime/session.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace lily;
using nlohmann::json;

namespace {

class BadInput : public ::testing::Test {
 protected:
  virtual std::string source() const { return "qwen3_5_moe_text-a"; }
  void SetUp() override {
    src_ = test::golden_dir(source());
    ASSERT_FALSE(src_.empty());
    dir_ = fs::temp_directory_path() / ("lily_bad_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    cfg_ = json::parse(read_text_file(src_ + "/config.json"));
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_config(const json& c) { std::ofstream(dir_ / "config.json") << c.dump(1); }
  void write_raw(const std::string& header, const std::string& data) {
    std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
    uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << data;
  }
  // Golden tensors with `edit` applied to the list before writing.
  void write_model(const std::function<void(std::vector<TensorToWrite>&)>& edit) {
    Checkpoint ck(src_);
    std::vector<TensorToWrite> t;
    for (auto& [name, ti] : ck.tensors()) t.push_back({name, ti->dtype, ti->shape, ti->data, ti->nbytes});
    edit(t);
    write_safetensors((dir_ / "model.safetensors").string(), t);
  }
  // Loads through the library and through the CLI; both must name `needle`.
  void expect_error(const std::string& needle) {
    try {
      ModelWeights::load(dir_.string());
      ADD_FAILURE() << "loading succeeded; expected an error naming '" << needle << "'";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    expect_cli_error("info --model " + dir_.string(), needle);
  }
  // `lily ARGS` exits with code 2 and prints `needle` (skipped without the binary).
  void expect_cli_error(const std::string& args, const std::string& needle) {
    const char* bin = std::getenv("LILY_BIN");
    if (!bin || !fs::exists(bin)) return;
    std::string cmd = std::string(bin) + " " + args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int st = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << "exit status " << st << ": " << out;
    EXPECT_NE(out.find(needle), std::string::npos) << out;
  }

  std::string src_;
  fs::path dir_;
  json cfg_;
};

TEST_F(BadInput, UnknownModelType) {
  cfg_["model_type"] = "llama";
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("unknown model_type 'llama'");
}

TEST_F(BadInput, MissingConfigField) {
  cfg_.erase("linear_num_value_heads");
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("missing field 'linear_num_value_heads'");
}

TEST_F(BadInput, ConfigNotJson) {
  std::ofstream(dir_ / "config.json") << "{\"model_type\": ";
  write_model([](auto&) {});
  expect_error("config.json: not valid JSON");
}

TEST_F(BadInput, NoConfig) {
  write_model([](auto&) {});
  expect_error("no config.json");
}

TEST_F(BadInput, NoWeights) {
  write_config(cfg_);
  expect_error("neither model.safetensors nor model.safetensors.index.json");
}

TEST_F(BadInput, MissingTensor) {
  write_config(cfg_);
  write_model([](auto& t) {
    std::erase_if(t, [](auto& x) { return x.name == "model.layers.1.linear_attn.in_proj_z.weight"; });
  });
  expect_error("missing tensor 'model.layers.1.linear_attn.in_proj_z.weight'");
}

TEST_F(BadInput, WrongShape) {
  write_config(cfg_);
  write_model([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.3.self_attn.q_proj.weight") x.shape = {x.shape[1], x.shape[0]};
  });
  expect_error("tensor 'model.layers.3.self_attn.q_proj.weight' has shape [128, 512], expected [512, 128]");
}

TEST_F(BadInput, WrongDtype) {
  write_config(cfg_);
  write_model([](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.0.mlp.gate.weight") x.dtype = DType::I16;
  });
  expect_error("model.layers.0.mlp.gate.weight");
}

TEST_F(BadInput, HeaderPastEnd) {
  write_config(cfg_);
  std::ofstream f(dir_ / "model.safetensors", std::ios::binary);
  uint64_t n = 1 << 20;
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << "{}";
  f.close();
  expect_error("runs past the end of the file");
}

TEST_F(BadInput, DataOffsetsPastEnd) {
  write_config(cfg_);
  write_raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(8, '\0'));
  expect_error("tensor 'a': data_offsets [0, 16] run past the end");
}

TEST_F(BadInput, OverlappingTensors) {
  write_config(cfg_);
  write_raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            std::string(24, '\0'));
  expect_error("tensors 'a' and 'b' overlap");
}

TEST_F(BadInput, SizeMismatch) {
  write_config(cfg_);
  write_raw(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", std::string(16, '\0'));
  expect_error("tensor 'a': 16 bytes stored but shape [4] of BF16 needs 8");
}

TEST_F(BadInput, UnknownDtype) {
  write_config(cfg_);
  write_raw(R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", std::string(4, '\0'));
  expect_error("unsupported dtype 'F8_E4M3'");
}

TEST_F(BadInput, HeaderNotJson) {
  write_config(cfg_);
  write_raw("{not json", "");
  expect_error("header is not valid JSON");
}

TEST_F(BadInput, TruncatedFile) {
  write_config(cfg_);
  std::ofstream(dir_ / "model.safetensors", std::ios::binary) << "abc";
  expect_error("too small to be a safetensors file");
}

TEST_F(BadInput, MissingMlpForDenseLayer) {
  cfg_["mlp_only_layers"] = {2};
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("missing tensor 'model.layers.2.mlp.gate_proj.weight'");
}

// The dense Qwen3.5 golden (qwen3_5_text, intermediate_size 256 in every layer).
class DenseBadInput : public BadInput {
 protected:
  std::string source() const override { return "qwen3_5_text-a-mtp"; }
};

TEST_F(DenseBadInput, IntermediateSizeDoesNotMatchTheTensors) {
  cfg_["intermediate_size"] = 300;
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("config.json: intermediate_size is 300 but tensor 'model.layers.0.mlp.gate_proj.weight' has shape [256, 128] (256 rows)");
}

TEST_F(DenseBadInput, DownProjectionNarrowerThanIntermediateSize) {
  write_config(cfg_);
  std::vector<uint16_t> narrow(128 * 192, 0x3f80);
  write_model([&](auto& t) {
    for (auto& x : t)
      if (x.name == "model.layers.2.mlp.down_proj.weight") x = {x.name, DType::BF16, {128, 192}, narrow.data(), narrow.size() * 2};
  });
  expect_error("intermediate_size is 256 but tensor 'model.layers.2.mlp.down_proj.weight' has shape [128, 192] (192 columns)");
}

TEST_F(DenseBadInput, MissingIntermediateSize) {
  cfg_.erase("intermediate_size");
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("missing field 'intermediate_size'");
}

TEST_F(DenseBadInput, NestedConfigWithoutTextConfig) {
  write_config(json{{"model_type", "qwen3_5"}, {"vision_config", json::object()}});
  write_model([](auto&) {});
  expect_error("model_type qwen3_5 needs an object 'text_config'");
}

TEST_F(DenseBadInput, UnsupportedActivation) {
  cfg_["hidden_act"] = "gelu";
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("hidden_act \"gelu\" is not supported");
}

// Opening a FIFO for reading waits for a writer: the loader must refuse it instead of hanging.
TEST_F(BadInput, FifoAsWeights) {
  write_config(cfg_);
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors").c_str(), 0600), 0);
  expect_error("model.safetensors: is a FIFO, not a regular file");
}

TEST_F(BadInput, FifoAsConfig) {
  write_model([](auto&) {});
  ASSERT_EQ(::mkfifo((dir_ / "config.json").c_str(), 0600), 0);
  expect_error("config.json: is a FIFO, not a regular file");
}

TEST_F(BadInput, DirectoryAsWeights) {
  write_config(cfg_);
  fs::create_directory(dir_ / "model.safetensors");
  expect_error("model.safetensors: is a directory, not a regular file");
}

// nlohmann keeps the last of two equal keys, so without a check the first entry vanished and its bytes
// looked like an overlap with a neighbour.
TEST_F(BadInput, DuplicateTensorInHeader) {
  write_config(cfg_);
  write_raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]},)"
            R"("a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
            std::string(32, '\0'));
  expect_error("tensor 'a' appears twice in the header");
}

TEST_F(BadInput, DuplicateTensorAcrossShards) {
  write_config(cfg_);
  Checkpoint ck(src_);
  std::vector<TensorToWrite> first, second;
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  size_t i = 0;
  for (auto& [name, ti] : ck.tensors()) {
    (i++ % 2 ? second : first).push_back({name, ti->dtype, ti->shape, ti->data, ti->nbytes});
    index["weight_map"][name] = i % 2 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  second.push_back(first.front());  // the first shard's first tensor stored again in the second
  write_safetensors((dir_ / "model-00001-of-00002.safetensors").string(), first);
  write_safetensors((dir_ / "model-00002-of-00002.safetensors").string(), second);
  std::ofstream(dir_ / "model.safetensors.index.json") << index.dump(1);
  expect_error("tensor '" + first.front().name + "' appears twice: in " + (dir_ / "model-00001-of-00002.safetensors").string() +
               " and in " + (dir_ / "model-00002-of-00002.safetensors").string());
}

TEST_F(BadInput, DuplicateTensorInIndex) {
  write_config(cfg_);
  write_model([](auto&) {});
  fs::rename(dir_ / "model.safetensors", dir_ / "shard.safetensors");
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "shard.safetensors", "model.norm.weight": "shard.safetensors"}})";
  expect_error("tensor 'model.norm.weight' appears twice in weight_map");
}

TEST_F(BadInput, TokenOutsideVocab) {
  auto e = Engine::open(src_, EngineOptions{});
  Session s(*e);
  std::vector<int32_t> ids = {1, 2, 320};
  try {
    s.prefill(ids, nullptr);
    FAIL() << "expected an error";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("token id 320 is outside the vocabulary"), std::string::npos) << err.what();
  }
}

TEST_F(BadInput, ContextOverflow) {
  EngineOptions eo;
  eo.ctx_size = 4;
  auto e = Engine::open(src_, eo);
  Session s(*e);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  EXPECT_THROW(s.prefill(ids, nullptr), InputError);
}

// ---- the MTP block (mtp.*) ----

class MtpBadInput : public BadInput {
 protected:
  std::string source() const override { return "qwen3_5_moe_text-a-mtp"; }
  // require_mtp() and `lily logits --mtp` both fail naming every needle.
  void expect_no_mtp(const std::vector<std::string>& needles) {
    auto w = ModelWeights::load(dir_.string());
    EXPECT_FALSE(w->mtp.has_value());
    try {
      w->require_mtp();
      ADD_FAILURE() << "require_mtp succeeded";
    } catch (const InputError& e) {
      for (auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
    for (auto& n : needles) expect_cli_error("logits --mtp --model " + dir_.string() + " --tokens 1,2,3 --out /dev/null", n);
  }
};

TEST_F(MtpBadInput, WrongShape) {
  write_config(cfg_);
  write_model([](auto& t) {
    for (auto& x : t)
      if (x.name == "mtp.fc.weight") x.shape = {x.shape[1], x.shape[0]};
  });
  expect_error("tensor 'mtp.fc.weight' has shape [256, 128], expected [128, 256]");
}

TEST_F(MtpBadInput, WrongNormShape) {
  write_config(cfg_);
  write_model([](auto& t) {
    for (auto& x : t)
      if (x.name == "mtp.pre_fc_norm_hidden.weight") x.shape = {2, x.shape[0] / 2};
  });
  expect_error("tensor 'mtp.pre_fc_norm_hidden.weight' has shape [2, 64], expected [128]");
}

TEST_F(MtpBadInput, WrongFusedExpertShape) {
  write_config(cfg_);
  write_model([](auto& t) {
    for (auto& x : t)
      if (x.name == "mtp.layers.0.mlp.experts.down_proj") x.shape = {x.shape[0], x.shape[2], x.shape[1]};
  });
  expect_error("tensor 'mtp.layers.0.mlp.experts.down_proj' has shape [8, 64, 128], expected [8, 128, 64]");
}

TEST_F(MtpBadInput, TensorMissingNamesTensorAndField) {
  write_config(cfg_);
  write_model([](auto& t) { std::erase_if(t, [](auto& x) { return x.name == "mtp.norm.weight"; }); });
  expect_error("missing tensor 'mtp.norm.weight'");
  expect_error("config.json field 'mtp_num_hidden_layers' is 1");
}

TEST_F(MtpBadInput, ConfigSaysMtpButCheckpointHasNone) {
  write_config(cfg_);
  write_model([](auto& t) { std::erase_if(t, [](auto& x) { return x.name.rfind("mtp.", 0) == 0; }); });
  expect_no_mtp({"config.json field 'mtp_num_hidden_layers' is 1", "'mtp.fc.weight'", "'mtp.layers.0.*'"});
}

TEST_F(MtpBadInput, ConfigSaysNoMtpButCheckpointHasIt) {
  cfg_["mtp_num_hidden_layers"] = 0;
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("config.json field 'mtp_num_hidden_layers' is 0 but the checkpoint holds MTP tensors ('mtp.fc.weight'");
}

TEST_F(MtpBadInput, SecondMtpLayer) {
  write_config(cfg_);
  std::vector<uint16_t> w(128, 0);
  write_model([&](auto& t) {
    t.push_back({"mtp.layers.1.input_layernorm.weight", DType::BF16, {128}, w.data(), w.size() * 2});
  });
  expect_error("tensor 'mtp.layers.1.input_layernorm.weight' belongs to MTP layer 1, but config.json field "
               "'mtp_num_hidden_layers' is 1");
}

TEST_F(MtpBadInput, TwoMtpLayersDeclared) {
  cfg_["mtp_num_hidden_layers"] = 2;
  write_config(cfg_);
  write_model([](auto&) {});
  expect_error("field 'mtp_num_hidden_layers' is 2; lily runs checkpoints with one MTP layer");
}

TEST_F(BadInput, NoMtpBlock) {
  write_config(cfg_);
  write_model([](auto&) {});
  auto w = ModelWeights::load(dir_.string());
  EXPECT_FALSE(w->mtp.has_value());
  EXPECT_THROW(w->require_mtp(), InputError);
  expect_cli_error("logits --mtp --model " + dir_.string() + " --tokens 1,2,3 --out /dev/null",
                   "the checkpoint has no MTP block (missing 'mtp.fc.weight'");
}

}  // namespace

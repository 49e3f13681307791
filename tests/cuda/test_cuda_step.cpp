// Multi-sequence steps on the CUDA backend (step_harness.h): S sequences of different lengths stepped
// together against each alone (CUDA) and against the CPU backend, prompt chunks mixed with decode rows;
// tentative rows and commit against plain rows; the pipelined generation loop with several requests
// against each request alone on the host path; malformed steps refused.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaStep, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <string>

#include "../model/test_util.h"
#include "../support/recording_job.h"
#include "backend/cpu/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/loop.h"
#include "runtime/session.h"
#include "step_harness.h"
#include "tools/synth.h"

using namespace lily;
using namespace lily::cudatest;

namespace {

struct StepModel {
  std::string name;
  std::shared_ptr<const ModelWeights> w;
  cpu::CpuOptions copt;
};

// The golden checkpoints present here (MoE and dense), and tiny synth models in affine 4-bit (quantized
// products; MoE and dense).
std::vector<StepModel> models() {
  std::vector<StepModel> m;
  for (const char* n : {"qwen3_5_moe_text-a", "qwen3_next-a", "qwen3_5_moe_text-r", "qwen3_5_text-a-mtp"}) {
    const std::string dir = test::golden_dir(n);
    if (!dir.empty()) m.push_back({n, ModelWeights::load(dir), {}});
  }
  for (const char* preset : {"tiny", "tiny-dense"}) {
    SynthOptions so;
    so.preset = preset;
    so.format = SynthFormat::Affine4;
    so.seed = 3;
    StepModel t{std::string(preset) + " synth affine4", synth_model(so), {}};
    t.copt.affine = cpu::AffinePath::Exact;  // the CUDA affine kernels take float activations
    m.push_back(std::move(t));
  }
  return m;
}

// CUDA against the CPU at fp32-class bounds: the prompt GEMMs in the high-precision mode.
void together_vs_alone(const StepModel& m, int S, int stagger, const CudaOptions& opt = cudatest::high_precision_options()) {
  const int64_t V = m.w->cfg.vocab;
  auto gpu = make_cuda_backend(m.w, opt);
  cpu::CpuBackend cpu(m.w, m.copt);
  const auto plans = make_plans(S, V, 4, stagger);
  const auto tog = run_schedule(*gpu, plans, true);
  const auto alone = run_schedule(*gpu, plans, false);
  const auto ref = run_schedule(cpu, plans, false);
  for (int i = 0; i < S; ++i) {
    const std::string w = m.name + " S " + std::to_string(S) + " stagger " + std::to_string(stagger) + " sequence " +
                          std::to_string(i) + " (prompt " + std::to_string(plans[size_t(i)].prompt.size()) + ")";
    expect_agree(tog[size_t(i)], alone[size_t(i)], V, w + ": together vs alone (CUDA)");
    expect_agree(tog[size_t(i)], ref[size_t(i)], V, w + ": together (CUDA) vs alone (CPU)");
  }
}

TEST(CudaStep, SequencesTogetherMatchEachAlone) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const StepModel& m : models())
    for (int S : {1, 2, 3, 7, 16}) together_vs_alone(m, S, 0);
}

// Many-row steps with every product on the per-row GEMV paths (--cuda-opt gemv_rows=32 moe_gemv_rows=32
// rows_dense=0 rows_moe=0); the defaults take the multi-row products.
TEST(CudaStep, SequencesTogetherOnManyRowGemvs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CudaOptions opt = cudatest::high_precision_options();
  opt.kernels.gemv_rows = 32;
  opt.kernels.moe_gemv_rows = 32;
  opt.kernels.rows_dense = 0;
  opt.kernels.rows_moe = 0;
  for (const StepModel& m : models())
    for (int S : {3, 16}) together_vs_alone(m, S, 0, opt);
}

// Steps of 3-8 rows with the norms inside their products and the MoE as a GEMV per slot: on the GEMVs
// (--cuda-opt norm_rows=4 ring_moe_rows=1) and with the dense products on the multi-row kernel (rows_min=3
// norm_rows=8), together against alone and the CPU, and tentative rows then commit; the latter also with the
// attention of the tentative rows on the decode kernel per token block (attn_token_blocks).
TEST(CudaStep, FusedNormsAndPerSlotExpertsAtFewRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  CudaOptions gemvs = cudatest::high_precision_options();
  gemvs.kernels.norm_rows = 4;
  gemvs.kernels.ring_moe_rows = 1;
  CudaOptions rows = cudatest::high_precision_options();
  rows.kernels.norm_rows = 8;
  rows.kernels.rows_min = 3;
  CudaOptions blocks = rows;
  blocks.kernels.attn_token_blocks = true;
  for (const StepModel& m : models()) {
    for (int S : {3, 4}) together_vs_alone(m, S, 0, gemvs);
    for (int S : {3, 8}) together_vs_alone(m, S, 0, rows);
    for (const CudaOptions* opt : {&gemvs, &rows, &blocks}) {
      auto gpu = make_cuda_backend(m.w, *opt);
      const auto prompt = ids(21, m.w->cfg.vocab, 31u);
      for (int k : {1, 3, 7}) check_tentative(*gpu, prompt, k, m.name + " fused norms");
    }
  }
}

// Prompts join while the others decode: steps that mix a prompt chunk with single decode rows.
TEST(CudaStep, PromptChunksMixedWithDecodeRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const StepModel& m : models()) {
    together_vs_alone(m, 7, 1);
    together_vs_alone(m, 3, 2);
  }
}

TEST(CudaStep, TentativeRowsThenCommitEqualPlainRows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const StepModel& m : models()) {
    auto gpu = make_cuda_backend(m.w);
    const auto prompt = ids(21, m.w->cfg.vocab, 31u);
    for (int k = 1; k <= 7; ++k) check_tentative(*gpu, prompt, k, m.name);
  }
}

// Tentative groups batched with plain ones: each sequence's commit leaves the state of its plain rows.
TEST(CudaStep, TentativeGroupsBatchedWithPlainOnes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const StepModel m = models().front();
  auto gpu = make_cuda_backend(m.w);
  const int64_t V = m.w->cfg.vocab;
  const auto prompt = ids(19, V, 5u);
  const auto rows = ids(4, V, 6u);
  auto a = gpu->new_state(64), b = gpu->new_state(64), c = gpu->new_state(64), ref = gpu->new_state(64);
  a->reserve_tentative(4);
  for (auto* s : {a.get(), b.get(), c.get(), ref.get()}) forward_step(*gpu, *s, prompt, 0, nullptr);
  Step st;
  st.add(*b, std::span(rows).first(1), 1);
  st.add(*a, rows, 4, true, false, true);
  st.add(*c, std::span(rows).first(2), 1);
  std::vector<float> l(size_t(st.logit_rows()) * size_t(V));
  gpu->finish(forward(*gpu, st), StepOutputs{l.data(), nullptr});
  a->commit(2);
  forward_step(*gpu, *ref, std::span(rows).first(2), 0, nullptr);
  expect_state_near(a->snapshot()->contents(), ref->snapshot()->contents(), "tentative in a batch, commit(2)");
  expect_state_near(c->snapshot()->contents(), ref->snapshot()->contents(), "plain 2 rows in the same batch");
}

// The pipelined loop (ids drawn and fed on the device, the next step queued before the previous one is
// read) with several requests at once gives each request's greedy tokens on the host path alone.
TEST(CudaStep, PipelinedLoopMatchesHostGreedy) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = test::golden_dir("qwen3_5_moe_text-a");
  if (dir.empty()) GTEST_SKIP() << "golden model not present";
  EngineOptions eo;
  eo.backend = "cuda";
  eo.ctx_size = 160;
  // the loop chunks prompts into 16-row steps (GEMVs), the solo runs do not (GEMMs): the same ids need the
  // fp32-class prompt products of the high-precision mode
  auto w = ModelWeights::load(dir);
  auto e = Engine::from_backend(w, make_cuda_backend(w, cudatest::high_precision_options()), eo);
  ASSERT_TRUE(e->backend().can_sample());
  const int S = 5;
  const int64_t V = e->config().vocab;
  std::vector<GenParams> ps;
  for (int i = 0; i < S; ++i) {
    GenParams p;
    p.prompt = ids(size_t(6 + 9 * i), V, 40u + uint32_t(i));
    p.max_tokens = 12 + i;
    p.use_cache = false;
    ps.push_back(p);
  }
  std::vector<std::vector<int32_t>> solo;
  for (auto p : ps) {
    p.allow_device = false;
    Session s(*e);
    solo.push_back(generate(s, p.prompt, p).tokens);
  }
  LoopOptions lo;
  lo.step_tokens = 16;  // prompts are chunked into the decode steps
  GenerationLoop loop(*e, lo);
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::shared_ptr<test_support::RecordingJob>> jobs;
  for (int i = 0; i < S; ++i) {
    sessions.push_back(std::make_unique<Session>(*e));
    jobs.push_back(std::make_shared<test_support::RecordingJob>(ps[size_t(i)]));
    loop.add(jobs.back(), *sessions.back(), GenerationLoop::now_ms());
  }
  int steps = 0;
  while (!loop.empty()) {
    loop.step();
    ++steps;
  }
  for (int i = 0; i < S; ++i) {
    EXPECT_EQ(jobs[size_t(i)]->ids, solo[size_t(i)]) << "request " << i;
    const GenResult r = jobs[size_t(i)]->wait();
    EXPECT_TRUE(r.device_sampled) << "request " << i;
    EXPECT_EQ(r.finish_reason, "length");
    std::vector<int32_t> want = ps[size_t(i)].prompt;
    want.insert(want.end(), solo[size_t(i)].begin(), solo[size_t(i)].end());
    EXPECT_EQ(sessions[size_t(i)]->tokens(), want) << "request " << i << " end state";
  }
  EXPECT_LT(steps, 40) << "requests shared steps";
}

template <class F>
void expect_internal(F&& f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted";
  } catch (const InternalError&) {
  }
}

TEST(CudaStep, MalformedStepsRefused) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const StepModel m = models().front();
  auto gpu = make_cuda_backend(m.w);
  auto other = make_cuda_backend(m.w);
  const int64_t V = m.w->cfg.vocab;
  auto a = gpu->new_state(16), b = gpu->new_state(16), x = other->new_state(16);
  const auto t3 = ids(3, V, 1u);
  const int32_t fed = kFedToken;
  auto run = [&](const Step& st) { gpu->finish(forward(*gpu, st), StepOutputs{}); };
  expect_internal([&] { Step st; st.add(*a, t3, 0); st.add(*a, t3, 0); run(st); }, "a sequence twice");
  expect_internal([&] { Step st; st.add(*x, t3, 0); run(st); }, "a state of another backend");
  expect_internal([&] { Step st; st.add(*a, std::span(&fed, 1), 1, false, true); run(st); }, "sampling without set_sampling");
  gpu->set_sampling(*a, DeviceSampling{}, {});
  expect_internal([&] { Step st; st.add(*a, std::span(&fed, 1), 1, false, true); run(st); }, "a fed row before any draw");
  expect_internal([&] { Step st; st.add(*b, t3, 3, true, false, true); run(st); }, "tentative rows without reserve_tentative");
  b->reserve_tentative(3);
  {
    Step st;
    st.add(*b, t3, 3, true, false, true);
    std::vector<float> l(size_t(3 * V));
    gpu->finish(forward(*gpu, st), StepOutputs{l.data(), nullptr});
  }
  expect_internal([&] { Step st; st.add(*b, t3, 0); run(st); }, "a sequence with pending tentative rows");
  expect_internal([&] { b->commit(4); }, "commit past the tentative rows");
  expect_internal([&] { (void)b->snapshot(); }, "snapshot with pending rows");
  b->commit(1);
  EXPECT_EQ(b->n_tokens(), 1);
  const auto t20 = ids(20, V, 2u);
  EXPECT_THROW(forward(*gpu, [&] { Step st; st.add(*b, t20, 0); return st; }()), InputError) << "rows past the context";
  expect_internal([&] { Step st; gpu->begin(st); }, "an empty step");
  expect_internal([&] { Step st; st.add(*a, t3, 0); gpu->finish(12345, StepOutputs{}); }, "an unknown ticket");
  // the backend still steps after the refusals
  std::vector<float> l(static_cast<size_t>(V));
  forward_step(*gpu, *a, t3, 1, l.data());
  EXPECT_EQ(a->n_tokens(), 3);
}

// Model shapes the CUDA kernels do not take are refused when the backend is built, naming the field.
TEST(CudaStep, UnsupportedShapesRefusedAtConstruction) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (auto [field, bad] : {std::pair<std::string, int64_t>{"head_dim", 96}, {"linear_key_head_dim", 48},
                            {"linear_conv_kernel_dim", 9}}) {
    SynthOptions so;
    so.preset = "tiny";
    so.format = SynthFormat::BF16;
    auto w0 = synth_model(so);
    auto w = std::make_shared<ModelWeights>(*w0);
    if (field == "head_dim") w->cfg.head_dim = bad;
    else if (field == "linear_key_head_dim") w->cfg.lin_k_dim = bad;
    else w->cfg.conv_kernel = bad;
    try {
      (void)make_cuda_backend(w);
      ADD_FAILURE() << field << " " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  }
}

}  // namespace
#endif

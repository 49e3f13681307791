// The decode step kernel's plan (mk.h): ops, counters, tiles and their partition into per-block tasks.
#include <fmt/format.h>

#include <algorithm>

#include "backend/cuda/mk.h"
#include "core/error.h"

namespace lily::cuda::mk {

const char* op_name(int32_t type) {
  static const char* names[kNumOpTypes] = {"embed", "gemv", "router", "expert_gu", "expert_down",
                                            "gdn", "attn_split", "attn_merge", "head"};
  return type >= 0 && type < kNumOpTypes ? names[type] : "?";
}

int Plan::counter(int n) {
  const int c = n_counters_;
  n_counters_ += n;
  return c;
}

int Plan::add(OpDesc op, std::vector<int> deps) {
  if (finalized()) throw InternalError("mk::Plan::add after finalize");
  for (int d : deps)
    if (d < 0 || d >= int(ops_.size())) throw InternalError(fmt::format("mk::Plan: op {} depends on op {}", ops_.size(), d));
  op.done = counter();
  ops_.push_back(op);
  deps_.push_back(std::move(deps));
  return int(ops_.size()) - 1;
}

int tile_rows(int64_t row_bytes, uint32_t stage_cap, int max_rows) {
  if (row_bytes <= 0) return max_rows;
  return int(std::clamp<int64_t>(int64_t(stage_cap) / row_bytes, 1, max_rows));
}

size_t staging_floats(const OpDesc& op) {
  switch (op.type) {
    case kGemv:
    case kRouter:
    case kExpertGu:
    case kExpertDown:
    case kHead:
      return staged_floats(op.m.bits, (op.in_kind == kInConcat ? op.parts : 1) * op.in);
    case kGdn:
      return size_t(2 * op.gdn.dk + op.gdn.dv / op.gdn.nck + 64);
    case kAttnSplit: {
      const int G = op.attn.Hq / op.attn.Hkv;
      return size_t(G * op.attn.hd + 3 * op.attn.hd + G * op.attn.kc + 8 * G + 64);
    }
    case kAttnMerge:
      return size_t(kConsumerWarps * op.attn.hd + 2 * op.attn.nsplit + 64);
    default:
      return 0;
  }
}

void Plan::finalize(int blocks, uint32_t stage_cap) {
  if (finalized()) throw InternalError("mk::Plan::finalize twice");
  if (blocks < 1) throw InternalError("mk::Plan::finalize: no blocks");
  std::vector<std::vector<Task>> per(static_cast<size_t>(blocks));
  int start = 0;
  stage_bytes_ = 0;
  staging_floats_ = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    OpDesc& op = ops_[i];
    if (op.stage_bytes > stage_cap)
      throw InternalError(fmt::format("mk::Plan: op {} ({}, layer {}) streams {} bytes a stage, more than {}", i,
                                      op_name(op.type), op.layer, op.stage_bytes, stage_cap));
    stage_bytes_ = std::max(stage_bytes_, op.stage_bytes);
    staging_floats_ = std::max(staging_floats_, mk::staging_floats(op));
    const int n = op.ntiles, nb = std::min(n, blocks);
    op.ntasks = nb;
    for (int k = 0; k < nb; ++k) {
      const int b = (start + k) % blocks;
      per[size_t(b)].push_back(Task{int32_t(i), int32_t(int64_t(k) * n / nb), int32_t(int64_t(k + 1) * n / nb)});
    }
    start = (start + nb) % blocks;
    int nd = 0;
    while (nd < kMaxDeps && op.dep[nd] >= 0) ++nd;  // raw counter dependencies set by the caller come first
    // an op without tiles is done at once: its dependents wait for what it waited for (already resolved)
    auto push = [&](int32_t c, uint32_t n) {
      for (int k = 0; k < nd; ++k)
        if (op.dep[k] == c) {
          op.dep_n[k] = std::max(op.dep_n[k], n);
          return;
        }
      if (nd == kMaxDeps) throw InternalError(fmt::format("mk::Plan: op {} has more than {} dependencies", i, kMaxDeps));
      op.dep[nd] = c;
      op.dep_n[nd] = n;
      ++nd;
    };
    for (int d : deps_[i]) {
      const OpDesc& dop = ops_[size_t(d)];
      if (dop.ntasks > 0) {
        push(dop.done, uint32_t(dop.ntasks));
      } else {
        for (int k = 0; k < kMaxDeps && dop.dep[k] >= 0; ++k) push(dop.dep[k], dop.dep_n[k]);
      }
    }
  }
  task_begin_.assign(size_t(blocks) + 1, 0);
  tasks_.clear();
  for (int b = 0; b < blocks; ++b) {
    task_begin_[size_t(b)] = int32_t(tasks_.size());
    tasks_.insert(tasks_.end(), per[size_t(b)].begin(), per[size_t(b)].end());
  }
  task_begin_[size_t(blocks)] = int32_t(tasks_.size());
}

std::vector<std::string> Plan::describe() const {
  std::vector<std::string> lines;
  std::vector<int> level(ops_.size(), 0);
  for (size_t i = 0; i < ops_.size(); ++i) {
    int lv = 0;
    std::string ds;
    for (int d : deps_[i]) {
      lv = std::max(lv, level[size_t(d)] + 1);
      ds += fmt::format("{}{}", ds.empty() ? "" : ",", d);
    }
    const OpDesc& op = ops_[i];
    if (op.type == kExpertGu || op.type == kExpertDown) {
      // the routing: one level after the router's top-k (its last task)
      for (int d : deps_[i])
        if (ops_[size_t(d)].type == kRouter) lv = std::max(lv, level[size_t(d)] + 1);
    }
    level[i] = lv;
    lines.push_back(fmt::format("op {:4d} level {:4d}  {:<11} layer {:3d}  tiles {:5d} tasks {:4d}  stage {:6d} B  deps [{}]", i, lv,
                                op_name(op.type), op.layer, op.ntiles, op.ntasks, op.stage_bytes, ds));
  }
  return lines;
}

std::vector<std::string> Plan::trace_report(const std::vector<unsigned long long>& tr) const {
  std::vector<std::string> out;
  if (tr.size() < tasks_.size() * kTraceWords || tasks_.empty()) return out;
  const size_t n = ops_.size();
  const unsigned long long inf = ~0ull;
  std::vector<unsigned long long> begin(n, inf), end(n, 0), start(n, inf);
  std::vector<double> task_work(n, 0), task_wait(n, 0), stage_wait(n, 0), free_wait(n, 0);
  std::vector<int> ntask(n, 0);
  unsigned long long t0 = inf, t1 = 0;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const unsigned long long* w = tr.data() + t * kTraceWords;
    const size_t o = size_t(tasks_[t].op);
    begin[o] = std::min(begin[o], w[kTrDeps]);
    start[o] = std::min(start[o], w[kTrStart]);
    end[o] = std::max(end[o], w[kTrEnd]);
    task_work[o] += double(w[kTrEnd] - w[kTrDeps]);
    task_wait[o] += double(w[kTrDeps] - w[kTrStart]);
    stage_wait[o] += double(w[kTrStageWait]);
    free_wait[o] += double(w[kTrFreeWait]);
    ++ntask[o];
    t0 = std::min(t0, w[kTrStart]);
    t1 = std::max(t1, w[kTrEnd]);
  }
  struct Agg {
    int ops = 0;
    double latency = 0, work = 0, task_work = 0, task_wait = 0, stage_wait = 0, free_wait = 0;
    int tasks = 0;
  };
  std::vector<Agg> by(kNumOpTypes);
  std::vector<double> layer_work;
  for (size_t o = 0; o < n; ++o) {
    if (ntask[o] == 0) continue;
    unsigned long long ready = t0;
    for (int d : deps_[o])
      if (ntask[size_t(d)]) ready = std::max(ready, end[size_t(d)]);
    Agg& a = by[size_t(ops_[o].type)];
    ++a.ops;
    a.latency += begin[o] > ready ? double(begin[o] - ready) : 0.0;
    a.work += double(end[o] - begin[o]);
    a.task_work += task_work[o];
    a.task_wait += task_wait[o];
    a.stage_wait += stage_wait[o];
    a.free_wait += free_wait[o];
    a.tasks += ntask[o];
    const int L = ops_[o].layer;
    if (L >= 0) {
      if (layer_work.size() <= size_t(L)) layer_work.resize(size_t(L) + 1, 0.0);
      layer_work[size_t(L)] += double(end[o] - std::max(begin[o], ready));
    }
  }
  out.push_back(fmt::format("step kernel: {:.1f} us from the first task's start to the last task's end, {} ops, {} tasks",
                            double(t1 - t0) / 1e3, n, tasks_.size()));
  out.push_back("op type      ops  latency us  work us  (per op: latency / work)  per task: compute us  deps wait  stage wait  producer free-stage wait");
  for (int ty = 0; ty < kNumOpTypes; ++ty) {
    const Agg& a = by[size_t(ty)];
    if (!a.ops) continue;
    out.push_back(fmt::format("{:<11} {:4d} {:11.1f} {:8.1f}  ({:6.2f} / {:7.2f})  {:21.2f} {:10.2f} {:11.2f} {:10.2f}", op_name(ty),
                              a.ops, a.latency / 1e3, a.work / 1e3, a.latency / 1e3 / a.ops, a.work / 1e3 / a.ops,
                              a.task_work / 1e3 / a.tasks, a.task_wait / 1e3 / a.tasks, a.stage_wait / 1e3 / a.tasks,
                              a.free_wait / 1e3 / a.tasks));
  }
  std::string lw = "per layer (us, inputs complete to last task done, summed over its ops):";
  for (size_t L = 0; L < layer_work.size(); ++L) lw += fmt::format(" {}", int(layer_work[L] / 1e3 + 0.5));
  out.push_back(lw);
  return out;
}

std::string Plan::trace_csv(const std::vector<unsigned long long>& tr) const {
  if (tr.size() < tasks_.size() * kTraceWords) return "";
  unsigned long long t0 = ~0ull;
  for (size_t t = 0; t < tasks_.size(); ++t) t0 = std::min(t0, tr[t * kTraceWords + kTrStart]);
  std::string out = "block,op,type,layer,tiles,start,deps,mid,end,issue0,issue1,stage_wait,free_wait\n";
  size_t b = 0;
  for (size_t t = 0; t < tasks_.size(); ++t) {
    while (b + 1 < task_begin_.size() && size_t(task_begin_[b + 1]) <= t) ++b;
    const Task& k = tasks_[t];
    const OpDesc& op = ops_[size_t(k.op)];
    const unsigned long long* w = tr.data() + t * kTraceWords;
    auto rel = [&](unsigned long long v) { return v >= t0 && v != 0 ? double(v - t0) : -1.0; };
    out += fmt::format("{},{},{},{},{},{:.0f},{:.0f},{:.0f},{:.0f},{:.0f},{:.0f},{},{}\n", b, k.op, op_name(op.type), op.layer, k.t1 - k.t0,
                       rel(w[kTrStart]), rel(w[kTrDeps]), rel(w[kTrMid]), rel(w[kTrEnd]), rel(w[kTrIssue0]), rel(w[kTrIssue1]),
                       w[kTrStageWait], w[kTrFreeWait]);
  }
  return out;
}

}  // namespace lily::cuda::mk

// Expert-parallel dispatch/combine benchmark: N rank processes on TCP loopback (this binary again,
// with --rank; they meet through a FileKeyValueStore in a temporary directory), the "dslike"
// layer of moe_layer_bench (E = 64, k = 6, D = 512, F = 256, sigmoid + bias, 8 groups) with its
// global batch of --tokens split evenly over the ranks, and the ranks forming one expert group.
//
//   dispatch_bench [--json] [--ranks N] [--tokens T] [--reps R] [--dtype f32|bf16] [--chunks C]
//   (--help: each with its default)
//
// exchange: dispatch + combine of the routed rows with a planned handle against two plain
//   all-to-all-v calls moving the same bytes, measured in the same run; efficiency = plain time /
//   dispatch+combine time, with one chunk and with --chunks (default 2, the layer's default;
//   chunks pipelined, nothing to overlap them with). plan_ms: the layout exchange, once per
//   layer forward.
// link: plain all-to-all of equal blocks of 2 MiB and of 8 MiB to each peer; the line through
//   the two times against the bytes a rank sends to its peers gives the bandwidth (per rank, one
//   direction: what a cluster file's link holds, docs/plan.md) and the latency (its intercept).
// dispatch_wire: one dispatch (one chunk, no combine) with rows in the compute dtype and with FP8
//   on the wire (E4M3 + one f32 scale per 128 elements, quantise and dequantise included): bytes
//   each rank sends (all, and to its peers: its own share is a local copy) and the time.
// layer: one MoE layer forward+backward with overlap (--chunks) and without; compute alone
//   = the same tokens through a one-rank layer holding all E experts (the same expert FLOPs when
//   routing is balanced, no communication); communication alone = the layer's four exchanges
//   with no compute. Overlap pays when step_overlap_ms < compute_alone_ms + comm_alone_ms.
// Every time is the slowest rank's median of --reps runs after a warm-up, each run starting at a
// barrier. Each rank runs max(1, cores / N) threads (MOETRAIN_NUM_THREADS, unless set).
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_flags.h"
#include "engine/backend/device_query.h"
#include "engine/comm/file_kv_store.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/core/rng.h"
#include "engine/core/status.h"
#include "engine/core/thread_pool.h"
#include "engine/moe/expert_parallel.h"
#include "engine/moe/moe_layer.h"
#include "engine/ops/gemm/gemm.h"
#include "engine/ops/permute/permute.h"
#include "engine/ops/router/router.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

struct Flags {
  bool json = false;
  int ranks = 2;
  int64_t tokens = 4096;  // global: every rank routes tokens / ranks
  int reps = 5;
  DType dtype = DType::kF32;
  int chunks = 2;  // the layer's default overlap_chunks
  int rank = -1;   // set in the rank processes
  std::string dir;
};

MoeConfig DsLike() {
  MoeConfig moe;
  moe.num_experts = 64;
  moe.top_k = 6;
  moe.expert_ffn_dim = 256;
  moe.score_function = ScoreFunction::kSigmoid;
  moe.expert_bias = true;
  moe.num_groups = 8;
  moe.group_top_k = 4;
  return moe;
}
constexpr int64_t kHidden = 512;

void Die(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "dispatch_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tensor RandomTensor(DType dtype, std::initializer_list<int64_t> shape, float stddev, int rank,
                    uint32_t stream) {
  Tensor f32 = Tensor::Empty(DType::kF32, shape);
  Rng(/*seed=*/1234, /*step=*/0, static_cast<uint32_t>(rank), stream)
      .FillNormal(f32.data<float>(), f32.numel(), 0.0f, stddev);
  if (dtype == DType::kF32) return f32;
  Tensor t = Tensor::Empty(dtype, shape);
  ConvertF32ToBF16(f32.data<float>(), t.data<BF16>(), t.numel());
  return t;
}

// The slowest rank's median seconds of `reps` runs of fn after one warm-up, each from a barrier.
double MedianSeconds(Communicator& world, int reps, const std::function<absl::Status()>& fn) {
  Die(fn(), "warm-up");
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    Die(world.Barrier(), "barrier");
    const double start = Seconds();
    Die(fn(), "run");
    times.push_back(Seconds() - start);
  }
  std::sort(times.begin(), times.end());
  const int64_t median_ns = static_cast<int64_t>(times[times.size() / 2] * 1e9);
  std::vector<int64_t> all(world.size());
  Die(world.AllGather(&median_ns, all.data(), 1, DType::kI64), "all-gather");
  return *std::max_element(all.begin(), all.end()) * 1e-9;
}

// Chunk by chunk as the layer runs them, with nothing to overlap.
absl::Status Pipelined(const DispatchHandle& h, TensorView rows, TensorView received,
                       TensorView back) {
  std::vector<ExchangeRequest> dispatched(h.num_chunks), combined(h.num_chunks);
  for (int c = 0; c < h.num_chunks; ++c) {
    MOETRAIN_ASSIGN_OR_RETURN(
        dispatched[c],
        StartDispatch({.handle = &h, .rows = rows, .received = received, .chunk = c}));
  }
  for (int c = 0; c < h.num_chunks; ++c) {
    MOETRAIN_RETURN_IF_ERROR(dispatched[c].Wait());
    MOETRAIN_ASSIGN_OR_RETURN(
        combined[c], StartCombine({.handle = &h, .rows = received, .out = back, .chunk = c}));
  }
  for (ExchangeRequest& request : combined) MOETRAIN_RETURN_IF_ERROR(request.Wait());
  return absl::OkStatus();
}

std::vector<int64_t> Times(const std::vector<int64_t>& counts, int64_t factor) {
  std::vector<int64_t> out = counts;
  for (int64_t& v : out) v *= factor;
  return out;
}

nlohmann::json RunRank(const Flags& flags, Communicator& world) {
  const MoeConfig moe = DsLike();
  const int ranks = world.size(), rank = world.rank();
  const int64_t t = flags.tokens / ranks, d = kHidden, e = moe.num_experts, f = moe.expert_ffn_dim;
  const int64_t local = e / ranks;
  const DType dtype = flags.dtype;
  const size_t row_bytes = d * DTypeSize(dtype);

  Die(world.Barrier(), "barrier");
  absl::StatusOr<double> dense_flops =
      ops::MeasureGemmFlops(ExecContext::Cpu(), dtype, 2048, flags.reps);
  Die(dense_flops.status(), "dense GEMM");

  // Weights are the same on every rank (rank 0's streams); tokens differ.
  Tensor router = RandomTensor(DType::kF32, {e, d}, 0.02f, 0, 10);
  Tensor bias = RandomTensor(DType::kF32, {e}, 0.01f, 0, 11);
  Tensor w_gate_up = RandomTensor(dtype, {e, 2 * f, d}, 0.02f, 0, 12);
  Tensor w_down = RandomTensor(dtype, {e, d, f}, 0.02f, 0, 13);
  Tensor x = RandomTensor(dtype, {t, d}, 1.0f, rank, 14);
  Tensor d_out = RandomTensor(dtype, {t, d}, 1.0f, rank, 15);

  // The routing of this rank's tokens, and the rows in send order.
  Tensor x_f32 = RandomTensor(DType::kF32, {t, d}, 1.0f, rank, 14);
  Tensor logits = Tensor::Empty(DType::kF32, {t, e});
  const ExecContext ctx = ExecContext::Cpu();
  ops::RouterOutput routing;
  Die(ops::Gemm(ctx, {.a = x_f32, .b = router, .c = logits, .trans_b = true}), "router");
  Die(ops::RouterForward(ctx, moe, {logits, bias, 0}, &routing), "routing");
  const std::vector<int64_t> tokens_per_expert(routing.tokens_per_expert.data<int64_t>(),
                                               routing.tokens_per_expert.data<int64_t>() + e);
  absl::StatusOr<DispatchHandle> one =
      PlanDispatch({.group = &world, .rows_per_expert = tokens_per_expert});
  Die(one.status(), "plan");
  const double plan_seconds = MedianSeconds(world, flags.reps, [&] {
    return PlanDispatch({.group = &world, .rows_per_expert = tokens_per_expert}).status();
  });
  ops::Permutation permutation;
  const std::vector<int64_t> offsets = ops::PermutedExpertOffsets(moe, t, tokens_per_expert);
  Die(ops::BuildPermutation(ctx, moe,
                            {.topk_experts = routing.topk_experts,
                             .topk_weights = routing.topk_weights,
                             .expert_offsets = offsets},
                            &permutation),
      "permute");
  const int64_t r = one->num_send_rows(), n = one->num_received_rows();
  Tensor rows = Tensor::Empty(dtype, {r, d}), received = Tensor::Empty(dtype, {n, d});
  Tensor back = Tensor::Empty(dtype, {r, d}), plain = Tensor::Empty(dtype, {n, d});
  Die(ops::GatherRows(ctx, x, permutation.row_token, rows), "gather");

  // Exchange: dispatch + combine against plain all-to-all-v of the same bytes.
  const double dc_seconds = MedianSeconds(world, flags.reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(Dispatch({.handle = &*one, .rows = rows, .received = received}));
    return Combine({.handle = &*one, .rows = received, .out = back});
  });
  const double plain_seconds = MedianSeconds(world, flags.reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(world.AllToAllV({.send = rows.view().raw(),
                                              .send_counts = Times(one->send_counts, d),
                                              .recv = plain.view().raw(),
                                              .recv_counts = Times(one->recv_counts, d),
                                              .dtype = dtype}));
    return world.AllToAllV({.send = plain.view().raw(),
                            .send_counts = Times(one->recv_counts, d),
                            .recv = back.view().raw(),
                            .recv_counts = Times(one->send_counts, d),
                            .dtype = dtype});
  });
  // --chunks, as the layer would pipeline them. Only the rows' counts matter here.
  const int chunks = static_cast<int>(std::min<int64_t>(flags.chunks, local));
  absl::StatusOr<DispatchHandle> two =
      PlanDispatch({.group = &world, .rows_per_expert = tokens_per_expert, .num_chunks = chunks});
  Die(two.status(), "plan");
  const double chunked_seconds =
      MedianSeconds(world, flags.reps, [&] { return Pipelined(*two, rows, received, back); });

  // Link: plain all-to-all of equal blocks, small and large, each rank sending `elements` f32 to
  // every peer; the line through the two (time against the bytes a rank sends to its peers) gives
  // the bandwidth (slope) and the latency (intercept, at least 0). What `moetrain plan` takes for
  // the link (scripts/calibrate-plan.sh).
  auto uniform_seconds = [&](int64_t elements) {
    Tensor send = Tensor::Zeros(DType::kF32, {ranks * elements});
    Tensor recv = Tensor::Empty(DType::kF32, {ranks * elements});
    const std::vector<int64_t> counts(ranks, elements);
    return MedianSeconds(world, flags.reps, [&] {
      return world.AllToAllV({.send = send.view().raw(),
                              .send_counts = counts,
                              .recv = recv.view().raw(),
                              .recv_counts = counts,
                              .dtype = DType::kF32});
    });
  };
  const int64_t small_elements = int64_t{1} << 19, large_elements = int64_t{1} << 21;
  const double small_seconds = uniform_seconds(small_elements);
  const double large_seconds = uniform_seconds(large_elements);
  const double link_bandwidth = 4.0 * (ranks - 1) * (large_elements - small_elements) /
                                std::max(large_seconds - small_seconds, 1e-9);
  const double link_latency =
      std::max(0.0, small_seconds - 4.0 * (ranks - 1) * small_elements / link_bandwidth);

  // FP8 on the wire: the same dispatch (one chunk, no combine) with compute-dtype rows and with
  // E4M3 rows + 1×128 scales, quantise and dequantise included in the FP8 time.
  const double dispatch_seconds = MedianSeconds(world, flags.reps, [&] {
    return Dispatch({.handle = &*one, .rows = rows, .received = received});
  });
  const double fp8_dispatch_seconds = MedianSeconds(world, flags.reps, [&] {
    return Dispatch(
        {.handle = &*one, .rows = rows, .received = received, .fp8 = true, .ctx = &ctx});
  });
  const int64_t peer_rows = r - one->send_counts[rank];  // the own share is a local copy
  auto wire = [&](bool fp8, double seconds) {
    const int64_t row = DispatchRowBytes(d, dtype, fp8);
    return nlohmann::json{{"row_bytes", row},
                          {"bytes_sent", r * row},
                          {"bytes_sent_to_peers", peer_rows * row},
                          {"dispatch_ms", seconds * 1e3}};
  };

  // Layer: expert-parallel step with and without overlap, compute alone, communication alone.
  MoeStats stats;
  Tensor out = Tensor::Empty(dtype, {t, d}), d_x = Tensor::Empty(dtype, {t, d});
  auto step = [&](MoeLayer& layer, const MoeWeights& w, const MoeGrads& g) -> absl::Status {
    MoeGrads grads = g;
    MOETRAIN_RETURN_IF_ERROR(layer.Forward(w, x, 0, out, &stats));
    return layer.Backward(w, d_out, d_x, &grads);
  };
  Tensor g_router = Tensor::Zeros(DType::kF32, {e, d});
  Tensor g_gate_up = Tensor::Zeros(DType::kF32, {e, 2 * f, d});
  Tensor g_down = Tensor::Zeros(DType::kF32, {e, d, f});
  const int64_t first = rank * local;
  const MoeWeights local_weights = {router,
                                    bias,
                                    w_gate_up.view().Slice(first, first + local),
                                    w_down.view().Slice(first, first + local),
                                    {},
                                    {}};
  const MoeGrads local_grads = {
      g_router, g_gate_up.view().Slice(0, local), g_down.view().Slice(0, local), {}, {}};
  std::vector<double> step_seconds;
  for (int overlap_chunks : {chunks, 1}) {
    absl::StatusOr<MoeLayer> layer = MoeLayer::Create(
        moe, d, dtype,
        {.expert_group = &world, .count_group = &world, .overlap_chunks = overlap_chunks});
    Die(layer.status(), "layer");
    step_seconds.push_back(
        MedianSeconds(world, flags.reps, [&] { return step(*layer, local_weights, local_grads); }));
  }
  absl::StatusOr<MoeLayer> whole = MoeLayer::Create(moe, d, dtype);
  Die(whole.status(), "layer");
  const MoeWeights all_weights = {router, bias, w_gate_up, w_down, {}, {}};
  const MoeGrads all_grads = {g_router, g_gate_up, g_down, {}, {}};
  const double compute_seconds =
      MedianSeconds(world, flags.reps, [&] { return step(*whole, all_weights, all_grads); });
  Tensor rows_f32 = Tensor::Empty(DType::kF32, {n, d});
  Tensor back_f32 = Tensor::Empty(DType::kF32, {r, d});
  // Forward, then backward: rows go in the compute dtype and come back in f32; plus the plan.
  const double comm_seconds = MedianSeconds(world, flags.reps, [&]() -> absl::Status {
    MOETRAIN_RETURN_IF_ERROR(
        PlanDispatch({.group = &world, .rows_per_expert = tokens_per_expert}).status());
    for (int pass = 0; pass < 2; ++pass) {
      MOETRAIN_RETURN_IF_ERROR(Dispatch({.handle = &*two, .rows = rows, .received = received}));
      MOETRAIN_RETURN_IF_ERROR(Combine({.handle = &*two, .rows = rows_f32, .out = back_f32}));
    }
    return absl::OkStatus();
  });

  const double bytes = static_cast<double>(r + n) * row_bytes;          // this rank's, both ways
  const double expert_flops = 18.0 * flags.tokens * moe.top_k * d * f;  // the whole group's
  const double dense_seconds = expert_flops / ranks / *dense_flops;
  const double overlap_seconds = step_seconds[0], serial_seconds = step_seconds[1];
  auto ms = [](double seconds) { return seconds * 1e3; };
  return {
      {"config",
       {{"name", "dslike"},
        {"tokens", flags.tokens},
        {"tokens_per_rank", t},
        {"hidden", d},
        {"expert_ffn_dim", f},
        {"experts", e},
        {"top_k", moe.top_k},
        {"dtype", std::string(DTypeName(dtype))}}},
      {"exchange",
       {{"rows_sent", r},
        {"rows_received", n},
        {"bytes", bytes},
        {"dispatch_combine_ms", ms(dc_seconds)},
        {"dispatch_combine_gb_per_s", bytes / dc_seconds / 1e9},
        {"plain_all_to_all_v_ms", ms(plain_seconds)},
        {"plain_gb_per_s", bytes / plain_seconds / 1e9},
        {"efficiency", plain_seconds / dc_seconds},
        {"plan_ms", ms(plan_seconds)},
        {"chunked",
         {{"chunks", chunks},
          {"dispatch_combine_ms", ms(chunked_seconds)},
          {"dispatch_combine_gb_per_s", bytes / chunked_seconds / 1e9},
          {"efficiency", plain_seconds / chunked_seconds}}}}},
      {"link",
       {{"small_bytes_per_peer", 4 * small_elements},
        {"small_ms", ms(small_seconds)},
        {"large_bytes_per_peer", 4 * large_elements},
        {"large_ms", ms(large_seconds)},
        {"latency_s", link_latency},
        {"bandwidth_bytes_per_s", link_bandwidth}}},
      {"dispatch_wire",
       {{"rows_sent", r},
        {"compute_dtype", wire(false, dispatch_seconds)},
        {"fp8", wire(true, fp8_dispatch_seconds)},
        {"byte_ratio", static_cast<double>(DispatchRowBytes(d, dtype, true)) /
                           static_cast<double>(DispatchRowBytes(d, dtype, false))},
        {"time_ratio", fp8_dispatch_seconds / dispatch_seconds}}},
      {"layer",
       {{"ep", ranks},
        {"overlap_chunks", chunks},
        {"step_overlap_ms", ms(overlap_seconds)},
        {"step_no_overlap_ms", ms(serial_seconds)},
        {"compute_alone_ms", ms(compute_seconds)},
        {"comm_alone_ms", ms(comm_seconds)},
        {"overlap_below_sum", overlap_seconds < compute_seconds + comm_seconds},
        {"overlap_saving_ms", ms(compute_seconds + comm_seconds - overlap_seconds)},
        {"tokens_per_s", flags.tokens / overlap_seconds},
        {"expert_gemm_gflops", expert_flops / overlap_seconds / 1e9},
        {"layer_efficiency", dense_seconds / overlap_seconds},
        {"max_mean_load_ratio", stats.max_mean_load_ratio}}},
      {"dense_gemm_gflops_per_rank", *dense_flops / 1e9},
  };
}

// One rank: joins the world, runs, and (rank 0) writes the report to <dir>/report.json.
int RankMain(const Flags& flags) {
  absl::StatusOr<std::shared_ptr<FileKeyValueStore>> store =
      FileKeyValueStore::Open(std::filesystem::path(flags.dir) / "kv");
  Die(store.status(), "store");
  GlooOptions options;
  options.group = {.store = *store,
                   .prefix = "bench",
                   .rank = flags.rank,
                   .size = flags.ranks,
                   .timeout = absl::Seconds(600)};
  absl::StatusOr<std::unique_ptr<GlooCommunicator>> world = GlooCommunicator::Create(options);
  Die(world.status(), "join");
  const nlohmann::json report = RunRank(flags, **world);
  if (flags.rank == 0)
    std::ofstream(std::filesystem::path(flags.dir) / "report.json") << report.dump();
  return 0;
}

// Starts the rank processes, waits for them, prints rank 0's report.
int ParentMain(const Flags& flags, char** argv) {
  std::string pattern = (std::filesystem::temp_directory_path() / "dispatch_bench_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::perror("dispatch_bench: mkdtemp");
    return 1;
  }
  const std::filesystem::path dir = pattern;
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1, cores / flags.ranks));
  if (std::getenv("MOETRAIN_NUM_THREADS") == nullptr)
    setenv("MOETRAIN_NUM_THREADS", threads.c_str(), 1);
  if (std::getenv("OMP_NUM_THREADS") == nullptr) setenv("OMP_NUM_THREADS", threads.c_str(), 1);
  std::fprintf(stderr, "dispatch_bench: %d ranks of %s threads, %ld tokens, dslike...\n",
               flags.ranks, std::getenv("OMP_NUM_THREADS"), static_cast<long>(flags.tokens));
  std::vector<pid_t> children;
  for (int rank = 0; rank < flags.ranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> args = {"/proc/self/exe", "--rank", std::to_string(rank), "--dir",
                                       dir.string()};
      for (char** a = argv + 1; *a != nullptr; ++a) args.push_back(*a);
      std::vector<char*> raw;
      for (std::string& a : args) raw.push_back(a.data());
      raw.push_back(nullptr);
      execv("/proc/self/exe", raw.data());
      _exit(127);
    }
    if (pid < 0) {
      std::perror("dispatch_bench: fork");
      return 1;
    }
    children.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  nlohmann::json report;
  if (ok) {
    std::ifstream in(dir / "report.json");
    report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!ok || report.is_discarded()) {
    std::fprintf(stderr, "dispatch_bench: a rank failed\n");
    return 1;
  }
  report["machine"] = {{"ranks", flags.ranks},
                       {"threads_per_rank", std::stoi(std::getenv("OMP_NUM_THREADS"))},
                       {"devices", DescribeDevices(QueryDevices())},
                       {"dense_gemm_gflops_per_rank", report["dense_gemm_gflops_per_rank"]}};
  report.erase("dense_gemm_gflops_per_rank");
  if (flags.json) {
    std::printf("%s\n", report.dump().c_str());
    return 0;
  }
  const nlohmann::json& x = report["exchange"];
  const nlohmann::json& l = report["layer"];
  std::printf(
      "exchange  dispatch+combine %.1f ms (%.2f GB/s), plain %.1f ms: efficiency %.3f; "
      "%d chunks %.1f ms: efficiency %.3f\n",
      x["dispatch_combine_ms"].get<double>(), x["dispatch_combine_gb_per_s"].get<double>(),
      x["plain_all_to_all_v_ms"].get<double>(), x["efficiency"].get<double>(),
      x["chunked"]["chunks"].get<int>(), x["chunked"]["dispatch_combine_ms"].get<double>(),
      x["chunked"]["efficiency"].get<double>());
  const nlohmann::json& w = report["dispatch_wire"];
  std::printf(
      "wire      dispatch %s %ld B/row %.1f ms; fp8 %ld B/row %.1f ms: bytes x%.3f, time x%.3f\n",
      report["config"]["dtype"].get<std::string>().c_str(),
      static_cast<long>(w["compute_dtype"]["row_bytes"].get<int64_t>()),
      w["compute_dtype"]["dispatch_ms"].get<double>(),
      static_cast<long>(w["fp8"]["row_bytes"].get<int64_t>()),
      w["fp8"]["dispatch_ms"].get<double>(), w["byte_ratio"].get<double>(),
      w["time_ratio"].get<double>());
  std::printf(
      "layer     ep=%d step %.1f ms with overlap, %.1f ms without; compute alone %.1f ms + "
      "communication alone %.1f ms\n",
      l["ep"].get<int>(), l["step_overlap_ms"].get<double>(), l["step_no_overlap_ms"].get<double>(),
      l["compute_alone_ms"].get<double>(), l["comm_alone_ms"].get<double>());
  return 0;
}

int Main(int argc, char** argv) {
  Flags flags;
  const int64_t experts = DsLike().num_experts;
  std::vector<int> rank_counts;  // those that divide the experts
  for (int ranks = 2; ranks <= experts; ++ranks) {
    if (experts % ranks == 0) rank_counts.push_back(ranks);
  }
  std::string dtype_name = "f32";
  CLI::App app{"dispatch_bench: expert-parallel dispatch/combine and overlap over rank processes"};
  app.add_flag("--json", flags.json, "print one JSON object instead of a summary");
  app.add_option("--ranks", flags.ranks,
                 "rank processes, one expert group: at least 2, and they divide the " +
                     std::to_string(experts) + " experts")
      ->capture_default_str()
      // AtLeast for its message on a non-number; the set alone labels the help.
      ->check(bench::AtLeast(2).description(""))
      ->check(CLI::IsMember(rank_counts));
  app.add_option("--tokens", flags.tokens,
                 "tokens of the global batch, split evenly over the ranks")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--reps", flags.reps, "timed runs per measurement, after one warm-up")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  app.add_option("--dtype", dtype_name, "compute dtype of the rows and the layer")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--chunks", flags.chunks,
                 "chunks of the pipelined exchange and of the layer's overlap (at most the "
                 "experts of a rank; 2 is the layer's default)")
      ->capture_default_str()
      ->check(bench::AtLeast(1));
  // What ParentMain passes to the rank processes, before the parent's own flags.
  const std::string internal = "Set by dispatch_bench for its rank processes";
  app.add_option("--rank", flags.rank, "this process's rank (default: none, the parent)")
      ->group(internal)
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  app.add_option("--dir", flags.dir, "where the ranks meet and rank 0 writes its report")
      ->group(internal);
  if (const std::optional<int> exit_code = bench::ParseFlags(app, argc, argv)) return *exit_code;
  flags.dtype = dtype_name == "bf16" ? DType::kBF16 : DType::kF32;
  if (flags.tokens < flags.ranks) {
    std::fprintf(stderr, "dispatch_bench: --tokens = %ld must be at least --ranks = %d\n",
                 static_cast<long>(flags.tokens), flags.ranks);
    return 2;
  }
  return flags.rank >= 0 ? RankMain(flags) : ParentMain(flags, argv);
}

}  // namespace
}  // namespace moetrain

int main(int argc, char** argv) { return moetrain::Main(argc, argv); }

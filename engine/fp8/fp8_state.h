// The FP8 state of a model: one slot per (linear layer, group, operand role) holding the scale
// that delayed scaling quantises with, and this step's statistics (amax, saturated count) that
// every recipe records. The MoE layer's routed experts register one group per *global* expert,
// so that under expert parallelism each rank fills only its own experts' slots, and a max over
// the ranks (zero is the identity) gives each expert's amax over its data-parallel replicas.
//
// Delayed scaling (Transformer Engine's DelayedScaling, GPU-NOTES.md §2): each slot keeps an amax
// history h of amax_history_len steps, h[0] being this step's. After each optimizer step
// (EndStep) the step's amaxes are max-reduced over the ranks, then per slot:
//   amax  = max(h) ("max") or h[0] ("most_recent");
//   scale = (fp8_max · 2^-margin) / amax when amax is finite and > 0, else the old scale;
//           FLT_MAX if that overflows;
//   h     = rolled: new[0] = 0, new[i] = h[i+1] (1 ≤ i ≤ L−2), new[L−1] = h[0].
// Scales start at 1 and the histories at zero. The histories and scales go into checkpoints
// (SaveState / LoadState), so a resumed job quantises with the bits it would have used.
//
// Scales, step amaxes and saturated counts live on the context's device, where the quantise ops
// read and update them; EndStep copies them to the host once per step.
#ifndef MOETRAIN_ENGINE_FP8_FP8_STATE_H_
#define MOETRAIN_ENGINE_FP8_FP8_STATE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend/exec_context.h"
#include "engine/comm/communicator.h"
#include "engine/core/tensor.h"
#include "engine/fp8/fp8_recipe.h"

namespace moetrain {

class Fp8State {
 public:
  Fp8State(const Fp8RecipeConfig& config, const ExecContext& ctx);

  const Fp8RecipeConfig& config() const { return config_; }
  const ExecContext& context() const { return ctx_; }

  // Registers a linear layer, e.g. "model.layers.2.self_attn.q_proj" or
  // "model.layers.2.mlp.experts.gate_up_proj" (groups = the number of global experts; else 1).
  // Returns its id; -1 after Allocate or for groups < 1.
  int Register(std::string name, int64_t groups);
  // Allocates every slot on the device: scales 1, amaxes and counts 0, histories 0.
  absl::Status Allocate();

  // The device views (1) of one slot: scale f32, amax f32, saturated i64.
  struct Slot {
    TensorView scale;
    TensorView amax;
    TensorView saturated;
  };
  // Empty views for a linear or group that was not registered, or before Allocate.
  Slot slot(int linear, int64_t group, Fp8Role role) const;

  // Off: the quantisations record no statistics (evaluation must not feed the amax histories).
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }

  // After each optimizer step, on every rank of `group` together (null = this rank alone): the
  // step's amaxes (max, NaN wins) and saturated counts (sum) reduced over the group, kept as the
  // last step's statistics; delayed histories rolled and scales recomputed (above); the step's
  // amaxes and counts zeroed.
  absl::Status EndStep(Communicator* group);

  // The last EndStep's statistics, one entry per (linear, group), in registration order.
  struct SlotStats {
    std::array<float, kNumFp8Roles> amax{};         // the step's amax of each operand
    std::array<float, kNumFp8Roles> scale{};        // the scale it was quantised with (kTensor
                                                    // scalings; 0 for block scalings)
    std::array<int64_t, kNumFp8Roles> saturated{};  // values clamped to ±fp8_max
  };
  struct LinearInfo {
    std::string name;
    int64_t groups = 1;
  };
  const std::vector<LinearInfo>& linears() const { return linears_; }
  // (linears()[i].groups) entries for linear i.
  const std::vector<SlotStats>& last_stats(int linear) const { return last_stats_[linear]; }

  // The recipe state to checkpoint: (slots, 1 + amax_history_len) f32 on the host, each row the
  // scale then the history; an empty tensor when the recipe keeps none (not delayed).
  absl::StatusOr<Tensor> SaveState() const;
  // Restores SaveState's tensor (host, f32); DataLoss naming both shapes when it does not fit
  // this model and recipe.
  absl::Status LoadState(TensorView saved);

 private:
  int64_t SlotIndex(int linear, int64_t group, Fp8Role role) const;

  Fp8RecipeConfig config_;
  ExecContext ctx_;
  std::vector<LinearInfo> linears_;
  std::vector<int64_t> first_slot_;  // per linear: its first slot index
  int64_t num_slots_ = 0;
  bool recording_ = true;
  Tensor scales_;                 // (slots) f32, device
  Tensor amaxes_;                 // (slots) f32, device
  Tensor saturated_;              // (slots) i64, device
  std::vector<float> histories_;  // (slots, amax_history_len) host; delayed only
  std::vector<std::vector<SlotStats>> last_stats_;
  bool allocated_ = false;
};

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_FP8_FP8_STATE_H_

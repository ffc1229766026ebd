// The memory one rank of a training job will hold (host memory, or a device's: see
// PlaceTrainingMemory), estimated from its config before anything is allocated, so that a model too
// large for the machine is refused with both figures named instead of ending the process
// (std::bad_alloc, or the kernel's OOM killer).
//
// The estimate mirrors what Trainer::Create and the first step allocate
// (engine/model/parameters.cc, block.cc, moe_layer.cc, transformer.cc, optimizer.cc): every
// workspace buffer stays allocated once used, so activations are the sum over all blocks of their
// forward and backward buffers (with train.recompute = FULL, one block's: they share them).
// Routed-expert rows are counted as if the tokens spread evenly over the expert-parallel ranks.
// tests/engine/train/memory_estimate_test.cc checks it against the measured peak of a real run.
#ifndef MOETRAIN_ENGINE_TRAIN_MEMORY_ESTIMATE_H_
#define MOETRAIN_ENGINE_TRAIN_MEMORY_ESTIMATE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/train/trainer.h"

namespace moetrain {

// Bytes, as doubles: a hostile spec's sizes overflow int64.
struct MemoryEstimate {
  double parameters = 0;  // the f32 masters, plus their compute-dtype copies (bf16)
  // f32, one per parameter; with parallel.grad_reduce_dtype = BF16 over several ranks, and a bf16
  // staging copy for the reduction. With parallel.sharding = GRADIENTS on the CPU, this rank's
  // share (as the optimizer's below) and the buckets backward has written and not yet had summed
  // (four of the largest, roughly, with their staging copies; at most the unsharded bytes): the
  // most held at once, during backward (a device zeroes what it lets go of and keeps the whole
  // buffer); and with several micro-batches an accumulator as large as the share.
  double gradients = 0;
  // AdamW's two moments (train.optimizer.moment_dtype) per trainable parameter this rank updates:
  // all of its own, or sharded (OPTIMIZER, GRADIENTS) 1/W of the dense ones and 1/dp of its
  // experts'.
  double optimizer = 0;
  // What forward keeps for backward, backward's scratch, the LM head's chunk, and with an FP8
  // recipe the quantised operands of the largest linear layer. Without the FP8 operands, what
  // Transformer::activation_bytes() counts after a step.
  double activations = 0;
  // With an FP8 recipe, its state (engine/fp8/fp8_state.h), S = Fp8SlotCount slots: a scale, an
  // amax and a saturated count per slot on the device (16 B); with the delayed recipe, the amax
  // histories on the host (4·amax_history_len B a slot). And the larger of two passing host
  // buffers: each step's end copies the slots' numbers to the host and, over several ranks,
  // all-gathers them (16 B a slot, and 16 B a slot per rank more); a checkpoint copies the delayed
  // state out (4·(1 + amax_history_len) B a slot, rank 0 only, counted on every rank).
  double fp8_state = 0;
  // The part of fp8_state in host memory whatever the device: all of it but the 16 B a slot.
  double fp8_state_host = 0;

  // While a checkpoint gathers the moments (sharded or bf16 ones: trainer_sharding.cc): an f32
  // scratch of one gradient bucket on the rank's device (counted as the larger of
  // grad_bucket_bytes and the largest stage, the embedding or LM head) and, on a writing rank,
  // the whole f32 moments in host memory (8 B a parameter).
  double checkpoint_gather = 0;
  // The part of checkpoint_gather in host memory whatever the device: the moments.
  double checkpoint_gather_host = 0;

  double total() const {
    return parameters + gradients + optimizer + activations + fp8_state + checkpoint_gather;
  }
  // What lives in a device's memory when the rank trains on one: all but the host parts.
  double on_device() const { return total() - fp8_state_host - checkpoint_gather_host; }
  // "1.23 GiB (params 0.20, grads 0.20, optimizer 0.40, activations 0.43 GiB)", and
  // ", fp8 state 0.01" and ", checkpoint gather 0.20" before the unit when there are any.
  std::string DebugString() const;
};

// One rank of `config` (a valid config; its micro-batch counted over all ranks).
MemoryEstimate EstimateTrainingMemory(const TrainerConfig& config);

// The parameters one rank of `model` holds, as engine/model/parameters.cc lays them out (its
// padding aside): embeddings, LM head, every block's attention, norms, dense FFN or router, expert
// bias and shared experts, the MTP modules' own, and the routed experts split over
// `expert_parallel` ranks.
double ParameterCount(const ModelConfig& model, int expert_parallel = 1);

// The tensor bytes of one checkpoint step of `config`, all ranks' files together: every parameter
// once in f32, AdamW's two f32 moments of every trainable one, and with the delayed FP8 recipe its
// (slots, 1 + amax_history_len) f32 state (rank 0's optimizer file).
double EstimateCheckpointBytes(const TrainerConfig& config);

// "512 B", "3.0 KiB", "1.23 GiB", "4.5 TiB".
std::string FormatBytes(double bytes);

// "8GiB", "512MiB", "1.5G", "4096" (bytes): binary units (KiB/K/Ki, MiB/M/Mi, GiB/G/Gi, TiB/T/Ti,
// optionally followed by B). InvalidArgument naming `flag` and the text otherwise, or when the
// size is not positive.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view flag);

// The memory this process may use: MemTotal of /proc/meminfo, or the cgroup v2 limit
// (/sys/fs/cgroup/memory.max) when that is lower. Unavailable when neither can be read.
absl::StatusOr<int64_t> MachineMemoryBytes();

// OK when the estimate fits in `limit_bytes`; else ResourceExhausted naming both figures. The
// limit's name (`limit_name`, e.g. "--memory-limit") tells a person what to change.
absl::Status CheckMemoryEstimate(const MemoryEstimate& estimate, int64_t limit_bytes,
                                 std::string_view limit_name);

// Where one rank's estimated memory lives. On the CPU all of it is host memory. On a device
// (config.device) all of it is device memory, since parameters, grads, moments and activations
// live there, and the host holds only, while a checkpoint is written, a copy of the f32 masters
// and of the moments (the optimizer state; when the checkpoint gathers them,
// checkpoint_gather_host instead); and the FP8 state's host part.
struct MemoryPlacement {
  double host = 0;
  double device = 0;  // 0 on the CPU
};
MemoryPlacement PlaceTrainingMemory(const TrainerConfig& config, const MemoryEstimate& estimate);

// CheckMemoryEstimate for the rank of `config`, each part against its own memory: on the CPU the
// whole estimate against `host_limit_bytes`; on a device, the device part against the device's
// memory (DeviceMemoryStats.total_bytes: the device is opened, and its error returned when it
// cannot be) and the host part against `host_limit_bytes`. A host limit ≤ 0 is not checked.
absl::Status CheckTrainingMemory(const TrainerConfig& config, const MemoryEstimate& estimate,
                                 int64_t host_limit_bytes, std::string_view host_limit_name);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_TRAIN_MEMORY_ESTIMATE_H_

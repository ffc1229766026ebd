// How `moetrain plan` is calibrated on this machine, and how well it then predicts it.
//
// A calibration file (bench/calibration/cpu.json; scripts/calibrate-plan.sh writes a fresh one)
// holds the JSON of one run of each benchmark, all on one machine in one sitting:
//   {"machine": {...}, "calibrate_bench": {...}, "train_bench": {...},
//    "dispatch_bench": {"2": {...}, "4": {...}}}       (keys: rank counts)
// calibrate_bench gives the op classes' efficiencies and the memory bandwidth; dispatch_bench's
// "link" the loopback link at its rank count. From those alone the plan predicts:
//   - train_bench's tokens/s: its config (and its recompute, "NONE" when the file has none) on
//     one rank, the FLOP/s peak being the dense GEMM that train_bench measured in its own run
//     (speeds compare only as ratios within a run);
//   - dispatch_bench's exchange (dispatch + combine, one chunk): two all-to-alls of the routed
//     rows that leave each rank.
// The predictions must come within 15 % (train_bench) and 25 % (dispatch_bench) of the measured
// figures; tests/engine/plan/calibration_test.cc checks the stored file.
#ifndef MOETRAIN_ENGINE_PLAN_CALIBRATION_H_
#define MOETRAIN_ENGINE_PLAN_CALIBRATION_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/plan/cluster.h"

namespace moetrain {

inline constexpr double kTrainBenchTolerance = 0.15;
inline constexpr double kDispatchBenchTolerance = 0.25;

// One benchmark figure the plan predicts.
struct CalibrationCheck {
  std::string name;  // "train_bench tokens/s", "dispatch_bench exchange ms, 2 ranks"
  double predicted = 0;
  double measured = 0;
  double tolerance = 0;  // of |predicted / measured − 1|
  double error() const { return predicted / measured - 1; }
  bool ok() const { return error() <= tolerance && error() >= -tolerance; }
};

// The calibration file's cluster for `ranks` Gloo ranks on this machine: calibrate_bench's peak,
// bandwidth and efficiencies, and dispatch_bench's link at that rank count (the 2-rank one for
// 1). InvalidArgument naming the missing or bad field.
absl::StatusOr<ClusterSpec> CalibratedCluster(std::string_view calibration_json, int ranks);

// The plan's prediction of each stored figure: train_bench's tokens/s, then dispatch_bench's
// exchange at each stored rank count. InvalidArgument naming the missing or bad field.
absl::StatusOr<std::vector<CalibrationCheck>> CheckCalibration(std::string_view calibration_json);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_PLAN_CALIBRATION_H_

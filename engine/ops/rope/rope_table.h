// RoPE's cos/sin tables on the host, shared by both backends: cos and sin of p·θ^(−2i/Dh)
// (rope_math.h) for p < S, i < Dh/2, computed in double and rounded to f32. The CPU reads them
// directly; the CUDA backend copies them to the device, so both rotate by the same f32 values.
#ifndef MOETRAIN_ENGINE_OPS_ROPE_ROPE_TABLE_H_
#define MOETRAIN_ENGINE_OPS_ROPE_ROPE_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace moetrain::ops {

struct RopeTable {
  int64_t seq_len;
  int64_t head_dim;
  float theta;
  std::vector<float> cos;  // (S, Dh/2) row-major
  std::vector<float> sin;  // (S, Dh/2) row-major
};

// The table of (S, Dh, θ), from a process-wide cache of the last few (a model asks for the same
// one in every layer). Safe from any thread; the table stays valid while the pointer is held.
std::shared_ptr<const RopeTable> CachedRopeTable(int64_t seq_len, int64_t head_dim, float theta);

}  // namespace moetrain::ops

#endif  // MOETRAIN_ENGINE_OPS_ROPE_ROPE_TABLE_H_

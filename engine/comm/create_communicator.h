// One place that picks the communicator for a rank: what the worker and `moetrain run` call.
#ifndef MOETRAIN_ENGINE_COMM_CREATE_COMMUNICATOR_H_
#define MOETRAIN_ENGINE_COMM_CREATE_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/comm/communicator.h"
#include "engine/comm/group_options.h"

namespace moetrain {

enum class CommBackend {
  kAuto,   // nccl when buffers are on a GPU, else local for a world of one, else gloo
  kLocal,  // size 1 only, host buffers
  kGloo,   // host buffers
  kNccl,   // device buffers
};

struct CommOptions {
  CommBackend backend = CommBackend::kAuto;
  bool cuda = false;                      // the collectives' buffers are device memory
  GroupOptions group;                     // store may stay null for a world of one (local or nccl)
  std::string listen_host = "127.0.0.1";  // gloo: see GlooOptions
  int cuda_device = -1;                   // nccl: see NcclOptions
  void* cuda_stream = nullptr;            // nccl: see NcclOptions
  void* order_after_stream = nullptr;     // nccl: see NcclOptions
};

// InvalidArgument for a backend that cannot serve the request (local with size > 1, gloo with
// device buffers, nccl without cuda); otherwise what that backend's factory returns (nccl:
// Unimplemented in a build without NCCL, FailedPrecondition where there is no usable GPU).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options);

}  // namespace moetrain

#endif  // MOETRAIN_ENGINE_COMM_CREATE_COMMUNICATOR_H_

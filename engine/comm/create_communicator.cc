#include "engine/comm/create_communicator.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "engine/comm/gloo_communicator.h"
#include "engine/comm/local_communicator.h"
#include "engine/comm/nccl_communicator.h"
#include "engine/core/status.h"

namespace moetrain {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(const CommOptions& options) {
  CommBackend backend = options.backend;
  if (backend == CommBackend::kAuto) {
    backend = options.cuda              ? CommBackend::kNccl
              : options.group.size == 1 ? CommBackend::kLocal
                                        : CommBackend::kGloo;
  }
  switch (backend) {
    case CommBackend::kLocal:
      if (options.group.size != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the local communicator serves a world of one, not size = ", options.group.size));
      }
      if (options.cuda) {
        return absl::InvalidArgumentError("the local communicator copies host buffers, not device");
      }
      return std::make_unique<LocalCommunicator>();
    case CommBackend::kGloo: {
      if (options.cuda) {
        return absl::InvalidArgumentError("the gloo communicator takes host buffers, not device");
      }
      MOETRAIN_ASSIGN_OR_RETURN(
          std::unique_ptr<GlooCommunicator> gloo,
          GlooCommunicator::Create({.group = options.group, .listen_host = options.listen_host}));
      return gloo;
    }
    case CommBackend::kNccl:
      if (!options.cuda) {
        return absl::InvalidArgumentError(
            "the nccl communicator serves GPU training (cuda = true), not a CPU one");
      }
      return CreateNcclCommunicator({.group = options.group,
                                     .cuda_device = options.cuda_device,
                                     .cuda_stream = options.cuda_stream,
                                     .order_after_stream = options.order_after_stream});
    case CommBackend::kAuto:
      break;
  }
  return absl::InternalError("CreateCommunicator: unhandled backend");
}

}  // namespace moetrain

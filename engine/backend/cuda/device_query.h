// The CUDA side of QueryDevices (engine/backend/device_query.h), compiled by nvcc into
// moetrain_backend.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_DEVICE_QUERY_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_DEVICE_QUERY_H_

#include "engine/backend/device_query.h"

namespace moetrain::cuda {

DeviceReport QueryCudaDevices();

}  // namespace moetrain::cuda

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_DEVICE_QUERY_H_

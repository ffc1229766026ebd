// cuBLASLt, loaded with dlopen when the first CudaContext is made instead of linked: the library's
// static initialisers take ~0.4 s of every process that links it, and most processes of this
// project (the CLI, a worker's agent, the tests) never run a CUDA op. Call sites use the library's
// own names through Lt():
//
//   MOETRAIN_CUBLAS_RETURN_IF_ERROR(op, Lt().cublasLtMatmulDescCreate(&desc, compute, scale));
//
// The library is looked up as libcublasLt.so.<CUBLAS_VER_MAJOR> on the loader's path
// (LD_LIBRARY_PATH first, so a machine's own toolkit or NVIDIA's wheels win), then in the toolkit
// this build was configured with. Included by .cu files only.
#ifndef MOETRAIN_ENGINE_BACKEND_CUDA_CUBLASLT_API_H_
#define MOETRAIN_ENGINE_BACKEND_CUDA_CUBLASLT_API_H_

#include <cublasLt.h>

#include "absl/status/status.h"

// Every cuBLASLt function the engine calls; one line here declares its pointer and loads it.
#define MOETRAIN_CUBLASLT_FUNCTIONS(X)    \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)

namespace moetrain::cuda {

struct CublasLtApi {
#define MOETRAIN_CUBLASLT_POINTER(name) decltype(&::name) name = nullptr;
  MOETRAIN_CUBLASLT_FUNCTIONS(MOETRAIN_CUBLASLT_POINTER)
#undef MOETRAIN_CUBLASLT_POINTER
};

// Loads the library and every function above, once per process; later calls return the first
// call's result. Unavailable, naming the paths tried and dlerror()'s words, when the library or
// one of its functions cannot be found.
absl::Status LoadCublasLt();

// The loaded functions. Only after LoadCublasLt() succeeded, which every CudaContext's creation
// has done; before, the process aborts naming the mistake.
const CublasLtApi& Lt();

}  // namespace moetrain::cuda

#endif  // MOETRAIN_ENGINE_BACKEND_CUDA_CUBLASLT_API_H_

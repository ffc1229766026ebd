#include "engine/backend/cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

// The toolkit's library folder (engine/CMakeLists.txt), tried after the loader's own search.
#ifndef MOETRAIN_CUDA_TOOLKIT_LIBRARY_DIR
#define MOETRAIN_CUDA_TOOLKIT_LIBRARY_DIR "/usr/local/cuda/lib64"
#endif

namespace moetrain::cuda {
namespace {

absl::StatusOr<CublasLtApi> Load() {
  CublasLtApi api;
  const std::string soname = absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR);
  const std::string in_toolkit = absl::StrCat(MOETRAIN_CUDA_TOOLKIT_LIBRARY_DIR, "/", soname);
  std::string errors;
  void* library = nullptr;
  for (const std::string& candidate : {soname, in_toolkit}) {
    // RTLD_LOCAL: the symbols stay out of the global namespace; a library loaded later that
    // brings its own cuBLASLt (PyTorch's, in a test harness) is not redirected to this one.
    library = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    const char* error = dlerror();
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", error != nullptr ? error : candidate);
  }
  if (library == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cuBLASLt could not be loaded (", soname, " on the library path, then ",
                     in_toolkit, "): ", errors,
                     ". Put the CUDA toolkit's or NVIDIA's cuBLAS wheel's lib folder on "
                     "LD_LIBRARY_PATH"));
  }
  // The library stays loaded for the life of the process (CudaContexts are never destroyed).
#define MOETRAIN_CUBLASLT_RESOLVE(name)                                                    \
  api.name = reinterpret_cast<decltype(&::name)>(dlsym(library, #name));                   \
  if (api.name == nullptr) {                                                               \
    return absl::UnavailableError(absl::StrCat(                                            \
        "cuBLASLt (", soname, ") has no function " #name "; this build needs cuBLAS ",     \
        CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, " or a later ", CUBLAS_VER_MAJOR, ".x")); \
  }
  MOETRAIN_CUBLASLT_FUNCTIONS(MOETRAIN_CUBLASLT_RESOLVE)
#undef MOETRAIN_CUBLASLT_RESOLVE
  return api;
}

const absl::StatusOr<CublasLtApi>& Once() {
  static const absl::StatusOr<CublasLtApi>* const loaded = new absl::StatusOr<CublasLtApi>(Load());
  return *loaded;
}

}  // namespace

absl::Status LoadCublasLt() { return Once().status(); }

const CublasLtApi& Lt() {
  const absl::StatusOr<CublasLtApi>& loaded = Once();
  if (!loaded.ok()) {
    // A programming error (a cuBLASLt call without a CudaContext): no caller can recover.
    std::fprintf(stderr, "moetrain: cuBLASLt called, but it could not be loaded: %s\n",
                 loaded.status().ToString().c_str());
    std::abort();
  }
  return *loaded;
}

}  // namespace moetrain::cuda

// cuBLASLt loaded with dlopen (cublaslt_api.h): the library is found, every function the engine
// calls resolves, and host-only calls work through the loaded pointers. Needs no GPU, only the
// library (the toolkit is installed wherever the CUDA backend builds); in builds with it.
#include "gtest/gtest.h"

#if MOETRAIN_TEST_CUDA
#include "engine/backend/cuda/cublaslt_api.h"
#include "tests/testing/testing.h"

namespace moetrain::cuda {
namespace {

TEST(CublasLtApiTest, LoadsOnceAndResolvesEveryFunction) {
  ASSERT_OK(LoadCublasLt());
  ASSERT_OK(LoadCublasLt());
#define MOETRAIN_EXPECT_RESOLVED(name) EXPECT_NE(Lt().name, nullptr) << #name;
  MOETRAIN_CUBLASLT_FUNCTIONS(MOETRAIN_EXPECT_RESOLVED)
#undef MOETRAIN_EXPECT_RESOLVED
}

TEST(CublasLtApiTest, HostOnlyCallsGoThroughTheLoadedLibrary) {
  ASSERT_OK(LoadCublasLt());
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(Lt().cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 129, 3, 129),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_NE(layout, nullptr);
  EXPECT_EQ(Lt().cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(Lt().cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  EXPECT_EQ(Lt().cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                sizeof(transpose)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(Lt().cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
}  // namespace moetrain::cuda
#endif  // MOETRAIN_TEST_CUDA

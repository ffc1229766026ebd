// The Status a failed CUDA or cuBLAS call becomes: the op, the call and the error's name, with the
// code that tells the caller what to do. Pure formatting: runs without a GPU (the CUDA runtime
// names its errors without a device), in builds with the CUDA backend.
#include <string>

#include "gtest/gtest.h"

#if MOETRAIN_TEST_CUDA
#include "engine/backend/cuda/cuda_check.h"

namespace moetrain::cuda {
namespace {

absl::Status FailingCall(cudaError_t error) {
  MOETRAIN_CUDA_RETURN_IF_ERROR("router", [error] { return error; }());
  return absl::OkStatus();
}

TEST(CudaCheckTest, ACudaErrorNamesTheOpTheCallAndTheError) {
  const absl::Status status = CudaStatus(cudaErrorIllegalAddress, "permute", "cudaMemcpyAsync(x)");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(std::string(status.message()),
            "permute: cudaMemcpyAsync(x) failed: cudaErrorIllegalAddress (an illegal memory access "
            "was encountered)");
}

TEST(CudaCheckTest, CodesSayWhatTheCallerShouldDo) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "op", "call").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "op", "call").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "op", "call").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "op", "call").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_NOT_SUPPORTED, "op", "call").code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_INVALID_VALUE, "op", "call").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_EXECUTION_FAILED, "op", "call").code(),
            absl::StatusCode::kInternal);
}

TEST(CudaCheckTest, ACublasErrorNamesItsStatus) {
  const absl::Status status = CublasStatus(CUBLAS_STATUS_NOT_SUPPORTED, "gemm", "cublasLtMatmul()");
  EXPECT_EQ(std::string(status.message()),
            "gemm: cublasLtMatmul() failed: CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_NE(std::string(CublasStatus(static_cast<cublasStatus_t>(999), "gemm", "f()").message())
                .find("cublasStatus_t 999"),
            std::string::npos);
}

TEST(CudaCheckTest, TheMacroReturnsTheStatusOfAFailedCallAndPassesSuccess) {
  EXPECT_TRUE(FailingCall(cudaSuccess).ok());
  const absl::Status status = FailingCall(cudaErrorInvalidValue);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(status.message())
                .find("router: [error] { return error; }() failed: "
                      "cudaErrorInvalidValue"),
            std::string::npos)
      << status;
}

}  // namespace
}  // namespace moetrain::cuda

#else
TEST(CudaCheckTest, BuiltWithoutCuda) { GTEST_SKIP() << "this build has no CUDA backend"; }
#endif

// One unary call through grpc::GenericStub, waited for: `bytes` sent unparsed as the request of
// `method` (e.g. "/moetrain.v1.JobService/GetJob"), for tests of what a server does with bytes
// no generated stub would send.
#ifndef MOETRAIN_TESTS_SERVER_GRPC_GENERIC_UNARY_CALL_H_
#define MOETRAIN_TESTS_SERVER_GRPC_GENERIC_UNARY_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>

namespace moetrain::testutil {

inline grpc::Status GenericUnaryCall(grpc::GenericStub& stub, grpc::ClientContext* context,
                                     const std::string& method, const std::string& bytes) {
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable done_cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    done_cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  done_cv.wait(lock, [&] { return done; });
  return status;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_SERVER_GRPC_GENERIC_UNARY_CALL_H_

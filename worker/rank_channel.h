// One end of the socket between a worker and a rank process it started: protobuf messages
// (worker/rank_channel.proto), each framed by its length as 4 bytes, little-endian.
//
//   MessageChannel channel(fd);                 // owns fd
//   MOETRAIN_RETURN_IF_ERROR(channel.Send(message));
//   rank::FromRank received;
//   MOETRAIN_RETURN_IF_ERROR(channel.Receive(&received));   // OutOfRange once the peer closed
//
// Send is thread-safe (whole frames, one at a time); Receive has one caller at a time. A frame
// longer than kMaxRankFrameBytes, or one that does not parse, is DataLoss: the peer is broken,
// and the caller gives up on it.
#ifndef MOETRAIN_WORKER_RANK_CHANNEL_H_
#define MOETRAIN_WORKER_RANK_CHANNEL_H_

#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"

namespace moetrain {

// Far above any report (a step report of DeepSeek-V3's 58 MoE layers × 256 experts with FP8
// statistics is about 2 MiB), far below what a rank could make the worker buffer by mistake.
inline constexpr int64_t kMaxRankFrameBytes = int64_t{64} << 20;

class MessageChannel {
 public:
  explicit MessageChannel(int fd) : fd_(fd) {}
  ~MessageChannel();  // closes the socket
  MessageChannel(const MessageChannel&) = delete;
  MessageChannel& operator=(const MessageChannel&) = delete;

  // Unavailable when the peer is gone.
  absl::Status Send(const google::protobuf::MessageLite& message);
  // OutOfRange when the peer closed its end between two messages; DataLoss for a frame cut short,
  // too long or not parsing; Unavailable for another error of the socket.
  absl::Status Receive(google::protobuf::MessageLite* message);
  // Wakes a Receive blocked in another thread (it returns OutOfRange) and fails later Sends.
  void Shutdown();

 private:
  const int fd_;
  std::mutex send_mu_;
};

}  // namespace moetrain

#endif  // MOETRAIN_WORKER_RANK_CHANNEL_H_

#include "worker/rank_channel.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace moetrain {
namespace {

// Reads exactly `size` bytes: the number read (less only at the end of the stream), or -errno.
int64_t ReadFully(int fd, char* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, data + done, size - done);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    done += static_cast<size_t>(n);
  }
  return static_cast<int64_t>(done);
}

}  // namespace

MessageChannel::~MessageChannel() { close(fd_); }

absl::Status MessageChannel::Send(const google::protobuf::MessageLite& message) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(kMaxRankFrameBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a message of ", size, " bytes exceeds the ",
                                                   kMaxRankFrameBytes, " a frame may carry"));
  }
  std::string frame(4 + size, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((size >> (8 * i)) & 0xFF);
  if (!message.SerializeToArray(frame.data() + 4, static_cast<int>(size))) {
    return absl::InternalError("a message did not serialize");
  }
  std::lock_guard<std::mutex> lock(send_mu_);
  size_t done = 0;
  while (done < frame.size()) {
    // MSG_NOSIGNAL: a peer that is gone is an error here, not a SIGPIPE for the whole process.
    const ssize_t n = send(fd_, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("the channel is closed: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status MessageChannel::Receive(google::protobuf::MessageLite* message) {
  unsigned char header[4];
  const int64_t got = ReadFully(fd_, reinterpret_cast<char*>(header), sizeof(header));
  if (got < 0) {
    return absl::UnavailableError(absl::StrCat("reading the channel: ", std::strerror(-got)));
  }
  if (got == 0) return absl::OutOfRangeError("the peer closed the channel");
  if (got < 4) return absl::DataLossError("the channel ended inside a frame's length");
  const uint32_t size =
      header[0] | (header[1] << 8) | (header[2] << 16) | (static_cast<uint32_t>(header[3]) << 24);
  if (size > kMaxRankFrameBytes) {
    return absl::DataLossError(absl::StrCat("a frame of ", size, " bytes exceeds the ",
                                            kMaxRankFrameBytes, " a frame may carry"));
  }
  std::string body(size, '\0');
  const int64_t read = ReadFully(fd_, body.data(), size);
  if (read < 0) {
    return absl::UnavailableError(absl::StrCat("reading the channel: ", std::strerror(-read)));
  }
  if (read < size) {
    return absl::DataLossError(
        absl::StrCat("the channel ended after ", read, " of a frame's ", size, " bytes"));
  }
  if (!message->ParseFromString(body)) {
    return absl::DataLossError(
        absl::StrCat("a frame of ", size, " bytes does not parse as ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

void MessageChannel::Shutdown() { shutdown(fd_, SHUT_RDWR); }

}  // namespace moetrain

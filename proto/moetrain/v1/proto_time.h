// absl::Time and absl::Duration to and from google.protobuf.Timestamp and Duration.
#ifndef MOETRAIN_PROTO_MOETRAIN_V1_PROTO_TIME_H_
#define MOETRAIN_PROTO_MOETRAIN_V1_PROTO_TIME_H_

#include <google/protobuf/duration.pb.h>
#include <google/protobuf/timestamp.pb.h>

#include <cstdint>

#include "absl/time/time.h"

namespace moetrain {

inline void ToProtoTimestamp(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t micros = absl::ToUnixMicros(time);
  int64_t seconds = micros / 1000000;
  int64_t remainder = micros % 1000000;
  if (remainder < 0) {  // Timestamp nanos are never negative
    --seconds;
    remainder += 1000000;
  }
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(static_cast<int32_t>(remainder * 1000));
}

inline absl::Time FromProtoTimestamp(const google::protobuf::Timestamp& timestamp) {
  return absl::FromUnixSeconds(timestamp.seconds()) + absl::Nanoseconds(timestamp.nanos());
}

inline void ToProtoDuration(absl::Duration duration, google::protobuf::Duration* proto) {
  const int64_t nanos = absl::ToInt64Nanoseconds(duration);
  proto->set_seconds(nanos / 1000000000);
  proto->set_nanos(static_cast<int32_t>(nanos % 1000000000));
}

inline absl::Duration FromProtoDuration(const google::protobuf::Duration& proto) {
  return absl::Seconds(proto.seconds()) + absl::Nanoseconds(proto.nanos());
}

}  // namespace moetrain

#endif  // MOETRAIN_PROTO_MOETRAIN_V1_PROTO_TIME_H_

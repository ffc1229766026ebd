// RequestParser against requests fed to it whole (no sockets): what it keeps, the caps it adds to
// Beast's, and the HttpRequest a handler gets from the target.
#include "server/http/request_parser.h"

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moetrain::server {
namespace {

namespace http = boost::beast::http;

// Feeds `request` to `parser` as a reader would: what is not consumed is offered again with the
// next byte; returns the first error other than need_more (none when the request is whole).
boost::beast::error_code Feed(RequestParser& parser, const std::string& request) {
  std::string pending;
  for (char c : request) {
    pending.push_back(c);
    boost::beast::error_code error;
    const size_t used = parser.put(boost::asio::buffer(pending), error);
    pending.erase(0, used);
    if (error == http::error::need_more) continue;
    if (error || parser.is_done()) return error;
  }
  return http::error::need_more;
}

std::string WithFields(int fields) {
  std::string request = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < fields; ++i) absl::StrAppend(&request, "X-", i, ": v\r\n");
  return request + "\r\n";
}

TEST(RequestParserTest, KeepsTheMethodTargetAndFirstAuthorization) {
  RequestParser parser(HttpServerOptions{});
  const std::string request =
      "DELETE /api/v1/jobs/j1?x=1 HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer first\r\n"
      "authorization: Bearer second\r\nContent-Length: 5\r\n\r\nhello";
  EXPECT_FALSE(Feed(parser, request));
  EXPECT_TRUE(parser.is_done());
  EXPECT_EQ(parser.method(), "DELETE");
  EXPECT_EQ(parser.target(), "/api/v1/jobs/j1?x=1");
  EXPECT_EQ(parser.authorization(), "Bearer first");
  EXPECT_FALSE(parser.transfer_encoding());
}

TEST(RequestParserTest, CapsTheHeaderFields) {
  HttpServerOptions options;
  options.max_header_count = 3;
  RequestParser exactly(options);
  EXPECT_FALSE(Feed(exactly, WithFields(3)));
  RequestParser over(options);
  EXPECT_EQ(Feed(over, WithFields(4)), http::error::header_limit);
}

// A request of exactly `bytes` bytes: a target of `target_bytes`, and one field filling the rest.
std::string OfBytes(int target_bytes, int bytes) {
  std::string request = absl::StrCat("GET /", std::string(target_bytes - 1, 't'), " HTTP/1.1\r\n");
  const std::string field = "X-Fill: ";
  const int fill = bytes - static_cast<int>(request.size() + field.size()) - 4;
  return absl::StrCat(request, field, std::string(fill, 'f'), "\r\n\r\n");
}

TEST(RequestParserTest, CapsTheHeaderBytesAndTheBody) {
  HttpServerOptions options;
  options.max_header_bytes = 256;
  options.max_request_body_bytes = 10;
  // The request line and the fields together: each is under the cap, which Beast checks alone.
  RequestParser exactly(options);
  EXPECT_FALSE(Feed(exactly, OfBytes(120, 256)));
  RequestParser over(options);
  EXPECT_EQ(Feed(over, OfBytes(120, 257)), http::error::header_limit);
  // A Content-Length over the cap is an error as soon as the header ends, for a GET too.
  RequestParser long_body(options);
  EXPECT_EQ(Feed(long_body, "GET / HTTP/1.1\r\nContent-Length: 11\r\n\r\n"),
            http::error::body_limit);
  RequestParser chunked(options);
  EXPECT_FALSE(Feed(chunked, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"));
  EXPECT_TRUE(chunked.transfer_encoding());
}

TEST(RequestParserTest, DecodesThePathAndTheQuery) {
  const HttpRequest request =
      ToHttpRequest("GET", "/a%20b+c?x=1%202&y=a+b&x=again&flag&=v&bad=%zz%4", "Bearer t");
  EXPECT_EQ(request.method, "GET");
  EXPECT_EQ(request.path, "/a b+c");
  EXPECT_EQ(request.authorization, "Bearer t");
  const std::map<std::string, std::string> expected = {
      {"x", "1 2"}, {"y", "a b"}, {"flag", ""}, {"", "v"}, {"bad", "%zz%4"}};
  EXPECT_EQ(request.query, expected);
  EXPECT_EQ(ToHttpRequest("GET", "/plain", "").query.size(), 0u);
}

}  // namespace
}  // namespace moetrain::server

// How HttpServer (server/http/http_server.h) reads a request: Boost.Beast's parser, keeping only
// what the server uses under the limits of HttpServerOptions, and the HttpRequest a handler sees.
//
//   RequestParser parser(options);   // header_limit, body_limit and the field cap set
//   http::async_read(stream, buffer, parser, ...);   // a broken limit is the read's error
//   HttpRequest request = ToHttpRequest(parser.method(), parser.target(), parser.authorization());
#ifndef MOETRAIN_SERVER_HTTP_REQUEST_PARSER_H_
#define MOETRAIN_SERVER_HTTP_REQUEST_PARSER_H_

#include <boost/beast/http/basic_parser.hpp>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "server/http/http_server.h"

namespace moetrain::server {

// Keeps the method, the target and the Authorization header, and discards the body as it
// arrives, so that a request costs the connection's read buffer however large it says it is.
// Beast bounds the body (body_limit, set to max_request_body_bytes and checked against a
// Content-Length before any of the body is read) and the raw bytes of the request line and of the
// fields (header_limit, set to max_header_bytes, which Beast applies to each of the two). This adds
// the caps on the two together, max_header_bytes, and on the number of fields, max_header_count;
// passing either is reported as http::error::header_limit too. The bytes are counted as a request
// is usually written, "METHOD target HTTP/1.1\r\n", "Name: value\r\n" for each field and the
// final "\r\n", so that optional whitespace around a value is not counted.
class RequestParser : public boost::beast::http::basic_parser<true> {
 public:
  explicit RequestParser(const HttpServerOptions& options);

  std::string& method() { return method_; }
  const std::string& target() const { return target_; }
  // The first Authorization header, as a handler of a repeated one would see it; empty if none.
  std::string& authorization() { return authorization_; }
  // Whether the request has a Transfer-Encoding (chunked or another).
  bool transfer_encoding() const { return has_transfer_encoding_; }

 private:
  using error_code = boost::beast::error_code;
  using string_view = boost::beast::string_view;

  void on_request_impl(boost::beast::http::verb, string_view method, string_view target, int,
                       error_code&) override;
  void on_response_impl(int, string_view, int, error_code&) override {}
  void on_field_impl(boost::beast::http::field name, string_view name_string, string_view value,
                     error_code& error) override;
  void on_header_impl(error_code&) override {}
  void on_body_init_impl(const boost::optional<std::uint64_t>&, error_code&) override {}
  size_t on_body_impl(string_view body, error_code&) override { return body.size(); }
  void on_chunk_header_impl(std::uint64_t, string_view, error_code&) override {}
  size_t on_chunk_body_impl(std::uint64_t, string_view body, error_code&) override {
    return body.size();
  }
  void on_finish_impl(error_code&) override {}
  // Adds a line to the header's bytes; an error once they pass the cap.
  void CountHeaderBytes(size_t bytes, error_code& error);

  const int64_t max_header_bytes_;
  const int max_fields_;
  int64_t header_bytes_ = 2;  // the empty line that ends the header
  int fields_ = 0;
  std::string method_;
  std::string target_;
  std::string authorization_;
  bool has_authorization_ = false;
  bool has_transfer_encoding_ = false;
};

// The request a handler sees: the path and the query's values percent-decoded ('+' is a space in
// the query), the first value of a repeated query key.
HttpRequest ToHttpRequest(std::string method, absl::string_view target, std::string authorization);

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_REQUEST_PARSER_H_

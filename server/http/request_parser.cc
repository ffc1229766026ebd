#include "server/http/request_parser.h"

#include <boost/beast/http/error.hpp>
#include <utility>

#include "absl/strings/str_split.h"

namespace moetrain::server {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded (and '+' as a space in a query); a '%' not followed by two hex digits is kept.
std::string PercentDecode(absl::string_view text, bool plus_is_space) {
  std::string decoded;
  decoded.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && HexDigit(text[i + 1]) >= 0 &&
        HexDigit(text[i + 2]) >= 0) {
      decoded.push_back(static_cast<char>(HexDigit(text[i + 1]) * 16 + HexDigit(text[i + 2])));
      i += 2;
    } else {
      decoded.push_back(plus_is_space && text[i] == '+' ? ' ' : text[i]);
    }
  }
  return decoded;
}

}  // namespace

RequestParser::RequestParser(const HttpServerOptions& options)
    : max_header_bytes_(options.max_header_bytes), max_fields_(options.max_header_count) {
  header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
  body_limit(static_cast<std::uint64_t>(options.max_request_body_bytes));
}

void RequestParser::CountHeaderBytes(size_t bytes, error_code& error) {
  header_bytes_ += static_cast<int64_t>(bytes);
  if (header_bytes_ > max_header_bytes_) error = boost::beast::http::error::header_limit;
}

void RequestParser::on_request_impl(boost::beast::http::verb, string_view method,
                                    string_view target, int, error_code& error) {
  // The two spaces, "HTTP/1.1" and the line's end.
  CountHeaderBytes(method.size() + target.size() + 12, error);
  method_.assign(method.data(), method.size());
  target_.assign(target.data(), target.size());
}

void RequestParser::on_field_impl(boost::beast::http::field name, string_view name_string,
                                  string_view value, error_code& error) {
  // ": " and the line's end.
  CountHeaderBytes(name_string.size() + value.size() + 4, error);
  if (++fields_ > max_fields_) error = boost::beast::http::error::header_limit;
  if (error) return;
  if (name == boost::beast::http::field::transfer_encoding) has_transfer_encoding_ = true;
  if (name == boost::beast::http::field::authorization && !has_authorization_) {
    authorization_.assign(value.data(), value.size());
    has_authorization_ = true;
  }
}

HttpRequest ToHttpRequest(std::string method, absl::string_view target, std::string authorization) {
  HttpRequest request;
  request.method = std::move(method);
  const size_t question = target.find('?');
  request.path = PercentDecode(target.substr(0, question), /*plus_is_space=*/false);
  if (question != absl::string_view::npos) {
    for (absl::string_view pair : absl::StrSplit(target.substr(question + 1), '&')) {
      if (pair.empty()) continue;
      const size_t equals = pair.find('=');
      request.query.emplace(PercentDecode(pair.substr(0, equals), /*plus_is_space=*/true),
                            equals == absl::string_view::npos
                                ? std::string()
                                : PercentDecode(pair.substr(equals + 1), /*plus_is_space=*/true));
    }
  }
  request.authorization = std::move(authorization);
  return request;
}

}  // namespace moetrain::server

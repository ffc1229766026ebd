#include "server/http/dashboard_page.h"

#include "absl/strings/str_cat.h"

namespace moetrain::server {
namespace {

// Inline script and style only, API calls to this origin only: a page that tried to load a font
// or a script from elsewhere would fail here as it would on an offline cluster.
constexpr char kContentSecurityPolicy[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'";

// The attribute of dashboard.html's <html> element that tells its script whether to ask for the
// token before the first API call.
constexpr char kNoAuthMarker[] = "<html lang=\"en\" data-auth=\"none\">";
constexpr char kBearerAuthMarker[] = "<html lang=\"en\" data-auth=\"bearer\">";

std::string PageFor(bool token_required) {
  std::string html(DashboardHtml());
  if (!token_required) return html;
  const size_t at = html.find(kNoAuthMarker);
  // The page still asks after the first 401 if the marker were ever lost in an edit.
  if (at != std::string::npos) {
    html.replace(at, sizeof(kNoAuthMarker) - 1, kBearerAuthMarker);
  }
  return html;
}

}  // namespace

DashboardPage::DashboardPage(bool token_required) : html_(PageFor(token_required)) {}

std::optional<std::string> DashboardPage::Route(absl::string_view path) const {
  if (path == "/") return std::string("/");
  return std::nullopt;
}

HttpResponse DashboardPage::Handle(const HttpRequest& request) {
  HttpResponse response;
  if (request.method != "GET" && request.method != "HEAD") {
    response.code = 405;
    response.body = absl::StrCat("method ", request.method, " is not allowed on /\n");
    response.headers.emplace_back("Allow", "GET, HEAD");
    return response;
  }
  response.content_type = "text/html; charset=utf-8";
  response.body = html_;
  response.headers.emplace_back("Content-Security-Policy", kContentSecurityPolicy);
  response.headers.emplace_back("X-Content-Type-Options", "nosniff");
  response.headers.emplace_back("Cache-Control", "no-cache");
  return response;
}

}  // namespace moetrain::server

// The dashboard page at `GET /`: one self-contained HTML document (inline CSS and JavaScript,
// system fonts, no external URL) that draws the jobs, a job's curves and expert-load heatmap, and
// the workers from the JSON API (json_api.h) on the same port. The page itself needs no token;
// it asks for one when the API answers 401 and keeps it in the tab's sessionStorage.
//
// The document is server/http/dashboard.html, embedded at build time (embed_file.cmake), so it
// stays an editable file and the binaries need nothing beside them.
#ifndef MOETRAIN_SERVER_HTTP_DASHBOARD_PAGE_H_
#define MOETRAIN_SERVER_HTTP_DASHBOARD_PAGE_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "server/http/http_server.h"

namespace moetrain::server {

// The embedded server/http/dashboard.html.
absl::string_view DashboardHtml();

class DashboardPage : public HttpHandler {
 public:
  // `token_required`: the API needs a bearer token, so the page asks for one before its first
  // call (it still asks after any 401).
  explicit DashboardPage(bool token_required = false);

  // "/" only.
  std::optional<std::string> Route(absl::string_view path) const override;
  // 200 text/html for GET and HEAD, with a Content-Security-Policy that lets the page reach
  // nothing but its own origin; 405 otherwise.
  HttpResponse Handle(const HttpRequest& request) override;

 private:
  const std::string html_;
};

}  // namespace moetrain::server

#endif  // MOETRAIN_SERVER_HTTP_DASHBOARD_PAGE_H_

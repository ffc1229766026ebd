// The dashboard page: served at / as one self-contained HTML document that loads nothing from
// anywhere else (an offline cluster has no CDN), and told whether the API needs a token.
#include "server/http/dashboard_page.h"

#include <httplib.h>

#include <memory>
#include <regex>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/readiness.h"
#include "server/http/http_server.h"
#include "server/http/metrics.h"

namespace moetrain::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

HttpRequest Request(const std::string& method) {
  HttpRequest request;
  request.method = method;
  request.path = "/";
  return request;
}

TEST(DashboardPageTest, IsServedAtTheRootAsHtml) {
  MetricsRegistry registry;
  Readiness readiness;
  DashboardPage page;
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.handlers = {&page};
  options.registry = &registry;
  options.readiness = &readiness;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Start().ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(5);
  httplib::Result result = client.Get("/");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(result->body, std::string(DashboardHtml()));
  EXPECT_THAT(result->get_header_value("Content-Security-Policy"), HasSubstr("default-src 'none'"));
  EXPECT_THAT(result->get_header_value("Content-Security-Policy"), HasSubstr("connect-src 'self'"));
  // Other paths stay the server's: a typo is a 404, not the page.
  result = client.Get("/index.htm");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
  (*server)->Stop();
}

TEST(DashboardPageTest, LoadsNothingFromElsewhere) {
  const std::string html(DashboardHtml());
  ASSERT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  ASSERT_THAT(html, HasSubstr("</html>"));
  // No absolute URL at all, and no protocol-relative or absolute source of a resource.
  EXPECT_THAT(html, Not(HasSubstr("http://")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, Not(HasSubstr("url(")));
  const std::regex resource(R"re((src|href|action)\s*=\s*["']?\s*(//|[a-z]+:))re",
                            std::regex::icase);
  std::smatch match;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), resource);
       it != std::sregex_iterator(); ++it) {
    // The one scheme allowed: the empty favicon, so the browser asks for no /favicon.ico.
    EXPECT_EQ(it->str(), "href=\"data:") << "an external resource in the page: " << it->str();
  }
  // Every script and style is inline.
  EXPECT_FALSE(std::regex_search(html, std::regex(R"(<script[^>]*\bsrc\s*=)", std::regex::icase)));
  EXPECT_FALSE(std::regex_search(html, std::regex(R"(<link[^>]*stylesheet)", std::regex::icase)));
}

TEST(DashboardPageTest, TellsThePageWhetherTheApiNeedsAToken) {
  const HttpResponse open = DashboardPage(false).Handle(Request("GET"));
  EXPECT_EQ(open.code, 200);
  EXPECT_THAT(open.body, HasSubstr("data-auth=\"none\""));
  const HttpResponse guarded = DashboardPage(true).Handle(Request("GET"));
  EXPECT_EQ(guarded.code, 200);
  EXPECT_THAT(guarded.body, HasSubstr("data-auth=\"bearer\""));
  EXPECT_THAT(guarded.body, Not(HasSubstr("data-auth=\"none\"")));
  // The page carries no secret: only whether one is needed.
  EXPECT_EQ(guarded.body.size(),
            open.body.size() + std::string("bearer").size() - std::string("none").size());
}

TEST(DashboardPageTest, OnlyReads) {
  const HttpResponse posted = DashboardPage().Handle(Request("POST"));
  EXPECT_EQ(posted.code, 405);
  bool allow = false;
  for (const auto& [name, value] : posted.headers) allow |= name == "Allow" && value == "GET, HEAD";
  EXPECT_TRUE(allow);
  EXPECT_EQ(DashboardPage().Route("/"), "/");
  EXPECT_EQ(DashboardPage().Route("/api/v1/jobs"), std::nullopt);
}

}  // namespace
}  // namespace moetrain::server

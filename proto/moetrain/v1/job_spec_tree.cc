// Job-spec text to the document tree of job_spec_tree.h: YAML through yaml-cpp (anchors and
// aliases refused), JSON through an nlohmann SAX handler; both with locations where known.
#include "moetrain/v1/job_spec_tree.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "moetrain/v1/job_spec_internal.h"

namespace moetrain::job_spec_internal {
namespace {

// Deeper than any spec can legitimately be; stops runaway recursion on hostile input.
constexpr int kMaxDepth = 64;

std::string At(const Location& location) {
  if (location.line <= 0) return "";
  return absl::StrCat(" (line ", location.line, ", column ", location.column, ")");
}

// --- YAML -> Node ----------------------------------------------------------------------------

Location YamlLocation(const YAML::Mark& mark) {
  if (mark.is_null()) return {};
  return {mark.line + 1, mark.column + 1};
}

absl::StatusOr<Node> FromYaml(const YAML::Node& yaml, int depth) {
  Node node;
  node.location = YamlLocation(yaml.Mark());
  if (depth > kMaxDepth)
    return Error(absl::StrCat("nested deeper than ", kMaxDepth), node.location);
  switch (yaml.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      node.kind = Node::Kind::kNull;
      return node;
    case YAML::NodeType::Scalar:
      node.kind = Node::Kind::kScalar;
      node.text = yaml.Scalar();
      return node;
    case YAML::NodeType::Sequence:
      node.kind = Node::Kind::kSequence;
      for (const YAML::Node& item : yaml) {
        absl::StatusOr<Node> child = FromYaml(item, depth + 1);
        if (!child.ok()) return child.status();
        node.children.push_back(*std::move(child));
      }
      return node;
    case YAML::NodeType::Map:
      node.kind = Node::Kind::kMap;
      for (const auto& entry : yaml) {
        if (!entry.first.IsScalar()) {
          return Error("a mapping key must be a plain name", YamlLocation(entry.first.Mark()));
        }
        absl::StatusOr<Node> child = FromYaml(entry.second, depth + 1);
        if (!child.ok()) return child.status();
        node.keys.push_back(entry.first.Scalar());
        node.key_locations.push_back(YamlLocation(entry.first.Mark()));
        node.children.push_back(*std::move(child));
      }
      return node;
  }
  return node;
}

// Finds the first anchor or alias of a YAML text without building anything. yaml-cpp shares an
// aliased node, so loading stays linear, but every walk of the loaded tree visits each alias in
// full: nine levels of nine aliases are 9^9 values from 500 bytes. A job spec has no use for
// them, so they are refused.
class AnchorFinder : public YAML::EventHandler {
 public:
  // The first anchor ("&name") or alias, with its location; empty when there is none.
  const std::string& found() const { return found_; }
  // Documents started so far.
  int documents() const { return documents_; }

  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    Found(absl::StrCat("&", Shown(name)), mark);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t /*anchor*/) override {
    Found("an alias", mark);
  }
  void OnDocumentStart(const YAML::Mark&) override { ++documents_; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  void Found(const std::string& what, const YAML::Mark& mark) {
    if (found_.empty()) found_ = absl::StrCat(what, At(YamlLocation(mark)));
  }

  std::string found_;
  int documents_ = 0;
};

// --- JSON -> Node ----------------------------------------------------------------------------

// nlohmann SAX handler: builds the tree directly, so duplicate keys survive to be reported and
// numbers keep their source text.
class JsonTreeBuilder {
 public:
  using Json = nlohmann::json;

  bool null() { return Add(Node{}); }
  bool boolean(bool value) { return Add(Scalar(value ? "true" : "false")); }
  bool number_integer(Json::number_integer_t value) { return Add(Scalar(absl::StrCat(value))); }
  bool number_unsigned(Json::number_unsigned_t value) { return Add(Scalar(absl::StrCat(value))); }
  bool number_float(Json::number_float_t /*value*/, const Json::string_t& raw) {
    return Add(Scalar(raw));
  }
  bool string(Json::string_t& value) { return Add(Scalar(value)); }
  bool binary(Json::binary_t& /*value*/) {
    error_ = "binary values are not supported";
    return false;
  }
  bool start_object(std::size_t /*elements*/) { return Open(Node::Kind::kMap); }
  bool key(Json::string_t& key) {
    open_.back().keys.push_back(key);
    open_.back().key_locations.push_back({});
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t /*elements*/) { return Open(Node::Kind::kSequence); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ...".
    absl::string_view what = e.what();
    if (size_t bracket = what.find("] "); absl::StartsWith(what, "[") && bracket != what.npos) {
      what.remove_prefix(bracket + 2);
    }
    // The message ends with the token it stopped at, which can be the rest of the file.
    constexpr absl::string_view kLastRead = "; last read: ";
    if (size_t last = what.find(kLastRead); last != what.npos) {
      error_ = absl::StrCat("JSON syntax error: ", what.substr(0, last), kLastRead,
                            Shown(what.substr(last + kLastRead.size())));
    } else {
      error_ = absl::StrCat("JSON syntax error: ", Shown(what));
    }
    return false;
  }

  const std::string& error() const { return error_; }
  Node TakeRoot() { return std::move(root_); }

 private:
  static Node Scalar(std::string text) {
    Node node;
    node.kind = Node::Kind::kScalar;
    node.text = std::move(text);
    return node;
  }
  bool Open(Node::Kind kind) {
    if (open_.size() >= kMaxDepth) {
      error_ = absl::StrCat("nested deeper than ", kMaxDepth);
      return false;
    }
    Node node;
    node.kind = kind;
    open_.push_back(std::move(node));
    return true;
  }
  bool Close() {
    Node node = std::move(open_.back());
    open_.pop_back();
    return Add(std::move(node));
  }
  bool Add(Node node) {
    if (open_.empty()) {
      root_ = std::move(node);
    } else {
      open_.back().children.push_back(std::move(node));
    }
    return true;
  }

  std::vector<Node> open_;  // containers being filled, innermost last
  Node root_;
  std::string error_;
};

}  // namespace

absl::Status Error(absl::string_view message, const Location& location) {
  return absl::InvalidArgumentError(absl::StrCat(message, At(location)));
}

absl::StatusOr<Node> ParseYamlTree(absl::string_view text) {
  try {
    std::istringstream stream{std::string(text)};
    YAML::Parser parser(stream);
    AnchorFinder finder;
    // Two documents are enough to refuse: yaml-cpp 0.7 never stops producing empty documents
    // from some texts (a lone ","), so reading them all would not end.
    while (finder.found().empty() && finder.documents() < 2 && parser.HandleNextDocument(finder)) {
    }
    if (!finder.found().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "YAML anchors and aliases are not accepted in a job spec: ", finder.found()));
    }
    if (finder.documents() == 0) return Node{};  // an empty file: every field unset
    if (finder.documents() > 1) {
      return absl::InvalidArgumentError("expected one YAML document, got more ('---' or '...')");
    }
    return FromYaml(YAML::Load(std::string(text)), 0);
  } catch (const YAML::Exception& e) {
    return Error(absl::StrCat("YAML syntax error: ", e.msg), YamlLocation(e.mark));
  }
}

absl::StatusOr<Node> ParseJsonTree(absl::string_view text) {
  JsonTreeBuilder builder;
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &builder);
  if (!ok || !builder.error().empty()) {
    return absl::InvalidArgumentError(builder.error().empty() ? "invalid JSON" : builder.error());
  }
  return builder.TakeRoot();
}

}  // namespace moetrain::job_spec_internal

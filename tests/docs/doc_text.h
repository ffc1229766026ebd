// A markdown doc as the docs tests read it: its text, the code in it (inline spans and fenced
// lines), and the anchors of its headings. Header-only and test-only.
#ifndef MOETRAIN_TESTS_DOCS_DOC_TEXT_H_
#define MOETRAIN_TESTS_DOCS_DOC_TEXT_H_

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moetrain::testutil {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A piece of a doc that reads as code: an inline `span`, or one line of a fenced block (lines
// continued with a backslash joined).
struct Code {
  std::string where;  // "docs/service.md:31"
  std::string text;
};

struct Doc {
  std::string name;  // "README.md", "docs/engine.md"
  std::string text;
  std::vector<Code> code;

  int LineOf(size_t offset) const {
    return 1 + static_cast<int>(std::count(text.begin(), text.begin() + offset, '\n'));
  }
  std::string Where(size_t offset) const { return absl::StrCat(name, ":", LineOf(offset)); }
};

inline bool IsFence(const std::string& line) {
  const size_t first = line.find_first_not_of(' ');
  return first != std::string::npos && line.compare(first, 3, "```") == 0;
}

// `name` (relative to `root`) read, with its code.
inline Doc LoadDoc(const std::filesystem::path& root, const std::string& name) {
  Doc doc{name, ReadFile(root / name), {}};
  bool fenced = false;
  std::string continued;  // a fenced line that ended with a backslash, and those after it
  size_t continued_at = 0;
  size_t span_at = std::string::npos;  // where an open inline span began
  size_t offset = 0;
  for (const absl::string_view line_view : absl::StrSplit(doc.text, '\n')) {
    const std::string line(line_view);
    const size_t start = offset;
    offset += line.size() + 1;
    if (IsFence(line)) {
      fenced = !fenced;
      span_at = std::string::npos;
      continue;
    }
    if (fenced) {
      if (continued.empty()) continued_at = start;
      if (!line.empty() && line.back() == '\\') {
        continued += line.substr(0, line.size() - 1) + " ";
        continue;
      }
      doc.code.push_back({doc.Where(continued_at), continued + line});
      continued.clear();
      continue;
    }
    // Inline spans, which may wrap onto the next line but end with their paragraph.
    if (line.find_first_not_of(' ') == std::string::npos) span_at = std::string::npos;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] != '`') continue;
      if (span_at == std::string::npos) {
        span_at = start + i + 1;
        continue;
      }
      std::string span = doc.text.substr(span_at, start + i - span_at);
      std::replace(span.begin(), span.end(), '\n', ' ');
      doc.code.push_back({doc.Where(span_at), span});
      span_at = std::string::npos;
    }
  }
  return doc;
}

// The anchors GitHub gives the headings of `doc` ("## 1. Build the images" → "1-build-the-images",
// "### `train.fp8`" → "trainfp8"): lower case, spaces to hyphens, other punctuation dropped. A
// repeated heading's "-1" suffix is not made.
inline std::set<std::string> HeadingAnchors(const Doc& doc) {
  std::set<std::string> anchors;
  bool fenced = false;
  std::istringstream lines(doc.text);
  for (std::string line; std::getline(lines, line);) {
    if (IsFence(line)) fenced = !fenced;
    if (fenced || line.rfind("#", 0) != 0) continue;
    const size_t title = line.find_first_not_of('#');
    if (title == std::string::npos || line[title] != ' ') continue;
    std::string anchor;
    for (const char c : line.substr(title + 1)) {
      const auto byte = static_cast<unsigned char>(c);
      if (std::isalnum(byte) || c == '-' || c == '_' || byte >= 0x80) {
        anchor += static_cast<char>(std::tolower(byte));
      } else if (c == ' ') {
        anchor += '-';
      }
    }
    anchors.insert(anchor);
  }
  return anchors;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_DOCS_DOC_TEXT_H_

// A job spec that is a YAML "billion laughs", for the tests of the parser's bounds and of the
// CLI that reads spec files.
#ifndef MOETRAIN_TESTS_PROTO_ALIAS_BOMB_YAML_H_
#define MOETRAIN_TESTS_PROTO_ALIAS_BOMB_YAML_H_

#include <string>

#include "absl/strings/str_cat.h"

namespace moetrain::testutil {

// Nine levels of nine aliases of the level below: the last one expands to 9^9 scalars from about
// 500 bytes of text. The first anchor, &l0, is at line 2, column 7.
inline std::string AliasBombYaml() {
  std::string yaml = "name: bomb\nlol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int level = 1; level <= 8; ++level) {
    const std::string below = absl::StrCat("*l", level - 1);
    absl::StrAppend(&yaml, "lol", level, ": &l", level, " [", below);
    for (int i = 1; i < 9; ++i) absl::StrAppend(&yaml, ", ", below);
    absl::StrAppend(&yaml, "]\n");
  }
  return yaml;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_PROTO_ALIAS_BOMB_YAML_H_

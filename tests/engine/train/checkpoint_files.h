// Looking at and damaging checkpoint files on disk, for the tests of what a damaged step
// directory does to writing, pruning and resuming.
#ifndef MOETRAIN_TESTS_ENGINE_TRAIN_CHECKPOINT_FILES_H_
#define MOETRAIN_TESTS_ENGINE_TRAIN_CHECKPOINT_FILES_H_

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <system_error>

#include "gtest/gtest.h"

namespace moetrain::testutil {

// The names in `dir`; none when it cannot be read.
inline std::set<std::string> Entries(const std::filesystem::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const std::filesystem::directory_entry& entry :
       std::filesystem::directory_iterator(dir, ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// XORs one byte in the middle of `path`: the size stays, the sha256 does not.
inline void FlipMiddleByte(const std::filesystem::path& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(0, std::ios::end);
  const std::streamoff middle = f.tellg() / 2;
  f.seekg(middle);
  char byte = 0;
  f.read(&byte, 1);
  byte ^= 0x5a;
  f.seekp(middle);
  f.write(&byte, 1);
  ASSERT_TRUE(f.good()) << path;
}

}  // namespace moetrain::testutil

#endif  // MOETRAIN_TESTS_ENGINE_TRAIN_CHECKPOINT_FILES_H_

#include "engine/comm/file_kv_store.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "comm_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

using ::testing::HasSubstr;
using testutil::TempDir;

TEST(FileKeyValueStoreTest, SetThenGetReturnsTheValueByteForByte) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path() / "new" / "nested");
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string binary("\0\x01\xff value with a NUL\n", 21);
  ASSERT_OK((*store)->Set("job/attempt-1/0", binary));
  auto value = (*store)->Get("job/attempt-1/0", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, binary);
  ASSERT_OK((*store)->Set("empty", ""));
  EXPECT_EQ((*store)->Get("empty", absl::ZeroDuration()).value_or("missing"), "");
}

TEST(FileKeyValueStoreTest, SetOverwrites) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  ASSERT_OK((*store)->Set("k", "first"));
  ASSERT_OK((*store)->Set("k", "second"));
  EXPECT_EQ((*store)->Get("k", absl::ZeroDuration()).value_or(""), "second");
}

// Keys that would name the same file, or a file outside the directory, if taken literally.
TEST(FileKeyValueStoreTest, AwkwardKeysStayDistinctAndInside) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path() / "kv");
  ASSERT_TRUE(store.ok());
  const std::string keys[] = {"a/b", "a%2Fb", "a_b", ".", "..", "../escape", "", "%", "A/B"};
  for (const std::string& key : keys) ASSERT_OK((*store)->Set(key, "value of " + key));
  for (const std::string& key : keys) {
    EXPECT_EQ((*store)->Get(key, absl::ZeroDuration()).value_or("missing"), "value of " + key)
        << "key '" << key << "'";
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "escape"));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() / "kv")) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp", 0), 0u) << "temporary file left";
    ++files;
  }
  EXPECT_EQ(files, std::size(keys));
}

TEST(FileKeyValueStoreTest, GetWaitsForALaterSet) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE((*store)->Set("late", "here").ok());
  });
  auto value = (*store)->Get("late", absl::Seconds(20));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "here");
}

TEST(FileKeyValueStoreTest, GetTimesOutNamingTheKey) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  auto value = (*store)->Get("world/3", absl::Milliseconds(50));
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("'world/3'"));
}

TEST(FileKeyValueStoreTest, TooLongKeyIsInvalid) {
  TempDir dir;
  auto store = FileKeyValueStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Set(std::string(300, 'k'), "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileKeyValueStoreTest, OpenFailsOnAFile) {
  TempDir dir;
  std::ofstream(dir.path() / "file").put('x');
  EXPECT_EQ(FileKeyValueStore::Open(dir.path() / "file").status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moetrain

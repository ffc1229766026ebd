#include "engine/train/token_file.h"

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace moetrain {
namespace {

// Passes when `status` has a message containing `part`, and shows the message when not.
::testing::AssertionResult MessageHas(const absl::Status& status, const std::string& part) {
  const std::string message(status.message());
  if (message.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << message << "\" lacks \"" << part << "\"";
}

void AppendLe(std::string& bytes, uint64_t value, int width) {
  for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((value >> (8 * b)) & 0xFF));
}

std::string U16Bytes(const std::vector<uint32_t>& tokens) {
  std::string bytes;
  for (uint32_t t : tokens) AppendLe(bytes, t, 2);
  return bytes;
}

// An llm.c shard; header fields can be overridden to build broken ones.
std::string LlmcBytes(const std::vector<uint32_t>& tokens, int32_t magic = kLlmcMagic,
                      int32_t version = kLlmcVersion, int64_t count = -1) {
  std::string bytes;
  AppendLe(bytes, static_cast<uint32_t>(magic), 4);
  AppendLe(bytes, static_cast<uint32_t>(version), 4);
  AppendLe(bytes, static_cast<uint32_t>(count < 0 ? tokens.size() : count), 4);
  for (int i = 3; i < kLlmcHeaderInts; ++i) AppendLe(bytes, 0, 4);
  return bytes + U16Bytes(tokens);
}

std::vector<uint32_t> Iota(int64_t n, uint32_t modulo = 65536) {
  std::vector<uint32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i % modulo);
  return tokens;
}

std::vector<int32_t> ReadAll(const TokenFile& file) {
  std::vector<int32_t> out(file.num_tokens());
  file.Read(0, file.num_tokens(), out.data());
  return out;
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/moetrain_token_file_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }

  std::string dir_;
};

TEST_F(TokenFileTest, ReadsLlmcShard) {
  std::vector<uint32_t> tokens = Iota(1000);
  tokens[3] = 65535;  // the whole uint16 range is valid when the vocabulary covers it
  const std::string path = Write("shard.bin", LlmcBytes(tokens));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kLlmc, 65536, 1);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->num_tokens(), 1000);
  EXPECT_EQ(file->path(), path);
  EXPECT_EQ(file->ByteOffset(0), 1024);
  EXPECT_EQ(file->ByteOffset(7), 1038);
  const std::vector<int32_t> read = ReadAll(*file);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(read[i], static_cast<int32_t>(tokens[i])) << i;
  std::vector<int32_t> middle(5);
  file->Read(500, 5, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{500, 501, 502, 503, 504}));
}

TEST_F(TokenFileTest, ReadsRawU16) {
  const std::vector<uint32_t> tokens = {0, 1, 255, 256, 50256, 7, 65535};
  const std::string path = Write("tokens.u16", U16Bytes(tokens));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 65536, 7);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->num_tokens(), 7);
  EXPECT_EQ(file->ByteOffset(3), 6);
  EXPECT_EQ(ReadAll(*file), (std::vector<int32_t>{0, 1, 255, 256, 50256, 7, 65535}));
}

TEST_F(TokenFileTest, TextIsOneTokenPerByteEvenWhenNotUtf8) {
  // "héllo" in UTF-8, then bytes that are not UTF-8 at all.
  const std::string bytes = std::string("h\xC3\xA9llo") + std::string("\xFF\xC3\x00\x80", 4);
  const std::string path = Write("text.txt", bytes);
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kText, 256, 1);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->num_tokens(), 10);
  EXPECT_EQ(ReadAll(*file),
            (std::vector<int32_t>{'h', 0xC3, 0xA9, 'l', 'l', 'o', 0xFF, 0xC3, 0x00, 0x80}));
}

TEST_F(TokenFileTest, CopiesShareTheMapping) {
  const std::string path = Write("tokens.u16", U16Bytes(Iota(64)));
  std::optional<TokenFile> copy;
  {
    absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 65536, 1);
    ASSERT_TRUE(file.ok()) << file.status();
    copy = *file;
  }
  std::filesystem::remove(path);  // the mapping outlives the name, too
  std::vector<int32_t> out(3);
  copy->Read(61, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{61, 62, 63}));
}

TEST_F(TokenFileTest, MissingFileIsNotFound) {
  const std::string path = dir_ + "/absent.bin";
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kLlmc, 50257, 1);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageHas(file.status(), "data.path " + path + ": no such file"));
}

TEST_F(TokenFileTest, DirectoryIsRejected) {
  absl::StatusOr<TokenFile> file = TokenFile::Open(dir_, TokenFileFormat::kU16, 50257, 1);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(file.status(), "not a regular file"));
}

struct BadFile {
  std::string name;
  TokenFileFormat format;
  std::string bytes;
  int64_t vocab_size;
  int64_t min_tokens;
  std::vector<std::string> expected;  // substrings of the message, besides the path
};

TEST_F(TokenFileTest, MalformedFilesAreInvalidArgumentNamingPathAndOffset) {
  std::vector<uint32_t> bad_token = Iota(100);
  bad_token[14] = 60000;  // the first offender is reported
  bad_token[20] = 65535;
  const std::vector<BadFile> cases = {
      {"magic.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), 20240519),
       50257,
       1,
       {"magic 20240519 at byte offset 0", "20240520"}},
      {"version.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), kLlmcMagic, 2),
       50257,
       1,
       {"version 2 at byte offset 4", "supported version 1"}},
      {"truncated.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(99), kLlmcMagic, 1, 100),
       50257,
       1,
       {"token count 100 at byte offset 8", "needs 1224 bytes", "has 1222", "truncated"}},
      {"extra.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100)) + "x",
       50257,
       1,
       {"token count 100 at byte offset 8", "has 1225", "(1 extra bytes)"}},
      {"negative.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(10), kLlmcMagic, 1, 0xFFFFFFFF),
       50257,
       1,
       {"token count -1 at byte offset 8 is negative"}},
      {"short.bin",
       TokenFileFormat::kLlmc,
       std::string(100, '\0'),
       50257,
       1,
       {"has 100 bytes, fewer than the 1024-byte llm.c header"}},
      {"empty.bin", TokenFileFormat::kLlmc, "", 50257, 1, {"has 0 bytes"}},
      {"vocab.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(bad_token),
       50257,
       1,
       {"token 60000 at byte offset 1052 is >= model.vocab_size = 50257"}},
      {"vocab.u16",
       TokenFileFormat::kU16,
       U16Bytes(bad_token),
       50257,
       1,
       {"token 60000 at byte offset 28 is >= model.vocab_size = 50257"}},
      {"odd.u16", TokenFileFormat::kU16, U16Bytes(Iota(5)) + "z", 50257, 1, {"odd byte count 11"}},
      {"few.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(10)),
       50257,
       65,
       {"has 10 tokens, fewer than one sequence of seq_len + 1 = 65"}},
      {"few.u16",
       TokenFileFormat::kU16,
       U16Bytes(Iota(64)),
       50257,
       65,
       {"has 64 tokens, fewer than one sequence of seq_len + 1 = 65"}},
      {"empty.u16", TokenFileFormat::kU16, "", 50257, 2, {"has 0 tokens"}},
      {"few.txt", TokenFileFormat::kText, "abc", 256, 4, {"has 3 tokens"}},
      {"small_vocab.txt",
       TokenFileFormat::kText,
       "abcdef",
       200,
       1,
       {"model.vocab_size >= 256, got 200"}},
  };
  for (const BadFile& c : cases) {
    const std::string path = Write(c.name, c.bytes);
    absl::StatusOr<TokenFile> file = TokenFile::Open(path, c.format, c.vocab_size, c.min_tokens);
    ASSERT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(MessageHas(file.status(), "data.path " + path + ": ")) << c.name;
    for (const std::string& part : c.expected) {
      EXPECT_TRUE(MessageHas(file.status(), part)) << c.name;
    }
  }
}

TEST_F(TokenFileTest, VocabularyBoundIsExclusive) {
  const std::string path = Write("edge.u16", U16Bytes({0, 99, 5}));
  EXPECT_TRUE(TokenFile::Open(path, TokenFileFormat::kU16, 100, 1).ok());
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 99, 1);
  EXPECT_TRUE(MessageHas(file.status(), "token 99 at byte offset 2 is >= model.vocab_size = 99"));
}

}  // namespace
}  // namespace moetrain

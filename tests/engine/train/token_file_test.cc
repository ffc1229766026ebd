#include "engine/train/token_file.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

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

std::string U32Bytes(const std::vector<uint32_t>& tokens) {
  std::string bytes;
  for (uint32_t t : tokens) AppendLe(bytes, t, 4);
  return bytes;
}

// An llm.c shard, uint32 tokens for version 2 and uint16 otherwise; header fields can be
// overridden to build broken ones.
std::string LlmcBytes(const std::vector<uint32_t>& tokens, int32_t magic = kLlmcMagic,
                      int32_t version = kLlmcVersionU16, int64_t count = -1) {
  std::string bytes;
  AppendLe(bytes, static_cast<uint32_t>(magic), 4);
  AppendLe(bytes, static_cast<uint32_t>(version), 4);
  AppendLe(bytes, static_cast<uint32_t>(count < 0 ? tokens.size() : count), 4);
  for (int i = 3; i < kLlmcHeaderInts; ++i) AppendLe(bytes, 0, 4);
  return bytes + (version == kLlmcVersionU32 ? U32Bytes(tokens) : U16Bytes(tokens));
}

// DeepSeek-V3's vocabulary, above what uint16 tokens can name.
constexpr int64_t kDeepSeekVocabSize = 129280;

std::vector<uint32_t> Iota(int64_t n, uint32_t modulo = 65536) {
  std::vector<uint32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>(i % modulo);
  return tokens;
}

std::vector<int32_t> ReadAll(const TokenFile& file) {
  std::vector<int32_t> out(file.num_tokens());
  EXPECT_OK(file.Read(0, file.num_tokens(), out.data()));
  return out;
}

class TokenFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
    return path;
  }

  const testutil::TempDir temp_dir_{"moetrain_token_file"};
  const std::string dir_ = temp_dir_.path().string();
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
  ASSERT_OK(file->Read(500, 5, middle.data()));
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

TEST_F(TokenFileTest, ReadsRawU32AboveTheUint16Range) {
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 100000, 129279, 1, 70000};
  const std::string path = Write("tokens.u32", U32Bytes(tokens));
  absl::StatusOr<TokenFile> file =
      TokenFile::Open(path, TokenFileFormat::kU32, kDeepSeekVocabSize, 7);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->num_tokens(), 7);
  EXPECT_EQ(file->token_bytes(), 4);
  EXPECT_EQ(file->ByteOffset(3), 12);
  EXPECT_EQ(ReadAll(*file), (std::vector<int32_t>{0, 65535, 65536, 100000, 129279, 1, 70000}));
  std::vector<int32_t> middle(3);
  ASSERT_OK(file->Read(2, 3, middle.data()));
  EXPECT_EQ(middle, (std::vector<int32_t>{65536, 100000, 129279}));
}

TEST_F(TokenFileTest, ReadsLlmcVersion2ShardOfUint32Tokens) {
  std::vector<uint32_t> tokens = Iota(1000, kDeepSeekVocabSize);
  tokens[3] = 129279;  // the last id of the vocabulary
  tokens[4] = 65536;
  const std::string path = Write("shard_v2.bin", LlmcBytes(tokens, kLlmcMagic, kLlmcVersionU32));
  absl::StatusOr<TokenFile> file =
      TokenFile::Open(path, TokenFileFormat::kLlmc, kDeepSeekVocabSize, 1);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->num_tokens(), 1000);
  EXPECT_EQ(file->token_bytes(), 4);
  EXPECT_EQ(file->ByteOffset(0), 1024);
  EXPECT_EQ(file->ByteOffset(7), 1052);
  const std::vector<int32_t> read = ReadAll(*file);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(read[i], static_cast<int32_t>(tokens[i])) << i;

  // Version 1 of the same tokens below 65,536 reads the same through the same format.
  std::vector<uint32_t> narrow = tokens;
  for (uint32_t& t : narrow) t %= 65536;
  absl::StatusOr<TokenFile> v1 = TokenFile::Open(Write("shard_v1.bin", LlmcBytes(narrow)),
                                                 TokenFileFormat::kLlmc, kDeepSeekVocabSize, 1);
  absl::StatusOr<TokenFile> v2 =
      TokenFile::Open(Write("narrow_v2.bin", LlmcBytes(narrow, kLlmcMagic, kLlmcVersionU32)),
                      TokenFileFormat::kLlmc, kDeepSeekVocabSize, 1);
  ASSERT_TRUE(v1.ok()) << v1.status();
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v1->token_bytes(), 2);
  EXPECT_EQ(ReadAll(*v1), ReadAll(*v2));
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

TEST_F(TokenFileTest, CopiesShareTheOpenFile) {
  const std::string path = Write("tokens.u16", U16Bytes(Iota(64)));
  std::optional<TokenFile> copy;
  {
    absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 65536, 1);
    ASSERT_TRUE(file.ok()) << file.status();
    copy = *file;
  }
  std::filesystem::remove(path);  // the open file outlives the name, too
  std::vector<int32_t> out(3);
  ASSERT_OK(copy->Read(61, 3, out.data()));
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
  std::vector<uint32_t> bad_wide_token = Iota(100, kDeepSeekVocabSize);
  bad_wide_token[14] = 129280;  // the first id past the vocabulary
  bad_wide_token[20] = 200000;
  const std::vector<BadFile> cases = {
      {"magic.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), 20240519),
       50257,
       1,
       {"magic 20240519 at byte offset 0", "20240520"}},
      {"version.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), kLlmcMagic, 3),
       50257,
       1,
       {"version 3 at byte offset 4 is not a supported version: 1 (uint16 tokens) or 2 (uint32 "
        "tokens)"}},
      {"version0.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), kLlmcMagic, 0),
       50257,
       1,
       {"version 0 at byte offset 4 is not a supported version"}},
      {"truncated_v2.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(99), kLlmcMagic, kLlmcVersionU32, 100),
       kDeepSeekVocabSize,
       1,
       {"token count 100 at byte offset 8 needs 1424 bytes (version 2, 4 bytes per token)",
        "has 1420", "truncated"}},
      {"extra_v2.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), kLlmcMagic, kLlmcVersionU32) + "xy",
       kDeepSeekVocabSize,
       1,
       {"token count 100 at byte offset 8 needs 1424 bytes", "has 1426", "(2 extra bytes)"}},
      // A version 1 shard whose header says version 2: half the bytes the count needs.
      {"mislabelled_v2.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(Iota(100), kLlmcMagic, kLlmcVersionU16).replace(4, 1, 1, '\x02'),
       kDeepSeekVocabSize,
       1,
       {"needs 1424 bytes (version 2", "has 1224", "truncated"}},
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
      {"vocab_v2.bin",
       TokenFileFormat::kLlmc,
       LlmcBytes(bad_wide_token, kLlmcMagic, kLlmcVersionU32),
       kDeepSeekVocabSize,
       1,
       {"token 129280 at byte offset 1080 is >= model.vocab_size = 129280"}},
      {"vocab.u32",
       TokenFileFormat::kU32,
       U32Bytes(bad_wide_token),
       kDeepSeekVocabSize,
       1,
       {"token 129280 at byte offset 56 is >= model.vocab_size = 129280"}},
      // Read returns int32: no vocabulary lets a uint32 token reach 2^31.
      {"int32.u32",
       TokenFileFormat::kU32,
       U32Bytes({1, 0x80000000u}),
       int64_t{1} << 32,
       1,
       {"token 2147483648 at byte offset 4 is >= 2^31"}},
      {"ragged.u32",
       TokenFileFormat::kU32,
       U32Bytes(Iota(5)) + "abc",
       kDeepSeekVocabSize,
       1,
       {"has 23 bytes, not a multiple of 4; a uint32 token file has 4 bytes per token "
        "(3 extra bytes at byte offset 20)"}},
      {"ragged2.u32", TokenFileFormat::kU32, "ab", kDeepSeekVocabSize, 1, {"has 2 bytes"}},
      {"few.u32",
       TokenFileFormat::kU32,
       U32Bytes(Iota(64)),
       kDeepSeekVocabSize,
       65,
       {"uint32 token file has 64 tokens, fewer than one sequence of seq_len + 1 = 65"}},
      {"empty.u32", TokenFileFormat::kU32, "", kDeepSeekVocabSize, 2, {"has 0 tokens"}},
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

  const std::string wide = Write("edge.u32", U32Bytes({0, 129279, 5}));
  EXPECT_TRUE(TokenFile::Open(wide, TokenFileFormat::kU32, 129280, 1).ok());
  file = TokenFile::Open(wide, TokenFileFormat::kU32, 129279, 1);
  EXPECT_TRUE(
      MessageHas(file.status(), "token 129279 at byte offset 4 is >= model.vocab_size = 129279"));
}

// A token file truncated while a job reads it: the file was memory-mapped, and touching a page past
// its new end killed the process with SIGBUS (exit 135), whatever the worker was doing. Now each
// Read is a pread, and the short read is an error naming the file, the offset and both sizes. In a
// child process first, so that the old crash fails only this test.
TEST_F(TokenFileTest, TruncatedUnderAReaderIsAnErrorNamingTheFileOffsetAndSize) {
  const std::string path = Write("truncated.u16", U16Bytes(Iota(32768)));  // 64 KiB, 16 pages
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 65536, 1);
  ASSERT_OK(file);
  EXPECT_EQ(file->file_bytes(), 65536);
  std::vector<int32_t> out(10);
  const auto truncate_then_read = [&](int64_t new_size, int64_t begin) {
    std::filesystem::resize_file(path, new_size);
    return file->Read(begin, static_cast<int64_t>(out.size()), out.data());
  };
  EXPECT_EXIT(testutil::ExitWithError(truncate_then_read(0, 20000)), ::testing::ExitedWithCode(0),
              "byte offset 40000 is past the end of the file, which has 0 bytes now and had 65536 "
              "when it was opened");
  if (HasFailure()) return;  // the old code would crash the test process below
  // Whole again.
  Write("truncated.u16", U16Bytes(Iota(32768)));
  ASSERT_OK(file->Read(20000, 10, out.data()));
  EXPECT_EQ(out[9], 20009);
  // Cut in the middle of the range read: the message names where the file ends.
  const absl::Status status = truncate_then_read(40010, 20000);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      status.message(),
      "data.path " + path +
          ": byte offset 40010 is past the end of the file, which has 40010 bytes now and had "
          "65536 when it was opened: it was truncated or rewritten while in use. Restore the "
          "file, or train on the new data in a new job");
  ASSERT_OK(file->Read(0, 10, out.data()));  // what is still there reads
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

// Rewritten in place with a token the model has no embedding for: refused as Open refuses it,
// never handed to the model.
TEST_F(TokenFileTest, ATokenRewrittenOutOfRangeIsRefusedByRead) {
  const std::string path = Write("rewritten.u16", U16Bytes(Iota(100, 50)));
  absl::StatusOr<TokenFile> file = TokenFile::Open(path, TokenFileFormat::kU16, 50, 1);
  ASSERT_OK(file);
  std::vector<uint32_t> tokens = Iota(100, 50);
  tokens[42] = 60000;
  tokens[43] = 50;
  Write("rewritten.u16", U16Bytes(tokens));
  std::vector<int32_t> out(20);
  const absl::Status status = file->Read(40, 20, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "data.path " + path + ": token 60000 at byte offset 84 is >= model.vocab_size = 50");
}

}  // namespace
}  // namespace moetrain

#include "engine/train/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string LittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file with `header` (space-padded to a multiple of 8) and then `data`, built by hand.
std::string RawFile(std::string header, const std::string& data) {
  header.resize((header.size() + 7) / 8 * 8, ' ');
  return LittleEndian64(header.size()) + header + data;
}

// The test's own reader: just enough of the format to check what the writer produced.
struct RawSafetensors {
  uint64_t header_length = 0;
  std::string header_text;
  Json header;
  std::string data;  // the data section
};

RawSafetensors ParseRaw(const std::string& bytes) {
  RawSafetensors raw;
  EXPECT_GE(bytes.size(), 8u);
  for (int i = 7; i >= 0; --i) {
    raw.header_length = raw.header_length << 8 | static_cast<unsigned char>(bytes[i]);
  }
  EXPECT_LE(8 + raw.header_length, bytes.size());
  raw.header_text = bytes.substr(8, raw.header_length);
  raw.header = Json::parse(raw.header_text);
  raw.data = bytes.substr(8 + raw.header_length);
  return raw;
}

std::string BytesOf(const TensorView& t) {
  return std::string(static_cast<const char*>(t.raw()), t.numel() * DTypeSize(t.dtype()));
}

std::vector<int64_t> ShapeOf(const TensorView& t) { return {t.shape().begin(), t.shape().end()}; }

// A tensor of `dtype` and `shape` filled with random bits: every bit pattern is fair game.
Tensor RandomBits(DType dtype, std::vector<int64_t> shape, std::mt19937_64& gen) {
  Tensor t = Tensor::Empty(dtype, shape);
  auto* bytes = static_cast<unsigned char*>(t.view().raw());
  for (int64_t i = 0; i < t.numel() * static_cast<int64_t>(DTypeSize(dtype)); ++i) {
    bytes[i] = static_cast<unsigned char>(gen());
  }
  return t;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `bytes` as a file, reads it, and expects InvalidArgument naming the file and `what`.
  void ExpectRejected(const std::string& bytes, const std::vector<std::string>& what) {
    const std::string path = Path("corrupt.safetensors");
    WriteBytes(path, bytes);
    const absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    const std::string message(file.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    for (const std::string& part : what)
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }

  const testutil::TempDir temp_dir_{"safetensors_test"};
  const fs::path dir_ = temp_dir_.path();
};

TEST_F(SafetensorsTest, WritesTheLayoutAnIndependentReaderExpects) {
  std::mt19937_64 gen(1);
  const Tensor weight = RandomBits(DType::kF32, {2, 3}, gen);
  const Tensor bias = RandomBits(DType::kBF16, {4}, gen);
  const Tensor count = RandomBits(DType::kI64, {}, gen);
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"z.weight", weight}, {"a.bias", bias}, {"count", count}},
                               {{"format", "pt"}, {"note", "unit test"}})
                  .ok());

  const std::string bytes = ReadBytes(path);
  const RawSafetensors raw = ParseRaw(bytes);
  EXPECT_EQ(raw.header_length % 8, 0u);
  // Padding is spaces after the JSON text.
  const size_t json_end = raw.header_text.find_last_of('}');
  EXPECT_EQ(raw.header_text.find_first_not_of(' ', json_end + 1), std::string::npos);
  EXPECT_EQ(raw.header["__metadata__"], (Json{{"format", "pt"}, {"note", "unit test"}}));
  EXPECT_EQ(raw.header.size(), 4u);

  struct Expected {
    const char* name;
    const char* dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
    const Tensor* tensor;
  };
  // Offsets follow the order written, not the names.
  const Expected expected[] = {{"z.weight", "F32", {2, 3}, 0, 24, &weight},
                               {"a.bias", "BF16", {4}, 24, 32, &bias},
                               {"count", "I64", {}, 32, 40, &count}};
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.name);
    const Json& entry = raw.header[e.name];
    EXPECT_EQ(entry["dtype"], e.dtype);
    EXPECT_EQ(entry["shape"].get<std::vector<int64_t>>(), e.shape);
    EXPECT_EQ(entry["data_offsets"], (Json{e.begin, e.end}));
    EXPECT_EQ(raw.data.substr(e.begin, e.end - e.begin), BytesOf(*e.tensor));
  }
  EXPECT_EQ(raw.data.size(), 40u);
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeBitForBit) {
  std::mt19937_64 gen(2);
  std::vector<std::pair<std::string, Tensor>> owned;
  owned.emplace_back("f32", RandomBits(DType::kF32, {3, 5}, gen));
  owned.emplace_back("bf16", RandomBits(DType::kBF16, {7, 3}, gen));  // odd byte count
  owned.emplace_back("i32", RandomBits(DType::kI32, {9}, gen));
  owned.emplace_back("i64", RandomBits(DType::kI64, {2, 2}, gen));
  owned.emplace_back("rank4", RandomBits(DType::kF32, {2, 1, 3, 2}, gen));
  owned.emplace_back("scalar", RandomBits(DType::kBF16, {}, gen));
  owned.emplace_back("no_rows", Tensor::Empty(DType::kF32, {0}));
  owned.emplace_back("no_cols", Tensor::Empty(DType::kI64, {2, 0, 3}));
  // Every fp8 byte, NaNs and infinities included.
  for (DType dtype : {DType::kF8E4M3, DType::kF8E5M2}) {
    Tensor t = Tensor::Empty(dtype, {16, 16});
    for (int i = 0; i < 256; ++i) static_cast<uint8_t*>(t.view().raw())[i] = i;
    owned.emplace_back(std::string(DTypeName(dtype)), std::move(t));
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, t] : owned) views.emplace_back(name, t.view());
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, views, {}).ok());

  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path(), path);
  EXPECT_TRUE(file->metadata().empty());
  // Data order; the two zero-byte tensors share an offset and so come by name.
  EXPECT_EQ(file->names(),
            (std::vector<std::string>{"f32", "bf16", "i32", "i64", "rank4", "scalar", "no_cols",
                                      "no_rows", "fp8_e4m3", "fp8_e5m2"}));
  for (const auto& [name, t] : views) {
    SCOPED_TRACE(name);
    const absl::StatusOr<TensorView> read = file->View(name);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->dtype(), t.dtype());
    EXPECT_EQ(ShapeOf(*read), ShapeOf(t));
    EXPECT_FALSE(read->empty());
    EXPECT_EQ(BytesOf(*read), BytesOf(t));
  }
}

TEST_F(SafetensorsTest, WritesStridedViewsInRowMajorOrder) {
  float storage[4 * 6];
  for (int i = 0; i < 24; ++i) storage[i] = static_cast<float>(i);
  const TensorView matrix(storage, DType::kF32, {4, 6});
  const TensorView transposed(storage, DType::kF32, {6, 4}, {1, 6});
  const TensorView every_other_column(storage, DType::kF32, {4, 3}, {6, 2});
  const std::string path = Path("strided.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"t", transposed}, {"c", every_other_column}}, {}).ok());

  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorView t = *file->View("t");
  const TensorView c = *file->View("c");
  ASSERT_EQ(ShapeOf(t), (std::vector<int64_t>{6, 4}));
  ASSERT_EQ(ShapeOf(c), (std::vector<int64_t>{4, 3}));
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(t.data<float>()[i * 4 + j], storage[j * 6 + i]);
  }
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 3; ++j) EXPECT_EQ(c.data<float>()[i * 3 + j], storage[i * 6 + 2 * j]);
  }
  EXPECT_TRUE(matrix.is_contiguous());
}

TEST_F(SafetensorsTest, ViewCopyAndTake) {
  std::mt19937_64 gen(3);
  const Tensor w = RandomBits(DType::kF32, {3}, gen);
  const std::string path = Path("w.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}}, {{"k", "v"}}).ok());
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("k"), "v");
  EXPECT_TRUE(file->contains("w"));
  EXPECT_FALSE(file->contains("x"));

  const absl::StatusOr<TensorView> missing = file->View("x");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("\"x\""), absl::string_view::npos);

  absl::StatusOr<Tensor> copy = file->Copy("w");
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(BytesOf(*copy), BytesOf(w));
  copy->data<float>()[0] += 1.0f;  // a copy, not an alias
  EXPECT_EQ(BytesOf(*file->View("w")), BytesOf(w));

  std::map<std::string, Tensor> taken = file->TakeTensors();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(BytesOf(taken.at("w")), BytesOf(w));
  EXPECT_TRUE(file->names().empty());
}

TEST_F(SafetensorsTest, AFileWithoutTensors) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  EXPECT_EQ(ReadBytes(path), RawFile("{}", ""));
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->names().empty());
}

TEST_F(SafetensorsTest, WriteRejectsBadNamesAndViews) {
  float x[2] = {1, 2};
  const TensorView v(x, DType::kF32, {2});
  const std::string path = Path("bad.safetensors");
  struct Case {
    std::vector<std::pair<std::string, TensorView>> tensors;
    std::string what;
  };
  const Case cases[] = {{{{"a", v}, {"a", v}}, "tensor \"a\": duplicate name"},
                        {{{"__metadata__", v}}, "reserved"},
                        {{{"", v}}, "empty tensor name"},
                        {{{"absent", TensorView()}}, "tensor \"absent\": the view has no data"},
                        {{{"bad\xff utf8", v}}, "UTF-8"}};
  for (const Case& c : cases) {
    const absl::Status status = WriteSafetensors(path, c.tensors, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
    EXPECT_NE(status.message().find(c.what), absl::string_view::npos) << status;
  }
  // A zero-element view needs no data.
  EXPECT_TRUE(
      WriteSafetensors(path, {{"none", TensorView(nullptr, DType::kF32, {0, 4})}}, {}).ok());
  EXPECT_EQ(WriteSafetensors(Path("no/such/dir.safetensors"), {}, {}).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, DigestsMatchKnownSha256) {
  const std::string path = Path("abc.txt");
  const absl::StatusOr<FileDigest> written = WriteFileSynced(path, "abc");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->bytes, 3);
  EXPECT_EQ(written->sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const absl::StatusOr<FileDigest> read = DigestFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->sha256, written->sha256);

  ASSERT_TRUE(WriteFileSynced(path, "").ok());
  EXPECT_EQ(DigestFile(path)->sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(DigestFile(Path("missing")).status().code(), absl::StatusCode::kNotFound);

  // The digest computed while writing a safetensors file is the file's.
  std::mt19937_64 gen(4);
  const Tensor t = RandomBits(DType::kBF16, {33, 5}, gen);
  FileDigest digest;
  ASSERT_TRUE(WriteSafetensors(Path("t.safetensors"), {{"t", t}}, {}, &digest).ok());
  const absl::StatusOr<FileDigest> again = DigestFile(Path("t.safetensors"));
  EXPECT_EQ(digest.bytes, again->bytes);
  EXPECT_EQ(digest.bytes, static_cast<int64_t>(fs::file_size(Path("t.safetensors"))));
  EXPECT_EQ(digest.sha256, again->sha256);
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadSafetensors(Path("nope.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, RejectsTruncatedHeaderLength) {
  ExpectRejected("abc", {"3 bytes", "8-byte header length"});
}

TEST_F(SafetensorsTest, RejectsHeaderLongerThanFile) {
  ExpectRejected(LittleEndian64(1000) + "{}      ", {"header length 1000 exceeds"});
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  ExpectRejected(RawFile("{\"w\": {", ""), {"not valid JSON"});
  // nlohmann throws out_of_range, not parse_error, for a number beyond a double (found by
  // tests/fuzz/safetensors_fuzz): it must not escape as an exception.
  ExpectRejected(RawFile(R"({"__metadata__": {"x": 1e400}})", ""), {"not valid JSON"});
  ExpectRejected(RawFile("[1, 2]", ""), {"not a JSON object"});
}

// A header nested 10^6 deep (2 MB, under the 100,000,000-byte header limit) where the reader
// quotes a value in its error: a tensor entry, a shape extent, a metadata value. Printing it
// recursed once per level and overflowed the stack (SIGSEGV); in a child process, so that the old
// crash fails only this test.
TEST_F(SafetensorsTest, DeeplyNestedHeaderIsRefusedNotACrash) {
  const std::string deep = testutil::NestedJsonArrays(1000000);
  const std::vector<std::string> headers = {
      "{\"w\": " + deep + "}",
      R"({"w": {"dtype": "F32", "data_offsets": [0, 4], "shape": [)" + deep + "]}}",
      R"({"__metadata__": {"format": )" + deep + "}}"};
  for (const std::string& header : headers) {
    const std::string path = Path("deep.safetensors");
    WriteBytes(path, RawFile(header, ""));
    EXPECT_EXIT(testutil::ExitWithError(ReadSafetensors(path)), ::testing::ExitedWithCode(0),
                "deep.safetensors: the header nests JSON arrays and objects deeper than 64 levels")
        << header.substr(0, 60);
  }
  // Nested within the limit, the values are quoted by their first bytes only.
  const std::string wide = "[\"" + std::string(1000, 'x') + "\"]";
  ExpectRejected(
      RawFile(R"({"w": {"dtype": "F32", "data_offsets": [0, 4], "shape": [)" + wide + "]}}",
              "xxxx"),
      {"every extent must be a non-negative integer, got [\"xxx", "... (1004 bytes)"});
}

TEST_F(SafetensorsTest, RejectsUnknownDType) {
  ExpectRejected(RawFile(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})", "xx"),
                 {"tensor \"w\"", "unsupported dtype \"F16\""});
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsets) {
  ExpectRejected(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, 'x')),
                 {"tensor \"b\"", "overlap tensor \"a\""});
}

TEST_F(SafetensorsTest, RejectsOffsetsOutsideTheFile) {
  ExpectRejected(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                         std::string(8, 'x')),
                 {"tensor \"b\"", "[8, 16]", "past the end"});
}

TEST_F(SafetensorsTest, RejectsGapsAndUncoveredBytes) {
  ExpectRejected(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         std::string(12, 'x')),
                 {"tensor \"b\"", "gap of 4 bytes"});
  ExpectRejected(
      RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(8, 'x')),
      {"4 bytes after offset 4", "belong to no tensor"});
}

TEST_F(SafetensorsTest, RejectsShapeThatDisagreesWithOffsets) {
  ExpectRejected(
      RawFile(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x')),
      {"tensor \"w\"", "needs 12 bytes", "span 8"});
}

TEST_F(SafetensorsTest, RejectsMalformedEntries) {
  const std::string data(4, 'x');
  ExpectRejected(RawFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", data),
                 {"tensor \"w\"", "non-negative integer"});
  ExpectRejected(RawFile(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1],"data_offsets":[0,4]}})", data),
                 {"tensor \"w\"", "rank 5"});
  ExpectRejected(RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", data),
                 {"tensor \"w\"", "end is before begin"});
  ExpectRejected(RawFile(R"({"w":{"dtype":"F32","shape":[1]}})", data),
                 {"tensor \"w\"", "data_offsets"});
  ExpectRejected(RawFile(R"({"w":[1,2]})", data), {"tensor \"w\"", "expected an object"});
  // 2^32 * 2^32 * 4 bytes wraps to 0 in 64 bits: it must not pass as an empty tensor.
  ExpectRejected(
      RawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
      {"tensor \"w\"", "too large"});
  // No elements, but the strides (products of trailing extents) would overflow int64 (found by
  // tests/fuzz/safetensors_fuzz under UBSan).
  ExpectRejected(
      RawFile(R"({"w":{"dtype":"I64","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
              ""),
      {"tensor \"w\"", "too large"});
  ExpectRejected(RawFile(R"({"__metadata__":{"step":100}})", ""),
                 {"metadata \"step\" is not a string"});
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  std::mt19937_64 gen(5);
  const Tensor a = RandomBits(DType::kF32, {4}, gen);
  const Tensor b = RandomBits(DType::kI32, {4}, gen);
  const std::string path = Path("whole.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a}, {"b", b}}, {}).ok());
  const std::string bytes = ReadBytes(path);
  ExpectRejected(bytes.substr(0, bytes.size() - 3), {"tensor \"b\"", "past the end"});
  // Cut inside the header: the length now exceeds what is left.
  ExpectRejected(bytes.substr(0, 20), {"exceeds"});
}

}  // namespace
}  // namespace moetrain

// The job-spec parser's bounds on hostile input: YAML anchors and aliases (an alias bomb expands
// exponentially) are refused, as is text over 1 MiB; an error quotes at most a bounded part of a
// huge value; and a value the spec derives is reported by the field the user wrote.
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "alias_bomb_yaml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job_spec.h"

namespace moetrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Far more than any error message needs; far less than the values below.
constexpr size_t kSmallMessage = 1000;

std::string ParseError(const absl::StatusOr<v1::JobSpec>& spec) {
  EXPECT_FALSE(spec.ok());
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

// The validation error of `yaml` (which must parse), from ValidateJobSpec and from
// ResolveJobSpec, which must agree.
std::string ValidationError(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return "";
  const absl::Status status = ValidateJobSpec(*spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  EXPECT_EQ(resolved.status(), status);
  return std::string(status.message());
}

using testutil::AliasBombYaml;

TEST(JobSpecBoundsTest, AliasBombIsRefused) {
  ASSERT_LT(AliasBombYaml().size(), 600u);
  const std::string error = ParseError(ParseJobSpecYaml(AliasBombYaml()));
  EXPECT_THAT(error, AllOf(HasSubstr("anchors and aliases are not accepted"), HasSubstr("&l0"),
                           HasSubstr("line 2, column 7")));
}

TEST(JobSpecBoundsTest, AnchorsAndAliasesAreRefusedEverywhere) {
  // An anchor alone, on a mapping, a sequence, a scalar, a null.
  EXPECT_THAT(ParseError(ParseJobSpecYaml("name: t\ntrain: &t {steps: 3}\n")),
              AllOf(HasSubstr("anchors and aliases are not accepted"), HasSubstr("&t"),
                    HasSubstr("line 2")));
  EXPECT_THAT(ParseError(ParseJobSpecYaml("name: &n t\n")), HasSubstr("&n"));
  EXPECT_THAT(ParseError(ParseJobSpecYaml("name: t\ndata: &d\n")), HasSubstr("&d"));
  // An alias of an anchor in a previous document is a syntax error; of one in this document,
  // refused at the anchor.
  EXPECT_THAT(ParseError(ParseJobSpecYaml("a: &x 1\nname: *x\n")), HasSubstr("&x"));
  EXPECT_THAT(ParseError(ParseJobSpecYaml("name: *x\n")), HasSubstr("YAML syntax error"));
  // Text that only looks like one is fine.
  absl::StatusOr<v1::JobSpec> quoted = ParseJobSpecYaml("name: '&t'\ncheckpoint: {dir: '*x'}\n");
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(quoted->name(), "&t");
  EXPECT_EQ(quoted->checkpoint().dir(), "*x");
}

TEST(JobSpecBoundsTest, TextOverOneMebibyteIsRefused) {
  std::string yaml = "name: t\n";
  while (yaml.size() <= (size_t{1} << 20))
    absl::StrAppend(&yaml, "# ", std::string(1000, 'x'), "\n");
  EXPECT_THAT(ParseError(ParseJobSpecYaml(yaml)),
              AllOf(HasSubstr("1 MiB"), HasSubstr(absl::StrCat(yaml.size(), " bytes"))));
  const std::string json = absl::StrCat("{\"name\": \"t\"", std::string(size_t{1} << 20, ' '), "}");
  EXPECT_THAT(ParseError(ParseJobSpecJson(json)), HasSubstr("1 MiB"));

  const std::filesystem::path path =
      std::filesystem::path(::testing::TempDir()) / "job_spec_bounds_big.yaml";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << yaml;
  }
  const std::string error = ParseError(LoadJobSpecFile(path.string()));
  EXPECT_THAT(error, AllOf(HasSubstr(path.string()), HasSubstr("1 MiB")));
  std::filesystem::remove(path);

  // Exactly 1 MiB is accepted.
  std::string fits = "name: t\n";
  absl::StrAppend(&fits, "#", std::string((size_t{1} << 20) - fits.size() - 2, 'x'), "\n");
  ASSERT_EQ(fits.size(), size_t{1} << 20);
  EXPECT_TRUE(ParseJobSpecYaml(fits).ok());
}

TEST(JobSpecBoundsTest, ErrorsQuoteOnlyTheStartOfAHugeValue) {
  const std::string huge(500'000, 'v');
  struct Case {
    std::string yaml;
    std::string expected;  // in the message
  };
  const Case cases[] = {
      // YAML keys are at most 1024 characters (a syntax error beyond); in JSON, anything goes.
      {"{\"name\": \"t\", \"model\": {\"" + huge + "\": 1}}", "unknown field model.vvvv"},
      {"name: t\nmodel: {vocab_size: " + std::string(500'000, '9') + "}\n",
       "model.vocab_size: 9999"},
      {"name: t\ntrain: {optimizer: {lr: 1" + std::string(500'000, '0') + "}}\n",
       "train.optimizer.lr: 1000"},
      {"name: t\nmodel: {vocab_size: " + huge + "}\n", "model.vocab_size: expected an integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expected);
    const std::string error =
        ParseError(c.yaml[0] == '{' ? ParseJobSpecJson(c.yaml) : ParseJobSpecYaml(c.yaml));
    EXPECT_LT(error.size(), kSmallMessage) << error.substr(0, kSmallMessage);
    EXPECT_THAT(error, AllOf(HasSubstr(c.expected), HasSubstr("bytes)")));
  }
  // JSON syntax errors quote the token they stopped at.
  const std::string json_error = ParseError(ParseJobSpecJson("{\"name\": \"" + huge + "\n\"}"));
  EXPECT_LT(json_error.size(), kSmallMessage) << json_error.substr(0, kSmallMessage);
  EXPECT_THAT(json_error, HasSubstr("JSON syntax error"));

  // Validation quotes strings the same way: the start, then the size.
  for (const std::string& yaml :
       {"name: " + huge + "!\n", "name: t\ndata: {path: " + huge + "}\n"}) {
    const std::string error = ValidationError(yaml);
    EXPECT_LT(error.size(), kSmallMessage) << error.substr(0, kSmallMessage);
    EXPECT_THAT(error, HasSubstr("... (50000"));
  }
  // A short value is quoted whole.
  EXPECT_EQ(ValidationError("name: a!b\n"),
            "name = \"a!b\" must be 1 to 128 characters from [A-Za-z0-9._-], starting with a "
            "letter or digit");
}

TEST(JobSpecBoundsTest, DerivedFieldErrorsNameTheFieldTheUserWrote) {
  // data.synthetic_vocab_size = model.vocab_size when unset: the synthetic source draws from
  // [2, 2^20] tokens.
  EXPECT_THAT(ValidationError("name: t\nmodel: {vocab_size: 2000000}\n"),
              AllOf(HasSubstr("model.vocab_size = 2000000"), HasSubstr("1048576"),
                    HasSubstr("data.synthetic_vocab_size"),
                    Not(HasSubstr("data.synthetic_vocab_size = "))));
  EXPECT_THAT(ValidationError("name: t\nmodel: {vocab_size: 1}\n"),
              AllOf(HasSubstr("model.vocab_size = 1"), Not(HasSubstr("synthetic_vocab_size ="))));
  // Written, it is named itself.
  EXPECT_EQ(ValidationError("name: t\nmodel: {vocab_size: 2000000}\n"
                            "data: {synthetic_vocab_size: 1500000}\n"),
            "data.synthetic_vocab_size = 1500000 must be at most 1048576 (the synthetic "
            "source's largest vocabulary)");
  EXPECT_EQ(ValidationError("name: t\ndata: {synthetic_vocab_size: 1}\n"),
            "data.synthetic_vocab_size = 1 must be at least 2");
  EXPECT_TRUE(ParseJobSpecYaml("name: t\nmodel: {vocab_size: 2000000}\n"
                               "data: {synthetic_vocab_size: 1048576}\n")
                  .ok());
  EXPECT_TRUE(ValidateJobSpec(*ParseJobSpecYaml("name: t\nmodel: {vocab_size: 2000000}\n"
                                                "data: {synthetic_vocab_size: 1048576}\n"))
                  .ok());

  // model.head_dim = hidden_size / num_heads when unset.
  EXPECT_EQ(ValidationError("name: t\nmodel: {hidden_size: 96, num_heads: 32, num_kv_heads: 32}\n"),
            "model.hidden_size = 96 / model.num_heads = 32 gives model.head_dim = 3, which must "
            "be even (RoPE rotates pairs of dimensions); set model.head_dim");
  EXPECT_EQ(ValidationError("name: t\nmodel: {head_dim: 3}\n"),
            "model.head_dim = 3 must be even (RoPE rotates pairs of dimensions)");

  // model.max_seq_len = train.seq_len when unset.
  EXPECT_EQ(ValidationError("name: t\ntrain: {seq_len: 0}\n"),
            "train.seq_len = 0 must be at least 1");
  EXPECT_EQ(ValidationError("name: t\nmodel: {max_seq_len: 0}\n"),
            "model.max_seq_len = 0 must be at least 1");
}

}  // namespace
}  // namespace moetrain

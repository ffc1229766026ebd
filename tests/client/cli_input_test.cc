// Hostile input to the real `moetrain` binary, and hostile text coming back from a coordinator:
// a YAML alias bomb and oversized spec files are refused with exit 2; an error quotes at most a
// bounded part of a huge value; strings the coordinator returns (cancel reasons, worker names,
// log lines, error messages) reach the terminal with their control characters escaped, and
// unchanged in --json output; a field the spec derives is reported by the field the user wrote.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"
#include "tests/proto/alias_bomb_yaml.h"

namespace moetrain::testutil {
namespace {

using CliInputTest = ClientTest;

// Far more than any error message needs; far less than the values below.
constexpr size_t kSmallStderr = 4096;

// True when `text` holds a C0 control other than newline, DEL, or a C1 control (UTF-8 C2 80-9F).
bool HasControlCharacters(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      return true;
    }
  }
  return false;
}

// Sets the window title, clears the screen, rings the bell, returns the carriage, and a C1 CSI.
const std::string kHostile =
    "evil\x1b]0;owned\x07\x1b[2J\rtext\xc2\x9b"
    "31m";

TEST_F(CliInputTest, AliasBombIsRefusedWithExitTwo) {
  const std::string bomb = WriteSpec(AliasBombYaml(), "bomb.yaml");
  ASSERT_LT(AliasBombYaml().size(), 600u);
  for (const char* command : {"submit", "run"}) {
    SCOPED_TRACE(command);
    const Finished finished = Moetrain(Args({command, bomb}, std::string(command) == "submit"));
    EXPECT_EQ(finished.exit_code, 2) << finished.err;
    EXPECT_TRUE(Contains(finished.err, "alias") || Contains(finished.err, "anchor"))
        << finished.err;
    EXPECT_TRUE(Contains(finished.err, bomb)) << finished.err;
    EXPECT_LT(finished.err.size(), kSmallStderr);
  }
  const Finished jobs = Moetrain(Args({"jobs"}));
  EXPECT_EQ(jobs.out, "(no jobs)\n");
}

TEST_F(CliInputTest, OversizedSpecFileIsRefusedWithExitTwo) {
  std::string yaml = TinySpecYaml("big", 20);
  // Comments: a spec that parses, were it not for its size.
  while (yaml.size() <= (size_t{2} << 20))
    absl::StrAppend(&yaml, "# ", std::string(1000, 'x'), "\n");
  const std::string path = WriteSpec(yaml, "big.yaml");
  const Finished submit = Moetrain(Args({"submit", path}));
  EXPECT_EQ(submit.exit_code, 2) << submit.err.substr(0, kSmallStderr);
  EXPECT_TRUE(Contains(submit.err, "1 MiB")) << submit.err.substr(0, kSmallStderr);
  EXPECT_LT(submit.err.size(), kSmallStderr);
}

TEST_F(CliInputTest, ErrorsQuoteOnlyPartOfAHugeValue) {
  const std::string huge(500'000, 'n');
  struct Case {
    std::string yaml;
    std::string field;
  };
  const std::vector<Case> cases = {
      // Not a valid name: its characters.
      {TinySpecYaml(huge + "!", 20), "name"},
      // An unknown field with a huge key (in JSON: YAML keys have at most 1024 characters).
      {"{\"name\": \"tiny\", \"" + huge + "\": 1}", "unknown field"},
      // A number too large for its field.
      {TinySpecYaml("tiny", 20, "top_k: " + std::string(500'000, '9')), "model.moe.top_k"},
      // A string where a number belongs.
      {TinySpecYaml("tiny", 20, "top_k: " + huge), "model.moe.top_k"},
      // A huge data path where none may be.
      {"name: tiny\ndata: {path: " + huge + "}\n", "data.path"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.field);
    const std::string path =
        WriteSpec(c.yaml, absl::StrCat("huge", i, c.yaml[0] == '{' ? ".json" : ".yaml"));
    const Finished submit = Moetrain(Args({"submit", path}));
    EXPECT_EQ(submit.exit_code, 2) << submit.err.substr(0, kSmallStderr);
    EXPECT_LT(submit.err.size(), kSmallStderr) << submit.err.substr(0, kSmallStderr);
    EXPECT_TRUE(Contains(submit.err, c.field)) << submit.err.substr(0, kSmallStderr);
  }
  // The coordinator's own errors, and the CLI's description of the call, are bounded too.
  const std::string id(100'000, 'j');
  const Finished describe = Moetrain(Args({"describe", id}));
  EXPECT_EQ(describe.exit_code, 2) << describe.err.substr(0, kSmallStderr);
  EXPECT_LT(describe.err.size(), kSmallStderr) << describe.err.substr(0, kSmallStderr);
  EXPECT_TRUE(Contains(describe.err, "GetJob(job_id 'jjjj"))
      << describe.err.substr(0, kSmallStderr);
}

TEST_F(CliInputTest, ServerStringsAreEscapedInTextAndKeptInJson) {
  const std::string id = Submit(WriteSpec(TinySpecYaml("tiny", 20)));
  std::unique_ptr<TestWorker> worker = RegisterWorker("worker-" + kHostile);
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<v1::Assignment> assignment = worker->AwaitAssignment(absl::Seconds(30));
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  ASSERT_TRUE(worker->ReportLog({"log " + kHostile}).ok());

  const Finished workers = Moetrain(Args({"workers"}));
  ASSERT_EQ(workers.exit_code, 0) << workers.err;
  EXPECT_FALSE(HasControlCharacters(workers.out)) << workers.out;
  EXPECT_TRUE(Contains(workers.out, "worker-evil\\x1b]0;owned\\x07")) << workers.out;

  const Finished cancel = Moetrain(Args({"cancel", id, "--reason", "reason " + kHostile}));
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  const Finished describe = Moetrain(Args({"describe", id}));
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  EXPECT_FALSE(HasControlCharacters(describe.out)) << describe.out;
  EXPECT_TRUE(Contains(describe.out, "reason evil\\x1b]0;owned\\x07\\x1b[2J\\rtext\\u009b31m"))
      << describe.out;

  const Finished logs = Moetrain(Args({"logs", id}));
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_FALSE(HasControlCharacters(logs.out)) << logs.out;
  EXPECT_TRUE(Contains(logs.out, "log evil\\x1b")) << logs.out;
  EXPECT_TRUE(Contains(logs.out, "reason evil\\x1b")) << logs.out;

  // --json keeps the strings as they are: the JSON encoding escapes them.
  const Finished logs_json = Moetrain(Args({"logs", id, "--json"}));
  ASSERT_EQ(logs_json.exit_code, 0) << logs_json.err;
  EXPECT_FALSE(HasControlCharacters(logs_json.out)) << logs_json.out;
  bool saw_log = false, saw_reason = false;
  for (const nlohmann::json& line : JsonLines(logs_json.out)) {
    saw_log = saw_log || line.value("message", "") == "log " + kHostile;
    saw_reason = saw_reason || line.value("reason", "") == "reason " + kHostile;
  }
  EXPECT_TRUE(saw_log) << logs_json.out;
  EXPECT_TRUE(saw_reason) << logs_json.out;
  const Finished workers_json = Moetrain(Args({"workers", "--json"}));
  ASSERT_EQ(workers_json.exit_code, 0) << workers_json.err;
  EXPECT_FALSE(HasControlCharacters(workers_json.out)) << workers_json.out;
  EXPECT_EQ(JsonLines(workers_json.out).at(0).at("workers").at(0).value("name", ""),
            "worker-" + kHostile);

  // An error message that echoes what the user typed.
  const Finished unknown = Moetrain(Args({"describe", "job-" + kHostile}));
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_FALSE(HasControlCharacters(unknown.err)) << unknown.err;
  EXPECT_TRUE(Contains(unknown.err, "job-evil\\x1b")) << unknown.err;
}

TEST_F(CliInputTest, DerivedFieldErrorsNameTheFieldTheUserWrote) {
  // data.synthetic_vocab_size is not written: it is model.vocab_size, beyond what the synthetic
  // source generates.
  const std::string path = WriteSpec(R"(name: derived
model: {vocab_size: 2000000, hidden_size: 32, num_layers: 1, num_heads: 2, ffn_dim: 32,
        moe: {num_experts: 2, top_k: 1, expert_ffn_dim: 32}}
train: {steps: 1, batch_size: 1, seq_len: 8}
)");
  for (const char* command : {"submit", "run"}) {
    SCOPED_TRACE(command);
    const Finished finished = Moetrain(Args({command, path}, std::string(command) == "submit"));
    EXPECT_EQ(finished.exit_code, 2) << finished.err;
    EXPECT_TRUE(Contains(finished.err, "model.vocab_size = 2000000")) << finished.err;
    EXPECT_FALSE(Contains(finished.err, "synthetic_vocab_size =")) << finished.err;
  }
}

}  // namespace
}  // namespace moetrain::testutil

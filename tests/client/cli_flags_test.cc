// How the real `moetrain` binary picks its coordinator and token: an explicit --coordinator or
// --token-file wins over MOETRAIN_COORDINATOR / MOETRAIN_TOKEN_FILE, which win over the defaults,
// for every command that talks to a coordinator. Also --help and --version of the three binaries,
// the exit code of bad usage of `moetrain eval`, and CUDA asked of a machine without a usable GPU
// (`moetrain run --device cuda`, `moetrain-worker --devices cuda`).
#include <filesystem>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/client/client_test_util.h"

namespace moetrain::testutil {
namespace {

using CliFlagsTest = ClientTest;

// Every coordinator command, as the arguments before the coordinator flags. `cancel` and
// `delete` act on `final_job` (cancelled first, then deleted); the others read `job`.
std::vector<std::vector<std::string>> EveryCommand(const std::string& spec, const std::string& job,
                                                   const std::string& final_job, bool with_delete) {
  std::vector<std::vector<std::string>> commands = {{"submit", spec},
                                                    {"jobs"},
                                                    {"describe", job},
                                                    {"logs", job},
                                                    {"checkpoints", job},
                                                    {"workers"},
                                                    {"cancel", final_job, "--reason", "flag test"}};
  if (with_delete) commands.push_back({"delete", final_job});
  return commands;
}

class CommandsTest : public CliFlagsTest {
 protected:
  void SetUp() override {
    CliFlagsTest::SetUp();
    if (HasFatalFailure()) return;
    spec_ = WriteSpec(TinySpecYaml("tiny", 20));
    job_ = Submit(spec_);
    final_job_ = Submit(spec_);
    ASSERT_FALSE(job_.empty());
    ASSERT_FALSE(final_job_.empty());
    wrong_token_ = (dir_ / "wrong-token").string();
    WriteTextFile(wrong_token_, "not-the-token\n");
    // `delete` is tested where this build has it.
    const Finished help = Moetrain({"--help"});
    with_delete_ = Contains(help.out, "\n  delete");
  }

  std::vector<std::vector<std::string>> Commands() const {
    return EveryCommand(spec_, job_, final_job_, with_delete_);
  }

  // Jobs on the live coordinator, read through the flags.
  size_t JobCount() {
    const Finished jobs = Moetrain(Args({"jobs", "--json"}));
    EXPECT_EQ(jobs.exit_code, 0) << jobs.err;
    const std::vector<nlohmann::json> lines = JsonLines(jobs.out);
    return lines.size() == 1 ? lines[0].at("jobs").size() : 0;
  }

  std::string spec_, job_, final_job_, wrong_token_;
  bool with_delete_ = false;
};

TEST_F(CommandsTest, CoordinatorAndTokenFlagsWinOverTheEnvironment) {
  // The environment names a coordinator that is not there and a token that is wrong: only the
  // flags lead to the live one.
  const EnvChanges env = {{"MOETRAIN_COORDINATOR", DeadAddress()},
                          {"MOETRAIN_TOKEN_FILE", wrong_token_}};
  for (const std::vector<std::string>& command : Commands()) {
    SCOPED_TRACE(command[0]);
    const Finished finished = Moetrain(Args(command), env);
    EXPECT_EQ(finished.exit_code, 0) << finished.err;
  }
  EXPECT_EQ(JobCount(), with_delete_ ? 2u : 3u);
}

TEST_F(CommandsTest, TokenFileFlagWinsOverTheEnvironment) {
  const EnvChanges env = {{"MOETRAIN_COORDINATOR", address()},
                          {"MOETRAIN_TOKEN_FILE", wrong_token_}};
  for (std::vector<std::string> command : Commands()) {
    SCOPED_TRACE(command[0]);
    command.insert(command.end(), {"--token-file", token_file_});
    const Finished finished = Moetrain(command, env);
    EXPECT_EQ(finished.exit_code, 0) << finished.err;
  }
}

TEST_F(CommandsTest, CoordinatorFlagIsNotRedirectedByTheEnvironment) {
  // The environment names the live coordinator and its token; the flag names one that is not
  // there, and the command must fail to reach it rather than act on the live one.
  const EnvChanges env = {{"MOETRAIN_COORDINATOR", address()},
                          {"MOETRAIN_TOKEN_FILE", token_file_}};
  const std::string dead = DeadAddress();
  for (std::vector<std::string> command : Commands()) {
    SCOPED_TRACE(command[0]);
    command.insert(command.end(), {"--coordinator", dead});
    const Finished finished = Moetrain(command, env);
    EXPECT_EQ(finished.exit_code, 3) << finished.err;
    EXPECT_TRUE(Contains(finished.err, dead)) << finished.err;
  }
  // Nothing was submitted, cancelled or deleted on the live coordinator.
  EXPECT_EQ(JobCount(), 2u);
  const Finished describe = Moetrain(Args({"describe", final_job_, "--json"}));
  ASSERT_EQ(describe.exit_code, 0) << describe.err;
  EXPECT_EQ(JsonLines(describe.out).at(0).value("state", ""), "JOB_STATE_PENDING");
}

TEST_F(CommandsTest, TheEnvironmentAloneIsUsedWithoutFlags) {
  const EnvChanges env = {{"MOETRAIN_COORDINATOR", address()},
                          {"MOETRAIN_TOKEN_FILE", token_file_}};
  for (const std::vector<std::string>& command : Commands()) {
    SCOPED_TRACE(command[0]);
    const Finished finished = Moetrain(command, env);
    EXPECT_EQ(finished.exit_code, 0) << finished.err;
  }
}

// "0.4.0": what CMake's project() version looks like.
bool LooksLikeVersion(const std::string& text) {
  return std::regex_search(text, std::regex(R"(^\S*\s*\d+\.\d+\.\d+\s*$)"));
}

Finished RunBinary(const std::string& name, const std::vector<std::string>& args,
                   const std::filesystem::path& cwd) {
  Child child(std::filesystem::path(MOETRAIN_BIN_DIR) / name);
  const std::string error = child.Start(args, cwd);
  EXPECT_EQ(error, "") << name;
  Finished finished = child.Wait(kCommandTimeout);
  EXPECT_FALSE(finished.timed_out) << name << " hung";
  return finished;
}

TEST_F(CliFlagsTest, EveryBinaryPrintsItsVersionAndHelp) {
  for (const char* binary : {"moetrain", "moetrain-coordinator", "moetrain-worker"}) {
    SCOPED_TRACE(binary);
    const Finished version = RunBinary(binary, {"--version"}, dir_);
    EXPECT_EQ(version.exit_code, 0) << version.err;
    EXPECT_TRUE(LooksLikeVersion(version.out)) << "'" << version.out << "'";
    for (const char* help_flag : {"--help", "-h"}) {
      const Finished help = RunBinary(binary, {help_flag}, dir_);
      EXPECT_EQ(help.exit_code, 0) << help_flag << ": " << help.err;
      EXPECT_TRUE(Contains(help.out, "Usage")) << help.out;
    }
  }
}

TEST_F(CliFlagsTest, EveryBinaryExitsTwoOnAnUnknownFlag) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> runs = {
      {"moetrain", {"jobs", "--no-such-flag"}},
      {"moetrain-coordinator", {"--no-such-flag"}},
      {"moetrain-worker", {"--no-such-flag"}}};
  for (const auto& [binary, args] : runs) {
    SCOPED_TRACE(binary);
    const Finished finished = RunBinary(binary, args, dir_);
    EXPECT_EQ(finished.exit_code, 2) << finished.err;
    EXPECT_TRUE(Contains(finished.err, "--no-such-flag")) << finished.err;
  }
}

TEST_F(CliFlagsTest, EveryCommandHasHelpThatExitsZero) {
  for (const char* command :
       {"run", "eval", "submit", "jobs", "describe", "logs", "cancel", "checkpoints", "workers"}) {
    SCOPED_TRACE(command);
    const Finished help = Moetrain({command, "--help"});
    EXPECT_EQ(help.exit_code, 0) << help.err;
    EXPECT_TRUE(Contains(help.out, "Usage")) << help.out;
  }
  // The help of a coordinator command says where the flags' defaults come from.
  const Finished help = Moetrain({"jobs", "--help"});
  EXPECT_TRUE(Contains(help.out, "MOETRAIN_COORDINATOR")) << help.out;
  EXPECT_TRUE(Contains(help.out, "MOETRAIN_TOKEN_FILE")) << help.out;
}

TEST_F(CliFlagsTest, EvalBadUsageExitsTwo) {
  const std::string checkpoint = (dir_ / "no-such-checkpoint").string();
  const std::string data = (dir_ / "tokens.bin").string();
  WriteTextFile(data, "some text");
  // A --data-format that does not exist.
  const Finished format =
      Moetrain({"eval", "--checkpoint", checkpoint, "--data-path", data, "--data-format", "bogus"});
  EXPECT_EQ(format.exit_code, 2) << format.err;
  EXPECT_TRUE(Contains(format.err, "--data-format = 'bogus'")) << format.err;
  // A checkpoint directory that does not exist.
  const Finished missing =
      Moetrain({"eval", "--checkpoint", checkpoint, "--data-path", data, "--data-format", "text"});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_TRUE(Contains(missing.err, checkpoint)) << missing.err;
  // Flags CLI11 refuses.
  EXPECT_EQ(Moetrain({"eval"}).exit_code, 2);
  EXPECT_EQ(Moetrain({"eval", "--checkpoint", checkpoint, "--data-path", data, "--data-format",
                      "text", "--batches", "-1"})
                .exit_code,
            2);
}

// CUDA_VISIBLE_DEVICES="" hides every GPU, so that these runs find none on any machine.
EnvChanges WithoutGpus() {
  return {{"MOETRAIN_COORDINATOR", std::nullopt},
          {"MOETRAIN_TOKEN_FILE", std::nullopt},
          {"CUDA_VISIBLE_DEVICES", ""}};
}

TEST_F(CliFlagsTest, ACudaRunWithoutAGpuFailsAtOnceAndCreatesNothing) {
  std::string yaml = TinySpecYaml("on-gpu", 2);
  const std::string cpu_spec = WriteSpec(yaml, "cpu.yaml");
  yaml.replace(yaml.find("resources:\n"), std::string("resources:\n").size(),
               "resources:\n  device: CUDA\n");
  const std::string cuda_spec = WriteSpec(yaml, "cuda.yaml");
  const std::filesystem::path checkpoints = dir_ / "gpu-checkpoints";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", cpu_spec, "--device", "cuda"},
        std::vector<std::string>{"run", cuda_spec}}) {
    std::vector<std::string> with_dir = args;
    with_dir.insert(with_dir.end(), {"--checkpoint-dir", checkpoints.string()});
    const Finished finished = Moetrain(with_dir, WithoutGpus());
    EXPECT_EQ(finished.exit_code, 2) << finished.out << finished.err;
    EXPECT_TRUE(Contains(finished.err, "resources.device = CUDA: no usable GPU on this machine ("))
        << finished.err;
    EXPECT_FALSE(std::filesystem::exists(checkpoints)) << "a refused run created its directory";
  }
  // A bad --device is bad usage.
  const Finished bad = Moetrain({"run", cpu_spec, "--device", "gpu"}, WithoutGpus());
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(Contains(bad.err, "--device")) << bad.err;
  // --device cpu overrides a CUDA spec: it trains here.
  const Finished cpu = Moetrain(
      {"run", cuda_spec, "--device", "cpu", "--checkpoint-dir", (dir_ / "cpu-ck").string()},
      WithoutGpus());
  EXPECT_EQ(cpu.exit_code, 0) << cpu.out << cpu.err;
  EXPECT_TRUE(Contains(cpu.out, "step 2/2")) << cpu.out;
}

TEST_F(CliFlagsTest, AWorkerOfferingGpusItCannotUseFailsAtStart) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> runs = {
      {{"--devices", "cuda"}, "--devices = 'cuda': no usable GPU on this machine ("},
      {{"--devices", "cuda:0,0"}, "--devices = 'cuda:0,0': GPU 0 is listed twice"},
      {{"--devices", "cuda:1,-1"}, "'-1' is not a device index"},
      {{"--devices", "gpu"}, "is neither 'cpu', 'cuda' (every GPU) nor 'cuda:I,J,...'"},
      // No GPU 4095 anywhere: on a machine with GPUs the message names it, without any it says
      // there is none.
      {{"--devices", "cuda:0,4095"}, "--devices = 'cuda:0,4095': "}};
  for (const auto& [args, message] : runs) {
    SCOPED_TRACE(args[1]);
    Child child(std::filesystem::path(MOETRAIN_BIN_DIR) / "moetrain-worker");
    ASSERT_EQ(child.Start(args, dir_, args[1] == "cuda" ? WithoutGpus() : CleanEnv()), "");
    // A worker that got past its flags would keep trying to reach a coordinator, not exit.
    const Finished finished = child.Wait(kCommandTimeout);
    EXPECT_FALSE(finished.timed_out) << "the worker started";
    EXPECT_EQ(finished.exit_code, 2) << finished.err;
    EXPECT_TRUE(Contains(finished.err, message)) << finished.err;
  }
}

}  // namespace
}  // namespace moetrain::testutil

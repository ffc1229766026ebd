// The command line of the six benchmarks and the demo (bench/bench_flags.h), through the real
// binaries as child processes: --help lists every option with its default and exits 0; a value
// that is not a number, one out of range or not among the choices, a missing value, an unknown
// flag and a stray argument each exit 2 with stderr naming the flag. None of them gets as far as
// running a benchmark.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

namespace moetrain::testutil {
namespace {

// An option as --help shows it: the flag, and the text stating its default ("" for none: a switch
// such as --json, or a flag set only by the program itself).
struct HelpOption {
  std::string flag;
  std::string default_text;
};

// Arguments that are bad usage, and the flag stderr must name.
struct BadUsage {
  std::vector<std::string> args;
  std::string named;
};

struct Binary {
  std::string name;
  std::vector<HelpOption> options;  // every option but -h,--help
  std::vector<BadUsage> bad;
};

std::vector<Binary> Binaries() {
  const std::string config_default = "(default: the config's)";
  return {
      {"train_bench",
       {{"--json", ""},
        {"--steps", "=4"},
        {"--dtype", "=bf16"},
        {"--device", "=cpu"},
        {"--config", "=default"},
        {"--layers", config_default},
        {"--hidden", config_default},
        {"--batch", config_default},
        {"--ranks", "=1"},
        {"--ep", "=1"},
        {"--sharding", "=none"},
        {"--moment-dtype", "=f32"},
        {"--recompute", "=none"},
        {"--grad-reduce-dtype", "=f32"}},
       {{{"--steps", "x"}, "--steps"},
        {{"--steps", "1"}, "--steps"},  // the first step is a warm-up: at least 2
        {{"--dtype", "f16"}, "--dtype"},
        {{"--device", "gpu"}, "--device"},
        {{"--device", "cuda:x"}, "--device"},
        {{"--config", "huge"}, "--config"},
        {{"--layers", "0"}, "--layers"},
        {{"--hidden", "1.5"}, "--hidden"},
        {{"--batch", "x"}, "--batch"},
        {{"--ranks", "0"}, "--ranks"},
        {{"--sharding", "full"}, "--sharding"},
        {{"--moment-dtype", "f16"}, "--moment-dtype"},
        {{"--recompute", "partial"}, "--recompute"},
        {{"--grad-reduce-dtype", "f16"}, "--grad-reduce-dtype"},
        {{"--ranks", "3", "--ep", "2"}, "--ep"},
        {{"--json", "--steps"}, "--steps"}}},
      {"attention_bench",
       {{"--reps", "=20"}},
       {{{"--reps", "x"}, "--reps"}, {{"--reps", "0"}, "--reps"}}},
      {"dispatch_bench",
       {{"--json", ""},
        {"--ranks", "=2"},
        {"--tokens", "=4096"},
        {"--reps", "=5"},
        {"--dtype", "=f32"},
        {"--chunks", "=2"},
        {"--rank", "(default: none, the parent)"},
        {"--dir", ""}},
       {{{"--reps", "x"}, "--reps"},
        {{"--ranks", "x"}, "--ranks"},
        {{"--ranks", "1"}, "--ranks"},
        {{"--ranks", "3"}, "--ranks"},    // does not divide the 64 experts
        {{"--tokens", "1"}, "--tokens"},  // fewer tokens than ranks
        {{"--tokens", "0"}, "--tokens"},
        {{"--dtype", "f16"}, "--dtype"},
        {{"--chunks", "0"}, "--chunks"},
        {{"--rank", "x"}, "--rank"}}},
      {"coordinator_load_bench",
       {{"--json", ""},
        {"--clients", "=50"},
        {"--jobs", "=1000"},
        {"--coordinator", "(default: the one next to this binary, else the build's)"}},
       {{{"--clients", "x"}, "--clients"},
        {{"--jobs", "0"}, "--jobs"},
        {{"--coordinator"}, "--coordinator"}}},
      {"moe_layer_bench",
       {{"--device", "=cpu"},
        {"--json", ""},
        {"--config", "(default: those of the device, below)"},
        {"--dtype", "(default: f32 and bf16 on the CPU, bf16 on a GPU)"},
        {"--reps", "=5"}},
       {{{"--reps", "x"}, "--reps"},
        {{"--reps", "0"}, "--reps"},
        {{"--config", "tiny,huge"}, "--config"},
        {{"--dtype", "bf16,f16"}, "--dtype"},
        {{"--device", "gpu"}, "--device"}}},
      {"calibrate_bench",
       {{"--json", ""},
        {"--config", "=default"},
        {"--dtype", "=bf16"},
        {"--reps", "=3"},
        {"--check", ""}},
       {{{"--reps", "x"}, "--reps"},
        {{"--reps", "0"}, "--reps"},
        {{"--config", "huge"}, "--config"},
        {{"--dtype", "f16"}, "--dtype"},
        {{"--check", "/nonexistent/calibration.json"}, "--check"}}},
      {"moe_layer_demo",
       {{"--steps", "=300"}, {"--dtype", "=f32"}, {"--score", "=softmax"}},
       {{{"--steps", "x"}, "--steps"},
        {{"--steps", "0"}, "--steps"},
        {{"--dtype", "f16"}, "--dtype"},
        {{"--score", "max"}, "--score"}}},
  };
}

Finished RunBinary(const std::string& binary, const std::vector<std::string>& args) {
  Child child(std::filesystem::path(MOETRAIN_BIN_DIR) / binary);
  const std::string started = child.Start(args, std::filesystem::temp_directory_path());
  EXPECT_EQ(started, "") << binary;
  // Each run only parses its flags; a benchmark that started by mistake is killed here.
  return child.Wait(std::chrono::seconds(60));
}

// The entry of `flag` in a help text: from its line to the next option's line, or to the blank
// line that ends its section (CLI11 puts a long label's description on the next line).
std::string HelpEntry(const std::string& help, const std::string& flag) {
  size_t start = std::string::npos;
  for (const char* after : {" ", "\n"}) {
    start = std::min(start, help.find("\n  " + flag + after));
  }
  if (start == std::string::npos) return "";
  ++start;
  const size_t end = std::min(help.find("\n  -", start), help.find("\n\n", start));
  return help.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The flags of a help text's option lines ("  --steps INT...", "  -h,--help ...").
std::set<std::string> HelpFlags(const std::string& help) {
  std::set<std::string> flags;
  const std::regex line(R"((^|\n)  (-[^ \n]+))");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), line); it != std::sregex_iterator();
       ++it) {
    flags.insert((*it)[2]);
  }
  return flags;
}

TEST(BenchFlagsTest, HelpListsEveryOptionWithItsDefault) {
  for (const Binary& binary : Binaries()) {
    SCOPED_TRACE(binary.name);
    const Finished help = RunBinary(binary.name, {"--help"});
    EXPECT_EQ(help.exit_code, 0) << help.err;
    EXPECT_EQ(help.err, "");
    std::set<std::string> expected = {"-h,--help"};
    for (const HelpOption& option : binary.options) {
      expected.insert(option.flag);
      const std::string entry = HelpEntry(help.out, option.flag);
      EXPECT_FALSE(entry.empty()) << option.flag << " missing from\n" << help.out;
      EXPECT_NE(entry.find(option.default_text), std::string::npos)
          << option.flag << " does not state its default " << option.default_text << ":\n"
          << entry;
    }
    // No option is left out of the table above.
    EXPECT_EQ(HelpFlags(help.out), expected) << help.out;
  }
}

TEST(BenchFlagsTest, BadValuesExitTwoNamingTheFlag) {
  for (const Binary& binary : Binaries()) {
    for (const BadUsage& bad : binary.bad) {
      std::string command = binary.name;
      for (const std::string& arg : bad.args) command += " " + arg;
      SCOPED_TRACE(command);
      const Finished finished = RunBinary(binary.name, bad.args);
      EXPECT_EQ(finished.exit_code, 2) << finished.out << finished.err;
      EXPECT_NE(finished.err.find(bad.named), std::string::npos) << finished.err;
      EXPECT_EQ(finished.out, "") << "bad usage printed a result";
    }
  }
}

TEST(BenchFlagsTest, UnknownFlagsAndStrayArgumentsExitTwo) {
  for (const Binary& binary : Binaries()) {
    SCOPED_TRACE(binary.name);
    const Finished unknown = RunBinary(binary.name, {"--no-such-flag"});
    EXPECT_EQ(unknown.exit_code, 2) << unknown.out << unknown.err;
    EXPECT_NE(unknown.err.find("--no-such-flag"), std::string::npos) << unknown.err;
    const Finished stray = RunBinary(binary.name, {"stray"});
    EXPECT_EQ(stray.exit_code, 2) << stray.out << stray.err;
    EXPECT_NE(stray.err.find("stray"), std::string::npos) << stray.err;
    EXPECT_EQ(unknown.out + stray.out, "");
  }
}

}  // namespace
}  // namespace moetrain::testutil

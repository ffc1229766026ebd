// What README.md and docs/*.md name exists: the binaries they run (in the build's bin folder), the
// subcommands and flags they give them (in each one's --help), the job-spec field paths they write
// in backticks and the rows of docs/job-spec.md's field tables (in moetrain.v1.JobSpec), the
// repository paths and links (in the source tree), the tests they cite and the MOETRAIN_* names
// (in the sources). Each failure names the doc, the line and the claim.
//
// Flags: a command whose program is known (`moetrain SUB`, `moetrain-worker`, a benchmark...)
// is checked against that program's --help; any other `--flag` must appear in at least one
// --help of ours, or in kExternalFlags, the other tools' flags that the docs show.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "moetrain/v1/job.pb.h"
#include "tests/docs/doc_text.h"
#include "tests/integration/child_process.h"

namespace moetrain {
namespace {

namespace fs = std::filesystem;
using testutil::Child;
using testutil::Code;
using testutil::Doc;
using testutil::Finished;
using testutil::HeadingAnchors;
using testutil::IsFence;
using testutil::LoadDoc;
using testutil::ReadFile;

const fs::path kRepo = MOETRAIN_SOURCE_DIR;
const fs::path kBin = MOETRAIN_BIN_DIR;

// Flags of other tools that the docs show in their commands, each with the tool.
const std::map<std::string, std::string> kExternalFlags = {
    {"--build", "cmake --build"},
    {"--target", "cmake --build --target, docker build --target"},
    {"--output-on-failure", "ctest"},
    {"--no-install-recommends", "apt-get install, in the Dockerfiles"},
    {"--rm", "docker run"},
    {"--network", "docker run"},
    {"--from-literal", "kubectl create secret"},
    {"--dry-run", "kubectl create"},
    {"--replicas", "kubectl scale"},
    {"--web.enable-lifecycle", "prometheus (its /-/reload endpoint)"},
    {"--ppid", "ps --ppid (a worker's rank processes)"},
    {"--use-distributed-optimizer", "Megatron-LM's ZeRO-1 (docs/job-spec.md's parallel.sharding)"},
    {"--grad-reduce-in-bf16", "Megatron-LM's bf16 gradient reduction (parallel.grad_reduce_dtype)"},
    {"--recompute-granularity",
     "Megatron-LM's activation recompute (docs/job-spec.md's train.recompute)"},
};

// Dotted names in backticks that begin like a spec path but are not one.
const std::map<std::string, std::string> kNotSpecPaths = {
    {"model.moe.topk", "docs/job-spec.md's example of an unknown-field error"},
};
// Hugging Face tensor and file names, which share the first segment `model`.
const std::vector<std::string> kHuggingFacePrefixes = {"model.layers.", "model.embed_tokens.",
                                                       "model.norm.", "model.safetensors"};

// Last segments that make a dotted name a file name.
const std::set<std::string> kFileExtensions = {"md", "json", "yaml", "yml", "proto", "py",
                                               "h",  "cc",   "cu",   "sh",  "txt"};

// Repository-looking paths that are something else.
const std::map<std::string, std::string> kNotRepoPaths = {
    {"deploy/moetrain-coordinator", "kubectl's name of the coordinator's Deployment"},
};

// Top-level folders of the repository, the start of a repository path in the docs.
const char kRepoDirs[] =
    "bench|client|cmake|deploy|docs|engine|examples|proto|scripts|server|tests|worker";

const std::vector<Doc>& Docs() {
  static const std::vector<Doc>* docs = [] {
    std::vector<std::string> names = {"README.md"};
    for (const fs::directory_entry& entry : fs::directory_iterator(kRepo / "docs")) {
      if (entry.path().extension() == ".md") {
        names.push_back("docs/" + entry.path().filename().string());
      }
    }
    std::sort(names.begin() + 1, names.end());
    auto* loaded = new std::vector<Doc>();
    for (const std::string& name : names) loaded->push_back(LoadDoc(kRepo, name));
    return loaded;
  }();
  return *docs;
}

// What `program args...` prints, stdout and stderr together; empty when it cannot run.
std::string Output(const fs::path& program, const std::vector<std::string>& args) {
  Child child(program);
  if (!child.Start(args, kRepo).empty()) return "";
  const Finished finished = child.Wait(std::chrono::seconds(60));
  return finished.out + finished.err;
}

// Each program of ours the docs run, and its --help (`moetrain SUB` for each subcommand).
struct Programs {
  std::map<std::string, std::string> help;  // "moetrain-worker", "moetrain run", ... → text
  std::set<std::string> subcommands;        // of moetrain
  std::string all_help;
};

const Programs& OurPrograms() {
  static const Programs* programs = [] {
    auto* p = new Programs();
    for (const char* name : {"moetrain", "moetrain-coordinator", "moetrain-worker", "train_bench",
                             "moe_layer_bench", "dispatch_bench", "attention_bench",
                             "coordinator_load_bench", "moe_layer_demo", "calibrate_bench"}) {
      p->help[name] = Output(kBin / name, {"--help"});
    }
    // CLI11's list: "Subcommands:" then one "  NAME   description" line each.
    const std::string& top = p->help["moetrain"];
    const size_t list = top.find("Subcommands:");
    if (list != std::string::npos) {
      std::istringstream lines(top.substr(list));
      std::string line;
      std::getline(lines, line);
      while (std::getline(lines, line) && line.rfind("  ", 0) == 0) {
        std::istringstream words(line);
        std::string sub;
        words >> sub;
        p->subcommands.insert(sub);
      }
    }
    // "moetrain COMMAND" in the docs: any subcommand.
    for (const std::string& sub : p->subcommands) {
      p->help["moetrain " + sub] = Output(kBin / "moetrain", {sub, "--help"});
      p->help["moetrain COMMAND"] += p->help["moetrain " + sub] + "\n";
    }
    for (const char* script :
         {"scripts/gpu-check.sh", "scripts/fp8-quality.sh", "tests/fuzz/run_fuzzers.sh"}) {
      p->help[script] = Output(kRepo / script, {"--help"});
    }
    for (const auto& [name, text] : p->help) p->all_help += text + "\n";
    return p;
  }();
  return *programs;
}

// Whether `flag` appears in `help` as a whole flag (not the start of a longer one).
bool HelpHasFlag(const std::string& help, const std::string& flag) {
  const auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  };
  for (size_t at = help.find(flag); at != std::string::npos; at = help.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    const bool starts = at == 0 || !name_char(help[at - 1]);
    const bool ends = end == help.size() || !name_char(help[end]);
    if (starts && ends) return true;
  }
  return false;
}

// The long flags in `text`: "--name", "--web.enable-lifecycle"; not "--tls-*" (a family).
std::vector<std::string> FlagsIn(const std::string& text) {
  static const std::regex flag(R"((^|[\s\[(|=,`"'{])(--[a-z][a-z0-9.-]*[a-z0-9])(?![\w*-]))");
  std::vector<std::string> flags;
  for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) {
    flags.push_back((*it)[2].str());
  }
  return flags;
}

TEST(DocsClaimsTest, EveryHelpRan) {
  for (const auto& [name, text] : OurPrograms().help) {
    EXPECT_NE(text.find("--"), std::string::npos) << name << " --help printed no flags:\n" << text;
  }
  EXPECT_GE(OurPrograms().subcommands.size(), 4u) << OurPrograms().help.at("moetrain");
}

// build/bin/NAME, the benchmarks and demos, and the moetrain programs at the head of a command.
TEST(DocsClaimsTest, NamedBinariesAreBuilt) {
  static const std::regex named(R"((build/bin/([A-Za-z0-9_.-]+))|\b([a-z0-9_]+_(bench|demo))\b)");
  static const std::regex command(R"(^\s*(moetrain(-[a-z]+)*)\s+-)");
  int checked = 0;
  for (const Doc& doc : Docs()) {
    for (std::sregex_iterator it(doc.text.begin(), doc.text.end(), named), end; it != end; ++it) {
      const std::string binary = (*it)[2].matched ? (*it)[2].str() : (*it)[3].str();
      ++checked;
      EXPECT_TRUE(fs::exists(kBin / binary))
          << doc.Where(it->position()) << ": " << binary << " is not in " << kBin;
    }
    for (const Code& code : doc.code) {
      std::smatch m;
      if (!std::regex_search(code.text, m, command)) continue;
      ++checked;
      EXPECT_TRUE(fs::exists(kBin / m[1].str()))
          << code.where << ": `" << code.text << "` runs " << m[1] << ", not in " << kBin;
    }
  }
  EXPECT_GT(checked, 20);
}

// The program a command runs, "moetrain SUB" for the CLI's subcommands, and the command's text up
// to its end (a pipe, a comment, `&&`, `;` or `&`). Empty when it runs none of ours.
std::pair<std::string, std::string> OurCommand(const std::string& text, std::string* bad_sub) {
  static const std::regex head(
      R"(^\s*(?:(?:build/bin/)?(moetrain(?:-coordinator|-worker)?|[a-z_]+_(?:bench|demo))|(scripts/gpu-check\.sh|scripts/fp8-quality\.sh|tests/fuzz/run_fuzzers\.sh))(?=\s|$)(.*)$)");
  std::smatch m;
  if (!std::regex_search(text, m, head)) return {};
  std::string program = m[1].matched ? m[1].str() : m[2].str();
  // One the docs name wrongly is NamedBinariesAreBuilt's to report.
  if (OurPrograms().help.count(program) == 0) return {};
  std::string rest = m[3].str();
  for (const char* stop : {" | ", " #", "&&", ";", " &"}) {
    const size_t at = rest.find(stop);
    if (at != std::string::npos) rest.resize(at);
  }
  if (program == "moetrain") {
    static const std::regex sub(R"(^\s+([a-z][a-z-]*|COMMAND)(?=\s|$))");
    std::smatch s;
    if (std::regex_search(rest, s, sub)) {
      if (s[1] != "COMMAND" && OurPrograms().subcommands.count(s[1].str()) == 0) {
        *bad_sub = s[1].str();
        return {};
      }
      program += " " + s[1].str();
    }
  }
  return {program, rest};
}

TEST(DocsClaimsTest, FlagsAreInTheirProgramsHelp) {
  const Programs& programs = OurPrograms();
  int attributed = 0, loose = 0;
  for (const Doc& doc : Docs()) {
    for (const Code& code : doc.code) {
      std::string bad_sub;
      const auto [program, rest] = OurCommand(code.text, &bad_sub);
      EXPECT_EQ(bad_sub, "") << code.where << ": `" << code.text << "`: moetrain has no subcommand "
                             << bad_sub;
      if (program.empty()) continue;
      // A subcommand's help lists its own flags; moetrain's (--help, --version) apply too.
      const std::string help =
          programs.help.at(program) + "\n" + programs.help.at(program.substr(0, program.find(' ')));
      for (const std::string& flag : FlagsIn(rest)) {
        ++attributed;
        EXPECT_TRUE(HelpHasFlag(help, flag)) << code.where << ": `" << code.text << "`: " << flag
                                             << " is not in `" << program << " --help`";
      }
    }
    const std::vector<std::string> mentioned = FlagsIn(doc.text);
    for (const std::string& flag : std::set<std::string>(mentioned.begin(), mentioned.end())) {
      ++loose;
      if (kExternalFlags.count(flag) != 0) continue;
      EXPECT_TRUE(HelpHasFlag(programs.all_help, flag))
          << doc.name << ": " << flag << " is in no --help of ours ("
          << doc.Where(doc.text.find(flag)) << " is the first mention), nor an external tool's";
    }
  }
  EXPECT_GT(attributed, 30);
  EXPECT_GT(loose, 50);
}

// A table of flags ("| flag | ..." or "| `moetrain run` flag | ...") lists flags of one program:
// the one its header names, else the one of the section ("## `moetrain-worker`") or of the last
// command shown before it.
TEST(DocsClaimsTest, FlagTablesMatchTheirProgram) {
  const Programs& programs = OurPrograms();
  static const std::regex heading(R"(^#+ `([^`]+)`\s*$)");
  static const std::regex named_header(R"(^\| `([^`]+)` flag \|)");
  static const std::regex row(R"(^\| `(--[a-z][a-z0-9-]*)[ `=])");
  int rows = 0;
  for (const Doc& doc : Docs()) {
    std::string context, table;  // the programs of the section and of the current table
    bool fenced = false, in_table = false;
    int line_number = 0;
    std::istringstream lines(doc.text);
    for (std::string line; std::getline(lines, line);) {
      ++line_number;
      std::smatch m;
      if (IsFence(line)) {
        fenced = !fenced;
        continue;
      }
      if (fenced) {
        std::string bad_sub;
        const std::string program = OurCommand(line, &bad_sub).first;
        if (!program.empty()) context = program;
        continue;
      }
      if (std::regex_search(line, m, heading) && programs.help.count(m[1].str()) != 0) {
        context = m[1].str();
      }
      if (line.rfind("|", 0) != 0) {
        in_table = false;
        continue;
      }
      if (!in_table) {  // the header
        in_table = true;
        table = std::regex_search(line, m, named_header) ? m[1].str()
                : line.rfind("| flag |", 0) == 0         ? context
                                                         : "";
        continue;
      }
      if (table.empty() || !std::regex_search(line, m, row)) continue;
      ++rows;
      ASSERT_EQ(programs.help.count(table), 1u) << doc.name << ":" << line_number << ": " << table;
      const std::string help =
          programs.help.at(table) + "\n" + programs.help.at(table.substr(0, table.find(' ')));
      EXPECT_TRUE(HelpHasFlag(help, m[1].str())) << doc.name << ":" << line_number << ": " << m[1]
                                                 << " is not in `" << table << " --help`";
    }
  }
  EXPECT_GT(rows, 30);
}

// The field at `path` ("model.moe.top_k") of JobSpec, walking message-typed fields; null when
// there is none.
const google::protobuf::FieldDescriptor* SpecField(const std::string& path) {
  const google::protobuf::Descriptor* message = v1::JobSpec::descriptor();
  const google::protobuf::FieldDescriptor* field = nullptr;
  for (const absl::string_view segment : absl::StrSplit(path, '.')) {
    if (message == nullptr) return nullptr;
    field = message->FindFieldByName(std::string(segment));
    if (field == nullptr) return nullptr;
    message = field->message_type();
  }
  return field;
}

// Dotted paths that begin with a message field of JobSpec ("train.fp8.recipe"), in backticks.
TEST(DocsClaimsTest, SpecPathsAreJobSpecFields) {
  std::string roots;
  const google::protobuf::Descriptor* spec = v1::JobSpec::descriptor();
  for (int i = 0; i < spec->field_count(); ++i) {
    if (spec->field(i)->message_type() == nullptr) continue;
    absl::StrAppend(&roots, roots.empty() ? "" : "|", spec->field(i)->name());
  }
  const std::regex path("(^|[^A-Za-z0-9_./-])((" + roots + R"()(\.[A-Za-z_][A-Za-z0-9_]*)+))");
  int checked = 0;
  for (const Doc& doc : Docs()) {
    for (const Code& code : doc.code) {
      for (std::sregex_iterator it(code.text.begin(), code.text.end(), path), end; it != end;
           ++it) {
        const std::string name = (*it)[2].str();
        const size_t after = it->position(2) + name.size();
        // A file name (`parallel.md`, `model.safetensors.index.json`) or a Hugging Face tensor
        // name (`model.layers.{L}`).
        if (after < code.text.size() && (code.text[after] == '.' || code.text[after] == '{')) {
          continue;
        }
        if (kFileExtensions.count(name.substr(name.rfind('.') + 1)) != 0) continue;
        if (kNotSpecPaths.count(name) != 0) continue;
        if (std::any_of(kHuggingFacePrefixes.begin(), kHuggingFacePrefixes.end(),
                        [&](const std::string& p) { return name.rfind(p, 0) == 0; })) {
          continue;
        }
        ++checked;
        EXPECT_NE(SpecField(name), nullptr)
            << code.where << ": `" << code.text << "`: " << name << " is not a field of "
            << spec->full_name() << " (proto/moetrain/v1/job.proto)";
      }
    }
  }
  EXPECT_GT(checked, 50);
}

// docs/job-spec.md's tables under "### `model.moe`" (or "### Top level") list that message's
// fields, one row each.
TEST(DocsClaimsTest, JobSpecTablesListRealFields) {
  const Doc& doc = *std::find_if(Docs().begin(), Docs().end(),
                                 [](const Doc& d) { return d.name == "docs/job-spec.md"; });
  static const std::regex heading(R"(^#{2,4} (?:`([a-z_.]+)`|(Top level))\s*$)");
  static const std::regex row(R"(^\| `([A-Za-z0-9_]+)` \|)");
  const google::protobuf::Descriptor* message = nullptr;
  std::string section;
  int rows = 0, line_number = 0;
  std::istringstream lines(doc.text);
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    std::smatch m;
    if (line.rfind("#", 0) == 0) {
      message = nullptr;
      if (!std::regex_search(line, m, heading)) continue;
      section = m[1].matched ? m[1].str() : "";
      if (section.empty()) {
        message = v1::JobSpec::descriptor();
        continue;
      }
      const google::protobuf::FieldDescriptor* field = SpecField(section);
      EXPECT_TRUE(field != nullptr && field->message_type() != nullptr)
          << doc.name << ":" << line_number << ": the section " << section
          << " is not a message field of JobSpec";
      if (field != nullptr) message = field->message_type();
      continue;
    }
    if (message == nullptr || !std::regex_search(line, m, row)) continue;
    ++rows;
    EXPECT_NE(message->FindFieldByName(m[1].str()), nullptr)
        << doc.name << ":" << line_number << ": " << m[1] << " is not a field of "
        << message->full_name() << " (section " << (section.empty() ? "Top level" : section) << ")";
  }
  EXPECT_GT(rows, 60);
}

// `path` without its placeholder tail: up to the first part with <, {, *, … or "...".
std::string WithoutPlaceholders(const std::string& path) {
  std::string kept;
  for (const absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.find_first_of("<{*") != absl::string_view::npos ||
        part.find("…") != absl::string_view::npos || part.find("...") != absl::string_view::npos) {
      break;
    }
    absl::StrAppend(&kept, kept.empty() ? "" : "/", part);
  }
  while (!kept.empty() && std::string(".,:;)").find(kept.back()) != std::string::npos) {
    kept.pop_back();
  }
  return kept;
}

TEST(DocsClaimsTest, RepositoryPathsExist) {
  const std::regex path(std::string(R"((^|[\s`(\["'])((?:)") + kRepoDirs +
                        R"()/[A-Za-z0-9_./<>{}*…+-]*))");
  static const std::regex link(R"(\]\(([^)#\s]*)(#[^)]*)?\))");
  int checked = 0;
  for (const Doc& doc : Docs()) {
    for (std::sregex_iterator it(doc.text.begin(), doc.text.end(), path), end; it != end; ++it) {
      const std::string kept = WithoutPlaceholders((*it)[2].str());
      if (kNotRepoPaths.count(kept) != 0) continue;
      ++checked;
      EXPECT_TRUE(fs::exists(kRepo / kept)) << doc.Where(it->position(2)) << ": " << (*it)[2]
                                            << ": " << kept << " is not in the repository";
    }
    for (std::sregex_iterator it(doc.text.begin(), doc.text.end(), link), end; it != end; ++it) {
      const std::string target = (*it)[1].str();
      if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) continue;
      ++checked;
      const fs::path resolved = (kRepo / doc.name).parent_path() / target;
      EXPECT_TRUE(fs::exists(resolved))
          << doc.Where(it->position()) << ": the link " << target << " leads nowhere";
      // An anchor into a doc names one of its headings.
      const std::string anchor = (*it)[2].matched ? (*it)[2].str().substr(1) : "";
      if (anchor.empty() || !(target.empty() || resolved.extension() == ".md")) continue;
      const std::string linked =
          target.empty() ? doc.name : fs::relative(resolved, kRepo).lexically_normal().string();
      const auto found = std::find_if(Docs().begin(), Docs().end(),
                                      [&](const Doc& d) { return d.name == linked; });
      if (found == Docs().end()) continue;  // not a doc this test reads
      EXPECT_EQ(HeadingAnchors(*found).count(anchor), 1u)
          << doc.Where(it->position()) << ": the link " << target << "#" << anchor << ": " << linked
          << " has no heading with that anchor";
    }
  }
  EXPECT_GT(checked, 50);
}

// The names of the tests: every file under tests/ (by stem) and every add_test or
// moetrain_node_test name in tests' CMake files; and the names of the files under tests/ and
// deploy/ ("rules_test.yml").
std::set<std::string> TestNames() {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(kRepo / "deploy")) {
    if (entry.is_regular_file()) names.insert(entry.path().filename().string());
  }
  static const std::regex added(R"((?:add_test\(NAME|moetrain_node_test\()\s*([A-Za-z0-9_]+))");
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(kRepo / "tests")) {
    if (!entry.is_regular_file()) continue;
    names.insert(entry.path().stem().string());
    names.insert(entry.path().filename().string());
    if (entry.path().filename() != "CMakeLists.txt") continue;
    const std::string text = ReadFile(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), added), end; it != end; ++it) {
      names.insert((*it)[1].str());
    }
  }
  return names;
}

TEST(DocsClaimsTest, NamedTestsExist) {
  const std::set<std::string> names = TestNames();
  // A name, or a file name when an extension follows ("cli_test.cc", "rules_test.yml").
  static const std::regex test(R"(\b([a-z0-9][a-z0-9_]*_test(\.[a-z]+)?)\b)");
  int checked = 0;
  for (const Doc& doc : Docs()) {
    for (std::sregex_iterator it(doc.text.begin(), doc.text.end(), test), end; it != end; ++it) {
      ++checked;
      EXPECT_EQ(names.count((*it)[1].str()), 1u)
          << doc.Where(it->position()) << ": no test is named " << (*it)[1];
    }
  }
  EXPECT_GT(checked, 10);
}

// Every MOETRAIN_* name the docs mention (an environment variable, a CMake option, a macro) occurs
// in the sources, scripts or deployment files.
TEST(DocsClaimsTest, NamedMoetrainVariablesExist) {
  std::string sources;
  for (const char* dir : {"bench", "client", "cmake", "deploy", "engine", "examples", "proto",
                          "scripts", "server", "tests", "worker"}) {
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(kRepo / dir)) {
      if (entry.is_regular_file() && entry.file_size() < (1 << 20)) {
        sources += ReadFile(entry.path());
      }
    }
  }
  sources += ReadFile(kRepo / "CMakeLists.txt") + ReadFile(kRepo / "Makefile");
  static const std::regex name(R"((^|[^A-Za-z0-9_]|-D)(MOETRAIN_[A-Z0-9_]+))");
  int checked = 0;
  for (const Doc& doc : Docs()) {
    for (std::sregex_iterator it(doc.text.begin(), doc.text.end(), name), end; it != end; ++it) {
      ++checked;
      EXPECT_NE(sources.find((*it)[2].str()), std::string::npos)
          << doc.Where(it->position(2)) << ": " << (*it)[2] << " occurs nowhere in the sources";
    }
  }
  EXPECT_GT(checked, 10);
}

}  // namespace
}  // namespace moetrain

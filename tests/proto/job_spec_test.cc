#include "moetrain/v1/job_spec.h"

#include <google/protobuf/util/message_differencer.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/testing.h"

namespace moetrain {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// The repository root, from this file's path (tests/proto/job_spec_test.cc).
std::filesystem::path RepoRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

// The parse error of `yaml`, or a failure when it parses.
std::string YamlError(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_FALSE(spec.ok()) << "parsed:\n" << yaml;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

// The validation error of `yaml` (which must parse), or a failure when it validates.
std::string ValidationError(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat("name: t\n", yaml));
  EXPECT_TRUE(spec.ok()) << spec.status();
  if (!spec.ok()) return "";
  const absl::Status status = ValidateJobSpec(*spec);
  EXPECT_FALSE(status.ok()) << "validated:\n" << yaml;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

v1::JobSpec Resolved(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(spec.ok() ? *spec : v1::JobSpec());
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  return resolved.ok() ? *resolved : v1::JobSpec();
}

void ExpectRoundTrips(const v1::JobSpec& spec) {
  const std::string yaml = JobSpecToYaml(spec);
  absl::StatusOr<v1::JobSpec> from_yaml = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status() << "\n" << yaml;
  EXPECT_TRUE(MessageDifferencer::Equals(*from_yaml, spec)) << yaml;

  const std::string json = JobSpecToJson(spec);
  absl::StatusOr<v1::JobSpec> from_json = ParseJobSpecJson(json);
  ASSERT_TRUE(from_json.ok()) << from_json.status() << "\n" << json;
  EXPECT_TRUE(MessageDifferencer::Equals(*from_json, spec)) << json;
}

// --- Examples ----------------------------------------------------------------------------------

TEST(JobSpecExamplesTest, TinyMoeLoadsValidatesAndRoundTrips) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(RepoRoot() / "examples/tiny-moe.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectRoundTrips(*spec);

  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ExpectRoundTrips(*resolved);
  EXPECT_EQ(resolved->name(), "tiny-moe");
  EXPECT_EQ(resolved->model().hidden_size(), 128);
  EXPECT_EQ(resolved->model().num_kv_heads(), 2);
  EXPECT_EQ(resolved->model().head_dim(), 32);
  EXPECT_EQ(resolved->model().moe().num_experts(), 8);
  EXPECT_EQ(resolved->model().moe().top_k(), 2);
  EXPECT_EQ(resolved->data().synthetic_vocab_size(), 64);
  EXPECT_EQ(resolved->train().steps(), 300);
  EXPECT_EQ(resolved->train().micro_batch_size(), 16);
  EXPECT_FLOAT_EQ(resolved->train().optimizer().lr(), 1e-3f);
  EXPECT_EQ(resolved->checkpoint().every_steps(), 100);
}

TEST(JobSpecExamplesTest, TinyMoeOnFourWorkersIsTinyMoeSplitOverFourRanks) {
  absl::StatusOr<v1::JobSpec> one = LoadJobSpecFile(RepoRoot() / "examples/tiny-moe.yaml");
  absl::StatusOr<v1::JobSpec> four =
      LoadJobSpecFile(RepoRoot() / "examples/tiny-moe-4-workers.yaml");
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(four.ok()) << four.status();
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*four);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->parallel().expert_parallel(), 2);
  EXPECT_EQ(resolved->parallel().data_parallel(), 2);
  EXPECT_EQ(resolved->train().micro_batch_size(), 4);  // 16 sequences over 4 ranks
  // The same job but for its name and where it runs.
  v1::JobSpec same = *four;
  same.set_name(one->name());
  *same.mutable_resources() = one->resources();
  same.clear_parallel();  // tiny-moe leaves it out
  EXPECT_FALSE(one->has_parallel());
  EXPECT_EQ(same.SerializeAsString(), one->SerializeAsString());
}

TEST(JobSpecExamplesTest, DeepSeekV3MiniLoadsValidatesAndRoundTrips) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(RepoRoot() / "examples/deepseek-v3-mini.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectRoundTrips(*spec);

  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ExpectRoundTrips(*resolved);
  const v1::MoeConfig& moe = resolved->model().moe();
  EXPECT_EQ(moe.score_function(), v1::MoeConfig::SIGMOID);
  EXPECT_TRUE(moe.expert_bias());
  EXPECT_EQ(moe.num_experts(), 16);
  EXPECT_EQ(moe.top_k(), 4);
  EXPECT_EQ(moe.num_groups(), 4);
  EXPECT_EQ(moe.group_top_k(), 2);
  EXPECT_EQ(moe.num_shared_experts(), 1);
  EXPECT_FLOAT_EQ(moe.routed_scaling_factor(), 2.5f);
  EXPECT_TRUE(moe.normalize_topk_weights());
  EXPECT_EQ(moe.aux_loss(), v1::MoeConfig::SEQUENCE);
  EXPECT_FLOAT_EQ(moe.aux_loss_coeff(), 1e-4f);
  EXPECT_EQ(resolved->model().first_dense_layers(), 1);
  // Multi-head Latent Attention and one MTP module, as DeepSeek-V3.
  EXPECT_EQ(resolved->model().attention(), v1::ModelConfig::MLA);
  EXPECT_EQ(resolved->model().mla().q_lora_rank(), 96);
  EXPECT_EQ(resolved->model().mla().kv_lora_rank(), 64);
  EXPECT_EQ(resolved->model().mtp_depth(), 1);
  EXPECT_EQ(resolved->train().precision(), v1::TrainConfig::BF16);
  // One rank, so that `moetrain run` trains it in-process.
  EXPECT_EQ(resolved->resources().workers(), 1);
  EXPECT_EQ(resolved->parallel().data_parallel(), 1);
  EXPECT_EQ(resolved->parallel().expert_parallel(), 1);
  EXPECT_EQ(resolved->data().seed(), 42u);  // from train.seed
}

TEST(JobSpecExamplesTest, YamlAndJsonOfTheSameSpecAgree) {
  absl::StatusOr<v1::JobSpec> yaml = ParseJobSpecYaml(R"(
name: same
model: {hidden_size: 64, moe: {top_k: 1, score_function: SIGMOID}}
train: {optimizer: {lr: 0.001}, skip_nonfinite_steps: true}
)");
  absl::StatusOr<v1::JobSpec> json = ParseJobSpecJson(R"({
  "name": "same",
  "model": {"hidden_size": 64, "moe": {"top_k": 1, "score_function": "SIGMOID"}},
  "train": {"optimizer": {"lr": 0.001}, "skip_nonfinite_steps": true}
})");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*yaml, *json));
}

TEST(JobSpecExamplesTest, YamlPrintsFloatsShortAndEnumsByName) {
  const v1::JobSpec spec = Resolved("name: floats\n");
  const std::string yaml = JobSpecToYaml(spec);
  EXPECT_THAT(yaml, HasSubstr("rms_norm_eps: 1e-06"));
  EXPECT_THAT(yaml, HasSubstr("init_std: 0.02"));
  EXPECT_THAT(yaml, HasSubstr("rope_theta: 10000"));
  EXPECT_THAT(yaml, HasSubstr("lr: 0.0003"));
  EXPECT_THAT(yaml, HasSubstr("score_function: SOFTMAX"));
  EXPECT_THAT(yaml, HasSubstr("name: \"floats\""));
  ExpectRoundTrips(spec);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// The fenced ```yaml block after `heading` in docs/job-spec.md.
std::string DocYamlBlock(absl::string_view heading) {
  const std::string doc = ReadFile(RepoRoot() / "docs/job-spec.md");
  const size_t section = doc.find(std::string(heading));
  if (section == std::string::npos) return "";
  const size_t begin = doc.find("```yaml\n", section);
  if (begin == std::string::npos) return "";
  const size_t end = doc.find("```\n", begin + 8);
  return doc.substr(begin + 8, end - begin - 8);
}

TEST(JobSpecDocsTest, FullExampleIsValidAndStatesEveryField) {
  const std::string yaml = DocYamlBlock("## A full example");
  ASSERT_FALSE(yaml.empty());
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  // Nothing was left for ApplyDefaults to fill.
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, *resolved));
}

// Every field of the schema has a row in the docs' tables.
void ExpectDocumented(const google::protobuf::Descriptor* message, const std::string& doc) {
  for (int i = 0; i < message->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = message->field(i);
    EXPECT_THAT(doc, HasSubstr(absl::StrCat("| `", field->name(), "` |")))
        << message->full_name() << "." << field->name() << " is not in docs/job-spec.md";
    if (field->message_type() != nullptr) ExpectDocumented(field->message_type(), doc);
  }
}

TEST(JobSpecDocsTest, EveryFieldIsDocumented) {
  ExpectDocumented(v1::JobSpec::descriptor(), ReadFile(RepoRoot() / "docs/job-spec.md"));
}

TEST(JobSpecDocsTest, SmallestSpecIsValid) {
  const std::string yaml = DocYamlBlock("# The job spec");
  EXPECT_EQ(yaml, "name: hello\n");
  EXPECT_EQ(Resolved(yaml).name(), "hello");
}

// --- Parse errors ------------------------------------------------------------------------------

TEST(JobSpecParseTest, UnknownFieldsAreNamedAtEveryDepth) {
  EXPECT_THAT(YamlError("nmae: x\n"), HasSubstr("unknown field nmae (did you mean name?)"));
  EXPECT_THAT(YamlError("model:\n  hiden_size: 64\n"),
              HasSubstr("unknown field model.hiden_size (did you mean hidden_size?)"));
  EXPECT_THAT(YamlError("model:\n  moe:\n    topk: 4\n"),
              HasSubstr("unknown field model.moe.topk (did you mean top_k?) (line 3, column 5)"));
  // Nothing close: the message lists the fields there are.
  EXPECT_THAT(YamlError("train:\n  optimizer:\n    momentum: 0.9\n"),
              HasSubstr("unknown field train.optimizer.momentum (train.optimizer has lr, min_lr"));
  EXPECT_THAT(YamlError("train:\n  fp8:\n    recipie: BLOCKWISE\n"),
              HasSubstr("unknown field train.fp8.recipie (did you mean recipe?)"));
}

TEST(JobSpecParseTest, WrongTypesNameThePathAndTheValue) {
  EXPECT_THAT(YamlError("model:\n  moe:\n    top_k: abc\n"),
              HasSubstr("model.moe.top_k: expected an integer, got 'abc' (line 3, column 12)"));
  EXPECT_THAT(YamlError("train:\n  steps: 2.5\n"),
              HasSubstr("train.steps: expected an integer, got '2.5'"));
  EXPECT_THAT(YamlError("model:\n  tie_embeddings: yes\n"),
              HasSubstr("model.tie_embeddings: expected true or false, got 'yes'"));
  EXPECT_THAT(YamlError("model:\n  rope_theta: fast\n"),
              HasSubstr("model.rope_theta: expected a number, got 'fast'"));
  EXPECT_THAT(YamlError("model:\n  rope_theta: .inf\n"),
              HasSubstr("model.rope_theta: expected a number, got '.inf'"));
  EXPECT_THAT(YamlError("model: 5\n"), HasSubstr("model: expected a mapping, got '5'"));
  EXPECT_THAT(YamlError("train:\n  steps: {a: 1}\n"),
              HasSubstr("train.steps: expected an integer, got a mapping"));
  EXPECT_THAT(YamlError("name: [a, b]\n"), HasSubstr("name: expected a string, got a sequence"));
  EXPECT_THAT(YamlError("- a\n- b\n"),
              HasSubstr("the job spec: expected a mapping, got a sequence"));
  EXPECT_THAT(YamlError("model:\n  vocab_size: 99999999999999999999\n"),
              HasSubstr("model.vocab_size: 99999999999999999999 is out of range for a 64-bit "
                        "integer"));
  EXPECT_THAT(YamlError("train:\n  seed: -1\n"),
              HasSubstr("train.seed: -1 is out of range for a 64-bit unsigned integer"));
  EXPECT_THAT(YamlError("model:\n  init_std: 1e39\n"),
              HasSubstr("model.init_std: 1e39 is out of range"));
}

TEST(JobSpecParseTest, BadEnumNamesListTheValues) {
  EXPECT_THAT(YamlError("model:\n  moe:\n    score_function: softmx\n"),
              HasSubstr("model.moe.score_function: expected one of SOFTMAX, SIGMOID, got "
                        "'softmx'"));
  EXPECT_THAT(YamlError("resources:\n  device: tpu\n"),
              HasSubstr("resources.device: expected one of CPU, CUDA, got 'tpu'"));
  // Numbers are not accepted for enums: a name says what it means.
  EXPECT_THAT(YamlError("train:\n  precision: 1\n"),
              HasSubstr("train.precision: expected one of FP32, BF16, FP8, got '1'"));
}

TEST(JobSpecParseTest, YamlSyntaxErrorsGiveLineAndColumn) {
  EXPECT_THAT(YamlError("name: x\nmodel:\n  moe: [1, 2\n"),
              testing::AllOf(HasSubstr("YAML syntax error"), HasSubstr("line ")));
  EXPECT_THAT(YamlError("name: x\nmodel:\n  hidden_size: 64\n   vocab_size: 3\n"),
              testing::AllOf(HasSubstr("YAML syntax error"), HasSubstr("(line 4, column")));
  EXPECT_THAT(YamlError("name: x\nmodel: b: c\n"),
              HasSubstr("YAML syntax error: illegal map value (line 2, column 9)"));
  EXPECT_THAT(YamlError("name: a\n---\nname: b\n"),
              HasSubstr("expected one YAML document, got more"));
}

TEST(JobSpecParseTest, DuplicateKeysAreErrors) {
  EXPECT_THAT(YamlError("name: a\nname: b\n"),
              HasSubstr("duplicate field name (line 2, column 1)"));
  // The proto name and the JSON name are the same field.
  EXPECT_THAT(YamlError("model:\n  moe:\n    top_k: 2\n    topK: 3\n"),
              HasSubstr("duplicate field model.moe.top_k"));
  absl::StatusOr<v1::JobSpec> json = ParseJobSpecJson(R"({"name": "a", "name": "b"})");
  ASSERT_FALSE(json.ok());
  EXPECT_THAT(std::string(json.status().message()), HasSubstr("duplicate field name"));
}

TEST(JobSpecParseTest, JsonErrors) {
  absl::StatusOr<v1::JobSpec> syntax = ParseJobSpecJson("{\n  \"name\": \"a\",\n  \"model\": {\n}");
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(syntax.status().message()),
              testing::AllOf(StartsWith("JSON syntax error"), HasSubstr("line 4")));

  absl::StatusOr<v1::JobSpec> unknown = ParseJobSpecJson(R"({"model": {"moe": {"topk": 2}}})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown field model.moe.topk"));

  absl::StatusOr<v1::JobSpec> type = ParseJobSpecJson(R"({"model": {"moe": {"top_k": "abc"}}})");
  ASSERT_FALSE(type.ok());
  EXPECT_THAT(std::string(type.status().message()),
              HasSubstr("model.moe.top_k: expected an integer, got 'abc'"));

  absl::StatusOr<v1::JobSpec> top = ParseJobSpecJson("[1]");
  ASSERT_FALSE(top.ok());
  EXPECT_THAT(std::string(top.status().message()), HasSubstr("expected a mapping, got a sequence"));
}

TEST(JobSpecParseTest, LenientWhereTheMeaningIsClear) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(R"(
name: 2024          # a plain number is still a string for a string field
model:
  moe:
    topK: "4"       # the JSON name, and a quoted number
    score_function: sigmoid
train:
  steps: 1e4        # an integral number in exponent form
  seed: 18446744073709551615
resources:
  device: cuda
checkpoint:         # null, as in the JSON mapping: unset
restart:
  max_restarts:     # the same for a scalar
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "2024");
  EXPECT_EQ(spec->model().moe().top_k(), 4);
  EXPECT_EQ(spec->model().moe().score_function(), v1::MoeConfig::SIGMOID);
  EXPECT_EQ(spec->train().steps(), 10000);
  EXPECT_EQ(spec->train().seed(), 18446744073709551615u);
  EXPECT_EQ(spec->resources().device(), v1::ResourceConfig::CUDA);
  EXPECT_FALSE(spec->has_checkpoint());
  EXPECT_TRUE(spec->has_restart());
  EXPECT_FALSE(spec->restart().has_max_restarts());
}

TEST(JobSpecParseTest, EmptyDocumentIsAllDefaults) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("# nothing\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, v1::JobSpec()));
}

// --- Files -------------------------------------------------------------------------------------

TEST(JobSpecFileTest, ExtensionsAndErrors) {
  const testutil::TempDir temp_dir("job_spec_test");
  const std::filesystem::path& dir = temp_dir.path();
  const std::string json_path = dir / "spec.JSON";
  std::ofstream(json_path) << R"({"name": "from-json", "train": {"steps": 5}})";
  absl::StatusOr<v1::JobSpec> json = LoadJobSpecFile(json_path);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->name(), "from-json");
  EXPECT_EQ(json->train().steps(), 5);

  const std::string yml_path = dir / "bad.yml";
  std::ofstream(yml_path) << "name: x\nmodel:\n  moe:\n    top_k: abc\n";
  absl::StatusOr<v1::JobSpec> bad = LoadJobSpecFile(yml_path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              testing::AllOf(StartsWith(yml_path + ": "), HasSubstr("model.moe.top_k")));

  absl::StatusOr<v1::JobSpec> missing = LoadJobSpecFile(dir / "missing.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  std::filesystem::create_directories(dir / "dir.yaml");
  EXPECT_EQ(LoadJobSpecFile(dir / "dir.yaml").status().code(), absl::StatusCode::kInvalidArgument);

  absl::StatusOr<v1::JobSpec> extension = LoadJobSpecFile(dir / "spec.toml");
  EXPECT_EQ(extension.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(extension.status().message()), HasSubstr(".yaml, .yml or .json"));
}

// --- Defaults ----------------------------------------------------------------------------------

TEST(JobSpecDefaultsTest, OmittedFieldsGetTheDocumentedDefaults) {
  const v1::JobSpec spec = Resolved("name: defaults\n");
  const v1::ModelConfig& model = spec.model();
  EXPECT_EQ(model.vocab_size(), 256);
  EXPECT_EQ(model.hidden_size(), 256);
  EXPECT_EQ(model.num_layers(), 4);
  EXPECT_EQ(model.num_heads(), 4);
  EXPECT_EQ(model.num_kv_heads(), 4);
  EXPECT_EQ(model.head_dim(), 64);
  EXPECT_EQ(model.ffn_dim(), 1024);
  EXPECT_EQ(model.first_dense_layers(), 1);
  EXPECT_EQ(model.max_seq_len(), 256);
  EXPECT_FLOAT_EQ(model.rope_theta(), 10000.0f);
  EXPECT_FLOAT_EQ(model.rms_norm_eps(), 1e-6f);
  EXPECT_FALSE(model.tie_embeddings());
  EXPECT_FLOAT_EQ(model.init_std(), 0.02f);

  const v1::MoeConfig& moe = model.moe();
  EXPECT_EQ(moe.num_experts(), 8);
  EXPECT_EQ(moe.top_k(), 2);
  EXPECT_EQ(moe.expert_ffn_dim(), 1024);
  EXPECT_EQ(moe.num_shared_experts(), 0);
  EXPECT_EQ(moe.score_function(), v1::MoeConfig::SOFTMAX);
  EXPECT_TRUE(moe.softmax_before_topk());
  EXPECT_TRUE(moe.normalize_topk_weights());
  EXPECT_FLOAT_EQ(moe.routed_scaling_factor(), 1.0f);
  EXPECT_EQ(moe.num_groups(), 1);
  EXPECT_EQ(moe.group_top_k(), 1);
  EXPECT_FALSE(moe.expert_bias());
  EXPECT_FLOAT_EQ(moe.expert_bias_update_rate(), 1e-3f);
  EXPECT_EQ(moe.aux_loss(), v1::MoeConfig::NONE);
  EXPECT_EQ(moe.aux_loss_coeff(), 0.0f);
  EXPECT_EQ(moe.z_loss_coeff(), 0.0f);
  EXPECT_EQ(moe.capacity_factor(), 0.0f);
  EXPECT_EQ(moe.drop_policy(), v1::MoeConfig::PROBABILITY);

  EXPECT_EQ(spec.data().format(), v1::DataConfig::SYNTHETIC);
  EXPECT_EQ(spec.data().synthetic_vocab_size(), 256);
  EXPECT_EQ(spec.data().eval_fraction(), 0.0f);
  EXPECT_EQ(spec.data().seed(), 0u);

  const v1::TrainConfig& train = spec.train();
  EXPECT_EQ(train.steps(), 1000);
  EXPECT_EQ(train.batch_size(), 8);
  EXPECT_EQ(train.micro_batch_size(), 8);
  EXPECT_EQ(train.seq_len(), 256);
  EXPECT_EQ(train.precision(), v1::TrainConfig::FP32);
  EXPECT_EQ(train.fp8().recipe(), v1::Fp8Recipe::DELAYED);
  EXPECT_EQ(train.fp8().format(), v1::Fp8Recipe::HYBRID);
  EXPECT_EQ(train.fp8().amax_history_len(), 1024);
  EXPECT_EQ(train.fp8().margin(), 0);
  EXPECT_EQ(train.fp8().amax_compute_algo(), v1::Fp8Recipe::MAX);
  EXPECT_FALSE(train.fp8().has_power_2_scales());  // DELAYED does not read it
  EXPECT_EQ(train.fp8().amax_epsilon(), 0.0f);
  EXPECT_FALSE(train.fp8().fp8_dispatch());
  EXPECT_FLOAT_EQ(train.optimizer().lr(), 3e-4f);
  EXPECT_EQ(train.optimizer().min_lr(), 0.0f);
  EXPECT_EQ(train.optimizer().warmup_steps(), 0);
  EXPECT_EQ(train.optimizer().decay(), v1::OptimizerConfig::COSINE);
  EXPECT_FLOAT_EQ(train.optimizer().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(train.optimizer().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(train.optimizer().eps(), 1e-8f);
  EXPECT_FLOAT_EQ(train.optimizer().weight_decay(), 0.1f);
  EXPECT_FLOAT_EQ(train.optimizer().grad_clip(), 1.0f);
  EXPECT_EQ(train.seed(), 0u);
  EXPECT_EQ(train.log_every(), 10);
  EXPECT_EQ(train.eval_every(), 0);
  EXPECT_EQ(train.eval_batches(), 8);
  EXPECT_FALSE(train.skip_nonfinite_steps());

  EXPECT_EQ(spec.checkpoint().dir(), "");
  EXPECT_EQ(spec.checkpoint().every_steps(), 0);
  EXPECT_EQ(spec.checkpoint().keep_last(), 3);
  EXPECT_EQ(spec.resources().workers(), 1);
  EXPECT_EQ(spec.resources().device(), v1::ResourceConfig::CPU);
  EXPECT_EQ(spec.resources().devices_per_worker(), 1);
  EXPECT_EQ(spec.parallel().expert_parallel(), 1);
  EXPECT_EQ(spec.parallel().data_parallel(), 1);
  EXPECT_EQ(spec.restart().max_restarts(), 3);
}

// Each recipe gets the defaults of the fields it reads and no others, so the resolved spec
// validates again (the coordinator stores it resolved, and the worker resolves it once more), and
// prints and parses back.
TEST(JobSpecDefaultsTest, EachFp8RecipeGetsItsOwnDefaults) {
  const v1::JobSpec delayed = Resolved("name: d\ntrain: {precision: FP8}\n");
  EXPECT_EQ(delayed.train().fp8().amax_history_len(), 1024);
  EXPECT_FALSE(delayed.train().fp8().has_power_2_scales());

  const v1::JobSpec current =
      Resolved("name: c\ntrain: {precision: FP8, fp8: {recipe: current}}\n");
  EXPECT_EQ(current.train().fp8().recipe(), v1::Fp8Recipe::CURRENT);
  EXPECT_EQ(current.train().fp8().format(), v1::Fp8Recipe::HYBRID);
  EXPECT_FALSE(current.train().fp8().has_amax_history_len());
  ASSERT_TRUE(current.train().fp8().has_power_2_scales());
  EXPECT_FALSE(current.train().fp8().power_2_scales());

  const v1::JobSpec blockwise =
      Resolved("name: b\ntrain: {precision: FP8, fp8: {recipe: BLOCKWISE}}\n");
  EXPECT_EQ(blockwise.train().fp8().format(), v1::Fp8Recipe::HYBRID);
  EXPECT_FALSE(blockwise.train().fp8().has_amax_history_len());
  ASSERT_TRUE(blockwise.train().fp8().has_power_2_scales());
  EXPECT_TRUE(blockwise.train().fp8().power_2_scales());
  // An explicit false is kept.
  const v1::JobSpec exact = Resolved(
      "name: b\ntrain: {precision: FP8, fp8: {recipe: BLOCKWISE, power_2_scales: false}}\n");
  ASSERT_TRUE(exact.train().fp8().has_power_2_scales());
  EXPECT_FALSE(exact.train().fp8().power_2_scales());

  const v1::JobSpec mxfp8 = Resolved("name: m\ntrain: {precision: FP8, fp8: {recipe: MXFP8}}\n");
  EXPECT_FALSE(mxfp8.train().fp8().has_amax_history_len());
  EXPECT_FALSE(mxfp8.train().fp8().has_power_2_scales());

  for (const v1::JobSpec& spec : {delayed, current, blockwise, exact, mxfp8}) {
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
    v1::JobSpec again = spec;
    ApplyDefaults(&again);
    EXPECT_TRUE(MessageDifferencer::Equals(again, spec)) << spec.train().fp8().DebugString();
    ExpectRoundTrips(spec);
  }
  // The printed spec states the recipe and its options.
  const std::string yaml = JobSpecToYaml(blockwise);
  EXPECT_THAT(yaml, HasSubstr("recipe: BLOCKWISE"));
  EXPECT_THAT(yaml, HasSubstr("power_2_scales: true"));
  EXPECT_THAT(yaml, HasSubstr("amax_epsilon: 0"));
  EXPECT_THAT(yaml, HasSubstr("fp8_dispatch: false"));
  EXPECT_THAT(yaml, Not(HasSubstr("amax_history_len")));
}

TEST(JobSpecDefaultsTest, ExplicitZeroIsNotUnset) {
  const v1::JobSpec spec = Resolved(R"(
name: zeros
model:
  first_dense_layers: 0
  moe: {softmax_before_topk: false, normalize_topk_weights: false}
data: {seed: 0}
train: {seed: 7, optimizer: {grad_clip: 0, weight_decay: 0}}
checkpoint: {keep_last: 0}
restart: {max_restarts: 0}
)");
  EXPECT_EQ(spec.model().first_dense_layers(), 0);
  EXPECT_FALSE(spec.model().moe().softmax_before_topk());
  EXPECT_FALSE(spec.model().moe().normalize_topk_weights());
  EXPECT_EQ(spec.data().seed(), 0u);  // not train.seed
  EXPECT_EQ(spec.train().optimizer().grad_clip(), 0.0f);
  EXPECT_EQ(spec.train().optimizer().weight_decay(), 0.0f);
  EXPECT_EQ(spec.checkpoint().keep_last(), 0);
  EXPECT_EQ(spec.restart().max_restarts(), 0);

  EXPECT_EQ(Resolved("name: x\ntrain: {seed: 7}\n").data().seed(), 7u);
}

TEST(JobSpecDefaultsTest, DerivedValuesFollowWhatIsSet) {
  // seq_len and max_seq_len: either one sets the other.
  v1::JobSpec spec = Resolved("name: x\ntrain: {seq_len: 64}\n");
  EXPECT_EQ(spec.model().max_seq_len(), 64);
  spec = Resolved("name: x\nmodel: {max_seq_len: 512}\n");
  EXPECT_EQ(spec.train().seq_len(), 512);
  spec = Resolved("name: x\nmodel: {max_seq_len: 512}\ntrain: {seq_len: 128}\n");
  EXPECT_EQ(spec.model().max_seq_len(), 512);
  EXPECT_EQ(spec.train().seq_len(), 128);

  spec = Resolved("name: x\nmodel: {num_heads: 8, hidden_size: 512}\n");
  EXPECT_EQ(spec.model().num_kv_heads(), 8);
  EXPECT_EQ(spec.model().head_dim(), 64);
  spec = Resolved("name: x\nmodel: {num_heads: 8, head_dim: 16}\n");
  EXPECT_EQ(spec.model().head_dim(), 16);

  spec = Resolved("name: x\nmodel: {vocab_size: 1000}\n");
  EXPECT_EQ(spec.data().synthetic_vocab_size(), 1000);

  spec = Resolved("name: x\nresources: {workers: 2}\ntrain: {batch_size: 16}\n");
  EXPECT_EQ(spec.parallel().data_parallel(), 2);
  EXPECT_EQ(spec.train().micro_batch_size(), 8);
  spec = Resolved(
      "name: x\nresources: {workers: 4}\nparallel: {expert_parallel: 2}\ntrain: {batch_size: "
      "16}\n");
  EXPECT_EQ(spec.parallel().data_parallel(), 2);
  EXPECT_EQ(spec.train().micro_batch_size(), 4);
}

// The real DeepSeek-V3 dimensions validate, and resolve to what the model card says.
TEST(JobSpecExamplesTest, DeepSeekV3FullSizeValidates) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(RepoRoot() / "examples/deepseek-v3-671b.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ExpectRoundTrips(*spec);
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  const v1::ModelConfig& model = resolved->model();
  EXPECT_EQ(model.vocab_size(), 129280);
  EXPECT_EQ(model.hidden_size(), 7168);
  EXPECT_EQ(model.num_layers(), 61);
  EXPECT_EQ(model.num_heads(), 128);
  EXPECT_EQ(model.attention(), v1::ModelConfig::MLA);
  EXPECT_EQ(model.mla().q_lora_rank(), 1536);
  EXPECT_EQ(model.mla().kv_lora_rank(), 512);
  EXPECT_EQ(model.mla().qk_nope_head_dim(), 128);
  EXPECT_EQ(model.mla().qk_rope_head_dim(), 64);
  EXPECT_EQ(model.mla().v_head_dim(), 128);
  EXPECT_EQ(model.mtp_depth(), 1);
  EXPECT_EQ(model.moe().num_experts(), 256);
  EXPECT_EQ(model.moe().top_k(), 8);
  EXPECT_EQ(model.moe().group_top_k(), 4);  // top_k / group_top_k = 2, as HF's DeepSeek-V3 code
  EXPECT_EQ(resolved->data().format(), v1::DataConfig::U32);
  EXPECT_EQ(resolved->resources().workers() * resolved->resources().devices_per_worker(), 2048);
  EXPECT_EQ(resolved->parallel().expert_parallel(), 64);
}

// MLA's and MTP's fields: defaults, and each refusal naming its field.
TEST(JobSpecValidateTest, MlaAndMtpFields) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecYaml("name: mla\nmodel: {attention: MLA, mtp_depth: 2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::JobSpec> resolved = ResolveJobSpec(*spec);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->model().mla().kv_lora_rank(), 512);
  EXPECT_EQ(resolved->model().mla().qk_rope_head_dim(), 64);
  EXPECT_FLOAT_EQ(resolved->model().mtp_loss_weight(), 0.1f);
  EXPECT_EQ(ValidationError("model: {attention: MLA, num_kv_heads: 2}"),
            "model.num_kv_heads = 2 applies only to model.attention = GQA (MLA's keys and values "
            "have model.num_heads heads); remove it");
  EXPECT_EQ(ValidationError("model: {attention: MLA, head_dim: 64}"),
            "model.head_dim = 64 applies only to model.attention = GQA; MLA's widths are "
            "model.mla.*");
  EXPECT_EQ(ValidationError("model: {attention: MLA, mla: {qk_rope_head_dim: 3}}"),
            "model.mla.qk_rope_head_dim = 3 must be even and at least 2 (RoPE rotates pairs of "
            "features)");
  EXPECT_EQ(ValidationError("model: {attention: MLA, mla: {v_head_dim: 300}}"),
            "model.mla.v_head_dim = 300 must be in [1, model.mla.qk_nope_head_dim + "
            "model.mla.qk_rope_head_dim = 192]");
  EXPECT_EQ(ValidationError("model: {mla: {kv_lora_rank: 8}}"),
            "model.mla is set but model.attention = GQA; set model.attention: MLA or remove "
            "model.mla");
  EXPECT_EQ(ValidationError("model: {mtp_depth: 9}"), "model.mtp_depth = 9 must be at most 8");
  EXPECT_EQ(ValidationError("model: {mtp_loss_weight: 0.5}"),
            "model.mtp_loss_weight = 0.5 has no effect with model.mtp_depth = 0; set "
            "model.mtp_depth or remove it");
}

TEST(JobSpecDefaultsTest, ApplyDefaultsIsIdempotentAndKeepsExplicitValues) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(RepoRoot() / "examples/deepseek-v3-mini.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec once = *spec;
  ApplyDefaults(&once);
  v1::JobSpec twice = once;
  ApplyDefaults(&twice);
  EXPECT_TRUE(MessageDifferencer::Equals(once, twice));
  EXPECT_EQ(once.train().micro_batch_size(), 4);
  EXPECT_EQ(once.restart().max_restarts(), 2);
}

// --- Validation --------------------------------------------------------------------------------

TEST(JobSpecValidateTest, ValidatesUnresolvedSpecsAsResolved) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("name: ok\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  EXPECT_FALSE(spec->model().has_vocab_size());  // the argument is not changed
}

TEST(JobSpecValidateTest, NameIsRequiredAndRestricted) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("model: {}\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_THAT(std::string(ValidateJobSpec(*spec).message()), HasSubstr("name is required"));
  spec = ParseJobSpecYaml("name: \"my job\"\n");
  ASSERT_TRUE(spec.ok());
  EXPECT_THAT(std::string(ValidateJobSpec(*spec).message()),
              HasSubstr("name = \"my job\" must be"));
}

TEST(JobSpecValidateTest, ModelRanges) {
  EXPECT_EQ(ValidationError("model: {moe: {num_experts: 8, top_k: 9}}"),
            "model.moe.top_k = 9 exceeds model.moe.num_experts = 8");
  EXPECT_EQ(ValidationError("model: {moe: {top_k: 0}}"), "model.moe.top_k = 0 must be at least 1");
  EXPECT_EQ(ValidationError("model: {moe: {num_groups: 3}}"),
            "model.moe.num_groups = 3 does not divide model.moe.num_experts = 8");
  EXPECT_EQ(ValidationError("model: {moe: {num_groups: 4, group_top_k: 5}}"),
            "model.moe.group_top_k = 5 must be in [1, model.moe.num_groups = 4]");
  EXPECT_EQ(ValidationError("model: {moe: {num_experts: 16, top_k: 6, num_groups: 4}}"),
            "model.moe.top_k = 6 exceeds the 4 experts of model.moe.group_top_k = 1 groups of 4");
  EXPECT_EQ(ValidationError("model: {num_heads: 4, num_kv_heads: 3}"),
            "model.num_kv_heads = 3 does not divide model.num_heads = 4");
  EXPECT_EQ(ValidationError("model: {hidden_size: 130, num_heads: 4}"),
            "model.hidden_size = 130 is not a multiple of model.num_heads = 4; set model.head_dim");
  EXPECT_EQ(ValidationError("model: {head_dim: 33}"),
            "model.head_dim = 33 must be even (RoPE rotates pairs of dimensions)");
  EXPECT_EQ(ValidationError("model: {num_layers: 2, first_dense_layers: 3}"),
            "model.first_dense_layers = 3 exceeds model.num_layers = 2");
  EXPECT_EQ(ValidationError("model: {hidden_size: -1}"),
            "model.hidden_size = -1 must be at least 1");
  EXPECT_EQ(ValidationError("model: {rms_norm_eps: 0}"),
            "model.rms_norm_eps = 0 must be positive and finite");
  EXPECT_EQ(ValidationError("model: {moe: {routed_scaling_factor: -2.5}}"),
            "model.moe.routed_scaling_factor = -2.5 must be positive and finite");
  EXPECT_EQ(ValidationError("model: {moe: {num_shared_experts: -1}}"),
            "model.moe.num_shared_experts = -1 must not be negative");
  EXPECT_EQ(ValidationError("model: {moe: {aux_loss_coeff: 0.01}}"),
            "model.moe.aux_loss_coeff = 0.01 has no effect with model.moe.aux_loss = NONE; set "
            "model.moe.aux_loss to SWITCH or SEQUENCE");
  EXPECT_EQ(ValidationError("model: {moe: {capacity_factor: -1}}"),
            "model.moe.capacity_factor = -1 must be non-negative and finite (0 = dropless)");
}

TEST(JobSpecValidateTest, DataRanges) {
  EXPECT_EQ(ValidationError("data: {format: LLMC}"),
            "data.path is required with data.format = LLMC");
  EXPECT_EQ(ValidationError("data: {path: /d/train.bin}"),
            "data.path = \"/d/train.bin\" is set but data.format = SYNTHETIC; set data.format to "
            "LLMC, U16, U32 or TEXT");
  EXPECT_EQ(ValidationError("data: {format: U32}"), "data.path is required with data.format = U32");
  EXPECT_EQ(ValidationError("data: {synthetic_vocab_size: 300}"),
            "data.synthetic_vocab_size = 300 exceeds model.vocab_size = 256");
  EXPECT_EQ(ValidationError("data: {format: U16, path: a.u16, synthetic_vocab_size: 64}"),
            "data.synthetic_vocab_size = 64 applies only to data.format = SYNTHETIC, not U16");
  EXPECT_EQ(ValidationError("model: {vocab_size: 100}\ndata: {format: TEXT, path: a.txt}"),
            "model.vocab_size = 100 is below 256, the byte vocabulary of data.format = TEXT");
  EXPECT_EQ(ValidationError("data: {eval_fraction: 1.0}"),
            "data.eval_fraction = 1 must be in [0, 1)");
  EXPECT_EQ(ValidationError("data: {format: LLMC, path: a.bin}\ntrain: {eval_every: 50}"),
            "train.eval_every = 50 needs held-out data: set data.eval_fraction > 0 (data.format = "
            "LLMC)");

  // DeepSeek-V3's vocabulary is beyond uint16 tokens; U32 (and LLMC version 2) files carry it.
  for (const char* format : {"U32", "LLMC"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat(
        "name: ok\nmodel: {vocab_size: 129280}\ndata: {format: ", format, ", path: /d/t.bin}\n"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << format << ": " << ValidateJobSpec(*spec);
  }
}

TEST(JobSpecValidateTest, TrainRanges) {
  EXPECT_EQ(ValidationError("train: {steps: 0}"), "train.steps = 0 must be at least 1");
  EXPECT_EQ(ValidationError("train: {batch_size: 16, micro_batch_size: 3}"),
            "train.micro_batch_size = 3 does not divide the per-rank batch train.batch_size / "
            "ranks = 16");
  EXPECT_EQ(ValidationError("resources: {workers: 4}\ntrain: {batch_size: 10}"),
            "train.batch_size = 10 is not a multiple of the job's 4 ranks (each rank reads its "
            "own share of every batch)");
  EXPECT_EQ(ValidationError("model: {max_seq_len: 256}\ntrain: {seq_len: 512}"),
            "train.seq_len = 512 exceeds model.max_seq_len = 256");
  EXPECT_EQ(ValidationError("train: {optimizer: {lr: 1e-4, min_lr: 1e-3}}"),
            "train.optimizer.min_lr = 0.001 exceeds train.optimizer.lr = 0.0001");
  EXPECT_EQ(ValidationError("train: {optimizer: {min_lr: -1e-5}}"),
            "train.optimizer.min_lr = -1e-05 must be non-negative and finite");
  EXPECT_EQ(ValidationError("train: {optimizer: {lr: 0}}"),
            "train.optimizer.lr = 0 must be positive and finite");
  EXPECT_EQ(ValidationError("train: {optimizer: {beta2: 1}}"),
            "train.optimizer.beta2 = 1 must be in [0, 1)");
  EXPECT_EQ(ValidationError("train: {steps: 100, optimizer: {warmup_steps: 200}}"),
            "train.optimizer.warmup_steps = 200 exceeds train.steps = 100");
  EXPECT_EQ(ValidationError("train: {log_every: 0}"), "train.log_every = 0 must be at least 1");
  EXPECT_EQ(ValidationError("train: {fp8: {amax_history_len: 0}}"),
            "train.fp8.amax_history_len = 0 must be at least 1");
}

TEST(JobSpecValidateTest, Fp8Ranges) {
  // Values accepted before the bounds of issue 31: 2^20 floats of history a slot (a 4 MiB model
  // then took 3 GB), a margin whose scales can have infinite inverses, an epsilon that dominates
  // every amax.
  EXPECT_EQ(ValidationError("train: {fp8: {amax_history_len: 1048576}}"),
            "train.fp8.amax_history_len = 1048576 must be at most 4096");
  EXPECT_EQ(ValidationError("train: {fp8: {amax_history_len: 4097}}"),
            "train.fp8.amax_history_len = 4097 must be at most 4096");
  EXPECT_EQ(ValidationError("train: {fp8: {margin: -1}}"),
            "train.fp8.margin = -1 must not be negative");
  EXPECT_EQ(ValidationError("train: {fp8: {margin: 64}}"),
            "train.fp8.margin = 64 must be at most 8");
  EXPECT_EQ(ValidationError("train: {fp8: {margin: 9}}"), "train.fp8.margin = 9 must be at most 8");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: CURRENT, amax_epsilon: -1e-06}}"),
            "train.fp8.amax_epsilon = -1e-06 must be in [0, 1]");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: CURRENT, amax_epsilon: 1e30}}"),
            "train.fp8.amax_epsilon = 1e+30 must be in [0, 1]");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: BLOCKWISE, amax_epsilon: 1.5}}"),
            "train.fp8.amax_epsilon = 1.5 must be in [0, 1]");

  // A field the recipe does not read is refused, naming it, its value and the recipe.
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: BLOCKWISE, amax_history_len: 16}}"),
            "train.fp8.amax_history_len = 16 is read only by train.fp8.recipe = DELAYED, not "
            "train.fp8.recipe = BLOCKWISE; remove it");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: CURRENT, margin: 2}}"),
            "train.fp8.margin = 2 is read only by train.fp8.recipe = DELAYED, not "
            "train.fp8.recipe = CURRENT; remove it");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: MXFP8, amax_compute_algo: MOST_RECENT}}"),
            "train.fp8.amax_compute_algo = MOST_RECENT is read only by train.fp8.recipe = "
            "DELAYED, not train.fp8.recipe = MXFP8; remove it");
  EXPECT_EQ(ValidationError("train: {fp8: {power_2_scales: false}}"),
            "train.fp8.power_2_scales = false is read only by train.fp8.recipe = CURRENT or "
            "BLOCKWISE, not train.fp8.recipe = DELAYED; remove it");
  EXPECT_EQ(ValidationError("train: {fp8: {recipe: MXFP8, power_2_scales: true}}"),
            "train.fp8.power_2_scales = true does not apply to train.fp8.recipe = MXFP8, whose "
            "E8M0 scales are always powers of two; remove it");
  EXPECT_EQ(ValidationError("train: {fp8: {amax_epsilon: 1e-12}}"),
            "train.fp8.amax_epsilon = 1e-12 is read only by train.fp8.recipe = CURRENT or "
            "BLOCKWISE, not train.fp8.recipe = DELAYED; remove it");
  // Checked whatever the precision: a bad block is a mistake even where it is not read.
  EXPECT_EQ(ValidationError("train: {precision: BF16, fp8: {recipe: MXFP8, margin: 1}}"),
            "train.fp8.margin = 1 is read only by train.fp8.recipe = DELAYED, not "
            "train.fp8.recipe = MXFP8; remove it");

  // Every field where its recipe reads it, and fp8_dispatch without expert parallelism.
  for (const char* yaml :
       {"train: {precision: FP8, fp8: {format: E4M3, amax_history_len: 16, margin: 3, "
        "amax_compute_algo: MOST_RECENT, fp8_dispatch: true}}",
        "train: {precision: FP8, fp8: {recipe: CURRENT, power_2_scales: true, amax_epsilon: 1e-6}}",
        "train: {precision: FP8, fp8: {recipe: BLOCKWISE, power_2_scales: false, amax_epsilon: 0}}",
        "train: {precision: FP8, fp8: {recipe: MXFP8, format: E4M3, fp8_dispatch: true}}",
        "resources: {device: CUDA}\ntrain: {precision: FP8, fp8: {recipe: BLOCKWISE}}"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat("name: ok\n", yaml));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << yaml << ": " << ValidateJobSpec(*spec);
  }
}

TEST(JobSpecValidateTest, CheckpointResourcesParallelRestartRanges) {
  EXPECT_EQ(ValidationError("checkpoint: {every_steps: -1}"),
            "checkpoint.every_steps = -1 must not be negative");
  EXPECT_EQ(ValidationError("checkpoint: {keep_last: -2}"),
            "checkpoint.keep_last = -2 must not be negative");
  EXPECT_EQ(ValidationError("restart: {max_restarts: -1}"),
            "restart.max_restarts = -1 must not be negative");
  EXPECT_EQ(ValidationError("resources: {workers: 0}"), "resources.workers = 0 must be at least 1");
  EXPECT_EQ(ValidationError("resources: {workers: 4611686018427387904, device: CUDA, "
                            "devices_per_worker: 4}"),
            "resources.workers = 4611686018427387904 must be at most 1048576");
  EXPECT_EQ(ValidationError("resources: {device: CUDA, device_memory_bytes: -1}"),
            "resources.device_memory_bytes = -1 must not be negative");
  EXPECT_EQ(ValidationError("resources: {devices_per_worker: 2}"),
            "resources.devices_per_worker = 2 must be 1 with resources.device = CPU (a CPU worker "
            "runs one rank)");
  EXPECT_EQ(ValidationError("resources: {workers: 2}\nparallel: {data_parallel: 4}"),
            "parallel.data_parallel = 4 x parallel.expert_parallel = 1 does not equal the job's 2 "
            "ranks (resources.workers = 2 x resources.devices_per_worker = 1)");
  EXPECT_EQ(ValidationError("resources: {workers: 4}\nparallel: {expert_parallel: 3}"),
            "parallel.expert_parallel = 3 does not divide the job's 4 ranks (resources.workers = 4 "
            "x resources.devices_per_worker = 1)");
  EXPECT_EQ(ValidationError("resources: {workers: 4}\nparallel: {expert_parallel: 2, "
                            "data_parallel: 4}"),
            "parallel.data_parallel = 4 x parallel.expert_parallel = 2 does not equal the job's 4 "
            "ranks (resources.workers = 4 x resources.devices_per_worker = 1)");
  EXPECT_EQ(ValidationError("parallel: {overlap_chunks: -1}"),
            "parallel.overlap_chunks = -1 must not be negative");
  EXPECT_EQ(ValidationError("parallel: {overlap_chunks: 65}"),
            "parallel.overlap_chunks = 65 must be at most 64");
  EXPECT_EQ(ValidationError("resources: {workers: 3}\nparallel: {expert_parallel: 3}\n"
                            "train: {batch_size: 9}"),
            "parallel.expert_parallel = 3 does not divide model.moe.num_experts = 8");
  // Several devices per worker are fine on CUDA, and a stated device memory need.
  absl::StatusOr<v1::JobSpec> cuda = ParseJobSpecYaml(
      "name: g\nresources: {device: CUDA, workers: 2, devices_per_worker: 4, "
      "device_memory_bytes: 18845101261}\n"
      "parallel: {expert_parallel: 8}\ntrain: {batch_size: 16}\n");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_EQ(cuda->resources().device_memory_bytes(), 18845101261);
  EXPECT_TRUE(ValidateJobSpec(*cuda).ok()) << ValidateJobSpec(*cuda);
}

TEST(JobSpecValidateTest, ValuesOnlyCodeCanSet) {
  v1::JobSpec spec;
  spec.set_name("code");
  spec.mutable_train()->mutable_optimizer()->set_lr(std::nanf(""));
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "train.optimizer.lr = nan must be positive and finite");

  spec = v1::JobSpec();
  spec.set_name("code");
  spec.mutable_model()->mutable_moe()->set_score_function(
      static_cast<v1::MoeConfig::ScoreFunction>(7));
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "model.moe.score_function = 7 is not one of SOFTMAX, SIGMOID");

  spec = v1::JobSpec();
  spec.set_name("code");
  spec.mutable_train()->mutable_fp8()->set_recipe(v1::Fp8Recipe::CURRENT);
  spec.mutable_train()->mutable_fp8()->set_amax_epsilon(std::numeric_limits<float>::infinity());
  EXPECT_EQ(ValidateJobSpec(spec).message(), "train.fp8.amax_epsilon = inf must be in [0, 1]");
  spec.mutable_train()->mutable_fp8()->set_recipe(static_cast<v1::Fp8Recipe::Recipe>(9));
  EXPECT_EQ(ValidateJobSpec(spec).message(),
            "train.fp8.recipe = 9 is not one of DELAYED, CURRENT, BLOCKWISE, MXFP8");
}

}  // namespace
}  // namespace moetrain

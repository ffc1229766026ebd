// JobService end to end: a real grpc::Server on 127.0.0.1 (ephemeral port) over a Coordinator and
// a SQLite store in a fresh temporary directory, called through the generated stub.

#include "server/grpc/job_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "tests/server/grpc/job_service_fixture.h"

namespace moetrain::server {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

// A JobSpec with every section and most fields set to valid values other than the defaults, with
// explicit zeros in fields that have presence.
v1::JobSpec FullSpec() {
  v1::JobSpec spec;
  spec.set_name("moe-full.1");
  auto* model = spec.mutable_model();
  model->set_vocab_size(512);
  model->set_hidden_size(128);
  model->set_num_layers(3);
  model->set_num_heads(4);
  model->set_num_kv_heads(2);
  model->set_head_dim(32);
  model->set_ffn_dim(384);
  model->set_first_dense_layers(0);  // an explicit zero of an optional field must survive
  model->set_max_seq_len(128);
  model->set_rope_theta(500000.0f);
  model->set_rms_norm_eps(1e-5f);
  model->set_tie_embeddings(true);
  model->set_init_std(0.01f);
  auto* moe = model->mutable_moe();
  moe->set_num_experts(16);
  moe->set_top_k(4);
  moe->set_expert_ffn_dim(64);
  moe->set_num_shared_experts(1);
  moe->set_score_function(v1::MoeConfig::SIGMOID);
  moe->set_softmax_before_topk(false);
  moe->set_normalize_topk_weights(false);
  moe->set_routed_scaling_factor(2.5f);
  moe->set_num_groups(4);
  moe->set_group_top_k(2);
  moe->set_expert_bias(true);
  moe->set_expert_bias_update_rate(0.002f);
  moe->set_aux_loss(v1::MoeConfig::SEQUENCE);
  moe->set_aux_loss_coeff(0.001f);
  moe->set_z_loss_coeff(0.0001f);
  moe->set_capacity_factor(1.25f);
  moe->set_drop_policy(v1::MoeConfig::POSITION);
  auto* data = spec.mutable_data();
  data->set_format(v1::DataConfig::LLMC);
  data->set_path("/data/shard_000.bin");
  data->set_eval_fraction(0.05f);
  data->set_seed(0);
  auto* train = spec.mutable_train();
  train->set_steps(200);
  train->set_batch_size(16);
  train->set_micro_batch_size(4);
  train->set_seq_len(128);
  train->set_precision(v1::TrainConfig::FP8);
  auto* fp8 = train->mutable_fp8();
  fp8->set_format(v1::Fp8Recipe::E4M3);
  // DELAYED reads the history fields; power_2_scales and amax_epsilon belong to other recipes,
  // so a valid spec leaves them unset.
  fp8->set_recipe(v1::Fp8Recipe::DELAYED);
  fp8->set_amax_history_len(16);
  fp8->set_margin(1);
  fp8->set_amax_compute_algo(v1::Fp8Recipe::MOST_RECENT);
  fp8->set_fp8_dispatch(true);
  auto* optimizer = train->mutable_optimizer();
  optimizer->set_lr(1e-3f);
  optimizer->set_min_lr(1e-4f);
  optimizer->set_warmup_steps(20);
  optimizer->set_decay(v1::OptimizerConfig::LINEAR);
  optimizer->set_beta1(0.8f);
  optimizer->set_beta2(0.99f);
  optimizer->set_eps(1e-6f);
  optimizer->set_weight_decay(0.0f);
  optimizer->set_grad_clip(0.5f);
  train->set_seed(42);
  train->set_log_every(5);
  train->set_eval_every(50);
  train->set_eval_batches(2);
  train->set_skip_nonfinite_steps(true);
  spec.mutable_checkpoint()->set_dir("/ckpt");
  spec.mutable_checkpoint()->set_every_steps(100);
  spec.mutable_checkpoint()->set_keep_last(0);
  spec.mutable_resources()->set_workers(2);
  spec.mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  spec.mutable_resources()->set_devices_per_worker(2);
  spec.mutable_parallel()->set_expert_parallel(4);
  spec.mutable_parallel()->set_data_parallel(1);
  spec.mutable_restart()->set_max_restarts(0);
  return spec;
}

class JobServiceTest : public JobServiceFixture {
 protected:
  int64_t StoredJobs() {
    absl::StatusOr<JobPage> page = store_->ListJobs({});
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? static_cast<int64_t>(page->jobs.size()) : -1;
  }
};

TEST_F(JobServiceTest, SubmitGetListCancel) {
  v1::Job job;
  ASSERT_TRUE(Submit(Submission("sub-1", 3), &job).ok());
  EXPECT_FALSE(job.id().empty());
  EXPECT_EQ(job.submission_id(), "sub-1");
  EXPECT_EQ(job.name(), "tiny");
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.priority(), 3);
  EXPECT_TRUE(job.spec().model().has_hidden_size());  // defaults applied
  EXPECT_GT(job.create_time().seconds(), 1600000000);
  EXPECT_FALSE(job.has_latest_checkpoint_step());

  // Idempotent on the submission id.
  {
    v1::Job again;
    ASSERT_TRUE(Submit(Submission("sub-1", 3), &again).ok());
    EXPECT_EQ(again.id(), job.id());
    v1::SubmitJobRequest renamed = Submission("sub-1", 3);
    renamed.mutable_spec()->set_name("renamed");
    v1::Job other;
    grpc::Status status = Submit(renamed, &other);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
  }

  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::GetJobRequest request;
    request.set_job_id(job.id());
    v1::Job got;
    grpc::Status status = stub_->GetJob(&context, request, &got);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(got.id(), job.id());
    EXPECT_EQ(got.spec().name(), "tiny");
  }
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::GetJobRequest request;
    request.set_job_id("job-missing");
    v1::Job got;
    EXPECT_EQ(stub_->GetJob(&context, request, &got).error_code(), grpc::StatusCode::NOT_FOUND);
  }

  v1::Job second = MustSubmit("sub-2");
  v1::Job third = MustSubmit("sub-3");
  std::vector<std::string> listed;
  std::string token;
  int pages = 0;
  do {
    grpc::ClientContext context;
    Authorize(&context);
    v1::ListJobsRequest request;
    request.set_page_size(2);
    request.set_page_token(token);
    v1::ListJobsResponse response;
    grpc::Status status = stub_->ListJobs(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (const v1::Job& j : response.jobs()) listed.push_back(j.id());
    token = response.next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 2);
  EXPECT_EQ(listed, (std::vector<std::string>{job.id(), second.id(), third.id()}));

  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::CancelJobRequest request;
    request.set_job_id(second.id());
    request.set_reason("changed my mind");
    v1::Job cancelled;
    grpc::Status status = stub_->CancelJob(&context, request, &cancelled);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(cancelled.state_reason(), "changed my mind");
  }
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::CancelJobRequest request;
    request.set_job_id(second.id());
    v1::Job cancelled;
    EXPECT_EQ(stub_->CancelJob(&context, request, &cancelled).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::ListJobsRequest request;
    request.add_states(v1::JOB_STATE_CANCELLED);
    v1::ListJobsResponse response;
    ASSERT_TRUE(stub_->ListJobs(&context, request, &response).ok());
    ASSERT_EQ(response.jobs_size(), 1);
    EXPECT_EQ(response.jobs(0).id(), second.id());
  }
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::ListJobsRequest request;
    request.add_states(v1::JOB_STATE_UNSPECIFIED);
    v1::ListJobsResponse response;
    ASSERT_TRUE(stub_->ListJobs(&context, request, &response).ok());
    EXPECT_EQ(response.jobs_size(), 0);
  }
}

TEST_F(JobServiceTest, WatchStreamsFromASequenceAndEndsAtTheFinalState) {
  v1::Job job = MustSubmit("w");
  ASSERT_TRUE(coordinator_->AppendEvent(job.id(), kLogEventKind, "hello").ok());

  grpc::ClientContext context;
  Authorize(&context);
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  request.set_from_sequence(1);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);

  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 1);
  EXPECT_EQ(event.log_line().text(), "hello");

  // A live event, then the cancellation that ends the stream.
  ASSERT_TRUE(coordinator_->AppendEvent(job.id(), "note", "live").ok());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 2);
  EXPECT_EQ(event.log_line().text(), "note: live") << "an unknown kind arrives as text";
  ASSERT_TRUE(coordinator_->Cancel(job.id(), "stop").ok());
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 3);
  ASSERT_TRUE(event.has_state_change());
  EXPECT_EQ(event.state_change().from(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(event.state_change().to(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(event.state_change().reason(), "stop");
  EXPECT_FALSE(reader->Read(&event));
  grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();

  // From the beginning of a final job: the whole history, starting with the submission.
  grpc::ClientContext again;
  Authorize(&again);
  request.set_from_sequence(0);
  reader = stub_->WatchJob(&again, request);
  std::vector<int64_t> sequences;
  while (reader->Read(&event)) sequences.push_back(event.sequence());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(sequences, (std::vector<int64_t>{0, 1, 2, 3}));

  grpc::ClientContext negative;
  Authorize(&negative);
  request.set_from_sequence(-1);
  reader = stub_->WatchJob(&negative, request);
  EXPECT_FALSE(reader->Read(&event));
  const grpc::Status refused = reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("from_sequence = -1"));
}

TEST_F(JobServiceTest, WatchEndsWhenTheClientCancels) {
  v1::Job job = MustSubmit("c");
  grpc::ClientContext context;
  Authorize(&context);
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event));
  EXPECT_EQ(event.sequence(), 0);
  EXPECT_EQ(event.state_change().to(), v1::JOB_STATE_PENDING);
  context.TryCancel();
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server's handler returns; TearDown's Shutdown would hang otherwise.
}

TEST_F(JobServiceTest, MissingOrWrongTokenIsUnauthenticated) {
  std::string last_changed = kFixtureToken;
  last_changed.back() = 'X';
  for (const std::string& token : {std::string(), std::string("wrong"),
                                   absl::StrCat(kFixtureToken, "-longer"), last_changed}) {
    grpc::ClientContext context;
    if (!token.empty()) Authorize(&context, token);
    v1::Job job;
    grpc::Status status = stub_->SubmitJob(&context, Submission("sub-1"), &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", kFixtureToken);  // no "Bearer "
    v1::GetJobRequest request;
    request.set_job_id("job-x");
    v1::Job job;
    EXPECT_EQ(stub_->GetJob(&context, request, &job).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    v1::ListJobsResponse response;
    EXPECT_EQ(stub_->ListJobs(&context, {}, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    v1::Job job;
    EXPECT_EQ(stub_->CancelJob(&context, {}, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, {});
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(StoredJobs(), 0);
}

TEST_F(JobServiceTest, MalformedSpecIsInvalidArgumentNamingTheFieldAndStoresNothing) {
  v1::SubmitJobRequest request = Submission("sub-bad");
  request.mutable_spec()->mutable_model()->mutable_moe()->set_top_k(99);
  grpc::ClientContext context;
  Authorize(&context);
  v1::Job job;
  grpc::Status status = stub_->SubmitJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("model.moe.top_k"));

  v1::SubmitJobRequest escape = Submission("sub-escape");
  escape.mutable_spec()->set_name("../../etc");
  status = Submit(escape, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("name"));
  EXPECT_EQ(StoredJobs(), 0);
}

// Acceptance at submit depends on the spec alone: the coordinator needs no GPU to accept a CUDA
// job (the scheduler gives it only to workers that offer GPUs), FP8 is accepted on either device,
// and a spec no trainer could run (an FP8 option its recipe does not read) is refused naming the
// field, and not stored.
TEST_F(JobServiceTest, ACudaJobAndFp8JobsAreAcceptedAnFp8OptionTheRecipeIgnoresRefused) {
  v1::SubmitJobRequest cuda = Submission("sub-cuda");
  cuda.mutable_spec()->mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  cuda.mutable_spec()->mutable_resources()->set_devices_per_worker(2);
  v1::Job job;
  grpc::Status status = Submit(cuda, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job.spec().resources().device(), v1::ResourceConfig::CUDA);

  v1::SubmitJobRequest fp8 = Submission("sub-fp8");
  fp8.mutable_spec()->mutable_train()->set_precision(v1::TrainConfig::FP8);
  fp8.mutable_spec()->mutable_train()->mutable_fp8()->set_recipe(v1::Fp8Recipe::BLOCKWISE);
  status = Submit(fp8, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  // Stored resolved: the recipe's own default filled in, the other recipes' fields left unset.
  EXPECT_TRUE(job.spec().train().fp8().power_2_scales());
  EXPECT_FALSE(job.spec().train().fp8().has_amax_history_len());

  v1::SubmitJobRequest cuda_fp8 = cuda;
  cuda_fp8.set_submission_id("sub-cuda-fp8");
  cuda_fp8.mutable_spec()->mutable_train()->set_precision(v1::TrainConfig::FP8);
  status = Submit(cuda_fp8, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(StoredJobs(), 3);

  v1::SubmitJobRequest ignored = Submission("sub-fp8-ignored");
  ignored.mutable_spec()->mutable_train()->set_precision(v1::TrainConfig::FP8);
  ignored.mutable_spec()->mutable_train()->mutable_fp8()->set_recipe(v1::Fp8Recipe::MXFP8);
  ignored.mutable_spec()->mutable_train()->mutable_fp8()->set_power_2_scales(true);
  status = Submit(ignored, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("train.fp8.power_2_scales = true"));
  EXPECT_EQ(StoredJobs(), 3);
}

// What a client sends is what every later reader gets: a spec with every section set comes back
// from SubmitJob and GetJob field for field (explicit zeros of optional fields included), through
// the wire and the store.
TEST_F(JobServiceTest, AFullSpecRoundTripsThroughTheStore) {
  v1::SubmitJobRequest request = Submission("full", -3);
  *request.mutable_spec() = FullSpec();
  // Every section of JobSpec is set, so a section added to the schema is noticed here.
  const google::protobuf::Descriptor* descriptor = v1::JobSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    EXPECT_TRUE(request.spec().GetReflection()->HasField(request.spec(), descriptor->field(i)))
        << descriptor->field(i)->name();
  }
  v1::Job submitted;
  grpc::Status status = Submit(request, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(submitted.name(), "moe-full.1");
  EXPECT_EQ(submitted.priority(), -3);

  grpc::ClientContext context;
  Authorize(&context);
  v1::GetJobRequest get;
  get.set_job_id(submitted.id());
  v1::Job got;
  status = stub_->GetJob(&context, get, &got);
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (const v1::Job* job : {&submitted, &got}) {
    std::string diff;
    MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    differencer.set_scope(MessageDifferencer::PARTIAL);  // fields sent; defaults may fill the rest
    EXPECT_TRUE(differencer.Compare(request.spec(), job->spec())) << diff;
    EXPECT_TRUE(job->spec().model().has_first_dense_layers());
    EXPECT_TRUE(job->spec().data().has_seed());
    EXPECT_TRUE(job->spec().checkpoint().has_keep_last());
    EXPECT_TRUE(job->spec().restart().has_max_restarts());
  }
}

TEST_F(JobServiceTest, StepsCheckpointsAndLogsReachTheWatcherTyped) {
  v1::Job job = MustSubmit("typed");
  v1::StepMetrics metrics;
  metrics.set_step(7);
  metrics.set_loss(2.5);
  metrics.set_tokens_seen(896);
  metrics.add_expert_load_per_layer(1.25);
  ASSERT_TRUE(coordinator_->RecordStepMetrics(job.id(), 1, metrics).ok());
  v1::CheckpointSaved saved;
  saved.set_step(7);
  saved.set_path("/c/step-00000007");
  ASSERT_TRUE(
      coordinator_->AppendEvent(job.id(), kCheckpointSavedEventKind, saved.SerializeAsString())
          .ok());

  // no_wait: what is recorded, then the end of the stream although the job is not final.
  grpc::ClientContext context;
  Authorize(&context);
  v1::WatchJobRequest request;
  request.set_job_id(job.id());
  request.set_no_wait(true);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = stub_->WatchJob(&context, request);
  std::vector<v1::JobEvent> events;
  for (v1::JobEvent event; reader->Read(&event);) events.push_back(event);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].has_state_change());
  ASSERT_TRUE(events[1].has_step_metrics());
  EXPECT_EQ(events[1].step_metrics().step(), 7);
  EXPECT_EQ(events[1].step_metrics().expert_load_per_layer(0), 1.25);
  ASSERT_TRUE(events[2].has_checkpoint_saved());
  EXPECT_EQ(events[2].checkpoint_saved().path(), "/c/step-00000007");

  // The job carries its newest step report.
  grpc::ClientContext get_context;
  Authorize(&get_context);
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job got;
  ASSERT_TRUE(stub_->GetJob(&get_context, get, &got).ok());
  EXPECT_EQ(got.last_metrics().step(), 7);
  EXPECT_EQ(got.last_metrics().loss(), 2.5);
}

TEST_F(JobServiceTest, ListsCheckpointsAndWorkers) {
  v1::Job job = MustSubmit("ckpt");
  CheckpointRecord checkpoint;
  checkpoint.step = 5;
  checkpoint.path = (fs::path(dir_) / "gone" / "step-00000005").string();
  checkpoint.tokens_seen = 640;
  checkpoint.attempt = 1;
  ASSERT_TRUE(store_->RecordCheckpoint(job.id(), checkpoint).ok());
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::ListCheckpointsRequest request;
    request.set_job_id(job.id());
    v1::ListCheckpointsResponse response;
    ASSERT_TRUE(stub_->ListCheckpoints(&context, request, &response).ok());
    // The directory is not visible to this process at all: the record is listed as it is.
    ASSERT_EQ(response.checkpoints_size(), 1);
    EXPECT_EQ(response.checkpoints(0).step(), 5);
    EXPECT_EQ(response.checkpoints(0).tokens_seen(), 640);
    EXPECT_EQ(response.checkpoints(0).attempt(), 1);
  }
  // Once the job's directory exists, only checkpoints still on disk are listed.
  fs::create_directories(fs::path(dir_) / "gone");
  {
    grpc::ClientContext context;
    Authorize(&context);
    v1::ListCheckpointsRequest request;
    request.set_job_id(job.id());
    v1::ListCheckpointsResponse response;
    ASSERT_TRUE(stub_->ListCheckpoints(&context, request, &response).ok());
    EXPECT_EQ(response.checkpoints_size(), 0);
  }
  v1::RegisterWorkerRequest registration;
  registration.set_name("node-a");
  registration.mutable_resources()->set_device_count(1);
  registration.mutable_resources()->set_threads(2);
  ASSERT_TRUE(fleet_->Register(registration).ok());
  grpc::ClientContext context;
  Authorize(&context);
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok());
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).name(), "node-a");
  EXPECT_EQ(workers.workers(0).state(), v1::WORKER_STATE_IDLE);
  EXPECT_EQ(workers.workers(0).threads(), 2);
}

TEST_F(JobServiceTest, RequestsWithUnknownFieldsAreRejectedAndStoreNothing) {
  v1::SubmitJobRequest request = Submission("unknown-field");
  // Field 99 of JobSpec: what a newer client would send.
  request.mutable_spec()
      ->GetReflection()
      ->MutableUnknownFields(request.mutable_spec())
      ->AddVarint(99, 1);
  grpc::ClientContext context;
  Authorize(&context);
  v1::Job job;
  grpc::Status status = stub_->SubmitJob(&context, request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("spec holds field number 99"));
  EXPECT_TRUE(store_->ListJobs({})->jobs.empty());
}

TEST_F(JobServiceTest, TruncatedRequestBytesChangeNothing) {
  // The bytes of a valid SubmitJobRequest, cut short, sent through the generic stub.
  const std::string whole = Submission("truncated").SerializeAsString();
  for (size_t length : {whole.size() - 1, whole.size() / 2, size_t{3}}) {
    const grpc::Status status =
        RawCall("/moetrain.v1.JobService/SubmitJob", whole.substr(0, length));
    EXPECT_FALSE(status.ok()) << "length " << length;
  }
  EXPECT_TRUE(store_->ListJobs({})->jobs.empty());
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  // A length difference is not hidden by a NUL padding.
  EXPECT_FALSE(ConstantTimeEquals(absl::string_view("ab\0", 3), "ab"));
}

TEST(BearerTokenMatchesTest, NeedsTheSchemeAndTheWholeToken) {
  EXPECT_TRUE(BearerTokenMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("s3cret", "s3cret")) << "no scheme";
  EXPECT_FALSE(BearerTokenMatches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("Bearer s3cret ", "s3cret"));
  EXPECT_FALSE(BearerTokenMatches("", "s3cret"));
}

TEST(ToGrpcStatusTest, KeepsCodeAndMessage) {
  grpc::Status status = ToGrpcStatus(absl::FailedPreconditionError("job x is FAILED"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "job x is FAILED");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace moetrain::server

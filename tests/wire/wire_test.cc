// The wire API end to end: a real grpc::Server on 127.0.0.1 (ephemeral port) with small in-test
// implementations of a few JobService and WorkerService RPCs and the default health service,
// called through the generated stubs.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job.pb.h"
#include "moetrain/v1/worker.grpc.pb.h"

namespace moetrain {
namespace {

using ::google::protobuf::util::MessageDifferencer;
namespace v1 = ::moetrain::v1;

constexpr int kWatchEvents = 5;

// SubmitJob echoes the request into a PENDING job; WatchJob streams a fixed 5-event history.
class TestJobService final : public v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::Job* job) override {
    if (request->submission_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "submission_id is required");
    }
    job->set_id("job-" + request->submission_id());
    job->set_submission_id(request->submission_id());
    job->set_name(request->spec().name());
    *job->mutable_spec() = request->spec();
    job->set_state(v1::JOB_STATE_PENDING);
    job->set_priority(request->priority());
    job->mutable_create_time()->set_seconds(1700000000);
    *job->mutable_update_time() = job->create_time();
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    if (request->from_sequence() < 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "from_sequence < 0");
    }
    for (int64_t seq = request->from_sequence(); seq < kWatchEvents; ++seq) {
      if (!writer->Write(Event(seq))) break;
    }
    return grpc::Status::OK;
  }

  // The job's history: PENDING→SCHEDULED, SCHEDULED→RUNNING, a step, a checkpoint,
  // RUNNING→SUCCEEDED.
  static v1::JobEvent Event(int64_t seq) {
    v1::JobEvent event;
    event.set_sequence(seq);
    event.mutable_time()->set_seconds(1700000000 + seq);
    auto state_change = [&](v1::JobState from, v1::JobState to, const char* reason) {
      auto* change = event.mutable_state_change();
      change->set_from(from);
      change->set_to(to);
      change->set_reason(reason);
    };
    switch (seq) {
      case 0: state_change(v1::JOB_STATE_PENDING, v1::JOB_STATE_SCHEDULED, "scheduled"); break;
      case 1: state_change(v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING, "running"); break;
      case 2: {
        auto* m = event.mutable_step_metrics();
        m->set_step(10);
        m->set_loss(3.5);
        m->set_eval_loss(3.75);
        m->set_lr(3e-4);
        m->set_grad_norm(0.5);
        m->set_tokens_per_s(12345.0);
        m->set_expert_load_max_over_mean(1.25);
        m->set_tokens_seen(20480);
        break;
      }
      case 3: {
        auto* c = event.mutable_checkpoint_saved();
        c->set_step(10);
        c->set_path("/ckpt/job-1/step-00000010");
        break;
      }
      default: state_change(v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, "done"); break;
    }
    return event;
  }
};

// KvSet/KvWait over an in-memory map keyed by (job, attempt, key).
class TestWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status KvSet(grpc::ServerContext*, const v1::KvSetRequest* request,
                     v1::KvSetResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[Key(request->job_id(), request->attempt(), request->key())] = request->value();
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status KvWait(grpc::ServerContext* context, const v1::KvWaitRequest* request,
                      v1::KvWaitResponse* response) override {
    using Clock = std::chrono::system_clock;
    Clock::time_point until = context->deadline();  // max() when the client set none
    if (request->has_timeout()) {
      auto timeout = std::chrono::seconds(request->timeout().seconds()) +
                     std::chrono::nanoseconds(request->timeout().nanos());
      if (timeout > timeout.zero()) {
        until = std::min(until, Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout));
      }
    }
    const std::string key = Key(request->job_id(), request->attempt(), request->key());
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (auto it = values_.find(key); it != values_.end()) {
        response->set_value(it->second);
        return grpc::Status::OK;
      }
      if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      auto now = Clock::now();
      if (now >= until) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key not set: " + request->key());
      }
      // Wake up at least every 50 ms to notice a cancelled call.
      cv_.wait_until(lock, std::min(until, now + std::chrono::milliseconds(50)));
    }
  }

 private:
  static std::string Key(const std::string& job, int64_t attempt, const std::string& key) {
    return job + '\0' + std::to_string(attempt) + '\0' + key;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// A JobSpec with every section and most fields set to non-default values.
v1::JobSpec FullSpec() {
  v1::JobSpec spec;
  spec.set_name("moe-tiny.1");
  auto* model = spec.mutable_model();
  model->set_vocab_size(512);
  model->set_hidden_size(128);
  model->set_num_layers(3);
  model->set_num_heads(4);
  model->set_num_kv_heads(2);
  model->set_head_dim(32);
  model->set_ffn_dim(384);
  model->set_first_dense_layers(0);  // explicit zero of an optional field must survive
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
  train->mutable_fp8()->set_format(v1::Fp8Recipe::E4M3);
  train->mutable_fp8()->set_amax_history_len(16);
  train->mutable_fp8()->set_margin(1);
  // DELAYED (the default) reads the history fields; power_2_scales and amax_epsilon are for
  // other recipes, so a valid spec leaves them unset.
  train->mutable_fp8()->set_recipe(v1::Fp8Recipe::DELAYED);
  train->mutable_fp8()->set_amax_compute_algo(v1::Fp8Recipe::MOST_RECENT);
  train->mutable_fp8()->set_fp8_dispatch(true);
  auto* opt = train->mutable_optimizer();
  opt->set_lr(1e-3f);
  opt->set_min_lr(1e-4f);
  opt->set_warmup_steps(20);
  opt->set_decay(v1::OptimizerConfig::LINEAR);
  opt->set_beta1(0.8f);
  opt->set_beta2(0.99f);
  opt->set_eps(1e-6f);
  opt->set_weight_decay(0.0f);
  opt->set_grad_clip(0.5f);
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

class WireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&workers_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel_->WaitForConnected(Deadline(std::chrono::seconds(10))));
    job_stub_ = v1::JobService::NewStub(channel_);
    worker_stub_ = v1::WorkerService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) {
      server_->Shutdown(Deadline(std::chrono::seconds(5)));
      server_->Wait();
    }
  }

  static std::chrono::system_clock::time_point Deadline(std::chrono::milliseconds from_now) {
    return std::chrono::system_clock::now() + from_now;
  }

  // Reads a whole WatchJob stream.
  std::vector<v1::JobEvent> Watch(int64_t from_sequence, grpc::Status* status) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(std::chrono::seconds(10)));
    v1::WatchJobRequest request;
    request.set_job_id("job-1");
    request.set_from_sequence(from_sequence);
    auto reader = job_stub_->WatchJob(&context, request);
    std::vector<v1::JobEvent> events;
    v1::JobEvent event;
    while (reader->Read(&event)) events.push_back(event);
    *status = reader->Finish();
    return events;
  }

  TestJobService jobs_;
  TestWorkerService workers_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> job_stub_;
  std::unique_ptr<v1::WorkerService::Stub> worker_stub_;
};

TEST_F(WireTest, HealthServiceAnswersServing) {
  ASSERT_NE(server_->GetHealthCheckService(), nullptr);
  // grpc.health.v1.Health/Check through the generic stub: the request HealthCheckRequest{service:
  // ""} encodes to no bytes; HealthCheckResponse{status: SERVING (1)} encodes to 08 01.
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  context.set_deadline(Deadline(std::chrono::seconds(10)));
  grpc::ByteBuffer request(nullptr, 0);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

TEST_F(WireTest, SubmitJobRoundTripsAFullSpec) {
  v1::SubmitJobRequest request;
  request.set_submission_id("sub-1");
  *request.mutable_spec() = FullSpec();
  request.set_priority(-3);

  // Every section of JobSpec is populated, so a field added to the schema is noticed here.
  const auto* descriptor = v1::JobSpec::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    EXPECT_TRUE(request.spec().GetReflection()->HasField(request.spec(), descriptor->field(i)))
        << descriptor->field(i)->name();
  }

  grpc::ClientContext context;
  context.set_deadline(Deadline(std::chrono::seconds(10)));
  v1::Job job;
  grpc::Status status = job_stub_->SubmitJob(&context, request, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job.id(), "job-sub-1");
  EXPECT_EQ(job.submission_id(), "sub-1");
  EXPECT_EQ(job.name(), "moe-tiny.1");
  EXPECT_EQ(job.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(job.priority(), -3);
  EXPECT_EQ(job.create_time().seconds(), 1700000000);
  EXPECT_FALSE(job.has_latest_checkpoint_step());
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  EXPECT_TRUE(differencer.Compare(job.spec(), request.spec())) << diff;
  // Presence of explicit zeros in optional fields survives the wire.
  EXPECT_TRUE(job.spec().model().has_first_dense_layers());
  EXPECT_EQ(job.spec().model().first_dense_layers(), 0);
  EXPECT_TRUE(job.spec().restart().has_max_restarts());
  EXPECT_TRUE(job.spec().data().has_seed());
}

TEST_F(WireTest, SubmitJobErrorStatusArrives) {
  grpc::ClientContext context;
  v1::Job job;
  grpc::Status status = job_stub_->SubmitJob(&context, v1::SubmitJobRequest(), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "submission_id is required");
}

TEST_F(WireTest, WatchJobStreamsAllEvents) {
  grpc::Status status;
  std::vector<v1::JobEvent> events = Watch(0, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(events.size(), static_cast<size_t>(kWatchEvents));
  for (int i = 0; i < kWatchEvents; ++i) {
    EXPECT_EQ(events[i].sequence(), i);
    EXPECT_EQ(events[i].time().seconds(), 1700000000 + i);
  }
  EXPECT_EQ(events[0].event_case(), v1::JobEvent::kStateChange);
  EXPECT_EQ(events[0].state_change().from(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(events[0].state_change().to(), v1::JOB_STATE_SCHEDULED);
  ASSERT_EQ(events[2].event_case(), v1::JobEvent::kStepMetrics);
  const v1::StepMetrics& m = events[2].step_metrics();
  EXPECT_EQ(m.step(), 10);
  EXPECT_DOUBLE_EQ(m.loss(), 3.5);
  ASSERT_TRUE(m.has_eval_loss());
  EXPECT_DOUBLE_EQ(m.eval_loss(), 3.75);
  EXPECT_DOUBLE_EQ(m.lr(), 3e-4);
  EXPECT_DOUBLE_EQ(m.grad_norm(), 0.5);
  EXPECT_DOUBLE_EQ(m.tokens_per_s(), 12345.0);
  EXPECT_DOUBLE_EQ(m.expert_load_max_over_mean(), 1.25);
  EXPECT_EQ(m.tokens_seen(), 20480);
  ASSERT_EQ(events[3].event_case(), v1::JobEvent::kCheckpointSaved);
  EXPECT_EQ(events[3].checkpoint_saved().step(), 10);
  EXPECT_EQ(events[3].checkpoint_saved().path(), "/ckpt/job-1/step-00000010");
  ASSERT_EQ(events[4].event_case(), v1::JobEvent::kStateChange);
  EXPECT_EQ(events[4].state_change().to(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(events[4].state_change().reason(), "done");
}

TEST_F(WireTest, WatchJobResumesFromSequence) {
  grpc::Status status;
  std::vector<v1::JobEvent> events = Watch(3, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].sequence(), 3);
  EXPECT_EQ(events[0].event_case(), v1::JobEvent::kCheckpointSaved);
  EXPECT_EQ(events[1].sequence(), 4);

  EXPECT_TRUE(Watch(kWatchEvents, &status).empty());
  EXPECT_TRUE(status.ok());
  Watch(-1, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(WireTest, KvWaitPastTheCallDeadlineIsDeadlineExceeded) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(std::chrono::milliseconds(200)));
  v1::KvWaitRequest request;
  request.set_job_id("job-1");
  request.set_attempt(1);
  request.set_key("never-set");
  v1::KvWaitResponse response;
  auto start = std::chrono::steady_clock::now();
  grpc::Status status = worker_stub_->KvWait(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
}

TEST_F(WireTest, KvWaitPastItsTimeoutIsDeadlineExceeded) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(std::chrono::seconds(10)));
  v1::KvWaitRequest request;
  request.set_job_id("job-1");
  request.set_attempt(1);
  request.set_key("never-set");
  request.mutable_timeout()->set_nanos(100'000'000);
  v1::KvWaitResponse response;
  grpc::Status status = worker_stub_->KvWait(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(status.error_message(), "key not set: never-set");  // the server's, not the client's
}

TEST_F(WireTest, KvWaitReturnsAValueSetWhileWaitingAndScopesByAttempt) {
  // A value of attempt 1 is invisible to attempt 2.
  {
    grpc::ClientContext context;
    v1::KvSetRequest set;
    set.set_job_id("job-1");
    set.set_attempt(1);
    set.set_key("nccl-id");
    set.set_value(std::string("stale\0id", 8));
    v1::KvSetResponse ignored;
    ASSERT_TRUE(worker_stub_->KvSet(&context, set, &ignored).ok());
  }
  std::future<std::pair<grpc::Status, std::string>> waiter = std::async(std::launch::async, [&] {
    grpc::ClientContext context;
    context.set_deadline(Deadline(std::chrono::seconds(10)));
    v1::KvWaitRequest request;
    request.set_job_id("job-1");
    request.set_attempt(2);
    request.set_key("nccl-id");
    v1::KvWaitResponse response;
    grpc::Status status = worker_stub_->KvWait(&context, request, &response);
    return std::make_pair(status, response.value());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  const std::string id("\x01\x00\xff unique id", 13);
  {
    grpc::ClientContext context;
    v1::KvSetRequest set;
    set.set_job_id("job-1");
    set.set_attempt(2);
    set.set_key("nccl-id");
    set.set_value(id);
    v1::KvSetResponse ignored;
    ASSERT_TRUE(worker_stub_->KvSet(&context, set, &ignored).ok());
  }
  auto [status, value] = waiter.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, id);
}

TEST_F(WireTest, UnimplementedRpcIsUnimplemented) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id("job-1");
  v1::Job job;
  EXPECT_EQ(job_stub_->GetJob(&context, request, &job).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace moetrain

#include "client/run_command.h"

#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "client/event_printer.h"
#include "client/job_follower.h"
#include "client/terminal_text.h"
#include "engine/backend/device_query.h"
#include "engine/core/log.h"
#include "engine/train/checkpoint.h"
#include "engine/train/memory_estimate.h"
#include "moetrain/v1/connect.h"
#include "moetrain/v1/coordinator.grpc.pb.h"
#include "moetrain/v1/job_spec.h"
#include "server/coordinator_server.h"
#include "worker/job_config.h"
#include "worker/worker.h"

namespace moetrain {
namespace {

int Fail(const absl::Status& status, int exit_code) {
  // Reasons and paths in the message come from the spec and the worker: bounded and escaped.
  std::fprintf(stderr, "moetrain: %s\n",
               TerminalSafe(Abbreviate(status.message(), kMaxErrorMessageBytes)).c_str());
  return exit_code;
}

// `text` as one word of a POSIX shell command: as it is when that is safe, else single-quoted.
std::string ShellWord(const std::string& text) {
  constexpr std::string_view kPlain = "@%_+=:,./-";
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [&](char c) {
    return absl::ascii_isalnum(c) || kPlain.find(c) != std::string_view::npos;
  });
  if (plain) return text;
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "'\\''"}}), "'");
}

// The command that continues this run where it stopped: the same job, steps, directory, device,
// memory limit and output form.
std::string ResumeCommand(const RunOptions& options) {
  std::string command = absl::StrCat("moetrain run ", ShellWord(options.spec_path), " --resume");
  if (options.steps > 0) absl::StrAppend(&command, " --steps ", options.steps);
  if (!options.checkpoint_dir.empty()) {
    absl::StrAppend(&command, " --checkpoint-dir ", ShellWord(options.checkpoint_dir));
  }
  if (!options.device.empty()) absl::StrAppend(&command, " --device ", ShellWord(options.device));
  if (!options.memory_limit.empty()) {
    absl::StrAppend(&command, " --memory-limit ", ShellWord(options.memory_limit));
  }
  if (options.json) absl::StrAppend(&command, " --json");
  return command;
}

// A temporary directory for the in-process coordinator's store, removed when done.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp", "/moetrain-run.XXXXXX");
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// SIGINT and SIGTERM, blocked in every thread and taken by one that tells the worker to stop
// after a checkpoint. Blocked before any thread starts, so that all inherit the mask.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &previous_);
  }
  ~StopSignals() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  void OnSignal(Worker* worker) {
    thread_ = std::thread([this, worker] {
      const timespec tick = {0, 100'000'000};
      while (!done_.load()) {
        if (sigtimedwait(&signals_, nullptr, &tick) > 0) worker->Shutdown();
      }
    });
  }

 private:
  sigset_t signals_, previous_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int RunJob(const RunOptions& options) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(options.spec_path);
  if (!spec.ok()) return Fail(spec.status(), 2);
  if (options.steps > 0) spec->mutable_train()->set_steps(options.steps);
  if (options.device == "cpu") {
    spec->mutable_resources()->set_device(v1::ResourceConfig::CPU);
  } else if (options.device == "cuda") {
    spec->mutable_resources()->set_device(v1::ResourceConfig::CUDA);
  } else if (!options.device.empty()) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--device = '", options.device, "' is neither 'cpu' nor 'cuda'")),
                2);
  }
  const bool cuda = spec->resources().device() == v1::ResourceConfig::CUDA;
  std::string checkpoint_dir = options.checkpoint_dir;
  if (checkpoint_dir.empty()) checkpoint_dir = spec->checkpoint().dir();
  if (checkpoint_dir.empty()) checkpoint_dir = "checkpoints";
  spec->mutable_checkpoint()->set_dir(checkpoint_dir);
  // Everything the worker would refuse, refused here before anything starts: a CUDA job on a
  // machine without a usable GPU too (TrainerConfigFromSpec names the field and the CUDA error).
  absl::StatusOr<TrainerConfig> config = TrainerConfigFromSpec(*spec, checkpoint_dir);
  if (!config.ok()) {
    // The spec's validation said what is wrong; when --steps cut the schedule below its warmup,
    // the likely wish was a short run of the full job, which --stop-at-step gives.
    const int64_t warmup = spec->train().optimizer().warmup_steps();
    if (options.steps > 0 && warmup > options.steps) {
      return Fail(absl::InvalidArgumentError(
                      absl::StrCat(config.status().message(), " (train.steps set by --steps ",
                                   options.steps, "): pass --stop-at-step ", options.steps,
                                   " instead to stop there with the spec's full schedule, or lower "
                                   "train.optimizer.warmup_steps in the spec")),
                  2);
    }
    return Fail(config.status(), 2);
  }
  const int64_t stop_at_step = options.stop_at_step.value_or(0);
  if (options.stop_at_step.has_value() && (stop_at_step < 1 || stop_at_step > config->steps)) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--stop-at-step = ", stop_at_step,
                                                " is not in [1, train.steps = ", config->steps,
                                                options.steps > 0 ? " (--steps)]" : "]")),
        2);
  }
  config->stop_after_step = stop_at_step;
  if (spec->resources().devices_per_worker() > 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "resources.devices_per_worker = ", spec->resources().devices_per_worker(),
                    ": moetrain run trains on one rank (one ", cuda ? "GPU" : "CPU",
                    "); submit the job to a coordinator (moetrain submit)")),
                2);
  }
  if (config->parallel.world_size() > 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "resources.workers = ", spec->resources().workers(),
                    ": moetrain run trains on one rank; submit the job to a coordinator with ",
                    config->parallel.world_size(), " workers (moetrain submit)")),
                2);
  }
  // The GPU it trains on (TrainerConfigFromSpec has checked that there is one).
  const DeviceReport gpus = cuda ? QueryDevices() : DeviceReport();
  const int64_t gpu_memory = gpus.gpus.empty() ? 0 : gpus.gpus.front().memory_bytes;
  // A model too large for this machine is refused before anything is allocated, with both figures.
  int64_t memory_limit = 0;
  if (!options.memory_limit.empty()) {
    absl::StatusOr<int64_t> limit = ParseByteSize(options.memory_limit, "--memory-limit");
    if (!limit.ok()) return Fail(limit.status(), 2);
    memory_limit = *limit;
  } else if (absl::StatusOr<int64_t> machine = MachineMemoryBytes(); machine.ok()) {
    memory_limit = *machine;
  }
  // On a GPU the estimate must fit the GPU's memory, and the host only a checkpoint's copy.
  const absl::Status fits = CheckTrainingMemory(
      *config, EstimateTrainingMemory(*config), memory_limit,
      options.memory_limit.empty() ? "this machine's memory; --memory-limit sets another limit"
                                   : "--memory-limit");
  if (!fits.ok()) return Fail(fits, 2);
  const std::string root = absl::StrCat(checkpoint_dir, "/", spec->name());
  absl::StatusOr<std::vector<int64_t>> existing = ListCheckpointSteps(root);
  if (!existing.ok()) return Fail(existing.status(), 1);
  if (!options.resume && !existing->empty()) {
    // Never train over a job's checkpoints by accident.
    return Fail(absl::FailedPreconditionError(
                    absl::StrCat("job ", spec->name(), " already has checkpoints in ", root,
                                 " (newest: step ", existing->back(),
                                 "): pass --resume to continue it, or choose another "
                                 "--checkpoint-dir")),
                2);
  }
  if (!existing->empty() && existing->back() > config->steps) {
    // Nothing to train, and no checkpoint at train.steps to finish on: say so before starting.
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "train.steps = ", config->steps, options.steps > 0 ? " (--steps)" : "",
                    " is below step ", existing->back(), ", the newest checkpoint of job ",
                    spec->name(), " in ", root, ": nothing to train; pass a larger --steps")),
                2);
  }
  if (stop_at_step > 0 && !existing->empty() && stop_at_step <= existing->back()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "--stop-at-step = ", stop_at_step, " is not beyond step ", existing->back(),
                    ", the newest checkpoint of job ", spec->name(), " in ", root,
                    ", where --resume continues",
                    existing->back() < config->steps
                        ? absl::StrCat(": pass a step in [", existing->back() + 1,
                                       ", train.steps = ", config->steps, "]")
                        : absl::StrCat(" (train.steps = ", config->steps, ": the job is done)"))),
                2);
  }

  EventPrinter printer(
      {.json = options.json, .total_steps = config->steps, .job_label = spec->name()});
  if (options.resume && existing->empty()) {
    v1::JobEvent note;
    note.mutable_log_line()->set_text(absl::StrCat("no checkpoint of job ", spec->name(), " in ",
                                                   checkpoint_dir, ": starting from step 0"));
    printer.Print(note);
  }
  if (!options.json) {
    std::printf(
        "job %s: %lld steps of %lld × %lld tokens%s, checkpoints in %s\n", spec->name().c_str(),
        static_cast<long long>(config->steps), static_cast<long long>(config->data.batch_size),
        static_cast<long long>(config->data.seq_len),
        stop_at_step > 0 ? absl::StrCat(", stopping after step ", stop_at_step).c_str() : "",
        root.c_str());
    std::fflush(stdout);
  }

  StopSignals signals;
  LogEnabled().store(false);
  ScratchDir scratch;
  if (scratch.path().empty()) {
    return Fail(absl::InternalError("cannot create a temporary directory for the job's state"), 1);
  }
  server::CoordinatorServerOptions coordinator;
  coordinator.listen = "";  // in-process only
  coordinator.http_listen = "";
  coordinator.state_db = scratch.path() + "/state.db";
  coordinator.fleet.checkpoint_dir = checkpoint_dir;
  // The job's directory is <dir>/<name>, where a person finds and resumes it by name.
  coordinator.fleet.checkpoint_naming = server::CheckpointNaming::kJobName;
  absl::StatusOr<std::unique_ptr<server::CoordinatorServer>> server =
      server::CoordinatorServer::Start(coordinator);
  if (!server.ok()) return Fail(server.status(), 1);
  Connection connection;
  connection.channel = (*server)->InProcessChannel();

  WorkerOptions worker_options;
  worker_options.name = "in-process";
  worker_options.version = MOETRAIN_VERSION;
  worker_options.threads = omp_get_max_threads();
  worker_options.memory_limit_bytes = memory_limit;
  worker_options.stop_after_step = stop_at_step;
  if (cuda) {
    // One rank on the first GPU: the job's gang of one.
    worker_options.device = v1::ResourceConfig::CUDA;
    worker_options.device_count = 1;
    worker_options.device_memory_bytes = gpu_memory;
  }
  Worker worker(connection, worker_options);
  signals.OnSignal(&worker);

  std::unique_ptr<v1::JobService::Stub> jobs = v1::JobService::NewStub(connection.channel);
  v1::SubmitJobRequest submit;
  submit.set_submission_id("run");
  *submit.mutable_spec() = *spec;
  v1::Job job;
  {
    grpc::ClientContext context;
    const grpc::Status status = jobs->SubmitJob(&context, submit, &job);
    if (!status.ok()) return Fail(FromGrpcStatus(status), 2);
  }

  // The worker runs until the job is over, or until a signal stops it after a checkpoint; then
  // the watch below is cut and one last read prints what the worker reported on its way out.
  absl::Mutex mu;
  bool worker_done = false;
  grpc::ClientContext* watch = nullptr;
  absl::Status worker_status;
  std::thread worker_thread([&] {
    worker_status = worker.Run();
    absl::MutexLock lock(&mu);
    worker_done = true;
    if (watch != nullptr) watch->TryCancel();
  });

  int64_t next_sequence = 0;
  v1::JobState final_state = v1::JOB_STATE_UNSPECIFIED;
  std::string final_reason;
  for (bool last_read = false; !last_read;) {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_job_id(job.id());
    request.set_from_sequence(next_sequence);
    {
      absl::MutexLock lock(&mu);
      last_read = worker_done;
      request.set_no_wait(last_read);
      watch = &context;
    }
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader = jobs->WatchJob(&context, request);
    for (v1::JobEvent event; reader->Read(&event);) {
      next_sequence = event.sequence() + 1;
      if (event.has_state_change()) {
        // Scheduling chatter is for `moetrain logs`; here only the end matters.
        if (IsFinalJobState(event.state_change().to())) {
          final_state = event.state_change().to();
          final_reason = event.state_change().reason();
        }
        continue;
      }
      printer.Print(event);
    }
    reader->Finish().IgnoreError();
    {
      absl::MutexLock lock(&mu);
      watch = nullptr;
    }
    if (final_state != v1::JOB_STATE_UNSPECIFIED) break;
  }
  worker.Shutdown();
  worker_thread.join();
  (*server)->Shutdown();

  if (!worker_status.ok()) return Fail(worker_status, 1);
  if (final_state == v1::JOB_STATE_FAILED || final_state == v1::JOB_STATE_CANCELLED) {
    return Fail(absl::AbortedError(absl::StrCat("job ", spec->name(), " ",
                                                JobStateLabel(final_state), ": ", final_reason)),
                1);
  }
  // Not SUCCEEDED: the worker stopped the job with a checkpoint (--stop-at-step or a signal).
  printer.Summary({.stopped = final_state != v1::JOB_STATE_SUCCEEDED,
                   .resume_command = ResumeCommand(options)});
  return 0;
}

}  // namespace moetrain

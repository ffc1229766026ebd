#include "client/job_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/event_printer.h"
#include "client/terminal_text.h"
#include "moetrain/v1/job_spec.h"
#include "moetrain/v1/proto_time.h"

namespace moetrain {
namespace {

// Columns padded to their widest cell, two spaces apart; the last column is not padded. Cells
// are escaped for the terminal: most hold the coordinator's strings.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

  void AddRow(std::vector<std::string> row) {
    for (std::string& cell : row) cell = TerminalSafe(cell);
    rows_.push_back(std::move(row));
  }

  std::string Render() const {
    std::vector<size_t> widths(rows_.front().size(), 0);
    for (const std::vector<std::string>& row : rows_) {
      for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
    }
    std::string out;
    for (const std::vector<std::string>& row : rows_) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) {
        absl::StrAppend(&line, row[i]);
        if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
      }
      absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string FormatTime(const google::protobuf::Timestamp& timestamp, absl::Time now) {
  const absl::Time time = TimeFromProto(timestamp);
  if (time == absl::InfinitePast()) return "-";
  return absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", time, absl::UTCTimeZone()), " (",
                      FormatAge(time, now), " ago)");
}

// A time that may lie ahead: "... (in 4s)" then, else as FormatTime.
std::string FormatComingTime(const google::protobuf::Timestamp& timestamp, absl::Time now) {
  const absl::Time time = TimeFromProto(timestamp);
  if (time <= now) return FormatTime(timestamp, now);
  return absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", time, absl::UTCTimeZone()), " (in ",
                      FormatAge(now, time), ")");
}

std::string FormatLoss(double loss) { return absl::StrFormat("%.4f", loss); }

// "120/300": the last reported step of the job over its train.steps.
std::string StepOfTotal(const v1::Job& job) {
  return absl::StrCat(job.has_last_metrics() ? job.last_metrics().step() : 0, "/",
                      job.spec().train().steps());
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string DescribeMetrics(const v1::StepMetrics& m, int64_t total_steps) {
  std::vector<std::string> parts = {
      absl::StrCat("step ", m.step(), "/", total_steps),
      absl::StrCat("loss ", FormatLoss(m.loss())),
  };
  if (m.has_eval_loss()) parts.push_back(absl::StrCat("eval loss ", FormatLoss(m.eval_loss())));
  if (m.has_best_possible_loss()) {
    parts.push_back(absl::StrCat("best possible ", FormatLoss(m.best_possible_loss())));
  }
  parts.push_back(absl::StrFormat("lr %.2e", m.lr()));
  parts.push_back(absl::StrFormat("grad norm %.3f", m.grad_norm()));
  parts.push_back(absl::StrFormat("%.0f tokens/s", m.tokens_per_s()));
  parts.push_back(absl::StrCat("tokens seen ", m.tokens_seen()));
  parts.push_back(absl::StrFormat("expert load max/mean %.2f", m.expert_load_max_over_mean()));
  parts.push_back(absl::StrFormat("aux loss %.4g", m.aux_loss()));
  if (m.has_mtp_loss()) parts.push_back(absl::StrCat("mtp loss ", FormatLoss(m.mtp_loss())));
  if (m.dropped_tokens() > 0) parts.push_back(absl::StrCat("dropped tokens ", m.dropped_tokens()));
  if (m.mfu() > 0) parts.push_back(absl::StrFormat("MFU %.1f%%", 100 * m.mfu()));
  if (m.device_memory_bytes() > 0 || m.device_memory_peak_bytes() > 0) {
    parts.push_back(absl::StrFormat("device memory %.2f GiB (peak %.2f GiB)",
                                    m.device_memory_bytes() / kGiB,
                                    m.device_memory_peak_bytes() / kGiB));
  }
  parts.push_back(absl::StrFormat("step time %.3fs", m.step_seconds()));
  return absl::StrJoin(parts, ", ");
}

}  // namespace

absl::StatusOr<v1::JobState> ParseJobStateName(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(absl::StripAsciiWhitespace(name));
  if (!absl::StartsWith(upper, "JOB_STATE_")) upper = absl::StrCat("JOB_STATE_", upper);
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  if (v1::JobState_Parse(upper, &state) && state != v1::JOB_STATE_UNSPECIFIED) return state;
  std::vector<std::string> names;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i) {
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED) {
      names.push_back(JobStateLabel(static_cast<v1::JobState>(i)));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--state = '", Abbreviate(name),
                                                 "' is not a job state; one of ",
                                                 absl::StrJoin(names, ", "), " (any case)"));
}

absl::Time TimeFromProto(const google::protobuf::Timestamp& timestamp) {
  if (timestamp.seconds() == 0 && timestamp.nanos() == 0) return absl::InfinitePast();
  return FromProtoTimestamp(timestamp);
}

std::string FormatAge(absl::Time then, absl::Time now) {
  if (then == absl::InfinitePast() || then - now > absl::Seconds(1)) return "-";
  const int64_t seconds = std::max<int64_t>(0, absl::ToInt64Seconds(now - then));
  if (seconds < 120) return absl::StrCat(seconds, "s");
  if (seconds < 120 * 60) return absl::StrCat(seconds / 60, "m");
  if (seconds < 48 * 3600) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

std::string FormatJobsTable(const std::vector<v1::Job>& jobs, absl::Time now) {
  if (jobs.empty()) return "(no jobs)\n";
  Table table({"ID", "NAME", "STATE", "STEP", "LOSS", "RESTARTS", "AGE"});
  for (const v1::Job& job : jobs) {
    table.AddRow({job.id(), job.name(), JobStateLabel(job.state()), StepOfTotal(job),
                  job.has_last_metrics() ? FormatLoss(job.last_metrics().loss()) : "-",
                  absl::StrCat(job.restarts()), FormatAge(TimeFromProto(job.create_time()), now)});
  }
  return table.Render();
}

std::string FormatJobDescription(const v1::Job& job, absl::Time now) {
  std::vector<std::pair<std::string, std::string>> fields;
  fields.emplace_back("Job", job.id());
  fields.emplace_back("Name", job.name());
  fields.emplace_back("Submission id", job.submission_id());
  fields.emplace_back(
      "State", job.state_reason().empty()
                   ? JobStateLabel(job.state())
                   : absl::StrCat(JobStateLabel(job.state()), " (", job.state_reason(), ")"));
  // Why a waiting job has not started, and when a restart's backoff ends.
  if (!job.waiting_reason().empty()) fields.emplace_back("Waiting", job.waiting_reason());
  if (job.has_next_attempt_time()) {
    fields.emplace_back("Next attempt", FormatComingTime(job.next_attempt_time(), now));
  }
  fields.emplace_back("Priority", absl::StrCat(job.priority()));
  fields.emplace_back("Attempt", job.attempt() == 0 ? "none yet" : absl::StrCat(job.attempt()));
  fields.emplace_back("Restarts", absl::StrCat(job.restarts(), " of at most ",
                                               job.spec().restart().max_restarts()));
  fields.emplace_back("Progress", StepOfTotal(job));
  fields.emplace_back("Latest checkpoint", job.has_latest_checkpoint_step()
                                               ? absl::StrCat("step ", job.latest_checkpoint_step())
                                               : "none");
  fields.emplace_back("Last metrics",
                      job.has_last_metrics()
                          ? DescribeMetrics(job.last_metrics(), job.spec().train().steps())
                          : "none yet");
  fields.emplace_back("Created", FormatTime(job.create_time(), now));
  fields.emplace_back("Updated", FormatTime(job.update_time(), now));

  size_t width = 0;
  for (const auto& [label, value] : fields) width = std::max(width, label.size());
  std::string out;
  for (const auto& [label, value] : fields) {
    absl::StrAppend(&out, label, ":", std::string(width - label.size() + 2, ' '),
                    TerminalSafe(value), "\n");
  }
  // The spec, indented under its label: still YAML, and clearly apart from the fields above.
  absl::StrAppend(&out, "Spec:\n");
  for (absl::string_view line :
       absl::StrSplit(JobSpecToYaml(job.spec()), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "  ", TerminalSafe(line), "\n");
  }
  return out;
}

std::string FormatCheckpointsTable(const v1::ListCheckpointsResponse& response, absl::Time now) {
  if (response.checkpoints().empty()) return "(no checkpoints)\n";
  Table table({"STEP", "TOKENS", "ATTEMPT", "AGE", "PATH"});
  for (const v1::Checkpoint& checkpoint : response.checkpoints()) {
    table.AddRow({absl::StrCat(checkpoint.step()), absl::StrCat(checkpoint.tokens_seen()),
                  absl::StrCat(checkpoint.attempt()),
                  FormatAge(TimeFromProto(checkpoint.create_time()), now), checkpoint.path()});
  }
  return table.Render();
}

std::string FormatWorkersTable(const v1::ListWorkersResponse& response, absl::Time now) {
  if (response.workers().empty()) return "(no workers)\n";
  Table table({"ID", "NAME", "STATE", "DEVICES", "THREADS", "JOB", "HEARTBEAT", "VERSION"});
  for (const v1::WorkerInfo& worker : response.workers()) {
    const std::string state(
        absl::StripPrefix(v1::WorkerState_Name(worker.state()), "WORKER_STATE_"));
    std::string devices =
        absl::StrCat(absl::AsciiStrToLower(v1::ResourceConfig::Device_Name(worker.device())), " x",
                     worker.device_count());
    // Each device's memory, where the worker knows it (its GPUs; 0 on the CPU).
    if (worker.device_memory_bytes() > 0) {
      absl::StrAppendFormat(&devices, " (%.1f GiB)", worker.device_memory_bytes() / kGiB);
    }
    const std::string job =
        worker.current_job_id().empty()
            ? "-"
            : absl::StrCat(worker.current_job_id(), " (attempt ", worker.current_attempt(), ")");
    table.AddRow({worker.id(), worker.name(), state, devices, absl::StrCat(worker.threads()), job,
                  absl::StrCat(FormatAge(TimeFromProto(worker.last_heartbeat()), now), " ago"),
                  worker.version().empty() ? "-" : worker.version()});
  }
  return table.Render();
}

absl::StatusOr<std::string> MessageToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // protobuf's own Status type before protobuf 22, absl::Status after.
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print ", message.GetTypeName(),
                                            " as JSON: ", std::string(status.message())));
  }
  return json;
}

}  // namespace moetrain

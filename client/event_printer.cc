#include "client/event_printer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/terminal_text.h"
#include "moetrain/v1/proto_time.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

using nlohmann::json;

constexpr int kBarWidth = 24;
// Erases the terminal line the cursor is on (the bar) before other text is written over it.
constexpr char kClearLine[] = "\r\033[K";

// "M:SS", or "H:MM:SS" from an hour on.
std::string ClockDuration(absl::Duration duration) {
  const int64_t s = absl::ToInt64Seconds(duration + absl::Milliseconds(500));
  return s >= 3600 ? absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60)
                   : absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// The event's time as the coordinator recorded it; now for an event without one.
absl::Time EventTime(const v1::JobEvent& event) {
  if (!event.has_time()) return absl::Now();
  return FromProtoTimestamp(event.time());
}

json NullOr(bool present, double value) { return present ? json(value) : json(nullptr); }

// One line of JSON. Log lines come from workers: invalid UTF-8 is replaced, not thrown about.
std::string Dump(const json& value) {
  return value.dump(/*indent=*/-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

}  // namespace

std::string JobStateLabel(v1::JobState state) {
  return std::string(absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

EventPrinter::EventPrinter(EventPrinterOptions options)
    : options_(std::move(options)),
      bar_(!options_.json &&
           (options_.progress == ProgressStyle::kBar ||
            (options_.progress == ProgressStyle::kAuto && isatty(fileno(options_.out))))) {}

void EventPrinter::Print(const v1::JobEvent& event) {
  if (event.event_case() == v1::JobEvent::EVENT_NOT_SET) return;
  const absl::Time time = EventTime(event);
  if (!first_time_.has_value()) first_time_ = time;
  last_time_ = time;
  switch (event.event_case()) {
    case v1::JobEvent::kStepMetrics:
      PrintStep(event.step_metrics(), time);
      break;
    case v1::JobEvent::kCheckpointSaved:
      PrintCheckpoint(event.checkpoint_saved());
      break;
    case v1::JobEvent::kLogLine:
      if (options_.json) {
        PrintJson(Dump({{"message", event.log_line().text()}}));
      } else {
        PrintLine(event.log_line().text());
      }
      break;
    case v1::JobEvent::kStateChange: {
      const v1::StateChange& change = event.state_change();
      if (options_.json) {
        PrintJson(Dump({{"state", JobStateLabel(change.to())}, {"reason", change.reason()}}));
      } else {
        PrintLine(change.reason().empty()
                      ? absl::StrCat("state ", JobStateLabel(change.to()))
                      : absl::StrCat("state ", JobStateLabel(change.to()), ": ", change.reason()));
      }
      break;
    }
    case v1::JobEvent::EVENT_NOT_SET:
      break;
  }
}

void EventPrinter::PrintStep(const v1::StepMetrics& m, absl::Time time) {
  if (!first_step_.has_value()) first_step_ = {m.step(), time};
  last_step_ = m;
  if (m.has_eval_loss()) last_eval_loss_ = m.eval_loss();
  if (m.has_best_possible_loss()) best_possible_loss_ = m.best_possible_loss();
  if (options_.json) {
    // Exactly the keys `moetrain run --json` has always printed: scripts read them.
    json line = {{"step", m.step()},
                 {"loss", m.loss()},
                 {"eval_loss", NullOr(m.has_eval_loss(), m.eval_loss())},
                 {"lr", m.lr()},
                 {"grad_norm", NullOr(std::isfinite(m.grad_norm()), m.grad_norm())},
                 {"tokens_per_s", m.tokens_per_s()},
                 {"expert_load_max_over_mean", m.expert_load_max_over_mean()},
                 {"aux_loss", m.aux_loss()},
                 {"tokens_seen", m.tokens_seen()}};
    // Only a job on a device reports its memory (0 on the CPU), and only it gets these keys,
    // so a CPU run prints what it always has.
    if (m.has_mtp_loss()) line["mtp_loss"] = m.mtp_loss();
    if (m.device_memory_bytes() > 0 || m.device_memory_peak_bytes() > 0) {
      line["device_memory_bytes"] = m.device_memory_bytes();
      line["device_memory_peak_bytes"] = m.device_memory_peak_bytes();
    }
    PrintJson(Dump(line));
    return;
  }
  std::string eval = m.has_eval_loss() ? absl::StrFormat("  eval %.4f", m.eval_loss()) : "";
  if (m.has_mtp_loss()) eval += absl::StrFormat("  mtp %.4f", m.mtp_loss());
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const std::string memory =
      m.device_memory_bytes() > 0 || m.device_memory_peak_bytes() > 0
          ? absl::StrFormat("  mem %.2f GiB (peak %.2f GiB)", m.device_memory_bytes() / kGiB,
                            m.device_memory_peak_bytes() / kGiB)
          : "";
  const std::string stats = absl::StrFormat(
      "loss %.4f%s  lr %.2e  |g| %.3f  %.0f tok/s  load %.2f%s", m.loss(), eval, m.lr(),
      m.grad_norm(), m.tokens_per_s(), m.expert_load_max_over_mean(), memory);
  const std::string count = options_.total_steps > 0
                                ? absl::StrFormat("step %d/%d", m.step(), options_.total_steps)
                                : absl::StrFormat("step %d", m.step());
  if (!bar_) {
    absl::FPrintF(options_.out, "%s  %s  elapsed %s\n", count, stats,
                  ClockDuration(time - *first_time_));
    std::fflush(options_.out);
    return;
  }
  // Without a total there is nothing to fill: the count and the stats only.
  std::string bar, eta;
  const int64_t total = options_.total_steps;
  if (total > 0) {
    const int filled =
        static_cast<int>(kBarWidth * std::clamp<int64_t>(m.step(), 0, total) / total);
    bar = absl::StrCat(" [", std::string(filled, '#'), std::string(kBarWidth - filled, '.'), "]");
    // At the rate since the first step event this printer saw; unknown until a second one.
    const auto& [first_step, first_time] = *first_step_;
    if (m.step() > first_step) {
      const absl::Duration per_step = (time - first_time) / (m.step() - first_step);
      eta = "  ETA " + ClockDuration(per_step * std::max<int64_t>(0, total - m.step()));
    }
  }
  absl::FPrintF(options_.out, "%s%s%s %s%s", kClearLine, count, bar, stats, eta);
  bar_line_open_ = true;
  // Keep the last step and every evaluation on screen.
  if (m.step() == options_.total_steps || m.has_eval_loss()) EndBarLine();
  std::fflush(options_.out);
}

void EventPrinter::PrintCheckpoint(const v1::CheckpointSaved& checkpoint) {
  last_checkpoint_ = checkpoint;
  if (options_.json) {
    PrintJson(Dump({{"checkpoint", checkpoint.path()}, {"step", checkpoint.step()}}));
  } else {
    PrintLine(absl::StrCat("checkpoint ", checkpoint.path()));
  }
}

void EventPrinter::PrintLine(const std::string& text) {
  if (bar_line_open_) {
    // Overwrite the bar; the next step event draws it again below the text.
    absl::FPrintF(options_.out, "%s", kClearLine);
    bar_line_open_ = false;
  }
  // Log lines, reasons and paths come from workers and the coordinator.
  absl::FPrintF(options_.out, "%s\n", TerminalSafe(text));
  std::fflush(options_.out);
}

void EventPrinter::PrintJson(const std::string& line) {
  absl::FPrintF(options_.out, "%s\n", JsonTerminalSafe(line));
  std::fflush(options_.out);
}

void EventPrinter::EndBarLine() {
  if (!bar_line_open_) return;
  absl::FPrintF(options_.out, "\n");
  bar_line_open_ = false;
}

void EventPrinter::Summary(const RunEnd& end) {
  int64_t steps = 0, tokens_seen = 0;
  if (last_step_.has_value()) {
    steps = last_step_->step();
    tokens_seen = last_step_->tokens_seen();
  }
  if (last_checkpoint_.has_value() && last_checkpoint_->step() > steps) {
    steps = last_checkpoint_->step();
    tokens_seen = last_checkpoint_->tokens_seen();
  }
  const absl::Duration elapsed =
      first_time_.has_value() ? *last_time_ - *first_time_ : absl::ZeroDuration();
  const std::string stopped_at =
      options_.total_steps > 0
          ? absl::StrCat("stopped at step ", steps, " of ", options_.total_steps)
          : absl::StrCat("stopped at step ", steps);
  const std::string resume = absl::StrCat("continue with: ", end.resume_command);
  if (options_.json) {
    // The summary stays the last line.
    if (end.stopped) PrintJson(Dump({{"message", absl::StrCat(stopped_at, "; ", resume)}}));
    const json summary = {
        {"summary", true},
        {"job", options_.job_label},
        {"steps", steps},
        {"tokens_seen", tokens_seen},
        {"final_loss", last_step_.has_value() ? json(last_step_->loss()) : json(nullptr)},
        {"eval_loss", NullOr(last_eval_loss_.has_value(), last_eval_loss_.value_or(0))},
        {"best_possible_loss",
         NullOr(best_possible_loss_.has_value(), best_possible_loss_.value_or(0))},
        {"checkpoint",
         last_checkpoint_.has_value() ? json(last_checkpoint_->path()) : json(nullptr)},
        {"elapsed_s", absl::ToDoubleSeconds(elapsed)},
        {"stopped", end.stopped}};
    PrintJson(Dump(summary));
    return;
  }
  EndBarLine();
  std::string line = end.stopped
                         ? absl::StrCat(stopped_at, " in ", ClockDuration(elapsed))
                         : absl::StrFormat("done: %d steps in %s", steps, ClockDuration(elapsed));
  if (last_step_.has_value()) absl::StrAppendFormat(&line, ", loss %.4f", last_step_->loss());
  if (last_eval_loss_.has_value())
    absl::StrAppendFormat(&line, ", eval loss %.4f", *last_eval_loss_);
  if (best_possible_loss_.has_value()) {
    absl::StrAppendFormat(&line, " (the data's entropy rate, the best possible: %.4f)",
                          *best_possible_loss_);
  }
  PrintLine(line);
  if (last_checkpoint_.has_value()) PrintLine("last checkpoint: " + last_checkpoint_->path());
  if (end.stopped) PrintLine(resume);
}

}  // namespace moetrain

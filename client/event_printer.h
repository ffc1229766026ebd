// Prints a job's events (moetrain.v1.JobEvent) as a person or a script wants them: a progress bar
// on a terminal, one plain line per event otherwise, or one JSON object per line. Shared by
// `moetrain logs`, `moetrain submit --follow` and `moetrain run`, so that every command that shows
// training progress shows it the same way. Text lines have their control characters escaped
// (TerminalSafe, client/terminal_text.h); JSON lines escape them as JSON does.
//
//   EventPrinter printer({.json = true, .total_steps = spec.train().steps(), .job_label = id});
//   for (const v1::JobEvent& event : events) printer.Print(event);
//   printer.Summary();
//
// JSON lines (--json), one per event, keys exactly as listed:
//   step metrics   {"step", "loss", "eval_loss" (null unless an evaluation ran), "lr",
//                   "grad_norm" (null when not finite), "tokens_per_s",
//                   "expert_load_max_over_mean", "aux_loss", "tokens_seen"}
//   checkpoint     {"checkpoint": path, "step": n}
//   log line       {"message": text}
//   state change   {"state": "RUNNING", "reason": text} (the state without its JOB_STATE_ prefix;
//                   reason "" when the coordinator gave none)
//   Summary()      {"summary": true, "job", "steps", "tokens_seen", "final_loss", "eval_loss",
//                   "best_possible_loss", "checkpoint", "elapsed_s", "stopped"} (see Summary
//                   below), after a {"message"} line on how to continue when stopped
// A step line is told from the others by its "loss" key, the summary by "summary".
#ifndef MOETRAIN_CLIENT_EVENT_PRINTER_H_
#define MOETRAIN_CLIENT_EVENT_PRINTER_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "moetrain/v1/coordinator.pb.h"

namespace moetrain {

// How text mode shows step metrics.
enum class ProgressStyle {
  kAuto,  // a bar when `out` is a terminal, else lines
  kBar,   // one line redrawn in place, with the step count, a bar and the time left
  kLines  // one line per step event
};

struct EventPrinterOptions {
  // One JSON object per line (the keys above) instead of text.
  bool json = false;
  // The job's train.steps, for the bar and "step N/TOTAL"; 0 = unknown ("step N").
  int64_t total_steps = 0;
  // Names the job in the summary: the job id, or the spec's name for `moetrain run`.
  std::string job_label;
  // Where to print; not owned, flushed after every event.
  FILE* out = stdout;
  ProgressStyle progress = ProgressStyle::kAuto;
};

// How a `moetrain run` ended, for its summary.
struct RunEnd {
  // Before train.steps, with a checkpoint to continue from: by --stop-at-step or a signal.
  bool stopped = false;
  std::string resume_command;  // shown when stopped: the command that continues the run
};

// "RUNNING" for JOB_STATE_RUNNING: the name people and scripts see.
std::string JobStateLabel(v1::JobState state);

// Not thread-safe: one thread prints.
class EventPrinter {
 public:
  explicit EventPrinter(EventPrinterOptions options);

  // Prints one event and remembers what the summary needs. Events without a payload are skipped.
  void Print(const v1::JobEvent& event);

  // The final summary, as `moetrain run --json` has always printed it:
  //   steps        max(the last step event's step, the last checkpoint's step); 0 when neither
  //   tokens_seen  the tokens_seen of whichever of the two gave `steps`
  //   final_loss   the last step event's loss, else null
  //   eval_loss    the last evaluation loss seen, else null
  //   best_possible_loss  StepMetrics.best_possible_loss of the last step that had it, else null
  //   checkpoint   the last checkpoint's path, else null
  //   elapsed_s    from the first event printed to the last, by the coordinator's event times
  //                (the local clock for events without one); 0 before any event
  //   stopped      end.stopped: the run ended before train.steps and can be continued
  // In JSON, a stopped run's summary comes after {"message": "stopped at step N of TOTAL;
  // continue with: <end.resume_command>"}. In text mode: "done: N steps in M:SS, loss L, eval
  // loss E (...)" ("stopped at step N of TOTAL in M:SS, ..." when stopped), the last checkpoint,
  // and when stopped "continue with: <end.resume_command>".
  void Summary(const RunEnd& end = {});

 private:
  void PrintStep(const v1::StepMetrics& metrics, absl::Time time);
  void PrintCheckpoint(const v1::CheckpointSaved& checkpoint);
  void PrintLine(const std::string& text);
  void PrintJson(const std::string& line);
  // Ends the bar's line, so that the next text starts on a fresh line.
  void EndBarLine();

  const EventPrinterOptions options_;
  const bool bar_;  // text mode draws the progress bar

  // Times of the first and the last event printed.
  std::optional<absl::Time> first_time_, last_time_;
  // The first step event (the reference for the rate and the time left).
  std::optional<std::pair<int64_t, absl::Time>> first_step_;
  std::optional<v1::StepMetrics> last_step_;
  std::optional<double> last_eval_loss_;
  std::optional<double> best_possible_loss_;
  std::optional<v1::CheckpointSaved> last_checkpoint_;
  bool bar_line_open_ = false;  // the bar was drawn and its line not ended
};

}  // namespace moetrain

#endif  // MOETRAIN_CLIENT_EVENT_PRINTER_H_

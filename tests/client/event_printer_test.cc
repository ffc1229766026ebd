// EventPrinter: the JSON lines scripts read (exactly the keys `moetrain run --json` prints), the
// summary, and the text forms (plain lines and the terminal bar), printed into a temporary file.
#include "client/event_printer.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moetrain {
namespace {

using nlohmann::json;

// An EventPrinter writing to a temporary file, and what it wrote.
class Capture {
 public:
  Capture() : file_(std::tmpfile()) {}
  ~Capture() { std::fclose(file_); }
  FILE* file() const { return file_; }

  // The options of a text printer writing here, one line per event, of a 10-step job "j".
  EventPrinterOptions TextLines() const {
    return {.json = false,
            .total_steps = 10,
            .job_label = "j",
            .out = file_,
            .progress = ProgressStyle::kLines};
  }

  std::string Text() const {
    std::fflush(file_);
    std::rewind(file_);
    std::string text;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file_)) > 0;) text.append(buffer, n);
    return text;
  }

  std::vector<json> Lines() const {
    std::vector<json> lines;
    std::istringstream in(Text());
    for (std::string line; std::getline(in, line);) {
      lines.push_back(json::parse(line, nullptr, /*allow_exceptions=*/false));
      EXPECT_TRUE(lines.back().is_object()) << line;
    }
    return lines;
  }

 private:
  FILE* file_;
};

v1::JobEvent At(int64_t sequence, int64_t unix_seconds) {
  v1::JobEvent event;
  event.set_sequence(sequence);
  event.mutable_time()->set_seconds(unix_seconds);
  return event;
}

v1::JobEvent Step(int64_t sequence, int64_t unix_seconds, int64_t step, double loss) {
  v1::JobEvent event = At(sequence, unix_seconds);
  v1::StepMetrics* metrics = event.mutable_step_metrics();
  metrics->set_step(step);
  metrics->set_loss(loss);
  metrics->set_lr(0.001);
  metrics->set_grad_norm(0.25);
  metrics->set_tokens_per_s(2048);
  metrics->set_expert_load_max_over_mean(1.5);
  metrics->set_aux_loss(0.125);
  metrics->set_tokens_seen(step * 64);
  return event;
}

v1::JobEvent Checkpoint(int64_t sequence, int64_t unix_seconds, int64_t step) {
  v1::JobEvent event = At(sequence, unix_seconds);
  event.mutable_checkpoint_saved()->set_step(step);
  event.mutable_checkpoint_saved()->set_path("/ck/job/step-" + std::to_string(step));
  event.mutable_checkpoint_saved()->set_tokens_seen(step * 64);
  return event;
}

v1::JobEvent State(int64_t sequence, int64_t unix_seconds, v1::JobState to,
                   const std::string& reason) {
  v1::JobEvent event = At(sequence, unix_seconds);
  event.mutable_state_change()->set_to(to);
  event.mutable_state_change()->set_reason(reason);
  return event;
}

v1::JobEvent Log(int64_t sequence, int64_t unix_seconds, const std::string& text) {
  v1::JobEvent event = At(sequence, unix_seconds);
  event.mutable_log_line()->set_text(text);
  return event;
}

TEST(EventPrinterTest, JsonLinesHaveTheKeysOfRunJson) {
  Capture capture;
  EventPrinter printer({.json = true, .total_steps = 10, .job_label = "j", .out = capture.file()});
  printer.Print(State(0, 100, v1::JOB_STATE_RUNNING, "all 1 ranks are running"));
  printer.Print(Step(1, 101, 1, 2.5));
  v1::JobEvent evaluated = Step(2, 102, 2, 2.25);
  evaluated.mutable_step_metrics()->set_eval_loss(2.125);
  evaluated.mutable_step_metrics()->set_grad_norm(std::numeric_limits<double>::infinity());
  printer.Print(evaluated);
  printer.Print(Checkpoint(3, 103, 2));
  printer.Print(Log(4, 104, "resumed from step 0"));
  printer.Print(v1::JobEvent());  // no payload: nothing printed

  const std::vector<json> lines = capture.Lines();
  ASSERT_EQ(lines.size(), 5u) << capture.Text();
  EXPECT_EQ(lines[0], json({{"state", "RUNNING"}, {"reason", "all 1 ranks are running"}}));
  const json first = {{"step", 1},
                      {"loss", 2.5},
                      {"eval_loss", nullptr},
                      {"lr", 0.001},
                      {"grad_norm", 0.25},
                      {"tokens_per_s", 2048.0},
                      {"expert_load_max_over_mean", 1.5},
                      {"aux_loss", 0.125},
                      {"tokens_seen", 64}};
  EXPECT_EQ(lines[1], first);
  EXPECT_EQ(lines[2].at("eval_loss"), 2.125);
  EXPECT_TRUE(lines[2].at("grad_norm").is_null()) << "a non-finite norm is null";
  EXPECT_EQ(lines[2].size(), first.size());
  EXPECT_EQ(lines[3], json({{"checkpoint", "/ck/job/step-2"}, {"step", 2}}));
  EXPECT_EQ(lines[4], json({{"message", "resumed from step 0"}}));
}

TEST(EventPrinterTest, JsonSummaryAsRunPrintsIt) {
  Capture capture;
  EventPrinter printer(
      {.json = true, .total_steps = 4, .job_label = "tiny", .out = capture.file()});
  printer.Print(State(0, 1000, v1::JOB_STATE_PENDING, "submitted"));
  v1::JobEvent evaluated = Step(1, 1001, 2, 3.0);
  evaluated.mutable_step_metrics()->set_eval_loss(2.75);
  evaluated.mutable_step_metrics()->set_best_possible_loss(1.5);
  printer.Print(evaluated);
  printer.Print(Step(2, 1002, 3, 2.5));
  // A checkpoint past the last step report (log_every skipped it) sets the step count.
  printer.Print(Checkpoint(3, 1003, 4));
  printer.Print(State(4, 1010, v1::JOB_STATE_SUCCEEDED, "finished"));
  printer.Summary();

  const std::vector<json> lines = capture.Lines();
  ASSERT_FALSE(lines.empty());
  const json expected = {{"summary", true},
                         {"job", "tiny"},
                         {"steps", 4},
                         {"tokens_seen", 4 * 64},
                         {"final_loss", 2.5},
                         {"eval_loss", 2.75},
                         {"best_possible_loss", 1.5},
                         {"checkpoint", "/ck/job/step-4"},
                         {"elapsed_s", 10.0},
                         {"stopped", false}};
  EXPECT_EQ(lines.back(), expected);
}

TEST(EventPrinterTest, JsonSummaryWithoutEventsHasNulls) {
  Capture capture;
  EventPrinter printer({.json = true, .total_steps = 4, .job_label = "j", .out = capture.file()});
  printer.Summary();
  const std::vector<json> lines = capture.Lines();
  ASSERT_EQ(lines.size(), 1u);
  const json expected = {{"summary", true},
                         {"job", "j"},
                         {"steps", 0},
                         {"tokens_seen", 0},
                         {"final_loss", nullptr},
                         {"eval_loss", nullptr},
                         {"best_possible_loss", nullptr},
                         {"checkpoint", nullptr},
                         {"elapsed_s", 0.0},
                         {"stopped", false}};
  EXPECT_EQ(lines[0], expected);
}

TEST(EventPrinterTest, TextLinesOnePerEvent) {
  Capture capture;
  EventPrinter printer(capture.TextLines());
  printer.Print(State(0, 100, v1::JOB_STATE_PENDING, "submitted"));
  printer.Print(State(1, 101, v1::JOB_STATE_SCHEDULED, ""));
  printer.Print(Step(2, 165, 1, 2.5));
  printer.Print(Checkpoint(3, 166, 1));
  printer.Print(Log(4, 167, "hello"));
  printer.Summary();
  EXPECT_EQ(capture.Text(),
            "state PENDING: submitted\n"
            "state SCHEDULED\n"
            "step 1/10  loss 2.5000  lr 1.00e-03  |g| 0.250  2048 tok/s  load 1.50  elapsed 1:05\n"
            "checkpoint /ck/job/step-1\n"
            "hello\n"
            "done: 1 steps in 1:07, loss 2.5000\n"
            "last checkpoint: /ck/job/step-1\n");
}

TEST(EventPrinterTest, AStoppedRunSaysWhereAndHowToContinue) {
  const RunEnd end = {.stopped = true, .resume_command = "moetrain run s.yaml --resume"};
  {
    Capture capture;
    EventPrinter printer(capture.TextLines());
    printer.Print(Step(0, 100, 3, 2.5));
    printer.Print(Checkpoint(1, 101, 3));
    printer.Summary(end);
    EXPECT_EQ(
        capture.Text(),
        "step 3/10  loss 2.5000  lr 1.00e-03  |g| 0.250  2048 tok/s  load 1.50  elapsed 0:00\n"
        "checkpoint /ck/job/step-3\n"
        "stopped at step 3 of 10 in 0:01, loss 2.5000\n"
        "last checkpoint: /ck/job/step-3\n"
        "continue with: moetrain run s.yaml --resume\n");
  }
  Capture capture;
  EventPrinter printer({.json = true, .total_steps = 10, .job_label = "j", .out = capture.file()});
  printer.Print(Step(0, 100, 3, 2.5));
  printer.Summary(end);
  const std::vector<json> lines = capture.Lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], json({{"message",
                             "stopped at step 3 of 10; continue with: moetrain run s.yaml "
                             "--resume"}}));
  EXPECT_EQ(lines[2].at("stopped"), true);
  EXPECT_EQ(lines[2].at("steps"), 3);
}

TEST(EventPrinterTest, DeviceMemoryIsShownOnlyWhenReported) {
  v1::JobEvent gpu_step = Step(2, 165, 1, 2.5);
  gpu_step.mutable_step_metrics()->set_device_memory_bytes(int64_t{3} << 30);
  gpu_step.mutable_step_metrics()->set_device_memory_peak_bytes(int64_t{9} << 29);
  {
    Capture capture;
    EventPrinter printer(capture.TextLines());
    printer.Print(State(1, 100, v1::JOB_STATE_RUNNING, ""));
    printer.Print(gpu_step);
    EXPECT_EQ(capture.Text(),
              "state RUNNING\n"
              "step 1/10  loss 2.5000  lr 1.00e-03  |g| 0.250  2048 tok/s  load 1.50  mem 3.00 GiB "
              "(peak 4.50 GiB)  elapsed 1:05\n");
  }
  {
    Capture capture;
    EventPrinter printer(
        {.json = true, .total_steps = 10, .job_label = "j", .out = capture.file()});
    printer.Print(gpu_step);
    printer.Print(Step(3, 166, 2, 2.25));  // a CPU step: no memory keys
    const std::vector<json> lines = capture.Lines();
    ASSERT_EQ(lines.size(), 2u) << capture.Text();
    EXPECT_EQ(lines[0].at("device_memory_bytes"), int64_t{3} << 30);
    EXPECT_EQ(lines[0].at("device_memory_peak_bytes"), int64_t{9} << 29);
    EXPECT_EQ(lines[0].size(), 11u);
    EXPECT_FALSE(lines[1].contains("device_memory_bytes")) << lines[1];
    EXPECT_EQ(lines[1].size(), 9u);
  }
}

TEST(EventPrinterTest, UnknownTotalPrintsTheStepAlone) {
  Capture capture;
  EventPrinter printer({.total_steps = 0,
                        .job_label = "j",
                        .out = capture.file(),
                        .progress = ProgressStyle::kLines});
  printer.Print(Step(0, 100, 7, 1.0));
  EXPECT_TRUE(capture.Text().starts_with("step 7  loss 1.0000")) << capture.Text();
}

TEST(EventPrinterTest, BarRedrawsOneLineAndKeepsEvaluationsAndTheEnd) {
  Capture capture;
  EventPrinter printer({.json = false,
                        .total_steps = 4,
                        .job_label = "j",
                        .out = capture.file(),
                        .progress = ProgressStyle::kBar});
  printer.Print(Step(0, 100, 1, 2.0));
  printer.Print(Step(1, 102, 2, 1.9));
  printer.Print(Log(2, 102, "note"));
  v1::JobEvent evaluated = Step(3, 104, 3, 1.8);
  evaluated.mutable_step_metrics()->set_eval_loss(1.7);
  printer.Print(evaluated);
  printer.Print(Step(4, 106, 4, 1.6));
  const std::string text = capture.Text();
  // Step 1 at 6 of 24 marks; the time left is unknown until a second step.
  EXPECT_TRUE(text.starts_with("\r\033[Kstep 1/4 [######..................] loss 2.0000")) << text;
  EXPECT_EQ(text.find("ETA"), text.find("ETA 0:04")) << text;  // 2 s per step, 2 steps left
  // The log line replaces the bar, the evaluation and the last step stay on screen.
  EXPECT_TRUE(text.find("\r\033[Knote\n") != std::string::npos) << text;
  EXPECT_TRUE(text.find("eval 1.7000") != std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("ETA 0:00\n")) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
}

TEST(EventPrinterTest, InvalidUtf8InALogLineIsReplaced) {
  Capture capture;
  EventPrinter printer({.json = true, .total_steps = 1, .job_label = "j", .out = capture.file()});
  printer.Print(Log(0, 100, "bad \xff byte"));
  const std::vector<json> lines = capture.Lines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("message"), "bad \xEF\xBF\xBD byte");  // U+FFFD
}

TEST(EventPrinterTest, StateLabels) {
  EXPECT_EQ(JobStateLabel(v1::JOB_STATE_RESTARTING), "RESTARTING");
  EXPECT_EQ(JobStateLabel(v1::JOB_STATE_UNSPECIFIED), "UNSPECIFIED");
}

}  // namespace
}  // namespace moetrain

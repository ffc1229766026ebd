// The `moetrain` command line.
//
// In this process, on the CPU or one GPU:
//   moetrain run SPEC.yaml [--checkpoint-dir DIR] [--steps N] [--stop-at-step N] [--resume]
//                [--json] [--memory-limit SIZE] [--device cpu|cuda]
//   moetrain eval --checkpoint DIR/step-XXXXXXXX --data-path FILE --data-format llmc|u16|u32|text
//                 [--batches N] [--json]
//   moetrain export --checkpoint DIR/step-XXXXXXXX --to-hf DIR [--dtype bf16|f32]
//                   [--max-shard-size SIZE] [--force]
//   moetrain import --from-hf DIR --out CHECKPOINT_ROOT [--memory-limit SIZE]
//   moetrain plan SPEC.yaml [--cluster PRESET|FILE] [--gpus N] [--sweep 8,16,...] [--recompute]
//                 [--json]
// Against a coordinator (flags: --coordinator, --token-file, --tls-ca, --tls-cert, --tls-key):
//   moetrain submit SPEC.yaml [--id SUBMISSION_ID] [--priority N] [--follow] [--dry-run] [--json]
//   moetrain jobs [--state S]... [--json]
//   moetrain describe JOB [--json]
//   moetrain logs JOB [-f|--follow] [--reconnect-timeout 60s] [--json]
//   moetrain cancel JOB [--reason TEXT] [--json]
//   moetrain delete JOB [--delete-checkpoints] [--json]
//   moetrain checkpoints JOB [--json]
//   moetrain workers [--json]
// Exit codes: client/job_commands.h (and the footer below).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/dry_run_command.h"
#include "client/eval_command.h"
#include "client/hf_commands.h"
#include "client/job_commands.h"
#include "client/job_plan.h"
#include "client/plan_command.h"
#include "client/run_command.h"
#include "client/terminal_text.h"
#include "worker/rank_main.h"

namespace {

constexpr char kExitCodes[] =
    "Exit codes of the coordinator commands:\n"
    "  0  success\n"
    "  1  the followed job ended FAILED or CANCELLED (submit --follow, logs -f)\n"
    "  2  bad usage or a bad spec (nothing sent), or the coordinator refused the request\n"
    "     (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE,\n"
    "     RESOURCE_EXHAUSTED, UNAUTHENTICATED, PERMISSION_DENIED), or for submit --dry-run\n"
    "     would refuse it\n"
    "  3  the coordinator is unreachable (UNAVAILABLE, DEADLINE_EXCEEDED; logs -f: for longer\n"
    "     than --reconnect-timeout)\n"
    "  4  the coordinator failed the call otherwise (INTERNAL, DATA_LOSS, ...)";

// The flags every coordinator command takes, stored in `options`. Their environment variables are
// read by ApplyClientEnvironment, not by CLI11 (see there).
void AddClientFlags(CLI::App* command, moetrain::ClientOptions* options) {
  moetrain::ConnectOptions& connect = options->connect;
  command->add_option("--coordinator", connect.address,
                      "the coordinator's gRPC address, host:port (default: $MOETRAIN_COORDINATOR, "
                      "else 127.0.0.1:7070)");
  command->add_option("--token-file", connect.token_file,
                      "file holding the bearer token the coordinator requires (sent with every "
                      "call); default: $MOETRAIN_TOKEN_FILE, else no token");
  command->add_option("--tls-ca", connect.tls_ca_file,
                      "PEM CA certificate to verify the coordinator with; given = connect with TLS "
                      "(default: plaintext)");
  command->add_option("--tls-cert", connect.tls_cert_file,
                      "PEM client certificate, for a coordinator that requires one (mTLS); needs "
                      "--tls-ca and --tls-key");
  command->add_option("--tls-key", connect.tls_key_file, "PEM private key of --tls-cert");
  command->footer(kExitCodes);
}

// MOETRAIN_COORDINATOR and MOETRAIN_TOKEN_FILE, for the command that ran and where its flag was
// not given: a flag wins over the environment, which wins over the default. CLI11 2.1's envname()
// cannot do this: it reads the variables for every subcommand, run or not, and since the commands
// share one ClientOptions, a command that did not run overwrote the flags of the one that did.
void ApplyClientEnvironment(CLI::App& app, moetrain::ClientOptions* options) {
  struct Setting {
    const char* flag;
    const char* variable;
    std::string* value;
  };
  const Setting settings[] = {
      {"--coordinator", "MOETRAIN_COORDINATOR", &options->connect.address},
      {"--token-file", "MOETRAIN_TOKEN_FILE", &options->connect.token_file},
  };
  for (const CLI::App* command : app.get_subcommands()) {
    for (const Setting& setting : settings) {
      const CLI::Option* option = command->get_option_no_throw(setting.flag);
      if (option == nullptr || option->count() > 0) continue;
      const char* value = std::getenv(setting.variable);
      if (value != nullptr && value[0] != '\0') *setting.value = value;
    }
  }
}

// "--reconnect-timeout" as a flag of `command`, stored as text and parsed after CLI11 is done.
void AddReconnectTimeout(CLI::App* command, std::string* text) {
  command
      ->add_option("--reconnect-timeout", *text,
                   "while following: give up (exit 3) once the coordinator has been unreachable "
                   "this long; 60s, 2m, 500ms, or seconds")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  // `moetrain run`'s rank, in the process its in-process worker started (worker/rank_main.h).
  if (moetrain::IsRankProcess(argc, argv)) return moetrain::RankProcessMain(argc, argv);
  CLI::App app{"moetrain: train Mixture-of-Experts language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", MOETRAIN_VERSION);
  app.footer(kExitCodes);

  moetrain::RunOptions run;
  CLI::App* run_cmd =
      app.add_subcommand("run", "train a job in this process, on the CPU or on one GPU");
  run_cmd->add_option("spec", run.spec_path, "job spec (.yaml, .yml or .json)")->required();
  run_cmd->add_option("--checkpoint-dir", run.checkpoint_dir,
                      "checkpoint root (default: checkpoint.dir of the spec, else ./checkpoints); "
                      "checkpoints go to <dir>/<job name>/step-XXXXXXXX");
  run_cmd
      ->add_option(
          "--steps", run.steps,
          "train until this step (overrides train.steps, which also ends the learning-rate "
          "schedule there)")
      ->check(CLI::PositiveNumber);
  run_cmd->add_option(
      "--stop-at-step", run.stop_at_step,
      "train through this step (1 to train.steps), save a checkpoint there and exit 0; the "
      "schedule and data order stay those of train.steps, so --resume continues as if never "
      "stopped (exit 2 for a step out of range, or not beyond the one --resume starts from)");
  run_cmd->add_flag("--resume", run.resume,
                    "continue from the newest good checkpoint of the job, if there is one");
  run_cmd->add_flag("--json", run.json, "print one JSON object per logged step and a summary");
  run_cmd->add_option("--memory-limit", run.memory_limit,
                      "host memory the job may use, e.g. 8GiB (default: the machine's memory); a "
                      "model whose estimate exceeds it is refused (exit 2)");
  run_cmd
      ->add_option("--device", run.device,
                   "cpu or cuda: overrides resources.device of the spec; cuda trains on this "
                   "machine's first GPU and fails at once (exit 2) where there is none")
      ->check(CLI::IsMember({"cpu", "cuda"}));

  moetrain::EvalOptions eval;
  CLI::App* eval_cmd =
      app.add_subcommand("eval", "mean next-token loss of a checkpoint over a token file");
  eval_cmd->add_option("--checkpoint", eval.checkpoint, "a step directory")->required();
  eval_cmd->add_option("--data-path", eval.data_path, "token file")->required();
  eval_cmd->add_option("--data-format", eval.data_format, "llmc, u16, u32 or text")->required();
  eval_cmd->add_option("--batches", eval.batches, "at most this many batches (default: all)")
      ->check(CLI::NonNegativeNumber);
  eval_cmd->add_option("--batch-size", eval.batch_size, "windows per batch (default 8)")
      ->check(CLI::PositiveNumber);
  eval_cmd->add_flag("--json", eval.json, "print {\"loss\": ..., \"tokens\": ...}");

  moetrain::ExportOptions export_options;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "write a checkpoint's model as a Hugging Face directory (safetensors shards)");
  export_cmd->add_option("--checkpoint", export_options.checkpoint, "a step directory")->required();
  export_cmd
      ->add_option("--to-hf", export_options.to_hf,
                   "the Hugging Face directory to write (must be absent or empty)")
      ->required();
  export_cmd->add_option("--dtype", export_options.dtype, "bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  export_cmd->add_option("--max-shard-size", export_options.max_shard_size,
                         "tensor bytes per shard, e.g. 2GiB (default 5 GB, Hugging Face's)");
  export_cmd->add_flag("--force", export_options.force,
                       "name DeepseekV3ForCausalLM even though its code scores expert groups by "
                       "their best 2 experts and this model by top_k / group_top_k");

  moetrain::ImportOptions import_options;
  CLI::App* import_cmd = app.add_subcommand(
      "import", "make a checkpoint (step 0) of a Hugging Face DeepSeek-V3 or moetrain directory");
  import_cmd->add_option("--from-hf", import_options.from_hf, "a Hugging Face directory")
      ->required();
  import_cmd
      ->add_option("--out", import_options.out,
                   "checkpoint root <dir>/<job id>; the step goes to <out>/step-00000000")
      ->required();
  import_cmd->add_option("--memory-limit", import_options.memory_limit,
                         "memory the import may use, e.g. 8GiB (default: the machine's memory); "
                         "a model whose f32 weights, their gradient buffer and the largest weight "
                         "file exceed it is refused (exit 2)");

  moetrain::ClientOptions client;
  moetrain::SubmitArgs submit;
  bool submit_dry_run = false;
  std::string submit_reconnect = "60s";
  moetrain::PlanOptions plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "memory per rank, step time and scaling of a job on a cluster, without running it");
  plan_cmd->add_option("spec", plan.spec_path, "job spec (.yaml, .yml or .json)")->required();
  plan_cmd
      ->add_option("--cluster", plan.cluster,
                   "a preset (h100-node, h200-node, cpu: this machine) or a cluster YAML file "
                   "(docs/plan.md)")
      ->capture_default_str();
  plan_cmd->add_option(
      "--gpus", plan.gpus,
      "GPUs to plan for, 1 to 1073741824 (default: the spec's world size; exit 2 otherwise)");
  plan_cmd
      ->add_option("--sweep", plan.sweep,
                   "GPU counts, e.g. 8,16,32, each 1 to 1073741824: weak- and strong-scaling "
                   "efficiency at each")
      ->delimiter(',');
  plan_cmd->add_flag("--recompute", plan.recompute,
                     "plan every layout with train.recompute: FULL (default: the spec's, or "
                     "SELECTIVE, or else FULL, where only that fits)");
  plan_cmd->add_flag("--json", plan.json, "print the plan as one JSON object");

  CLI::App* submit_cmd = app.add_subcommand(
      "submit", "submit a job spec to the coordinator; prints \"job <id> <STATE>\"");
  submit_cmd
      ->add_option("spec", submit.spec_path,
                   "job spec (.yaml, .yml or .json), checked here before it is sent; a CUDA "
                   "job's resources.device_memory_bytes, when 0, is set from its plan")
      ->required();
  submit_cmd->add_option("--id", submit.submission_id,
                         "submission id that makes the submission idempotent: the same id with the "
                         "same spec and priority returns the first job, with another spec or "
                         "priority fails (exit 2); "
                         "default: a fresh random UUID");
  submit_cmd->add_option("--priority", submit.priority,
                         "scheduling priority; higher runs first (default 0, may be negative)");
  CLI::Option* follow_flag = submit_cmd->add_flag(
      "--follow,-f", submit.follow, "then print the job's events until it ends, as `logs -f` does");
  submit_cmd
      ->add_flag("--dry-run", submit_dry_run,
                 "submit nothing: list the coordinator's workers, print the plan of the spec on "
                 "them (as `moetrain plan` does) and whether the coordinator would accept it; exit "
                 "0 if it would, 2 if it would refuse it (docs/plan.md)")
      ->excludes(follow_flag);
  submit_cmd->add_flag("--json", client.json,
                       "print the Job as one JSON document (protobuf JSON mapping, proto field "
                       "names), then with --follow one JSON object per event; with --dry-run, "
                       "the plan and whether the coordinator would accept it as one JSON object");
  AddReconnectTimeout(submit_cmd, &submit_reconnect);
  AddClientFlags(submit_cmd, &client);

  std::vector<std::string> states;
  CLI::App* jobs_cmd =
      app.add_subcommand("jobs",
                         "list every job, oldest first: ID, NAME, STATE, STEP, LOSS, "
                         "RESTARTS, AGE");
  jobs_cmd
      ->add_option("--state", states,
                   "only jobs in this state (PENDING, SCHEDULED, RUNNING, RESTARTING, SUCCEEDED, "
                   "FAILED, CANCELLED; any case); repeat or separate with commas for several")
      ->delimiter(',');
  jobs_cmd->add_flag("--json", client.json, "print {\"jobs\": [Job, ...]} as one JSON document");
  AddClientFlags(jobs_cmd, &client);

  std::string job_id;
  CLI::App* describe_cmd = app.add_subcommand(
      "describe", "show a job: state and reason, attempts, checkpoint, metrics, times, the spec");
  describe_cmd->add_option("job", job_id, "the job's id")->required();
  describe_cmd->add_flag("--json", client.json, "print the Job as one JSON document");
  AddClientFlags(describe_cmd, &client);

  moetrain::LogsArgs logs;
  std::string logs_reconnect = "60s";
  CLI::App* logs_cmd = app.add_subcommand(
      "logs", "print a job's events (state changes, steps, checkpoints, log lines) from its start");
  logs_cmd->add_option("job", logs.job_id, "the job's id")->required();
  logs_cmd->add_flag("--follow,-f", logs.follow,
                     "keep printing new events until the job ends, reconnecting (without repeating "
                     "or missing an event) when the coordinator goes away or restarts");
  logs_cmd->add_flag("--json", client.json,
                     "one JSON object per event: step metrics as `run --json` prints them, "
                     "{\"checkpoint\", \"step\"}, {\"message\"}, {\"state\", \"reason\"}");
  AddReconnectTimeout(logs_cmd, &logs_reconnect);
  AddClientFlags(logs_cmd, &client);

  std::string cancel_reason;
  CLI::App* cancel_cmd = app.add_subcommand(
      "cancel", "cancel a job: it becomes CANCELLED at once and its ranks stop at the next step");
  cancel_cmd->add_option("job", job_id, "the job's id")->required();
  cancel_cmd->add_option("--reason", cancel_reason,
                         "recorded as the job's state reason (default \"cancelled\")");
  cancel_cmd->add_flag("--json", client.json, "print the cancelled Job as one JSON document");
  AddClientFlags(cancel_cmd, &client);

  bool delete_checkpoints = false;
  CLI::App* delete_cmd = app.add_subcommand(
      "delete", "delete a SUCCEEDED, FAILED or CANCELLED job, its events and checkpoint records");
  delete_cmd->add_option("job", job_id, "the job's id")->required();
  delete_cmd->add_flag("--delete-checkpoints", delete_checkpoints,
                       "also remove its checkpoint directory <checkpoint root>/<job id> (default: "
                       "the files stay, and their directory is printed)");
  delete_cmd->add_flag("--json", client.json,
                       "print {\"checkpoint_dir\", \"checkpoints_deleted\"} as one JSON document");
  AddClientFlags(delete_cmd, &client);

  CLI::App* checkpoints_cmd = app.add_subcommand(
      "checkpoints", "list a job's good checkpoints still on disk, oldest first");
  checkpoints_cmd->add_option("job", job_id, "the job's id")->required();
  checkpoints_cmd->add_flag("--json", client.json,
                            "print {\"checkpoints\": [Checkpoint, ...]} as one JSON document");
  AddClientFlags(checkpoints_cmd, &client);

  CLI::App* workers_cmd =
      app.add_subcommand("workers", "list the workers the coordinator knows, lost ones included");
  workers_cmd->add_flag("--json", client.json,
                        "print {\"workers\": [WorkerInfo, ...]} as one JSON document");
  AddClientFlags(workers_cmd, &client);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 prints the problem (or the help); any usage error is exit code 2.
    return app.exit(error) == 0 ? moetrain::kExitOk : moetrain::kExitUsage;
  }
  ApplyClientEnvironment(app, &client);

  if (run_cmd->parsed()) return moetrain::RunJob(run);
  if (eval_cmd->parsed()) return moetrain::EvalCheckpoint(eval);
  if (export_cmd->parsed()) return moetrain::ExportCommand(export_options);
  if (import_cmd->parsed()) return moetrain::ImportCommand(import_options);
  if (plan_cmd->parsed()) return moetrain::PlanCommand(plan);
  if (submit_cmd->parsed() || logs_cmd->parsed()) {
    const std::string& text = submit_cmd->parsed() ? submit_reconnect : logs_reconnect;
    absl::StatusOr<absl::Duration> timeout =
        moetrain::ParseDurationFlag("--reconnect-timeout", text);
    if (!timeout.ok()) {
      std::fprintf(stderr, "moetrain: %s\n",
                   moetrain::TerminalSafe(timeout.status().message()).c_str());
      return moetrain::kExitUsage;
    }
    submit.reconnect_timeout = logs.reconnect_timeout = *timeout;
  }
  if (submit_cmd->parsed() && submit_dry_run) {
    return moetrain::SubmitDryRunCommand(client, submit.spec_path);
  }
  if (submit_cmd->parsed()) {
    // The plan needs the engine, which the client library does not link: given from here.
    submit.complete_spec = moetrain::CompleteDeviceMemory;
    return moetrain::SubmitCommand(client, submit);
  }
  if (jobs_cmd->parsed()) return moetrain::JobsCommand(client, states);
  if (describe_cmd->parsed()) return moetrain::DescribeCommand(client, job_id);
  if (logs_cmd->parsed()) return moetrain::LogsCommand(client, logs);
  if (cancel_cmd->parsed()) return moetrain::CancelCommand(client, job_id, cancel_reason);
  if (delete_cmd->parsed()) return moetrain::DeleteCommand(client, job_id, delete_checkpoints);
  if (checkpoints_cmd->parsed()) return moetrain::CheckpointsCommand(client, job_id);
  if (workers_cmd->parsed()) return moetrain::WorkersCommand(client);
  return moetrain::kExitUsage;
}

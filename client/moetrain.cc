// The `moetrain` command line.
//
//   moetrain run SPEC.yaml [--checkpoint-dir DIR] [--steps N] [--resume] [--json]
//   moetrain eval --checkpoint DIR/step-XXXXXXXX --data-path FILE --data-format llmc|u16|text
//                 [--batches N] [--json]
#include <cstdio>

#include "CLI/CLI.hpp"
#include "client/run_command.h"

int main(int argc, char** argv) {
  CLI::App app{"moetrain: train Mixture-of-Experts language models"};
  app.require_subcommand(1);

  moetrain::RunOptions run;
  CLI::App* run_cmd = app.add_subcommand("run", "train a job in this process on the CPU");
  run_cmd->add_option("spec", run.spec_path, "job spec (.yaml, .yml or .json)")->required();
  run_cmd->add_option("--checkpoint-dir", run.checkpoint_dir,
                      "checkpoint root (default: checkpoint.dir of the spec, else ./checkpoints); "
                      "checkpoints go to <dir>/<job name>/step-XXXXXXXX");
  run_cmd->add_option("--steps", run.steps, "train until this step (overrides train.steps)")
      ->check(CLI::PositiveNumber);
  run_cmd->add_flag("--resume", run.resume,
                    "continue from the newest good checkpoint of the job, if there is one");
  run_cmd->add_flag("--json", run.json, "print one JSON object per logged step and a summary");

  moetrain::EvalOptions eval;
  CLI::App* eval_cmd =
      app.add_subcommand("eval", "mean next-token loss of a checkpoint over a token file");
  eval_cmd->add_option("--checkpoint", eval.checkpoint, "a step directory")->required();
  eval_cmd->add_option("--data-path", eval.data_path, "token file")->required();
  eval_cmd->add_option("--data-format", eval.data_format, "llmc, u16 or text")->required();
  eval_cmd->add_option("--batches", eval.batches, "at most this many batches (default: all)")
      ->check(CLI::NonNegativeNumber);
  eval_cmd->add_option("--batch-size", eval.batch_size, "windows per batch (default 8)")
      ->check(CLI::PositiveNumber);
  eval_cmd->add_flag("--json", eval.json, "print {\"loss\": ..., \"tokens\": ...}");

  CLI11_PARSE(app, argc, argv);
  if (run_cmd->parsed()) return moetrain::RunJob(run);
  if (eval_cmd->parsed()) return moetrain::EvalCheckpoint(eval);
  return 2;
}

#include "client/eval_command.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "client/terminal_text.h"
#include "engine/model/transformer.h"
#include "engine/train/checkpoint.h"
#include "engine/train/model_config_json.h"
#include "engine/train/token_file.h"
#include "engine/train/trainer.h"
#include "nlohmann/json.hpp"

namespace moetrain {

int CommandFailed(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "moetrain %s: %s\n", command,
               TerminalSafe(Abbreviate(status.message(), kMaxErrorMessageBytes)).c_str());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

int EvalCheckpoint(const EvalOptions& options) {
  absl::StatusOr<TokenFileFormat> format =
      options.data_format == "llmc"   ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kLlmc)
      : options.data_format == "u16"  ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kU16)
      : options.data_format == "u32"  ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kU32)
      : options.data_format == "text" ? absl::StatusOr<TokenFileFormat>(TokenFileFormat::kText)
                                      : absl::InvalidArgumentError(absl::StrCat(
                                            "--data-format = '", Abbreviate(options.data_format),
                                            "' is not one of llmc, u16, u32, text"));
  if (!format.ok()) return CommandFailed("eval", format.status());
  absl::StatusOr<LoadedCheckpoint> checkpoint = LoadCheckpoint(options.checkpoint);
  if (!checkpoint.ok()) return CommandFailed("eval", checkpoint.status());
  absl::StatusOr<ModelConfig> model_config = ManifestModelConfig(checkpoint->manifest);
  if (!model_config.ok()) return CommandFailed("eval", model_config.status());
  // Read exactly: config.json is the checkpoint's, whoever wrote it.
  int64_t seq_len = 0;
  if (const absl::Status read = ReadJsonKey(checkpoint->hf_config, "config.json: ",
                                            "max_position_embeddings", &seq_len);
      !read.ok()) {
    return CommandFailed("eval", absl::DataLossError(
                                     absl::StrCat(options.checkpoint, ": ", read.message())));
  }
  if (seq_len < 1 || seq_len > model_config->max_seq_len) {
    return CommandFailed("eval", absl::DataLossError(absl::StrCat(
                                     options.checkpoint, ": config.json max_position_embeddings = ",
                                     seq_len, " is not a usable sequence length")));
  }
  // The main model only: the MTP modules' weights are not read, and every window is S + 1
  // tokens whatever the model's mtp_depth, so all models see the same windows of a file.
  model_config->mtp_depth = 0;
  absl::StatusOr<Transformer> model = Transformer::Create(*model_config, DType::kF32);
  if (!model.ok()) return CommandFailed("eval", model.status());
  if (absl::Status status = RestoreModelParameters(*checkpoint, &*model); !status.ok()) {
    return CommandFailed("eval", status);
  }

  absl::StatusOr<TokenFile> file =
      TokenFile::Open(options.data_path, *format, model_config->vocab_size, seq_len + 1);
  if (!file.ok()) return CommandFailed("eval", file.status());
  // Window i is tokens [i·S, i·S + S + 1): consecutive windows share their boundary token.
  const int64_t window = seq_len + 1;
  const int64_t windows = (file->num_tokens() - 1) / seq_len;
  const int64_t batch_size = std::max<int64_t>(1, options.batch_size);
  int64_t batches = (windows + batch_size - 1) / batch_size;
  if (options.batches > 0) batches = std::min(batches, options.batches);
  double loss_sum = 0;
  int64_t windows_done = 0;
  for (int64_t b = 0; b < batches; ++b) {
    const int64_t first = b * batch_size, count = std::min(batch_size, windows - first);
    Tensor tokens = Tensor::Empty(DType::kI32, {count, window});
    for (int64_t w = 0; w < count; ++w) {
      const absl::Status read =
          file->Read((first + w) * seq_len, window, tokens.data<int32_t>() + w * window);
      if (!read.ok()) return CommandFailed("eval", read);
    }
    absl::StatusOr<float> loss = model->Evaluate(tokens);
    if (!loss.ok()) return CommandFailed("eval", loss.status());
    loss_sum += static_cast<double>(*loss) * count;
    windows_done += count;
  }
  const double loss = loss_sum / windows_done;
  if (options.json) {
    std::printf(
        "%s\n",
        nlohmann::json({{"loss", loss}, {"tokens", windows_done * seq_len}}).dump().c_str());
  } else {
    std::printf("loss %.6f over %lld tokens (%lld windows of %lld)\n", loss,
                static_cast<long long>(windows_done * seq_len),
                static_cast<long long>(windows_done), static_cast<long long>(seq_len));
  }
  return 0;
}

}  // namespace moetrain

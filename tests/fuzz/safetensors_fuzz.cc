// The safetensors reader (engine/train/safetensors.h) on arbitrary file contents. Beyond not
// crashing: a refusal is InvalidArgument (ResourceExhausted when the tensors do not fit in
// memory), and a file that reads writes back (WriteSafetensors) to a file that reads to the same
// names, dtypes, shapes, bytes and metadata.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/train/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace moetrain::fuzz {
namespace {

bool SameTensor(const TensorView& a, const TensorView& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  const size_t bytes = static_cast<size_t>(a.numel()) * DTypeSize(a.dtype());
  return bytes == 0 || std::memcmp(a.raw(), b.raw(), bytes) == 0;
}

void CheckRewrite(const SafetensorsFile& file) {
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& name : file.names()) {
    absl::StatusOr<TensorView> view = file.View(name);
    if (!view.ok())
      Fail(absl::StrCat("names() lists \"", name, "\", View() has none"), view.status());
    tensors.emplace_back(name, *view);
  }
  const std::string copy = ScratchDir() + "/rewritten.safetensors";
  absl::Status written = WriteSafetensors(copy, tensors, file.metadata());
  if (!written.ok()) Fail("WriteSafetensors refuses what ReadSafetensors accepted", written);
  absl::StatusOr<SafetensorsFile> reread = ReadSafetensors(copy);
  if (!reread.ok()) Fail("ReadSafetensors refuses what WriteSafetensors wrote", reread.status());
  if (reread->names() != file.names()) Fail("the rewritten file lists other tensors");
  if (reread->metadata() != file.metadata()) Fail("the rewritten file has other metadata");
  for (const auto& [name, view] : tensors) {
    absl::StatusOr<TensorView> reread_view = reread->View(name);
    if (!reread_view.ok() || !SameTensor(*reread_view, view))
      Fail(absl::StrCat("tensor \"", name, "\" changed when rewritten"));
  }
}

}  // namespace
}  // namespace moetrain::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moetrain;
  const std::string path = fuzz::WriteScratchFile("input.safetensors", data, size);
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  if (!file.ok()) {
    fuzz::ExpectCode(file.status(),
                     {absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted},
                     "ReadSafetensors");
    return 0;
  }
  fuzz::CheckRewrite(*file);
  return 0;
}

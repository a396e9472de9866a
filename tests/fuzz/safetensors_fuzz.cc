// libFuzzer target for the safetensors parser: any byte string either is
// rejected with a Status or yields views that lie inside the input, whose
// sizes agree with dtype and shape, and that survive a write/read round
// trip unchanged.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/safetensors/safetensors_file.h"
#include "common/safetensors/safetensors_writer.h"

namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tandem::safetensors::CheckedNumBytes;
  using tandem::safetensors::DTypeSize;
  using tandem::safetensors::SafetensorsFile;
  using tandem::safetensors::SerializeSafetensors;
  using tandem::safetensors::TensorToWrite;
  using tandem::safetensors::TensorView;

  auto file = SafetensorsFile::FromBuffer({data, size}, "fuzz-input");
  if (!file.ok()) {
    Require(!file.status().message().empty());
    return 0;
  }

  std::vector<TensorToWrite> tensors;
  uint64_t checksum = 0;
  for (const TensorView& view : (*file)->tensors()) {
    Require(view.data >= data && view.data + view.nbytes <= data + size);
    auto needed = CheckedNumBytes(view.shape, DTypeSize(view.dtype));
    Require(needed.ok() && *needed == view.nbytes);
    Require((*file)->Find(view.name) == &view);
    // Touch every byte so that a bad view shows up under ASan.
    for (size_t i = 0; i < view.nbytes; ++i) checksum += view.data[i];
    tensors.push_back({view.name, view.dtype, view.shape, view.bytes()});
  }
  (void)checksum;

  auto rewritten = SerializeSafetensors(tensors, (*file)->metadata());
  Require(rewritten.ok());
  auto reread = SafetensorsFile::FromBuffer(
      {reinterpret_cast<const uint8_t*>(rewritten->data()), rewritten->size()},
      "fuzz-rewritten");
  Require(reread.ok());
  Require((*reread)->metadata() == (*file)->metadata());
  Require((*reread)->tensors().size() == tensors.size());
  for (const TensorToWrite& tensor : tensors) {
    const TensorView* view = (*reread)->Find(tensor.name);
    Require(view != nullptr && view->dtype == tensor.dtype &&
            view->shape == tensor.shape &&
            view->nbytes == tensor.bytes.size() &&
            (view->nbytes == 0 ||
             std::memcmp(view->data, tensor.bytes.data(), view->nbytes) == 0));
  }
  return 0;
}

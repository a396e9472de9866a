#pragma once

// EngineModel is the seam between the generation engine and the neural
// network: it keeps each sequence's keys and values and computes the tokens
// the scheduler asks for. The engine calls it from its one thread only.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "engine/sequence.h"

namespace tandem::engine {

struct ForwardChunk {
  // Compute tokens [start, end) of `seq`, appending their keys and values
  // to the sequence's cache (which holds exactly `start` tokens).
  const Sequence* seq = nullptr;
  int32_t start = 0;
  int32_t end = 0;
  // Produce logits of the last computed token.
  bool wants_logits = false;
};

// How to sample one chunk's next token: its sampling parameters and the
// uniform draw in [0, 1) the engine made for it from the sequence's own
// generator (unused when greedy).
struct SampleRequest {
  const SamplingParams* params = nullptr;
  double uniform = 0.0;
};

class EngineModel {
 public:
  virtual ~EngineModel() = default;
  virtual int32_t vocab_size() const = 0;
  // Runs one step over all chunks. Returns vocab_size() floats per chunk
  // with wants_logits, in chunk order.
  virtual absl::StatusOr<std::vector<float>> Forward(
      const std::vector<ForwardChunk>& chunks) = 0;
  // Runs one step and samples the next token of every chunk with
  // wants_logits (requests[i] for the i-th of them), by
  // SampleTokenWithUniform's rule. The default runs Forward() and samples
  // on the host; a model whose logits live on a GPU samples there, so only
  // the chosen ids and their log-probs cross to the host.
  virtual absl::StatusOr<std::vector<SampledToken>> ForwardSample(
      const std::vector<ForwardChunk>& chunks,
      const std::vector<SampleRequest>& requests);
  // Copies the first `num_tokens` cached tokens of `src` into `dst`'s
  // (empty) cache. Returns false when `src` does not hold them.
  virtual bool ForkCache(uint64_t src, uint64_t dst, int32_t num_tokens) = 0;
  // Drops a sequence's cache.
  virtual void ReleaseCache(uint64_t seq_id) = 0;
};

// Where new weights come from. The transport fills a staging buffer in the
// background; the engine asks at each step boundary whether a version is
// ready and, if so, commits it while generation is paused. A source that
// writes into the live weights themselves (the inplace mode) parks the
// engine instead: ReadyVersion() turns non-zero when a writer wants the
// weights, and Commit() blocks until the new version is in place.
class WeightUpdateSource {
 public:
  virtual ~WeightUpdateSource() = default;
  // A fully received, verified version newer than `live` (or, in inplace
  // mode, one being written), or 0. Must not block. When it returns 0 the
  // engine reads the live weights until its next StepDone().
  virtual uint64_t ReadyVersion(uint64_t live) = 0;
  // Makes `version` live in the model (a pointer swap in staged mode; in
  // inplace mode it waits until the writer is done) and returns the version
  // now live: `version`, or a newer one that replaced it (inplace mode,
  // after a rejected version was replaced by a full copy of the latest).
  // Called on the engine thread between steps. REQUIRES: the engine reads
  // no weights after a non-zero ReadyVersion() before Commit() returned.
  virtual absl::StatusOr<uint64_t> Commit(uint64_t version) = 0;
  // The engine will not read the live weights again before its next
  // ReadyVersion() call (it ran this step's forward pass, or had none).
  virtual void StepDone() {}
};

}  // namespace tandem::engine

// Changed fraction of bf16 weights per real AdamW step, and what the delta
// codec makes of those changes (issue 5 benchmark).
//
//   delta_adamw_bench [steps=10]
//
// A small MLP (LayerNorm + Linear layers, ~6.3M parameters, init std 0.02)
// is trained on a random regression task in two regimes:
//   bf16-params:  parameters and optimizer state in bf16 (updates below half
//                 an ULP are lost, as in pure-bf16 training);
//   fp32-master:  fp32 parameters and optimizer, bf16 copy published after
//                 each step (mixed precision, the usual trainer setup).
// After every step the published bf16 buffer is compared word by word with
// the previous one and delta-encoded with kernels/bf16_delta.h.

#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/bf16_change.h"
#include "kernels/bf16_delta.h"

namespace {

torch::nn::Sequential MakeModel() {
  torch::nn::Sequential model;
  const int64_t width = 1024;
  model->push_back(torch::nn::Linear(256, width));
  for (int i = 0; i < 5; ++i) {
    model->push_back(
        torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::GELU());
  }
  model->push_back(torch::nn::Linear(width, 256));
  torch::NoGradGuard no_grad;
  for (auto& p : model->named_parameters()) {
    if (p.key().find("weight") != std::string::npos && p.value().dim() == 2) {
      p.value().normal_(0.0, 0.02);
    } else if (p.key().find("bias") != std::string::npos) {
      p.value().normal_(0.0, 0.01);
    }
  }
  return model;
}

// All parameters as one flat bf16 word buffer.
std::vector<uint16_t> Publish(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> flat;
  for (auto& p : model->parameters()) {
    flat.push_back(p.detach().to(torch::kBFloat16).reshape({-1}));
  }
  torch::Tensor all = torch::cat(flat).contiguous();
  std::vector<uint16_t> words(all.numel());
  std::memcpy(words.data(), all.data_ptr(), words.size() * 2);
  return words;
}

void Run(bool bf16_params, double lr, int steps) {
  torch::manual_seed(1);
  torch::nn::Sequential model = MakeModel();
  const auto dtype = bf16_params ? torch::kBFloat16 : torch::kFloat32;
  model->to(dtype);
  torch::optim::AdamW optimizer(
      model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
  torch::Tensor x = torch::randn({128, 256}).to(dtype);
  torch::Tensor y = torch::randn({128, 256}).to(dtype);
  std::vector<uint16_t> prev = Publish(model);
  absl::PrintF("\n%s, lr %g, %d parameters\n",
               bf16_params ? "bf16-params" : "fp32-master", lr, prev.size());
  absl::PrintF(
      "| step | changed | changed %% | B/elem (default) | B/elem raw values "
      "| payload %% of full bf16 |\n|---|---|---|---|---|---|\n");
  double sum_fraction = 0, sum_bytes = 0, sum_changed = 0;
  for (int step = 1; step <= steps; ++step) {
    optimizer.zero_grad();
    // The loss runs in fp32 (LibTorch 1.13 has no bf16 mse on CPU).
    torch::Tensor loss =
        (model->forward(x).to(torch::kFloat32) - y.to(torch::kFloat32))
            .pow(2)
            .mean();
    loss.backward();
    optimizer.step();
    std::vector<uint16_t> next = Publish(model);
    const uint64_t changed = tandem::kernels::CountChangedWords(prev, next);
    auto delta = tandem::kernels::EncodeBf16Delta(prev, next);
    auto raw = tandem::kernels::EncodeBf16Delta(
        prev, next, {tandem::kernels::DeltaValueCoding::kRaw, 16384});
    if (!delta.ok() || !raw.ok()) std::abort();
    std::vector<uint16_t> check = prev;
    if (!tandem::kernels::ApplyBf16Delta(*delta, absl::MakeSpan(check)).ok() ||
        check != next) {
      std::abort();
    }
    const double n = changed == 0 ? 1.0 : static_cast<double>(changed);
    const double fraction = static_cast<double>(changed) / next.size();
    absl::PrintF("| %d | %d | %.3f%% | %.2f | %.2f | %.3f%% |\n", step, changed,
                 100 * fraction, delta->size() / n, raw->size() / n,
                 100.0 * delta->size() / (2.0 * next.size()));
    sum_fraction += fraction;
    sum_bytes += delta->size();
    sum_changed += changed;
    prev = std::move(next);
  }
  absl::PrintF("mean changed %.3f%%, mean B/elem %.2f\n",
               100 * sum_fraction / steps,
               sum_changed > 0 ? sum_bytes / sum_changed : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  torch::set_num_threads(1);
  try {
    for (bool bf16 : {true, false}) {
      for (double lr : {1e-6, 1e-5}) Run(bf16, lr, steps);
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "LibTorch error: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}

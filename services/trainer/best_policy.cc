#include "services/trainer/best_policy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/posix.h"
#include "common/base/status_macros.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_weights.h"
#include "common/safetensors/atomic_file.h"
#include "common/task/arith_tokenizer.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kBestPrefix[] = "best-v";

auto Log() { return ComponentLogger("trainer"); }

std::optional<BestPolicy> ReadBest(const fs::path& dir) {
  const fs::path info = dir / kBestPolicyLink / kBestPolicyInfoFile;
  std::error_code ec;
  if (!fs::exists(info, ec)) return std::nullopt;
  std::ifstream in(info);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    Log()->warn("{}: not a JSON object; the best policy starts over",
                info.string());
    return std::nullopt;
  }
  try {
    BestPolicy best;
    best.policy_version = j.at("policy_version").get<uint64_t>();
    best.step = j.at("step").get<int64_t>();
    best.accuracy = j.at("accuracy").get<double>();
    best.correct = j.at("correct").get<int64_t>();
    best.problems = j.at("problems").get<int64_t>();
    best.path = fs::canonical(dir / kBestPolicyLink, ec).string();
    if (ec) return std::nullopt;
    return best;
  } catch (const json::exception& e) {
    Log()->warn("{}: {}; the best policy starts over", info.string(),
                e.what());
    return std::nullopt;
  }
}

}  // namespace

BestPolicyKeeper::BestPolicyKeeper(BestPolicyOptions options)
    : options_(std::move(options)),
      best_(ReadBest(fs::path(options_.checkpoint_dir))) {}

absl::StatusOr<std::optional<BestPolicy>> BestPolicyKeeper::Offer(
    const model::ModelWeights& weights, const HeldoutResult& result,
    int64_t step) {
  if (best_.has_value() && best_->problems == result.total &&
      !(result.accuracy() > best_->accuracy)) {
    return std::nullopt;
  }
  const fs::path dir(options_.checkpoint_dir);
  const std::string name = absl::StrCat(kBestPrefix, result.policy_version);
  const fs::path final_path = dir / name;
  const fs::path tmp = dir / absl::StrCat(".", name, ".tmp");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FilesystemError(ec, dir.string(), "create directory");
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return FilesystemError(ec, tmp.string(), "create directory");
  model::SaveOptions save;
  save.tokenizer_dir = options_.tokenizer_dir;
  RETURN_IF_ERROR(model::SaveHfModel(weights, tmp.string(), save));
  if (options_.builtin_tokenizer) {
    RETURN_IF_ERROR(task::WriteArithTokenizerFiles(tmp.string()));
  }
  BestPolicy best;
  best.policy_version = result.policy_version;
  best.step = step;
  best.accuracy = result.accuracy();
  best.correct = result.correct;
  best.problems = result.total;
  best.path = final_path.string();
  const std::string text = json{{"policy_version", best.policy_version},
                                {"step", best.step},
                                {"accuracy", best.accuracy},
                                {"correct", best.correct},
                                {"problems", best.problems}}
                               .dump(2) +
                           "\n";
  RETURN_IF_ERROR(safetensors::WriteFileAtomically(
      (tmp / kBestPolicyInfoFile).string(),
      {absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 text.size())}));
  RETURN_IF_ERROR(SyncDirectory(tmp.string()));
  fs::remove_all(final_path, ec);
  fs::rename(tmp, final_path, ec);
  if (ec) return FilesystemError(ec, final_path.string(), "rename");
  const fs::path link = dir / kBestPolicyLink;
  const fs::path tmp_link = dir / ".best.tmp";
  fs::remove(tmp_link, ec);
  fs::create_directory_symlink(name, tmp_link, ec);
  if (ec) return FilesystemError(ec, tmp_link.string(), "create symlink");
  fs::rename(tmp_link, link, ec);
  if (ec) return FilesystemError(ec, link.string(), "replace symlink");
  RETURN_IF_ERROR(SyncDirectory(dir.string()));
  // The previous best (and any other left by a crash) goes only now that
  // the link names the new one.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string other = entry.path().filename().string();
    if (other.rfind(kBestPrefix, 0) == 0 && other != name) {
      std::error_code ignored;
      fs::remove_all(entry.path(), ignored);
    }
  }
  best_ = best;
  return best_;
}

}  // namespace tandem::trainer

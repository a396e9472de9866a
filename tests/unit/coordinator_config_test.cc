// The coordinator's weight_sync.backend key: gloo runs; nccl runs in builds
// with TANDEM_ENABLE_NCCL and is refused at start otherwise with an error
// naming the key and the value; anything else is refused by the schema.

#include "services/coordinator/coordinator_config.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/config/config_schema.h"

namespace tandem::coordinator {
namespace {

// Loads `yaml` like a daemon start does: schema first, then Validate().
absl::Status Load(const std::string& yaml, CoordinatorConfig* config) {
  config::ConfigSchema schema;
  RegisterFields(&schema, config);
  if (absl::Status s = schema.ApplyYamlText(yaml, "coordinator.yaml");
      !s.ok()) {
    return s;
  }
  return Validate(*config);
}

TEST_CASE("weight_sync.backend defaults to gloo and accepts it",
          "[coordinator][config]") {
  CoordinatorConfig defaults;
  REQUIRE(Load("", &defaults).ok());
  CHECK(defaults.weight_sync.backend == "gloo");
  CoordinatorConfig config;
  REQUIRE(Load("weight_sync:\n  backend: gloo\n", &config).ok());
  CHECK(config.weight_sync.backend == "gloo");
}

TEST_CASE(
    "weight_sync.backend nccl is accepted in NCCL builds and refused at start "
    "otherwise, naming key and value",
    "[coordinator][config]") {
  CoordinatorConfig config;
  const absl::Status s = Load("weight_sync:\n  backend: nccl\n", &config);
  // Refused or accepted whatever weight_sync.broadcast says, so a config
  // that would fail once broadcast is turned on fails now.
  CoordinatorConfig off;
  const absl::Status s_off =
      Load("weight_sync:\n  broadcast: false\n  backend: nccl\n", &off);
#if TANDEM_ENABLE_NCCL
  REQUIRE(s.ok());
  CHECK(config.weight_sync.backend == "nccl");
  CHECK(s_off.ok());
#else
  REQUIRE(absl::IsInvalidArgument(s));
  const std::string message(s.message());
  CHECK_THAT(message, Catch::StartsWith("weight_sync.backend: nccl: this "
                                        "build has no NCCL transport"));
  CHECK_THAT(message, Catch::Contains("TANDEM_ENABLE_NCCL is off"));
  CHECK_THAT(message, Catch::Contains("use weight_sync.backend: gloo"));
  CHECK(absl::IsInvalidArgument(s_off));
#endif
}

TEST_CASE("weight_sync.backend rejects unknown transports in the schema",
          "[coordinator][config]") {
  CoordinatorConfig config;
  const absl::Status s = Load("weight_sync:\n  backend: mpi\n", &config);
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()),
             Catch::StartsWith("coordinator.yaml:2: weight_sync.backend"));
  CHECK_THAT(std::string(s.message()), Catch::Contains("mpi"));
}

}  // namespace
}  // namespace tandem::coordinator

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/config/config_schema.h"
#include "common/config/daemon_flags.h"

namespace tandem::config {
namespace {

struct TestConfig {
  std::string name = "default";
  int64_t workers = 4;
  double ratio = 0.5;
  bool enabled = false;
  std::string level = "info";
  std::vector<std::string> tags;
};

void Bind(ConfigSchema* schema, TestConfig* config) {
  schema->AddString("name", &config->name, "Name.");
  schema->AddInt("engine.workers", &config->workers, 1, 64, "Workers.");
  schema->AddDouble("engine.ratio", &config->ratio, 0.0, 1.0, "Ratio.");
  schema->AddBool("enabled", &config->enabled, "Enabled.");
  schema->AddEnum("log.level", &config->level, {"info", "debug"}, "Level.");
  schema->AddStringList("tags", &config->tags, "Tags.");
}

std::string Message(const absl::Status& status) {
  return std::string(status.message());
}

TEST_CASE("yaml values override defaults") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  REQUIRE(schema
              .ApplyYamlText("name: alpha\nengine:\n  workers: 8\n  ratio: "
                             "0.25\nenabled: true\ntags: [a, b]\n",
                             "t.yaml")
              .ok());
  CHECK(config.name == "alpha");
  CHECK(config.workers == 8);
  CHECK(config.ratio == 0.25);
  CHECK(config.enabled);
  CHECK(config.tags == std::vector<std::string>{"a", "b"});
  CHECK(config.level == "info");
}

TEST_CASE("unknown key error names file, line and key path") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s = schema.ApplyYamlText(
      "name: a\nengine:\n  workers: 2\n  wrokers: 3\n", "conf.yaml");
  REQUIRE_FALSE(s.ok());
  CHECK(Message(s) == "conf.yaml:4: unknown key 'engine.wrokers'");
}

TEST_CASE("a duplicate key is an error naming the file and both lines") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s = schema.ApplyYamlText(
      "name: a\nengine:\n  workers: 2\nenabled: true\nname: b\n",
      "dup.yaml");
  REQUIRE_FALSE(s.ok());
  CHECK(absl::IsInvalidArgument(s));
  CHECK(Message(s) == "dup.yaml:5: duplicate key 'name' (first at line 1)");

  // Inside a section, with the key path.
  s = schema.ApplyYamlText(
      "engine:\n  workers: 2\n  ratio: 0.1\n  workers: 3\n", "dup.yaml");
  CHECK(Message(s) ==
        "dup.yaml:4: duplicate key 'engine.workers' (first at line 2)");

  // A section given twice is a duplicate too, even with different keys.
  s = schema.ApplyYamlText(
      "engine:\n  workers: 2\nname: x\nengine:\n  ratio: 0.1\n",
      "dup.yaml");
  CHECK(Message(s) == "dup.yaml:4: duplicate key 'engine' (first at line 1)");

  // The same key in different sections is not a duplicate.
  REQUIRE(schema.ApplyYamlText("log:\n  level: debug\nname: level\n",
                               "ok.yaml")
              .ok());
}

TEST_CASE("unknown top-level section is an error") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s = schema.ApplyYamlText("bogus:\n  x: 1\n", "c.yaml");
  CHECK(Message(s) == "c.yaml:1: unknown key 'bogus'");
}

TEST_CASE("wrong type error names file, line, key and value") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s =
      schema.ApplyYamlText("engine:\n  workers: many\n", "conf.yaml");
  REQUIRE_FALSE(s.ok());
  CHECK(Message(s) ==
        "conf.yaml:2: engine.workers expected an integer, got 'many'");
  s = schema.ApplyYamlText("enabled: maybe\n", "conf.yaml");
  CHECK(Message(s) ==
        "conf.yaml:1: enabled expected true or false, got 'maybe'");
  s = schema.ApplyYamlText("name: [1, 2]\n", "conf.yaml");
  CHECK(Message(s) == "conf.yaml:1: name expected a string, got a list");
  s = schema.ApplyYamlText("engine: 3\n", "conf.yaml");
  CHECK(Message(s) == "conf.yaml:1: engine must be a mapping, got '3'");
}

TEST_CASE("out of range error names the bounds and the value") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s =
      schema.ApplyYamlText("\n\nengine:\n  workers: -3\n", "conf.yaml");
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(Message(s) == "conf.yaml:4: engine.workers must be in [1, 64], got -3");
  s = schema.ApplyYamlText("engine:\n  ratio: 1.5\n", "conf.yaml");
  CHECK(Message(s) == "conf.yaml:2: engine.ratio must be in [0, 1], got 1.5");
  s = schema.ApplyYamlText("log:\n  level: loud\n", "conf.yaml");
  CHECK(Message(s) ==
        "conf.yaml:2: log.level must be one of info, debug; got 'loud'");
  CHECK(config.workers == 4);  // nothing half-applied for the failing key
}

TEST_CASE("malformed yaml error names file and line") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s =
      schema.ApplyYamlText("name: a\nengine: [1, 2\nother: 3\n", "bad.yaml");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(Message(s), Catch::StartsWith("bad.yaml:"));
  CHECK_THAT(Message(s), Catch::Contains("malformed YAML"));
  s = schema.ApplyYamlText("- a\n- b\n", "list.yaml");
  CHECK(Message(s) == "list.yaml:1: the top level must be a mapping");
}

TEST_CASE("missing config file error names the path") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  absl::Status s = schema.ApplyYamlFile("/nonexistent/tandem.yaml");
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(Message(s), Catch::Contains("/nonexistent/tandem.yaml"));
}

TEST_CASE("environment overrides file and names the variable on error") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  REQUIRE(schema.ApplyYamlText("engine:\n  workers: 8\n", "f.yaml").ok());
  std::string good = "TANDEM_ENGINE_WORKERS=16";
  std::string other = "TANDEM_SOMETHING_ELSE=1";
  std::vector<char*> env = {good.data(), other.data(), nullptr};
  REQUIRE(schema.ApplyEnvironment(env.data()).ok());
  CHECK(config.workers == 16);
  std::string bad = "TANDEM_ENGINE_WORKERS=0";
  std::vector<char*> bad_env = {bad.data(), nullptr};
  absl::Status s = schema.ApplyEnvironment(bad_env.data());
  CHECK(Message(s) ==
        "environment TANDEM_ENGINE_WORKERS: engine.workers must be in [1, "
        "64], got 0");
}

TEST_CASE("--set overrides and reports unknown keys") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  REQUIRE(schema.ApplyOverride("engine.ratio=0.75").ok());
  CHECK(config.ratio == 0.75);
  REQUIRE(schema.ApplyOverride("tags=x, y").ok());
  CHECK(config.tags == std::vector<std::string>{"x", "y"});
  CHECK(Message(schema.ApplyOverride("engine.nope=1")) ==
        "--set engine.nope=1: unknown key 'engine.nope'");
  CHECK(Message(schema.ApplyOverride("novalue")) ==
        "--set novalue: expected key=value");
}

TEST_CASE("printed config parses back to the same values") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  REQUIRE(schema
              .ApplyYamlText("name: \"quo\\\"te: x\"\nengine:\n  ratio: "
                             "0.1\ntags: [p, q]\nenabled: yes\n",
                             "f.yaml")
              .ok());
  const std::string printed = schema.ToYaml();
  TestConfig copy;
  ConfigSchema copy_schema;
  Bind(&copy_schema, &copy);
  REQUIRE(copy_schema.ApplyYamlText(printed, "printed").ok());
  CHECK(copy.name == config.name);
  CHECK(copy.workers == config.workers);
  CHECK(copy.ratio == config.ratio);
  CHECK(copy.enabled == config.enabled);
  CHECK(copy.tags == config.tags);
  CHECK(copy.level == config.level);
}

TEST_CASE("environment variable names derive from key paths") {
  CHECK(ConfigSchema::EnvName("coordinator_address") ==
        "TANDEM_COORDINATOR_ADDRESS");
  CHECK(ConfigSchema::EnvName("engine.max_num_seqs") ==
        "TANDEM_ENGINE_MAX_NUM_SEQS");
}

TEST_CASE("HostOfAddress takes the host of a listen address") {
  CHECK(HostOfAddress("0.0.0.0:50051") == "0.0.0.0");
  CHECK(HostOfAddress("trainer:0") == "trainer");
  CHECK(HostOfAddress("[::]:0") == "::");
  CHECK(HostOfAddress("[::1]:8080") == "::1");
  CHECK(HostOfAddress("localhost") == "localhost");
  CHECK(HostOfAddress("::1") == "::1");
}

TEST_CASE("ReachableHostOf replaces a wildcard host by loopback") {
  CHECK(ReachableHostOf("10.1.2.3:50054") == "10.1.2.3");
  CHECK(ReachableHostOf("trainer:0") == "trainer");
  CHECK(ReachableHostOf("[::1]:0") == "::1");
  CHECK(ReachableHostOf("0.0.0.0:50054") == "127.0.0.1");
  CHECK(ReachableHostOf("[::]:0") == "127.0.0.1");
  CHECK(ReachableHostOf(":50054") == "127.0.0.1");
}

TEST_CASE("checks run on final values and name where the value came from") {
  TestConfig config;
  ConfigSchema schema;
  Bind(&schema, &config);
  schema.AddCheck("name", [&config]() {
    return config.name == "bad" ? absl::InvalidArgumentError("is bad")
                                : absl::OkStatus();
  });
  CHECK(schema.Origin("name") == "default");
  REQUIRE(schema.ApplyYamlText("enabled: true\nname: bad\n", "t.yaml").ok());
  CHECK(schema.Origin("name") == "t.yaml:2");
  CHECK(Message(schema.Check()) == "t.yaml:2: name is bad");
  // A later layer replaces the value and where it came from.
  REQUIRE(schema.ApplyOverride("name=good").ok());
  CHECK(schema.Check().ok());
  REQUIRE(schema.ApplyOverride("name=bad").ok());
  CHECK(Message(schema.Check()) == "--set name=bad: name is bad");
}

}  // namespace
}  // namespace tandem::config

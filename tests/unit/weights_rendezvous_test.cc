// The broadcast rendezvous store over the trainer's gRPC (issue 25 item 3):
// RendezvousClient against a real mTLS GrpcServer serving the trainer's
// RendezvousService, over the RendezvousKeys the trainer's own member uses
// in-process. Every store operation, the long-poll wait (answered by a
// set, or not ready at its timeout), the limits (named in the error), the
// scopes an epoch leaves behind, and who may call: trainer and rollout
// certificates only; a verifier's is PERMISSION_DENIED, a certificate of
// another CA and a plaintext client cannot connect, and no key they tried
// to set is there for a member to read.

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/weights/broadcast/rendezvous_client.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#include "rendezvous_test_util.h"

namespace tandem::weights {
namespace {

using tandem::testing::IssuedCertificates;
using tandem::testing::RoleTls;
using tandem::testing::TempDir;

// The trainer's side: keys, the service, an mTLS server with the trainer's
// certificate.
using Trainer = tandem::testing::RendezvousTestServer;

TEST_CASE("a rollout member's store operations reach the trainer's keys") {
  auto certs = IssuedCertificates();
  Trainer trainer(*certs);
  auto client = trainer.Client(RoleTls(*certs, "rollout"));
  const std::string scope = "tandem/weights/epoch1";

  REQUIRE(client->Set(scope, "addr/1", "10.0.0.1:4000").ok());
  // The trainer's member reads it in-process, and the other way round.
  CHECK(trainer.keys->Get(scope, "addr/1").value() == "10.0.0.1:4000");
  REQUIRE(trainer.keys->Set(scope, "addr/0", "10.0.0.0:4000").ok());
  CHECK(client->Get(scope, "addr/0").value() == "10.0.0.0:4000");
  CHECK(client->Get(scope, "missing").status().code() ==
        absl::StatusCode::kNotFound);

  CHECK(client->Add(scope, "barrier", 1).value() == 1);
  CHECK(client->Add(scope, "barrier", 2).value() == 3);
  CHECK(trainer.keys->Add(scope, "barrier", -1).value() == 2);
  CHECK(client->Get(scope, "barrier").value() == "2");
  CHECK(client->Add(scope, "addr/0", 1).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // compareSet: unset + empty expected sets; a mismatch answers the value
  // held; a match swaps.
  CHECK(client->CompareSet(scope, "cas", "", "a").value() == "a");
  CHECK(client->CompareSet(scope, "cas", "x", "b").value() == "a");
  CHECK(client->CompareSet(scope, "cas", "a", "b").value() == "b");
  CHECK(client->CompareSet(scope, "unset", "x", "y").value() == "x");
  CHECK(client->Get(scope, "unset").status().code() ==
        absl::StatusCode::kNotFound);

  // check (a wait of zero) and the key count.
  CHECK(
      client->Wait(scope, {"addr/0", "addr/1"}, absl::ZeroDuration()).value());
  CHECK_FALSE(
      client->Wait(scope, {"addr/0", "addr/2"}, absl::ZeroDuration()).value());
  CHECK(client->NumKeys(scope).value() == 4);
  CHECK(client->DeleteKey(scope, "cas").value());
  CHECK_FALSE(client->DeleteKey(scope, "cas").value());
  CHECK(client->NumKeys(scope).value() == 3);
  CHECK(client->NumKeys("another/scope").value() == 0);
  CHECK(trainer.Refused("wrong_role") == 0);
}

TEST_CASE("wait is a long poll: answered by a set, not ready at its timeout") {
  auto certs = IssuedCertificates();
  Trainer trainer(*certs);
  auto client = trainer.Client(RoleTls(*certs, "rollout"));
  const std::string scope = "tandem/weights/epoch2";

  absl::Time start = absl::Now();
  CHECK_FALSE(client->Wait(scope, {"never"}, absl::Milliseconds(600)).value());
  const absl::Duration waited = absl::Now() - start;
  CHECK(waited >= absl::Milliseconds(600));
  CHECK(waited < absl::Seconds(3));

  // Longer than one server poll (kMaxWaitMs): the client polls again.
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    REQUIRE(trainer.keys->Set(scope, "late", "v").ok());
  });
  start = absl::Now();
  CHECK(client->Wait(scope, {"late"}, absl::Seconds(20)).value());
  setter.join();
  // Woken by the set, not at the end of a poll.
  CHECK(absl::Now() - start < absl::Seconds(2));
}

TEST_CASE(
    "limits: key, value and keys named in the error; old scopes make room") {
  auto certs = IssuedCertificates();
  RendezvousLimits limits;
  limits.max_key_bytes = 32;
  limits.max_value_bytes = 64;
  limits.max_keys_per_scope = 3;
  limits.max_scopes = 2;
  Trainer trainer(*certs, limits);
  auto client = trainer.Client(RoleTls(*certs, "rollout"));
  const std::string scope = "s1";

  absl::Status big = client->Set(scope, "value", std::string(65, 'x'));
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(big.message()), Catch::Contains("'value'") &&
                                             Catch::Contains("65 bytes") &&
                                             Catch::Contains("limit of 64"));
  absl::Status long_key = client->Set(scope, std::string(33, 'k'), "v");
  CHECK(long_key.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(long_key.message()), Catch::Contains("limit of 32"));

  for (int i = 0; i < 3; ++i) {
    REQUIRE(client->Set(scope, "k" + std::to_string(i), "v").ok());
  }
  absl::Status many = client->Set(scope, "k3", "v");
  CHECK(many.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(many.message()),
             Catch::Contains("'k3'") && Catch::Contains("the limit is 3"));
  CHECK(client->Add(scope, "k4", 1).status().code() ==
        absl::StatusCode::kResourceExhausted);
  // Overwriting a key is not a new key.
  CHECK(client->Set(scope, "k0", "w").ok());

  // Scopes: past the limit the least recently created one that is not the
  // trainer's current scope (an epoch it never formed) is retired.
  trainer.keys->EnterScope(scope);
  REQUIRE(client->Set("s2", "k", "v").ok());
  REQUIRE(client->Set("s3", "k", "v").ok());
  CHECK(trainer.keys->live_scopes() == 2);
  CHECK(client->Get("s2", "k").status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(client->Get(scope, "k0").value() == "w");
}

TEST_CASE("the trainer drops an epoch's keys; a retired scope refuses calls") {
  auto certs = IssuedCertificates();
  Trainer trainer(*certs);
  auto client = trainer.Client(RoleTls(*certs, "rollout"));
  REQUIRE(client->Set("epoch1", "k", "v").ok());
  REQUIRE(client->Set("epoch2", "k", "v").ok());
  // A scope the trainer creates itself retires nothing (a member of a
  // newer epoch may have come first) ...
  trainer.keys->EnterScope("epoch0");
  CHECK(trainer.keys->live_scopes() == 3);
  trainer.keys->RetireScope("epoch0");
  // ... one that members used first retires every scope used before it.
  trainer.keys->EnterScope("epoch2");
  CHECK(trainer.keys->live_scopes() == 1);
  absl::Status late = client->Set("epoch1", "k", "w");
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.message()),
             Catch::Contains("'epoch1'") && Catch::Contains("retired"));
  // Leaving epoch 2 drops its keys; a held wait on it ends with the error.
  std::thread leave([&] {
    absl::SleepFor(absl::Milliseconds(200));
    trainer.keys->RetireScope("epoch2");
  });
  absl::StatusOr<bool> waited =
      client->Wait("epoch2", {"never"}, absl::Seconds(10));
  leave.join();
  CHECK(waited.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(trainer.keys->live_scopes() == 0);
  CHECK(client->Get("epoch2", "k").status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("only trainer and rollout certificates of the CA reach the store") {
  auto certs = IssuedCertificates();
  auto other_ca = IssuedCertificates();
  Trainer trainer(*certs);
  const std::string scope = "tandem/weights/epoch1";

  for (const char* role : {"verifier", "coordinator", "admin"}) {
    INFO("role " << role);
    auto client = trainer.Client(RoleTls(*certs, role));
    absl::Status set = client->Set(scope, "addr/1", "evil");
    CHECK(set.code() == absl::StatusCode::kPermissionDenied);
    CHECK(client->Get(scope, "addr/1").status().code() ==
          absl::StatusCode::kPermissionDenied);
    CHECK(client->Wait(scope, {"addr/1"}, absl::Seconds(1)).status().code() ==
          absl::StatusCode::kPermissionDenied);
  }
  CHECK(trainer.Refused("wrong_role") == 9);

  // A rollout certificate of another CA, and no TLS at all: the handshake
  // fails.
  auto foreign = trainer.Client(RoleTls(*other_ca, "rollout"));
  CHECK(foreign->Set(scope, "addr/1", "evil").code() ==
        absl::StatusCode::kUnavailable);
  auto plaintext = trainer.Client(rpc::TlsOptions());
  CHECK(plaintext->Set(scope, "addr/1", "evil").code() ==
        absl::StatusCode::kUnavailable);

  // Nothing they sent is there for a member to read.
  CHECK(trainer.keys->NumKeys(scope).value() == 0);
  CHECK(trainer.keys->live_scopes() == 0);
  auto member = trainer.Client(RoleTls(*certs, "rollout"));
  CHECK(member->Get(scope, "addr/1").status().code() ==
        absl::StatusCode::kNotFound);
  auto trainer_member = trainer.Client(RoleTls(*certs, "trainer"));
  CHECK(trainer_member->Set(scope, "addr/0", "ok").ok());
}

}  // namespace
}  // namespace tandem::weights

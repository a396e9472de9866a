// ConnectStoreClient (common/weights/store_client.h): a client of a c10d
// TCPStore that returns by its deadline whatever the other end does.

#include "common/weights/broadcast/store_client.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "tests/unit/silent_port.h"

namespace tandem::weights {
namespace {

TEST_CASE("a store client connects to a real store and sees its keys") {
  auto server =
      GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(10));
  REQUIRE(server.ok());
  auto client =
      ConnectStoreClient("127.0.0.1", (*server)->port(), absl::Seconds(10));
  REQUIRE(client.ok());
  (*client)->set("key", std::vector<uint8_t>{1, 2, 3});
  CHECK((*client)->get("key") == std::vector<uint8_t>{1, 2, 3});
}

TEST_CASE(
    "a store that accepts the connection but never answers gives "
    "DeadlineExceeded soon after the timeout") {
  tandem::testing::SilentPort silent;
  const absl::Time start = absl::Now();
  auto client = ConnectStoreClient(
      "127.0.0.1", static_cast<uint16_t>(silent.port()), absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  INFO(client.status().ToString() << " after " << absl::FormatDuration(took));
  REQUIRE_FALSE(client.ok());
  CHECK(client.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(took >= absl::Seconds(1));
  // The timeout, the second of slack the constructor gets, and one poll of
  // the sockets; generous for a loaded machine.
  CHECK(took < absl::Seconds(10));
}

TEST_CASE("a store port with no listener gives Unavailable") {
  uint16_t port = 0;
  {
    // A port that was free a moment ago: bind, read it, close.
    tandem::testing::SilentPort taken;
    port = static_cast<uint16_t>(taken.port());
  }
  auto client = ConnectStoreClient("127.0.0.1", port, absl::Seconds(1));
  INFO(client.status().ToString());
  REQUIRE_FALSE(client.ok());
  CHECK(client.status().code() != absl::StatusCode::kOk);
  CHECK(client.status().message().find("127.0.0.1") != std::string::npos);
}

}  // namespace
}  // namespace tandem::weights

// Epoch formation time of a Gloo broadcast group over the two rendezvous
// stores, side by side and interleaved: c10d's TCPStore (tls.mode off) and
// the store over the trainer's gRPC with mTLS (RendezvousService; rank 0
// in-process, the others RendezvousClient with rollout certificates).
// One round forms one epoch: from the moment every rank starts
// CreateBroadcastGroup to the end of a first 4-byte broadcast on every
// rank (the group is ready). Both stores live for the whole run, as the
// trainer's do; each round is a new key prefix (a new epoch). The order of
// the two modes alternates between rounds. Worker ranks connect anew each
// epoch in both modes (a TCPStore client; a gRPC channel with its TLS
// handshake), as rollout workers do.
//
//   build/bin/rendezvous_bench [--world 4] [--rounds 20]
//
// Prints the median, min and max per mode, and gRPC / TCPStore of the
// medians. Results and the command go to docs/operations.md.

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/rpc/grpc_client.h"
#include "common/rpc/grpc_server.h"
#include "common/weights/broadcast/broadcast_group.h"
#include "common/weights/broadcast/gloo_broadcast_transport.h"
#include "common/weights/broadcast/rendezvous_client.h"
#include "common/weights/broadcast/rendezvous_keys.h"
#include "services/tandemctl/certs_init.h"
#include "services/trainer/rendezvous_service.h"

namespace tandem::weights {
namespace {

rpc::TlsOptions RoleTls(const std::string& dir, const std::string& role) {
  rpc::TlsOptions tls;
  tls.mode = "mtls";
  tls.cert = dir + "/" + role + ".pem";
  tls.key = dir + "/" + role + ".key";
  tls.ca = dir + "/ca.pem";
  return tls;
}

// Forms the group of `world` ranks under `prefix` with each rank's config
// from `config_of`, broadcasts 4 bytes; seconds, or -1 on failure.
template <typename ConfigOf>
double FormEpoch(int world, const GlooRendezvousStore* tcp_server,
                 ConfigOf config_of) {
  std::vector<absl::Status> status(world);
  std::vector<std::thread> ranks;
  const absl::Time start = absl::Now();
  for (int rank = 0; rank < world; ++rank) {
    ranks.emplace_back([&, rank] {
      auto group = CreateBroadcastGroup(config_of(rank),
                                        rank == 0 ? tcp_server : nullptr);
      if (!group.ok()) {
        status[rank] = group.status();
        return;
      }
      alignas(4) uint8_t bytes[4] = {1, 2, 3, 4};
      status[rank] = (*group)->Broadcast(absl::MakeSpan(bytes, 4));
    });
  }
  for (auto& t : ranks) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  for (int rank = 0; rank < world; ++rank) {
    if (!status[rank].ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank,
                   status[rank].ToString().c_str());
      return -1;
    }
  }
  return seconds;
}

void Report(const char* name, std::vector<double> s) {
  std::sort(s.begin(), s.end());
  std::printf("%-10s median %.1f ms  min %.1f ms  max %.1f ms  (%zu epochs)\n",
              name, 1e3 * s[s.size() / 2], 1e3 * s.front(), 1e3 * s.back(),
              s.size());
}

int Main(int argc, char** argv) {
  int world = 4;
  int rounds = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--world") == 0) world = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  char pattern[] = "/tmp/rendezvous_bench.XXXXXX";
  if (mkdtemp(pattern) == nullptr) return 1;
  const std::string certs = pattern;
  certs::CertsInitOptions init;
  init.dir = certs;
  if (!certs::WriteDevCertificates(init).ok()) return 1;

  auto tcp = GlooRendezvousStore::Create("127.0.0.1", 0, absl::Seconds(30));
  if (!tcp.ok()) return 1;
  auto keys = std::make_shared<RendezvousKeys>();
  trainer::RendezvousService service(keys, /*tls_enabled=*/true, nullptr);
  auto server = rpc::GrpcServer::Start("127.0.0.1:0", {&service},
                                       RoleTls(certs, "trainer"));
  if (!server.ok()) return 1;
  const std::string address = (*server)->bound_address();
  std::vector<double> tcp_s, grpc_s;
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool grpc = (round + k) % 2 == 0;
      const std::string prefix =
          std::string(grpc ? "grpc" : "tcp") + "/epoch" + std::to_string(round);
      if (grpc) keys->EnterScope(prefix);
      const double s =
          FormEpoch(world, grpc ? nullptr : tcp->get(), [&](int rank) {
            BroadcastGroupConfig c;
            c.store_port = (*tcp)->port();
            c.key_prefix = prefix;
            c.rank = rank;
            c.world_size = world;
            c.timeout = absl::Seconds(30);
            if (grpc && rank == 0) c.rendezvous = keys;
            // A new client (channel, TLS handshake) per worker rank and
            // epoch, as a worker makes when it joins an epoch (over the
            // TCPStore each worker rank connects anew too).
            if (grpc && rank > 0) {
              c.rendezvous = std::make_shared<RendezvousClient>(
                  rpc::MakeChannel(address, RoleTls(certs, "rollout")),
                  address);
            }
            return c;
          });
      if (s < 0) return 1;
      (grpc ? grpc_s : tcp_s).push_back(s);
    }
  }
  service.Shutdown();
  (*server).reset();
  std::filesystem::remove_all(certs);
  std::printf("world %d, %d rounds interleaved\n", world, rounds);
  Report("TCPStore", tcp_s);
  Report("gRPC+mTLS", grpc_s);
  std::sort(tcp_s.begin(), tcp_s.end());
  std::sort(grpc_s.begin(), grpc_s.end());
  std::printf("gRPC / TCPStore (medians): %.2f\n",
              grpc_s[grpc_s.size() / 2] / tcp_s[tcp_s.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace tandem::weights

int main(int argc, char** argv) { return tandem::weights::Main(argc, argv); }

// Control-plane capacity: simulated rollout workers in this process (a
// process separate from the coordinator) lease prompts and submit finished
// samples over loopback as fast as they can. Reports accepted samples/s and
// SubmitSamples / LeasePrompts latency percentiles, and the CPU time this
// process used (user and system), so a script can put the client's cost per
// sample beside the coordinator's. With --trainer 1 a simulated trainer
// publishes versions back to back meanwhile (each publish syncs the
// coordinator's journal when it has one; the bench script runs it with a
// journal on a slowed disk to show whether workers wait for it). Run it through tests/bench/coordinator_bench.sh, which starts a
// coordinator for it.
//
//   coordinator_bench --coordinator HOST:PORT [--workers 16] [--seconds 10]
//                     [--tokens 16] [--batch 64] [--trainer 0|1]
//                     [--tls-cert F --tls-key F --tls-ca F]  (mutual TLS)
//                     [--tls-trainer-cert F --tls-trainer-key F]
//
// With mutual TLS the coordinator checks roles (coordinator_authz.h): the
// simulated workers present --tls-cert (a rollout certificate), the
// simulated trainer --tls-trainer-cert (a trainer certificate; default
// --tls-cert).

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/rpc/grpc_client.h"
#include "tandem/v1/coordinator.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string coordinator;
  int workers = 16;
  int seconds = 10;
  int tokens = 16;
  int batch = 64;
  int trainer = 0;
  tandem::rpc::TlsOptions tls;
  // The simulated trainer's: `tls` with the trainer's certificate and key.
  tandem::rpc::TlsOptions trainer_tls;
};

struct Latencies {
  std::mutex mu;
  std::vector<double> submit, lease;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Registers a simulated member of `role`; returns its member id.
std::string Register(tandem::v1::Coordinator::Stub& stub,
                     tandem::v1::Role role) {
  tandem::v1::RegisterRequest request;
  request.set_role(role);
  request.set_grpc_address("127.0.0.1:1");
  tandem::v1::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  if (!stub.Register(&context, request, &response).ok()) std::abort();
  return response.member_id();
}

void Worker(const Flags& flags, std::atomic<bool>* stop,
            std::atomic<uint64_t>* accepted, std::atomic<uint64_t>* rejected,
            Latencies* latencies) {
  auto stub = tandem::v1::Coordinator::NewStub(
      tandem::rpc::MakeChannel(flags.coordinator, flags.tls));
  const std::string id = Register(*stub, tandem::v1::ROLE_ROLLOUT);
  std::vector<double> submit_ms, lease_ms;
  auto last_heartbeat = Clock::now();
  std::vector<tandem::v1::Sample> pending;
  while (!*stop) {
    if (Clock::now() - last_heartbeat > std::chrono::milliseconds(500)) {
      tandem::v1::HeartbeatRequest hb;
      hb.set_member_id(id);
      tandem::v1::HeartbeatResponse hb_response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(5));
      stub->Heartbeat(&context, hb, &hb_response);
      last_heartbeat = Clock::now();
    }
    if (pending.size() < static_cast<size_t>(flags.batch)) {
      tandem::v1::LeasePromptsRequest request;
      request.set_member_id(id);
      request.set_max_prompts(16);
      tandem::v1::LeasePromptsResponse response;
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(5));
      const auto start = Clock::now();
      grpc::Status status = stub->LeasePrompts(&context, request, &response);
      lease_ms.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - start)
              .count());
      if (!status.ok()) continue;
      for (const auto& lease : response.leases()) {
        for (uint32_t i = 0; i < lease.group_size(); ++i) {
          tandem::v1::Sample s;
          s.set_sample_id(lease.lease_id() + "/" + std::to_string(i));
          s.set_lease_id(lease.lease_id());
          s.set_group_id(lease.group_id());
          s.set_sample_index(i);
          for (int t = 0; t < flags.tokens; ++t) {
            s.add_completion_token_ids(t % 10);
            s.add_behavior_logprobs(-0.5f);
          }
          auto* span = s.add_version_spans();
          span->set_policy_version(0);
          span->set_num_tokens(flags.tokens);
          s.set_finish_reason(tandem::v1::FINISH_REASON_STOP);
          s.set_completion_text("42");
          s.set_worker_id(id);
          pending.push_back(std::move(s));
        }
      }
      if (response.leases_size() == 0 && pending.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
    }
    tandem::v1::SubmitSamplesRequest request;
    request.set_member_id(id);
    const size_t n = std::min(pending.size(), static_cast<size_t>(flags.batch));
    for (size_t i = 0; i < n; ++i)
      *request.add_samples() = std::move(pending[i]);
    pending.erase(pending.begin(), pending.begin() + n);
    tandem::v1::SubmitSamplesResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    const auto start = Clock::now();
    grpc::Status status = stub->SubmitSamples(&context, request, &response);
    submit_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - start)
            .count());
    if (status.ok()) {
      *accepted += response.accepted();
      *rejected += response.rejected_sample_ids_size();
    }
  }
  std::lock_guard<std::mutex> lock(latencies->mu);
  latencies->submit.insert(latencies->submit.end(), submit_ms.begin(),
                           submit_ms.end());
  latencies->lease.insert(latencies->lease.end(), lease_ms.begin(),
                          lease_ms.end());
}

// Publishes version after version (no batch: each publish only announces
// a version, and syncs the journal) until `stop`; returns how many.
uint64_t Trainer(const Flags& flags, const std::atomic<bool>* stop) {
  auto stub = tandem::v1::Coordinator::NewStub(
      tandem::rpc::MakeChannel(flags.coordinator, flags.trainer_tls));
  const std::string member_id = Register(*stub, tandem::v1::ROLE_TRAINER);
  uint64_t version = 0;
  auto last_heartbeat = Clock::now();
  while (!*stop) {
    if (Clock::now() - last_heartbeat > std::chrono::milliseconds(500)) {
      tandem::v1::HeartbeatRequest hb;
      hb.set_member_id(member_id);
      tandem::v1::HeartbeatResponse hb_response;
      grpc::ClientContext context;
      stub->Heartbeat(&context, hb, &hb_response);
      last_heartbeat = Clock::now();
    }
    tandem::v1::PublishPolicyVersionRequest request;
    request.set_member_id(member_id);
    request.mutable_manifest()->set_policy_version(version + 1);
    tandem::v1::PublishPolicyVersionResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    if (stub->PublishPolicyVersion(&context, request, &response).ok()) {
      ++version;
    }
  }
  return version;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--coordinator")
      flags.coordinator = argv[i + 1];
    else if (f == "--workers")
      flags.workers = std::atoi(argv[i + 1]);
    else if (f == "--seconds")
      flags.seconds = std::atoi(argv[i + 1]);
    else if (f == "--tokens")
      flags.tokens = std::atoi(argv[i + 1]);
    else if (f == "--batch")
      flags.batch = std::atoi(argv[i + 1]);
    else if (f == "--trainer")
      flags.trainer = std::atoi(argv[i + 1]);
    else if (f == "--tls-cert")
      flags.tls.cert = argv[i + 1];
    else if (f == "--tls-key")
      flags.tls.key = argv[i + 1];
    else if (f == "--tls-ca")
      flags.tls.ca = argv[i + 1];
    else if (f == "--tls-trainer-cert")
      flags.trainer_tls.cert = argv[i + 1];
    else if (f == "--tls-trainer-key")
      flags.trainer_tls.key = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (flags.coordinator.empty()) {
    std::fprintf(stderr, "--coordinator HOST:PORT is required\n");
    return 2;
  }
  if (!flags.tls.cert.empty()) {
    flags.tls.mode = "mtls";
    if (absl::Status s = tandem::rpc::CheckTlsOptions(flags.tls); !s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  {
    tandem::rpc::TlsOptions trainer = flags.tls;
    if (!flags.trainer_tls.cert.empty()) trainer.cert = flags.trainer_tls.cert;
    if (!flags.trainer_tls.key.empty()) trainer.key = flags.trainer_tls.key;
    flags.trainer_tls = trainer;
    if (absl::Status s = tandem::rpc::CheckTlsOptions(flags.trainer_tls);
        !s.ok()) {
      std::fprintf(stderr, "trainer: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, rejected{0};
  Latencies latencies;
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int w = 0; w < flags.workers; ++w) {
    threads.emplace_back(Worker, std::cref(flags), &stop, &accepted, &rejected,
                         &latencies);
  }
  uint64_t published = 0;
  std::thread trainer;
  if (flags.trainer > 0) {
    trainer = std::thread([&] { published = Trainer(flags, &stop); });
  }
  std::this_thread::sleep_for(std::chrono::seconds(flags.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  if (trainer.joinable()) trainer.join();
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "workers %d, %d completion tokens/sample, %d samples/SubmitSamples, "
      "%.1f s\n",
      flags.workers, flags.tokens, flags.batch, seconds);
  if (flags.trainer > 0) {
    std::printf("versions published meanwhile: %llu\n",
                static_cast<unsigned long long>(published));
  }
  std::printf("accepted samples: %llu (%.0f samples/s), rejected %llu\n",
              static_cast<unsigned long long>(accepted.load()),
              accepted / seconds,
              static_cast<unsigned long long>(rejected.load()));
  std::printf("SubmitSamples: %zu calls, p50 %.2f ms, p99 %.2f ms\n",
              latencies.submit.size(), Percentile(latencies.submit, 0.5),
              Percentile(latencies.submit, 0.99));
  std::printf("LeasePrompts:  %zu calls, p50 %.2f ms, p99 %.2f ms\n",
              latencies.lease.size(), Percentile(latencies.lease, 0.5),
              Percentile(latencies.lease, 0.99));
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  std::printf("bench cpu: %.2f s user, %.2f s system\n",
              secs(usage.ru_utime), secs(usage.ru_stime));
  return 0;
}

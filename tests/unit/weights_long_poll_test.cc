// Long-polled GetManifest (weight_server.h, grpc_pull_receiver.h), on a
// real port-0 loopback gRPC server: the server holds a request for a
// version newer than the caller's until one is stored, wait_ms passes, the
// client cancels or the service shuts down; the receiver waits with it,
// so an idle receiver asks about once per long-poll window, and
// Interrupt()/Cancel() still end its wait at once. The server's holds and
// the receiver's waits run on a FakeClock (tests/support/fake_clock.h):
// wait_ms, poll_interval and ReceiveNext's deadline pass when the test
// advances it, not in real time.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "common/weights/pull/grpc_pull_receiver.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"
#include "common/weights/weight_sync_metrics.h"
#include "prometheus/registry.h"
#include "tests/support/fake_clock.h"
#include "tests/support/wait_for.h"
#include "weight_server_test_util.h"
#include "weights_test_util.h"

namespace tandem::weights {
namespace {

using Bytes = std::vector<uint8_t>;
using ::tandem::testing::AdvanceWhileWaiting;
using ::tandem::testing::FakeClock;

// Stores version `v` of SmallLayout as a FULL payload (its own anchor).
void PutFull(WeightStore& store, uint64_t v) {
  static const FlatWeightLayout layout = testing::SmallLayout();
  std::mt19937_64 rng(v);
  WeightBuffer weights(layout.total_bytes());
  testing::FillRandom(layout, &weights, rng);
  auto manifest = layout.BuildManifest(weights.span(), v);
  REQUIRE(manifest.ok());
  manifest->set_anchor_version(v);
  REQUIRE(
      store
          .Put(*manifest, std::make_shared<const Bytes>(
                              weights.data(), weights.data() + weights.size()))
          .ok());
}

struct Answer {
  grpc::Status status;
  v1::WeightManifest manifest;
  absl::Duration took;
};

// One GetManifest(latest) call, long-polled when wait_ms > 0.
Answer Ask(const std::shared_ptr<grpc::Channel>& channel, uint64_t newer_than,
           uint32_t wait_ms, grpc::ClientContext* context = nullptr) {
  auto stub = v1::WeightServer::NewStub(channel);
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(60));
  v1::GetManifestRequest request;
  request.set_newer_than(newer_than);
  request.set_wait_ms(wait_ms);
  Answer answer;
  const absl::Time start = absl::Now();
  answer.status = stub->GetManifest(context, request, &answer.manifest);
  answer.took = absl::Now() - start;
  return answer;
}

// tandem_weight_sync_manifest_requests_total{wait="<wait>"}.
double ManifestRequests(prometheus::Registry& registry,
                        const std::string& wait) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "tandem_weight_sync_manifest_requests_total") continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Label& label : m.label) {
        if (label.name == "wait" && label.value == wait) return m.counter.value;
      }
    }
  }
  return 0;
}

// Waits (real time, at most 10 s) until `ready()`: for a request to reach
// the server, which is real I/O.
template <typename Predicate>
bool WaitUntil(Predicate ready) {
  return ::tandem::testing::WaitFor(ready, absl::Seconds(10));
}

// Asks GetManifest(newer_than, wait_ms) on its own thread.
struct Asking {
  Asking(const std::shared_ptr<grpc::Channel>& channel, uint64_t newer_than,
         uint32_t wait_ms)
      : thread([this, channel, newer_than, wait_ms] {
          answer = Ask(channel, newer_than, wait_ms);
          answered.store(true);
        }) {}
  ~Asking() {
    if (thread.joinable()) thread.join();
  }
  Answer answer;
  std::atomic<bool> answered{false};
  std::thread thread;
};

TEST_CASE("A held GetManifest is answered when a newer version is stored",
          "[weights][long_poll]") {
  WeightStore store;
  prometheus::Registry registry;
  WeightSyncMetrics metrics(registry);
  // wait_ms never passes on a clock nobody advances: only the Put ends it.
  FakeClock clock;
  testing::WeightServerLoopback server(&store,
                                       {.metrics = &metrics, .clock = &clock});
  PutFull(store, 1);
  Asking asking(server.channel(), 1, 20000);
  REQUIRE(WaitUntil([&] { return server.service().held_long_polls() == 1; }));
  CHECK_FALSE(asking.answered.load());  // it is held
  PutFull(store, 2);
  asking.thread.join();
  const Answer& answer = asking.answer;
  INFO(answer.status.error_message()
       << " after " << absl::FormatDuration(answer.took));
  REQUIRE(answer.status.ok());
  CHECK(answer.manifest.policy_version() == 2);
  CHECK(answer.took < absl::Seconds(2));  // at once after the Put
  CHECK(server.service().stats().long_polls == 1);
  CHECK(server.service().stats().manifest_requests == 1);
  CHECK(ManifestRequests(registry, "long_poll") == 1);
  CHECK(Ask(server.channel(), 1, 0).status.ok());
  CHECK(ManifestRequests(registry, "none") == 1);
}

TEST_CASE("A held GetManifest is answered as at once when wait_ms passes",
          "[weights][long_poll]") {
  WeightStore store;
  FakeClock clock;
  testing::WeightServerLoopback server(&store, {.clock = &clock});
  // Held while 299 ms of wait_ms 300 passed on the server's clock (its loop
  // still waits on the clock for the rest), answered once 300 ms passed.
  auto held_for_wait_ms = [&](Asking& asking) {
    REQUIRE(WaitUntil([&] { return server.service().held_long_polls() == 1; }));
    REQUIRE(clock.WaitForWaiters(1));
    clock.Advance(absl::Milliseconds(299));
    CHECK(clock.WaitForWaiters(1, absl::Seconds(2)));
    CHECK(server.service().held_long_polls() == 1);
    CHECK_FALSE(asking.answered.load());
    clock.Advance(absl::Milliseconds(1));
    asking.thread.join();
    return asking.answer;
  };
  SECTION("empty store: NOT_FOUND after wait_ms") {
    Asking asking(server.channel(), 0, 300);
    const Answer answer = held_for_wait_ms(asking);
    INFO(absl::FormatDuration(answer.took));
    CHECK(answer.status.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(answer.took < absl::Seconds(2));
  }
  SECTION("nothing newer: the latest after wait_ms") {
    PutFull(store, 3);
    Asking asking(server.channel(), 3, 300);
    const Answer answer = held_for_wait_ms(asking);
    INFO(absl::FormatDuration(answer.took));
    REQUIRE(answer.status.ok());
    CHECK(answer.manifest.policy_version() == 3);
    CHECK(answer.took < absl::Seconds(2));
  }
  SECTION("something newer, or no wait_ms (an older client): at once") {
    PutFull(store, 3);
    for (const auto& [newer_than, wait_ms] :
         {std::pair<uint64_t, uint32_t>{2, 20000}, {3, 0}, {7, 0}}) {
      const Answer answer = Ask(server.channel(), newer_than, wait_ms);
      INFO("newer_than " << newer_than << " wait_ms " << wait_ms << ": "
                         << absl::FormatDuration(answer.took));
      REQUIRE(answer.status.ok());
      CHECK(answer.manifest.policy_version() == 3);
      CHECK(answer.took < absl::Seconds(2));
    }
    CHECK(server.service().stats().long_polls == 0);
  }
  SECTION("a version stored into an empty store ends the wait") {
    Asking asking(server.channel(), 0, 20000);
    REQUIRE(WaitUntil([&] { return server.service().held_long_polls() == 1; }));
    PutFull(store, 1);
    asking.thread.join();
    const Answer& answer = asking.answer;
    REQUIRE(answer.status.ok());
    CHECK(answer.manifest.policy_version() == 1);
    CHECK(answer.took < absl::Seconds(2));
  }
}

TEST_CASE("Held GetManifests end at once on Shutdown, cancel, server stop",
          "[weights][long_poll]") {
  WeightStore store;
  PutFull(store, 1);
  SECTION("the service's Shutdown, then the loopback server's") {
    auto server = std::make_unique<testing::WeightServerLoopback>(&store);
    std::vector<Answer> answers(3);
    std::vector<std::thread> asking;
    for (Answer& a : answers) {
      asking.emplace_back(
          [&, channel = server->channel()] { a = Ask(channel, 1, 30000); });
    }
    REQUIRE(
        WaitUntil([&] { return server->service().held_long_polls() == 3; }));
    REQUIRE(server->service().stats().long_polls == 3);
    const absl::Time start = absl::Now();
    server.reset();  // Shutdown(), server Shutdown(), destruction
    const absl::Duration stopping = absl::Now() - start;
    for (std::thread& t : asking) t.join();
    CHECK(stopping < absl::Seconds(2));
    for (const Answer& a : answers) {
      INFO(a.status.error_message());
      CHECK(a.status.ok());
      CHECK(a.manifest.policy_version() == 1);
      CHECK(a.took < absl::Seconds(3));
    }
  }
  SECTION("a gRPC server shut down with a deadline cancels them") {
    WeightServerService service(&store, {});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> grpc_server = builder.BuildAndStart();
    REQUIRE(grpc_server != nullptr);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                       grpc::InsecureChannelCredentials());
    Answer answer;
    std::thread asking([&] { answer = Ask(channel, 1, 30000); });
    REQUIRE(WaitUntil([&] { return service.held_long_polls() == 1; }));
    REQUIRE(service.stats().long_polls == 1);
    const absl::Time start = absl::Now();
    grpc_server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(100));
    grpc_server.reset();
    const absl::Duration stopping = absl::Now() - start;
    asking.join();
    CHECK(stopping < absl::Seconds(2));
    CHECK_FALSE(answer.status.ok());
    CHECK(answer.took < absl::Seconds(3));
    // `service` is destroyed with nothing held; a later Put reaches no
    // finished reactor.
    PutFull(store, 2);
  }
  SECTION("the client cancels") {
    testing::WeightServerLoopback server(&store);
    grpc::ClientContext context;
    Answer answer;
    std::thread asking(
        [&] { answer = Ask(server.channel(), 1, 30000, &context); });
    REQUIRE(WaitUntil([&] { return server.service().held_long_polls() == 1; }));
    context.TryCancel();
    asking.join();
    CHECK(answer.status.error_code() == grpc::StatusCode::CANCELLED);
    CHECK(answer.took < absl::Seconds(2));
    // The cancelled poll is gone: a Put answers only the next one.
    Answer next;
    std::thread again([&] { next = Ask(server.channel(), 1, 30000); });
    // Held: the second poll, alone (the cancelled one left the list).
    REQUIRE(WaitUntil([&] {
      return server.service().stats().long_polls == 2 &&
             server.service().held_long_polls() == 1;
    }));
    PutFull(store, 2);
    again.join();
    REQUIRE(next.status.ok());
    CHECK(next.manifest.policy_version() == 2);
    CHECK(server.service().stats().long_polls == 2);
  }
}

// A receiver holding v1, as a worker does.
struct Receiving {
  explicit Receiving(testing::WeightServerLoopback& server, WeightStore& store,
                     PullOptions options) {
    PutFull(store, 1);
    auto made = StagingWeights::Create(testing::SmallLayout(),
                                       StagingMode::kDoubleBuffer);
    REQUIRE(made.ok());
    staging = *std::move(made);
    receiver = std::make_unique<GrpcPullReceiver>(server.channel(), options);
    auto got = receiver->ReceiveNext(staging.get(),
                                     options.clock->Now() + absl::Seconds(20));
    REQUIRE(got.ok());
    REQUIRE(staging->Commit().ok());
  }
  std::unique_ptr<StagingWeights> staging;
  std::unique_ptr<GrpcPullReceiver> receiver;
};

// ReceiveNext on its own thread, timed on `clock`.
struct Receive {
  Receive(GrpcPullReceiver* receiver, StagingWeights* staging, FakeClock& clock,
          absl::Time deadline)
      : thread([this, receiver, staging, &clock, deadline] {
          const absl::Time start = clock.Now();
          got = receiver->ReceiveNext(staging, deadline);
          took = clock.Now() - start;
          done.store(true);
        }) {}
  ~Receive() {
    if (thread.joinable()) thread.join();
  }
  absl::StatusOr<uint64_t> got = absl::UnknownError("not returned");
  absl::Duration took;
  std::atomic<bool> done{false};
  std::thread thread;
};

TEST_CASE(
    "An idle pull receiver asks once per long-poll window instead of every "
    "poll_interval",
    "[weights][long_poll]") {
  WeightStore store;
  // One clock for the server's holds and the receiver's waits, advanced in
  // 10 ms steps only while one of them waits on it (not while a call is
  // on its way), so the counts below do not depend on the machine's load.
  FakeClock clock;
  testing::WeightServerLoopback server(&store, {.clock = &clock});
  // Side by side: long polls of 1 s against none (every 100 ms, as before
  // long polls), each over a 3 s ReceiveNext with nothing newer.
  auto idle_calls = [&](absl::Duration long_poll) {
    Receiving r(server, store, {.long_poll = long_poll, .clock = &clock});
    const uint64_t before = server.service().stats().manifest_requests;
    Receive receive(r.receiver.get(), r.staging.get(), clock,
                    clock.Now() + absl::Seconds(3));
    REQUIRE(AdvanceWhileWaiting(clock, absl::Milliseconds(10),
                                [&] { return receive.done.load(); }));
    receive.thread.join();
    INFO(receive.got.status().ToString()
         << " after " << absl::FormatDuration(receive.took));
    CHECK(absl::IsDeadlineExceeded(receive.got.status()));
    CHECK(receive.took >= absl::Milliseconds(2800));
    CHECK(receive.took <= absl::Milliseconds(3200));
    return server.service().stats().manifest_requests - before;
  };
  const uint64_t polled = idle_calls(absl::ZeroDuration());
  const uint64_t long_polled = idle_calls(absl::Seconds(1));
  INFO("GetManifest calls in 3 s: " << polled << " polling every 100 ms, "
                                    << long_polled << " long-polling 1 s");
  CHECK(polled >= 20);
  CHECK(long_polled >= 3);
  CHECK(long_polled <= 4);
}

TEST_CASE(
    "A long-polling receiver gets a new version at once, and Interrupt and "
    "Cancel end its wait at once",
    "[weights][long_poll]") {
  WeightStore store;
  // Nobody advances the clock but the deadline section: poll_interval and
  // long_poll never pass, only the long poll's answer (or Interrupt,
  // Cancel) can end a wait.
  FakeClock clock;
  testing::WeightServerLoopback server(&store, {.clock = &clock});
  Receiving r(server, store,
              {.poll_interval = absl::Seconds(5),
               .long_poll = absl::Seconds(10),
               .clock = &clock});
  const uint64_t polls_before = server.service().stats().long_polls;
  auto held = [&](uint64_t polls) {
    return WaitUntil([&] {
      return server.service().stats().long_polls == polls &&
             server.service().held_long_polls() == 1;
    });
  };
  SECTION("a version stored while it waits") {
    std::thread publisher([&] {
      REQUIRE(held(polls_before + 1));
      PutFull(store, 2);
    });
    const absl::Time start = absl::Now();
    auto got = r.receiver->ReceiveNext(r.staging.get(),
                                       clock.Now() + absl::Seconds(20));
    const absl::Duration took = absl::Now() - start;
    publisher.join();
    INFO(got.status().ToString() << " after " << absl::FormatDuration(took));
    REQUIRE(got.ok());
    CHECK(*got == 2);
    CHECK(took < absl::Seconds(1));
    CHECK(server.service().stats().long_polls == polls_before + 1);
  }
  SECTION("Interrupt") {
    std::thread interrupter([&] {
      REQUIRE(held(polls_before + 1));
      r.receiver->Interrupt();
    });
    const absl::Time start = absl::Now();
    auto got = r.receiver->ReceiveNext(r.staging.get(),
                                       clock.Now() + absl::Seconds(20));
    const absl::Duration took = absl::Now() - start;
    interrupter.join();
    INFO(got.status().ToString() << " after " << absl::FormatDuration(took));
    REQUIRE(absl::IsCancelled(got.status()));
    CHECK(std::string(got.status().message()).find("interrupted") !=
          std::string::npos);
    CHECK(took < absl::Seconds(1));
    CHECK(server.service().stats().long_polls == polls_before + 1);
    // The receiver goes on: the next wait gets the next version.
    std::thread publisher([&] {
      REQUIRE(held(polls_before + 2));
      PutFull(store, 2);
    });
    got = r.receiver->ReceiveNext(r.staging.get(),
                                  clock.Now() + absl::Seconds(20));
    publisher.join();
    REQUIRE(got.ok());
    CHECK(*got == 2);
  }
  SECTION("Cancel") {
    std::thread canceller([&] {
      REQUIRE(held(polls_before + 1));
      r.receiver->Cancel();
    });
    const absl::Time start = absl::Now();
    auto got = r.receiver->ReceiveNext(r.staging.get(),
                                       clock.Now() + absl::Seconds(20));
    const absl::Duration took = absl::Now() - start;
    canceller.join();
    INFO(got.status().ToString() << " after " << absl::FormatDuration(took));
    CHECK(absl::IsCancelled(got.status()));
    CHECK(took < absl::Seconds(1));
  }
  SECTION("the deadline") {
    const absl::Time deadline = clock.Now() + absl::Milliseconds(700);
    Receive receive(r.receiver.get(), r.staging.get(), clock, deadline);
    REQUIRE(AdvanceWhileWaiting(clock, absl::Milliseconds(10),
                                [&] { return receive.done.load(); }));
    receive.thread.join();
    INFO(receive.got.status().ToString());
    CHECK(absl::IsDeadlineExceeded(receive.got.status()));
    CHECK(clock.Now() >= deadline - absl::Milliseconds(100));
    CHECK(clock.Now() < deadline + absl::Milliseconds(300));
  }
}

TEST_CASE(
    "A server that answers long polls at once is asked every poll_interval, "
    "not in a busy loop",
    "[weights][long_poll]") {
  WeightStore store;
  FakeClock clock;
  testing::WeightServerLoopback server(&store, {.clock = &clock});
  Receiving r(server, store, {.long_poll = absl::Seconds(10), .clock = &clock});
  // After Shutdown the service answers every long poll at once with what
  // it has, as a server that ignores wait_ms does.
  server.service().Shutdown();
  const uint64_t before = server.service().stats().manifest_requests;
  Receive receive(r.receiver.get(), r.staging.get(), clock,
                  clock.Now() + absl::Seconds(1));
  REQUIRE(AdvanceWhileWaiting(clock, absl::Milliseconds(10),
                              [&] { return receive.done.load(); }));
  receive.thread.join();
  CHECK(absl::IsDeadlineExceeded(receive.got.status()));
  const uint64_t calls = server.service().stats().manifest_requests - before;
  INFO(calls << " GetManifest calls in 1 s at poll_interval 100 ms");
  CHECK(calls >= 5);
  CHECK(calls <= 11);
}

TEST_CASE(
    "A receiver without a live version asks at once: version 0 is a "
    "version",
    "[weights][long_poll]") {
  WeightStore store;
  FakeClock clock;
  testing::WeightServerLoopback server(&store, {.clock = &clock});
  auto staging = StagingWeights::Create(testing::SmallLayout(),
                                        StagingMode::kDoubleBuffer);
  REQUIRE(staging.ok());
  GrpcPullReceiver receiver(server.channel(),
                            {.long_poll = absl::Seconds(10), .clock = &clock});
  std::thread publisher;
  SECTION("stored before") { PutFull(store, 0); }
  SECTION("stored while it waits") {
    // Once the receiver, told NOT_FOUND, pauses for poll_interval: store
    // version 0 and let the pause end.
    publisher = std::thread([&] {
      REQUIRE(clock.WaitForWaiters(1));
      PutFull(store, 0);
      clock.Advance(absl::Milliseconds(100));
    });
  }
  const absl::Time start = absl::Now();
  auto got =
      receiver.ReceiveNext(staging->get(), clock.Now() + absl::Seconds(20));
  const absl::Duration took = absl::Now() - start;
  if (publisher.joinable()) publisher.join();
  INFO(got.status().ToString() << " after " << absl::FormatDuration(took));
  REQUIRE(got.ok());
  CHECK(*got == 0);
  CHECK(took < absl::Seconds(2));
  CHECK(server.service().stats().long_polls == 0);
}

}  // namespace
}  // namespace tandem::weights

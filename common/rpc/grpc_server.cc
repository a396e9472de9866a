#include "common/rpc/grpc_server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>

#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/logging.h"
#include "common/rpc/tls_credentials.h"

namespace tandem::rpc {

// The number of calls the server is handling. gRPC's own shutdown waits for
// calls *and* for every client connection to go away, which it cannot tell
// apart; counting calls here lets Shutdown stop waiting once only idle
// connections are left.
class GrpcServer::CallCounter {
 public:
  void Add() {
    absl::MutexLock lock(&mu_);
    ++count_;
  }
  void Done() {
    absl::MutexLock lock(&mu_);
    --count_;
  }
  int count() const {
    absl::MutexLock lock(&mu_);
    return count_;
  }
  // True if no call is in flight by `deadline`.
  bool AwaitNone(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto none = [this]()
                    ABSL_SHARED_LOCKS_REQUIRED(mu_) { return count_ == 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
  }

 private:
  mutable absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {

// Lives exactly as long as one call: gRPC creates it when the call arrives
// and destroys it with the call's context, after the handler is done.
class CountingInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit CountingInterceptor(std::function<void()> done)
      : done_(std::move(done)) {}
  ~CountingInterceptor() override { done_(); }
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  std::function<void()> done_;
};

}  // namespace

class GrpcServer::CountingInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingInterceptorFactory(std::shared_ptr<CallCounter> calls)
      : calls_(std::move(calls)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    calls_->Add();
    return new CountingInterceptor([calls = calls_] { calls->Done(); });
  }

 private:
  std::shared_ptr<CallCounter> calls_;
};

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const TlsOptions& tls) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("grpc_address must be host:port, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (tls.enabled()) {
    // Config loading checks these already; a caller that builds TlsOptions
    // itself gets the same message instead of a server whose every
    // handshake fails.
    if (absl::Status s = CheckTlsOptions(tls); !s.ok()) return s;
  }
  if (!tls.enabled() && !IsLoopbackHost(host)) {
    ComponentLogger("grpc")->warn(
        "serving gRPC on {} in plaintext (tls.mode: off): anyone who can "
        "reach this address can call every RPC; set tls.mode: mtls "
        "(docs/operations.md, TLS)",
        address);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, MakeServerCredentials(tls), &port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<GrpcServer> server(new GrpcServer());
  server->calls_ = std::make_shared<CallCounter>();
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<CountingInterceptorFactory>(server->calls_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve gRPC on ", address, " (address in use or not local?)"));
  }
  // The default health service reports SERVING once built; turn it off at
  // once so nothing sees the daemon ready before it is.
  server->SetServing(false);
  server->bound_address_ = absl::StrCat(address.substr(0, colon), ":", port);
  return server;
}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) {
  if (server_ == nullptr) return;
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
  }
}

int GrpcServer::calls_in_flight() const {
  return calls_ == nullptr ? 0 : calls_->count();
}

void GrpcServer::Shutdown(absl::Duration deadline) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  SetServing(false);
  const absl::Time give_up = absl::Now() + deadline;
  // Stop admitting calls and connections at once. Core shutdown is
  // idempotent and notifies every tag: grpc::Server::Shutdown below repeats
  // it with its own.
  grpc_completion_queue* shutdown_cq =
      grpc_completion_queue_create_for_pluck(nullptr);
  int shutdown_tag = 0;
  grpc_server_shutdown_and_notify(server_->c_server(), shutdown_cq,
                                  &shutdown_tag);
  if (!calls_->AwaitNone(give_up)) {
    ComponentLogger("grpc")->warn(
        "{} gRPC call(s) still in flight after the {} shutdown deadline; "
        "cancelling them",
        calls_->count(), absl::FormatDuration(deadline));
  }
  // Only idle connections are left (or the deadline passed): close them
  // rather than wait for each client to acknowledge the GOAWAY.
  grpc_server_cancel_all_calls(server_->c_server());
  server_->Shutdown(absl::ToChronoTime(give_up));
  server_->Wait();
  grpc_completion_queue_pluck(shutdown_cq, &shutdown_tag,
                              gpr_inf_future(GPR_CLOCK_REALTIME), nullptr);
  grpc_completion_queue_shutdown(shutdown_cq);
  grpc_completion_queue_pluck(shutdown_cq, nullptr,
                              gpr_inf_future(GPR_CLOCK_REALTIME), nullptr);
  grpc_completion_queue_destroy(shutdown_cq);
}

}  // namespace tandem::rpc

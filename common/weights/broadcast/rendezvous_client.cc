#include "common/weights/broadcast/rendezvous_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

// The longest single poll the client asks for; the server bounds it too.
constexpr absl::Duration kPollSlice = absl::Seconds(2);

}  // namespace

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                   std::string target,
                                   absl::Duration rpc_timeout)
    : stub_(tandem::v1::Rendezvous::NewStub(std::move(channel))),
      target_(std::move(target)),
      rpc_timeout_(rpc_timeout) {}

void RendezvousClient::SetDeadline(grpc::ClientContext* context,
                                   absl::Duration extra) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_ + extra));
}

absl::Status RendezvousClient::Failed(const char* op, const std::string& key,
                                      const grpc::Status& status) const {
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("rendezvous ", op, " of '", key, "' at the trainer ",
                   target_, ": ", status.error_message()));
}

absl::Status RendezvousClient::Set(const std::string& scope,
                                   const std::string& key,
                                   const std::string& value) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreSetRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_value(value);
  tandem::v1::StoreSetResponse response;
  grpc::Status status = stub_->StoreSet(&context, request, &response);
  if (!status.ok()) return Failed("set", key, status);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& scope,
                                                  const std::string& key) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreKeyRequest request;
  request.set_scope(scope);
  request.set_key(key);
  tandem::v1::StoreValueResponse response;
  grpc::Status status = stub_->StoreGet(&context, request, &response);
  if (!status.ok()) return Failed("get", key, status);
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> RendezvousClient::Add(const std::string& scope,
                                              const std::string& key,
                                              int64_t delta) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreAddRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_delta(delta);
  tandem::v1::StoreAddResponse response;
  grpc::Status status = stub_->StoreAdd(&context, request, &response);
  if (!status.ok()) return Failed("add", key, status);
  return response.value();
}

absl::StatusOr<std::string> RendezvousClient::CompareSet(
    const std::string& scope, const std::string& key,
    const std::string& expected, const std::string& desired) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreCompareSetRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  tandem::v1::StoreValueResponse response;
  grpc::Status status = stub_->StoreCompareSet(&context, request, &response);
  if (!status.ok()) return Failed("compareSet", key, status);
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> RendezvousClient::Wait(
    const std::string& scope, const std::vector<std::string>& keys,
    absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    const absl::Duration slice =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kPollSlice);
    grpc::ClientContext context;
    SetDeadline(&context, slice);
    tandem::v1::StoreWaitRequest request;
    request.set_scope(scope);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_wait_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(slice)));
    tandem::v1::StoreWaitResponse response;
    grpc::Status status = stub_->StoreWait(&context, request, &response);
    if (!status.ok()) {
      return Failed("wait", keys.empty() ? std::string() : keys.front(),
                    status);
    }
    if (response.ready()) return true;
    if (absl::Now() >= deadline) return false;
  }
}

absl::StatusOr<bool> RendezvousClient::DeleteKey(const std::string& scope,
                                                 const std::string& key) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreKeyRequest request;
  request.set_scope(scope);
  request.set_key(key);
  tandem::v1::StoreDeleteKeyResponse response;
  grpc::Status status = stub_->StoreDeleteKey(&context, request, &response);
  if (!status.ok()) return Failed("deleteKey", key, status);
  return response.deleted();
}

absl::StatusOr<int64_t> RendezvousClient::NumKeys(const std::string& scope) {
  grpc::ClientContext context;
  SetDeadline(&context, absl::ZeroDuration());
  tandem::v1::StoreNumKeysRequest request;
  request.set_scope(scope);
  tandem::v1::StoreNumKeysResponse response;
  grpc::Status status = stub_->StoreNumKeys(&context, request, &response);
  if (!status.ok()) return Failed("getNumKeys", scope, status);
  return response.num_keys();
}

}  // namespace tandem::weights

#include "common/weights/broadcast/rendezvous_client.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::weights {
namespace {

// The longest single poll the client asks for; the server bounds it too.
constexpr absl::Duration kPollSlice = absl::Seconds(2);

using Stub = tandem::v1::Rendezvous::Stub;

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

template <typename Request, typename Response>
absl::Status RendezvousClient::Call(
    const char* op, const std::string& key,
    grpc::Status (tandem::v1::Rendezvous::Stub::*method)(grpc::ClientContext*,
                                                         const Request&,
                                                         Response*),
    const Request& request, Response* response, absl::Duration extra) const {
  grpc::ClientContext context;
  SetDeadline(&context, extra);
  grpc::Status status = (stub_.get()->*method)(&context, request, response);
  if (!status.ok()) return Failed(op, key, status);
  return absl::OkStatus();
}

absl::Status RendezvousClient::Set(const std::string& scope,
                                   const std::string& key,
                                   const std::string& value) {
  tandem::v1::StoreSetRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_value(value);
  tandem::v1::StoreSetResponse response;
  return Call("set", key, &Stub::StoreSet, request, &response);
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& scope,
                                                  const std::string& key) {
  tandem::v1::StoreKeyRequest request;
  request.set_scope(scope);
  request.set_key(key);
  tandem::v1::StoreValueResponse response;
  RETURN_IF_ERROR(Call("get", key, &Stub::StoreGet, request, &response));
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> RendezvousClient::Add(const std::string& scope,
                                              const std::string& key,
                                              int64_t delta) {
  tandem::v1::StoreAddRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_delta(delta);
  tandem::v1::StoreAddResponse response;
  RETURN_IF_ERROR(Call("add", key, &Stub::StoreAdd, request, &response));
  return response.value();
}

absl::StatusOr<std::string> RendezvousClient::CompareSet(
    const std::string& scope, const std::string& key,
    const std::string& expected, const std::string& desired) {
  tandem::v1::StoreCompareSetRequest request;
  request.set_scope(scope);
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  tandem::v1::StoreValueResponse response;
  RETURN_IF_ERROR(
      Call("compareSet", key, &Stub::StoreCompareSet, request, &response));
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> RendezvousClient::Wait(
    const std::string& scope, const std::vector<std::string>& keys,
    absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    const absl::Duration slice =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kPollSlice);
    tandem::v1::StoreWaitRequest request;
    request.set_scope(scope);
    for (const std::string& key : keys) request.add_keys(key);
    request.set_wait_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(slice)));
    tandem::v1::StoreWaitResponse response;
    RETURN_IF_ERROR(Call("wait", keys.empty() ? std::string() : keys.front(),
                         &Stub::StoreWait, request, &response, slice));
    if (response.ready()) return true;
    if (absl::Now() >= deadline) return false;
  }
}

absl::StatusOr<bool> RendezvousClient::DeleteKey(const std::string& scope,
                                                 const std::string& key) {
  tandem::v1::StoreKeyRequest request;
  request.set_scope(scope);
  request.set_key(key);
  tandem::v1::StoreDeleteKeyResponse response;
  RETURN_IF_ERROR(
      Call("deleteKey", key, &Stub::StoreDeleteKey, request, &response));
  return response.deleted();
}

absl::StatusOr<int64_t> RendezvousClient::NumKeys(const std::string& scope) {
  tandem::v1::StoreNumKeysRequest request;
  request.set_scope(scope);
  tandem::v1::StoreNumKeysResponse response;
  RETURN_IF_ERROR(
      Call("getNumKeys", scope, &Stub::StoreNumKeys, request, &response));
  return response.num_keys();
}

}  // namespace tandem::weights

#include "common/rpc/tls_credentials.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/synchronization/mutex.h"

namespace tandem::rpc {
namespace {

using grpc::experimental::CertificateProviderInterface;
using grpc::experimental::FileWatcherCertificateProvider;

// One provider per distinct set of files and refresh interval, kept for the
// life of the process: a daemon has one set, so this holds one provider and
// its refresh thread instead of one per channel.
std::shared_ptr<CertificateProviderInterface> SharedProvider(
    const TlsOptions& tls) {
  using Key = std::tuple<std::string, std::string, std::string, int64_t>;
  // Leaked on purpose: channels may outlive static destruction.
  static auto* mu = new absl::Mutex;
  static auto* providers =
      new std::map<Key, std::shared_ptr<CertificateProviderInterface>>;
  absl::MutexLock lock(mu);
  auto& slot = (*providers)[Key(tls.key, tls.cert, tls.ca, tls.refresh_s)];
  if (slot == nullptr) {
    slot = std::make_shared<FileWatcherCertificateProvider>(
        tls.key, tls.cert, tls.ca,
        static_cast<unsigned int>(std::max<int64_t>(1, tls.refresh_s)));
  }
  return slot;
}

}  // namespace

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(SharedProvider(tls));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const TlsOptions& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(SharedProvider(tls));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

void ApplyTargetNameOverride(const TlsOptions& tls,
                             grpc::ChannelArguments* args) {
  if (tls.enabled() && !tls.server_name.empty()) {
    args->SetSslTargetNameOverride(tls.server_name);
  }
}

}  // namespace tandem::rpc

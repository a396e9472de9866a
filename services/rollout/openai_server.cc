#include "services/rollout/openai_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "services/rollout/openai_session.h"

namespace tandem::rollout {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

}  // namespace

OpenAIServer::Impl::~Impl() {
  io->stop();
  if (thread.joinable()) thread.join();
  poster->Detach();
  acceptor.reset();
  io.reset();
}

void OpenAIServer::Impl::Start(const std::string& host,
                               const std::string& port) {
  tcp::resolver resolver(*io);
  const auto endpoints = resolver.resolve(host, port, tcp::resolver::passive);
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor->open(endpoint.protocol());
  acceptor->set_option(tcp::acceptor::reuse_address(true));
  acceptor->bind(endpoint);
  acceptor->listen(asio::socket_base::max_listen_connections);
  Accept();
  thread = std::thread([this] { io->run(); });
}

void OpenAIServer::Impl::Accept() {
  acceptor->async_accept([this](beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted) return;
    if (error) {
      // Out of descriptors or similar: try again shortly, never spin.
      auto timer = std::make_shared<asio::steady_timer>(*io);
      timer->expires_after(std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) { Accept(); });
      return;
    }
    ServeConnection(std::move(socket), this);
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<OpenAIServer>> OpenAIServer::Create(
    OpenAIServerOptions options, const tokenizer::Tokenizer* tokenizer,
    std::shared_ptr<const chat::LoadedChatTemplates> templates,
    std::string no_chat_reason, ServingQueue* queue,
    std::function<uint64_t()> policy_version) {
  const std::string address = options.listen;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("openai.listen must be host:port, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  std::unique_ptr<OpenAIServer> server(new OpenAIServer());
  server->impl_ = std::make_unique<Impl>(
      std::move(options), tokenizer, std::move(templates),
      std::move(no_chat_reason), queue, std::move(policy_version));
  try {
    server->impl_->Start(host, port);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve the OpenAI endpoint on ", address, ": ", e.what()));
  }
  server->bound_address_ =
      absl::StrCat(address.substr(0, colon), ":",
                   server->impl_->acceptor->local_endpoint().port());
  return server;
}

OpenAIServer::~OpenAIServer() = default;

}  // namespace tandem::rollout

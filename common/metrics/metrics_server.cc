#include "common/metrics/metrics_server.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <exception>
#include <thread>

#include "absl/strings/str_cat.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr char kVersion[] = "0.1.0";
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A connection idle (or a request unfinished) this long is closed.
constexpr std::chrono::seconds kIdleTimeout(60);

// One HTTP/1.1 connection: answers requests in turn until the peer closes,
// asks to close, idles out, or the server stops. Owned by its pending
// handlers (shared_from_this); all of them run on the server's one thread.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<prometheus::Registry> registry)
      : stream_(std::move(socket)), registry_(std::move(registry)) {}

  void Read() {
    request_ = {};
    stream_.expires_after(kIdleTimeout);
    http::async_read(
        stream_, buffer_, request_,
        [self = shared_from_this()](beast::error_code error, size_t) {
          if (!error) self->Respond();
        });
  }

 private:
  void Respond() {
    auto response = std::make_shared<http::response<http::string_body>>();
    // HTTP/1.1 whatever the request's version (the highest one served);
    // the connection stays open only when the request asked for that.
    response->version(11);
    response->keep_alive(request_.keep_alive());
    response->set(http::field::server, "tandem");
    const std::string_view target(request_.target().data(),
                                  request_.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (path != "/metrics") {
      response->result(http::status::not_found);
      response->set(http::field::content_type, "text/plain");
      response->body() = "not found: the metrics are at /metrics\n";
    } else if (request_.method() != http::verb::get &&
               request_.method() != http::verb::head) {
      response->result(http::status::method_not_allowed);
      response->set(http::field::allow, "GET, HEAD");
    } else {
      response->result(http::status::ok);
      response->set(http::field::content_type, kContentType);
      response->body() =
          prometheus::TextSerializer().Serialize(registry_->Collect());
    }
    response->prepare_payload();
    if (request_.method() == http::verb::head) response->body().clear();
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](
                          beast::error_code error, size_t) {
                        if (error || !response->keep_alive()) {
                          beast::error_code ignored;
                          self->stream_.socket().shutdown(
                              tcp::socket::shutdown_send, ignored);
                          return;
                        }
                        self->Read();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::shared_ptr<prometheus::Registry> registry_;
};

}  // namespace

// The listener and its thread. Destruction stops the io_context, joins the
// thread, and then destroys the pending handlers (and with them every open
// connection).
class MetricsServer::Http {
 public:
  explicit Http(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)), acceptor_(io_) {}

  ~Http() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
  }

  // Binds host:port (port 0: any free one) and starts serving.
  void Start(const std::string& host, const std::string& port) {
    tcp::resolver resolver(io_);
    const auto endpoints =
        resolver.resolve(host, port, tcp::resolver::passive);
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  unsigned short port() const { return acceptor_.local_endpoint().port(); }

 private:
  void Accept() {
    acceptor_.async_accept([this](beast::error_code error,
                                  tcp::socket socket) {
      if (error == asio::error::operation_aborted) return;
      if (!error) {
        std::make_shared<Session>(std::move(socket), registry_)->Read();
      }
      Accept();
    });
  }

  std::shared_ptr<prometheus::Registry> registry_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Create(
    const std::string& address, const std::string& daemon,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  prometheus::BuildGauge()
      .Name("tandem_build_info")
      .Help("Always 1; labels carry the daemon and its version.")
      .Register(*server->registry_)
      .Add({{"daemon", daemon}, {"version", kVersion}})
      .Set(1);
  const double start_seconds =
      std::chrono::duration<double>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  prometheus::BuildGauge()
      .Name("tandem_process_start_time_seconds")
      .Help("Unix time when the daemon started, in seconds.")
      .Register(*server->registry_)
      .Add({})
      .Set(start_seconds);
  if (address.empty()) return server;

  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address must be host:port, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty()) host = "0.0.0.0";
  auto http = std::make_unique<Http>(server->registry_);
  try {
    http->Start(host, port);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", e.what()));
  }
  server->bound_address_ =
      absl::StrCat(address.substr(0, colon), ":", http->port());
  server->http_ = std::move(http);
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace tandem::metrics

#include "common/metrics/metrics_server.h"

#include <sys/stat.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <list>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

constexpr char kVersion[] = "0.1.0";
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A connection idle (or a request unfinished) this long is closed, and so
// is one whose response is not taken within kWriteTimeout.
constexpr std::chrono::seconds kIdleTimeout(60);
constexpr std::chrono::seconds kWriteTimeout(30);
// Most connections open at once. A scraper keeps one; beyond the cap the
// oldest connection waiting for a request is closed to admit a new one.
constexpr size_t kMaxConnections = 64;
// accept() failures (EMFILE...) pause accepting this long, doubling.
constexpr std::chrono::milliseconds kMinAcceptBackoff(10);
constexpr std::chrono::milliseconds kMaxAcceptBackoff(1000);

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  // Closes the connection (its pending operation completes with an error
  // and the session goes away).
  virtual void Evict() = 0;
};

// The sessions open, oldest request wait first, so that the connection
// that has waited longest for a request can be closed for a new one. Used
// on the server's one thread only.
struct SessionList {
  std::list<SessionBase*> waiting;  // waiting for (or reading) a request
  size_t open = 0;
};

// One HTTP/1.1 connection over `Stream` (beast::tcp_stream, or TlsStream
// after a handshake): answers requests in turn until the peer closes, asks
// to close, idles out, is evicted, or the server stops. Owned by its
// pending handlers (shared_from_this); all of them run on the server's one
// thread.
template <typename Stream>
class Session : public SessionBase,
                public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  // `context`: the TLS context the connection was accepted with (kept
  // alive while the session is); null for plain HTTP.
  Session(tcp::socket socket, std::shared_ptr<ssl::context> context,
          std::shared_ptr<prometheus::Registry> registry,
          SessionList* sessions)
      : context_(std::move(context)),
        stream_(MakeStream(std::move(socket), context_.get())),
        registry_(std::move(registry)),
        sessions_(sessions) {
    ++sessions_->open;
  }
  ~Session() override {
    StopWaiting();
    --sessions_->open;
  }

  // The TLS handshake first (with the request's deadline, evictable as a
  // connection waiting for its request), then requests.
  void Start() {
    if constexpr (kTls) {
      Tcp().expires_after(kIdleTimeout);
      Wait();
      stream_.async_handshake(
          ssl::stream_base::server,
          [self = this->shared_from_this()](beast::error_code error) {
            self->StopWaiting();
            if (!error) self->Read();
          });
    } else {
      Read();
    }
  }

  void Evict() override {
    StopWaiting();
    beast::error_code ignored;
    Tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Tcp().socket().close(ignored);
  }

 private:
  static Stream MakeStream(tcp::socket socket, ssl::context* context) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *context);
    } else {
      return Stream(std::move(socket));
    }
  }

  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  void Wait() {
    waiting_ = sessions_->waiting.insert(sessions_->waiting.end(), this);
    is_waiting_ = true;
  }

  void StopWaiting() {
    if (!is_waiting_) return;
    sessions_->waiting.erase(waiting_);
    is_waiting_ = false;
  }

  void Read() {
    request_ = {};
    Tcp().expires_after(kIdleTimeout);
    Wait();
    http::async_read(
        stream_, buffer_, request_,
        [self = this->shared_from_this()](beast::error_code error, size_t) {
          self->StopWaiting();
          if (!error) self->Respond();
        });
  }

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
    Tcp().expires_after(kWriteTimeout);
    http::async_write(stream_, *response,
                      [self = this->shared_from_this(), response](
                          beast::error_code error, size_t) {
                        if (error || !response->keep_alive()) {
                          // The response carries its length: closing the
                          // TCP connection ends it (no TLS close_notify).
                          beast::error_code ignored;
                          self->Tcp().socket().shutdown(
                              tcp::socket::shutdown_send, ignored);
                          return;
                        }
                        self->Read();
                      });
  }

  std::shared_ptr<ssl::context> context_;
  Stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::shared_ptr<prometheus::Registry> registry_;
  SessionList* sessions_;
  std::list<SessionBase*>::iterator waiting_;
  bool is_waiting_ = false;
};

// Modification time and size of a file (zero when it cannot be read).
struct FileStamp {
  int64_t mtime_ns = 0;
  int64_t size = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp StampOf(const std::string& path) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 +
              st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size)};
}

// A server TLS context from `tls`'s files; the error names the key and
// file that did not load.
absl::StatusOr<std::shared_ptr<ssl::context>> LoadTlsContext(
    const MetricsTls& tls) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  beast::error_code error;
  context->set_options(ssl::context::default_workarounds |
                           ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                           ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1,
                       error);
  auto failed = [&](const char* key, const std::string& path) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.tls ", tls.mode, ": ", key, " '", path,
                     "' does not load: ", error.message()));
  };
  if (context->use_certificate_chain_file(tls.cert, error); error) {
    return failed("tls.cert", tls.cert);
  }
  if (context->use_private_key_file(tls.key, ssl::context::pem, error);
      error) {
    return failed("tls.key", tls.key);
  }
  if (tls.mode == "mtls") {
    if (context->load_verify_file(tls.ca, error); error) {
      return failed("tls.ca", tls.ca);
    }
    context->set_verify_mode(
        ssl::verify_peer | ssl::verify_fail_if_no_peer_cert, error);
  } else {
    context->set_verify_mode(ssl::verify_none, error);
  }
  return context;
}

}  // namespace

// The listener and its thread. Destruction stops the io_context, joins the
// thread, and then destroys the pending handlers (and with them every open
// connection). Idle clients cost a connection slot each, never the thread:
// every read and write is asynchronous with a deadline, at most
// kMaxConnections are open (the oldest waiting one yields to a newcomer),
// and accept() failures back off instead of spinning.
class MetricsServer::Http {
 public:
  // `context`: the TLS context loaded from `tls` (null: plain HTTP).
  Http(std::shared_ptr<prometheus::Registry> registry, MetricsTls tls,
       std::shared_ptr<ssl::context> context)
      : registry_(std::move(registry)),
        tls_(std::move(tls)),
        context_(std::move(context)),
        stamps_(Stamps()),
        last_check_(std::chrono::steady_clock::now()),
        acceptor_(io_),
        backoff_timer_(io_),
        dropped_(prometheus::BuildCounter()
                     .Name("tandem_metrics_connections_dropped_total")
                     .Help("Connections to /metrics closed by the server to "
                           "stay within its bounds, by reason: evicted (the "
                           "oldest connection waiting for a request, closed "
                           "to admit a new one), accept_error (accept() "
                           "failed, e.g. out of file descriptors).")
                     .Register(*registry_)),
        evicted_(dropped_.Add({{"reason", "evicted"}})),
        accept_errors_(dropped_.Add({{"reason", "accept_error"}})),
        reload_failures_(
            prometheus::BuildCounter()
                .Name("tandem_metrics_tls_reload_failures_total")
                .Help("Changed TLS files (tls.cert, tls.key, tls.ca) of the "
                      "/metrics endpoint that did not load (metrics.tls on); "
                      "the last files that loaded stay in use.")
                .Register(*registry_)
                .Add({})) {}

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
    acceptor_.listen(asio::socket_base::max_listen_connections);
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  unsigned short port() const { return acceptor_.local_endpoint().port(); }

 private:
  // Closes the connection that has waited longest for a request; false
  // when every open connection is busy answering one.
  bool EvictOldestWaiting() {
    if (sessions_.waiting.empty()) return false;
    sessions_.waiting.front()->Evict();
    evicted_.Increment();
    return true;
  }

  void Accept() {
    acceptor_.async_accept([this](beast::error_code error,
                                  tcp::socket socket) {
      if (error == asio::error::operation_aborted) return;
      if (error) {
        // Out of descriptors (or another accept failure): free one by
        // closing the connection that has waited longest for a request and
        // try again at once; with none to close, wait (doubling) before
        // the next try, the pending connections queued in the backlog.
        accept_errors_.Increment();
        if (EvictOldestWaiting()) {
          Accept();
          return;
        }
        if (backoff_ == std::chrono::milliseconds(0)) {
          std::fprintf(stderr, "metrics: accept failed (%s); backing off\n",
                       error.message().c_str());
        }
        backoff_ = std::clamp(backoff_ * 2, kMinAcceptBackoff,
                              kMaxAcceptBackoff);
        backoff_timer_.expires_after(backoff_);
        backoff_timer_.async_wait([this](beast::error_code e) {
          if (e != asio::error::operation_aborted) Accept();
        });
        return;
      }
      backoff_ = std::chrono::milliseconds(0);
      if (sessions_.open >= kMaxConnections && !EvictOldestWaiting()) {
        // Every slot is answering a request: this one waits its turn in
        // no queue of ours; close it.
        beast::error_code ignored;
        socket.close(ignored);
      } else if (context_ != nullptr) {
        ReloadIfChanged();
        std::make_shared<Session<TlsStream>>(std::move(socket), context_,
                                             registry_, &sessions_)
            ->Start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(
            std::move(socket), nullptr, registry_, &sessions_)
            ->Start();
      }
      Accept();
    });
  }

  std::array<FileStamp, 3> Stamps() const {
    return {StampOf(tls_.cert), StampOf(tls_.key), StampOf(tls_.ca)};
  }

  // At most every refresh_s: when a TLS file changed on disk, new
  // connections get a context loaded from the new files (open ones keep
  // the context they were accepted with). Files that do not load (e.g. a
  // certificate replaced before its key) are tried again at the next
  // check; until then the last good context serves.
  void ReloadIfChanged() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check_ < std::chrono::seconds(tls_.refresh_s)) return;
    last_check_ = now;
    const std::array<FileStamp, 3> stamps = Stamps();
    if (stamps == stamps_) return;
    absl::StatusOr<std::shared_ptr<ssl::context>> context =
        LoadTlsContext(tls_);
    if (!context.ok()) {
      reload_failures_.Increment();
      std::fprintf(stderr, "metrics: %s; keeping the last TLS files\n",
                   std::string(context.status().message()).c_str());
      return;
    }
    context_ = *std::move(context);
    stamps_ = stamps;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  const MetricsTls tls_;
  // The TLS context new connections get (null: plain HTTP), the stamps of
  // the files it was loaded from, and when they were last compared. Used
  // on the server's thread only (and before it starts).
  std::shared_ptr<ssl::context> context_;
  std::array<FileStamp, 3> stamps_;
  std::chrono::steady_clock::time_point last_check_;
  // Before io_: the sessions io_'s pending handlers own leave this list
  // when io_ is destroyed.
  SessionList sessions_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer backoff_timer_;
  std::chrono::milliseconds backoff_{0};
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Counter& evicted_;
  prometheus::Counter& accept_errors_;
  prometheus::Counter& reload_failures_;
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Create(
    const std::string& address, const std::string& daemon,
    std::shared_ptr<prometheus::Registry> registry, const MetricsTls& tls) {
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
  std::shared_ptr<ssl::context> context;
  if (tls.enabled()) {
    if (tls.mode != "tls" && tls.mode != "mtls") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics.tls must be off, tls or mtls, got '", tls.mode, "'"));
    }
    ASSIGN_OR_RETURN(context, LoadTlsContext(tls));
  }
  auto http = std::make_unique<Http>(server->registry_, tls, context);
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

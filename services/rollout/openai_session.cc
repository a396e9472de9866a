#include "services/rollout/openai_session.h"

#include <algorithm>
#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "services/rollout/harness_routes.h"
#include "services/rollout/openai_choices.h"
#include "services/rollout/openai_prompt.h"

namespace tandem::rollout {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using openai::ApiError;
using openai::Json;

auto Log() { return ComponentLogger("openai"); }

constexpr std::chrono::seconds kHeaderTimeout(60);
constexpr std::chrono::seconds kWriteTimeout(30);
constexpr std::chrono::seconds kLingerTimeout(5);

int HttpStatusOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// One HTTP/1.1 connection: reads a request, answers it (possibly after a
// generation, possibly as a stream), and reads the next until the peer
// closes. Owned by its pending handlers; io thread only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, OpenAIServer::Impl* server)
      : stream_(std::move(socket)), server_(server), timer_(*server->io) {
    ++server_->open_sessions;
  }
  ~Session() {
    if (request_) server_->queue->Cancel(request_->request_id());
    EndEpisodeTurn(/*completed=*/false);
    --server_->open_sessions;
  }

  void Read() {
    parser_.emplace();
    parser_->body_limit(server_->options.max_body_bytes);
    stream_.expires_after(kHeaderTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code e, size_t) {
                       self->OnRead(e);
                     });
  }

  // Answers 503 and closes: the connection cap is reached.
  void Refuse() {
    keep_alive_ = false;
    WriteError(503,
               {.http_status = 503,
                .message = absl::StrCat("too many connections (the limit is ",
                                        server_->options.max_connections, ")"),
                .type = "server_error"});
  }

 private:
  void OnRead(beast::error_code error) {
    if (error == http::error::body_limit) {
      keep_alive_ = false;
      WriteError(413, {.http_status = 413,
                       .message = absl::StrCat("the request body exceeds ",
                                               server_->options.max_body_bytes,
                                               " bytes")});
      return;
    }
    if (error) return;  // closed, timed out, or malformed: drop
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    const std::string_view target(req.target().data(), req.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (IsHarnessPath(path)) {
      // Episode times are on the harness's clock (unused without one).
      HarnessEpisodes* harness = server_->options.harness;
      return ServeHarness(HandleHarnessRequest(
          harness, req.method() == http::verb::post, path, req.body(),
          harness != nullptr ? harness->Now() : absl::InfinitePast()));
    }
    if (path == "/v1/models" || path == "/models") {
      if (req.method() != http::verb::get) return MethodNotAllowed("GET");
      WriteJson(200,
                openai::ModelList(server_->options.model_id, server_->created,
                                  server_->policy_version(),
                                  server_->options.prompt.context_tokens));
      return;
    }
    openai::Endpoint endpoint;
    if (path == "/v1/completions") {
      endpoint = openai::Endpoint::kCompletions;
    } else if (path == "/v1/chat/completions") {
      endpoint = openai::Endpoint::kChatCompletions;
    } else {
      WriteError(404, {.http_status = 404,
                       .message = absl::StrCat(
                           "no route ", std::string(path),
                           "; this server has /v1/models, /v1/completions "
                           "and /v1/chat/completions")});
      return;
    }
    if (req.method() != http::verb::post) return MethodNotAllowed("POST");
    ApiError api_error;
    std::optional<openai::CompletionRequest> parsed =
        openai::ParseCompletionRequest(endpoint, req.body(),
                                       server_->options.limits, &api_error);
    if (!parsed) return WriteError(api_error.http_status, api_error);
    Start(std::move(*parsed));
  }

  // A claim that found nothing polls every 20 ms until its wait is over.
  // The wait is real time, as a parked PullTrainingBatch's: it answers a
  // real HTTP client before that client's own timeout.
  void ServeHarness(HarnessReply reply) {
    if (reply.status != 204 || reply.claim_wait <= absl::ZeroDuration()) {
      return WriteJson(reply.status, reply.body);
    }
    const absl::Time give_up = absl::Now() + reply.claim_wait;
    timer_.expires_after(std::chrono::milliseconds(20));
    timer_.async_wait(
        [self = shared_from_this(), give_up](beast::error_code e) {
          if (e) return;
          HarnessEpisodes* harness = self->server_->options.harness;
          if (auto claimed = TryClaim(harness, harness->Now())) {
            return self->WriteJson(200, *claimed);
          }
          self->ServeHarness({.status = 204,
                              .claim_wait = std::max(give_up - absl::Now(),
                                                     absl::ZeroDuration())});
        });
  }

  // The harness episode's turn ends: recorded when `completed`, else
  // dropped (the episode goes on from its earlier tokens).
  void EndEpisodeTurn(bool completed) {
    if (!request_ || api_request_.episode_id.empty()) return;
    ::tandem::rollout::EndEpisodeTurn(
        server_->options.harness, api_request_.episode_id,
        request_->request_id(),
        completed ? std::optional(choices_->Results().at(0)) : std::nullopt);
  }

  void MethodNotAllowed(const char* allowed) {
    WriteError(405, {.http_status = 405,
                     .message = absl::StrCat("use ", allowed, " here")});
  }

  // Tokenizes, checks the context, and submits to the engine.
  void Start(openai::CompletionRequest request) {
    auto prepared =
        PrepareRequest(request, *server_->tokenizer, server_->templates.get(),
                       server_->no_chat_reason, server_->options.prompt);
    if (const auto* error = std::get_if<openai::ApiError>(&prepared)) {
      return WriteError(error->http_status, *error);
    }
    std::vector<int32_t> prompt =
        std::move(std::get<PreparedRequest>(prepared).prompt);
    const engine::SamplingParams params =
        std::get<PreparedRequest>(prepared).params;

    const bool chat = request.endpoint == openai::Endpoint::kChatCompletions;
    const uint64_t number = server_->next_request++;
    if (std::optional<ApiError> error =
            BeginEpisodeTurn(server_->options.harness, request,
                             absl::StrCat("oai-", number), prompt)) {
      return WriteError(error->http_status, *error);
    }
    header_.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", number);
    header_.created = absl::ToUnixSeconds(absl::Now());
    header_.model = server_->options.model_id;
    // A connection's previous request leaves nothing behind.
    outbox_.clear();
    stream_done_ = false;
    std::optional<openai::ChoiceAssembler::ToolParsing> tools;
    if (chat && request.parse_tool_calls) {
      tools = openai::ChoiceAssembler::ToolParsing{
          .format = server_->options.tool_call_format,
          .id_prefix = absl::StrCat("call_", number, "_")};
    }
    choices_.emplace(server_->tokenizer, request.n, request.stop,
                     std::move(tools));
    prompt_ = prompt;
    api_request_ = std::move(request);

    std::weak_ptr<Session> weak = weak_from_this();
    std::shared_ptr<IoPoster> poster = server_->poster;
    request_ = std::make_shared<ServedRequest>(absl::StrCat("oai-", number),
                                               std::move(prompt), params,
                                               [weak, poster] {
                                                 poster->Post([weak] {
                                                   if (auto self = weak.lock())
                                                     self->OnProgress();
                                                 });
                                               });
    if (absl::Status s = server_->queue->Submit(request_); !s.ok()) {
      EndEpisodeTurn(/*completed=*/false);
      request_.reset();
      return WriteError(503, {.http_status = 503,
                              .message = std::string(s.message()),
                              .type = "server_error"});
    }
    timer_.expires_after(std::chrono::milliseconds(
        absl::ToInt64Milliseconds(server_->options.request_timeout)));
    timer_.async_wait([self = shared_from_this()](beast::error_code e) {
      if (!e) self->OnTimeout();
    });
    WatchForClose();
    if (api_request_.stream) StartStream();
  }

  // Learns that the peer closed while it waits for the engine: the socket
  // turns readable and a peek reads nothing.
  void WatchForClose() {
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this(), request = request_](beast::error_code e) {
          if (request != self->request_) return;  // a finished request
          char c;
          beast::error_code peek_error;
          const size_t n = self->stream_.socket().receive(
              asio::buffer(&c, 1), tcp::socket::message_peek, peek_error);
          if (e || peek_error || n == 0) {
            Log()->info("client closed {} mid-generation; cancelled",
                        self->header_.id);
            self->Abandon();
          }
        });
  }

  void OnTimeout() {
    if (!request_) return;
    const std::string message =
        absl::StrCat("the generation did not finish within ",
                     absl::FormatDuration(server_->options.request_timeout),
                     " (openai.request_timeout_s)");
    server_->queue->Cancel(request_->request_id());
    EndEpisodeTurn(/*completed=*/false);
    request_.reset();
    keep_alive_ = false;
    if (api_request_.stream) {
      QueueChunk(absl::StrCat(
          "data: ",
          openai::Dump(openai::ErrorBody(
              {.http_status = 504, .message = message, .type = "timeout"})),
          "\n\n"));
      EndStream();
    } else {
      WriteError(504,
                 {.http_status = 504, .message = message, .type = "timeout"});
    }
  }

  // The client went away: cancel, and let the handlers release the session.
  void Abandon() {
    if (request_) server_->queue->Cancel(request_->request_id());
    EndEpisodeTurn(/*completed=*/false);
    request_.reset();
    timer_.cancel();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  void OnProgress() {
    if (!request_) return;
    ServedRequest::Progress p = request_->Take();
    if (!p.error.ok()) {
      const absl::Status error = p.error;
      EndEpisodeTurn(/*completed=*/false);
      request_.reset();
      timer_.cancel();
      if (api_request_.stream) {
        QueueChunk(absl::StrCat("data: ",
                                openai::Dump(openai::ErrorBody(
                                    {.http_status = HttpStatusOf(error),
                                     .message = std::string(error.message()),
                                     .type = "server_error"})),
                                "\n\n"));
        keep_alive_ = false;
        EndStream();
      } else {
        const int status = HttpStatusOf(error);
        WriteError(status, {.http_status = status,
                            .message = std::string(error.message()),
                            .type = status == 400 ? "invalid_request_error"
                                                  : "server_error"});
      }
      return;
    }
    std::string events;
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      const int32_t index = static_cast<int32_t>(i);
      if (choices_->Absorb(index, p.tokens[i])) {
        server_->queue->Cancel(request_->request_id(), index);  // stop string
      }
      choices_->Finish(index, p.finished[i]);
      if (!api_request_.stream) continue;
      bool first = false;
      if (std::optional<openai::ChoiceResult> delta =
              choices_->TakeDelta(index, &first)) {
        absl::StrAppend(&events, "data: ",
                        openai::Dump(openai::StreamChunk(
                            api_request_, header_, prompt_, *delta, first)),
                        "\n\n");
      }
    }
    if (api_request_.stream && !events.empty()) QueueChunk(std::move(events));
    if (!choices_->all_done()) return;
    // Recorded before the response goes out: the harness's next turn
    // extends it.
    EndEpisodeTurn(/*completed=*/true);
    request_.reset();
    timer_.cancel();
    if (api_request_.stream) {
      std::string tail;
      if (api_request_.include_usage) {
        const int64_t completion = choices_->completion_tokens();
        tail =
            absl::StrCat("data: ",
                         openai::Dump(openai::UsageChunk(
                             api_request_, header_,
                             static_cast<int64_t>(prompt_.size()), completion)),
                         "\n\n");
      }
      QueueChunk(tail + "data: [DONE]\n\n");
      EndStream();
      return;
    }
    WriteJson(200, openai::CompletionResponse(api_request_, header_, prompt_,
                                              choices_->Results()));
  }

  // ---- Streaming: chunked transfer encoding, one write at a time. ----

  void StartStream() {
    stream_header_ = std::make_shared<http::response<http::empty_body>>(
        http::status::ok, 11);
    stream_header_->set(http::field::server, "tandem");
    stream_header_->set(http::field::content_type, "text/event-stream");
    stream_header_->set(http::field::cache_control, "no-cache");
    stream_header_->keep_alive(keep_alive_);
    stream_header_->chunked(true);
    auto serializer =
        std::make_shared<http::response_serializer<http::empty_body>>(
            *stream_header_);
    writing_ = true;
    stream_.expires_after(kWriteTimeout);
    http::async_write_header(
        stream_, *serializer,
        [self = shared_from_this(), serializer](beast::error_code e, size_t) {
          self->OnStreamWrite(e);
        });
  }

  void QueueChunk(std::string data) {
    outbox_.push_back(std::move(data));
    if (!writing_) FlushStream();
  }

  void EndStream() {
    stream_done_ = true;
    if (!writing_) FlushStream();
  }

  void FlushStream() {
    if (outbox_.empty()) {
      if (!stream_done_) return;
      stream_done_ = false;
      writing_ = true;
      stream_.expires_after(kWriteTimeout);
      asio::async_write(
          stream_, http::make_chunk_last(),
          [self = shared_from_this()](beast::error_code e, size_t) {
            self->writing_ = false;
            if (e || !self->keep_alive_) return self->Close();
            self->Read();
          });
      return;
    }
    auto data = std::make_shared<std::string>(std::move(outbox_.front()));
    outbox_.pop_front();
    writing_ = true;
    stream_.expires_after(kWriteTimeout);
    asio::async_write(
        stream_, http::make_chunk(asio::buffer(*data)),
        [self = shared_from_this(), data](beast::error_code e, size_t) {
          self->OnStreamWrite(e);
        });
  }

  void OnStreamWrite(beast::error_code error) {
    writing_ = false;
    if (error) {
      // The client is gone mid-stream: stop its sequences.
      if (request_) {
        Log()->info("client closed {} mid-stream; cancelled", header_.id);
      }
      Abandon();
      return;
    }
    stream_.expires_never();
    FlushStream();
  }

  // ---- Plain responses. ----

  void WriteError(int status, const ApiError& error) {
    WriteJson(status, openai::ErrorBody(error));
  }

  void WriteJson(int status, const Json& body) {
    auto response = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(status), 11);
    response->set(http::field::server, "tandem");
    response->set(http::field::content_type, "application/json");
    response->keep_alive(keep_alive_);
    if (status != 204) response->body() = openai::Dump(body);
    response->prepare_payload();
    stream_.expires_after(kWriteTimeout);
    http::async_write(
        stream_, *response,
        [self = shared_from_this(), response](beast::error_code e, size_t) {
          if (e || !response->keep_alive()) return self->Close();
          self->Read();
        });
  }

  // Ends the response side, then reads and discards what the client still
  // sends (an oversized body, say) until it closes, for at most
  // kLingerTimeout: closing with unread input would reset the connection
  // and the client could lose the response it has not read yet.
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTimeout);
    Discard();
  }

  void Discard() {
    auto sink = std::make_shared<std::array<char, 16384>>();
    stream_.async_read_some(
        asio::buffer(*sink),
        [self = shared_from_this(), sink](beast::error_code e, size_t) {
          if (!e) self->Discard();
        });
  }

  beast::tcp_stream stream_;
  OpenAIServer::Impl* const server_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = true;
  // The request being generated (null between requests).
  std::shared_ptr<ServedRequest> request_;
  openai::CompletionRequest api_request_;
  openai::ResponseHeader header_;
  std::vector<int32_t> prompt_;
  std::optional<openai::ChoiceAssembler> choices_;
  std::shared_ptr<http::response<http::empty_body>> stream_header_;
  std::deque<std::string> outbox_;
  bool writing_ = false;
  bool stream_done_ = false;
};

}  // namespace

void ServeConnection(boost::asio::ip::tcp::socket socket,
                     OpenAIServer::Impl* server) {
  auto session = std::make_shared<Session>(std::move(socket), server);
  if (server->open_sessions > server->options.max_connections) {
    session->Refuse();
  } else {
    session->Read();
  }
}

}  // namespace tandem::rollout

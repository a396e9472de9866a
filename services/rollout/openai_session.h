#pragma once

// Internal to OpenAIServer (openai_server.cc, openai_session.cc): the
// state the listener shares with its sessions, and the session that serves
// one accepted HTTP/1.1 connection (reads a request, answers it, possibly
// after a generation, possibly as a stream, and reads the next until the
// peer closes).

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "services/rollout/io_poster.h"
#include "services/rollout/openai_server.h"
#include "services/rollout/serving_queue.h"

namespace tandem::rollout {

// State shared by the listener and its sessions; io thread only, except
// the immutable parts.
class OpenAIServer::Impl {
 public:
  Impl(OpenAIServerOptions options, const tokenizer::Tokenizer* tokenizer,
       std::shared_ptr<const chat::LoadedChatTemplates> templates,
       std::string no_chat_reason, ServingQueue* queue,
       std::function<uint64_t()> policy_version)
      : options(std::move(options)),
        tokenizer(tokenizer),
        templates(std::move(templates)),
        no_chat_reason(std::move(no_chat_reason)),
        queue(queue),
        policy_version(std::move(policy_version)),
        io(std::make_unique<boost::asio::io_context>()),
        poster(std::make_shared<IoPoster>(io.get())),
        acceptor(std::make_unique<boost::asio::ip::tcp::acceptor>(*io)),
        created(absl::ToUnixSeconds(absl::Now())) {}

  // Stops the thread, then destroys the pending handlers (and with them
  // every session, which cancels its request) while this object is whole.
  ~Impl();

  // Binds host:port, starts accepting and the io thread. Throws Boost's
  // system_error when the address cannot be bound.
  void Start(const std::string& host, const std::string& port);

  // Accepts the next connection and hands it to ServeConnection (io
  // thread).
  void Accept();

  const OpenAIServerOptions options;
  const tokenizer::Tokenizer* const tokenizer;
  const std::shared_ptr<const chat::LoadedChatTemplates> templates;
  const std::string no_chat_reason;
  ServingQueue* const queue;
  const std::function<uint64_t()> policy_version;
  std::unique_ptr<boost::asio::io_context> io;
  // The engine thread's way into `io`; it may outlive the server.
  std::shared_ptr<IoPoster> poster;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor;
  const int64_t created;
  int32_t open_sessions = 0;  // io thread
  uint64_t next_request = 1;  // io thread
  std::thread thread;
};

// Serves `socket`, just accepted by `server`'s listener, until the peer
// closes; refuses it (503, then closes) when it makes more than
// options.max_connections open sessions. io thread only; the session owns
// itself through its pending handlers and is destroyed with them.
void ServeConnection(boost::asio::ip::tcp::socket socket,
                     OpenAIServer::Impl* server);

}  // namespace tandem::rollout

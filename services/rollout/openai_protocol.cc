#include "services/rollout/openai_protocol.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem::rollout::openai {
namespace {

// A short, printable rendering of a value for an error message.
std::string Show(const Json& value) {
  std::string s = Dump(value);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Parse state: the body and the first error met.
class Fields {
 public:
  Fields(const Json& body, ApiError* error) : body_(body), error_(error) {}

  bool failed() const { return failed_; }

  bool Fail(const std::string& param, const std::string& message) {
    if (!failed_) {
      failed_ = true;
      error_->http_status = 400;
      error_->param = param;
      error_->message = message;
    }
    return false;
  }
  bool WrongType(const std::string& param, const char* expected) {
    return Fail(param, absl::StrCat("'", param, "' must be ", expected,
                                    ", got ", Show(body_[param])));
  }

  // Present and not null.
  bool Has(const char* key) const {
    auto it = body_.find(key);
    return it != body_.end() && !it->is_null();
  }
  const Json& At(const char* key) const { return body_[key]; }

  // A number in [lo, hi] (bools are not numbers).
  void Number(const char* key, double lo, double hi, double* out) {
    if (!Has(key)) return;
    const Json& v = At(key);
    if (!v.is_number()) {
      WrongType(key, "a number");
      return;
    }
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      Fail(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi,
                             "], got ", Show(v)));
      return;
    }
    *out = d;
  }
  // An integer in [lo, hi].
  bool Integer(const char* key, int64_t lo, int64_t hi, int64_t* out) {
    if (!Has(key)) return false;
    const Json& v = At(key);
    if (!v.is_number_integer()) {
      // 3.0 is an integer to Python clients that build bodies from floats.
      if (v.is_number_float() &&
          std::trunc(v.get<double>()) == v.get<double>() &&
          std::abs(v.get<double>()) < 9e15) {
        return InRange(key, static_cast<int64_t>(v.get<double>()), lo, hi, out);
      }
      WrongType(key, "an integer");
      return false;
    }
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return InRange(key, INT64_MAX, lo, hi, out);
    }
    return InRange(key, v.get<int64_t>(), lo, hi, out);
  }
  bool InRange(const char* key, int64_t value, int64_t lo, int64_t hi,
               int64_t* out) {
    if (value < lo || value > hi) {
      Fail(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi,
                             "], got ", Show(At(key))));
      return false;
    }
    *out = value;
    return true;
  }
  void Bool(const char* key, bool* out) {
    if (!Has(key)) return;
    if (!At(key).is_boolean()) {
      WrongType(key, "a boolean");
      return;
    }
    *out = At(key).get<bool>();
  }
  void String(const char* key, std::string* out) {
    if (!Has(key)) return;
    if (!At(key).is_string()) {
      WrongType(key, "a string");
      return;
    }
    *out = At(key).get<std::string>();
  }
  // Accepted only when absent, null or equal to the neutral value.
  void Neutral(const char* key, double neutral, const char* why) {
    if (!Has(key)) return;
    const Json& v = At(key);
    if (!v.is_number()) {
      WrongType(key, "a number");
      return;
    }
    if (v.get<double>() != neutral) {
      Fail(key,
           absl::StrCat("'", key, "' ", Show(v), " is not supported: ", why));
    }
  }

 private:
  const Json& body_;
  ApiError* error_;
  bool failed_ = false;
};

// A token-id array: non-empty, each a non-negative 32-bit integer.
bool TokenIds(Fields* f, const std::string& param, const Json& v,
              size_t max_len, std::vector<int32_t>* out) {
  if (!v.is_array()) return f->WrongType(param, "an array of token ids");
  if (v.size() > max_len) {
    return f->Fail(param, absl::StrCat("'", param, "' has ", v.size(),
                                       " token ids; the limit is ", max_len));
  }
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& t = v[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return f->Fail(param, absl::StrCat("'", param, "[", i,
                                         "]' must be a token id (an integer "
                                         ">= 0), got ",
                                         Show(t)));
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

void ParsePrompt(Fields* f, CompletionRequest* r, const RequestLimits& limits) {
  if (!f->Has("prompt")) {
    f->Fail("prompt", "'prompt' is required");
    return;
  }
  const Json& p = f->At("prompt");
  if (p.is_string()) {
    r->prompt_text = p.get<std::string>();
    if (r->prompt_text.empty()) f->Fail("prompt", "'prompt' is empty");
    return;
  }
  if (p.is_array() && !p.empty() && p[0].is_number()) {
    r->prompt_is_ids = true;
    TokenIds(f, "prompt", p, limits.max_prompt_token_ids, &r->prompt_ids);
    return;
  }
  if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r->prompt_text = p[0].get<std::string>();
    if (r->prompt_text.empty()) f->Fail("prompt", "'prompt' is empty");
    return;
  }
  if (p.is_array() && p.size() == 1 && p[0].is_array()) {
    r->prompt_is_ids = true;
    TokenIds(f, "prompt", p[0], limits.max_prompt_token_ids, &r->prompt_ids);
    return;
  }
  if (p.is_array() && p.size() > 1) {
    f->Fail("prompt",
            absl::StrCat("'prompt' holds ", p.size(),
                         " prompts; this endpoint takes one prompt per "
                         "request (send several requests, or use 'n')"));
    return;
  }
  f->WrongType("prompt", "a string or an array of token ids");
}

void ParseMessages(Fields* f, CompletionRequest* r) {
  if (!f->Has("messages")) {
    f->Fail("messages", "'messages' is required");
    return;
  }
  const Json& m = f->At("messages");
  if (!m.is_array() || m.empty()) {
    f->WrongType("messages", "a non-empty array of messages");
    return;
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m[i].is_object()) {
      f->Fail(param, absl::StrCat("'", param, "' must be an object, got ",
                                  Show(m[i])));
      return;
    }
    auto role = m[i].find("role");
    if (role == m[i].end() || !role->is_string()) {
      f->Fail(param + ".role",
              absl::StrCat("'", param, ".role' must be a string"));
      return;
    }
    auto content = m[i].find("content");
    if (content != m[i].end() && !content->is_null() && !content->is_string() &&
        !content->is_array()) {
      f->Fail(param + ".content",
              absl::StrCat("'", param,
                           ".content' must be a string or an array of parts, "
                           "got ",
                           Show(*content)));
      return;
    }
  }
  r->messages = m;
  if (f->Has("tools")) {
    if (!f->At("tools").is_array()) {
      f->WrongType("tools", "an array of tool definitions");
      return;
    }
    r->tools = f->At("tools");
  }
  // tool_choice: "none" leaves the model's calls as text; "auto",
  // "required" and a named function parse them (the engine does not
  // constrain the model to call).
  const bool choice_none = f->Has("tool_choice") &&
                           f->At("tool_choice").is_string() &&
                           f->At("tool_choice").get<std::string>() == "none";
  r->parse_tool_calls =
      r->tools.is_array() && !r->tools.empty() && !choice_none;
  if (f->Has("chat_template_kwargs")) {
    if (!f->At("chat_template_kwargs").is_object()) {
      f->WrongType("chat_template_kwargs", "an object");
      return;
    }
    r->chat_template_kwargs = f->At("chat_template_kwargs");
  }
  f->Bool("add_generation_prompt", &r->add_generation_prompt);
}

void ParseStop(Fields* f, CompletionRequest* r, const RequestLimits& limits) {
  if (!f->Has("stop")) return;
  const Json& s = f->At("stop");
  std::vector<std::string> stops;
  if (s.is_string()) {
    stops.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    for (const Json& x : s) {
      if (!x.is_string()) {
        f->WrongType("stop", "a string or an array of strings");
        return;
      }
      stops.push_back(x.get<std::string>());
    }
  } else {
    f->WrongType("stop", "a string or an array of strings");
    return;
  }
  if (static_cast<int32_t>(stops.size()) > limits.max_stop_strings) {
    f->Fail("stop",
            absl::StrCat("'stop' has ", stops.size(), " strings; the limit is ",
                         limits.max_stop_strings));
    return;
  }
  for (const std::string& x : stops) {
    if (x.empty() || x.size() > limits.max_stop_bytes) {
      f->Fail("stop", absl::StrCat("each 'stop' string must be 1 to ",
                                   limits.max_stop_bytes, " bytes, got ",
                                   Show(Json(x))));
      return;
    }
  }
  r->stop = std::move(stops);
}

}  // namespace

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::optional<CompletionRequest> ParseCompletionRequest(
    Endpoint endpoint, std::string_view body, const RequestLimits& limits,
    ApiError* error) {
  Json json = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    error->http_status = 400;
    error->message =
        "the request body is not valid JSON (send Content-Type: "
        "application/json with a JSON object)";
    return std::nullopt;
  }
  if (!json.is_object()) {
    error->http_status = 400;
    error->message = absl::StrCat(
        "the request body must be a JSON object, got ", Show(json));
    return std::nullopt;
  }
  CompletionRequest r;
  r.endpoint = endpoint;
  Fields f(json, error);
  f.String("model", &r.model);
  if (endpoint == Endpoint::kCompletions) {
    ParsePrompt(&f, &r, limits);
  } else {
    ParseMessages(&f, &r);
  }
  int64_t i = 0;
  const char* max_key =
      endpoint == Endpoint::kChatCompletions && f.Has("max_completion_tokens")
          ? "max_completion_tokens"
          : "max_tokens";
  if (f.Integer(max_key, 1, INT32_MAX, &i)) r.max_tokens = i;
  f.Number("temperature", 0.0, 2.0, &r.temperature);
  f.Number("top_p", 0.0, 1.0, &r.top_p);
  if (!f.failed() && f.Has("top_p") && r.top_p <= 0.0) {
    f.Fail("top_p", "'top_p' must be in (0, 1], got 0");
  }
  if (f.Integer("top_k", -1, INT32_MAX, &i)) {
    r.top_k = static_cast<int32_t>(std::max<int64_t>(i, 0));
  }
  if (f.Integer("n", 1, limits.max_n, &i)) r.n = static_cast<int32_t>(i);
  if (f.Integer("best_of", r.n, r.n, &i)) {
    // best_of == n is what OpenAI does by default; more would rank samples.
  }
  ParseStop(&f, &r, limits);
  if (f.Has("stop_token_ids") && !f.failed()) {
    TokenIds(&f, "stop_token_ids", f.At("stop_token_ids"), 1024,
             &r.stop_token_ids);
  }
  if (endpoint == Endpoint::kCompletions) {
    if (f.Has("logprobs")) {
      if (f.Integer("logprobs", 0, 20, &i)) {
        if (i > 0) {
          f.Fail("logprobs",
                 absl::StrCat("'logprobs' ", i,
                              " asks for the top alternatives of every "
                              "token, which the engine does not compute; "
                              "send 0 for the sampled tokens' log-probs"));
        }
        r.want_logprobs = true;
      }
    }
  } else {
    f.Bool("logprobs", &r.want_logprobs);
    if (f.Integer("top_logprobs", 0, 20, &i) && i > 0) {
      f.Fail("top_logprobs",
             absl::StrCat("'top_logprobs' ", i,
                          " asks for the top alternatives of every token, "
                          "which the engine does not compute; send 0 (or "
                          "leave it out) with 'logprobs': true"));
    }
  }
  if (f.Has("seed")) {
    if (f.At("seed").is_number_integer()) {
      r.seed = f.At("seed").is_number_unsigned()
                   ? f.At("seed").get<uint64_t>()
                   : static_cast<uint64_t>(f.At("seed").get<int64_t>());
    } else {
      f.WrongType("seed", "an integer");
    }
  }
  f.Bool("stream", &r.stream);
  if (f.Has("stream_options")) {
    const Json& o = f.At("stream_options");
    if (!o.is_object()) {
      f.WrongType("stream_options", "an object");
    } else if (o.contains("include_usage") && !o["include_usage"].is_null()) {
      if (!o["include_usage"].is_boolean()) {
        f.Fail("stream_options.include_usage",
               "'stream_options.include_usage' must be a boolean");
      } else {
        r.include_usage = o["include_usage"].get<bool>();
      }
    }
  }
  f.String("user", &r.user);
  f.String("tandem_episode_id", &r.episode_id);
  if (!r.episode_id.empty() && r.n != 1) {
    f.Fail("n", absl::StrCat("an episode's turn ('tandem_episode_id') is one "
                             "sample: 'n' must be 1, got ", r.n));
  }
  f.Neutral("presence_penalty", 0.0, "the engine applies no penalties");
  f.Neutral("frequency_penalty", 0.0, "the engine applies no penalties");
  f.Neutral("repetition_penalty", 1.0, "the engine applies no penalties");
  if (f.Has("logit_bias") &&
      !(f.At("logit_bias").is_object() && f.At("logit_bias").empty())) {
    f.Fail("logit_bias", "'logit_bias' is not supported by the engine");
  }
  if (endpoint == Endpoint::kCompletions) {
    bool echo = false;
    f.Bool("echo", &echo);
    if (echo) f.Fail("echo", "'echo' true is not supported");
    std::string suffix;
    f.String("suffix", &suffix);
    if (!suffix.empty()) f.Fail("suffix", "'suffix' is not supported");
  }
  if (f.failed()) return std::nullopt;
  return r;
}

Json ErrorBody(const ApiError& error) {
  Json e = Json::object();
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  e["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return Json{{"error", e}};
}

namespace {

// The extension fields every choice carries (docs/openai-endpoint.md).
void AddExtensions(const ChoiceResult& c, const std::vector<int32_t>* prompt,
                   Json* choice) {
  (*choice)["token_ids"] = c.token_ids;
  (*choice)["behavior_logprobs"] = c.logprobs;
  (*choice)["policy_versions"] = c.policy_versions;
  if (prompt != nullptr) (*choice)["prompt_token_ids"] = *prompt;
}

// text_offset is null: offsets of tokens in the text are not tracked.
Json CompletionLogprobs(const ChoiceResult& c) {
  return Json{{"tokens", c.token_strings},
              {"token_logprobs", c.logprobs},
              {"top_logprobs", nullptr},
              {"text_offset", nullptr}};
}

Json ChatLogprobs(const ChoiceResult& c) {
  Json content = Json::array();
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    const std::string& token =
        i < c.token_strings.size() ? c.token_strings[i] : std::string();
    std::vector<int> bytes(token.begin(), token.end());
    for (int& b : bytes) b &= 0xff;
    content.push_back(Json{{"token", token},
                           {"logprob", c.logprobs[i]},
                           {"bytes", bytes},
                           {"top_logprobs", Json::array()}});
  }
  return Json{{"content", content}};
}

Json FinishReason(const ChoiceResult& c) {
  return c.finish_reason.empty() ? Json(nullptr) : Json(c.finish_reason);
}

// The fields every response and chunk starts with; `object` names its kind.
Json Envelope(const ResponseHeader& header, const char* object) {
  Json out = Json::object();
  out["id"] = header.id;
  out["object"] = object;
  out["created"] = header.created;
  out["model"] = header.model;
  return out;
}

Json Usage(int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

// A choice's text and logprobs: `text` (completions) or `message`/`delta`
// (chat: `role` in the message and in a stream's first delta only).
void AddContent(const CompletionRequest& request, const ChoiceResult& c,
                const char* chat_key, bool with_role, Json* choice) {
  if (request.endpoint == Endpoint::kChatCompletions) {
    Json m = Json::object();
    if (with_role) m["role"] = "assistant";
    if (!c.tool_call_deltas.empty()) {
      // A stream's call parts, as OpenAI streams them: the header with the
      // index, id, type and name; then the index and an arguments fragment.
      m["content"] = c.text.empty() ? Json(nullptr) : Json(c.text);
      Json calls = Json::array();
      for (const chat::ToolCallStream::CallDelta& d : c.tool_call_deltas) {
        Json call = Json{{"index", d.index}};
        if (d.header) {
          call["id"] = d.id;
          call["type"] = "function";
          call["function"] =
              Json{{"name", d.name}, {"arguments", d.arguments}};
        } else {
          call["function"] = Json{{"arguments", d.arguments}};
        }
        calls.push_back(std::move(call));
      }
      m["tool_calls"] = std::move(calls);
    } else if (c.tool_calls.empty()) {
      m["content"] = c.text;
    } else {
      // As OpenAI answers a call: content null when the model wrote
      // nothing besides its calls; each call with its index (streams).
      m["content"] = c.text.empty() ? Json(nullptr) : Json(c.text);
      Json calls = Json::array();
      for (size_t i = 0; i < c.tool_calls.size(); ++i) {
        const chat::ParsedToolCall& call = c.tool_calls[i];
        calls.push_back(Json{{"index", i},
                             {"id", call.id},
                             {"type", "function"},
                             {"function",
                              {{"name", call.name},
                               {"arguments", call.arguments_json}}}});
      }
      m["tool_calls"] = std::move(calls);
    }
    (*choice)[chat_key] = std::move(m);
    (*choice)["logprobs"] = request.want_logprobs ? ChatLogprobs(c) : Json();
  } else {
    (*choice)["text"] = c.text;
    (*choice)["logprobs"] =
        request.want_logprobs ? CompletionLogprobs(c) : Json();
  }
}

}  // namespace

Json CompletionResponse(const CompletionRequest& request,
                        const ResponseHeader& header,
                        const std::vector<int32_t>& prompt_ids,
                        const std::vector<ChoiceResult>& choices) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  Json out = Envelope(header, chat ? "chat.completion" : "text_completion");
  Json list = Json::array();
  int64_t completion_tokens = 0;
  for (const ChoiceResult& c : choices) {
    Json choice = Json::object();
    choice["index"] = c.index;
    AddContent(request, c, "message", /*with_role=*/true, &choice);
    choice["finish_reason"] = FinishReason(c);
    AddExtensions(c, nullptr, &choice);
    completion_tokens += static_cast<int64_t>(c.token_ids.size());
    list.push_back(std::move(choice));
  }
  out["choices"] = std::move(list);
  out["usage"] =
      Usage(static_cast<int64_t>(prompt_ids.size()), completion_tokens);
  out["prompt_token_ids"] = prompt_ids;
  return out;
}

Json StreamChunk(const CompletionRequest& request, const ResponseHeader& header,
                 const std::vector<int32_t>& prompt_ids,
                 const ChoiceResult& delta, bool first) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  Json out =
      Envelope(header, chat ? "chat.completion.chunk" : "text_completion");
  Json choice = Json::object();
  choice["index"] = delta.index;
  AddContent(request, delta, "delta", /*with_role=*/first, &choice);
  choice["finish_reason"] = FinishReason(delta);
  AddExtensions(delta, first ? &prompt_ids : nullptr, &choice);
  out["choices"] = Json::array({std::move(choice)});
  return out;
}

Json UsageChunk(const CompletionRequest& request, const ResponseHeader& header,
                int64_t prompt_tokens, int64_t completion_tokens) {
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  Json out =
      Envelope(header, chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = Json::array();
  out["usage"] = Usage(prompt_tokens, completion_tokens);
  return out;
}

Json ModelList(const std::string& model_id, int64_t created,
               uint64_t policy_version, int64_t max_model_len) {
  Json model = Json{{"id", model_id},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "tandem"},
                    {"policy_version", policy_version},
                    {"max_model_len", max_model_len}};
  return Json{{"object", "list"}, {"data", Json::array({model})}};
}

}  // namespace tandem::rollout::openai

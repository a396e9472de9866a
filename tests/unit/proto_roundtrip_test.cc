// Every message of the tandem.v1 package survives serialization: each is
// filled through reflection with distinct non-default values in every field
// (recursively, repeated fields with two elements, maps with two entries,
// one member of each oneof), serialized, parsed back and compared.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/message_differencer.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tandem/v1/common.pb.h"
#include "tandem/v1/coordinator.pb.h"
#include "tandem/v1/rollout.pb.h"
#include "tandem/v1/trainer.pb.h"
#include "tandem/v1/verifier.pb.h"

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void Fill(Message* message, int seed, int depth);

void SetField(Message* message, const FieldDescriptor* field, int seed,
              int depth) {
  const Reflection* r = message->GetReflection();
  const bool rep = field->is_repeated();
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      rep ? r->AddInt32(message, field, -seed - 1)
          : r->SetInt32(message, field, -seed - 1);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      rep ? r->AddInt64(message, field, -(int64_t{1} << 40) - seed)
          : r->SetInt64(message, field, -(int64_t{1} << 40) - seed);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      rep ? r->AddUInt32(message, field, 4000000000u - seed)
          : r->SetUInt32(message, field, 4000000000u - seed);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      rep ? r->AddUInt64(message, field, (uint64_t{1} << 63) + seed)
          : r->SetUInt64(message, field, (uint64_t{1} << 63) + seed);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      rep ? r->AddDouble(message, field, 0.125 + seed)
          : r->SetDouble(message, field, 0.125 + seed);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      rep ? r->AddFloat(message, field, -1.5f - seed)
          : r->SetFloat(message, field, -1.5f - seed);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      rep ? r->AddBool(message, field, true) : r->SetBool(message, field, true);
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = field->enum_type();
      const auto* v = e->value(e->value_count() - 1 - seed % e->value_count());
      if (v->number() == 0) v = e->value(e->value_count() - 1);
      rep ? r->AddEnum(message, field, v) : r->SetEnum(message, field, v);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string value =
          field->name() + "-" + std::to_string(seed) + "-\xce\xbb";
      if (field->type() == FieldDescriptor::TYPE_BYTES) {
        value += std::string("\0\xff", 2);
      }
      rep ? r->AddString(message, field, value)
          : r->SetString(message, field, value);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      Message* child = rep ? r->AddMessage(message, field)
                           : r->MutableMessage(message, field);
      Fill(child, seed + 1, depth + 1);
      break;
    }
  }
}

void Fill(Message* message, int seed, int depth) {
  if (depth > 4) return;
  const Descriptor* d = message->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* field = d->field(i);
    // One member per oneof: the first one.
    if (field->real_containing_oneof() != nullptr &&
        field->index_in_oneof() != 0) {
      continue;
    }
    const int copies = field->is_repeated() ? 2 : 1;
    for (int c = 0; c < copies; ++c) SetField(message, field, seed + c, depth);
  }
}

std::vector<const Descriptor*> AllMessages() {
  std::vector<const google::protobuf::FileDescriptor*> files = {
      tandem::v1::Sample::descriptor()->file(),
      tandem::v1::RegisterRequest::descriptor()->file(),
      tandem::v1::RolloutStatus::descriptor()->file(),
      tandem::v1::TrainerStatus::descriptor()->file(),
      tandem::v1::ScoreBatchRequest::descriptor()->file()};
  std::vector<const Descriptor*> out;
  for (const auto* file : files) {
    for (int i = 0; i < file->message_type_count(); ++i) {
      out.push_back(file->message_type(i));
    }
  }
  return out;
}

TEST_CASE("every tandem.v1 message round-trips through the wire format") {
  google::protobuf::DynamicMessageFactory factory;
  const auto messages = AllMessages();
  REQUIRE(messages.size() > 40);
  for (const Descriptor* d : messages) {
    if (d->options().map_entry()) continue;
    INFO(d->full_name());
    const Message* prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(d);
    REQUIRE(prototype != nullptr);
    std::unique_ptr<Message> original(prototype->New());
    Fill(original.get(), 1, 0);
    const std::string wire = original->SerializeAsString();
    if (d->field_count() > 0) CHECK_FALSE(wire.empty());
    std::unique_ptr<Message> parsed(prototype->New());
    REQUIRE(parsed->ParseFromString(wire));
    CHECK(
        google::protobuf::util::MessageDifferencer::Equals(*original, *parsed));
  }
}

TEST_CASE("version spans of a sample keep their order and counts") {
  tandem::v1::Sample sample;
  sample.add_completion_token_ids(5);
  sample.add_completion_token_ids(6);
  sample.add_completion_token_ids(7);
  auto* a = sample.add_version_spans();
  a->set_policy_version(3);
  a->set_num_tokens(2);
  auto* b = sample.add_version_spans();
  b->set_policy_version(4);
  b->set_num_tokens(1);
  tandem::v1::Sample parsed;
  REQUIRE(parsed.ParseFromString(sample.SerializeAsString()));
  REQUIRE(parsed.version_spans_size() == 2);
  CHECK(parsed.version_spans(0).policy_version() == 3);
  CHECK(parsed.version_spans(1).num_tokens() == 1);
}

}  // namespace

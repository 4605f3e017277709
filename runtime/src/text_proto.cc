#include "neuron/runtime/text_proto.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>


#include "neuron/runtime/error.h"
#include "neuron/runtime/files.h"

namespace neuron::runtime {
namespace {

// Collects the first parse error with its position (1-based, as editors show).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!message_.empty()) return;
    message_ = StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

}  // namespace

void ParseTextProto(const std::string& text, const std::string& origin, const char* what,
                    google::protobuf::Message* out,
                    google::protobuf::TextFormat::ParseInfoTree* locations) {
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (locations != nullptr) parser.WriteLocationsTo(locations);
  NEURON_CHECK(parser.ParseFromString(text, out), what, " ", origin, ": ",
               errors.message());
}

std::string ReadTextFile(const std::string& path, const char* what) {
  try {
    return ReadFile(path, what, kMaxTextFileBytes);
  } catch (const IoError& e) {
    throw InvalidUsage(e.what());  // a bad path the user gave: bad input
  }
}

}  // namespace neuron::runtime

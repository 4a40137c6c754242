// Text-protobuf files (train configs, strategies) with errors that name
// their place: a syntax or schema error is "ORIGIN:LINE:COL: message", and a
// check after parsing can ask where the text set a field ("ORIGIN:LINE").
#pragma once

#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <memory>
#include <string>

#include "core/status.h"

namespace loom {

// Where a parsed text set its fields.
class TextLocations {
 public:
  // "ORIGIN:LINE" of a dotted field path, or "" when the text does not set
  // it. A repeated field's element is named by an index ("layer[2].sample");
  // without one, the first element.
  std::string Where(const std::string& path) const;
  const std::string& origin() const { return origin_; }

 private:
  friend StatusOr<TextLocations> ParseTextProto(const std::string&, const std::string&, google::protobuf::Message*);
  std::shared_ptr<google::protobuf::TextFormat::ParseInfoTree> tree_;
  const google::protobuf::Descriptor* type_ = nullptr;
  std::string origin_;
};

// Parses `text` into `message` (unknown fields are errors). `origin` names
// the text in errors (a file path).
StatusOr<TextLocations> ParseTextProto(const std::string& text, const std::string& origin,
                                       google::protobuf::Message* message);

// The whole of a text file; `what` names it in errors ("config file"):
// "PATH: is a directory, not a WHAT", "PATH: cannot open the WHAT" (NotFound
// when it does not exist), "PATH: cannot read the WHAT: reason".
StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what);

}  // namespace loom

#include "core/text_proto.h"

#include <google/protobuf/io/tokenizer.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace loom {
namespace {

namespace pb = google::protobuf;

class FirstError : public pb::io::ErrorCollector {
 public:
  explicit FirstError(std::string origin) : origin_(std::move(origin)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = StrCat(origin_, ":", line + 1, ":", column + 1, ": ", message);
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}
  const std::string& first() const { return first_; }

 private:
  std::string origin_;
  std::string first_;
};

}  // namespace

std::string TextLocations::Where(const std::string& path) const {
  if (!tree_) return "";
  const pb::TextFormat::ParseInfoTree* tree = tree_.get();
  const pb::Descriptor* type = type_;
  std::stringstream parts(path);
  std::string part;
  std::vector<std::string> names;
  while (std::getline(parts, part, '.')) names.push_back(part);
  for (size_t i = 0; i < names.size(); ++i) {
    std::string name = names[i];
    int element = -1;
    const size_t bracket = name.find('[');
    if (bracket != std::string::npos) {
      if (name.back() != ']') return "";
      element = std::atoi(name.substr(bracket + 1, name.size() - bracket - 2).c_str());
      name = name.substr(0, bracket);
    }
    const pb::FieldDescriptor* field = type->FindFieldByName(name);
    if (!field || (element >= 0 && !field->is_repeated())) return "";
    const int index = field->is_repeated() ? std::max(element, 0) : -1;
    if (i + 1 == names.size()) {
      pb::TextFormat::ParseLocation loc = tree->GetLocation(field, index);
      return loc.line < 0 ? "" : StrCat(origin_, ":", loc.line + 1);
    }
    tree = tree->GetTreeForNested(field, index);
    if (!tree || !field->message_type()) return "";
    type = field->message_type();
  }
  return "";
}

StatusOr<TextLocations> ParseTextProto(const std::string& text, const std::string& origin, pb::Message* message) {
  TextLocations loc;
  loc.tree_ = std::make_shared<pb::TextFormat::ParseInfoTree>();
  loc.type_ = message->GetDescriptor();
  loc.origin_ = origin;
  pb::TextFormat::Parser parser;
  FirstError errors(origin);
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(loc.tree_.get());
  if (!parser.ParseFromString(text, message))
    return InvalidArgument(errors.first().empty() ? origin + ": cannot parse the text" : errors.first());
  return loc;
}

StatusOr<std::string> ReadTextFile(const std::string& path, const std::string& what) {
  // An ifstream opens a directory and reads nothing: without this check the
  // empty text would fail later with a misleading message.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return InvalidArgument(path, ": is a directory, not a ", what);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT || errno == 0) return NotFound(path, ": cannot open the ", what);
    return InvalidArgument(path, ": cannot open the ", what, ": ", std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss(path, ": cannot read the ", what, ": ", std::strerror(errno));
  return text.str();
}

}  // namespace loom

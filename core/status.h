// Status and StatusOr: how loom reports errors that a user can cause (bad
// config, bad shape, missing file). Internal invariants use LOOM_CHECK.
#pragma once

#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace loom {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kOutOfRange,
  kFailedPrecondition,
  kUnimplemented,
  kResourceExhausted,
  kDataLoss,
  kInternal,
  kCancelled,  // stopped on request (Trainer::Cancel)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Prefixes the message with where it happened ("layer conv1: ...").
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Builds a message from streamable parts: InvalidArgument("got ", n, " dims").
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// A value as error messages echo it: whole up to 64 bytes, else its first 64
// bytes (cut at a UTF-8 boundary) and "... (N bytes)", so that a pasted file
// or a runaway value does not flood the terminal.
std::string Excerpt(const std::string& value);

template <typename... Args>
Status InvalidArgument(const Args&... args) { return Status(StatusCode::kInvalidArgument, StrCat(args...)); }
template <typename... Args>
Status NotFound(const Args&... args) { return Status(StatusCode::kNotFound, StrCat(args...)); }
template <typename... Args>
Status OutOfRange(const Args&... args) { return Status(StatusCode::kOutOfRange, StrCat(args...)); }
template <typename... Args>
Status FailedPrecondition(const Args&... args) { return Status(StatusCode::kFailedPrecondition, StrCat(args...)); }
template <typename... Args>
Status Unimplemented(const Args&... args) { return Status(StatusCode::kUnimplemented, StrCat(args...)); }
template <typename... Args>
Status ResourceExhausted(const Args&... args) { return Status(StatusCode::kResourceExhausted, StrCat(args...)); }
template <typename... Args>
Status DataLoss(const Args&... args) { return Status(StatusCode::kDataLoss, StrCat(args...)); }
template <typename... Args>
Status Internal(const Args&... args) { return Status(StatusCode::kInternal, StrCat(args...)); }
template <typename... Args>
Status Cancelled(const Args&... args) { return Status(StatusCode::kCancelled, StrCat(args...)); }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("StatusOr built from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { CheckOk(); return *value_; }
  const T& value() const& { CheckOk(); return *value_; }
  T&& value() && { CheckOk(); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition, const std::string& message);

template <typename T>
void StatusOr<T>::CheckOk() const {
  if (!status_.ok()) CheckFailed(__FILE__, __LINE__, "StatusOr::ok()", status_.ToString());
}

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

#define LOOM_RETURN_IF_ERROR(expr)            \
  do {                                        \
    ::loom::Status loom_status_ = (expr);     \
    if (!loom_status_.ok()) return loom_status_; \
  } while (0)

#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_statusor_, __LINE__), lhs, expr)

// Invariant checks: a failure is a bug in loom, never a user error.
#define LOOM_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) ::loom::CheckFailed(__FILE__, __LINE__, #cond, ::loom::StrCat("" __VA_ARGS__)); \
  } while (0)

#define LOOM_CHECK_OK(expr)                                                   \
  do {                                                                        \
    ::loom::Status loom_status_ = (expr);                                     \
    if (!loom_status_.ok()) ::loom::CheckFailed(__FILE__, __LINE__, #expr, loom_status_.ToString()); \
  } while (0)

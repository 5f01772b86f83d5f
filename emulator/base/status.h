// Status and Result<T>: the engine's one error convention.
//
// Codes are errno values (0 is success) so that the provider can hand them to
// libibverbs callers unchanged; the message says, for a human, what was wrong.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace rdmaemu {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(int code, std::string message) {
    return Status(code, std::move(message));
  }

  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}

  int code_ = 0;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status::Error(EINVAL, std::move(m)); }
inline Status NotSupported(std::string m) { return Status::Error(EOPNOTSUPP, std::move(m)); }
inline Status NoMemory(std::string m) { return Status::Error(ENOMEM, std::move(m)); }
inline Status Busy(std::string m) { return Status::Error(EBUSY, std::move(m)); }
inline Status NotFound(std::string m) { return Status::Error(ENOENT, std::move(m)); }
inline Status PermissionDenied(std::string m) { return Status::Error(EACCES, std::move(m)); }

// A value or a failed Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace rdmaemu

// status.h: the error value every module returns instead of throwing across a module boundary.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace memforensics {

// Where an error happened: a byte offset into an input, an event index, or nothing.
struct Error {
  std::string message;  // what was expected and what was found
  int64_t offset = -1;  // byte offset in the input, -1 when not about bytes

  std::string describe() const;
};

// A value or an Error. Deliberately tiny: [[nodiscard]] so that a caller cannot drop an error.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Expected(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Expected<void>.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace memforensics

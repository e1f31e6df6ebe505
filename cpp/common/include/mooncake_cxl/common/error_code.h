// ErrorCode and Result<T>: how every fallible operation in the core reports.
//
// Contract: the numeric values are Mooncake's (mooncake-store types.h), so the
// Python binding can hand them to callers unchanged. Core functions return
// Result<T> (a value or an ErrorCode), never throw for expected failures.
// Only the binding turns an ErrorCode into a Python integer.
#pragma once

#include <cstdint>
#include <utility>
#include <variant>

namespace mcxl {

enum class ErrorCode : int32_t {
  OK = 0,
  INTERNAL_ERROR = -1,
  BUFFER_OVERFLOW = -10,
  SHARD_INDEX_OUT_OF_RANGE = -100,
  SEGMENT_NOT_FOUND = -101,
  SEGMENT_ALREADY_EXISTS = -102,
  CLIENT_NOT_FOUND = -103,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_VERSION = -300,
  INVALID_KEY = -400,
  WRITE_FAIL = -500,
  INVALID_PARAMS = -600,
  ILLEGAL_CLIENT = -601,
  INVALID_WRITE = -700,
  INVALID_READ = -701,
  INVALID_REPLICA = -702,
  REPLICA_IS_NOT_READY = -703,
  OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705,
  OBJECT_HAS_LEASE = -706,
  LEASE_EXPIRED = -707,
  OBJECT_HAS_REPLICATION_TASK = -708,
  OBJECT_NO_REPLICATION_TASK = -709,
  REPLICA_NOT_FOUND = -710,
  REPLICA_ALREADY_EXISTS = -711,
  REPLICA_IS_GONE = -712,
  REPLICA_NOT_IN_LOCAL_MEMORY = -713,
  OBJECT_REPLICA_BUSY = -714,
  TRANSFER_FAIL = -800,
  CHECKSUM_MISMATCH = -801,
  RPC_FAIL = -900,
  RPC_TIMEOUT = -901,
  ETCD_OPERATION_ERROR = -1000,
  UNAVAILABLE_IN_CURRENT_STATUS = -1010,
  UNAVAILABLE_IN_CURRENT_MODE = -1011,
  NOT_SUPPORTED = -1012,
  FILE_NOT_FOUND = -1100,
  FILE_OPEN_FAIL = -1101,
};

// Name of a code, e.g. "OBJECT_NOT_FOUND"; "UNKNOWN" for values not listed.
const char* ErrorCodeName(ErrorCode code);

inline int32_t ToInt(ErrorCode code) { return static_cast<int32_t>(code); }

// A value of type T or an ErrorCode other than OK.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(ErrorCode error) : v_(error) {}             // NOLINT: implicit by design
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  ErrorCode error() const { return ok() ? ErrorCode::OK : std::get<1>(v_); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, ErrorCode> v_;
};

// Result of an operation with no value: OK or an error.
class [[nodiscard]] Status {
 public:
  Status(ErrorCode code = ErrorCode::OK) : code_(code) {}  // NOLINT
  bool ok() const { return code_ == ErrorCode::OK; }
  explicit operator bool() const { return ok(); }
  ErrorCode error() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace mcxl

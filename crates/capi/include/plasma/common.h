// plasma/common.h: Plasma's (Apache Arrow 11) ids, error codes and object
// table, for programs written against Plasma's C++ client, on ferroplasma.
//
// Part of ferroplasma's Plasma compatibility headers: a program that
// included Plasma's <plasma/client.h> builds unchanged against these, with
// the include path and link flags of `pkg-config --cflags --libs
// ferroplasma-plasma` (docs/migrating-from-plasma.md). Header-only, on the
// C library (ferroplasma.h) and Arrow C++ (the headers and libarrow that
// pyarrow's wheel ships, or any Arrow C++ 11 or later).
#ifndef FERROPLASMA_PLASMA_COMMON_H
#define FERROPLASMA_PLASMA_COMMON_H

/// Defined by ferroplasma's Plasma compatibility headers (not by Plasma's).
#define FERROPLASMA_PLASMA_COMPAT 1

#include <stddef.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>

#include <arrow/status.h>

#include "plasma/compat.h"

namespace plasma {

/// Where an object is (Plasma's enum; ferroplasma's calls do not return it).
enum class ObjectLocation : int32_t { Local, Remote, NotFound };

/// Plasma's own error kinds, carried as a `PlasmaStatusDetail` of an
/// `arrow::Status` and told apart by the `IsPlasma...` predicates.
enum class PlasmaErrorCode : int8_t {
  PlasmaObjectExists = 1,
  PlasmaObjectNotFound = 2,
  PlasmaStoreFull = 3,
  PlasmaObjectAlreadySealed = 4,
};

/// The detail of a Plasma error (type id "plasma::PlasmaStatusDetail", as
/// Plasma's).
class PlasmaStatusDetail : public arrow::StatusDetail {
 public:
  explicit PlasmaStatusDetail(PlasmaErrorCode code) : code_(code) {}
  static const char* kTypeId() { return "plasma::PlasmaStatusDetail"; }
  const char* type_id() const override { return kTypeId(); }
  std::string ToString() const override {
    switch (code_) {
      case PlasmaErrorCode::PlasmaObjectExists:
        return "Plasma object is exists";
      case PlasmaErrorCode::PlasmaObjectNotFound:
        return "Plasma object is not found";
      case PlasmaErrorCode::PlasmaStoreFull:
        return "Plasma store is full";
      case PlasmaErrorCode::PlasmaObjectAlreadySealed:
        return "Plasma object is already sealed";
    }
    return "Plasma error";
  }
  PlasmaErrorCode code() const { return code_; }

 private:
  PlasmaErrorCode code_;
};

/// A Plasma error, with the Arrow status code Plasma 11 gave it: exists is
/// UnknownError, not found KeyError, full CapacityError, already sealed
/// TypeError.
inline arrow::Status MakePlasmaError(PlasmaErrorCode code, std::string message) {
  arrow::StatusCode arrow_code = arrow::StatusCode::UnknownError;
  switch (code) {
    case PlasmaErrorCode::PlasmaObjectExists:
      arrow_code = arrow::StatusCode::UnknownError;
      break;
    case PlasmaErrorCode::PlasmaObjectNotFound:
      arrow_code = arrow::StatusCode::KeyError;
      break;
    case PlasmaErrorCode::PlasmaStoreFull:
      arrow_code = arrow::StatusCode::CapacityError;
      break;
    case PlasmaErrorCode::PlasmaObjectAlreadySealed:
      arrow_code = arrow::StatusCode::TypeError;
      break;
  }
  return arrow::Status(arrow_code, std::move(message),
                       std::make_shared<PlasmaStatusDetail>(code));
}

namespace detail {
inline bool IsPlasmaError(const arrow::Status& status, PlasmaErrorCode code) {
  if (status.ok()) return false;
  const auto& d = status.detail();
  return d != nullptr && std::strcmp(d->type_id(), PlasmaStatusDetail::kTypeId()) == 0 &&
         static_cast<const PlasmaStatusDetail*>(d.get())->code() == code;
}
}  // namespace detail

/// Whether `status` says the object already exists.
inline bool IsPlasmaObjectExists(const arrow::Status& status) {
  return detail::IsPlasmaError(status, PlasmaErrorCode::PlasmaObjectExists);
}
/// Whether `status` says the object is not in the store.
inline bool IsPlasmaObjectNotFound(const arrow::Status& status) {
  return detail::IsPlasmaError(status, PlasmaErrorCode::PlasmaObjectNotFound);
}
/// Plasma's older name of `IsPlasmaObjectNotFound`.
inline bool IsPlasmaObjectNonexistent(const arrow::Status& status) {
  return IsPlasmaObjectNotFound(status);
}
/// Whether `status` says the object was sealed already.
inline bool IsPlasmaObjectAlreadySealed(const arrow::Status& status) {
  return detail::IsPlasmaError(status, PlasmaErrorCode::PlasmaObjectAlreadySealed);
}
/// Whether `status` says the store has no room for the object.
inline bool IsPlasmaStoreFull(const arrow::Status& status) {
  return detail::IsPlasmaError(status, PlasmaErrorCode::PlasmaStoreFull);
}

/// Bytes of an id.
constexpr int64_t kUniqueIDSize = 20;

/// A 20-byte id (plain old data, as Plasma's).
class UniqueID {
 public:
  /// The id whose bytes are `binary` (its first 20; zeros after a shorter one).
  static UniqueID from_binary(const std::string& binary) {
    UniqueID id;
    std::memset(id.id_, 0, sizeof(id.id_));
    std::memcpy(id.id_, binary.data(),
                binary.size() < sizeof(id.id_) ? binary.size() : sizeof(id.id_));
    return id;
  }
  bool operator==(const UniqueID& rhs) const {
    return std::memcmp(id_, rhs.id_, sizeof(id_)) == 0;
  }
  bool operator!=(const UniqueID& rhs) const { return !(*this == rhs); }
  const uint8_t* data() const { return id_; }
  uint8_t* mutable_data() { return id_; }
  /// The 20 bytes.
  std::string binary() const { return std::string(reinterpret_cast<const char*>(id_), sizeof(id_)); }
  /// 40 lowercase hex digits.
  std::string hex() const {
    static const char digits[] = "0123456789abcdef";
    std::string out(2 * sizeof(id_), '0');
    for (size_t i = 0; i < sizeof(id_); i++) {
      out[2 * i] = digits[id_[i] >> 4];
      out[2 * i + 1] = digits[id_[i] & 15];
    }
    return out;
  }
  /// A hash of the bytes (FNV-1a), for hash tables.
  size_t hash() const {
    uint64_t h = 14695981039346656037ULL;
    for (uint8_t b : id_) h = (h ^ b) * 1099511628211ULL;
    return static_cast<size_t>(h);
  }
  static int64_t size() { return kUniqueIDSize; }

 private:
  uint8_t id_[kUniqueIDSize];
};

static_assert(std::is_trivial_v<UniqueID> && std::is_standard_layout_v<UniqueID>,
              "UniqueID must be plain old data");

typedef UniqueID ObjectID;

/// Bytes of the digest `PlasmaClient::Hash` writes.
constexpr int64_t kDigestSize = sizeof(uint64_t);

/// An object's state in `PlasmaClient::List`.
enum class ObjectState : int {
  /// Being created: not sealed yet.
  PLASMA_CREATED = 1,
  /// Sealed: immutable and readable.
  PLASMA_SEALED = 2,
  /// Evicted (Plasma's; ferroplasma's list never shows evicted objects).
  PLASMA_EVICTED = 3,
};

namespace internal {
struct CudaIpcPlaceholder {};
}  // namespace internal

/// One object of `PlasmaClient::List`. ferroplasma fills `data_size`,
/// `metadata_size`, `ref_count`, `state`, `create_time` (seconds since the
/// epoch) and `construct_duration` (seconds from create to seal, -1 while
/// unsealed); `fd`, `map_size`, `offset` and `pointer` describe Plasma's
/// memory-mapped files and stay -1, 0 or null; `digest` stays zero (see
/// `PlasmaClient::Hash`).
struct ObjectTableEntry {
  ObjectTableEntry() = default;
  ~ObjectTableEntry() = default;
  int fd = -1;
  int device_num = 0;
  int64_t map_size = 0;
  ptrdiff_t offset = 0;
  uint8_t* pointer = nullptr;
  int64_t data_size = 0;
  int64_t metadata_size = 0;
  int ref_count = 0;
  int64_t create_time = 0;
  int64_t construct_duration = -1;
  ObjectState state = ObjectState::PLASMA_CREATED;
  unsigned char digest[kDigestSize] = {};
  std::shared_ptr<internal::CudaIpcPlaceholder> ipc_handle;
};

}  // namespace plasma

namespace std {
template <>
struct hash<::plasma::UniqueID> {
  size_t operator()(const ::plasma::UniqueID& id) const { return id.hash(); }
};
}  // namespace std

namespace plasma {
/// Every object of the store, by id (`PlasmaClient::List`).
typedef std::unordered_map<ObjectID, std::unique_ptr<ObjectTableEntry>> ObjectTable;
}  // namespace plasma

#endif  // FERROPLASMA_PLASMA_COMMON_H

// ferroplasma.hpp: a C++ client in the shape of Plasma's plasma::PlasmaClient,
// header-only, on libferroplasma (ferroplasma.h). Porting Plasma C++ code:
// include this header instead of plasma/client.h and use the namespace
// ferroplasma instead of plasma (docs/migrating-from-plasma.md).
//
// Buffers are RAII: a Buffer holds a reference to its object until the last
// shared_ptr to it goes, so the store never reuses memory something reads.
// A PlasmaClient may be used from several threads at once.
#ifndef FERROPLASMA_HPP
#define FERROPLASMA_HPP

#include "ferroplasma.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace ferroplasma {

/// What a call did (Plasma's arrow::Status, for the calls below).
class Status {
 public:
  Status() = default;
  Status(fp_status code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }
  /// A bad argument the wrapper caught before calling the library.
  static Status Invalid(std::string message) {
    return Status(FP_INVALID_ARGUMENT, std::move(message));
  }
  /// The status of the C call that just returned `code` on this thread.
  static Status FromC(fp_status code) {
    return code == FP_OK ? Status() : Status(code, fp_last_error());
  }
  bool ok() const { return code_ == FP_OK; }
  fp_status code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const {
    return ok() ? "OK" : std::string(fp_status_name(code_)) + ": " + message_;
  }
  bool IsObjectExists() const { return code_ == FP_OBJECT_EXISTS; }
  bool IsObjectNotFound() const { return code_ == FP_OBJECT_NOT_FOUND; }
  bool IsStoreFull() const { return code_ == FP_STORE_FULL; }
  bool IsTimeout() const { return code_ == FP_TIMEOUT; }

 private:
  fp_status code_ = FP_OK;
  std::string message_;
};

/// A 20-byte object id (Plasma's plasma::ObjectID).
class ObjectID {
 public:
  ObjectID() { std::memset(id_.bytes, 0, sizeof id_.bytes); }
  explicit ObjectID(fp_object_id id) : id_(id) {}
  static ObjectID from_random() { return ObjectID(fp_object_id_random()); }
  /// From 20 bytes (as Plasma's from_binary); shorter input is zero-padded.
  static ObjectID from_binary(const std::string& binary) {
    ObjectID o;
    std::memcpy(o.id_.bytes, binary.data(), binary.size() < 20 ? binary.size() : 20);
    return o;
  }
  static int64_t size() { return 20; }
  std::string binary() const { return std::string(reinterpret_cast<const char*>(id_.bytes), 20); }
  std::string hex() const {
    char out[41];
    fp_object_id_to_hex(id_, out);
    return std::string(out, 40);
  }
  const uint8_t* data() const { return id_.bytes; }
  const fp_object_id& c_id() const { return id_; }
  bool operator==(const ObjectID& o) const { return std::memcmp(id_.bytes, o.id_.bytes, 20) == 0; }
  bool operator!=(const ObjectID& o) const { return !(*this == o); }
  bool operator<(const ObjectID& o) const { return std::memcmp(id_.bytes, o.id_.bytes, 20) < 0; }

 private:
  fp_object_id id_;
};

/// Bytes in the store's shared memory (the shape of arrow::Buffer's
/// data()/size()). A buffer from Get is read-only; one from Create is
/// mutable until sealed. Either keeps its object alive while it exists.
class Buffer {
 public:
  Buffer(const uint8_t* data, int64_t size, std::shared_ptr<fp_buffer> ref, bool mutable_)
      : data_(data), size_(size), ref_(std::move(ref)), mutable_(mutable_) {}
  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return mutable_ ? const_cast<uint8_t*>(data_) : nullptr; }
  int64_t size() const { return size_; }
  bool is_mutable() const { return mutable_; }
  std::string ToString() const { return std::string(reinterpret_cast<const char*>(data_), size_); }
  /// The C buffer behind it (for fp_object_layout); may be null for a
  /// buffer still being created.
  const fp_buffer* c_buffer() const { return ref_.get(); }

 private:
  friend class PlasmaClient;
  const uint8_t* data_;
  int64_t size_;
  std::shared_ptr<fp_buffer> ref_;
  bool mutable_;
};

/// Plasma's plasma::ObjectBuffer: an object's data and metadata.
struct ObjectBuffer {
  std::shared_ptr<Buffer> data;
  std::shared_ptr<Buffer> metadata;
  int device_num = 0;
};

/// Plasma's plasma::PlasmaClient, on ferroplasma.
class PlasmaClient {
 public:
  PlasmaClient() = default;
  PlasmaClient(const PlasmaClient&) = delete;
  PlasmaClient& operator=(const PlasmaClient&) = delete;
  ~PlasmaClient() { Disconnect(); }

  /// Connects to the store at `store_socket_name` ("" : the default
  /// socket). The other arguments are Plasma's and are ignored.
  Status Connect(const std::string& store_socket_name, const std::string& = "", int = 0,
                 int = -1) {
    Disconnect();
    return Status::FromC(
        fp_connect(store_socket_name.empty() ? nullptr : store_socket_name.c_str(), &client_));
  }

  /// Creates an object; `*data` is its writable buffer until Seal or Abort.
  Status Create(const ObjectID& object_id, int64_t data_size, const uint8_t* metadata,
                int64_t metadata_size, std::shared_ptr<Buffer>* data, int = 0) {
    if (data == nullptr) return Status::Invalid("Create: data is null");
    if (data_size < 0 || metadata_size < 0) return Status::Invalid("Create: negative size");
    fp_mut_buffer* mb = nullptr;
    fp_status s = fp_create(client_, &object_id.c_id(), static_cast<uint64_t>(data_size),
                            metadata, static_cast<size_t>(metadata_size), &mb);
    if (s != FP_OK) return Status::FromC(s);
    auto buf = std::make_shared<Buffer>(fp_mut_buffer_data(mb), data_size, nullptr, true);
    std::lock_guard<std::mutex> lock(mu_);
    creating_[object_id] = Creating{mb, buf};
    *data = buf;
    return Status::OK();
  }

  /// Creates, fills and seals an object in one call.
  Status CreateAndSeal(const ObjectID& object_id, const std::string& data,
                       const std::string& metadata) {
    return Status::FromC(fp_create_and_seal(
        client_, &object_id.c_id(), reinterpret_cast<const uint8_t*>(data.data()), data.size(),
        reinterpret_cast<const uint8_t*>(metadata.data()), metadata.size()));
  }

  /// Seals an object this client created: immutable and visible to all.
  /// The buffer from Create stays readable while it is referenced.
  Status Seal(const ObjectID& object_id) {
    Creating c;
    if (!Take(object_id, &c)) return NotCreating(object_id);
    fp_buffer* sealed = nullptr;
    fp_status s = fp_seal(client_, c.handle, &sealed);
    if (s != FP_OK) return Status::FromC(s);
    if (auto buf = c.buffer.lock()) {
      buf->ref_ = std::shared_ptr<fp_buffer>(sealed, fp_buffer_release);
      buf->mutable_ = false;
    } else {
      fp_buffer_release(sealed);
    }
    return Status::OK();
  }

  /// Discards an object this client created and has not sealed.
  Status Abort(const ObjectID& object_id) {
    Creating c;
    if (!Take(object_id, &c)) return NotCreating(object_id);
    return Status::FromC(fp_abort(client_, c.handle));
  }

  /// Gets objects, waiting up to `timeout_ms` (-1: forever) for those not
  /// sealed yet; an object not available in time has null data.
  Status Get(const std::vector<ObjectID>& object_ids, int64_t timeout_ms,
             std::vector<ObjectBuffer>* object_buffers) {
    if (object_buffers == nullptr) return Status::Invalid("Get: object_buffers is null");
    std::vector<fp_object_id> ids;
    ids.reserve(object_ids.size());
    for (const auto& o : object_ids) ids.push_back(o.c_id());
    std::vector<fp_buffer*> got(ids.size(), nullptr);
    fp_status s = fp_get(client_, ids.data(), ids.size(), timeout_ms, got.data());
    if (s != FP_OK) return Status::FromC(s);
    object_buffers->clear();
    object_buffers->resize(ids.size());
    for (size_t i = 0; i < got.size(); i++) {
      if (got[i] == nullptr) continue;
      std::shared_ptr<fp_buffer> ref(got[i], fp_buffer_release);
      (*object_buffers)[i].data = std::make_shared<Buffer>(
          fp_buffer_data(got[i]), static_cast<int64_t>(fp_buffer_size(got[i])), ref, false);
      (*object_buffers)[i].metadata = std::make_shared<Buffer>(
          fp_buffer_metadata(got[i]), static_cast<int64_t>(fp_buffer_metadata_size(got[i])),
          ref, false);
    }
    return Status::OK();
  }

  /// Plasma's Release: references end with the last Buffer; this checks
  /// that the client holds the object.
  Status Release(const ObjectID& object_id) {
    return Status::FromC(fp_release(client_, &object_id.c_id()));
  }

  Status Contains(const ObjectID& object_id, bool* has_object) {
    return Status::FromC(fp_contains(client_, &object_id.c_id(), has_object));
  }

  Status Delete(const ObjectID& object_id) {
    return Status::FromC(fp_delete(client_, &object_id.c_id(), 1, nullptr));
  }

  Status Delete(const std::vector<ObjectID>& object_ids) {
    std::vector<fp_object_id> ids;
    for (const auto& o : object_ids) ids.push_back(o.c_id());
    return Status::FromC(fp_delete(client_, ids.data(), ids.size(), nullptr));
  }

  /// Evicts unreferenced objects until at least `num_bytes` are freed.
  Status Evict(int64_t num_bytes, int64_t& num_bytes_evicted) {
    if (num_bytes < 0) return Status::Invalid("Evict: negative num_bytes");
    uint64_t freed = 0;
    fp_status s = fp_evict(client_, static_cast<uint64_t>(num_bytes), &freed, nullptr);
    num_bytes_evicted = static_cast<int64_t>(freed);
    return Status::FromC(s);
  }

  /// Subscribes to sealed and deleted objects; `*fd` becomes readable when
  /// an event waits. Read events with GetNotification.
  Status Subscribe(int* fd) {
    if (fd == nullptr) return Status::Invalid("Subscribe: fd is null");
    fp_subscription* sub = nullptr;
    fp_status s = fp_subscribe(client_, false, &sub);
    if (s != FP_OK) return Status::FromC(s);
    *fd = fp_subscription_fd(sub);
    std::lock_guard<std::mutex> lock(mu_);
    subscriptions_[*fd] = sub;
    return Status::OK();
  }

  /// The next event of subscription `fd` (waits for it). A deletion
  /// reports sizes of -1, as Plasma did.
  Status GetNotification(int fd, ObjectID* object_id, int64_t* data_size,
                         int64_t* metadata_size) {
    if (object_id == nullptr || data_size == nullptr || metadata_size == nullptr) {
      return Status::Invalid("GetNotification: the outputs must not be null");
    }
    fp_subscription* sub = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = subscriptions_.find(fd);
      if (it == subscriptions_.end())
        return Status(FP_INVALID_ARGUMENT, "no subscription with this descriptor");
      sub = it->second;
    }
    fp_event e;
    fp_status s = fp_subscription_next(sub, -1, &e);
    if (s != FP_OK) return Status::FromC(s);
    *object_id = ObjectID(e.id);
    bool deleted = e.kind == FP_EVENT_DELETED;
    *data_size = deleted ? -1 : static_cast<int64_t>(e.data_size);
    *metadata_size = deleted ? -1 : static_cast<int64_t>(e.metadata_size);
    return Status::OK();
  }

  /// Closes subscriptions and the connection; buffers stay valid.
  Status Disconnect() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : creating_) fp_abort(client_, c.second.handle);
    creating_.clear();
    for (auto& s : subscriptions_) fp_subscription_close(s.second);
    subscriptions_.clear();
    fp_disconnect(client_);
    client_ = nullptr;
    return Status::OK();
  }

  /// The C client behind it.
  fp_client* c_client() const { return client_; }

 private:
  struct Creating {
    fp_mut_buffer* handle = nullptr;
    std::weak_ptr<Buffer> buffer;
  };

  bool Take(const ObjectID& id, Creating* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = creating_.find(id);
    if (it == creating_.end()) return false;
    *out = it->second;
    creating_.erase(it);
    return true;
  }

  static Status NotCreating(const ObjectID& id) {
    return Status(FP_INVALID_STATE, "object " + id.hex() + " is not being created by this client");
  }

  fp_client* client_ = nullptr;
  std::mutex mu_;
  std::map<ObjectID, Creating> creating_;
  std::map<int, fp_subscription*> subscriptions_;
};

}  // namespace ferroplasma

#endif  // FERROPLASMA_HPP

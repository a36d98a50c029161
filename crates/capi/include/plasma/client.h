// plasma/client.h: Plasma's (Apache Arrow 11) C++ client, on ferroplasma.
//
// A program written for Plasma's PlasmaClient builds unchanged against this
// header: the same namespace (plasma), calls, signatures, arrow::Status
// returns, std::shared_ptr<arrow::Buffer> buffers, ObjectBuffer and
// ObjectTable, and Plasma's semantics (Create holds the object until Seal
// and one Release; Get's buffers release the object when the last of them
// goes; a client's Contains is true for what it holds or creates; a
// subscription first hears of the objects sealed already; Connect retries).
// Only the include path and the link flags change:
//
//   c++ -std=c++17 app.cc $(pkg-config --cflags --libs ferroplasma-plasma)
//
// Header-only, on the C library (ferroplasma.h) and Arrow C++ (the headers
// and libarrow that pyarrow's wheel ships, or any Arrow C++ 11 or later).
// Where it differs from Plasma (docs/migrating-from-plasma.md, "C++"):
// SetClientOptions accepts a quota but the store does not enforce it;
// DebugString reports ferroplasma's figures in its own words;
// DecodeNotifications is not available (read notifications with
// GetNotification); evict_if_full=false still lets the store evict; a call
// Plasma answered by aborting the process (Release or Abort of an object
// the client does not hold) returns an error status instead.
#ifndef FERROPLASMA_PLASMA_CLIENT_H
#define FERROPLASMA_PLASMA_CLIENT_H

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/status.h>

#include "ferroplasma.h"
#include "plasma/client_detail.h"
#include "plasma/common.h"

using arrow::Buffer;
using arrow::Status;

namespace plasma {

/// An object's data and metadata, as Get returns them. Both keep the
/// object in use (it is neither freed nor evicted) while either lives.
struct ObjectBuffer {
  /// The data, or null if the object was not sealed in time.
  std::shared_ptr<Buffer> data;
  /// The metadata, or null if the object was not sealed in time.
  std::shared_ptr<Buffer> metadata;
  /// Always 0: ferroplasma keeps objects in host memory.
  int device_num = 0;
};

/// A connection to a ferroplasma store, with Plasma's calls. Thread-safe.
class PlasmaClient {
 public:
  PlasmaClient() : impl_(std::make_shared<detail::ClientState>()) {}
  ~PlasmaClient() { (void)Disconnect(); }
  PlasmaClient(const PlasmaClient&) = delete;
  PlasmaClient& operator=(const PlasmaClient&) = delete;

  /// Connects to the store at `store_socket_name`, trying again every 100
  /// ms up to `num_retries` times (-1: 80, as Plasma) while it is not there
  /// yet.
  /// `manager_socket_name` and `release_delay` are accepted and unused, as
  /// in Plasma 11.
  Status Connect(const std::string& store_socket_name,
                 const std::string& manager_socket_name = "", int release_delay = 0,
                 int num_retries = -1) {
    (void)manager_socket_name;
    (void)release_delay;
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    if (impl_->client != nullptr) return Status::Invalid("the client is connected already");
    const int tries = 1 + (num_retries < 0 ? 80 : num_retries);
    fp_status st = FP_STORE_UNAVAILABLE;
    for (int i = 0; i < tries; i++) {
      st = fp_connect(store_socket_name.c_str(), &impl_->client);
      if (st != FP_STORE_UNAVAILABLE) break;
      if (i + 1 < tries) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (st != FP_OK) {
      impl_->client = nullptr;
      if (st == FP_STORE_UNAVAILABLE) {
        return Status::IOError("Could not connect to socket ", store_socket_name, ": ",
                               fp_last_error());
      }
      return detail::FromC(st, "Connect");
    }
    uint64_t capacity = 0;
    if (fp_capacity(impl_->client, &capacity) == FP_OK) {
      impl_->capacity = static_cast<int64_t>(capacity);
    }
    return Status::OK();
  }

  /// Accepted for Plasma's API; ferroplasma's store enforces no per-client
  /// quota (docs/migrating-from-plasma.md).
  Status SetClientOptions(const std::string& client_name, int64_t output_memory_quota) {
    (void)client_name;
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    if (output_memory_quota < 0) return Status::Invalid("the quota must not be negative");
    return Status::OK();
  }

  /// Creates an object of `data_size` bytes with a copy of `metadata`;
  /// `*data` is its writable buffer. The client uses the object until it
  /// is sealed and released once (or, unsealed, released and aborted).
  /// PlasmaObjectExists if the id is taken, PlasmaStoreFull if it cannot
  /// fit. `device_num` must be 0; `evict_if_full` is accepted (the store
  /// evicts unused objects to make room either way).
  Status Create(const ObjectID& object_id, int64_t data_size, const uint8_t* metadata,
                int64_t metadata_size, std::shared_ptr<Buffer>* data, int device_num = 0,
                bool evict_if_full = true) {
    (void)evict_if_full;
    if (data == nullptr) return Status::Invalid("Create: data must not be null");
    if (data_size < 0 || metadata_size < 0) {
      return Status::Invalid("Create: sizes must not be negative");
    }
    if (metadata_size > 0 && metadata == nullptr) {
      return Status::Invalid("Create: metadata is null but metadata_size is not 0");
    }
    if (device_num != 0) {
      return Status::Invalid("Create: ferroplasma keeps objects in host memory (device_num 0)");
    }
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    fp_object_id id = detail::ToC(object_id);
    fp_mut_buffer* buf = nullptr;
    ARROW_RETURN_NOT_OK(detail::FromC(
        fp_create(impl_->client, &id, static_cast<uint64_t>(data_size), metadata,
                  static_cast<size_t>(metadata_size), &buf),
        "Create"));
    auto& e = impl_->objects_[object_id];
    e.creating = buf;
    e.count += 2;
    *data = std::make_shared<detail::CreatedBuffer>(fp_mut_buffer_data(buf), data_size, impl_);
    return Status::OK();
  }

  /// Creates, fills and seals an object; the client keeps no use of it.
  Status CreateAndSeal(const ObjectID& object_id, const std::string& data,
                       const std::string& metadata, bool evict_if_full = true) {
    (void)evict_if_full;
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    fp_object_id id = detail::ToC(object_id);
    const auto* d = reinterpret_cast<const uint8_t*>(data.data());
    const auto* m = reinterpret_cast<const uint8_t*>(metadata.data());
    return detail::FromC(
        fp_create_and_seal(impl_->client, &id, d, data.size(), m, metadata.size()),
        "CreateAndSeal");
  }

  /// CreateAndSeal of each object in turn; stops at the first error.
  Status CreateAndSealBatch(const std::vector<ObjectID>& object_ids,
                            const std::vector<std::string>& data,
                            const std::vector<std::string>& metadata,
                            bool evict_if_full = true) {
    if (object_ids.size() != data.size() || object_ids.size() != metadata.size()) {
      return Status::Invalid("CreateAndSealBatch: ids, data and metadata differ in length");
    }
    for (size_t i = 0; i < object_ids.size(); i++) {
      ARROW_RETURN_NOT_OK(CreateAndSeal(object_ids[i], data[i], metadata[i], evict_if_full));
    }
    return Status::OK();
  }

  /// Gets objects, waiting up to `timeout_ms` (-1: forever) for those not
  /// sealed yet; an object not sealed in time has null buffers. The
  /// buffers end the object's use when the last of them goes.
  Status Get(const std::vector<ObjectID>& object_ids, int64_t timeout_ms,
             std::vector<ObjectBuffer>* object_buffers) {
    if (object_buffers == nullptr) return Status::Invalid("Get: object_buffers is null");
    // The C library holds a batch's objects in one handle (one object: in
    // its own buffer); each result ends its object's use when its data
    // buffer and its metadata buffer are gone: no per-object books here.
    // (An object without metadata gets one shared empty metadata buffer
    // that holds nothing: it has no bytes to keep.)
    const size_t n = object_ids.size();
    thread_local std::vector<fp_buffer_view> views;  // reused: no allocation per Get
    views.resize(n);
    fp_held* held = nullptr;
    fp_buffer* one = nullptr;
    {
      // Under the client's lock, as Plasma's Get: a Disconnect from another
      // thread waits for it.
      std::lock_guard<std::recursive_mutex> lock(impl_->mu);
      ARROW_RETURN_NOT_OK(impl_->Connected());
      const fp_object_id* ids = detail::AsC(object_ids.data());
      ARROW_RETURN_NOT_OK(detail::FromC(
          n == 1 ? fp_get_views(impl_->client, ids, 1, timeout_ms, &one, views.data())
                 : fp_get_held(impl_->client, ids, n, timeout_ms, &held, views.data()),
          "Get"));
    }
    std::vector<ObjectBuffer> out(n);
    for (size_t i = 0; i < n; i++) {
      const fp_buffer_view& v = views[i];
      if (v.data == nullptr) continue;  // not sealed in time
      auto pair = n == 1 ? std::allocate_shared<detail::BufferPair>(
                               detail::CachedAllocator<detail::BufferPair>(), one, v)
                         : std::allocate_shared<detail::BufferPair>(
                               detail::CachedAllocator<detail::BufferPair>(), held, i, v);
      if (v.metadata_size == 0) {
        out[i].metadata = detail::EmptyMetadata();
      } else {
        pair->metadata.emplace(v.metadata, static_cast<int64_t>(v.metadata_size),
                               detail::CpuMemoryManager());
        out[i].metadata = std::shared_ptr<Buffer>(pair, &*pair->metadata);
      }
      out[i].data = std::shared_ptr<Buffer>(std::move(pair), &pair->data);
    }
    if (n > 4096) {  // a huge batch: do not keep its scratch for the thread's life
      std::vector<fp_buffer_view>().swap(views);
    }
    *object_buffers = std::move(out);
    return Status::OK();
  }

  /// Plasma's older Get: the buffers do not end the object's use, each
  /// object must be released with Release.
  Status Get(const ObjectID* object_ids, int64_t num_objects, int64_t timeout_ms,
             ObjectBuffer* object_buffers) {
    if (num_objects < 0) return Status::Invalid("Get: num_objects is negative");
    if (num_objects > 0 && (object_ids == nullptr || object_buffers == nullptr)) {
      return Status::Invalid("Get: object_ids and object_buffers must not be null");
    }
    return GetImpl(object_ids, num_objects, timeout_ms, object_buffers);
  }

  /// Ends one use of the object (of Create, or of the older Get).
  Status Release(const ObjectID& object_id) { return impl_->Release(object_id); }

  /// Whether the object is sealed in the store (also while a delete waits
  /// for its last use), or used or being created by this client.
  Status Contains(const ObjectID& object_id, bool* has_object) {
    if (has_object == nullptr) return Status::Invalid("Contains: has_object is null");
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    if (impl_->objects_.count(object_id) != 0) {
      *has_object = true;
      return Status::OK();
    }
    fp_object_id id = detail::ToC(object_id);
    return detail::FromC(fp_contains_deleting(impl_->client, &id, has_object), "Contains");
  }

  /// Every object in the store.
  Status List(ObjectTable* objects) {
    if (objects == nullptr) return Status::Invalid("List: objects is null");
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    fp_object_info* infos = nullptr;
    size_t n = 0;
    ARROW_RETURN_NOT_OK(detail::FromC(fp_list(impl_->client, &infos, &n), "List"));
    objects->clear();
    for (size_t i = 0; i < n; i++) {
      const fp_object_info& o = infos[i];
      auto e = std::make_unique<ObjectTableEntry>();
      e->data_size = static_cast<int64_t>(o.data_size);
      e->metadata_size = static_cast<int64_t>(o.metadata_size);
      e->ref_count = static_cast<int>(o.ref_count);
      e->create_time = o.create_time_us / 1000000;
      e->construct_duration =
          o.construct_duration_us < 0 ? -1 : o.construct_duration_us / 1000000;
      e->state = o.sealed ? ObjectState::PLASMA_SEALED : ObjectState::PLASMA_CREATED;
      (*objects)[detail::FromC(o.id)] = std::move(e);
    }
    fp_list_free(infos, n);
    return Status::OK();
  }

  /// Discards an object this client is creating, once it released the
  /// use Create gave it (Invalid before, as in Plasma, and for a sealed
  /// object).
  Status Abort(const ObjectID& object_id) {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    auto it = impl_->objects_.find(object_id);
    if (it == impl_->objects_.end()) {
      fp_object_id id = detail::ToC(object_id);
      bool sealed = false;
      if (impl_->client != nullptr && fp_contains(impl_->client, &id, &sealed) == FP_OK &&
          sealed) {
        return Status::Invalid("Plasma client cannot abort a sealed object");
      }
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectNotFound,
                             "Abort() called on an object this client is not creating: " +
                                 object_id.hex());
    }
    auto& e = it->second;
    if (e.creating == nullptr) {
      return Status::Invalid("Plasma client cannot abort a sealed object");
    }
    if (e.count > 1) {
      return Status::Invalid("Plasma client cannot have a reference to the buffer.");
    }
    fp_mut_buffer* buf = e.creating;
    impl_->objects_.erase(it);
    return detail::FromC(fp_abort(impl_->client, buf), "Abort");
  }

  /// Seals an object this client created: it becomes immutable and
  /// readable by every client. PlasmaObjectNotFound for an object the
  /// client is not creating, PlasmaObjectAlreadySealed for a second Seal.
  Status Seal(const ObjectID& object_id) {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    auto it = impl_->objects_.find(object_id);
    if (it == impl_->objects_.end()) {
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectNotFound,
                             "Seal() called on an object without a reference to it");
    }
    auto& e = it->second;
    if (e.creating == nullptr) {
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectAlreadySealed,
                             "Seal() called on an already sealed object");
    }
    fp_mut_buffer* buf = e.creating;
    e.creating = nullptr;
    fp_buffer* held = nullptr;
    Status st = detail::FromC(fp_seal(impl_->client, buf, &held), "Seal");
    if (!st.ok()) {
      impl_->objects_.erase(it);
      return st;
    }
    e.held = held;
    return impl_->Release(object_id);  // Seal ends one of Create's two uses
  }

  /// Deletes an object: now, or once no client uses it.
  Status Delete(const ObjectID& object_id) { return Delete(std::vector<ObjectID>{object_id}); }

  /// Deletes objects: each now, or once no client uses it.
  Status Delete(const std::vector<ObjectID>& object_ids) {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    std::vector<fp_object_id> ids = detail::ToC(object_ids);
    return detail::FromC(fp_delete(impl_->client, ids.data(), ids.size(), nullptr), "Delete");
  }

  /// Evicts unused objects, least recently used first, until at least
  /// `num_bytes` are freed; `num_bytes_evicted` receives what was.
  Status Evict(int64_t num_bytes, int64_t& num_bytes_evicted) {
    if (num_bytes < 0) return Status::Invalid("Evict: num_bytes is negative");
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    uint64_t freed = 0;
    ARROW_RETURN_NOT_OK(detail::FromC(
        fp_evict(impl_->client, static_cast<uint64_t>(num_bytes), &freed, nullptr), "Evict"));
    num_bytes_evicted = static_cast<int64_t>(freed);
    return Status::OK();
  }

  /// Marks the objects (those in the store) as just used: they are the
  /// last to be evicted.
  Status Refresh(const std::vector<ObjectID>& object_ids) {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    std::vector<fp_object_id> ids = detail::ToC(object_ids);
    std::vector<fp_buffer*> got(ids.size(), nullptr);
    ARROW_RETURN_NOT_OK(
        detail::FromC(fp_get(impl_->client, ids.data(), ids.size(), 0, got.data()), "Refresh"));
    for (fp_buffer* b : got) fp_buffer_release(b);
    return Status::OK();
  }

  /// An 8-byte digest of the object's data and metadata (BLAKE2b; equal
  /// objects hash equal on any ferroplasma store, and Python's
  /// PlasmaClient.hash gives the same). PlasmaObjectNotFound if it is not
  /// sealed in the store.
  Status Hash(const ObjectID& object_id, uint8_t* digest) {
    if (digest == nullptr) return Status::Invalid("Hash: digest is null");
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    fp_object_id id = detail::ToC(object_id);
    fp_buffer* b = nullptr;
    ARROW_RETURN_NOT_OK(detail::FromC(fp_get(impl_->client, &id, 1, 0, &b), "Hash"));
    if (b == nullptr) {
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectNotFound, "Object not found");
    }
    Status st = detail::FromC(fp_buffer_hash(b, digest), "Hash");
    fp_buffer_release(b);
    return st;
  }

  /// Subscribes to the store's notifications: `*fd` becomes readable when
  /// one waits. The objects sealed already come first, then every seal
  /// and delete; read them with GetNotification. The client owns the fd
  /// (it closes it at Disconnect): poll it, do not close it.
  Status Subscribe(int* fd) {
    if (fd == nullptr) return Status::Invalid("Subscribe: fd is null");
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    fp_subscription* sub = nullptr;
    ARROW_RETURN_NOT_OK(detail::FromC(fp_subscribe(impl_->client, true, &sub), "Subscribe"));
    *fd = fp_subscription_fd(sub);
    impl_->subscriptions[*fd] = std::make_shared<detail::ClientState::Sub>(sub);
    return Status::OK();
  }

  /// The next notification of the subscription `fd` (waiting for one): a
  /// sealed object's id and sizes, or a deleted one's id with sizes -1.
  Status GetNotification(int fd, ObjectID* object_id, int64_t* data_size,
                         int64_t* metadata_size) {
    if (object_id == nullptr || data_size == nullptr || metadata_size == nullptr) {
      return Status::Invalid("GetNotification: the outputs must not be null");
    }
    std::shared_ptr<detail::ClientState::Sub> sub;
    {
      std::lock_guard<std::recursive_mutex> lock(impl_->mu);
      auto it = impl_->subscriptions.find(fd);
      if (it == impl_->subscriptions.end()) {
        return Status::Invalid("GetNotification: ", fd, " is no subscription of this client");
      }
      sub = it->second;
    }
    // Waits in steps, so that a Disconnect from another thread ends the wait.
    fp_event ev;
    for (;;) {
      fp_status st = fp_subscription_next(sub->sub, 100, &ev);
      if (st == FP_OK) break;
      if (st != FP_TIMEOUT) return detail::FromC(st, "GetNotification");
      if (sub->closed) return Status::IOError("GetNotification: the client disconnected");
    }
    *object_id = detail::FromC(ev.id);
    if (ev.kind == FP_EVENT_DELETED) {
      *data_size = -1;
      *metadata_size = -1;
    } else {
      *data_size = static_cast<int64_t>(ev.data_size);
      *metadata_size = static_cast<int64_t>(ev.metadata_size);
    }
    return Status::OK();
  }

  /// Not available: ferroplasma's notifications are not Plasma's
  /// flatbuffers. Read them with GetNotification.
  Status DecodeNotifications(const uint8_t* buffer, std::vector<ObjectID>* object_ids,
                             std::vector<int64_t>* data_sizes,
                             std::vector<int64_t>* metadata_sizes) {
    (void)buffer;
    (void)object_ids;
    (void)data_sizes;
    (void)metadata_sizes;
    return Status::NotImplemented(
        "DecodeNotifications: ferroplasma's notifications are read with GetNotification");
  }

  /// Closes the connection (again: nothing): the objects the client was
  /// creating are aborted and its uses end, as Plasma's store did when a
  /// client left; a GetNotification waiting in another thread returns an
  /// IOError. Buffers of the self-releasing Get keep their objects while
  /// they live.
  Status Disconnect() {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    impl_->Close();
    return Status::OK();
  }

  /// The store's figures, in ferroplasma's words (Plasma's quota lines are
  /// not there).
  std::string DebugString() {
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    fp_stats s;
    if (impl_->client == nullptr || fp_get_stats(impl_->client, &s) != FP_OK) {
      return "ferroplasma store: not connected";
    }
    return "ferroplasma store\ncapacity: " + std::to_string(s.capacity) +
           "\nused: " + std::to_string(s.used) + "\nnum objects: " + std::to_string(s.objects) +
           "\nsealed objects: " + std::to_string(s.sealed_objects) +
           "\nreferenced objects: " + std::to_string(s.referenced_objects) +
           "\nclients: " + std::to_string(s.clients) +
           "\nnum evictions: " + std::to_string(s.evictions) +
           "\nbytes evicted: " + std::to_string(s.evicted_bytes) + "\n";
  }

  /// The store's memory in bytes (read when connecting).
  int64_t store_capacity() { return impl_->capacity; }

 private:
  /// The older Get: each result is one more use of the object, counted
  /// here, ended by Release.
  Status GetImpl(const ObjectID* object_ids, int64_t n, int64_t timeout_ms, ObjectBuffer* out) {
    // Under the client's lock throughout, as Plasma's Get: a Disconnect
    // from another thread waits for it.
    std::lock_guard<std::recursive_mutex> lock(impl_->mu);
    ARROW_RETURN_NOT_OK(impl_->Connected());
    std::vector<fp_object_id> ask;
    std::vector<int64_t> at;
    for (int64_t i = 0; i < n; i++) {
      auto it = impl_->objects_.find(object_ids[i]);
      if (it == impl_->objects_.end() || it->second.held == nullptr) {
        ask.push_back(detail::ToC(object_ids[i]));
        at.push_back(i);
      }
    }
    std::vector<fp_buffer*> got(ask.size(), nullptr);
    if (!ask.empty()) {
      ARROW_RETURN_NOT_OK(detail::FromC(
          fp_get(impl_->client, ask.data(), ask.size(), timeout_ms, got.data()), "Get"));
    }
    size_t next = 0;
    for (int64_t i = 0; i < n; i++) {
      const ObjectID& id = object_ids[i];
      if (next < at.size() && at[next] == i) {
        fp_buffer* b = got[next++];
        if (b == nullptr) {
          out[i] = ObjectBuffer();
          continue;
        }
        auto& got_entry = impl_->objects_[id];
        if (got_entry.held == nullptr) {
          got_entry.held = b;
        } else {
          fp_buffer_release(b);  // the id twice in one call, or got meanwhile
        }
      }
      auto& e = impl_->objects_[id];
      if (e.held == nullptr) {
        // Released to nothing by another thread since the first look.
        fp_object_id raw = detail::ToC(id);
        fp_get(impl_->client, &raw, 1, 0, &e.held);
        if (e.held == nullptr) {
          if (e.creating == nullptr && e.count == 0) impl_->objects_.erase(id);
          out[i] = ObjectBuffer();
          continue;
        }
      }
      e.count++;
      auto pair = std::make_shared<detail::KeptPair>(e.held, impl_);
      out[i].data = std::shared_ptr<Buffer>(pair, &pair->data);
      out[i].metadata = std::shared_ptr<Buffer>(pair, &pair->metadata);
      out[i].device_num = 0;
    }
    return Status::OK();
  }

  std::shared_ptr<detail::ClientState> impl_;
};

}  // namespace plasma

#endif  // FERROPLASMA_PLASMA_CLIENT_H

// plasma/client_detail.h: what plasma/client.h builds on (the C library's
// handles behind a PlasmaClient, its buffers, their allocation). Not part
// of Plasma's API: include plasma/client.h.
#ifndef FERROPLASMA_PLASMA_CLIENT_DETAIL_H
#define FERROPLASMA_PLASMA_CLIENT_DETAIL_H

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/status.h>

#include "ferroplasma.h"
#include "plasma/common.h"

namespace plasma {

namespace detail {

inline fp_object_id ToC(const ObjectID& id) {
  fp_object_id raw;
  std::memcpy(raw.bytes, id.data(), sizeof(raw.bytes));
  return raw;
}

inline std::vector<fp_object_id> ToC(const std::vector<ObjectID>& ids) {
  std::vector<fp_object_id> out;
  out.reserve(ids.size());
  for (const auto& id : ids) out.push_back(ToC(id));
  return out;
}

inline ObjectID FromC(const fp_object_id& raw) {
  ObjectID id;
  std::memcpy(id.mutable_data(), raw.bytes, sizeof(raw.bytes));
  return id;
}

/// The arrow::Status of a C library status, as Plasma reported the same.
inline arrow::Status FromC(fp_status st, const char* call) {
  if (st == FP_OK) return arrow::Status::OK();
  std::string msg = std::string(call) + ": " + fp_last_error();
  switch (st) {
    case FP_OBJECT_EXISTS:
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectExists, msg);
    case FP_OBJECT_NOT_FOUND:
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectNotFound, msg);
    case FP_STORE_FULL:
    case FP_TOO_LARGE:
      return MakePlasmaError(PlasmaErrorCode::PlasmaStoreFull, msg);
    case FP_INVALID_ARGUMENT:
    case FP_INVALID_STATE:
    case FP_NOT_HELD:
      return arrow::Status::Invalid(msg);
    case FP_TIMEOUT:
    case FP_INTERRUPTED:
      return arrow::Status::Cancelled(msg);
    default:
      return arrow::Status::IOError(msg);
  }
}

/// The state behind a PlasmaClient: the connection and, per object this
/// client uses, how many uses it has (Plasma's count: two from Create, one
/// given back by Seal; one per Get result) and the C library's handles.
class ClientState : public std::enable_shared_from_this<ClientState> {
 public:
  struct Entry {
    int count = 0;
    fp_mut_buffer* creating = nullptr;  // until sealed or aborted
    fp_buffer* held = nullptr;          // the store's reference, once sealed
  };

  ~ClientState() { Close(); }

  std::recursive_mutex mu;
  fp_client* client = nullptr;
  int64_t capacity = 0;
  /// A subscription, closed when the last user of it (the client's map,
  /// or a GetNotification waiting on it) lets it go.
  struct Sub {
    explicit Sub(fp_subscription* s) : sub(s) {}
    ~Sub() { fp_subscription_close(sub); }
    Sub(const Sub&) = delete;
    Sub& operator=(const Sub&) = delete;
    fp_subscription* sub;
    std::atomic<bool> closed{false};
  };

  std::unordered_map<ObjectID, Entry> objects_;
  std::unordered_map<int, std::shared_ptr<Sub>> subscriptions;

  arrow::Status Connected() const {
    return client != nullptr ? arrow::Status::OK()
                             : arrow::Status::IOError("the client is not connected to a store");
  }

  /// Closes the connection as Plasma's store did when a client left:
  /// objects it was creating are aborted and its uses end (buffers the
  /// older Get returned then point at memory the store may reuse, as in
  /// Plasma). Buffers of the self-releasing Get hold their own references.
  void Close() {
    for (auto& kv : subscriptions) kv.second->closed = true;
    subscriptions.clear();
    if (client == nullptr) return;
    for (auto& kv : objects_) {
      if (kv.second.creating != nullptr) fp_abort(client, kv.second.creating);
      if (kv.second.held != nullptr) fp_buffer_release(kv.second.held);
    }
    objects_.clear();
    fp_disconnect(client);
    client = nullptr;
  }

  /// One use of `id` fewer; at none, the store's reference goes.
  arrow::Status Release(const ObjectID& id) {
    std::lock_guard<std::recursive_mutex> lock(mu);
    auto it = objects_.find(id);
    if (it == objects_.end()) {
      return MakePlasmaError(PlasmaErrorCode::PlasmaObjectNotFound,
                             "Release() called on an object this client does not use: " +
                                 id.hex());
    }
    Entry& e = it->second;
    if (e.count > 0) e.count--;
    if (e.count == 0 && e.creating == nullptr) {
      fp_buffer_release(e.held);
      objects_.erase(it);
    }
    return arrow::Status::OK();
  }
};

/// The CPU memory manager every buffer here names, without counting
/// references: a shared_ptr with no owner pointing at Arrow's default CPU
/// memory manager, which a reference kept here (never dropped) keeps alive
/// to the end of the process. Buffer(data, size) would instead call
/// arrow::default_cpu_memory_manager() out of line and count a reference
/// up and down, atomically, per buffer.
inline std::shared_ptr<arrow::MemoryManager> CpuMemoryManager() {
  static const auto* const kept =
      new std::shared_ptr<arrow::MemoryManager>(arrow::default_cpu_memory_manager());
  return std::shared_ptr<arrow::MemoryManager>(std::shared_ptr<arrow::MemoryManager>(),
                                               kept->get());
}

/// The metadata buffer of every object that has none: one empty buffer,
/// never freed, handed out without ownership (a shared_ptr that counts no
/// references), so that such an object costs one arrow::Buffer and no
/// atomic operation for its metadata.
inline std::shared_ptr<arrow::Buffer> EmptyMetadata() {
  static const uint8_t nothing = 0;
  static arrow::Buffer* const empty = new arrow::Buffer(&nothing, 0, CpuMemoryManager());
  return std::shared_ptr<arrow::Buffer>(std::shared_ptr<arrow::Buffer>(), empty);
}

/// A Get's data buffer (and metadata buffer, if the object has metadata),
/// made in one allocation (the ObjectBuffer's shared_ptrs share it), and
/// the C library's buffer behind them: the store's reference, given back
/// when the last of them goes.
struct BufferPair {
  /// Object `index` of a batch (`fp_get_held`).
  BufferPair(fp_held* held, size_t index, const fp_buffer_view& view)
      : data(view.data, static_cast<int64_t>(view.size), CpuMemoryManager()),
        held(held),
        index(index) {}
  /// One object (`fp_get_views`): cheaper than a batch of one.
  BufferPair(fp_buffer* one, const fp_buffer_view& view)
      : data(view.data, static_cast<int64_t>(view.size), CpuMemoryManager()), one(one) {}
  ~BufferPair() {
    if (held != nullptr) {
      fp_held_release(held, index);
    } else {
      fp_buffer_release(one);
    }
  }
  BufferPair(const BufferPair&) = delete;
  BufferPair& operator=(const BufferPair&) = delete;
  arrow::Buffer data;
  std::optional<arrow::Buffer> metadata;
  fp_held* held = nullptr;  // the Get's batch, which frees itself with its last object
  size_t index = 0;
  fp_buffer* one = nullptr;
};

/// ObjectID and fp_object_id are both 20 bytes and nothing else, so a
/// vector of ids goes to the C library as it lies, without a copy.
static_assert(sizeof(ObjectID) == sizeof(fp_object_id) && alignof(ObjectID) == 1 &&
                  std::is_standard_layout_v<ObjectID> && std::is_trivially_copyable_v<ObjectID>,
              "ObjectID must have fp_object_id's layout");
inline const fp_object_id* AsC(const ObjectID* ids) {
  return reinterpret_cast<const fp_object_id*>(ids);
}

/// Freed blocks of the one size Get's buffers take, kept per thread for
/// the next Get (up to 4096): a batched get of 1,000 objects then
/// allocates nothing, where the C library's allocator would give the
/// memory back to the kernel after each batch and fault it in again.
struct BlockCache {
  std::vector<void*> free;
  size_t size = 0;
  ~BlockCache();
};

/// Set once this thread's cache is destroyed (thread exit, or `exit()`
/// before static objects that may still hold buffers): blocks then go
/// straight to the allocator. Trivially destructible, so always readable.
inline thread_local bool block_cache_gone = false;

inline BlockCache::~BlockCache() {
  block_cache_gone = true;
  for (void* p : free) ::operator delete(p);
  free.clear();
}

/// This thread's cache, or null once it is destroyed.
inline BlockCache* block_cache() {
  if (block_cache_gone) return nullptr;
  static thread_local BlockCache cache;
  return &cache;
}

template <class T>
struct CachedAllocator {
  using value_type = T;
  CachedAllocator() = default;
  template <class U>
  CachedAllocator(const CachedAllocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    BlockCache* c = block_cache();
    if (c != nullptr && c->size == bytes && !c->free.empty()) {
      void* p = c->free.back();
      c->free.pop_back();
      return static_cast<T*>(p);
    }
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    BlockCache* c = block_cache();
    if (c != nullptr && (c->size == bytes || c->free.empty()) && c->free.size() < 4096) {
      c->size = bytes;
      c->free.push_back(p);
      return;
    }
    ::operator delete(p);
  }
  template <class U>
  bool operator==(const CachedAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const CachedAllocator<U>&) const {
    return false;
  }
};

/// The older Get's buffers: they keep the client's state (and so the
/// object's handle) alive, and end no use.
struct KeptPair {
  KeptPair(fp_buffer* held, std::shared_ptr<ClientState> state)
      : data(fp_buffer_data(held), static_cast<int64_t>(fp_buffer_size(held))),
        metadata(fp_buffer_metadata(held), static_cast<int64_t>(fp_buffer_metadata_size(held))),
        state(std::move(state)) {}
  arrow::Buffer data;
  arrow::Buffer metadata;
  std::shared_ptr<ClientState> state;
};

/// The writable buffer Create returns. It stays writable (as Plasma's did)
/// while the client lives; writing after Seal changes what readers see.
class CreatedBuffer : public arrow::MutableBuffer {
 public:
  CreatedBuffer(uint8_t* data, int64_t size, std::shared_ptr<ClientState> state)
      : arrow::MutableBuffer(data, size), state_(std::move(state)) {}

 private:
  std::shared_ptr<ClientState> state_;
};

}  // namespace detail

}  // namespace plasma

#endif  // FERROPLASMA_PLASMA_CLIENT_DETAIL_H

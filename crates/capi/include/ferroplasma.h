/*
 * ferroplasma.h: the C API of libferroplasma, the ferroplasma client.
 * Generated from crates/capi by cbindgen; do not edit (make header).
 * docs/languages.md explains ownership, threads and errors, with examples.
 */

#ifndef FERROPLASMA_H
#define FERROPLASMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Most dimensions of an array (numpy's limit).
#define FP_MAX_DIMS 32

// What a call did: `FP_OK`, or why it failed (`fp_last_error()` says more).
typedef enum fp_status {
  // Done.
  FP_OK = 0,
  // No store at the socket path, or it refused the connection.
  FP_STORE_UNAVAILABLE = 1,
  // An object with this id exists already.
  FP_OBJECT_EXISTS = 2,
  // No such object.
  FP_OBJECT_NOT_FOUND = 3,
  // No room, even after evicting everything unreferenced; also an object
  // larger than the whole store (the message says which, as Plasma's
  // store-full error covered both).
  FP_STORE_FULL = 4,
  // The object is not in a state that allows this (e.g. sealed twice).
  FP_INVALID_STATE = 5,
  // A request larger than one message of the protocol may carry (the
  // calls split what they send, so this means a store that allows less
  // than this library expects).
  FP_TOO_LARGE = 6,
  // A bad argument: a NULL pointer, a bad id, sizes that do not match.
  FP_INVALID_ARGUMENT = 7,
  // The store sent something this library does not understand.
  FP_PROTOCOL = 8,
  // This client holds no reference to the object.
  FP_NOT_HELD = 9,
  // The client was made before a fork(): connect again in the child.
  FP_FORKED = 10,
  // The connection to the store broke.
  FP_DISCONNECTED = 11,
  // The object was lost with the cluster member that held it.
  FP_OBJECT_LOST = 12,
  // Not enough of the store's cluster is reachable.
  FP_CLUSTER_UNAVAILABLE = 13,
  // A signal interrupted the call.
  FP_INTERRUPTED = 14,
  // Nothing arrived in time (subscriptions).
  FP_TIMEOUT = 15,
  // A bug in this library (a Rust panic, caught at the boundary).
  FP_PANIC = 16,
  // Not allowed: the store is run by a user this client does not trust
  // (see FERROPLASMA_TRUST_UID), or this client's user may only read it.
  FP_PERMISSION_DENIED = 17,
  // This connection already has as many gets waiting (or objects
  // awaited) as the store allows: retry when some finish.
  FP_TOO_MANY_WAITING = 18,
  // The store serves its maximum of clients (--max-clients) and refused
  // this connection: retry when some have disconnected.
  FP_STORE_BUSY = 19,
} fp_status;

// What `fp_delete` did with one id.
typedef enum fp_delete_status {
  // Freed now.
  FP_DELETED = 0,
  // Still referenced (or not sealed); freed when the last reference goes.
  FP_DEFERRED = 1,
  // No such object.
  FP_NOT_FOUND = 2,
} fp_delete_status;

// The kind of an object (the byte at offset 5 of Python's header).
typedef enum fp_kind {
  // A pickle protocol-5 stream and its out-of-band buffers (numpy
  // arrays, pandas frames, any Python object).
  FP_KIND_PICKLE = 0,
  // An Arrow IPC stream of a table (the payload).
  FP_KIND_ARROW_TABLE = 1,
  // An Arrow IPC stream of one record batch (the payload).
  FP_KIND_ARROW_BATCH = 2,
  // A record batch as its Arrow buffers (what a scan lands).
  FP_KIND_ARROW_BUFFERS = 3,
  // A Python `bytes` object (the payload is its bytes).
  FP_KIND_BYTES = 4,
  // A list of Python `str`: count, offsets, UTF-8 text (the payload).
  FP_KIND_STR_LIST = 5,
  // A numpy array: dtype, shape and order (`fp_ndarray_info`) and its
  // data (buffer 0).
  FP_KIND_NDARRAY = 6,
  // No header: bytes written with create/seal, taken as they are.
  FP_KIND_RAW = 255,
} fp_kind;

// What happened to an object.
typedef enum fp_event_kind {
  // It was sealed.
  FP_EVENT_SEALED = 0,
  // It was deleted or evicted.
  FP_EVENT_DELETED = 1,
} fp_event_kind;

// A sealed object's bytes in the store's shared memory, read-only. While
// it exists the object is neither freed nor evicted, even if deleted.
// Made by `fp_get` (or `fp_seal`); freed by `fp_buffer_release`, once.
typedef struct fp_buffer fp_buffer;

// A connection to a store. Thread-safe: one client may be used from many
// threads at once. Made by `fp_connect`; freed by `fp_disconnect`, after
// which buffers made through it stay valid until released.
typedef struct fp_client fp_client;

// The objects of one `fp_get_held`, each holding its reference until
// `fp_held_release` of its index. The handle frees itself with the
// release of its last object.
typedef struct fp_held fp_held;

// An object being created: its bytes are writable until it is sealed or
// aborted. Made by `fp_create`; given back by exactly one `fp_seal` or
// `fp_abort`, which free it whatever they return.
typedef struct fp_mut_buffer fp_mut_buffer;

// A stream of events on its own connection. Made by `fp_subscribe`; freed
// by `fp_subscription_close`. Use it from one thread at a time.
typedef struct fp_subscription fp_subscription;

// A 20-byte object id.
typedef struct fp_object_id {
  // The id's bytes.
  uint8_t bytes[20];
} fp_object_id;

// Where a sealed object's parts lie (`fp_get_views`): pointers into the
// store's memory, valid while its buffer lives; all zero for an object
// not sealed in time.
typedef struct fp_buffer_view {
  // The data (`fp_buffer_data`).
  const uint8_t *data;
  // Bytes of data.
  uint64_t size;
  // The metadata (`fp_buffer_metadata`).
  const uint8_t *metadata;
  // Bytes of metadata.
  uint64_t metadata_size;
} fp_buffer_view;

// One object of `fp_list`.
typedef struct fp_object_info {
  // The id.
  struct fp_object_id id;
  // Bytes of data.
  uint64_t data_size;
  // Bytes of metadata.
  uint64_t metadata_size;
  // References held, over all clients.
  uint64_t ref_count;
  // True once sealed.
  bool sealed;
  // A delete waits for the last reference to go.
  bool delete_pending;
  // When it was created: µs since the Unix epoch.
  int64_t create_time_us;
  // µs from create to seal; -1 while unsealed.
  int64_t construct_duration_us;
} fp_object_info;

// The store's main figures (`fp_get_stats`).
typedef struct fp_stats {
  // Usable bytes.
  uint64_t capacity;
  // Bytes held by allocations.
  uint64_t used;
  // Objects, sealed or not.
  uint64_t objects;
  // Sealed objects.
  uint64_t sealed_objects;
  // Objects with at least one reference.
  uint64_t referenced_objects;
  // Connected clients.
  uint64_t clients;
  // Objects evicted since the store started.
  uint64_t evictions;
  // Bytes evicted since the store started.
  uint64_t evicted_bytes;
} fp_stats;

// A numpy array that Python stored (`FP_KIND_NDARRAY`).
typedef struct fp_ndarray {
  // numpy's typestr of the dtype, NUL-terminated: byte order (`<`, `>`
  // or `|`), kind (`f` float, `i` int, `u` unsigned, `b` bool, `M`
  // datetime, `S` bytes, ...) and item size, e.g. "<f8".
  char typestr[16];
  // Bytes per item.
  uint64_t itemsize;
  // Dimensions (0 for a scalar array).
  uint32_t ndim;
  // True: Fortran order (first index fastest); false: C order.
  bool fortran_order;
  // The first `ndim` entries are the shape.
  uint64_t shape[FP_MAX_DIMS];
  // The data, in the store's memory.
  const uint8_t *data;
  // Bytes of data (the product of the shape times itemsize).
  uint64_t size;
} fp_ndarray;

// Where an object's parts lie. Pointers point into the store's memory and
// are valid while the buffer they came from lives.
typedef struct fp_layout {
  // The kind.
  enum fp_kind kind;
  // Format version of the header (0 for raw objects).
  uint8_t version;
  // The payload (for FP_KIND_RAW: the whole object).
  const uint8_t *payload;
  // Bytes of payload.
  uint64_t payload_size;
  // Out-of-band buffers (`fp_layout_buffer` gives each).
  uint32_t buffer_count;
} fp_layout;

// One event.
typedef struct fp_event {
  // Sealed or deleted.
  enum fp_event_kind kind;
  // The object.
  struct fp_object_id id;
  // Bytes of data (0 for deletions).
  uint64_t data_size;
  // Bytes of metadata (0 for deletions).
  uint64_t metadata_size;
} fp_event;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The object's data (`fp_buffer_size` bytes), valid while the buffer
// lives; NULL for a NULL or released buffer (`fp_last_error` says which).
//
// # Safety
// `buf` is NULL or a buffer from this library.
const uint8_t *fp_buffer_data(const struct fp_buffer *buf);

// Bytes of data (0 for a NULL or released buffer).
//
// # Safety
// `buf` is NULL or a buffer from this library.
uint64_t fp_buffer_size(const struct fp_buffer *buf);

// The object's metadata (`fp_buffer_metadata_size` bytes), valid while
// the buffer lives; NULL for a NULL or released buffer.
//
// # Safety
// `buf` is NULL or a buffer from this library.
const uint8_t *fp_buffer_metadata(const struct fp_buffer *buf);

// Bytes of metadata (0 for a NULL or released buffer).
//
// # Safety
// `buf` is NULL or a buffer from this library.
uint64_t fp_buffer_metadata_size(const struct fp_buffer *buf);

// The object's id (all zeros for a NULL or released buffer).
//
// # Safety
// `buf` is NULL or a buffer from this library.
struct fp_object_id fp_buffer_id(const struct fp_buffer *buf);

// Writes an 8-byte digest of the object (BLAKE2b with an 8-byte output,
// over its data then its metadata) into `out`: equal objects hash equal on
// any store, and Python's `PlasmaClient.hash` gives the same bytes.
//
// # Safety
// `buf` is NULL or a buffer from this library; `out` is NULL or has room
// for 8 bytes.
enum fp_status fp_buffer_hash(const struct fp_buffer *buf, uint8_t *out);

// Gives the buffer's reference back to the store and frees the buffer.
// After this the buffer's pointers are invalid. NULL is ignored
// (`FP_OK`); a buffer released already is `FP_INVALID_ARGUMENT`.
//
// # Safety
// `buf` is NULL or a buffer from this library.
enum fp_status fp_buffer_release(struct fp_buffer *buf);

// The writable data of an object being created (`fp_mut_buffer_size`
// bytes), valid until it is sealed or aborted; NULL for a NULL buffer or
// one sealed or aborted already.
//
// # Safety
// `buf` is NULL or a buffer from `fp_create`, used from one thread.
uint8_t *fp_mut_buffer_data(struct fp_mut_buffer *buf);

// Bytes of data of an object being created (0 for a NULL buffer or one
// sealed or aborted already).
//
// # Safety
// `buf` is NULL or a buffer from `fp_create`.
uint64_t fp_mut_buffer_size(const struct fp_mut_buffer *buf);

// The id of an object being created (zeros for a NULL buffer or one
// sealed or aborted already).
//
// # Safety
// `buf` is NULL or a buffer from `fp_create`.
struct fp_object_id fp_mut_buffer_id(const struct fp_mut_buffer *buf);

// Connects to the store at `socket_path` (NULL: `$FERROPLASMA_SOCKET`,
// else `/tmp/ferroplasma.sock`) and sets `*out` to the new client.
//
// # Safety
// `socket_path` is NULL or a NUL-terminated string; `out` is writable.
enum fp_status fp_connect(const char *socket_path, struct fp_client **out);

// Closes the connection and frees the client. Buffers made through it
// stay valid until released. NULL is ignored (`FP_OK`); a client
// disconnected already is `FP_INVALID_ARGUMENT`, and so is a call on it
// soon after (see "Ownership" in docs/languages.md).
//
// # Safety
// `c` is NULL or a client from `fp_connect`.
enum fp_status fp_disconnect(struct fp_client *c);

// Bytes of memory of the store.
//
// # Safety
// `c` is NULL or a live client; `out` is writable.
enum fp_status fp_capacity(const struct fp_client *c, uint64_t *out);

// Creates an object of `data_size` bytes of data (to be written through
// `fp_mut_buffer_data`) and the given metadata (copied now), and sets
// `*out` to its buffer. Pass that buffer to exactly one `fp_seal` or
// `fp_abort`. FP_OBJECT_EXISTS if the id is taken, FP_STORE_FULL if there
// is no room.
//
// # Safety
// `c` is a live client; `id` points to an id; `metadata` has
// `metadata_size` readable bytes (or is NULL with size 0); `out` is writable.
enum fp_status fp_create(const struct fp_client *c,
                         const struct fp_object_id *id,
                         uint64_t data_size,
                         const uint8_t *metadata,
                         size_t metadata_size,
                         struct fp_mut_buffer **out);

// Seals the object being created: it becomes immutable and visible to
// every client. Frees `buf` whatever happens (a buffer sealed or aborted
// already is `FP_INVALID_ARGUMENT`). With `out` not NULL, `*out` becomes a
// read-only buffer of the sealed object (holding a reference; release it
// with `fp_buffer_release`); with `out` NULL the creator's reference is
// given back now.
//
// # Safety
// `c` is a client; `buf` is a buffer from `fp_create`; `out` is NULL or
// writable.
enum fp_status fp_seal(const struct fp_client *c,
                       struct fp_mut_buffer *buf,
                       struct fp_buffer **out);

// Discards the object being created (its id becomes free again). Frees
// `buf` whatever happens (one sealed or aborted already is
// `FP_INVALID_ARGUMENT`).
//
// # Safety
// `c` is a client; `buf` is a buffer from `fp_create`.
enum fp_status fp_abort(const struct fp_client *c, struct fp_mut_buffer *buf);

// Creates, fills and seals an object in one call (one message when data
// and metadata fit in one, else a create, a copy and a seal). No
// reference is kept.
//
// # Safety
// `c` is a live client; `id` points to an id; `data` and `metadata` have
// the given numbers of readable bytes (or are NULL with size 0).
enum fp_status fp_create_and_seal(const struct fp_client *c,
                                  const struct fp_object_id *id,
                                  const uint8_t *data,
                                  size_t data_size,
                                  const uint8_t *metadata,
                                  size_t metadata_size);

// Gets `n` objects, waiting up to `timeout_ms` (negative: forever, 0: not
// at all) for those not sealed yet. `out[i]` becomes a buffer of object
// `ids[i]`, or NULL if it was not sealed in time; release each non-NULL
// buffer with `fp_buffer_release`. Sealed objects in this store's memory
// are read without asking the store (docs/protocol.md).
//
// # Safety
// `c` is a live client; `ids` has `n` ids and `out` room for `n` pointers.
enum fp_status fp_get(const struct fp_client *c,
                      const struct fp_object_id *ids,
                      size_t n,
                      int64_t timeout_ms,
                      struct fp_buffer **out);

// `fp_get`, and where each object's data and metadata lie: `views[i]`
// becomes what `fp_buffer_data`, `fp_buffer_size`, `fp_buffer_metadata`
// and `fp_buffer_metadata_size` of `out[i]` return (all zero for a NULL
// `out[i]`), without four calls per object. `views` may be NULL.
//
// # Safety
// As `fp_get`; `views` is NULL or has room for `n` views.
enum fp_status fp_get_views(const struct fp_client *c,
                            const struct fp_object_id *ids,
                            size_t n,
                            int64_t timeout_ms,
                            struct fp_buffer **out,
                            struct fp_buffer_view *views);

// Plasma's `Release`: references belong to buffers and end with
// `fp_buffer_release`; this only checks that the client holds a buffer of
// the object (or is creating it): FP_NOT_HELD otherwise.
//
// # Safety
// `c` is a live client; `id` points to an id.
enum fp_status fp_release(const struct fp_client *c, const struct fp_object_id *id);

// Sets `*out` to whether the object is sealed in the store.
//
// # Safety
// `c` is a live client; `id` points to an id; `out` is writable.
enum fp_status fp_contains(const struct fp_client *c, const struct fp_object_id *id, bool *out);

// Plasma's contains: sets `*out` to whether the object is sealed in the
// store, counting one whose delete waits for its last reference (those
// who hold it still read it), as Plasma's store answered. `fp_contains`
// is false for such an object.
//
// # Safety
// `c` is a live client; `id` points to an id; `out` is writable.
enum fp_status fp_contains_deleting(const struct fp_client *c,
                                    const struct fp_object_id *id,
                                    bool *out);

// Deletes `n` objects: each is freed now, or when its last reference
// goes. With `out` not NULL, `out[i]` says which, for `ids[i]`.
//
// # Safety
// `c` is a live client; `ids` has `n` ids; `out` is NULL or has room for
// `n` statuses.
enum fp_status fp_delete(const struct fp_client *c,
                         const struct fp_object_id *ids,
                         size_t n,
                         enum fp_delete_status *out);

// Evicts least recently used, unreferenced objects until at least
// `num_bytes` (data + metadata) are freed. `freed_bytes` and
// `freed_objects` (each may be NULL) receive what was freed.
//
// # Safety
// `c` is a live client; the outputs are NULL or writable.
enum fp_status fp_evict(const struct fp_client *c,
                        uint64_t num_bytes,
                        uint64_t *freed_bytes,
                        uint64_t *freed_objects);

// Every object in the store: `*out` becomes an array of `*n` entries,
// owned by the caller and freed with `fp_list_free(*out, *n)`.
//
// # Safety
// `c` is a live client; `out` and `n` are writable.
enum fp_status fp_list(const struct fp_client *c, struct fp_object_info **out, size_t *n);

// Frees an array from `fp_list` (NULL is ignored).
//
// # Safety
// `infos` and `n` are exactly what one `fp_list` returned, freed once.
void fp_list_free(struct fp_object_info *infos, size_t n);

// The store's main figures.
//
// # Safety
// `c` is a live client; `out` is writable.
enum fp_status fp_get_stats(const struct fp_client *c, struct fp_stats *out);

// `fp_get_views`, holding the objects in one batch: `*out` becomes a
// held batch whose index `i` holds object `ids[i]` (its parts in
// `views[i]`, all zero if it was not sealed in time), or NULL if none was.
// Release each object got with `fp_held_release(*out, i)`; the batch is
// freed with the last.
//
// # Safety
// `c` is a live client; `ids` has `n` ids; `out` is writable; `views` has
// room for `n` views.
enum fp_status fp_get_held(const struct fp_client *c,
                           const struct fp_object_id *ids,
                           size_t n,
                           int64_t timeout_ms,
                           struct fp_held **out,
                           struct fp_buffer_view *views);

// Ends the use of object `i` of the batch: its reference goes back to the
// store, and its views are invalid. The last release frees the batch.
// An index out of range, not got, or released already is
// `FP_INVALID_ARGUMENT`.
//
// # Safety
// `h` is a batch from `fp_get_held`.
enum fp_status fp_held_release(struct fp_held *h, size_t i);

// A random id (what Plasma's `ObjectID.from_random` makes).
struct fp_object_id fp_object_id_random(void);

// Reads 40 hex digits (NUL-terminated) into `*out`.
//
// # Safety
// `hex` is NULL or a NUL-terminated string; `out` is NULL or writable.
enum fp_status fp_object_id_from_hex(const char *hex, struct fp_object_id *out);

// Writes the id as 40 lowercase hex digits and a NUL into `out`, which has
// room for 41 bytes.
//
// # Safety
// `out` is NULL or has room for 41 bytes.
enum fp_status fp_object_id_to_hex(struct fp_object_id id, char *out);

// Reads the numpy array in `buf` (an `FP_KIND_NDARRAY` object) into
// `*out`: dtype, shape, order, and a pointer to its data in the store.
// FP_INVALID_ARGUMENT for an object of another kind.
//
// # Safety
// `buf` is a live buffer; `out` is writable.
enum fp_status fp_ndarray_info(const struct fp_buffer *buf, struct fp_ndarray *out);

// Reads the layout of the object in `buf` into `*out`. Objects without
// Python's header are FP_KIND_RAW (the payload is the whole object).
//
// # Safety
// `buf` is a live buffer; `out` is writable.
enum fp_status fp_object_layout(const struct fp_buffer *buf, struct fp_layout *out);

// Out-of-band buffer `i` (0-based, below `buffer_count`) of the object in
// `buf`: `*data` points into the store, `*size` is its length.
//
// # Safety
// `buf` is a live buffer; `data` and `size` are writable.
enum fp_status fp_layout_buffer(const struct fp_buffer *buf,
                                uint32_t i,
                                const uint8_t **data,
                                uint64_t *size);

// The message of the last call on this thread that did not return
// `FP_OK` ("" if none). Valid until the next failing call on this thread;
// owned by the library (do not free it).
const char *fp_last_error(void);

// A static, human-readable name of a status code ("FP_OK", ...;
// "FP_UNKNOWN" for a number that is no status).
const char *fp_status_name(int32_t status);

// Subscribes to the store's events: `*out` receives every object sealed
// or deleted from now on (with `existing`, first every object sealed
// already, as Plasma's store did).
//
// # Safety
// `c` is a live client; `out` is writable.
enum fp_status fp_subscribe(const struct fp_client *c, bool existing, struct fp_subscription **out);

// Waits up to `timeout_ms` (negative: forever) for the next event and
// writes it to `*out`; FP_TIMEOUT if none came in time.
//
// # Safety
// `sub` is a live subscription; `out` is writable.
enum fp_status fp_subscription_next(struct fp_subscription *sub,
                                    int64_t timeout_ms,
                                    struct fp_event *out);

// The subscription's file descriptor, readable when an event is waiting
// (for poll/epoll); -1 for NULL. Owned by the subscription.
//
// # Safety
// `sub` is NULL or a live subscription.
int32_t fp_subscription_fd(const struct fp_subscription *sub);

// Closes the subscription and frees it. NULL is ignored (`FP_OK`); one
// closed already is `FP_INVALID_ARGUMENT`.
//
// # Safety
// `sub` is NULL or a subscription from `fp_subscribe`.
enum fp_status fp_subscription_close(struct fp_subscription *sub);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* FERROPLASMA_H */

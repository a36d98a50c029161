//! A connection to a store, and the operations on objects.

use crate::buffer::{fp_buffer, fp_buffer_view, fp_mut_buffer};
use crate::handle::{self, impl_kind, Handle};
use crate::id::fp_object_id;
use crate::status::{fp_status, guard, invalid, CapiError};
use ferroplasma_client::{Client, DeleteStatus, ObjectId};
use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::time::Duration;

/// A connection to a store. Thread-safe: one client may be used from many
/// threads at once. Made by `fp_connect`; freed by `fp_disconnect`, after
/// which buffers made through it stay valid until released.
#[derive(Debug)]
pub struct fp_client {
    h: Handle<Client>,
}

impl_kind!(fp_client, Client, "the client");

/// What `fp_delete` did with one id.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fp_delete_status {
    /// Freed now.
    FP_DELETED = 0,
    /// Still referenced (or not sealed); freed when the last reference goes.
    FP_DEFERRED = 1,
    /// No such object.
    FP_NOT_FOUND = 2,
}

/// One object of `fp_list`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fp_object_info {
    /// The id.
    pub id: fp_object_id,
    /// Bytes of data.
    pub data_size: u64,
    /// Bytes of metadata.
    pub metadata_size: u64,
    /// References held, over all clients.
    pub ref_count: u64,
    /// True once sealed.
    pub sealed: bool,
    /// A delete waits for the last reference to go.
    pub delete_pending: bool,
    /// When it was created: µs since the Unix epoch.
    pub create_time_us: i64,
    /// µs from create to seal; -1 while unsealed.
    pub construct_duration_us: i64,
}

/// The store's main figures (`fp_get_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fp_stats {
    /// Usable bytes.
    pub capacity: u64,
    /// Bytes held by allocations.
    pub used: u64,
    /// Objects, sealed or not.
    pub objects: u64,
    /// Sealed objects.
    pub sealed_objects: u64,
    /// Objects with at least one reference.
    pub referenced_objects: u64,
    /// Connected clients.
    pub clients: u64,
    /// Objects evicted since the store started.
    pub evictions: u64,
    /// Bytes evicted since the store started.
    pub evicted_bytes: u64,
}

/// The client behind a handle, or an error naming the call (NULL, or
/// disconnected already).
pub(crate) fn client<'a>(c: *const fp_client, call: &str) -> Result<&'a Client, CapiError> {
    handle::value(c, call)
}

/// Writes `value` to `out`, which must not be NULL.
fn put<T>(out: *mut T, value: T, call: &str) -> Result<(), CapiError> {
    if out.is_null() {
        return Err(invalid(format!("{call}: the output pointer is NULL")));
    }
    // Safety: not NULL, and writable (the caller's promise).
    unsafe { out.write(value) };
    Ok(())
}

/// `n` ids at `ids` (NULL allowed when n is 0).
pub(crate) fn ids_at<'a>(
    ids: *const fp_object_id,
    n: usize,
    call: &str,
) -> Result<&'a [fp_object_id], CapiError> {
    if n == 0 {
        return Ok(&[]);
    }
    if ids.is_null() {
        return Err(invalid(format!("{call}: ids is NULL")));
    }
    // Safety: `n` readable ids (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(ids, n) })
}

/// `len` bytes at `p` (NULL allowed when len is 0).
fn bytes_at<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], CapiError> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL but its size is {len}")));
    }
    // Safety: `len` readable bytes (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

pub(crate) fn timeout(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Connects to the store at `socket_path` (NULL: `$FERROPLASMA_SOCKET`,
/// else `/tmp/ferroplasma.sock`) and sets `*out` to the new client.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_connect(
    socket_path: *const c_char,
    out: *mut *mut fp_client,
) -> fp_status {
    guard(|| {
        let path = if socket_path.is_null() {
            None
        } else {
            // Safety: NUL-terminated (the caller's promise).
            let s = unsafe { CStr::from_ptr(socket_path) };
            Some(PathBuf::from(
                s.to_str()
                    .map_err(|_| invalid("the socket path is not UTF-8"))?,
            ))
        };
        if out.is_null() {
            return Err(invalid("fp_connect: the output pointer is NULL"));
        }
        let inner = Client::connect(path.as_deref())?;
        put(out, handle::make::<fp_client>(inner), "fp_connect")
    })
}

/// Closes the connection and frees the client. Buffers made through it
/// stay valid until released. NULL is ignored (`FP_OK`); a client
/// disconnected already is `FP_INVALID_ARGUMENT`, and so is a call on it
/// soon after (see "Ownership" in docs/languages.md).
///
/// # Safety
/// `c` is NULL or a client from `fp_connect`.
#[no_mangle]
pub unsafe extern "C" fn fp_disconnect(c: *mut fp_client) -> fp_status {
    guard(|| {
        if !c.is_null() {
            drop(handle::free(c, "fp_disconnect")?);
        }
        Ok(())
    })
}

/// Bytes of memory of the store.
///
/// # Safety
/// `c` is NULL or a live client; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_capacity(c: *const fp_client, out: *mut u64) -> fp_status {
    guard(|| put(out, client(c, "fp_capacity")?.capacity(), "fp_capacity"))
}

/// Creates an object of `data_size` bytes of data (to be written through
/// `fp_mut_buffer_data`) and the given metadata (copied now), and sets
/// `*out` to its buffer. Pass that buffer to exactly one `fp_seal` or
/// `fp_abort`. FP_OBJECT_EXISTS if the id is taken, FP_STORE_FULL if there
/// is no room.
///
/// # Safety
/// `c` is a live client; `id` points to an id; `metadata` has
/// `metadata_size` readable bytes (or is NULL with size 0); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_create(
    c: *const fp_client,
    id: *const fp_object_id,
    data_size: u64,
    metadata: *const u8,
    metadata_size: usize,
    out: *mut *mut fp_mut_buffer,
) -> fp_status {
    guard(|| {
        let cl = client(c, "fp_create")?;
        let [id] = ids_at(id, 1, "fp_create")? else {
            unreachable!("one id")
        };
        let meta = bytes_at(metadata, metadata_size, "metadata")?;
        if out.is_null() {
            return Err(invalid("fp_create: out is NULL"));
        }
        let inner = cl.create(ObjectId::from(*id), data_size, meta)?;
        put(out, handle::make::<fp_mut_buffer>(inner), "fp_create")
    })
}

/// Seals the object being created: it becomes immutable and visible to
/// every client. Frees `buf` whatever happens (a buffer sealed or aborted
/// already is `FP_INVALID_ARGUMENT`). With `out` not NULL, `*out` becomes a
/// read-only buffer of the sealed object (holding a reference; release it
/// with `fp_buffer_release`); with `out` NULL the creator's reference is
/// given back now.
///
/// # Safety
/// `c` is a client; `buf` is a buffer from `fp_create`; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn fp_seal(
    c: *const fp_client,
    buf: *mut fp_mut_buffer,
    out: *mut *mut fp_buffer,
) -> fp_status {
    guard(|| {
        let b = handle::free(buf, "fp_seal")?;
        let cl = client(c, "fp_seal")?;
        let sealed = cl.seal(b)?;
        if out.is_null() {
            drop(sealed);
            return Ok(());
        }
        put(out, handle::make::<fp_buffer>(sealed), "fp_seal")
    })
}

/// Discards the object being created (its id becomes free again). Frees
/// `buf` whatever happens (one sealed or aborted already is
/// `FP_INVALID_ARGUMENT`).
///
/// # Safety
/// `c` is a client; `buf` is a buffer from `fp_create`.
#[no_mangle]
pub unsafe extern "C" fn fp_abort(c: *const fp_client, buf: *mut fp_mut_buffer) -> fp_status {
    guard(|| {
        let b = handle::free(buf, "fp_abort")?;
        client(c, "fp_abort")?.abort(b)?;
        Ok(())
    })
}

/// Creates, fills and seals an object in one call (one message when data
/// and metadata fit in one, else a create, a copy and a seal). No
/// reference is kept.
///
/// # Safety
/// `c` is a live client; `id` points to an id; `data` and `metadata` have
/// the given numbers of readable bytes (or are NULL with size 0).
#[no_mangle]
pub unsafe extern "C" fn fp_create_and_seal(
    c: *const fp_client,
    id: *const fp_object_id,
    data: *const u8,
    data_size: usize,
    metadata: *const u8,
    metadata_size: usize,
) -> fp_status {
    guard(|| {
        let cl = client(c, "fp_create_and_seal")?;
        let [id] = ids_at(id, 1, "fp_create_and_seal")? else {
            unreachable!("one id")
        };
        let d = bytes_at(data, data_size, "data")?;
        let m = bytes_at(metadata, metadata_size, "metadata")?;
        cl.create_and_seal(ObjectId::from(*id), d, m)?;
        Ok(())
    })
}

/// Gets `n` objects, waiting up to `timeout_ms` (negative: forever, 0: not
/// at all) for those not sealed yet. `out[i]` becomes a buffer of object
/// `ids[i]`, or NULL if it was not sealed in time; release each non-NULL
/// buffer with `fp_buffer_release`. Sealed objects in this store's memory
/// are read without asking the store (docs/protocol.md).
///
/// # Safety
/// `c` is a live client; `ids` has `n` ids and `out` room for `n` pointers.
#[no_mangle]
pub unsafe extern "C" fn fp_get(
    c: *const fp_client,
    ids: *const fp_object_id,
    n: usize,
    timeout_ms: i64,
    out: *mut *mut fp_buffer,
) -> fp_status {
    guard(|| get_into(c, ids, n, timeout_ms, out, std::ptr::null_mut(), "fp_get"))
}

/// `fp_get`, and where each object's data and metadata lie: `views[i]`
/// becomes what `fp_buffer_data`, `fp_buffer_size`, `fp_buffer_metadata`
/// and `fp_buffer_metadata_size` of `out[i]` return (all zero for a NULL
/// `out[i]`), without four calls per object. `views` may be NULL.
///
/// # Safety
/// As `fp_get`; `views` is NULL or has room for `n` views.
#[no_mangle]
pub unsafe extern "C" fn fp_get_views(
    c: *const fp_client,
    ids: *const fp_object_id,
    n: usize,
    timeout_ms: i64,
    out: *mut *mut fp_buffer,
    views: *mut fp_buffer_view,
) -> fp_status {
    guard(|| get_into(c, ids, n, timeout_ms, out, views, "fp_get_views"))
}

/// The body of `fp_get` and `fp_get_views`.
fn get_into(
    c: *const fp_client,
    ids: *const fp_object_id,
    n: usize,
    timeout_ms: i64,
    out: *mut *mut fp_buffer,
    views: *mut fp_buffer_view,
    call: &str,
) -> Result<(), CapiError> {
    let cl = client(c, call)?;
    let ids: Vec<ObjectId> = ids_at(ids, n, call)?.iter().map(|&i| i.into()).collect();
    if n > 0 && out.is_null() {
        return Err(invalid(format!("{call}: out is NULL")));
    }
    let got = cl.get(&ids, timeout(timeout_ms))?;
    for (i, b) in got.into_iter().enumerate() {
        if !views.is_null() {
            let v = b.as_ref().map_or(fp_buffer_view::NONE, fp_buffer_view::of);
            // Safety: `views` has room for `n` views, i < n.
            unsafe { views.add(i).write(v) };
        }
        let p = b.map_or(std::ptr::null_mut(), handle::make::<fp_buffer>);
        // Safety: `out` has room for `n` pointers, i < n.
        unsafe { out.add(i).write(p) };
    }
    Ok(())
}

/// Plasma's `Release`: references belong to buffers and end with
/// `fp_buffer_release`; this only checks that the client holds a buffer of
/// the object (or is creating it): FP_NOT_HELD otherwise.
///
/// # Safety
/// `c` is a live client; `id` points to an id.
#[no_mangle]
pub unsafe extern "C" fn fp_release(c: *const fp_client, id: *const fp_object_id) -> fp_status {
    guard(|| {
        let cl = client(c, "fp_release")?;
        let [id] = ids_at(id, 1, "fp_release")? else {
            unreachable!("one id")
        };
        cl.release(ObjectId::from(*id))?;
        Ok(())
    })
}

/// Sets `*out` to whether the object is sealed in the store.
///
/// # Safety
/// `c` is a live client; `id` points to an id; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_contains(
    c: *const fp_client,
    id: *const fp_object_id,
    out: *mut bool,
) -> fp_status {
    contains_one(c, id, out, "fp_contains", Client::contains)
}

/// One id's contains, by `ask` (plain or Plasma's).
fn contains_one(
    c: *const fp_client,
    id: *const fp_object_id,
    out: *mut bool,
    call: &str,
    ask: fn(&Client, &[ObjectId]) -> ferroplasma_client::Result<Vec<bool>>,
) -> fp_status {
    guard(|| {
        let cl = client(c, call)?;
        let [id] = ids_at(id, 1, call)? else {
            unreachable!("one id")
        };
        let found = ask(cl, &[ObjectId::from(*id)])?;
        put(out, found.first().copied().unwrap_or(false), call)
    })
}

/// Plasma's contains: sets `*out` to whether the object is sealed in the
/// store, counting one whose delete waits for its last reference (those
/// who hold it still read it), as Plasma's store answered. `fp_contains`
/// is false for such an object.
///
/// # Safety
/// `c` is a live client; `id` points to an id; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_contains_deleting(
    c: *const fp_client,
    id: *const fp_object_id,
    out: *mut bool,
) -> fp_status {
    contains_one(
        c,
        id,
        out,
        "fp_contains_deleting",
        Client::contains_deleting,
    )
}

/// Deletes `n` objects: each is freed now, or when its last reference
/// goes. With `out` not NULL, `out[i]` says which, for `ids[i]`.
///
/// # Safety
/// `c` is a live client; `ids` has `n` ids; `out` is NULL or has room for
/// `n` statuses.
#[no_mangle]
pub unsafe extern "C" fn fp_delete(
    c: *const fp_client,
    ids: *const fp_object_id,
    n: usize,
    out: *mut fp_delete_status,
) -> fp_status {
    guard(|| {
        let cl = client(c, "fp_delete")?;
        let ids: Vec<ObjectId> = ids_at(ids, n, "fp_delete")?
            .iter()
            .map(|&i| i.into())
            .collect();
        let st = cl.delete(&ids)?;
        if !out.is_null() {
            for (i, s) in st.into_iter().enumerate() {
                let v = match s {
                    DeleteStatus::Deleted => fp_delete_status::FP_DELETED,
                    DeleteStatus::Deferred => fp_delete_status::FP_DEFERRED,
                    DeleteStatus::NotFound => fp_delete_status::FP_NOT_FOUND,
                };
                // Safety: room for `n` statuses, i < n.
                unsafe { out.add(i).write(v) };
            }
        }
        Ok(())
    })
}

/// Evicts least recently used, unreferenced objects until at least
/// `num_bytes` (data + metadata) are freed. `freed_bytes` and
/// `freed_objects` (each may be NULL) receive what was freed.
///
/// # Safety
/// `c` is a live client; the outputs are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fp_evict(
    c: *const fp_client,
    num_bytes: u64,
    freed_bytes: *mut u64,
    freed_objects: *mut u64,
) -> fp_status {
    guard(|| {
        let (bytes, objects) = client(c, "fp_evict")?.evict(num_bytes)?;
        if !freed_bytes.is_null() {
            // Safety: writable (the caller's promise).
            unsafe { freed_bytes.write(bytes) };
        }
        if !freed_objects.is_null() {
            // Safety: writable (the caller's promise).
            unsafe { freed_objects.write(objects) };
        }
        Ok(())
    })
}

/// Every object in the store: `*out` becomes an array of `*n` entries,
/// owned by the caller and freed with `fp_list_free(*out, *n)`.
///
/// # Safety
/// `c` is a live client; `out` and `n` are writable.
#[no_mangle]
pub unsafe extern "C" fn fp_list(
    c: *const fp_client,
    out: *mut *mut fp_object_info,
    n: *mut usize,
) -> fp_status {
    guard(|| {
        let objects = client(c, "fp_list")?.list()?;
        if out.is_null() || n.is_null() {
            return Err(invalid("fp_list: out and n must not be NULL"));
        }
        let infos: Box<[fp_object_info]> = objects
            .into_iter()
            .map(|o| fp_object_info {
                id: o.id.into(),
                data_size: o.data_size,
                metadata_size: o.metadata_size,
                ref_count: o.ref_count,
                sealed: o.sealed,
                delete_pending: o.delete_pending,
                create_time_us: o.create_time_us,
                construct_duration_us: o.construct_duration_us.unwrap_or(-1),
            })
            .collect();
        put(n, infos.len(), "fp_list")?;
        put(
            out,
            Box::into_raw(infos).cast::<fp_object_info>(),
            "fp_list",
        )
    })
}

/// Frees an array from `fp_list` (NULL is ignored).
///
/// # Safety
/// `infos` and `n` are exactly what one `fp_list` returned, freed once.
#[no_mangle]
pub unsafe extern "C" fn fp_list_free(infos: *mut fp_object_info, n: usize) {
    if !infos.is_null() {
        // Safety: a boxed slice of `n` entries made by fp_list, freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(infos, n)) });
    }
}

/// The store's main figures.
///
/// # Safety
/// `c` is a live client; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn fp_get_stats(c: *const fp_client, out: *mut fp_stats) -> fp_status {
    guard(|| {
        let s = client(c, "fp_get_stats")?.stats()?;
        put(
            out,
            fp_stats {
                capacity: s.capacity,
                used: s.used,
                objects: s.objects,
                sealed_objects: s.sealed_objects,
                referenced_objects: s.referenced_objects,
                clients: s.clients,
                evictions: s.evictions,
                evicted_bytes: s.evicted_bytes,
            },
            "fp_get_stats",
        )
    })
}

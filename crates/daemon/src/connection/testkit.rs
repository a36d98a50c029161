//! What the connection tests share: a runtime, a store, and a connection
//! of a new client on a socket pair.

use super::Connection;
use crate::arena::Arena;
use crate::shared::SharedRef;
use bytes::BytesMut;
use ferroplasma_store::Store;

/// A current-thread runtime, as the store runs on.
pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A store of `capacity` bytes (no spill directory).
pub(super) fn store(capacity: u64) -> SharedRef {
    let arena = Arena::create(capacity, None, false).expect("arena");
    SharedRef::new(Store::new(capacity), arena, None, None)
}

/// A connection of a new client of `shared` that has sent `input`, and the
/// client's end of the socket. Must be called inside `rt`.
pub(super) fn connection(
    rt: &tokio::runtime::Runtime,
    shared: &SharedRef,
    input: &[u8],
) -> (Connection, std::os::unix::net::UnixStream) {
    let (client, rx) = shared.lock().register(super::NOTICE_QUEUE);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    ours.set_nonblocking(true).expect("nonblocking");
    let _in_rt = rt.enter();
    let ours = tokio::net::UnixStream::from_std(ours).expect("registered");
    let conn = Connection::new(
        client,
        rx,
        shared.clone(),
        None,
        ours,
        BytesMut::from(input),
    );
    (conn, theirs)
}

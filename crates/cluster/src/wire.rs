//! The peer protocol's messages as this crate makes and reads them: its
//! limits, and conversions between the protobuf types and the directory's,
//! the membership's and the store's own.

use crate::directory::membership::MemberInfo;
use crate::directory::table::{Change, Entry, State};
use crate::pb;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{DeleteOutcome, ObjectInfo, ObjectState, StoreError};
use std::time::Duration;

/// Most ids one peer request may carry.
pub const MAX_IDS: usize = 1 << 16;

/// Most operations in one `Update` (the peer service refuses more).
pub const MAX_OPS: usize = 16_384;

/// The longest a single directory lookup waits on the owner; longer waits
/// are several lookups in a row.
pub const MAX_LOOKUP_WAIT: Duration = Duration::from_secs(10);

/// An error reply for the Python/Rust clients.
pub fn wire_error(code: wire::ErrorCode, message: String, id: Option<ObjectId>) -> wire::Error {
    wire::Error {
        code: code as i32,
        message,
        object_id: id.map(|i| i.0.to_vec()).unwrap_or_default(),
    }
}

/// A store's refusal as the clients hear it.
pub fn store_error(e: &StoreError) -> wire::Error {
    use wire::ErrorCode as C;
    let (code, id) = match e {
        StoreError::ObjectExists(id) => (C::ObjectExists, Some(id)),
        StoreError::ObjectNotFound(id) => (C::ObjectNotFound, Some(id)),
        StoreError::StoreFull { .. }
        | StoreError::SpillFull { .. }
        | StoreError::SpillFailed { .. } => (C::StoreFull, None),
        StoreError::NotCreator(id) => (C::NotCreator, Some(id)),
        StoreError::AlreadySealed(id) => (C::AlreadySealed, Some(id)),
        StoreError::NotHeld(id) | StoreError::OutsideLease { id, .. } => {
            (C::ProtocolViolation, Some(id))
        }
        StoreError::MetadataTooLarge { .. } => (C::TooLarge, None),
    };
    wire_error(code, e.to_string(), id.copied())
}

/// What a delete did, as the clients hear it.
pub fn delete_status(d: DeleteOutcome) -> i32 {
    (match d {
        DeleteOutcome::Deleted => wire::DeleteStatus::Deleted,
        DeleteOutcome::Deferred => wire::DeleteStatus::Deferred,
        DeleteOutcome::NotFound => wire::DeleteStatus::NotFound,
    }) as i32
}

/// A local object as `ListLocal` answers it.
pub fn listed(o: &ObjectInfo, cached: bool) -> pb::ListedObject {
    pb::ListedObject {
        cached,
        object_id: o.id.0.to_vec(),
        data_size: o.location.data_size,
        metadata_size: o.location.metadata_size,
        ref_count: o.ref_count,
        sealed: matches!(o.state, ObjectState::Sealed),
        create_time_us: o.create_time_us,
        construct_duration_us: o.construct_duration_us.unwrap_or(-1),
        delete_pending: o.delete_pending,
        spilled: o.spilled,
    }
}

/// A directory entry on the wire.
pub fn entry_pb(e: Option<&Entry>) -> pb::Entry {
    match e {
        None => pb::Entry::default(),
        // Deleted: reads as absent (a get waits for a new object).
        Some(e) if e.state == State::Deleted => pb::Entry::default(),
        Some(e) => pb::Entry {
            state: match e.state {
                State::Creating { .. } => pb::EntryState::Creating,
                State::Sealed => pb::EntryState::Sealed,
                State::Lost => pb::EntryState::Lost,
                State::Deleted => pb::EntryState::Absent,
            } as i32,
            holders: e.holders.iter().map(|h| h.to_string()).collect(),
            data_size: e.data_size,
            metadata_size: e.metadata_size,
        },
    }
}

/// A directory change from the wire (`None` for an unknown op).
pub fn change_of(op: &pb::Op) -> Option<Change> {
    let (data_size, metadata_size) = (op.data_size, op.metadata_size);
    match pb::OpKind::try_from(op.kind).ok()? {
        pb::OpKind::SealedPrimary => Some(Change::SealedPrimary {
            data_size,
            metadata_size,
            version: op.version,
        }),
        pb::OpKind::SealedCached => Some(Change::SealedCached {
            data_size,
            metadata_size,
        }),
        pb::OpKind::Dropped => Some(Change::Dropped),
        pb::OpKind::Aborted => Some(Change::Aborted),
        pb::OpKind::Unspecified => None,
    }
}

/// What a heartbeat says of a member.
pub fn member_of(m: Option<pb::Member>) -> MemberInfo {
    let m = m.unwrap_or_default();
    MemberInfo {
        addr: m.addr,
        data_addr: m.data_addr,
        incarnation: m.incarnation,
        capacity: m.capacity,
        used: m.used,
        objects: m.objects,
        directory_epoch: m.directory_epoch,
    }
}

/// A member, as a heartbeat says it.
pub fn member_pb(m: MemberInfo) -> pb::Member {
    pb::Member {
        addr: m.addr,
        data_addr: m.data_addr,
        incarnation: m.incarnation,
        capacity: m.capacity,
        used: m.used,
        objects: m.objects,
        directory_epoch: m.directory_epoch,
    }
}

/// The error a client hears when a member did not answer.
pub fn unavailable(what: &str, e: &tonic::Status) -> wire::Error {
    wire_error(
        wire::ErrorCode::ClusterUnavailable,
        format!(
            "{what}: cluster member unreachable ({}); retry shortly",
            e.message()
        ),
        None,
    )
}

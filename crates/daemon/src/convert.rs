//! Conversions between the state machine's types and the wire messages.

use ferroplasma_protocol::{pb, ObjectId};
use ferroplasma_store::{Event, EventKind, Location, ObjectInfo, ObjectState, Stats};

pub fn location(l: Location) -> pb::Location {
    pb::Location {
        arena_id: l.arena,
        offset: l.offset,
        data_size: l.data_size,
        metadata_size: l.metadata_size,
    }
}

// Store refusals and delete outcomes convert as the cluster's replies do.
pub use ferroplasma_cluster::wire::{delete_status, store_error as error};

pub fn info(i: &ObjectInfo) -> pb::ObjectInfo {
    pb::ObjectInfo {
        object_id: i.id.0.to_vec(),
        data_size: i.location.data_size,
        metadata_size: i.location.metadata_size,
        ref_count: i.ref_count,
        state: match i.state {
            ObjectState::Created { .. } => pb::ObjectState::Created,
            ObjectState::Sealed => pb::ObjectState::Sealed,
        } as i32,
        create_time_us: i.create_time_us,
        construct_duration_us: i.construct_duration_us.unwrap_or(-1),
        delete_pending: i.delete_pending,
        spilled: i.spilled,
        node: String::new(),
        cached: false,
    }
}

pub fn event(e: &Event) -> pb::Event {
    pb::Event {
        kind: match e.kind {
            EventKind::Sealed => pb::EventKind::SealedEvent,
            EventKind::Deleted => pb::EventKind::DeletedEvent,
        } as i32,
        object_id: e.id.0.to_vec(),
        data_size: e.data_size,
        metadata_size: e.metadata_size,
    }
}

pub fn stats(s: &Stats) -> pb::StatsReply {
    pb::StatsReply {
        capacity: s.capacity,
        used: s.used,
        objects: s.objects,
        sealed_objects: s.sealed_objects,
        clients: s.clients,
        evictions: s.evictions,
        evicted_bytes: s.evicted_bytes,
        largest_free_block: s.largest_free_block,
        free_blocks: s.free_blocks,
        fragmentation: s.fragmentation,
        referenced_objects: s.referenced_objects,
        spilled_objects: s.spilled_objects,
        spilled_bytes: s.spilled_bytes,
        spill_dir_bytes: s.spill_dir_bytes,
        spills: s.spills,
        restores: s.restores,
        evictable_bytes: s.evictable_bytes,
        awaited_objects: s.awaited_objects,
        // Not the state machine's: the connections fill it in.
        waiting_creates: 0,
    }
}

/// A member's health as a metric label.
pub fn health_name(health: i32) -> &'static str {
    match pb::MemberHealth::try_from(health) {
        Ok(pb::MemberHealth::ThisMember) => "this",
        Ok(pb::MemberHealth::Alive) => "alive",
        Ok(pb::MemberHealth::Dead) => "dead",
        Ok(pb::MemberHealth::Refused) => "refused",
        _ => "unknown",
    }
}

/// A page of a listing, a column per field (`cached` says which objects
/// are cached copies from other members).
pub fn page(rows: &[ObjectInfo], cached: impl Fn(&ObjectId) -> bool) -> pb::ListPage {
    let n = rows.len();
    let mut p = pb::ListPage {
        object_ids: Vec::with_capacity(n * ObjectId::LEN),
        data_size: Vec::with_capacity(n),
        metadata_size: Vec::with_capacity(n),
        ref_count: Vec::with_capacity(n),
        flags: Vec::with_capacity(n),
        create_time_us: Vec::with_capacity(n),
        construct_duration_us: Vec::with_capacity(n),
        ..Default::default()
    };
    for o in rows {
        let flag = |on: bool, f: pb::ListFlag| if on { f as u32 } else { 0 };
        p.object_ids.extend_from_slice(&o.id.0);
        p.data_size.push(o.location.data_size);
        p.metadata_size.push(o.location.metadata_size);
        p.ref_count.push(o.ref_count);
        p.flags.push(
            flag(o.state == ObjectState::Sealed, pb::ListFlag::ListSealed)
                | flag(o.delete_pending, pb::ListFlag::ListDeletePending)
                | flag(o.spilled, pb::ListFlag::ListSpilled)
                | flag(cached(&o.id), pb::ListFlag::ListCached),
        );
        p.create_time_us.push(o.create_time_us);
        p.construct_duration_us
            .push(o.construct_duration_us.unwrap_or(-1));
    }
    p
}

/// The rows of a cluster-wide listing (each naming its member) as one
/// page.
pub fn page_of_infos(rows: Vec<pb::ObjectInfo>) -> pb::ListPage {
    let mut p = pb::ListPage::default();
    let mut members: std::collections::HashMap<String, u32> = Default::default();
    for o in rows {
        let flag = |on: bool, f: pb::ListFlag| if on { f as u32 } else { 0 };
        p.object_ids.extend_from_slice(&o.object_id);
        p.data_size.push(o.data_size);
        p.metadata_size.push(o.metadata_size);
        p.ref_count.push(o.ref_count);
        p.flags.push(
            flag(
                o.state == pb::ObjectState::Sealed as i32,
                pb::ListFlag::ListSealed,
            ) | flag(o.delete_pending, pb::ListFlag::ListDeletePending)
                | flag(o.spilled, pb::ListFlag::ListSpilled)
                | flag(o.cached, pb::ListFlag::ListCached),
        );
        p.create_time_us.push(o.create_time_us);
        p.construct_duration_us.push(o.construct_duration_us);
        let next = members.len() as u32;
        let m = *members.entry(o.node).or_insert_with_key(|node| {
            p.members.push(node.clone());
            next
        });
        p.member.push(m);
    }
    p.total = p.flags.len() as u64;
    p
}

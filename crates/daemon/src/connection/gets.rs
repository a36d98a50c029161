//! Gets: answered at once when every object is there, else parked until
//! the objects are sealed (here or, in a cluster, pulled from a member) or
//! the deadline passes.

use super::{parse_ids, store_refusal, Connection, Refusal};
use crate::convert;
use ferroplasma_protocol::pb::{self, reply};
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::Location;
use std::time::Duration;
use tokio::time::Instant;

/// A get still waiting for some of its objects.
#[derive(Debug)]
pub(super) struct PendingGet {
    request_id: u64,
    ids: Vec<ObjectId>,
    found: Vec<Option<Location>>,
    pub(super) deadline: Option<Instant>,
}

impl PendingGet {
    pub(super) fn complete(&self) -> bool {
        self.found.iter().all(Option::is_some)
    }

    pub(super) fn wants(&self, id: &ObjectId) -> bool {
        self.ids
            .iter()
            .zip(&self.found)
            .any(|(i, f)| i == id && f.is_none())
    }
}

impl Connection {
    pub(super) fn get(&mut self, rid: u64, g: pb::Get) -> Result<Option<reply::Body>, Refusal> {
        let ids = parse_ids(&g.object_ids)?;
        let mut sh = self.shared.lock();
        for id in &ids {
            sh.unspill(*id).map_err(store_refusal)?;
        }
        let found: Vec<Option<Location>> = ids
            .iter()
            .map(|id| sh.store.get(self.client, *id))
            .collect();
        let pending = PendingGet {
            request_id: rid,
            ids,
            found,
            deadline: (g.timeout_ms > 0)
                .then(|| Instant::now() + Duration::from_millis(g.timeout_ms as u64)),
        };
        if pending.complete() || g.timeout_ms == 0 {
            return Ok(Some(get_reply(&pending)));
        }
        let mut remote = Vec::new();
        for (id, f) in pending.ids.iter().zip(&pending.found) {
            if f.is_none() {
                sh.store.watch(self.client, *id);
                if !sh.store.exists(id) {
                    remote.push(*id);
                }
            }
        }
        drop(sh);
        if let Some(cl) = &self.cluster {
            for id in remote {
                cl.want(id, pending.deadline, self.done_tx.clone());
            }
        }
        self.pending.push(pending);
        Ok(None)
    }

    /// `id` was sealed: gets waiting for it take a reference now; those
    /// complete are answered.
    pub(super) fn on_sealed(&mut self, id: ObjectId) {
        let mut sh = self.shared.lock();
        let mut still_missing = false;
        for p in &mut self.pending {
            for (i, f) in p.ids.iter().zip(p.found.iter_mut()) {
                if *i == id && f.is_none() {
                    *f = sh.store.get(self.client, id);
                    still_missing |= f.is_none();
                }
            }
        }
        // Evicted or deleted again before we got to it: keep waiting.
        if still_missing {
            sh.store.watch(self.client, id);
        }
        drop(sh);
        self.answer_where(|p, _| p.complete(), Instant::now());
    }

    pub(super) fn expire(&mut self, now: Instant) {
        self.answer_where(|p, now| p.deadline.is_some_and(|d| d <= now), now);
    }

    /// Answers and removes the pending gets `done` selects; withdraws the
    /// watches no remaining get needs.
    pub(super) fn answer_where(
        &mut self,
        done: impl Fn(&PendingGet, Instant) -> bool,
        now: Instant,
    ) {
        let (finished, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| done(p, now));
        self.pending = rest;
        for p in &finished {
            for (id, f) in p.ids.iter().zip(&p.found) {
                if f.is_none() && !self.pending.iter().any(|q| q.wants(id)) {
                    self.shared.lock().store.unwatch(self.client, *id);
                }
            }
            self.push_reply(p.request_id, get_reply(p));
        }
    }

    /// Answers every pending get that waits for `id` with `error`, giving
    /// back the references those gets had taken.
    pub(super) fn fail_gets(&mut self, id: ObjectId, error: pb::Error) {
        let (failed, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.wants(&id));
        self.pending = rest;
        for p in failed {
            {
                let mut sh = self.shared.lock();
                for (i, f) in p.ids.iter().zip(&p.found) {
                    match f {
                        Some(_) => {
                            if let Ok(fx) = sh.store.release(self.client, *i) {
                                sh.deliver(fx);
                            }
                        }
                        None if !self.pending.iter().any(|q| q.wants(i)) => {
                            sh.store.unwatch(self.client, *i)
                        }
                        None => {}
                    }
                }
            }
            self.push_reply(p.request_id, reply::Body::Error(error.clone()));
        }
    }
}

fn get_reply(p: &PendingGet) -> reply::Body {
    reply::Body::Get(pb::GetReply {
        results: p
            .found
            .iter()
            .map(|f| pb::GetResult {
                location: f.map(convert::location),
            })
            .collect(),
    })
}

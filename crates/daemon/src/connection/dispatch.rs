//! Each request, answered now or handed to the part that finishes it later.

use super::continuations::ClaimOf;
use super::creates::check_inline;
use super::{parse_id, parse_ids, refuse, store_refusal, Connection, Refusal};
use crate::convert;
use crate::shared::now_us;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_store::Effects;

impl Connection {
    pub(super) fn dispatch(
        &mut self,
        rid: u64,
        body: request::Body,
    ) -> Result<Option<reply::Body>, Refusal> {
        use request::Body as B;
        let client = self.client;
        let ok = || Some(reply::Body::Ok(pb::Ok {}));
        if self.read_only {
            let what = match &body {
                // A reader's objects could push the owner's out (eviction)
                // or take ids the owner's programs expect: readers only read.
                B::Create(_) | B::CreateAndSeal(_) | B::Lease(_) | B::Settle(_) | B::NewIds(_) => {
                    Some("create objects")
                }
                B::Delete(_) => Some("delete objects"),
                B::Evict(_) => Some("evict objects"),
                _ => None,
            };
            if let Some(what) = what {
                return Err(refuse(
                    pb::ErrorCode::PermissionDenied,
                    format!(
                        "this store lets your user read but not {what}: only the store's own \
                         user (and root) may (docs/security.md)"
                    ),
                ));
            }
        }
        match body {
            B::Connect(_) => Err(refuse(
                pb::ErrorCode::ProtocolViolation,
                "already connected".into(),
            )),
            B::AttachTable(_) => Err(refuse(
                pb::ErrorCode::ProtocolViolation,
                "AttachTable is the first and only request of a connection of its own".into(),
            )),
            B::Create(mut c) => {
                let id = parse_id(&c.object_id)?;
                check_inline("metadata", c.metadata.len())?;
                if !c.metadata.is_empty() {
                    if c.metadata_size != 0 {
                        return Err(refuse(
                            pb::ErrorCode::InvalidRequest,
                            "Create gives both metadata and metadata_size: send the bytes \
                             (up to the inline limit) or only their size"
                                .into(),
                        ));
                    }
                    c.metadata_size = c.metadata.len() as u64;
                }
                match self.claim_of(&id) {
                    ClaimOf::Needed => {
                        self.start_claim(rid, id, B::Create(c));
                        Ok(None)
                    }
                    claim => {
                        let r = self.create(rid, id, c, claim == ClaimOf::Handed);
                        if r.is_err() && claim == ClaimOf::Handed {
                            self.unclaim(id);
                        }
                        r
                    }
                }
            }
            B::CreateAndSeal(c) => {
                let id = parse_id(&c.object_id)?;
                check_inline("data", c.data.len())?;
                check_inline("metadata", c.metadata.len())?;
                match self.claim_of(&id) {
                    ClaimOf::Needed => {
                        self.start_claim(rid, id, B::CreateAndSeal(c));
                        Ok(None)
                    }
                    claim => {
                        let r = self.create_and_seal(rid, id, c, claim == ClaimOf::Handed);
                        if r.is_err() && claim == ClaimOf::Handed {
                            self.unclaim(id);
                        }
                        r
                    }
                }
            }
            B::Seal(s) => {
                let id = parse_id(&s.object_id)?;
                let mut sh = self.shared.lock();
                let fx = sh.store.seal(client, id, now_us()).map_err(store_refusal)?;
                sh.deliver(fx);
                Ok(ok())
            }
            B::Abort(a) => {
                let id = parse_id(&a.object_id)?;
                let mut sh = self.shared.lock();
                let fx = sh.store.abort(client, id).map_err(store_refusal)?;
                sh.deliver(fx);
                Ok(ok())
            }
            B::Lease(l) => {
                use crate::fast_writes::GrantError;
                let mut sh = self.shared.lock();
                match sh.grant(client, l.size, &l.ended, l.bumps_top) {
                    Ok(g) => Ok(Some(reply::Body::Lease(pb::LeaseReply {
                        offset: g.lease.map_or(0, |l| l.0),
                        size: g.lease.map_or(0, |l| l.1),
                        area_offset: g.area_offset,
                        ring_offset: g.ring_offset,
                        tag: g.tag,
                    }))),
                    Err(GrantError::Store(e)) => Err(store_refusal(e)),
                    Err(GrantError::Off) => Err(refuse(
                        pb::ErrorCode::InvalidRequest,
                        "this store does not offer writes without a round trip (it has no \
                         shared table, is under 32 MiB, or runs with --fast-writes off): \
                         create with Create"
                            .into(),
                    )),
                    Err(GrantError::TooMany) => Err(refuse(
                        pb::ErrorCode::TooLarge,
                        format!(
                            "this connection holds {} leases already: end some (Lease.ended) \
                             before asking for another",
                            crate::fast_writes::MAX_LEASES
                        ),
                    )),
                    Err(GrantError::Broken) => Err(refuse(
                        pb::ErrorCode::ProtocolViolation,
                        "this connection broke the protocol of writes without a round trip \
                         before; create with Create"
                            .into(),
                    )),
                }
            }
            B::Settle(s) => {
                let id = parse_id(&s.object_id)?;
                let mut sh = self.shared.lock();
                sh.settle(client, id).map_err(store_refusal)?;
                Ok(ok())
            }
            B::NewIds(n) => self.new_ids(rid, n.count),
            B::Get(g) => self.get(rid, g),
            B::Release(_) => unreachable!("handled before dispatch"),
            B::Contains(c) if c.cluster && self.cluster.is_some() => {
                let ids = parse_ids(&c.object_ids)?;
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let present = cl.contains(ids).await?;
                    Ok(reply::Body::Contains(pb::ContainsReply { present }))
                });
                Ok(None)
            }
            B::Contains(c) => {
                let ids = parse_ids(&c.object_ids)?;
                let sh = self.shared.lock();
                let present = if c.deleting {
                    ids.iter()
                        .map(|id| sh.store.contains_deleting(id))
                        .collect()
                } else {
                    ids.iter().map(|id| sh.store.contains(id)).collect()
                };
                Ok(Some(reply::Body::Contains(pb::ContainsReply { present })))
            }
            B::Delete(d) if self.cluster.is_some() => {
                let ids = parse_ids(&d.object_ids)?;
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let status = cl.delete(ids).await?;
                    Ok(reply::Body::Delete(pb::DeleteReply { status }))
                });
                Ok(None)
            }
            B::Delete(d) => {
                let ids = parse_ids(&d.object_ids)?;
                let mut sh = self.shared.lock();
                let mut status = Vec::with_capacity(ids.len());
                // One delivery for the batch: waking the space waiters and
                // walking the outboxes once, not once per id.
                let mut all = Effects::default();
                for id in ids {
                    let (outcome, fx) = sh.store.delete(id);
                    all.extend(fx);
                    status.push(convert::delete_status(outcome));
                }
                sh.deliver(all);
                Ok(Some(reply::Body::Delete(pb::DeleteReply { status })))
            }
            B::List(l) if l.cluster && self.cluster.is_some() => {
                let cl = self.cluster.clone().expect("checked");
                self.spawn_reply(rid, async move {
                    let objects = cl.list().await;
                    Ok(match l.page_size {
                        0 => reply::Body::List(pb::ListReply { objects }),
                        _ => reply::Body::ListPage(convert::page_of_infos(objects)),
                    })
                });
                Ok(None)
            }
            B::List(l) if l.page_size > 0 => self.list_page(rid, l.page_size, l.cursor),
            B::List(_) => {
                let sh = self.shared.lock();
                let cluster = self.cluster.as_deref();
                let objects = sh
                    .store
                    .list()
                    .iter()
                    .map(|o| pb::ObjectInfo {
                        cached: cluster.is_some_and(|c| c.is_cached(&o.id)),
                        ..convert::info(o)
                    })
                    .collect();
                Ok(Some(reply::Body::List(pb::ListReply { objects })))
            }
            B::ClusterStatus(_) => Ok(Some(reply::Body::ClusterStatus(match &self.cluster {
                Some(c) => c.status(),
                None => pb::ClusterStatusReply::default(),
            }))),
            B::Evict(e) => {
                let mut sh = self.shared.lock();
                let (freed, count, fx) = sh.store.evict(e.num_bytes);
                sh.deliver(fx);
                Ok(Some(reply::Body::Evict(pb::EvictReply {
                    freed_bytes: freed,
                    objects_evicted: count,
                })))
            }
            B::Subscribe(_) if !self.gets.is_empty() || !self.creates.is_empty() => Err(refuse(
                pb::ErrorCode::ProtocolViolation,
                "Subscribe on a connection with requests still waiting: subscribe on a \
                 connection of its own"
                    .into(),
            )),
            B::Subscribe(s) => {
                let existing = {
                    let mut sh = self.shared.lock();
                    sh.store.subscribe(client);
                    if s.existing {
                        sh.store.sealed_events()
                    } else {
                        Vec::new()
                    }
                };
                self.subscribed = Some(s.framing());
                // The reply first, then the objects already there, then
                // (through the notice queue) everything that happens next.
                self.push_reply(rid, reply::Body::Ok(pb::Ok {}));
                for e in &existing {
                    self.push_event(e);
                }
                Ok(None)
            }
            B::Stats(_) => {
                let (mut stats, scan) = {
                    let sh = self.shared.lock();
                    let mut stats = convert::stats(&sh.store.stats());
                    stats.waiting_creates = sh.waiting_creates as u64;
                    (stats, sh.table.as_ref().map(|t| t.hold_scan()))
                };
                let Some(scan) = scan else {
                    return Ok(Some(reply::Body::Stats(stats)));
                };
                // Objects held through the table only count as referenced
                // too: finding them is a pass over every client's holds,
                // done on a blocking thread while the store serves others.
                let shared = self.shared.clone();
                self.spawn_reply(rid, async move {
                    let (scan, held) = tokio::task::spawn_blocking(move || {
                        let held = scan.held_slots();
                        (Some(scan), held)
                    })
                    .await
                    .unwrap_or_default();
                    let sh = shared.lock();
                    if let (Some(t), Some(scan)) = (&sh.table, scan) {
                        let ids = t.objects_in(&scan, &held);
                        stats.referenced_objects += sh.store.unreferenced_among(&ids);
                        // Held, so not evictable while they are.
                        stats.evictable_bytes = stats
                            .evictable_bytes
                            .saturating_sub(sh.store.evictable_bytes_among(&ids));
                    }
                    Ok(reply::Body::Stats(stats))
                });
                Ok(None)
            }
        }
    }
}

//! The heartbeat loop: every interval, tell each known member who this one
//! is and whom it knows; record who answered; suspect the members silent
//! for longer than the peer timeout, and declare dead those still silent a
//! heartbeat interval later.
//!
//! It runs on a thread of its own, with channels of its own, and does
//! nothing slow there: what it says about this member is refreshed on the
//! cluster's thread ([`refresh_info`]), and what a death or a join means
//! for the directory is done there too ([`Cluster::apply`]).
//!
//! Joining is the same mechanism: `--join HOST:PORT` makes that member
//! known, its answer names the others, and their answers name this one.

use crate::cluster::Cluster;
use crate::pb;
use crate::peers::token;
use crate::sync::lock;
use crate::wire::{member_of, member_pb};
use std::sync::Arc;

/// Runs until the task is dropped.
pub async fn run(cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(cluster.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let known = lock(&cluster.membership).known();
        let msg = pb::HeartbeatRequest {
            from: Some(member_pb(cluster.info())),
            known: cluster.known_with_me(),
        };
        for addr in known {
            let (c, msg) = (cluster.clone(), msg.clone());
            tokio::spawn(async move {
                match c.hb_peers.heartbeat(&addr, msg).await {
                    Ok(r) => c.heard(member_of(r.from), &r.known),
                    Err(e) if e.code() == tonic::Code::Unauthenticated => {
                        lock(&c.membership).refused(&addr);
                        token::refused_heartbeat(&addr);
                    }
                    Err(e) => tracing::trace!(member = %addr, error = %e, "no heartbeat answer"),
                }
            });
        }
        let changes = lock(&cluster.membership).sweep(tokio::time::Instant::now().into_std());
        for d in &changes.died {
            cluster.peers.forget(d);
            cluster.hb_peers.forget(d);
        }
        cluster.changed(changes);
    }
}

/// Refreshes what heartbeats say about this member, every interval (on
/// the cluster's thread: it asks the store).
pub async fn refresh_info(cluster: Arc<Cluster>) {
    let mut tick = tokio::time::interval(cluster.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        cluster.refresh_info();
    }
}

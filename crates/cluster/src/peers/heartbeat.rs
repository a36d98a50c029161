//! The heartbeat loop: every interval, tell each known member who this one
//! is and whom it knows; record who answered; declare dead the members
//! silent for longer than the peer timeout.
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
            from: Some(member_pb(cluster.my_info())),
            known: cluster.known_with_me(),
        };
        for addr in known {
            let (c, msg) = (cluster.clone(), msg.clone());
            tokio::spawn(async move {
                match c.peers.heartbeat(&addr, msg).await {
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
        }
        cluster.apply(changes);
    }
}

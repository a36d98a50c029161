//! Claiming an id cluster-wide for a create: asked of the id's owner and
//! backup (calling side), answered from this member's directory (answering
//! side).

use crate::cluster::Cluster;
use crate::directory::table::Claim;
#[cfg(doc)]
use crate::directory::table::Directory;
use crate::pb;
use crate::sync::lock;
use crate::wire::{unavailable, wire_error};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Cluster {
    async fn claim_at(
        &self,
        target: &str,
        id: ObjectId,
        ring: u64,
        rejoin: bool,
    ) -> Result<bool, tonic::Status> {
        if target == self.me {
            return self.claim_local(id, &self.me, ring, rejoin);
        }
        let msg = pb::ClaimRequest {
            node: self.me.clone(),
            object_ids: id.0.to_vec(),
            ring,
            rejoin,
        };
        let mut c = self.peers.get(target)?;
        let r = c.claim(self.peers.request(msg, Duration::ZERO)).await?;
        Ok(r.into_inner().granted.first().copied().unwrap_or(false))
    }

    /// Reserves `id` cluster-wide for an object this member creates: false
    /// when it is being created or sealed elsewhere.
    pub async fn claim(&self, id: ObjectId) -> Result<bool, wire::Error> {
        // News of this id still on its way to the directory (an old copy
        // dropped, a create aborted) goes first: arriving after the claim,
        // it would cancel it. (Bounded: an owner that takes no update is
        // declared dead within the peer timeout, and the agent moves on.)
        // A member that has just started does not know the ring yet: alone
        // in it, it would grant itself any id.
        while !self.settled() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let no_quorum = || {
            wire_error(
                wire::ErrorCode::ClusterUnavailable,
                "this member sees no majority of the cluster alive (it may be cut off): \
                 new ids cannot be claimed until it does; retry shortly"
                    .into(),
                Some(id),
            )
        };
        if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
            return Err(no_quorum());
        }
        let give_up = tokio::time::Instant::now() + 3 * self.peers.timeout();
        loop {
            let sent = self.updates_sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            if !self.store.is_update_pending(&id) || tokio::time::Instant::now() >= give_up {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), sent).await;
        }
        // Just after a membership change the directory members answer
        // nothing until the ring is agreed on and rebuilt: ask again until
        // they do (or the wait is over).
        let mut pause = Duration::from_millis(10);
        let mut was_granted = false;
        let answer = loop {
            // Asked again: the members may have died around this one (it
            // was cut off), leaving it alone in its ring.
            if !lock(&self.membership).has_quorum(std::time::Instant::now()) {
                break Err(no_quorum());
            }
            match self.claim_unordered(id, false).await {
                Ok((true, ring)) => {
                    // Granted in `ring`. If the ring changed meanwhile, the
                    // re-registration may have missed this claim (the
                    // object is not in the store yet): claim again in the
                    // new ring. From here on, re-registrations re-claim it,
                    // until its object is sealed or aborted.
                    lock(&self.granted).insert(id);
                    was_granted = true;
                    if lock(&self.directory).ring() == ring {
                        return Ok(true);
                    }
                }
                Ok((false, _)) => break Ok(false),
                Err(e) if tokio::time::Instant::now() + pause >= give_up => break Err(e),
                Err(_) => {}
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        };
        if was_granted {
            // Granted in an earlier ring, refused (or unanswered) now: take
            // it back wherever it is still recorded.
            // (Unless a create of this id on another connection here has
            // landed meanwhile: the claim is that object's.)
            lock(&self.granted).remove(&id);
            self.store.give_up_claim(id);
        }
        answer
    }

    /// One round of [`Cluster::claim`] (no waiting for this id's news to be
    /// sent; the agent uses it to re-claim, `rejoin`, what it creates after
    /// a ring change). Returns the answer and the ring it was asked in.
    pub(crate) async fn claim_unordered(
        &self,
        id: ObjectId,
        rejoin: bool,
    ) -> Result<(bool, u64), wire::Error> {
        self.counters.claims.fetch_add(1, Ordering::Relaxed);
        let (t, ring) = {
            let d = lock(&self.directory);
            (self.targets(&id), d.ring())
        };
        let (owner, backup) = tokio::join!(self.claim_at(&t[0], id, ring, rejoin), async {
            match t.get(1) {
                Some(b) => Some(self.claim_at(b, id, ring, rejoin).await),
                None => None,
            }
        });
        let answers = [Some(&owner), backup.as_ref()].map(|a| match a {
            Some(Ok(true)) => Answer::Granted,
            Some(Ok(false)) => Answer::Refused,
            Some(Err(_)) => Answer::Silent,
            None => Answer::NoBackup,
        });
        let (granted, undo) = claim_verdict(answers);
        tracing::debug!(%id, owner = %t[0], ?answers, ?granted, rejoin, "claim");
        for (i, target) in t.iter().take(2).enumerate() {
            if undo[i] {
                // The other refused: take back this grant, or the id stays
                // reserved there for an object that is never created.
                let op = pb::Op {
                    kind: pb::OpKind::Aborted as i32,
                    object_id: id.0.to_vec(),
                    ..Default::default()
                };
                if let Err(e) = self.update_at(target, &self.me, vec![op], false, 0).await {
                    tracing::debug!(member = %target, error = %e, "could not take back a claim");
                }
            }
        }
        match (granted, owner, backup) {
            (Some(g), _, _) => Ok((g, ring)),
            (None, Err(e), _) | (None, _, Some(Err(e))) => Err(unavailable("claiming the id", &e)),
            (None, Ok(_), _) => Ok((false, ring)), // not reached: an answer decides
        }
    }

    /// Answers a claim of `id` by `node` made in ring `ring` from this
    /// member's directory (see [`Directory::claim_in_ring`]): a
    /// grant only when both see the same ring and every member of it has
    /// re-registered since it formed; otherwise no answer (`Unavailable`),
    /// and the claimant asks again.
    pub(crate) fn claim_local(
        &self,
        id: ObjectId,
        node: &str,
        ring: u64,
        rejoin: bool,
    ) -> Result<bool, tonic::Status> {
        if !rejoin && !self.settled() {
            return Err(tonic::Status::unavailable(
                "this member has just started and has not met every member yet",
            ));
        }
        let mut d = lock(&self.directory);
        let before = tracing::enabled!(tracing::Level::TRACE)
            .then(|| d.lookup(&id).map(|e| e.state.clone()));
        let answer = d.claim_in_ring(id, node, ring, rejoin);
        tracing::trace!(%id, node, ?before, ?answer, "claim answered");
        match answer {
            Claim::Granted => Ok(true),
            Claim::Refused => Ok(false),
            Claim::NotNow(why) => Err(tonic::Status::unavailable(why)),
        }
    }
}

/// One directory member's answer to a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Granted,
    Refused,
    /// Unreachable, or no answer yet (see `claim_local`).
    Silent,
    /// A ring of one member: no backup to ask.
    NoBackup,
}

/// Combines the owner's and the backup's answers to a claim: refused if
/// either refused (one id never names two objects), granted only if both
/// granted (or the ring has one member), `None` if one of them did not
/// answer: it may be alive on the far side of a cut, granting the id to
/// someone else, so the claimant asks again until it answers or is declared
/// dead (and the ring changes). The second value says where a grant must
/// be taken back.
fn claim_verdict(answers: [Answer; 2]) -> (Option<bool>, [bool; 2]) {
    let grants = answers.map(|a| a == Answer::Granted);
    if answers.contains(&Answer::Refused) {
        (Some(false), grants)
    } else if answers.contains(&Answer::Silent) {
        (None, grants)
    } else {
        (Some(true), [false; 2])
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_verdict, Answer::*};

    #[test]
    fn a_claim_is_granted_only_when_both_directory_members_grant_it() {
        assert_eq!(claim_verdict([Granted, Granted]), (Some(true), [false; 2]));
        assert_eq!(claim_verdict([Granted, NoBackup]), (Some(true), [false; 2]));
        // A silent member may be granting the id on the far side of a cut:
        // no verdict (ask again), and the grant given is taken back.
        assert_eq!(claim_verdict([Granted, Silent]), (None, [true, false]));
        assert_eq!(claim_verdict([Silent, Granted]), (None, [false, true]));
        // The owner's grant no longer wins over the backup's refusal, and
        // the backup's grant is taken back when the owner refuses.
        assert_eq!(
            claim_verdict([Granted, Refused]),
            (Some(false), [true, false])
        );
        assert_eq!(
            claim_verdict([Refused, Granted]),
            (Some(false), [false, true])
        );
        assert_eq!(claim_verdict([Refused, Silent]), (Some(false), [false; 2]));
        assert_eq!(claim_verdict([Silent, Silent]), (None, [false; 2]));
    }
}

//! The shared state's side of spilling: when a create or a restore needs
//! room, which objects to write out (the store's plan) and the blocking
//! threads that write and read segment files (crate::spill), the waits of
//! callers that cannot park while segments are written, and a spill
//! directory removed under the store.

use super::{Locked, Shared, SharedRef};
use crate::spill::SpillDir;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::StoreError;

/// What [`Shared::request_restore`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// The object is not spilled (in memory, or absent): get it now.
    NotSpilled,
    /// It is on its way back: wait for it (watch it).
    Underway,
}

impl SharedRef {
    /// Runs `f` on the locked state; while it fails for lack of room and
    /// spill segments are being written (they will free memory), waits for
    /// them and tries again. For the callers that cannot park: restores of
    /// spilled objects and copies pulled from other members.
    pub fn with_room<'a, T>(
        &'a self,
        mut sh: Locked<'a>,
        mut f: impl FnMut(&mut Shared) -> Result<T, StoreError>,
    ) -> (Locked<'a>, Result<T, StoreError>) {
        loop {
            match f(&mut sh) {
                Err(StoreError::StoreFull { .. } | StoreError::SpillFull { .. })
                    if sh.spills_in_flight > 0 =>
                {
                    sh = self.wait(sh);
                }
                r => return (sh, r),
            }
        }
    }

    /// Waits (blocking the thread) while `id` is being brought back from
    /// the spill directory by [`Shared::request_restore`].
    pub fn wait_restored<'a>(&'a self, mut sh: Locked<'a>, id: ObjectId) -> Locked<'a> {
        while sh.store.is_restoring(&id) {
            sh = self.wait(sh);
        }
        sh
    }
}

impl Shared {
    /// With a spill directory: writes out the least recently used objects
    /// needed to make an allocation of this size fit (one segment file for
    /// the batch), here and now. Without one, or when it fits, does nothing.
    /// (Creates use [`Shared::start_spill`], which does not block.)
    pub fn spill_for(&mut self, data_size: u64, metadata_size: u64) -> Result<(), StoreError> {
        if metadata_size > ferroplasma_store::MAX_METADATA {
            // Refused by the create anyway: nothing is spilled for it.
            return Err(StoreError::MetadataTooLarge {
                size: metadata_size,
                limit: ferroplasma_store::MAX_METADATA,
            });
        }
        let Some(dir) = self.spill.clone() else {
            return Ok(());
        };
        self.spill_refusal(&dir, data_size, metadata_size)?;
        self.store.refresh_recency();
        let plan = self.store.spill_plan(data_size, metadata_size);
        if plan.is_empty() {
            return Ok(());
        }
        let segment = self.store.begin_spill(&plan)?;
        let generation = dir.generation();
        let written = dir.write_segment(segment, &self.arena, &plan);
        self.end_spill(segment, &plan, written, generation)
    }

    /// With a spill directory, when an allocation of this size does not
    /// fit: starts writing out the objects that make it fit, on a blocking
    /// thread, and returns true; the memory is freed (and waiting creates
    /// are woken) when the write is done. Meanwhile the victims stay
    /// readable and the store serves everyone else.
    pub fn start_spill(
        &mut self,
        me: &SharedRef,
        data_size: u64,
        metadata_size: u64,
    ) -> Result<bool, StoreError> {
        let Some(dir) = self.spill.clone() else {
            return Ok(false);
        };
        self.spill_refusal(&dir, data_size, metadata_size)?;
        self.store.refresh_recency();
        let plan = self.store.spill_plan(data_size, metadata_size);
        if plan.is_empty() {
            return Ok(false);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.spill_for(data_size, metadata_size)?;
            return Ok(false);
        };
        let segment = self.store.begin_spill(&plan)?;
        self.spills_in_flight += 1;
        let (me, arena) = (me.clone(), self.arena.clone());
        // Taken here, under the lock: a removal noticed from now on makes
        // the spill count as failed.
        let generation = dir.generation();
        rt.spawn_blocking(move || {
            let written = dir.write_segment(segment, &arena, &plan);
            let mut sh = me.lock();
            sh.spills_in_flight -= 1;
            sh.spills_finished += 1;
            let _ = sh.end_spill(segment, &plan, written, generation);
            sh.retry_restores(&me);
            // Waiting creates look again even if the write failed.
            sh.space.notify_waiters();
            drop(sh);
            me.wake_blocked();
        });
        Ok(true)
    }

    /// Refuses a spill at once while the spill directory is failing (a
    /// write failed less than a second ago): creates that need room get a
    /// clear error instead of trying again and again.
    fn spill_refusal(&mut self, dir: &SpillDir, data: u64, meta: u64) -> Result<(), StoreError> {
        self.check_spill_dir();
        match dir.refusal() {
            None => Ok(()),
            Some(reason) => Err(StoreError::SpillFailed {
                requested: data.saturating_add(meta),
                reason,
            }),
        }
    }

    /// Whether the spill directory was removed under the store: if so, the
    /// objects spilled into it are dropped and reported lost (once, in the
    /// log), so that none reads as present but unreadable, and spilling
    /// goes on in a new directory. Cheap (one `fstat`): called before every
    /// spill, after a failed read, and once a second by the server.
    pub fn check_spill_dir(&mut self) {
        let Some(dir) = self.spill.clone() else {
            return;
        };
        if !dir.vanished() {
            return;
        }
        let (objects, bytes, fx) = self.store.forget_all_spilled();
        if objects > 0 {
            tracing::error!(
                objects,
                bytes,
                "the spill directory was removed under the store: the objects spilled into it \
                 are lost (they read as absent)"
            );
        }
        self.deliver(fx);
    }

    /// Completes a spill whose segment was written (or not), begun when the
    /// spill directory was at `generation`: one removed meanwhile took the
    /// segment with it, so the spill counts as failed and its objects stay
    /// in memory.
    fn end_spill(
        &mut self,
        segment: u64,
        plan: &[ferroplasma_store::SpillVictim],
        written: std::io::Result<Vec<u64>>,
        generation: u64,
    ) -> Result<(), StoreError> {
        let bytes: u64 = plan.iter().map(|v| v.len).sum();
        self.check_spill_dir();
        let moved = self
            .spill
            .as_ref()
            .is_some_and(|d| d.generation() != generation);
        let written = match written {
            Ok(_) if moved => Err(std::io::Error::other(
                "the spill directory was removed while the segment was written",
            )),
            w => w,
        };
        match written {
            Ok(offsets) => {
                let fx = self.store.finish_spill(segment, plan, &offsets);
                tracing::debug!(segment, objects = plan.len(), bytes, "spilled");
                self.deliver(fx);
                Ok(())
            }
            Err(e) => {
                // The spill directory logs the failure (once).
                tracing::debug!(error = %e, bytes, "spilling failed; the create is refused");
                let fx = self.store.abort_spill(plan);
                self.deliver(fx);
                Err(StoreError::SpillFailed {
                    requested: bytes,
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Brings `id` back into memory now if it is spilled (spilling others
    /// to make room, here and now). A spilled object whose file cannot be
    /// read is dropped and logged: it then reads as absent, never as wrong
    /// bytes. For callers that cannot wait for [`Shared::request_restore`]:
    /// those off the runtime thread (cluster serving) and tests.
    pub fn unspill(&mut self, id: ObjectId) -> Result<(), StoreError> {
        let Some((data, meta)) = self.store.spilled_sizes(&id) else {
            return Ok(());
        };
        self.spill_for(data, meta)?;
        let dir = self
            .spill
            .clone()
            .expect("spilled objects imply a spill dir");
        let arena = self.arena.clone();
        let (loc, at, mut fx) = self.store.begin_restore(id)?;
        // Only after the read may the segment file go (fx may name it).
        let dead = std::mem::take(&mut fx.dead_segments);
        self.deliver(fx);
        let read = dir.read_into(at, &arena, loc.offset);
        self.end_restore(id, read, dead);
        Ok(())
    }

    /// Starts bringing `id` back into memory if it is spilled, without
    /// blocking: its bytes are read on a blocking thread, and when no room
    /// can be had now but spills under way will make some, it waits for
    /// them. Meanwhile gets of it wait (watch it): when it is back, each
    /// watcher is handed a reference ([`Notice::Restored`]); when it cannot
    /// come back, they are told with a [`Notice::Sealed`], and asking again
    /// gives the error.
    ///
    /// `Err` when it cannot come back at all (memory full of objects in use,
    /// or the spill directory full). Outside a runtime (tests), restores
    /// here and now.
    ///
    /// [`Notice::Restored`]: ferroplasma_store::Notice::Restored
    /// [`Notice::Sealed`]: ferroplasma_store::Notice::Sealed
    pub fn request_restore(&mut self, me: &SharedRef, id: ObjectId) -> Result<Restore, StoreError> {
        if self.store.is_restoring(&id) || self.restores_waiting.contains(&id) {
            return Ok(Restore::Underway);
        }
        let Some((data, meta)) = self.store.spilled_sizes(&id) else {
            return Ok(Restore::NotSpilled);
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.unspill(id)?;
            return Ok(Restore::NotSpilled);
        };
        match self.store.begin_restore(id) {
            Ok((loc, at, mut fx)) => {
                let dead = std::mem::take(&mut fx.dead_segments);
                self.deliver(fx);
                let dir = self
                    .spill
                    .clone()
                    .expect("spilled objects imply a spill dir");
                let (me, arena) = (me.clone(), self.arena.clone());
                rt.spawn_blocking(move || {
                    let read = dir.read_into(at, &arena, loc.offset);
                    me.lock().end_restore(id, read, dead);
                    me.wake_blocked();
                });
                Ok(Restore::Underway)
            }
            Err(StoreError::StoreFull { .. }) if self.start_spill(me, data, meta)? => {
                self.restores_waiting.push(id);
                Ok(Restore::Underway)
            }
            Err(StoreError::StoreFull { .. }) if self.spills_in_flight > 0 => {
                self.restores_waiting.push(id);
                Ok(Restore::Underway)
            }
            Err(e) => Err(e),
        }
    }

    /// A spill was written: the restores that waited for room try again;
    /// the waiters of one that still cannot come back are told, and so are
    /// those of one no longer spilled (deleted while it waited): a get that
    /// does not wait then answers without it instead of waiting for a
    /// restore that will never come.
    fn retry_restores(&mut self, me: &SharedRef) {
        for id in std::mem::take(&mut self.restores_waiting) {
            match self.request_restore(me, id) {
                Ok(Restore::Underway) => continue,
                Ok(Restore::NotSpilled) => {}
                Err(e) => {
                    tracing::debug!(%id, error = %e, "a spilled object cannot come back yet");
                }
            }
            // Its gets hear that it is not coming (yet): those that do not
            // wait answer without it.
            let fx = self.store.wake_waiters(id);
            self.deliver(fx);
        }
    }

    /// Completes a restore whose bytes were read (or not).
    fn end_restore(&mut self, id: ObjectId, read: std::io::Result<()>, dead_segments: Vec<u64>) {
        if let Err(e) = &read {
            self.check_spill_dir();
            tracing::warn!(%id, error = %e, "a spilled object could not be read back; dropped");
        }
        let mut fx = self.store.finish_restore(id, read.is_ok());
        fx.dead_segments.extend(dead_segments);
        self.deliver(fx);
    }
}

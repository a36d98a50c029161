//! [`Client::get`] and its two halves: sealed local objects from the
//! store's shared table ([`Client::get_local`]), then the rest from the
//! store ([`Client::get_rest`]).

use crate::buffer::ObjectBuffer;
use crate::client::Client;
use crate::error::Result;
use crate::shared_table::TableView;
use ferroplasma_protocol::shared_table::{self, Take};
use ferroplasma_protocol::ObjectId;
use std::sync::Arc;
use std::time::Duration;

impl Client {
    /// Gets sealed objects, waiting up to `timeout` (`None`: forever,
    /// zero: don't wait) for those not sealed yet. Each entry is `None` if
    /// its object did not appear in time. Each buffer holds a reference,
    /// released when it is dropped.
    pub fn get(
        &self,
        ids: &[ObjectId],
        timeout: Option<Duration>,
    ) -> Result<Vec<Option<ObjectBuffer>>> {
        let mut out: Vec<Option<ObjectBuffer>> = ids.iter().map(|_| None).collect();
        let rest = self.get_local(ids, |pos, b| out[pos] = Some(b))?;
        self.get_rest(ids, rest, timeout, |pos, b| out[pos] = b)?;
        Ok(out)
    }

    /// The first half of [`get`](Self::get): takes, from the store's
    /// shared table, those of `ids` that are sealed in its memory, and hands
    /// each buffer to `each` with its position as soon as it is taken.
    /// Never waits and never asks the store. Returns the positions it did
    /// not serve, for [`get_rest`](Self::get_rest).
    ///
    /// Among millions of objects a take waits for memory (the table's slot,
    /// this client's hold); a caller that makes something of each buffer
    /// here (a Python object, say) does that work while the CPU loads the
    /// slots of the objects that come next, instead of after them all.
    pub fn get_local(
        &self,
        ids: &[ObjectId],
        each: impl FnMut(usize, ObjectBuffer),
    ) -> Result<Vec<usize>> {
        let Some(tables) = self.inner.table.as_ref() else {
            return Ok((0..ids.len()).collect());
        };
        self.inner.check_pid()?;
        let table = tables.current();
        let rest = self.take_from(&table, ids, 0..ids.len(), each)?;
        if rest.is_empty() {
            table.count(shared_table::COUNT_GET);
        }
        Ok(rest)
    }

    /// The second half of [`get`](Self::get): the objects at positions
    /// `rest` of `ids`, which [`get_local`](Self::get_local) did not
    /// serve. They are looked for once more in the table in use now (the
    /// one that replaced the table it read, if the store rebuilt it
    /// meanwhile), then asked of the store in one request, waiting up to
    /// `timeout`. `each` gets every position of
    /// `rest` once, with `None` for an object that did not appear in time.
    pub fn get_rest(
        &self,
        ids: &[ObjectId],
        mut rest: Vec<usize>,
        timeout: Option<Duration>,
        mut each: impl FnMut(usize, Option<ObjectBuffer>),
    ) -> Result<()> {
        if rest.is_empty() {
            return Ok(());
        }
        // Missed in a table the store has replaced (it grew or shrank with
        // the object count): those are looked for again in the new one (or
        // in the one in use now, which another thread may have swapped in
        // since `get_local`; a second look for an object being created, or
        // elsewhere, costs little beside asking the store).
        if let Some(tables) = self.inner.table.as_ref() {
            let table = tables.current();
            let table = self.inner.table_after(&table).unwrap_or(table);
            rest = self.take_from(&table, ids, rest.into_iter(), |p, b| each(p, Some(b)))?;
            if rest.is_empty() {
                table.count(shared_table::COUNT_GET);
                return Ok(());
            }
        }
        let asked: Vec<ObjectId> = rest.iter().map(|&p| ids[p]).collect();
        for (p, b) in rest.into_iter().zip(self.get_from_store(&asked, timeout)?) {
            each(p, b);
        }
        Ok(())
    }

    /// Takes the objects at `positions` of `ids` from `table`, handing
    /// each buffer to `each`; returns the positions the store must serve.
    /// The lines every take will touch are asked for first
    /// ([`TableView::prefetch`]).
    fn take_from(
        &self,
        table: &Arc<TableView>,
        ids: &[ObjectId],
        positions: impl Iterator<Item = usize> + Clone,
        mut each: impl FnMut(usize, ObjectBuffer),
    ) -> Result<Vec<usize>> {
        let mut rest = Vec::new();
        if positions.size_hint().0 > 1 {
            positions.clone().for_each(|p| table.prefetch(&ids[p]));
        }
        for pos in positions {
            match self.take(table, &ids[pos])? {
                Some(b) => each(pos, b),
                None => rest.push(pos),
            }
        }
        Ok(rest)
    }

    /// A buffer of `id` from `table`, holding a hold there; `None` if the
    /// store must be asked.
    fn take(&self, table: &Arc<TableView>, id: &ObjectId) -> Result<Option<ObjectBuffer>> {
        match table.take(id) {
            Take::Held(slot, v) => {
                // The hold itself is the reference (and what `release`
                // checks); an error below gives it back here.
                let hold = Some((table.clone(), slot));
                match self.buffer(*id, v.offset, v.data_size, v.metadata_size, hold) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) => {
                        self.inner.give_back_hold(*id, table, slot);
                        Err(e)
                    }
                }
            }
            Take::ReleaseThenAsk => {
                self.inner.release_adopted(*id);
                Ok(None)
            }
            Take::Absent | Take::Busy => Ok(None),
        }
    }
}

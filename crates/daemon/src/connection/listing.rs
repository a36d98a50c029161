//! `List` with a page size: listings that page. The first page takes a
//! snapshot of every id (20 B per object, kept on this connection until
//! its last page is read or the connection ends); each page reads its rows
//! from the store when it is asked for. So an object that exists for the
//! whole listing appears exactly once, never twice; one deleted meanwhile
//! is skipped; one created after the first page is not listed. The
//! alternative, a cursor in the object table's own order, needs an
//! ordered table, and the table is a hash map that reorders as it grows.
//!
//! A cluster-wide listing is gathered from every member first (as the
//! unpaged `List` is) and sent as one page.

use super::{refuse, Connection, Refusal};
use crate::convert;
use ferroplasma_protocol::frame::{encode_frame, MAX_LIST_PAGE};
use ferroplasma_protocol::pb::{self, reply};
use ferroplasma_protocol::ObjectId;
use std::collections::VecDeque;

/// Listings one connection may have open; starting another forgets the
/// oldest (its cursor is then refused), so that a client that abandons
/// listings cannot make the store keep their snapshots.
pub(super) const MAX_OPEN_LISTINGS: usize = 4;

/// Bits of a cursor that are the offset in the snapshot; those above
/// number the listing on its connection.
const OFFSET_BITS: u32 = 40;

/// The listings open on one connection.
#[derive(Debug, Default)]
pub(super) struct Listings {
    open: VecDeque<Listing>,
    /// The number of the last listing started (listing numbers start at 1,
    /// so that no cursor of a listing is 0).
    last: u64,
}

impl Listings {
    /// Keeps a listing with pages to come, forgetting the oldest open one
    /// if there are [`MAX_OPEN_LISTINGS`] already.
    fn keep(&mut self, listing: Listing) {
        if self.open.len() >= MAX_OPEN_LISTINGS {
            self.open.pop_front();
        }
        self.open.push_back(listing);
    }
}

#[derive(Debug)]
struct Listing {
    number: u64,
    ids: Vec<ObjectId>,
}

impl Connection {
    /// One page of a listing: the first (`cursor` 0) or the one `cursor`
    /// names. A first page of a store with more objects is written to the
    /// socket before the rest of the snapshot is taken (None is returned
    /// then: nothing is left to answer).
    pub(super) fn list_page(
        &mut self,
        rid: u64,
        page_size: u32,
        cursor: u64,
    ) -> Result<Option<reply::Body>, Refusal> {
        let size = (page_size as usize).min(MAX_LIST_PAGE);
        let cluster = self.cluster.clone();
        let cached = |id: &ObjectId| cluster.as_deref().is_some_and(|c| c.is_cached(id));
        let sh = self.shared.lock();
        let listings = &mut self.listings;
        if cursor == 0 {
            let number = (listings.last % ((1 << (64 - OFFSET_BITS)) - 1)) + 1;
            listings.last = number;
            let total = sh.store.object_count() as u64;
            let (wr, out) = (&self.wr, &mut self.out);
            let mut sent = false;
            let ids = sh.store.object_ids_with(size, |head| {
                let mut page = convert::page(&sh.store.list_rows(head), cached);
                page.next = (number << OFFSET_BITS) | head.len() as u64;
                page.total = total;
                let frame = encode_frame(&pb::Reply {
                    request_id: rid,
                    body: Some(reply::Body::ListPage(page)),
                });
                // What the socket does not take now goes first at the next
                // flush, before the replies queued already.
                let written = wr.try_write(&frame).unwrap_or(0);
                out.splice(0..0, frame[written..].iter().copied());
                sent = true;
            });
            let offset = if sent { size } else { 0 };
            let listing = Listing { number, ids };
            if sent {
                listings.keep(listing);
                return Ok(None);
            }
            let (rows, next) = page_of(&sh.store, &listing, offset, size);
            if next != 0 {
                listings.keep(listing);
            }
            drop(sh);
            return Ok(Some(reply_page(rows, next, total, cached)));
        }
        let number = cursor >> OFFSET_BITS;
        let offset = (cursor & ((1 << OFFSET_BITS) - 1)) as usize;
        let at = listings
            .open
            .iter()
            .position(|l| l.number == number && offset <= l.ids.len())
            .ok_or_else(|| {
                refuse(
                    pb::ErrorCode::InvalidRequest,
                    format!(
                        "List cursor {cursor:#x} names no listing open on this connection: it \
                         ended, or {MAX_OPEN_LISTINGS} others were started since; start again \
                         with cursor 0"
                    ),
                )
            })?;
        let (rows, next) = page_of(&sh.store, &listings.open[at], offset, size);
        drop(sh);
        let total = listings.open[at].ids.len() as u64;
        if next == 0 {
            listings.open.remove(at);
        }
        Ok(Some(reply_page(rows, next, total, cached)))
    }
}

/// The rows of the page at `offset`, and the cursor of the next (0 when
/// this is the last).
fn page_of(
    store: &ferroplasma_store::Store,
    listing: &Listing,
    offset: usize,
    size: usize,
) -> (Vec<ferroplasma_store::ObjectInfo>, u64) {
    let end = (offset + size).min(listing.ids.len());
    let rows = store.list_rows(&listing.ids[offset..end]);
    let next = if end == listing.ids.len() {
        0
    } else {
        (listing.number << OFFSET_BITS) | end as u64
    };
    (rows, next)
}

fn reply_page(
    rows: Vec<ferroplasma_store::ObjectInfo>,
    next: u64,
    total: u64,
    cached: impl Fn(&ObjectId) -> bool,
) -> reply::Body {
    let mut page = convert::page(&rows, cached);
    page.next = next;
    page.total = total;
    reply::Body::ListPage(page)
}

//! Listing the store's objects: [`Client::list_pages`], an iterator of
//! pages, and [`Client::list`] built on it.

use crate::client::{unexpected, Client};
use crate::error::{ClientError, Result};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;

/// One row of [`Client::list`] and of each page of [`Client::list_pages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The id.
    pub id: ObjectId,
    /// Data bytes.
    pub data_size: u64,
    /// Metadata bytes.
    pub metadata_size: u64,
    /// References held, over all clients.
    pub ref_count: u64,
    /// True once sealed.
    pub sealed: bool,
    /// Unix time of the create, µs.
    pub create_time_us: i64,
    /// µs from create to seal; `None` while unsealed.
    pub construct_duration_us: Option<i64>,
    /// A delete waits for the last reference to go.
    pub delete_pending: bool,
    /// Its bytes are in the store's spill directory (a get brings them back).
    pub spilled: bool,
    /// In a cluster-wide list: the member holding this copy (empty otherwise).
    pub node: String,
    /// A cached copy pulled from another member.
    pub cached: bool,
}

/// Objects in a page of [`Client::list`] (the store's cap,
/// `ferroplasma_protocol::frame::MAX_LIST_PAGE`).
pub const DEFAULT_LIST_PAGE: usize = ferroplasma_protocol::frame::MAX_LIST_PAGE;

/// Objects in the first page of a listing (when the page size asked for is
/// larger): small, so that it arrives at once even from a store of
/// millions; the pages after it are as large as asked.
pub const FIRST_LIST_PAGE: usize = 1000;

/// The pages of one listing ([`Client::list_pages`]): each item is the
/// next page's objects, or the error that ended the listing.
#[derive(Debug)]
pub struct ListPages {
    client: Client,
    cluster: bool,
    page_size: u32,
    cursor: u64,
    started: bool,
    done: bool,
    total: Option<u64>,
    /// The next page, asked for on a thread of its own as soon as the one
    /// before came, so that the store reads it while the caller works
    /// through the one before.
    ahead: Option<std::thread::JoinHandle<Result<reply::Body>>>,
}

impl ListPages {
    /// The objects the store had when the listing started (the most it
    /// returns): known after the first page.
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    fn request(&self) -> request::Body {
        let page_size = if self.started {
            self.page_size
        } else {
            self.page_size.min(FIRST_LIST_PAGE as u32)
        };
        request::Body::List(pb::List {
            cluster: self.cluster,
            page_size,
            cursor: self.cursor,
        })
    }

    fn next_page(&mut self) -> Result<Vec<ObjectInfo>> {
        let body = match self.ahead.take() {
            Some(ahead) => ahead
                .join()
                .unwrap_or_else(|_| Err(ClientError::Protocol("listing thread panicked".into())))?,
            None => self.client.call(self.request())?,
        };
        self.started = true;
        match body {
            reply::Body::ListPage(p) => {
                self.cursor = p.next;
                self.done = p.next == 0;
                self.total = Some(p.total);
                if !self.done {
                    let (client, ask) = (self.client.clone(), self.request());
                    // Without a thread, the page is asked for when needed.
                    self.ahead = std::thread::Builder::new()
                        .name("ferroplasma-list".into())
                        .spawn(move || client.call(ask))
                        .ok();
                }
                rows_of(p)
            }
            // A store older than paged listings answers with every object.
            reply::Body::List(l) => {
                self.done = true;
                self.total = Some(l.objects.len() as u64);
                l.objects.into_iter().map(row_of).collect()
            }
            other => Err(unexpected("List", &other)),
        }
    }
}

impl Iterator for ListPages {
    type Item = Result<Vec<ObjectInfo>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let page = self.next_page();
        if page.is_err() {
            self.done = true;
        }
        Some(page)
    }
}

impl Client {
    /// Every object in the store.
    pub fn list(&self) -> Result<Vec<ObjectInfo>> {
        self.list_in(false)
    }

    /// Every object in this store or, with `cluster`, on every live member
    /// of its cluster (each naming its member in [`ObjectInfo::node`]).
    /// Read in pages of [`DEFAULT_LIST_PAGE`] objects.
    pub fn list_in(&self, cluster: bool) -> Result<Vec<ObjectInfo>> {
        let mut pages = self.list_pages_in(cluster, DEFAULT_LIST_PAGE);
        let mut out = Vec::new();
        while let Some(page) = pages.next() {
            let page = page?;
            if out.is_empty() {
                out.reserve(pages.total().unwrap_or(0) as usize);
            }
            out.extend(page);
        }
        Ok(out)
    }

    /// The store's objects, a page of at most `page_size` at a time (the
    /// first page at most [`FIRST_LIST_PAGE`], so that it comes at once;
    /// the store caps pages at 100,000). The store takes a snapshot of
    /// the ids at the first page and reads each page's objects when it is
    /// asked for: an object that exists for the whole listing is in
    /// exactly one page, one deleted meanwhile may be missing, one created
    /// after the first page is not listed. A page may hold fewer objects
    /// than asked (those deleted since the snapshot), even none.
    ///
    /// ```no_run
    /// # fn main() -> ferroplasma_client::Result<()> {
    /// let client = ferroplasma_client::Client::connect(None)?;
    /// let mut bytes = 0;
    /// for page in client.list_pages(10_000) {
    ///     bytes += page?.iter().map(|o| o.data_size).sum::<u64>();
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_pages(&self, page_size: usize) -> ListPages {
        self.list_pages_in(false, page_size)
    }

    /// [`Client::list_pages`], of every live cluster member with
    /// `cluster`. A cluster-wide listing is gathered from the members
    /// whole and comes as one page.
    pub fn list_pages_in(&self, cluster: bool, page_size: usize) -> ListPages {
        ListPages {
            client: self.clone(),
            cluster,
            page_size: page_size.clamp(1, u32::MAX as usize) as u32,
            cursor: 0,
            started: false,
            done: false,
            total: None,
            ahead: None,
        }
    }
}

fn protocol(what: &str) -> ClientError {
    ClientError::Protocol(format!("malformed ListPage: {what}"))
}

/// The rows of a page, its columns checked.
fn rows_of(p: pb::ListPage) -> Result<Vec<ObjectInfo>> {
    let ids =
        ferroplasma_protocol::unpack_ids(&p.object_ids).map_err(|e| protocol(&e.to_string()))?;
    let n = ids.len();
    let columns = [
        p.data_size.len(),
        p.metadata_size.len(),
        p.ref_count.len(),
        p.flags.len(),
        p.create_time_us.len(),
        p.construct_duration_us.len(),
    ];
    if columns.iter().any(|&c| c != n) {
        return Err(protocol("columns of different lengths"));
    }
    if !(p.member.is_empty() || p.member.len() == n) {
        return Err(protocol("a member column of another length"));
    }
    let mut out = Vec::with_capacity(n);
    for (i, id) in ids.into_iter().enumerate() {
        let flags = p.flags[i];
        let on = |f: pb::ListFlag| flags & f as u32 != 0;
        let node = match p.member.get(i) {
            None => String::new(),
            Some(&m) => p
                .members
                .get(m as usize)
                .cloned()
                .ok_or_else(|| protocol("a member index out of range"))?,
        };
        let construct = p.construct_duration_us[i];
        out.push(ObjectInfo {
            id,
            data_size: p.data_size[i],
            metadata_size: p.metadata_size[i],
            ref_count: p.ref_count[i],
            sealed: on(pb::ListFlag::ListSealed),
            create_time_us: p.create_time_us[i],
            construct_duration_us: (construct >= 0).then_some(construct),
            delete_pending: on(pb::ListFlag::ListDeletePending),
            spilled: on(pb::ListFlag::ListSpilled),
            node,
            cached: on(pb::ListFlag::ListCached),
        });
    }
    Ok(out)
}

/// A row of an unpaged `ListReply`.
fn row_of(o: pb::ObjectInfo) -> Result<ObjectInfo> {
    Ok(ObjectInfo {
        id: ObjectId::from_slice(&o.object_id).map_err(|e| ClientError::Protocol(e.to_string()))?,
        data_size: o.data_size,
        metadata_size: o.metadata_size,
        ref_count: o.ref_count,
        sealed: o.state == pb::ObjectState::Sealed as i32,
        create_time_us: o.create_time_us,
        construct_duration_us: (o.construct_duration_us >= 0).then_some(o.construct_duration_us),
        delete_pending: o.delete_pending,
        spilled: o.spilled,
        node: o.node,
        cached: o.cached,
    })
}

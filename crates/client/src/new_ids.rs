//! [`Client::new_id`]: ids for new objects. On a cluster member the store
//! hands them out (`NewIds`), claimed cluster-wide ahead, so that creating
//! one asks no other member; this client keeps a stock of them and knows
//! which it gave out (only those go through its ring: docs/cluster.md,
//! "Ids the store hands out").

use crate::client::{unexpected, Client};
use crate::error::{ClientError, Result};
use crate::session::Session;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;

/// Ids asked for at once.
const ASK: u32 = 256;

impl Session {
    /// Whether `id` came from [`Client::new_id`] on a cluster member and
    /// was not created yet; from now on it counts as created.
    pub(crate) fn take_issued(&self, id: &ObjectId) -> bool {
        self.lock_fresh().issued.remove(id)
    }

    fn lock_fresh(&self) -> std::sync::MutexGuard<'_, crate::session::FreshIds> {
        self.fresh.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Client {
    /// An id for a new object. On a lone store, a random one (drawn 256 at
    /// a time: no system call per id). On a cluster
    /// member, one the store claimed cluster-wide ahead: creating it (with
    /// [`Client::put`], [`Client::create`], ...) asks no other member, and
    /// small objects are created without a round trip at all, as on a lone
    /// store. (An id the caller chose costs a claim at its directory
    /// members on a member: a round trip to another host.) Ids asked for
    /// and never used go back when the client disconnects; a client holds
    /// at most 4096 unused at once ([`ClientError::TooLarge`] beyond).
    ///
    /// ```no_run
    /// # fn main() -> ferroplasma_client::Result<()> {
    /// let client = ferroplasma_client::Client::connect(None)?;
    /// let id = client.new_id()?;
    /// client.put(id, b"hello", b"")?;
    /// # Ok(()) }
    /// ```
    pub fn new_id(&self) -> Result<ObjectId> {
        // (After a fork this fails, so a child never hands out its
        // parent's stock.)
        self.inner.check_pid()?;
        let mut f = self.inner.lock_fresh();
        if !self.inner.cluster_member {
            if f.stock.is_empty() {
                // One system call for many ids.
                f.stock = ObjectId::random_many(ASK as usize);
            }
            return Ok(f.stock.pop().expect("not empty"));
        }
        if f.stock.is_empty() {
            let got = self.call(request::Body::NewIds(pb::NewIds { count: ASK }))?;
            let reply::Body::NewIds(r) = got else {
                return Err(unexpected("NewIds", &got));
            };
            let ids: Vec<ObjectId> = r
                .object_ids
                .chunks(ObjectId::LEN)
                .filter_map(|b| ObjectId::from_slice(b).ok())
                .collect();
            if ids.is_empty() {
                return Err(ClientError::Protocol("the store handed out no ids".into()));
            }
            // Handed out last first, as asked.
            f.stock = ids.into_iter().rev().collect();
        }
        let id = f.stock.pop().expect("not empty");
        f.issued.insert(id);
        Ok(id)
    }
}

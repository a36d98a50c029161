//! The store's error type: every way a request can be refused.

use ferroplasma_protocol::ObjectId;

/// Why the store refused a request. None of these harm stored objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The id is taken by a sealed object or one being created.
    #[error("object {0} already exists")]
    ObjectExists(ObjectId),
    /// No object has this id.
    #[error("object {0} not found")]
    ObjectNotFound(ObjectId),
    /// The object does not fit, even after evicting every evictable object.
    #[error("{}", store_full(*.requested, *.free, *.evictable, *.capacity))]
    StoreFull {
        /// Bytes the allocation needed.
        requested: u64,
        /// Bytes free before the attempt.
        free: u64,
        /// Bytes held by sealed, unreferenced objects.
        evictable: u64,
        /// The store's capacity.
        capacity: u64,
    },
    /// The store is full and the spill directory cannot take what would
    /// have to be spilled to make room (its limit, or the disk, is reached).
    #[error(
        "store full and the spill directory cannot take {requested} more bytes \
         ({used} of {limit} used); delete objects, or raise --spill-limit or free disk space"
    )]
    SpillFull {
        /// Bytes the spill needed to write.
        requested: u64,
        /// Bytes the spill directory holds.
        used: u64,
        /// The spill directory's limit.
        limit: u64,
    },
    /// The store is full and writing objects out to the spill directory
    /// failed (a full disk, an I/O error).
    #[error(
        "store full, and spilling {requested} bytes to the spill directory failed: {reason}; \
         free disk space, or delete objects"
    )]
    SpillFailed {
        /// Bytes the spill needed to write.
        requested: u64,
        /// The I/O error.
        reason: String,
    },
    /// Seal or abort of an object another client created.
    #[error("object {0} was created by another client")]
    NotCreator(ObjectId),
    /// Seal or abort of an object that is already sealed.
    #[error("object {0} is already sealed")]
    AlreadySealed(ObjectId),
    /// Release of an object this client holds no reference to.
    #[error("client holds no reference to object {0}")]
    NotHeld(ObjectId),
    /// An object a client made in leased memory (writes without a round
    /// trip) that does not lie where the client's leases allow.
    #[error(
        "object {id} at bytes {offset}..{end} does not lie in free room of a lease of this client"
    )]
    OutsideLease {
        /// The object.
        id: ObjectId,
        /// Where it starts.
        offset: u64,
        /// Where it ends.
        end: u64,
    },
    /// A create asked for more metadata than an object may have.
    #[error(
        "{size} bytes of metadata: an object may have at most {limit}; \
         put large descriptions in the object's data"
    )]
    MetadataTooLarge {
        /// Metadata bytes asked for.
        size: u64,
        /// [`MAX_METADATA`](crate::object::MAX_METADATA).
        limit: u64,
    },
}

/// The message of [`StoreError::StoreFull`], with the advice that fits.
fn store_full(requested: u64, free: u64, evictable: u64, capacity: u64) -> String {
    if requested > capacity {
        format!(
            "store full: the object needs {requested} bytes, more than the whole store \
             ({capacity} bytes); start the store with more --memory"
        )
    } else {
        format!(
            "store full: {requested} bytes requested, {free} free, {evictable} evictable, \
             capacity {capacity}; release or delete objects, or start the store with more --memory"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_full_advice_fits_the_case() {
        let too_big = StoreError::StoreFull {
            requested: 5000,
            free: 4000,
            evictable: 0,
            capacity: 4000,
        };
        let msg = too_big.to_string();
        assert!(msg.contains("more than the whole store") && !msg.contains("release or delete"));
        let crowded = StoreError::StoreFull {
            requested: 3000,
            free: 100,
            evictable: 0,
            capacity: 4000,
        };
        assert!(crowded.to_string().contains("release or delete objects"));
    }
}

//! Who is in the cluster and where each id's entry lives.
//!
//! - [`ring`] — consistent hashing of ids onto members (owner and backup).
//! - [`table`] — the directory entries this member keeps (pure state).
//! - [`membership`] — the member table and failure detector (pure state).
//! - [`agent`] — turns local seals and deletions into directory updates,
//!   and re-registers everything held after a membership change.
//!
//! Every directory entry lives on two members (the id's owner and backup
//! on the ring), so the loss of any one member loses no entry: its ids fall
//! to their backups, who know where every copy is and which are now lost.

pub mod agent;
pub mod membership;
pub mod ring;
pub mod table;

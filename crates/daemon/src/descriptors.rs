//! File descriptors: the store raises its soft `RLIMIT_NOFILE` to the hard
//! limit at start, and splits what it has between local clients and the
//! network ports so that connections from the network can never take the
//! descriptors local clients need (docs/cluster.md, "Network ports").

/// Descriptors kept for everything but clients and network connections:
/// stdio, the arena and table, runtimes, listeners, spill files, and this
/// member's own connections to a few other members.
pub const OTHER: u64 = 64;

/// Members a cluster is expected to have at most; the network caps are
/// sized from it.
pub const EXPECTED_MEMBERS: usize = 64;

/// Most connections at once on each network port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkCaps {
    /// The cluster's gRPC port (`--cluster-listen`): a channel from each
    /// other member, with room for reconnections and `ferroplasma` tools.
    pub grpc: usize,
    /// The bulk data port: each other member pools up to
    /// `transport::POOL_PER_PEER` connections to it.
    pub bulk: usize,
    /// The metrics endpoint (`--metrics-listen`): a few scrapers.
    pub metrics: usize,
}

impl NetworkCaps {
    /// The caps when descriptors are plenty.
    pub const DEFAULT: Self = Self {
        grpc: 4 * EXPECTED_MEMBERS,
        bulk: ferroplasma_cluster::transfer::client::POOL_PER_PEER * EXPECTED_MEMBERS,
        metrics: 16,
    };

    /// All three together.
    pub fn total(&self) -> usize {
        self.grpc + self.bulk + self.metrics
    }

    /// The caps for a store allowed `limit` descriptors and at most
    /// `max_clients` local clients: local clients keep
    /// `min(max_clients, limit / 2)` of them and [`OTHER`] more are kept
    /// for the store itself; the network ports share what is left, the
    /// default caps scaled down to fit (each at least 1).
    pub fn for_limit(limit: u64, max_clients: u32) -> Self {
        let budget = limit.saturating_sub(local_reserve(limit, max_clients) + OTHER);
        let d = Self::DEFAULT;
        let total = d.total() as u64;
        if total <= budget {
            return d;
        }
        let scale = |cap: usize| ((cap as u64 * budget / total) as usize).max(1);
        Self {
            grpc: scale(d.grpc),
            bulk: scale(d.bulk),
            metrics: scale(d.metrics),
        }
    }
}

/// Descriptors kept for local clients under `limit`.
pub fn local_reserve(limit: u64, max_clients: u32) -> u64 {
    u64::from(max_clients).min(limit / 2)
}

/// Raises the soft descriptor limit to the hard one; returns the soft
/// limit now in force and the one before.
pub fn raise_limit() -> (u64, u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return (1024, 1024);
    };
    // An unlimited hard limit cannot be the soft one (Linux caps it at
    // fs.nr_open): then the soft one stays.
    let now = if hard > soft
        && hard != nix::sys::resource::RLIM_INFINITY
        && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok()
    {
        hard
    } else {
        soft
    };
    // Unlimited or huge: plenty, counted as a million.
    (now.min(1 << 20), soft.min(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plenty_of_descriptors_give_the_default_caps() {
        assert_eq!(NetworkCaps::for_limit(1 << 20, 4096), NetworkCaps::DEFAULT);
        assert_eq!(NetworkCaps::for_limit(65536, 4096), NetworkCaps::DEFAULT);
    }

    #[test]
    fn a_low_limit_keeps_half_for_local_clients() {
        for limit in [64u64, 256, 1024, 2048, 4096, 8192] {
            for max_clients in [1u32, 100, 1000, 4096] {
                let c = NetworkCaps::for_limit(limit, max_clients);
                let local = local_reserve(limit, max_clients);
                assert!(
                    c.total() as u64 + local + OTHER <= limit.max(3 + local + OTHER),
                    "{limit} {max_clients}: {c:?}"
                );
                assert!(c.grpc >= 1 && c.bulk >= 1 && c.metrics >= 1);
            }
        }
        let c = NetworkCaps::for_limit(1024, 4096);
        assert_eq!(local_reserve(1024, 4096), 512);
        assert!(c.total() <= 1024 - 512 - OTHER as usize, "{c:?}");
        assert!(c.grpc >= 100 && c.bulk >= 200 && c.metrics >= 4, "{c:?}");
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (now, before) = raise_limit();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert!(now >= before);
        assert_eq!(now, soft.min(1 << 20));
        if hard != nix::sys::resource::RLIM_INFINITY {
            assert_eq!(soft, hard);
        }
    }
}

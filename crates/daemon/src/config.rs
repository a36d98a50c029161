//! The store's settings (`ferroplasma store --help`) and their defaults.

use crate::DaemonError;
use std::path::PathBuf;

/// Default cap on the automatic memory size: 8 GiB.
pub const DEFAULT_MEMORY_CAP: u64 = 8 << 30;

/// Default for `--max-clients`.
pub const DEFAULT_MAX_CLIENTS: u32 = 4096;

/// Slots of the shared object table by default (16 MiB of table).
pub const DEFAULT_TABLE_SLOTS: u32 = 1 << 18;

/// Settings of one store.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreConfig {
    /// Shared memory to manage, e.g. `512MiB`, `4GiB` or plain bytes.
    /// Default: half of the free space of /dev/shm, at most 8 GiB.
    #[arg(short = 'm', long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<u64>,

    /// Unix socket to listen on.
    /// Default: $FERROPLASMA_SOCKET, else /tmp/ferroplasma.sock.
    #[arg(short = 's', long, value_name = "PATH")]
    pub socket: Option<PathBuf>,

    /// Permissions of the socket file, in octal. 0600 lets only this user
    /// (and root) connect; 0660 adds the group, 0666 everyone.
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,

    /// If --socket names a regular file (e.g. a temporary file's name),
    /// replace it with the socket, as Plasma's store did. A live store's
    /// socket, a directory or anything else is never replaced.
    #[arg(long)]
    pub replace_file: bool,

    /// Leave the socket file behind when the store stops, as Plasma's
    /// store did (plasma_store sets it, for programs that remove the file
    /// themselves). A stale socket is replaced at the next start anyway.
    #[arg(long)]
    pub keep_socket: bool,

    /// Put the arena in a file in DIR (a tmpfs or hugetlbfs mount) instead of
    /// an anonymous memfd. The file is unlinked at once, so nothing is left
    /// behind if the store dies.
    #[arg(short = 'd', long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Back the arena with 2 MiB huge pages (memfd with MFD_HUGETLB, or a
    /// hugetlbfs --dir). Needs pages reserved in /proc/sys/vm/nr_hugepages.
    #[arg(long)]
    pub hugepages: bool,

    /// Touch every page of the arena at start, so that first writes into
    /// objects run at memory speed instead of page-fault speed, and the
    /// memory is really there.
    #[arg(long)]
    pub prefault: bool,

    /// How long freed memory of the arena stays unused (under 16 MiB a
    /// second allocated or freed meanwhile) before its pages go back to
    /// the kernel, e.g. `30s`. Shorter gives a store's memory back sooner
    /// after it empties; longer keeps the pages of a program that puts and
    /// deletes large objects now and then (faulting a GiB in again costs
    /// about a second on a VM). With --prefault pages are never given back.
    #[arg(long, value_name = "TIME", default_value = "30s", value_parser = parse_duration)]
    pub give_back_after: std::time::Duration,

    /// When memory is short, write least recently used objects to segment
    /// files in DIR instead of evicting them; a later get brings them back.
    /// Without it, such objects are evicted (dropped).
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,

    /// Most bytes the spill directory may hold, e.g. `20GiB`.
    /// Default: the free space of its filesystem at start.
    #[arg(long, value_name = "SIZE", value_parser = parse_memory, requires = "spill_dir")]
    pub spill_limit: Option<u64>,

    /// Stop (as on SIGTERM) when the process that started the store exits,
    /// even if it is killed: for stores that a program starts for itself.
    #[arg(long)]
    pub exit_with_parent: bool,

    /// Most clients connected at once (subscriptions and the commands
    /// count too); one more is told the store is busy.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CLIENTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: u32,

    /// Slots the object table published in shared memory starts with (and
    /// shrinks back to): clients get, check and release sealed local
    /// objects through it without asking the store (40 bytes per slot; each
    /// client's holds take 4 bytes per slot). It grows with the store, to
    /// 1.6 times its objects once three quarters full, so every sealed object
    /// is in it (docs/protocol.md, "A table that grows"). 0 turns it off:
    /// every operation then asks the store over the socket.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TABLE_SLOTS)]
    pub table_slots: u32,

    /// Let clients create, write and seal objects of up to 64 KiB without
    /// a round trip: each allocates in ranges of the arena the store leases
    /// it (1 MiB at a time) and tells the store through a ring in shared
    /// memory (docs/protocol.md, "Writes without a round trip"). Needs the
    /// shared table (--table-slots above 0); on a cluster member, for ids
    /// the member hands out (claimed cluster-wide ahead; docs/cluster.md).
    /// `off` sends every create to the store.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off,
          action = clap::ArgAction::Set)]
    pub fast_writes: bool,

    /// Microseconds the store stays awake after each request before its
    /// thread sleeps (yielding, and looking for the next request without
    /// blocking). On a virtual machine each wake-up from sleep costs tens
    /// of microseconds (a round trip: 70 µs with both sides sleeping, 5 µs
    /// with both awake, on a 2-core VM), far more than a short request
    /// takes; clients do the same (FERROPLASMA_SPIN_US). Costs at most this
    /// much CPU time after the last request of a burst, yielded to any
    /// other thread that wants it. 0 turns it off.
    #[arg(long, value_name = "US", default_value_t = crate::spin::DEFAULT_SPIN_US,
          value_parser = clap::value_parser!(u32).range(0..=crate::spin::MAX_SPIN_US as i64))]
    pub spin_us: u32,

    /// User ids allowed to connect (checked with SO_PEERCRED), comma
    /// separated. Default: the store's own user and root.
    #[arg(long, value_name = "UID,...", value_delimiter = ',')]
    pub allow_uid: Vec<u32>,

    /// Group ids whose members may also connect, comma separated (use with
    /// --socket-mode 660). Default: none.
    #[arg(long, value_name = "GID,...", value_delimiter = ',')]
    pub allow_gid: Vec<u32>,

    /// Serve Prometheus metrics at http://ADDRESS/metrics: PORT alone
    /// binds 127.0.0.1 (loopback), HOST:PORT that address (0.0.0.0:PORT
    /// for every interface). Off by default. Metrics: docs/operations.md.
    #[arg(long, value_name = "[HOST:]PORT", value_parser = parse_metrics_addr)]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Join a cluster: serve the peer protocol (gRPC) on HOST:PORT. Needs
    /// --cluster-token and, unless this is the first member, --peers or
    /// --join. Clients of any member then get objects held by any other.
    #[arg(long, value_name = "HOST:PORT", help_heading = "Cluster")]
    pub cluster_listen: Option<std::net::SocketAddr>,

    /// The address other members reach this one at (its name in the
    /// cluster). Default: --cluster-listen, which then must not be 0.0.0.0.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "cluster_listen",
        help_heading = "Cluster"
    )]
    pub advertise: Option<String>,

    /// Where object bytes are served to other members. Default: the
    /// --cluster-listen address with a free port.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "cluster_listen",
        help_heading = "Cluster"
    )]
    pub data_listen: Option<std::net::SocketAddr>,

    /// Every other member's cluster address, comma separated.
    #[arg(
        long,
        value_name = "HOST:PORT,...",
        value_delimiter = ',',
        requires = "cluster_listen",
        conflicts_with = "join",
        help_heading = "Cluster"
    )]
    pub peers: Vec<String>,

    /// Any one member's cluster address; the others are learned from it.
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "cluster_listen",
        help_heading = "Cluster"
    )]
    pub join: Option<String>,

    /// The shared secret every member presents (printable ASCII).
    /// Connections without it are refused. Prefer --cluster-token-file or
    /// $FERROPLASMA_CLUSTER_TOKEN: a token on the command line can be read
    /// by every local user (/proc/PID/cmdline).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "FERROPLASMA_CLUSTER_TOKEN",
        hide_env_values = true,
        help_heading = "Cluster"
    )]
    pub cluster_token: Option<String>,

    /// Read the cluster token from this file (its first line; keep the
    /// file private, mode 600).
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "cluster_token",
        help_heading = "Cluster"
    )]
    pub cluster_token_file: Option<PathBuf>,

    /// Time between heartbeats to each member, e.g. `500ms`.
    #[arg(long, value_name = "TIME", default_value = "500ms", value_parser = parse_duration,
          help_heading = "Cluster")]
    pub heartbeat_interval: std::time::Duration,

    /// Silence after which a member is declared dead (its objects lost
    /// unless copied elsewhere), e.g. `3s`.
    #[arg(long, value_name = "TIME", default_value = "3s", value_parser = parse_duration,
          help_heading = "Cluster")]
    pub peer_timeout: std::time::Duration,
}

impl StoreConfig {
    /// A config with every default (memory decided at start).
    pub fn new() -> Self {
        Self {
            memory: None,
            socket: None,
            socket_mode: 0o600,
            replace_file: false,
            keep_socket: false,
            dir: None,
            hugepages: false,
            prefault: false,
            spill_dir: None,
            spill_limit: None,
            exit_with_parent: false,
            max_clients: DEFAULT_MAX_CLIENTS,
            metrics_listen: None,
            table_slots: DEFAULT_TABLE_SLOTS,
            spin_us: crate::spin::DEFAULT_SPIN_US,
            fast_writes: true,
            give_back_after: std::time::Duration::from_secs(30),
            allow_uid: Vec::new(),
            allow_gid: Vec::new(),
            cluster_listen: None,
            advertise: None,
            data_listen: None,
            peers: Vec::new(),
            join: None,
            cluster_token: None,
            cluster_token_file: None,
            heartbeat_interval: std::time::Duration::from_millis(500),
            peer_timeout: std::time::Duration::from_secs(3),
        }
    }

    /// The cluster settings, when --cluster-listen is given.
    pub fn cluster(&self) -> Result<Option<ferroplasma_cluster::ClusterConfig>, DaemonError> {
        let Some(listen) = self.cluster_listen else {
            return Ok(None);
        };
        let bad = |m: String| Err(DaemonError::BadConfig(m));
        let from_file = match &self.cluster_token_file {
            Some(path) => Some(read_token_file(path)?),
            None => None,
        };
        let Some(token) = from_file
            .or_else(|| self.cluster_token.clone())
            .filter(|t| !t.is_empty())
        else {
            return bad(
                "--cluster-listen needs --cluster-token-file (or $FERROPLASMA_CLUSTER_TOKEN, \
                 or --cluster-token): the secret every member of the cluster shares"
                    .into(),
            );
        };
        if !token.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return bad("--cluster-token must be printable ASCII".into());
        }
        let advertise = match &self.advertise {
            Some(a) => a.clone(),
            None if listen.ip().is_unspecified() => {
                return bad(format!(
                    "--cluster-listen {listen} listens on every interface: say with --advertise \
                     HOST:PORT which address the other members should use"
                ))
            }
            None => listen.to_string(),
        };
        if self.peer_timeout <= self.heartbeat_interval {
            return bad(format!(
                "--peer-timeout ({:?}) must be longer than --heartbeat-interval ({:?})",
                self.peer_timeout, self.heartbeat_interval
            ));
        }
        let mut peers: Vec<String> = self.peers.iter().chain(&self.join).cloned().collect();
        peers.retain(|p| *p != advertise);
        Ok(Some(ferroplasma_cluster::ClusterConfig {
            listen,
            advertise,
            data_listen: self
                .data_listen
                .unwrap_or_else(|| std::net::SocketAddr::new(listen.ip(), 0)),
            peers,
            token,
            heartbeat: self.heartbeat_interval,
            peer_timeout: self.peer_timeout,
            grpc_connections: crate::descriptors::NetworkCaps::DEFAULT.grpc,
            bulk_connections: crate::descriptors::NetworkCaps::DEFAULT.bulk,
        }))
    }

    /// Whether a peer with these credentials may connect.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        let own = nix::unistd::geteuid().as_raw();
        if self.allow_uid.is_empty() {
            uid == own || uid == 0 || self.allow_gid.contains(&gid)
        } else {
            self.allow_uid.contains(&uid) || self.allow_gid.contains(&gid)
        }
    }

    /// Checks that the backing filesystem (--dir, else /dev/shm) has room
    /// for `memory`, so the store never promises more shared memory than it
    /// can give; returns a line saying how much is free. With --prefault
    /// the pages are reserved at start anyway, so only that check applies.
    pub fn check_backing(&self, memory: u64) -> Result<String, DaemonError> {
        let dir = self.dir.clone().unwrap_or_else(|| "/dev/shm".into());
        let free = free_space(&dir)?;
        if memory > free && !self.prefault && !self.hugepages {
            return Err(DaemonError::BadSize(format!(
                "--memory {} is more than the {} free in {}: clients would die of SIGBUS \
                 when it runs out. Lower --memory, free space in {}, or pass --prefault to \
                 reserve the memory at start",
                human(memory),
                human(free),
                dir.display(),
                dir.display()
            )));
        }
        Ok(format!(
            "{} free in {}{}",
            human(free),
            dir.display(),
            if self.prefault {
                "; the arena's pages are reserved at start (--prefault)"
            } else {
                ""
            }
        ))
    }

    /// The spill directory's limit in force, and where it came from.
    pub fn spill_limit(&self) -> Result<Option<(u64, String)>, DaemonError> {
        let Some(dir) = &self.spill_dir else {
            return Ok(None);
        };
        if let Some(l) = self.spill_limit {
            return Ok(Some((l, "from --spill-limit".into())));
        }
        let free = free_space(dir)?;
        Ok(Some((
            free,
            format!(
                "default: the {} free in {} at start",
                human(free),
                dir.display()
            ),
        )))
    }

    /// The socket path in force.
    pub fn socket_path(&self) -> PathBuf {
        ferroplasma_protocol::default_socket_path(self.socket.as_deref())
    }

    /// The memory size in force and a line saying where it came from.
    pub fn memory_size(&self) -> Result<(u64, String), DaemonError> {
        if let Some(m) = self.memory {
            return Ok((m, "from --memory".into()));
        }
        let dir = self.dir.clone().unwrap_or_else(|| "/dev/shm".into());
        let free = free_space(&dir)?;
        let size = (free / 2).min(DEFAULT_MEMORY_CAP);
        if size < 1 << 20 {
            return Err(DaemonError::BadSize(format!(
                "{} has only {free} bytes free; pass --memory",
                dir.display()
            )));
        }
        Ok((
            size,
            format!(
                "default: half of the {} free in {}, capped at {}",
                human(free),
                dir.display(),
                human(DEFAULT_MEMORY_CAP)
            ),
        ))
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Bytes free for an unprivileged writer in the filesystem holding `dir`.
pub fn free_space(dir: &std::path::Path) -> Result<u64, DaemonError> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| DaemonError::io(format!("statvfs {}", dir.display()), e))?;
    Ok(st.blocks_available() as u64 * st.fragment_size() as u64)
}

/// Parses `512MiB`, `4GiB`, `1.5 GB`, `1000000`.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let v = parse_size::Config::new()
        .with_binary()
        .parse_size(s.trim())
        .map_err(|e| format!("{e} (try e.g. 512MiB, 4GiB or a number of bytes)"))?;
    if v == 0 {
        return Err("a store needs some memory: give at least 1 byte".into());
    }
    Ok(v)
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{s:?} is not an octal mode like 600 or 660"))?;
    if m > 0o777 {
        return Err(format!("{s} is not a permission mode (at most 777)"));
    }
    Ok(m)
}

/// `1.5 GiB`-style rendering.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Parses a duration such as `500ms`, `3s` or `1m`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e}; write e.g. `500ms`, `3s` or `1m`"))?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    if d > MAX_DURATION {
        return Err("must be at most a day (`24h`)".into());
    }
    Ok(d)
}

/// The longest time any flag takes: longer ones would overflow deadlines.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The token in `path`: its first line, which must not be empty. A file
/// other users may read is used, with a warning.
fn read_token_file(path: &std::path::Path) -> Result<String, DaemonError> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path).map_err(|e| {
        DaemonError::io(
            format!("reading --cluster-token-file {}", path.display()),
            e,
        )
    })?;
    let token = text
        .lines()
        .next()
        .unwrap_or("")
        .trim_end_matches('\r')
        .to_string();
    if token.is_empty() {
        return Err(DaemonError::BadConfig(format!(
            "--cluster-token-file {} is empty: put the cluster's token on its first line",
            path.display()
        )));
    }
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                "the cluster token file can be read by other users: chmod 600 it"
            );
        }
    }
    Ok(token)
}

/// `--metrics-listen`: PORT (on loopback) or HOST:PORT.
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        format!("{s:?} is neither a port (9464) nor HOST:PORT (127.0.0.1:9464, 0.0.0.0:9464)")
    })
}

/// `on` or `off` (also true/false, yes/no, 1/0).
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{s:?}: say on or off")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn metrics_listen_takes_a_port_on_loopback_or_an_address() {
        use super::parse_metrics_addr as p;
        assert_eq!(p("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(p("0.0.0.0:9464").unwrap().to_string(), "0.0.0.0:9464");
        assert!(p("localhost").unwrap_err().contains("HOST:PORT"));
    }

    use super::*;

    #[test]
    fn durations_past_a_day_are_refused_not_overflowed() {
        assert_eq!(
            parse_duration("3s").unwrap(),
            std::time::Duration::from_secs(3)
        );
        assert_eq!(parse_duration("24h").unwrap(), MAX_DURATION);
        for worst in ["200000000000years", "25h", "0s"] {
            assert!(parse_duration(worst).is_err(), "{worst}");
        }
    }

    #[test]
    fn the_cluster_token_comes_from_its_file() {
        let dir = std::env::temp_dir().join(format!("fp-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (file, empty) = (dir.join("token"), dir.join("empty"));
        std::fs::write(&file, "s3cret\nignored\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        assert_eq!(read_token_file(&file).unwrap(), "s3cret");
        assert!(read_token_file(&empty)
            .unwrap_err()
            .to_string()
            .contains("is empty"));
        let missing = read_token_file(&dir.join("missing"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("--cluster-token-file"), "{missing}");
        let mut c = StoreConfig::new();
        c.cluster_listen = Some("127.0.0.1:0".parse().unwrap());
        c.cluster_token_file = Some(file);
        assert!(c.cluster().unwrap().is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes_and_modes() {
        assert_eq!(parse_memory("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_memory("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_memory("1000000").unwrap(), 1_000_000);
        assert!(parse_memory("lots").is_err());
        assert_eq!(parse_memory("4000").unwrap(), 4000);
        assert!(parse_memory("0").is_err());
        assert_eq!(parse_mode("600").unwrap(), 0o600);
        assert!(parse_mode("999").is_err());
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}

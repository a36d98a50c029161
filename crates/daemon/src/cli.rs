//! The `ferroplasma` command line, shared by the binary and the Python
//! package's console script.

use crate::config::human;
use crate::StoreConfig;
use clap::{Parser, Subcommand};
use ferroplasma_client::Client;
use std::path::PathBuf;

/// `println!` that returns the error instead of panicking on it: a reader
/// that closed the pipe (`ferroplasma list | head`) ends the command
/// quietly, as it does other Unix tools.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($t)*)
    }};
}
/// ferroplasma: a shared-memory object store for immutable data.
///
/// Processes on one host put objects (byte buffers with metadata) into the
/// store once and read them from shared memory without copying.
/// Start a store with `ferroplasma store`; clients find it through
/// $FERROPLASMA_SOCKET or /tmp/ferroplasma.sock.
#[derive(Debug, Parser)]
#[command(
    name = "ferroplasma",
    version,
    propagate_version = true,
    after_help = "Commands of the Python package's `ferroplasma` (the wheel, or `make build`):\n  \
                  scan-server  Serve SQL over Parquet/CSV datasets to `fp.scan` clients (docs/scan.md)\n  \
                  records      Generate, sort (map/reduce on the store) and validate text records (docs/jobs.md)\n  \
                  dataframe    Sort a table with the parallel sample sort on the store (docs/jobs.md)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a store in the foreground until SIGTERM or Ctrl-C.
    ///
    /// Logs go to stderr; set FERROPLASMA_LOG (e.g. `debug`) for more.
    Store(Box<StoreConfig>),
    /// Print a running store's memory and object counters (with --watch,
    /// again and again, with rates).
    Stats(StatsArgs),
    /// List the objects in a running store.
    List(ListArgs),
    /// Cluster commands (see docs/cluster.md).
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Show the members of the store's cluster: address, health, capacity
    /// and use, and this store's transfer counters.
    Status(Target),
}

#[derive(Debug, clap::Args)]
struct StatsArgs {
    #[command(flatten)]
    target: Target,
    /// Look again every SECONDS (default 1) until Ctrl-C, with rates per
    /// second next to the totals: redrawn in place on a terminal, one line
    /// of key=value pairs per look otherwise (a pipe, a log file).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "1",
          value_parser = parse_seconds)]
    watch: Option<f64>,
    /// With --watch: the cluster's figures too (members up, pulls, serves,
    /// lookups).
    #[arg(long, requires = "watch")]
    cluster: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.05..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!(
            "{s:?}: give seconds between looks, from 0.05 to 86400 (e.g. 1 or 0.5)"
        )),
    }
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    #[command(flatten)]
    target: Target,
    /// List the objects of every live cluster member, with the member
    /// holding each copy.
    #[arg(long)]
    cluster: bool,
    /// Stop after this many objects.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Objects asked of the store at a time: rows are printed as each page
    /// arrives, in the store's order (the first page is small, so that it
    /// comes at once from a store of millions).
    #[arg(long, value_name = "N", default_value_t = ferroplasma_client::listing::DEFAULT_LIST_PAGE as u32,
          value_parser = clap::value_parser!(u32).range(1..))]
    page_size: u32,
    /// Oldest first (by the time of the create): reads every page before
    /// printing the first row.
    #[arg(long)]
    sorted: bool,
}

#[derive(Debug, clap::Args)]
struct Target {
    /// Socket of the store. Default: $FERROPLASMA_SOCKET, else /tmp/ferroplasma.sock.
    #[arg(short = 's', long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    match cli.command {
        Command::Store(cfg) => crate::run(*cfg).map_err(|e| {
            let msg = format!("cannot run the store: {}", chain(&e));
            match e {
                crate::DaemonError::BadConfig(_) | crate::DaemonError::BadSize(_) => {
                    Box::new(BadFlags(msg)) as Box<dyn std::error::Error + Send + Sync>
                }
                _ => msg.into(),
            }
        }),
        Command::Stats(a) => {
            let c = Client::connect(a.target.socket.as_deref())?;
            if let Some(every) = a.watch {
                return crate::watch::watch(
                    &c,
                    std::time::Duration::from_secs_f64(every),
                    a.cluster,
                );
            }
            let s = c.stats()?;
            say!("socket              {}", c.socket().display())?;
            say!("capacity            {}", human(s.capacity))?;
            say!(
                "used                {} ({:.1}%)",
                human(s.used),
                100.0 * s.used as f64 / s.capacity.max(1) as f64
            )?;
            say!(
                "objects             {} ({} sealed, {} referenced)",
                s.objects,
                s.sealed_objects,
                s.referenced_objects
            )?;
            say!("clients             {}", s.clients)?;
            say!(
                "evictions           {} ({})",
                s.evictions,
                human(s.evicted_bytes)
            )?;
            say!(
                "largest free block  {} in {} free blocks (fragmentation {:.3})",
                human(s.largest_free_block),
                s.free_blocks,
                s.fragmentation
            )?;
            if s.spills > 0 || s.spilled_objects > 0 {
                say!(
                    "spilled             {} objects ({}); {} in segment files; {} spills, {} restores",
                    s.spilled_objects,
                    human(s.spilled_bytes),
                    human(s.spill_dir_bytes),
                    s.spills,
                    s.restores
                )?;
            }
            Ok(())
        }
        Command::List(a) => list(a),
        Command::Cluster(ClusterCommand::Status(t)) => {
            let c = Client::connect(t.socket.as_deref())?;
            let s = c.cluster_status()?;
            if !s.enabled {
                say!("this store is not in a cluster (start it with --cluster-listen)")?;
                return Ok(());
            }
            say!(
                "{:<22}  {:<22}  {:<8}  {:>10}  {:>10}  {:>8}  last heard",
                "member",
                "data address",
                "health",
                "capacity",
                "used",
                "objects"
            )?;
            for m in &s.members {
                let health = match ferroplasma_client::MemberHealth::try_from(m.health) {
                    Ok(ferroplasma_client::MemberHealth::ThisMember) => "this",
                    Ok(ferroplasma_client::MemberHealth::Alive) => "alive",
                    Ok(ferroplasma_client::MemberHealth::Dead) => "DEAD",
                    Ok(ferroplasma_client::MemberHealth::Refused) => "REFUSED",
                    _ => "unknown",
                };
                let heard = match health {
                    "this" => "-".into(),
                    "unknown" => "never".into(),
                    "REFUSED" => "another --cluster-token".into(),
                    _ => format!("{:.1} s ago", m.last_seen_ms as f64 / 1000.0),
                };
                say!(
                    "{:<22}  {:<22}  {:<8}  {:>10}  {:>10}  {:>8}  {heard}",
                    m.addr,
                    m.data_addr,
                    health,
                    human(m.capacity),
                    human(m.used),
                    m.objects
                )?;
            }
            say!(
                "pulled {} objects ({}) in {} requests, served {} ({}); {} lookups, {} claims sent, {} ids claimed ahead; {} directory entries kept; {} updates sent, {} pending",
                s.fetches,
                human(s.fetched_bytes),
                s.pulls,
                s.served,
                human(s.served_bytes),
                s.lookups,
                s.claims,
                s.ids_claimed_ahead,
                s.directory_entries,
                s.updates,
                s.updates_pending
            )?;
            Ok(())
        }
    }
}

/// `ferroplasma list`: a header, then a row per object, page by page.
fn list(a: ListArgs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use std::io::Write;
    let c = Client::connect(a.target.socket.as_deref())?;
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    writeln!(
        out,
        "{:<40}  {:>12}  {:>10}  {:>5}  {}state",
        "object id",
        "data",
        "metadata",
        "refs",
        if a.cluster {
            "member                 "
        } else {
            ""
        }
    )?;
    out.flush()?;
    let mut left = a.limit.unwrap_or(u64::MAX);
    let mut pages = c.list_pages_in(a.cluster, a.page_size as usize);
    let mut all = Vec::new();
    while left > 0 {
        let Some(page) = pages.next() else { break };
        let mut page = page?;
        page.truncate(left.min(page.len() as u64) as usize);
        left -= page.len() as u64;
        if a.sorted {
            all.extend(page);
            continue;
        }
        for o in &page {
            list_row(&mut out, o, a.cluster)?;
        }
        out.flush()?;
    }
    all.sort_by_key(|o| o.create_time_us);
    for o in &all {
        list_row(&mut out, o, a.cluster)?;
    }
    out.flush()?;
    Ok(())
}

fn list_row(
    out: &mut impl std::io::Write,
    o: &ferroplasma_client::ObjectInfo,
    cluster: bool,
) -> std::io::Result<()> {
    let member = if cluster {
        format!("{:<22} ", o.node)
    } else {
        String::new()
    };
    writeln!(
        out,
        "{:<40}  {:>12}  {:>10}  {:>5}  {member}{}{}{}",
        o.id,
        o.data_size,
        o.metadata_size,
        o.ref_count,
        match (o.spilled, o.sealed) {
            (true, _) => "spilled",
            (false, true) => "sealed",
            (false, false) => "created",
        },
        if o.cached { " (cached copy)" } else { "" },
        if o.delete_pending {
            " (delete pending)"
        } else {
            ""
        }
    )
}

/// Parses `args` (the first is the program name) and runs the command.
/// Returns the process exit code; errors are printed to stderr.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERROPLASMA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
    match run(cli) {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(e.as_ref()) => 0,
        Err(e) => {
            eprintln!("ferroplasma: error: {e}");
            // A flag's value or flags that do not go together: as for
            // values clap refuses, exit status 2.
            if e.downcast_ref::<BadFlags>().is_some() {
                2
            } else {
                1
            }
        }
    }
}

/// Whether `e` is a write to a pipe whose reader went away.
fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// A start refused for its flags' values (exit status 2, as clap's own).
#[derive(Debug)]
struct BadFlags(String);

impl std::fmt::Display for BadFlags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadFlags {}

/// `error: cause: cause` on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

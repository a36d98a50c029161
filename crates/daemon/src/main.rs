//! `ferroplasma`: run a store, or inspect a running one.

use anyhow::Context;
use clap::{Parser, Subcommand};
use ferroplasma_client::Client;
use ferroplasma_daemon::config::human;
use ferroplasma_daemon::StoreConfig;
use std::path::PathBuf;

/// ferroplasma: a shared-memory object store for immutable data.
///
/// Processes on one host put objects (byte buffers with metadata) into the
/// store once and read them from shared memory without copying.
/// Start a store with `ferroplasma store`; clients find it through
/// $FERROPLASMA_SOCKET or /tmp/ferroplasma.sock.
#[derive(Debug, Parser)]
#[command(name = "ferroplasma", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a store in the foreground until SIGTERM or Ctrl-C.
    ///
    /// Logs go to stderr; set FERROPLASMA_LOG (e.g. `debug`) for more.
    Store(StoreConfig),
    /// Print a running store's memory and object counters.
    Stats(Target),
    /// List the objects in a running store.
    List(Target),
}

#[derive(Debug, clap::Args)]
struct Target {
    /// Socket of the store. Default: $FERROPLASMA_SOCKET, else /tmp/ferroplasma.sock.
    #[arg(short = 's', long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FERROPLASMA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(cli) {
        eprintln!("ferroplasma: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Store(cfg) => ferroplasma_daemon::run(cfg).context("cannot run the store"),
        Command::Stats(t) => {
            let c = Client::connect(t.socket.as_deref())?;
            let s = c.stats()?;
            println!("socket              {}", c.socket().display());
            println!("capacity            {}", human(s.capacity));
            println!(
                "used                {} ({:.1}%)",
                human(s.used),
                100.0 * s.used as f64 / s.capacity.max(1) as f64
            );
            println!(
                "objects             {} ({} sealed, {} referenced)",
                s.objects, s.sealed_objects, s.referenced_objects
            );
            println!("clients             {}", s.clients);
            println!(
                "evictions           {} ({})",
                s.evictions,
                human(s.evicted_bytes)
            );
            println!(
                "largest free block  {} in {} free blocks (fragmentation {:.3})",
                human(s.largest_free_block),
                s.free_blocks,
                s.fragmentation
            );
            Ok(())
        }
        Command::List(t) => {
            let c = Client::connect(t.socket.as_deref())?;
            let mut objs = c.list()?;
            objs.sort_by_key(|o| o.create_time_us);
            println!(
                "{:<40}  {:>12}  {:>10}  {:>5}  state",
                "object id", "data", "metadata", "refs"
            );
            for o in objs {
                println!(
                    "{:<40}  {:>12}  {:>10}  {:>5}  {}{}",
                    o.id,
                    o.data_size,
                    o.metadata_size,
                    o.ref_count,
                    if o.sealed { "sealed" } else { "created" },
                    if o.delete_pending {
                        " (delete pending)"
                    } else {
                        ""
                    }
                );
            }
            Ok(())
        }
    }
}

//! Starting and running a store: arena, socket, accept loop, signals.

use crate::arena::Arena;
use crate::cluster_store::ClusterStore;
use crate::config::{human, StoreConfig};
use crate::descriptors::{self, NetworkCaps};
use crate::shared::SharedRef;
use crate::shared_table::SharedTable;
use crate::spill::SpillDir;
use crate::{connection, listener, DaemonError};
use ferroplasma_cluster::net::rate_log::RateLimited;
use ferroplasma_cluster::Cluster;
use ferroplasma_store::Store;
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};

/// Runs a store until SIGTERM or SIGINT, on a runtime of its own.
pub fn run(config: StoreConfig) -> Result<(), DaemonError> {
    run_until(config, std::future::pending())
}

/// Runs a store, on a runtime of its own, until SIGTERM or SIGINT or until
/// `shutdown` completes (a test, or a program that embeds a store, stops
/// it this way; its socket is removed as on SIGTERM).
pub fn run_until(
    config: StoreConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| DaemonError::io("starting the runtime", e))?;
    rt.block_on(serve_until(config, shutdown))
}

/// Runs a store on the current tokio runtime until SIGTERM or SIGINT.
pub async fn serve(config: StoreConfig) -> Result<(), DaemonError> {
    serve_until(config, std::future::pending()).await
}

/// Runs a store on the current tokio runtime until SIGTERM or SIGINT or
/// until `shutdown` completes.
pub async fn serve_until(
    config: StoreConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), DaemonError> {
    let mut cluster_config = config.cluster()?;
    let caps = descriptor_budget(config.max_clients);
    if let Some(c) = &mut cluster_config {
        (c.grpc_connections, c.bulk_connections) = (caps.grpc, caps.bulk);
    }
    let (memory, why) = config.memory_size()?;
    let honest = config.check_backing(memory)?;
    let path = config.socket_path();
    // Writes without a round trip keep their claims just past the memory
    // objects are allocated in (crate::fast_writes); with huge pages, whose
    // count may be reserved to fit --memory, inside it.
    let area = match config.fast_writes && !config.hugepages {
        true => ferroplasma_protocol::fast_writes::AREA_BYTES as u64 + 64,
        false => 0,
    };
    let arena = Arena::create(memory + area, config.dir.as_deref(), config.hugepages)?;
    let (std_listener, mut socket_guard) =
        listener::bind(&path, config.socket_mode, config.replace_file)?;
    if config.keep_socket {
        socket_guard.keep();
    }
    if config.prefault {
        let t = std::time::Instant::now();
        arena.reserve()?;
        arena.prefault();
        tracing::info!(seconds = t.elapsed().as_secs_f64(), "prefaulted the arena");
    }
    let listener = UnixListener::from_std(std_listener)
        .map_err(|e| DaemonError::io("registering the socket", e))?;
    let (store, spill) = match (config.spill_limit()?, &config.spill_dir) {
        (Some((limit, why)), Some(dir)) => {
            let spill = SpillDir::create(dir)?;
            tracing::info!(dir = %spill.path().display(), limit = %human(limit), "spilling on ({why})");
            (Store::with_spill(memory, limit), Some(spill))
        }
        _ => (Store::new(memory), None),
    };
    // A slot serves one object, and an object takes at least 64 bytes of
    // the arena: more slots than that can never be used, and each costs 64
    // bytes touched at start.
    let useful_slots = (memory / 64).max(crate::config::DEFAULT_TABLE_SLOTS as u64);
    if config.table_slots as u64 > useful_slots {
        return Err(DaemonError::BadConfig(format!(
            "--table-slots {} is more than {memory} bytes of --memory can ever use (at most \
             {useful_slots}: one object per 64 bytes); each slot costs 64 bytes of memory",
            config.table_slots
        )));
    }
    let table = match config.table_slots {
        0 => None,
        // The table only saves round trips: a kernel that cannot seal it
        // (before Linux 5.1) gets a store without it, and is told.
        n => match SharedTable::create(n as usize, useful_slots as usize) {
            Ok(t) => Some(Arc::new(t)),
            Err(e) => {
                tracing::warn!(
                    "no object table in shared memory ({e}): every get asks the store over \
                     the socket"
                );
                None
            }
        },
    };
    // Bound before anything else starts: a taken port is a start-up error.
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(crate::metrics::bind(addr).await?),
        None => None,
    };
    let spills = spill.is_some();
    // Free pages go back to the kernel, except where the arena's memory is
    // promised up front: --prefault, and huge pages (giving them back gives
    // up their reservation).
    let give_back = !config.prefault && !config.hugepages && !arena.is_hugetlb();
    let shared = SharedRef::new(store, arena, spill, table);
    shared.lock().give_back_memory = give_back;
    shared.lock().quiet_looks_needed = config.give_back_after.as_secs_f64().ceil().max(1.0) as u32;
    if config.fast_writes && shared.lock().enable_fast_writes() {
        tracing::debug!("writes without a round trip are on");
        // Records clients wrote are taken in whenever anyone takes the
        // store's lock, and at the latest a few milliseconds later, so that
        // new objects appear in the shared table for other clients' reads.
        let probe = shared.lock().dirty_probe();
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut idle_looks = 0u32;
            loop {
                tokio::time::sleep(crate::fast_writes::next_look(idle_looks)).await;
                if probe.as_ref().is_some_and(|p| p.dirty()) {
                    drop(shared.lock());
                    idle_looks = 0;
                } else {
                    idle_looks = idle_looks.saturating_add(1);
                }
            }
        });
    }
    tokio::spawn(
        shared
            .spin()
            .clone()
            .run(std::time::Duration::from_micros(u64::from(config.spin_us))),
    );
    {
        // The table shrinks, and the arena's free pages go back, once a
        // second (when deletes made room for it). The kernel takes the pages
        // on a blocking thread, in steps whose memory is reserved meanwhile:
        // the store goes on answering (shared/memory.rs).
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
            loop {
                every.tick().await;
                let mut step = shared.lock().tidy_memory();
                while let Some(s) = step {
                    let blocks = s.blocks.clone();
                    let (s, result) = match tokio::task::spawn_blocking(move || {
                        let r = s.run();
                        (s, r)
                    })
                    .await
                    {
                        Ok(done) => done,
                        Err(e) => {
                            // A panic, or a runtime shutting down: the
                            // blocks are free again, untouched or not.
                            tracing::error!(error = %e, "giving free pages back failed");
                            shared.lock().abandon_give_back(&blocks);
                            break;
                        }
                    };
                    step = shared.lock().finish_give_back(s, result);
                }
            }
        });
    }
    if spills {
        // A spill directory removed under the store is noticed within a
        // second, even by a store nobody writes to.
        let shared = shared.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(crate::spill::RETRY_AFTER);
            loop {
                every.tick().await;
                shared.lock().check_spill_dir();
            }
        });
    }
    let cluster = match cluster_config {
        Some(c) => {
            let (store, events) = ClusterStore::register(shared.clone());
            Some(Cluster::start(c, Arc::new(store), events).await?)
        }
        None => None,
    };
    if let Some(listener) = metrics_listener {
        let instruments = shared.lock().instruments.clone();
        let registry = crate::metrics::registry(&instruments, shared.clone(), cluster.clone());
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "metrics at http://{addr}/metrics");
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    %addr,
                    "the metrics endpoint has no authentication and listens beyond this host: \
                     anyone who reaches {addr} reads the store's figures; bind it to 127.0.0.1 \
                     or firewall the port"
                );
            }
        }
        tokio::spawn(crate::metrics::serve(listener, caps.metrics, registry));
    }
    // Signals are ours before anyone is told the store is ready: a SIGINT
    // or SIGTERM that follows "ready" at once is never lost.
    let mut term = signal(SignalKind::terminate()).map_err(|e| DaemonError::io("SIGTERM", e))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| DaemonError::io("SIGINT", e))?;
    tracing::info!(
        socket = %path.display(),
        memory = %human(memory),
        "ferroplasma store ready ({why}; {honest}; backing: {})",
        match (&config.dir, config.hugepages) {
            (Some(d), _) => format!("file in {}", d.display()),
            (None, true) => "memfd, huge pages".into(),
            (None, false) => "memfd".into(),
        }
    );
    let clients = Arc::new(tokio::sync::Semaphore::new(config.max_clients as usize));
    // Other users the store allows (readers) may take at most half of the
    // slots: they can never lock the store's own user out.
    let readers = Arc::new(tokio::sync::Semaphore::new(
        (config.max_clients as usize / 2).max(1),
    ));
    let me = nix::unistd::geteuid().as_raw();
    // Refusals any local user can cause are logged at a bounded rate.
    let accept_failed = RateLimited::new();
    let (not_allowed, no_cred, busy) = (RateLimited::new(), RateLimited::new(), RateLimited::new());
    let parent_gone = parent_watch(config.exit_with_parent);
    tokio::pin!(parent_gone);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    match stream.peer_cred() {
                        Ok(c) if config.allows(c.uid(), c.gid()) => {
                            let reader = c.uid() != me && c.uid() != 0;
                            let permits = match clients.clone().try_acquire_owned() {
                                Ok(p) if !reader => Ok((p, None)),
                                Ok(p) => readers.clone().try_acquire_owned().map(|r| (p, Some(r))),
                                Err(e) => Err(e),
                            };
                            match permits {
                                Ok(permits) => {
                                    let (shared, cluster) = (shared.clone(), cluster.clone());
                                    tokio::spawn(async move {
                                        connection::serve(stream, shared, cluster).await;
                                        drop(permits);
                                    });
                                }
                                Err(_) => {
                                    if let Some(suppressed) = busy.admit() {
                                        tracing::warn!(
                                            max = config.max_clients, reader, suppressed,
                                            "connection refused: the store serves its maximum of \
                                             clients (--max-clients; other users: half of it)"
                                        );
                                    }
                                    tokio::spawn(connection::refuse_busy(stream, config.max_clients));
                                }
                            }
                        }
                        Ok(c) => {
                            if let Some(suppressed) = not_allowed.admit() {
                                tracing::warn!(
                                    uid = c.uid(), gid = c.gid(), pid = c.pid(), suppressed,
                                    "connection refused: user not allowed (see --allow-uid, --allow-gid)"
                                );
                            }
                        }
                        Err(e) => {
                            if let Some(suppressed) = no_cred.admit() {
                                tracing::warn!(error = %e, suppressed, "connection refused: no peer credentials");
                            }
                        }
                    }
                }
                Err(e) => {
                    // Out of descriptors or similar: back off, keep serving.
                    if let Some(suppressed) = accept_failed.admit() {
                        tracing::warn!(error = %e, suppressed, "accept failed");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: shutting down"); break; }
            _ = &mut shutdown => { tracing::info!("asked to stop: shutting down"); break; }
            _ = &mut parent_gone => {
                tracing::info!("the process that started the store exited: shutting down (--exit-with-parent)");
                break;
            }
        }
    }
    Ok(())
}

/// Raises the descriptor limit to the hard one and splits it between local
/// clients and the network ports: the network ports' caps.
fn descriptor_budget(max_clients: u32) -> NetworkCaps {
    let (limit, before) = descriptors::raise_limit();
    let caps = NetworkCaps::for_limit(limit, max_clients);
    tracing::debug!(
        limit,
        before,
        local_clients = descriptors::local_reserve(limit, max_clients),
        store = descriptors::OTHER,
        cluster = caps.grpc,
        bulk = caps.bulk,
        metrics = caps.metrics,
        "descriptors: the limit (the soft one raised to the hard one), those kept for \
         local clients and for the store, and each network port's cap"
    );
    caps
}

/// With `enabled`, completes when this process's parent has exited (it is
/// then adopted by another process); otherwise never.
async fn parent_watch(enabled: bool) {
    if !enabled {
        return std::future::pending().await;
    }
    let parent = nix::unistd::getppid();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        if nix::unistd::getppid() != parent {
            return;
        }
    }
}

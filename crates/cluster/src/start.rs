//! Starting a member: its ports, its two runtimes and threads, and the
//! tasks that run there: on the cluster's thread the bulk server, the
//! directory agent and the handling of membership changes; on the
//! heartbeat thread the peer service (which hands every call but
//! heartbeats and claims to the cluster's thread) and the heartbeat loop,
//! so that no bulk work delays a heartbeat or the failure detector.

use crate::cluster::{Cluster, ClusterConfig, Counters};
use crate::directory::agent;
use crate::directory::membership::{Changes, MemberInfo, Membership};
use crate::directory::ring::Ring;
use crate::directory::table::Directory;
use crate::error::ClusterError;
use crate::local::LocalStore;
use crate::peers::client::Peers;
use crate::peers::{heartbeat, service};
use crate::sync::lock;
use crate::transfer::client::TcpTransport;
use crate::transfer::copies::Copies;
use crate::transfer::server::serve_tcp;
use crate::transfer::source::StoreSource;
use ferroplasma_store::Notice;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

impl Cluster {
    /// Binds the gRPC and bulk listeners and starts the service, heartbeat and agent tasks on the
    /// cluster's own thread: nothing the store's thread does (a long
    /// batched get, a list of every object, a restore) can hold up
    /// heartbeats or the answers other members wait for.
    pub async fn start(
        mut cfg: ClusterConfig,
        store: Arc<dyn LocalStore>,
        events: mpsc::UnboundedReceiver<Notice>,
    ) -> Result<Arc<Self>, ClusterError> {
        let handle = runtime_thread("fp-cluster")?;
        let hb = runtime_thread("fp-heartbeat")?;
        // Sockets belong to the runtime they are registered with: the
        // gRPC port the heartbeat thread's, the bulk port the cluster's.
        let in_hb_rt = hb.enter();
        let bind = |addr: SocketAddr, what: String| {
            std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| ClusterError::io(what, e))
        };
        let grpc = bind(
            cfg.listen,
            format!("binding --cluster-listen {}", cfg.listen),
        )?;
        drop(in_hb_rt);
        let _in_cluster_rt = handle.enter();
        // `--cluster-listen HOST:0`: the system picks the port, and the
        // member advertises the one it got (tests use this: no port is
        // chosen, freed and bound again, with a race in between).
        if cfg.listen.port() == 0 {
            let port = grpc
                .local_addr()
                .map_err(|e| ClusterError::io("cluster port", e))?
                .port();
            if let Some(host) = cfg.advertise.strip_suffix(":0") {
                cfg.advertise = format!("{host}:{port}");
            }
        }
        let bulk = bind(
            cfg.data_listen,
            format!("binding the data port {}", cfg.data_listen),
        )?;
        let bulk_port = bulk
            .local_addr()
            .map_err(|e| ClusterError::io("data port address", e))?
            .port();
        let host = cfg
            .advertise
            .rsplit_once(':')
            .map_or(cfg.advertise.as_str(), |(h, _)| h);
        let data_addr = format!("{host}:{bulk_port}");
        let mut inc = [0u8; 8];
        getrandom::fill(&mut inc).map_err(|e| {
            ClusterError::io("random incarnation", std::io::Error::other(e.to_string()))
        })?;
        let token: Arc<str> = cfg.token.as_str().into();
        let mut membership =
            Membership::new(&cfg.advertise, cfg.peer_timeout).with_grace(cfg.heartbeat);
        membership.learn(cfg.peers.iter().map(String::as_str));
        let (ring_changes, mut changes) = mpsc::unbounded_channel::<Changes>();
        let cluster = Arc::new(Self {
            me: cfg.advertise.clone(),
            data_addr,
            incarnation: u64::from_le_bytes(inc) | 1,
            token: token.clone(),
            heartbeat: cfg.heartbeat,
            store,
            ring: Mutex::new(Ring::new([cfg.advertise.clone()])),
            membership: Mutex::new(membership),
            directory: Mutex::new(Directory::new()),
            directory_changed: Notify::new(),
            rejoin: Notify::new(),
            updates_sent: Notify::new(),
            started: std::time::Instant::now(),
            peer_timeout: cfg.peer_timeout,
            directory_epoch: AtomicU64::new(0),
            granted: Mutex::new(HashSet::default()),
            fresh: Mutex::new(Vec::new()),
            refilling: std::sync::atomic::AtomicBool::new(false),
            cached: Mutex::new(Copies::default()),
            inflight: Mutex::new(HashMap::default()),
            peers: Peers::new(&token, cfg.peer_timeout, handle.clone())?,
            hb_peers: Peers::new(&token, cfg.peer_timeout, hb.clone())?,
            ring_changes,
            info: Mutex::new(MemberInfo::default()),
            rt: handle.clone(),
            transport: Box::new(TcpTransport::new(token.clone(), cfg.peer_timeout)),
            counters: Counters::default(),
        });
        {
            // Alone in its ring, and with an empty store: complete for it.
            let me = [cluster.me.clone()];
            let fingerprint = cluster.fingerprint(&me);
            let mut d = lock(&cluster.directory);
            d.set_ring(fingerprint, me.to_vec());
            d.synced(&cluster.me, fingerprint);
        }
        cluster.refresh_info();
        let grpc = service::guard(cfg.grpc_connections, cfg.peer_timeout).incoming(grpc);
        hb.spawn(service::serve(cluster.clone(), grpc));
        handle.spawn(serve_tcp(
            bulk,
            cfg.bulk_connections,
            token,
            Arc::new(StoreSource(cluster.clone())),
            cfg.peer_timeout,
        ));
        handle.spawn(agent::run(cluster.clone(), events));
        let c = cluster.clone();
        handle.spawn(async move {
            while let Some(ch) = changes.recv().await {
                c.apply(ch).await;
            }
        });
        handle.spawn(heartbeat::refresh_info(cluster.clone()));
        hb.spawn(heartbeat::run(cluster.clone()));
        tracing::info!(
            me = %cluster.me, data = %cluster.data_addr, peers = ?cfg.peers,
            heartbeat_ms = cfg.heartbeat.as_millis() as u64,
            peer_timeout_ms = cfg.peer_timeout.as_millis() as u64,
            "cluster member ready"
        );
        Ok(cluster)
    }
}

/// A current-thread runtime driven by a thread of its own, named `name`.
fn runtime_thread(name: &str) -> Result<tokio::runtime::Handle, ClusterError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClusterError::io(format!("starting the runtime of {name}"), e))?;
    let handle = rt.handle().clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || rt.block_on(std::future::pending::<()>()))
        .map_err(|e| ClusterError::io(format!("starting the thread {name}"), e))?;
    Ok(handle)
}

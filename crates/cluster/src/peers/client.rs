//! gRPC calls to other members: one lazily connected channel per member,
//! the token attached to every call, and a deadline on each.

use crate::error::ClusterError;
use crate::pb;
use crate::pb::peer_client::PeerClient;
use crate::peers::token::Attach;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// A client for one member.
pub type Client = PeerClient<InterceptedService<Channel, Attach>>;

/// Channels to the other members.
#[derive(Debug)]
pub struct Peers {
    attach: Attach,
    timeout: Duration,
    channels: Mutex<HashMap<String, Client>>,
    /// The cluster's runtime: channels run their connections there, so a
    /// busy store thread never stalls a heartbeat.
    rt: tokio::runtime::Handle,
}

impl Peers {
    /// Calls carry `token` and give up after `timeout` (lookups that wait
    /// get their wait on top).
    pub fn new(
        token: &str,
        timeout: Duration,
        rt: tokio::runtime::Handle,
    ) -> Result<Self, ClusterError> {
        let value = token.parse().map_err(|_| {
            ClusterError::BadConfig("--cluster-token must be printable ASCII".into())
        })?;
        Ok(Self {
            attach: Attach(value),
            timeout,
            channels: Mutex::new(HashMap::new()),
            rt,
        })
    }

    /// The client for member `addr` (connected on first use).
    pub fn get(&self, addr: &str) -> Result<Client, tonic::Status> {
        if let Some(c) = lock(&self.channels).get(addr) {
            return Ok(c.clone());
        }
        let ep = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| tonic::Status::invalid_argument(format!("member address {addr}: {e}")))?
            .connect_timeout(self.timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.timeout)
            .keep_alive_timeout(self.timeout);
        let channel = {
            let _in_cluster_rt = self.rt.enter();
            ep.connect_lazy()
        };
        let c = PeerClient::with_interceptor(channel, self.attach.clone())
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        lock(&self.channels).insert(addr.to_string(), c.clone());
        Ok(c)
    }

    /// Drops the channel to a member (it died or restarted).
    pub fn forget(&self, addr: &str) {
        lock(&self.channels).remove(addr);
    }

    /// The deadline of a call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A request with this call's deadline (`extra` on top of the default).
    pub fn request<T>(&self, msg: T, extra: Duration) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout + extra);
        r
    }

    /// Sends a heartbeat.
    pub async fn heartbeat(
        &self,
        addr: &str,
        msg: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatReply, tonic::Status> {
        let mut c = self.get(addr)?;
        Ok(c.heartbeat(self.request(msg, Duration::ZERO))
            .await?
            .into_inner())
    }
}

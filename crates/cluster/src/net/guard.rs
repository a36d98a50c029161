//! The network ports' guard: a cap on connections at once and deadlines on
//! each connection, for the cluster's gRPC and bulk ports and the metrics
//! endpoint (docs/cluster.md, "Network ports").
//!
//! A [`Guard`] wraps a port's listener into an [`Incoming`]: each accepted
//! connection holds one of the port's permits until it is closed, and one
//! accepted while every permit is taken is closed at once. The HTTP ports
//! take [`Guarded`] connections (an [`Incoming`] is a stream of them for
//! tonic's `serve_with_incoming` and an `axum::serve::Listener`): a
//! connection that sends nothing within the hello deadline of being
//! accepted, or that moves no byte either way for the idle timeout after
//! that, is closed. The bulk port takes [`Admitted`] connections and keeps
//! its own deadlines (its hello and token, then requests).
//!
//! Refusals (over the cap, hello deadline passed) and failed accepts are
//! logged at most once per 10 s per port and kind ([`RateLimited`]).
//!
//! Why by hand: tonic and hyper offer HTTP/2 keep-alive pings (a stranger's
//! HTTP/2 stack answers them, which would keep its connection open) and a
//! maximum connection age, axum nothing; none of them caps connections or
//! bounds the time to a connection's first bytes (hyper's HTTP/1 header
//! timeout needs a timer axum does not set). So this is the glue: a
//! semaphore permit per connection and a timer in its reads and writes.

use crate::net::rate_log::RateLimited;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The time a connection to the gRPC or metrics port may stay without
/// sending a byte.
pub const HELLO: Duration = Duration::from_secs(3);

/// Pause after a failed accept (out of descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// One port's cap and deadlines, and its refusals' log lines.
#[derive(Debug)]
pub struct Guard {
    port: &'static str,
    cap: usize,
    hello: Duration,
    idle: Duration,
    slots: Arc<Semaphore>,
    over_cap: RateLimited,
    no_hello: RateLimited,
    accept_failed: RateLimited,
}

impl Guard {
    /// A guard for the port named `port` (in log lines): at most `cap`
    /// connections at once, each closed when it sends nothing within
    /// `hello` of being accepted or moves nothing for `idle` after that.
    pub fn new(port: &'static str, cap: usize, hello: Duration, idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            port,
            cap,
            hello,
            idle,
            slots: Arc::new(Semaphore::new(cap)),
            over_cap: RateLimited::new(),
            no_hello: RateLimited::new(),
            accept_failed: RateLimited::new(),
        })
    }

    /// The hello deadline.
    pub fn hello(&self) -> Duration {
        self.hello
    }

    /// The idle timeout.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// Takes `listener`'s connections under this guard.
    pub fn incoming(self: &Arc<Self>, listener: TcpListener) -> Incoming {
        Incoming {
            listener,
            guard: self.clone(),
            backoff: None,
        }
    }

    /// Logs (rate-limited) that `peer` sent no hello within the deadline.
    pub fn no_hello(&self, peer: Option<SocketAddr>) {
        if let Some(suppressed) = self.no_hello.admit() {
            tracing::warn!(
                port = self.port,
                ?peer,
                suppressed,
                "connection closed: nothing received within {:?} of being accepted",
                self.hello
            );
        }
    }

    fn over_cap(&self, peer: SocketAddr) {
        if let Some(suppressed) = self.over_cap.admit() {
            tracing::warn!(
                port = self.port, %peer, suppressed,
                "connection refused: {} connections are open on this port already (its cap)",
                self.cap
            );
        }
    }

    fn accept_failed(&self, e: &io::Error) {
        if let Some(suppressed) = self.accept_failed.admit() {
            tracing::warn!(port = self.port, error = %e, suppressed, "accept failed");
        }
    }
}

/// A connection let in: the stream, who it is from, and its permit.
#[derive(Debug)]
pub struct Admitted {
    /// The connection.
    pub stream: TcpStream,
    /// Its peer.
    pub peer: SocketAddr,
    /// Its place under the cap, given back when dropped.
    pub permit: OwnedSemaphorePermit,
}

/// A listener's connections under a [`Guard`].
#[derive(Debug)]
pub struct Incoming {
    listener: TcpListener,
    guard: Arc<Guard>,
    backoff: Option<Pin<Box<Sleep>>>,
}

impl Incoming {
    /// The next connection under the cap; those over it are closed.
    pub async fn admit(&mut self) -> Admitted {
        std::future::poll_fn(|cx| self.poll_admit(cx)).await
    }

    fn poll_admit(&mut self, cx: &mut Context<'_>) -> Poll<Admitted> {
        loop {
            if let Some(b) = &mut self.backoff {
                ready!(b.as_mut().poll(cx));
                self.backoff = None;
            }
            match ready!(self.listener.poll_accept(cx)) {
                Ok((stream, peer)) => match self.guard.slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let _ = stream.set_nodelay(true);
                        return Poll::Ready(Admitted {
                            stream,
                            peer,
                            permit,
                        });
                    }
                    Err(_) => {
                        self.guard.over_cap(peer);
                        drop(stream);
                    }
                },
                // The peer gave up before it was accepted.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // Out of descriptors or the like: pause, keep serving.
                    self.guard.accept_failed(&e);
                    self.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_BACKOFF)));
                }
            }
        }
    }

    fn poll_guarded(&mut self, cx: &mut Context<'_>) -> Poll<Guarded> {
        let a = ready!(self.poll_admit(cx));
        Poll::Ready(Guarded::new(a, self.guard.clone()))
    }
}

impl futures_core::Stream for Incoming {
    type Item = io::Result<Guarded>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_guarded(cx).map(|g| Some(Ok(g)))
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Guarded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Guarded, SocketAddr) {
        let g = std::future::poll_fn(|cx| self.poll_guarded(cx)).await;
        let peer = g.peer;
        (g, peer)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// A connection that is closed (its reads and writes fail with
/// `TimedOut`) when it sends nothing within its guard's hello deadline of
/// being accepted, or when no byte moves either way for the idle timeout
/// after that. It holds its place under the cap until dropped.
#[derive(Debug)]
pub struct Guarded {
    io: TcpStream,
    peer: SocketAddr,
    guard: Arc<Guard>,
    _permit: OwnedSemaphorePermit,
    accepted: Instant,
    /// When a byte last moved, once the peer has sent one.
    active: Option<Instant>,
    /// Wakes the connection at (or before) its deadline.
    timer: Pin<Box<Sleep>>,
}

impl Guarded {
    fn new(a: Admitted, guard: Arc<Guard>) -> Self {
        let accepted = Instant::now();
        Self {
            io: a.stream,
            peer: a.peer,
            timer: Box::pin(tokio::time::sleep_until(accepted + guard.hello)),
            guard,
            _permit: a.permit,
            accepted,
            active: None,
        }
    }

    fn deadline(&self) -> Instant {
        match self.active {
            Some(t) => t + self.guard.idle,
            None => self.accepted + self.guard.hello,
        }
    }

    /// Whether the deadline has passed (the task is woken at it otherwise);
    /// logs a hello deadline passed.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.deadline();
            if due <= Instant::now() {
                match self.active {
                    None => self.guard.no_hello(Some(self.peer)),
                    Some(_) => tracing::debug!(port = self.guard.port, peer = %self.peer,
                        "connection closed: idle for {:?}", self.guard.idle),
                }
                return true;
            }
            // Activity moved the deadline on since the timer was set.
            self.timer.as_mut().reset(due);
        }
    }

    fn timed_out<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.expired(cx) {
            Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection's deadline passed",
            )))
        } else {
            Poll::Pending
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.active = Some(Instant::now());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.timed_out(cx),
        }
    }
}

impl Guarded {
    /// What a write returned, noting progress (only once the peer has
    /// spoken: what this side sends first does not keep it open).
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 && self.active.is_some() {
                    self.active = Some(Instant::now());
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.timed_out(cx),
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Guarded {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;

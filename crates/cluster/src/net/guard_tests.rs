use super::*;
use futures_core::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MS: Duration = Duration::from_millis(1);

/// A port with `cap`, a 300 ms hello deadline and a 600 ms idle timeout,
/// echoing what its connections send; its address.
async fn echo_port(cap: usize) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let mut incoming = Guard::new("test", cap, 300 * MS, 600 * MS).incoming(l);
    tokio::spawn(async move {
        loop {
            let Some(Ok(mut c)) =
                std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await
            else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n @ 1..) = c.read(&mut buf).await {
                    if c.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// How long until the port closes `s` (reads give 0 or fail); `None`
/// when it is still open after `within`.
async fn closed_after(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout_at(t + within, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0) | Err(_)) => return Some(t.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once() {
    let addr = echo_port(2).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        held.push(s);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    let t = closed_after(&mut third, 200 * MS).await;
    assert!(t.is_some_and(|t| t < 100 * MS), "{t:?}");
    // A place freed is taken again.
    drop(held.pop());
    tokio::time::sleep(50 * MS).await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    again.write_all(b"y").await.unwrap();
    let mut b = [0u8; 1];
    again.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"y");
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_hello_deadline() {
    let addr = echo_port(8).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let t = closed_after(&mut s, 2000 * MS).await.expect("closed");
    assert!(t >= 250 * MS && t < 600 * MS, "closed after {t:?}");
}

#[tokio::test]
async fn after_the_hello_a_connection_lives_while_bytes_move() {
    let addr = echo_port(8).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // Talks every 200 ms for 1.2 s: past the hello deadline and twice the
    // idle timeout, it stays open.
    let mut b = [0u8; 1];
    for _ in 0..6 {
        s.write_all(b"z").await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        tokio::time::sleep(200 * MS).await;
    }
    // Then silent: closed one idle timeout after the last byte.
    let t = closed_after(&mut s, 2000 * MS).await.expect("closed");
    assert!(
        t >= 300 * MS && t < 1000 * MS,
        "closed {t:?} after going quiet"
    );
}

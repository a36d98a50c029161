//! A store embedded in another program (as the C library's tests and the
//! Python package do): started on a thread with `run_until`, stopped by its
//! shutdown future, not only by a signal to the whole process.

use ferroplasma_client::{Client, ObjectId};
use ferroplasma_daemon::config::StoreConfig;
use std::time::{Duration, Instant};

#[test]
fn an_embedded_store_stops_when_its_shutdown_future_completes() {
    let dir = std::env::temp_dir().join(format!("fp-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("store.sock");
    let mut cfg = StoreConfig::new();
    cfg.memory = Some(16 << 20);
    cfg.socket = Some(socket.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let store = std::thread::spawn(move || {
        ferroplasma_daemon::run_until(cfg, async {
            let _ = stopped.await;
        })
    });
    let t = Instant::now();
    let client = loop {
        match Client::connect(Some(&socket)) {
            Ok(c) => break c,
            Err(e) => assert!(t.elapsed() < Duration::from_secs(20), "no store: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let id = ObjectId::random();
    client.put(id, b"before the stop", b"").unwrap();
    assert_eq!(client.contains(&[id]).unwrap(), vec![true]);

    stop.send(()).unwrap();
    let t = Instant::now();
    while !store.is_finished() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the store did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    store.join().unwrap().expect("a clean stop");
    assert!(!socket.exists(), "its socket is removed, as on SIGTERM");
    assert!(Client::connect(Some(&socket)).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

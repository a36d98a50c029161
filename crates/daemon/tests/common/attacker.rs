//! What an attacker's test needs: a store whose log the test reads, and a
//! hand-made handshake that keeps every descriptor the store sends.

use super::{bin, temp_dir};
use ferroplasma_client::Client;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A store whose log goes to a file the test reads.
pub struct LoggedStore {
    pub child: Child,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl LoggedStore {
    pub fn start(memory: &str, extra: &[&str]) -> Self {
        let dir = temp_dir("trust");
        let (socket, log) = (dir.join("store.sock"), dir.join("store.log"));
        let child = Command::new(bin())
            .args(["store", "--memory", memory, "--socket"])
            .arg(&socket)
            .args(extra)
            .env("FERROPLASMA_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn ferroplasma store");
        let t = Instant::now();
        while Client::connect(Some(&socket)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "store did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self {
            child,
            dir,
            socket,
            log,
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(Some(&self.socket)).expect("connect")
    }

    pub fn log_lines(&self, containing: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }

    /// CPU seconds the store process has used (user + system).
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let after = stat.rsplit_once(')').unwrap().1;
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks as f64
            / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .unwrap()
                .unwrap() as f64
    }
}

impl Drop for LoggedStore {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects by hand, as a hostile client would, and keeps every descriptor
/// the store sends: the arena, the table and the holds region.
pub fn raw_handshake(
    socket: &std::path::Path,
) -> (
    ferroplasma_protocol::pb::ConnectReply,
    Vec<std::os::fd::OwnedFd>,
) {
    let (s, reply, fds) = raw_connection(socket);
    std::mem::forget(s); // the connection stays open while the test runs
    (reply, fds)
}

/// [`raw_handshake`], keeping the connection to send more by hand.
pub fn raw_connection(
    socket: &std::path::Path,
) -> (
    std::os::unix::net::UnixStream,
    ferroplasma_protocol::pb::ConnectReply,
    Vec<std::os::fd::OwnedFd>,
) {
    use ferroplasma_protocol::frame::{write_message, FrameCodec};
    use ferroplasma_protocol::pb::{self, reply, request};
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let req = pb::Request {
        request_id: 1,
        body: Some(request::Body::Connect(pb::Connect {
            protocol_version: ferroplasma_protocol::PROTOCOL_VERSION,
            client_name: "attacker".into(),
        })),
    };
    write_message(&mut s, &req).unwrap();
    let (mut fds, mut buf, mut chunk) = (Vec::new(), bytes::BytesMut::new(), vec![0u8; 4096]);
    loop {
        if let Some(r) = FrameCodec::REPLIES
            .decode_message::<pb::Reply>(&mut buf)
            .unwrap()
        {
            let Some(reply::Body::Connect(c)) = r.body else {
                panic!("no Connect reply: {r:?}");
            };
            return (s, c, fds);
        }
        let mut cmsg = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
        let msg =
            recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty()).unwrap();
        let n = msg.bytes;
        for c in msg.cmsgs().unwrap() {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // Safety: the kernel just installed these descriptors for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        assert!(n > 0, "the store hung up during the handshake");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether `fd` can be written in any way: reopened read-write through
/// /proc, then written or mapped shared and writable.
pub fn writable_somehow(fd: &std::os::fd::OwnedFd) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) => return Err(format!("reopen refused: {e}")),
    };
    let mut why = Vec::new();
    match std::os::unix::fs::FileExt::write_at(&f, &[0u8; 8], 4096) {
        Ok(_) => return Ok(()),
        Err(e) => why.push(format!("write refused: {e}")),
    }
    // Safety: a fresh mapping of a file nobody else in this process maps;
    // it is unmapped at once.
    match unsafe { memmap2::MmapOptions::new().len(4096).map_mut(&f) } {
        Ok(_) => Ok(()),
        Err(e) => {
            why.push(format!("writable mapping refused: {e}"));
            Err(why.join("; "))
        }
    }
}

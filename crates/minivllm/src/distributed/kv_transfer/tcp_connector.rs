//! The KV pull over TCP: a prefill server keeps each finished request's encoded
//! [`KvPayload`](super::KvPayload) under a random key until a decode server pulls it (once)
//! or it times out; a decode server pulls it before its request reaches the engine.
//!
//! Framing (all integers little-endian): the puller sends `MVKV`, version byte 1, op byte 1
//! (pull), a u16 key length and the key; the server answers one status byte (0: found, 1:
//! unknown or expired key), then, if found, a u64 length and the payload's bytes, and
//! closes. The connection carries no authentication: keep the port on the cluster's
//! network, as vLLM's NIXL side channel.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAGIC: &[u8; 4] = b"MVKV";
const VERSION: u8 = 1;
const OP_PULL: u8 = 1;
/// Pulls served at once; more wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 32;
/// A puller must send its key within this, and take the payload within `SEND_TIMEOUT`.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Longer keys are not ours (ours are 32 hex digits).
const MAX_KEY_LEN: usize = 256;

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum KvTransferError {
    #[error("KV transfer with {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("KV transfer with {addr} timed out after {secs} s")]
    Timeout { addr: String, secs: u64 },
    #[error("{addr} holds no KV under that request id (pulled already, or expired)")]
    NotFound { addr: String },
    #[error("{addr} sent {len} bytes of KV, over the {max} this engine accepts")]
    TooLarge { addr: String, len: u64, max: u64 },
    #[error("{addr} answered with status {status}")]
    BadStatus { addr: String, status: u8 },
}

/// Payloads waiting to be pulled, oldest first, within a byte budget.
struct Stash {
    entries: VecDeque<(String, Instant, Arc<Vec<u8>>)>,
    bytes: u64,
    capacity: u64,
    timeout: Duration,
}

impl Stash {
    /// Drops what has waited past the timeout.
    fn expire(&mut self, now: Instant) {
        while let Some((_, at, p)) = self.entries.front() {
            if now.duration_since(*at) < self.timeout {
                break;
            }
            self.bytes -= p.len() as u64;
            self.entries.pop_front();
        }
    }

    /// Keeps `payload`, dropping the oldest ones while the budget is short (a decode
    /// server that pulls them late recomputes its prompt). One larger than the whole budget
    /// is not kept.
    fn put(&mut self, key: String, payload: Arc<Vec<u8>>, now: Instant) -> bool {
        self.expire(now);
        let len = payload.len() as u64;
        if len > self.capacity {
            return false;
        }
        while self.bytes + len > self.capacity {
            let (_, _, old) = self.entries.pop_front().expect("bytes > 0");
            self.bytes -= old.len() as u64;
        }
        self.bytes += len;
        self.entries.push_back((key, now, payload));
        true
    }

    fn take(&mut self, key: &str, now: Instant) -> Option<Arc<Vec<u8>>> {
        self.expire(now);
        let at = self.entries.iter().position(|(k, _, _)| k == key)?;
        let (_, _, p) = self.entries.remove(at).expect("found");
        self.bytes -= p.len() as u64;
        Some(p)
    }
}

/// The prefill server's side: a listener thread serving pulls of stashed payloads. Dropped,
/// it stops listening (within its 20 ms poll) and frees what it held.
pub struct KvExportServer {
    addr: SocketAddr,
    stash: Arc<Mutex<Stash>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KvExportServer {
    /// Listens on `host:port` (port 0: any free one). Payloads wait at most `timeout` and
    /// take at most `capacity` bytes together.
    pub fn start(host: &str, port: u16, capacity: u64, timeout: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind((host, port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stash = Arc::new(Mutex::new(Stash {
            entries: VecDeque::new(),
            bytes: 0,
            capacity,
            timeout,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (Arc::clone(&stash), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("minivllm-kv-export".into())
            .spawn(move || serve(listener, &s, &st))?;
        Ok(Self {
            addr,
            stash,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keeps an encoded payload for one pull under `key`; false if it is larger than the
    /// whole budget (`kv_buffer_size`).
    pub fn stash(&self, key: String, payload: Vec<u8>) -> bool {
        let mut s = self.stash.lock().unwrap_or_else(|e| e.into_inner());
        s.put(key, Arc::new(payload), Instant::now())
    }

    /// Bytes held for pulls not yet made.
    pub fn held_bytes(&self) -> u64 {
        let mut s = self.stash.lock().unwrap_or_else(|e| e.into_inner());
        s.expire(Instant::now());
        s.bytes
    }
}

impl Drop for KvExportServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: TcpListener, stash: &Arc<Mutex<Stash>>, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let mut last_expiry = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // Payloads expire even when no pull comes to drop them.
        if last_expiry.elapsed() > Duration::from_secs(1) {
            last_expiry = Instant::now();
            stash
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .expire(last_expiry);
        }
        // At the limit, new pulls wait in the backlog rather than be dropped.
        if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        match listener.accept() {
            Ok((conn, peer)) => {
                active.fetch_add(1, Ordering::Relaxed);
                let (stash, done) = (Arc::clone(stash), Arc::clone(&active));
                let spawned = std::thread::Builder::new()
                    .name("minivllm-kv-pull".into())
                    .spawn(move || {
                        if let Err(e) = answer_pull(conn, &stash) {
                            tracing::warn!(%peer, "KV pull failed: {e}");
                        }
                        done.fetch_sub(1, Ordering::Relaxed);
                    });
                if let Err(e) = spawned {
                    active.fetch_sub(1, Ordering::Relaxed);
                    tracing::warn!("cannot start a KV pull thread: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => {
                tracing::warn!("KV export listener: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn answer_pull(mut conn: TcpStream, stash: &Mutex<Stash>) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_write_timeout(Some(SEND_TIMEOUT))?;
    // One deadline for the whole request, however slowly its bytes come.
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut head = [0u8; 8];
    read_exact_by(&mut conn, &mut head, deadline)?;
    if &head[..4] != MAGIC || head[4] != VERSION || head[5] != OP_PULL {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a KV pull request",
        ));
    }
    let key_len = u16::from_le_bytes([head[6], head[7]]) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a key of {key_len} bytes"),
        ));
    }
    let mut key = vec![0u8; key_len];
    read_exact_by(&mut conn, &mut key, deadline)?;
    let key = String::from_utf8_lossy(&key);
    let found = (stash.lock().unwrap_or_else(|e| e.into_inner())).take(&key, Instant::now());
    match found {
        None => conn.write_all(&[1]),
        Some(p) => {
            conn.write_all(&[0])?;
            conn.write_all(&(p.len() as u64).to_le_bytes())?;
            conn.write_all(&p)
        }
    }
}

/// `read_exact`, failing once `deadline` passes.
fn read_exact_by(conn: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(left))?;
        match conn.read(&mut buf[filled..])? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => filled += n,
        }
    }
    Ok(())
}

/// Pulls the payload kept under `key` at `host:port`: at most `max_bytes`, all within
/// `timeout`.
pub async fn fetch(
    host: &str,
    port: u16,
    key: &str,
    max_bytes: u64,
    timeout: Duration,
) -> Result<Vec<u8>, KvTransferError> {
    let addr = format!("{host}:{port}");
    let pull = async {
        let io = |source| KvTransferError::Io {
            addr: addr.clone(),
            source,
        };
        let mut conn = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(io)?;
        let key = key.as_bytes();
        let mut req = Vec::with_capacity(8 + key.len());
        req.extend(MAGIC);
        req.extend([VERSION, OP_PULL]);
        req.extend((key.len().min(u16::MAX as usize) as u16).to_le_bytes());
        req.extend(&key[..key.len().min(u16::MAX as usize)]);
        conn.write_all(&req).await.map_err(io)?;
        match conn.read_u8().await.map_err(io)? {
            0 => {}
            1 => return Err(KvTransferError::NotFound { addr: addr.clone() }),
            status => {
                return Err(KvTransferError::BadStatus {
                    addr: addr.clone(),
                    status,
                })
            }
        }
        let len = conn.read_u64_le().await.map_err(io)?;
        if len > max_bytes {
            return Err(KvTransferError::TooLarge {
                addr: addr.clone(),
                len,
                max: max_bytes,
            });
        }
        // Grown as bytes arrive, not reserved on the sender's word.
        let mut payload = Vec::with_capacity(len.min(1 << 20) as usize);
        (&mut conn)
            .take(len)
            .read_to_end(&mut payload)
            .await
            .map_err(io)?;
        if payload.len() as u64 != len {
            let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "payload cut short");
            return Err(io(eof));
        }
        Ok(payload)
    };
    tokio::time::timeout(timeout, pull)
        .await
        .unwrap_or_else(|_| {
            Err(KvTransferError::Timeout {
                addr: addr.clone(),
                secs: timeout.as_secs(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(capacity: u64, timeout: Duration) -> KvExportServer {
        KvExportServer::start("127.0.0.1", 0, capacity, timeout).unwrap()
    }

    async fn pull(s: &KvExportServer, key: &str) -> Result<Vec<u8>, KvTransferError> {
        let port = s.local_addr().port();
        fetch("127.0.0.1", port, key, 1 << 20, Duration::from_secs(5)).await
    }

    #[tokio::test]
    async fn a_payload_is_pulled_once() {
        let s = server(1 << 20, Duration::from_secs(60));
        assert!(s.stash("a".into(), vec![1, 2, 3]));
        assert_eq!(s.held_bytes(), 3);
        assert_eq!(pull(&s, "a").await.unwrap(), vec![1, 2, 3]);
        assert!(matches!(
            pull(&s, "a").await,
            Err(KvTransferError::NotFound { .. })
        ));
        assert_eq!(s.held_bytes(), 0);
    }

    #[tokio::test]
    async fn the_budget_drops_the_oldest_and_refuses_what_never_fits() {
        let s = server(10, Duration::from_secs(60));
        assert!(s.stash("a".into(), vec![0; 6]));
        assert!(s.stash("b".into(), vec![0; 6]));
        assert_eq!(s.held_bytes(), 6);
        assert!(matches!(
            pull(&s, "a").await,
            Err(KvTransferError::NotFound { .. })
        ));
        assert!(!s.stash("c".into(), vec![0; 11]));
        assert_eq!(pull(&s, "b").await.unwrap().len(), 6);
    }

    #[tokio::test]
    async fn unpulled_payloads_expire() {
        let s = server(1 << 20, Duration::from_millis(50));
        assert!(s.stash("a".into(), vec![0; 100]));
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(s.held_bytes(), 0);
        assert!(matches!(
            pull(&s, "a").await,
            Err(KvTransferError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn a_payload_over_the_pullers_limit_is_refused() {
        let s = server(1 << 20, Duration::from_secs(60));
        assert!(s.stash("a".into(), vec![0; 100]));
        let port = s.local_addr().port();
        let r = fetch("127.0.0.1", port, "a", 99, Duration::from_secs(5)).await;
        assert!(matches!(r, Err(KvTransferError::TooLarge { len: 100, .. })));
    }

    #[tokio::test]
    async fn more_pulls_than_threads_wait_their_turn() {
        let s = server(1 << 20, Duration::from_secs(60));
        for k in 0..(MAX_CONNECTIONS + 8) {
            assert!(s.stash(format!("k{k}"), vec![k as u8; 1000]));
        }
        let pulls = (0..(MAX_CONNECTIONS + 8)).map(|k| {
            let port = s.local_addr().port();
            async move {
                let key = format!("k{k}");
                fetch("127.0.0.1", port, &key, 1 << 20, Duration::from_secs(10)).await
            }
        });
        for (k, r) in futures_util::future::join_all(pulls)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(r.unwrap(), vec![k as u8; 1000]);
        }
    }

    #[tokio::test]
    async fn garbage_on_the_port_does_not_stop_the_server() {
        let s = server(1 << 20, Duration::from_secs(60));
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        drop(c);
        // A key far longer than ours is refused before it is read.
        let mut c = TcpStream::connect(s.local_addr()).unwrap();
        c.write_all(&[b'M', b'V', b'K', b'V', 1, 1, 0xff, 0xff])
            .unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        assert!(answer.is_empty(), "{answer:?}");
        assert!(s.stash("a".into(), vec![7]));
        assert_eq!(pull(&s, "a").await.unwrap(), vec![7]);
    }
}

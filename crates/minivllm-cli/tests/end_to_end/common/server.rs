//! A real `minivllm serve` on a free loopback port, and a minimal HTTP client to talk to it.
//! Included with `#[path]` by the test files that start a server, so the others do not
//! compile it unused.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the server however the test ends, so a failed assertion leaves no process behind.
pub struct Server {
    pub child: Child,
    pub port: u16,
    /// `child` is mpirun, which must be signalled, not killed: killed, it would leave its
    /// ranks behind.
    launcher: bool,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.launcher {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(model: &str) -> Server {
    start_with(model, &[])
}

pub fn start_with(model: &str, extra: &[&str]) -> Server {
    start_under(
        Command::new(env!("CARGO_BIN_EXE_minivllm")),
        model,
        extra,
        false,
    )
}

/// The server's resident memory.
pub fn rss_kib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The server under an address-space limit of `bytes` (`prlimit --as`, which then runs the
/// binary in its own process, so the server's pid is the child's).
pub fn start_capped(model: &str, bytes: u64, extra: &[&str]) -> Server {
    let mut prlimit = Command::new("prlimit");
    prlimit
        .arg(format!("--as={bytes}"))
        .arg(env!("CARGO_BIN_EXE_minivllm"));
    start_under(prlimit, model, extra, false)
}

/// The server as `mpirun` starts it: `ranks` processes of one tensor-parallel group
/// (`child` is mpirun).
pub fn start_ranks(ranks: usize, model: &str, extra: &[&str]) -> Server {
    let mut mpirun = Command::new("mpirun");
    mpirun
        .args(["--allow-run-as-root", "--oversubscribe", "-n"])
        .arg(ranks.to_string())
        .arg(env!("CARGO_BIN_EXE_minivllm"));
    let tp = ranks.to_string();
    let args: Vec<&str> = ["--tensor-parallel-size", &tp, "--threads", "1"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    start_under(mpirun, model, &args, true)
}

/// `minivllm serve` run by `launcher` (the binary itself, or a launcher followed by it).
fn start_under(mut launcher: Command, model: &str, extra: &[&str], is_launcher: bool) -> Server {
    // Port 0: the server binds a free port itself and says which, so no other process can
    // take it between our choosing it and the server binding it.
    let mut child = launcher
        .args([
            "serve",
            "--model",
            model,
            "--served-model-name",
            "smol",
            "--port",
            "0",
        ])
        // Small defaults, unless the test gives its own.
        .args(
            [["--kv-cache-memory", "64MiB"], ["--max-model-len", "1024"]]
                .into_iter()
                .filter(|[flag, _]| !extra.contains(flag))
                .flatten(),
        )
        .args(extra)
        .env_remove("MINIVLLM_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start minivllm serve");
    let port = bound_port(child.stderr.take().expect("piped stderr"));
    let mut server = Server {
        child,
        port: 0,
        launcher: is_launcher,
    };
    let Ok(port) = port.recv_timeout(Duration::from_secs(120)) else {
        let status = server.child.try_wait().ok().flatten();
        panic!("the server never said which port it bound (exit status {status:?})");
    };
    server.port = port;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((200, _)) = request(port, "GET", "/health", None) {
            return server;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("server exited early: {status}");
        }
        assert!(Instant::now() < deadline, "server not healthy in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads the server's stderr on a thread of its own (so the pipe never fills), passing it on
/// to ours, and sends the port of its `serving … on http://host:port` line.
fn bound_port(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<u16> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("{line}");
            let port = line.split_once(" on http://").and_then(|(_, addr)| {
                addr.split_whitespace()
                    .next()?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            });
            if let Some(port) = port {
                let _ = tx.send(port);
            }
        }
    });
    rx
}

/// A minimal HTTP/1.1 client: one request per connection, body read to the end.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let (status, _, body) = request_with(port, method, path, &[], body)?;
    Ok((status, body))
}

/// Sends one request on a fresh connection; the headers come back as one lowercased string.
pub fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    // JSON unless the caller names another Content-Type.
    let own_type = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    let json = if own_type {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{json}\
         {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    Ok(s)
}

pub fn request_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> std::io::Result<(u16, String, String)> {
    let mut s = send(port, method, path, headers, body.unwrap_or(""))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((status, head, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of an unlabelled-beyond-`model_name` sample in a `/metrics` text, or of the
/// sample whose labels contain `label`.
pub fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} {label} in metrics:\n{text}"))
}

pub fn metrics(server: &Server) -> String {
    let (status, text) = request(server.port, "GET", "/metrics", None).unwrap();
    assert_eq!(status, 200);
    text
}

pub fn wait_for_metrics(server: &Server, what: &str, ok: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = metrics(server);
        if ok(&text) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

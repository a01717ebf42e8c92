//! An HTTP fault proxy on 127.0.0.1 in front of a real registry. Every request gets its own
//! upstream connection (`Connection: close`), and, drawn from a seeded generator, is answered
//! 503, answered 429 with `Retry-After: 1`, cut after a random number of response bytes, cut
//! half-way through its request body, or passed through. [`Mode::StallAfter`] instead lets
//! everything through until that many request-body bytes went by, then hangs (for SIGKILL
//! tests); [`Mode::DownAfter`] lets that many request bytes through, then "goes down": every
//! open connection is cut and new ones are closed at once; [`Mode::RewriteTaggedManifests`]
//! changes every manifest put by tag on its way in; [`Mode::RefuseTagsEnding`] refuses the
//! manifest puts of some tags, as a registry's tag immutability rule does;
//! [`Mode::FailReads`] answers the reads (`GET`, `HEAD`) of some paths with a status of its
//! choosing, or drops their connection unanswered; [`Mode::ReferrersAnswer`] answers the OCI 1.1
//! referrers API (`GET .../referrers/...`) itself.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default, Debug)]
pub struct Counts {
    pub requests: AtomicUsize,
    pub s503: AtomicUsize,
    pub s429: AtomicUsize,
    pub cut_response: AtomicUsize,
    pub cut_request: AtomicUsize,
    /// Requests held at the stall of [`Mode::StallAfter`].
    pub stalled: AtomicUsize,
    /// [`Mode::DownAfter`]: the budget is spent, the registry is down.
    pub down: AtomicBool,
    /// [`Mode::RewriteTaggedManifests`]: manifests changed on their way in.
    pub rewritten: AtomicUsize,
    /// [`Mode::RefuseTagsEnding`]: manifest puts refused.
    pub refused: AtomicUsize,
    /// [`Mode::FailReads`]: reads failed.
    pub failed_reads: AtomicUsize,
    /// [`Mode::ReferrersAnswer`]: referrers requests answered by the proxy.
    pub referrers: AtomicUsize,
}

pub struct FaultProxy {
    pub addr: String,
    pub counts: Arc<Counts>,
}

#[derive(Clone, Copy)]
pub enum Mode {
    /// Faults with this seed and this probability (per cent) for each kind.
    Faults { seed: u64, percent: u64 },
    /// Pass everything until this many request-body bytes went upstream, then hang.
    StallAfter(u64),
    /// Pass everything until this many request bytes (heads and bodies) went upstream, then
    /// cut every open connection and close every new one at once.
    DownAfter(u64),
    /// Pass everything, but a manifest put by tag gets a newline appended on its way in: a
    /// registry that stores something else than it was given (one that converts manifests).
    RewriteTaggedManifests,
    /// Pass everything, but refuse a manifest put by a tag that ends with this suffix as
    /// Harbor refuses a tag its immutability rules cover (412, `PRECONDITION`).
    RefuseTagsEnding(&'static str),
    /// Pass everything, but answer every `GET /v2/<name>/referrers/<digest>` with this status,
    /// content type and body (a registry or a proxy in front of it that answers the referrers
    /// API with something else than a referrers list).
    ReferrersAnswer(u16, &'static str, &'static str),
    /// Pass everything, but fail every read (`GET`, `HEAD`) whose path contains this string
    /// (a tag, a digest's hex) as [`ReadFault`] says.
    FailReads(&'static str, ReadFault),
}

/// How [`Mode::FailReads`] fails a read.
#[derive(Clone, Copy, Debug)]
pub enum ReadFault {
    /// Answer this status, with a registry's error body (and, for 401, a `Basic` challenge).
    Status(u16),
    /// Close the connection without an answer.
    Drop,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
}

/// What the connections of one proxy share.
struct Shared {
    upstream: String,
    mode: Mode,
    counts: Arc<Counts>,
    rng: Mutex<Rng>,
    /// Request bytes that went upstream (bodies for `StallAfter`, heads too for `DownAfter`).
    uploaded: AtomicU64,
    /// `DownAfter`: the streams of every open connection, by connection number, to cut them all.
    open: Mutex<HashMap<usize, Vec<TcpStream>>>,
}

impl Shared {
    /// Count `n` more request bytes; with `DownAfter`, true (and everything cut) once the
    /// budget is spent.
    fn spend(&self, n: usize) -> bool {
        let Mode::DownAfter(budget) = self.mode else {
            return false;
        };
        if self.uploaded.fetch_add(n as u64, Ordering::SeqCst) + n as u64 <= budget {
            return false;
        }
        self.counts.down.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().values().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
        true
    }
    /// `DownAfter`: keep a handle on `stream` of connection `id` to cut it when going down.
    fn track(&self, id: usize, stream: &TcpStream) -> std::io::Result<()> {
        if let Mode::DownAfter(_) = self.mode {
            let clone = stream.try_clone()?;
            self.open.lock().unwrap().entry(id).or_default().push(clone);
        }
        Ok(())
    }
}

pub fn start(upstream: &str, mode: Mode) -> FaultProxy {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let counts = Arc::new(Counts::default());
    let shared = Arc::new(Shared {
        upstream: upstream.to_string(),
        mode,
        counts: counts.clone(),
        rng: Mutex::new(Rng(match mode {
            Mode::Faults { seed, .. } => seed.wrapping_mul(0x9E3779B97F4A7C15) | 1,
            _ => 1,
        })),
        uploaded: AtomicU64::new(0),
        open: Mutex::new(HashMap::new()),
    });
    std::thread::spawn(move || {
        for (id, client) in listener.incoming().flatten().enumerate() {
            if shared.counts.down.load(Ordering::SeqCst) {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            let shared = shared.clone();
            std::thread::spawn(move || {
                let _ = handle(client, id, &shared);
                shared.open.lock().unwrap().remove(&id);
            });
        }
    });
    FaultProxy { addr, counts }
}

fn handle(client: TcpStream, id: usize, shared: &Shared) -> std::io::Result<()> {
    let (mode, counts, rng) = (shared.mode, &*shared.counts, &shared.rng);
    shared.track(id, &client)?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut client_w = client;
    {
        // Request head.
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let end = line == "\r\n";
            head.push(line);
            if end {
                break;
            }
        }
        counts.requests.fetch_add(1, Ordering::SeqCst);
        let rewrite = matches!(mode, Mode::RewriteTaggedManifests) && {
            let mut words = head[0].split(' ');
            let (method, path) = (words.next(), words.next().unwrap_or(""));
            method == Some("PUT")
                && path
                    .split_once("/manifests/")
                    .is_some_and(|(_, r)| !r.starts_with("sha256:"))
        };
        let refuse = match mode {
            Mode::RefuseTagsEnding(suffix) => {
                let mut words = head[0].split(' ');
                let (method, path) = (words.next(), words.next().unwrap_or(""));
                method == Some("PUT")
                    && path
                        .split_once("/manifests/")
                        .is_some_and(|(_, r)| r.ends_with(suffix))
            }
            _ => false,
        };
        let read_fault = match mode {
            Mode::FailReads(needle, how) => {
                let mut words = head[0].split(' ');
                let (method, path) = (words.next(), words.next().unwrap_or(""));
                (matches!(method, Some("GET" | "HEAD")) && path.contains(needle))
                    .then_some((how, method == Some("HEAD")))
            }
            _ => None,
        };
        if let Some((how, head_only)) = read_fault {
            counts.failed_reads.fetch_add(1, Ordering::SeqCst);
            if let ReadFault::Status(code) = how {
                let (reason, code_name, extra) = match code {
                    401 => (
                        "Unauthorized",
                        "UNAUTHORIZED",
                        "WWW-Authenticate: Basic realm=\"fault-proxy\"\r\n",
                    ),
                    403 => ("Forbidden", "DENIED", ""),
                    404 => ("Not Found", "MANIFEST_UNKNOWN", ""),
                    _ => ("Internal Server Error", "UNKNOWN", ""),
                };
                let body =
                    format!(r#"{{"errors":[{{"code":"{code_name}","message":"fault proxy"}}]}}"#);
                write!(client_w, "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n", body.len())?;
                if !head_only {
                    client_w.write_all(body.as_bytes())?;
                }
                client_w.flush()?;
            }
            let _ = client_w.shutdown(Shutdown::Both);
            return Ok(());
        }
        if let Mode::ReferrersAnswer(status, content_type, body) = mode {
            let mut words = head[0].split(' ');
            if words.next() == Some("GET") && words.next().unwrap_or("").contains("/referrers/") {
                counts.referrers.fetch_add(1, Ordering::SeqCst);
                write!(client_w, "HTTP/1.1 {status} Answer\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
                client_w.write_all(body.as_bytes())?;
                client_w.flush()?;
                let _ = client_w.shutdown(Shutdown::Both);
                return Ok(());
            }
        }
        let mut length = 0u64;
        let mut out_head = String::new();
        for (i, l) in head.iter().enumerate() {
            let lower = l.to_ascii_lowercase();
            if lower.starts_with("content-length:") {
                length = l[15..].trim().parse().unwrap_or(0);
                if rewrite {
                    out_head.push_str(&format!("Content-Length: {}\r\n", length + 1));
                    continue;
                }
            }
            if i > 0 && (lower.starts_with("connection:") || lower.starts_with("keep-alive:")) {
                continue;
            }
            if l == "\r\n" {
                out_head.push_str("Connection: close\r\n");
            }
            out_head.push_str(l);
        }
        let fault = match mode {
            Mode::RefuseTagsEnding(_) if refuse => 5,
            Mode::StallAfter(_)
            | Mode::DownAfter(_)
            | Mode::RewriteTaggedManifests
            | Mode::RefuseTagsEnding(_)
            | Mode::FailReads(..)
            | Mode::ReferrersAnswer(..) => 0,
            Mode::Faults { percent, .. } => {
                let roll = rng.lock().unwrap().next() % 100;
                // 1: 503, 2: 429, 3: cut response, 4: cut request body (only when there is one)
                if roll < percent {
                    1
                } else if roll < 2 * percent {
                    2
                } else if roll < 3 * percent {
                    3
                } else if roll < 4 * percent && length > 0 {
                    4
                } else {
                    0
                }
            }
        };
        if fault == 5 {
            std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink())?;
            counts.refused.fetch_add(1, Ordering::SeqCst);
            let body = br#"{"errors":[{"code":"PRECONDITION","message":"Failed to process request due to 'the tag' configured as immutable."}]}"#;
            write!(client_w, "HTTP/1.1 412 Precondition Failed\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())?;
            client_w.write_all(body)?;
            client_w.flush()?;
            let _ = client_w.shutdown(Shutdown::Both);
            return Ok(());
        }
        if fault == 1 || fault == 2 {
            std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink())?;
            let (status, extra) = if fault == 1 {
                counts.s503.fetch_add(1, Ordering::SeqCst);
                ("503 Service Unavailable", "")
            } else {
                counts.s429.fetch_add(1, Ordering::SeqCst);
                ("429 Too Many Requests", "Retry-After: 1\r\n")
            };
            let body = br#"{"errors":[{"code":"UNAVAILABLE","message":"fault proxy"}]}"#;
            write!(client_w, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n", body.len())?;
            client_w.write_all(body)?;
            client_w.flush()?;
            let _ = client_w.shutdown(Shutdown::Both);
            return Ok(());
        }
        let mut up = TcpStream::connect(&shared.upstream)?;
        shared.track(id, &up)?;
        if shared.spend(out_head.len()) {
            return Ok(());
        }
        up.write_all(out_head.as_bytes())?;
        // Request body, streamed.
        let mut left = length;
        let cut_at = if fault == 4 {
            rng.lock().unwrap().next() % length.max(1)
        } else {
            u64::MAX
        };
        let mut sent = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            let n = reader.read(&mut buf[..want])?;
            if n == 0 {
                return Ok(());
            }
            if sent + n as u64 > cut_at {
                counts.cut_request.fetch_add(1, Ordering::SeqCst);
                let _ = up.shutdown(Shutdown::Both);
                let _ = client_w.shutdown(Shutdown::Both);
                return Ok(());
            }
            if let Mode::StallAfter(limit) = mode {
                if shared.uploaded.fetch_add(n as u64, Ordering::SeqCst) + n as u64 > limit {
                    counts.stalled.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_secs(600));
                    return Ok(());
                }
            }
            if shared.spend(n) {
                return Ok(());
            }
            up.write_all(&buf[..n])?;
            sent += n as u64;
            left -= n as u64;
        }
        if rewrite {
            up.write_all(b"\n")?;
            counts.rewritten.fetch_add(1, Ordering::SeqCst);
        }
        // Response, relayed until the upstream closes (we asked it to).
        let cut_resp = if fault == 3 {
            1 + rng.lock().unwrap().next() % 4096
        } else {
            u64::MAX
        };
        let mut relayed = 0u64;
        loop {
            let n = up.read(&mut buf)?;
            if n == 0 {
                break;
            }
            if relayed + n as u64 > cut_resp {
                let keep = (cut_resp - relayed) as usize;
                client_w.write_all(&buf[..keep])?;
                counts.cut_response.fetch_add(1, Ordering::SeqCst);
                let _ = client_w.shutdown(Shutdown::Both);
                return Ok(());
            }
            client_w.write_all(&buf[..n])?;
            relayed += n as u64;
        }
        client_w.flush()?;
        // The response carried `Connection: close` from upstream: end this client connection.
        let _ = client_w.shutdown(Shutdown::Both);
    }
    Ok(())
}

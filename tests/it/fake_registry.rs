//! A tiny in-process registry for fault tests only (a blob that does not match its digest, a
//! transfer that stops half-way). Every other test uses the real docker-registry.

use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// How the blob is served.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BlobMode {
    /// Correctly, with range support.
    Good,
    /// Different bytes than the digest says.
    Corrupt,
    /// Send this many bytes, then hang (the client is killed by the test).
    StallAfter(usize),
}

pub struct FakeRegistry {
    pub addr: String,
    pub mode: Arc<Mutex<BlobMode>>,
    /// Range requests seen for the layer: their start offsets.
    pub ranges: Arc<Mutex<Vec<u64>>>,
    pub layer_gets: Arc<AtomicUsize>,
    pub layer_digest: String,
}

/// Serve repository `repo` with tag `tag`: one linux/amd64 image with one layer of `layer`.
pub fn start(repo: &str, tag: &str, layer: Vec<u8>, mode: BlobMode) -> FakeRegistry {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let layer_digest = digest(&layer);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{}","size":{}}}]}}"#,
        digest(&config),
        config.len(),
        layer_digest,
        layer.len()
    )
    .into_bytes();
    let mut blobs: HashMap<String, Vec<u8>> = HashMap::new();
    blobs.insert(digest(&config), config);
    blobs.insert(layer_digest.clone(), layer);
    let mode = Arc::new(Mutex::new(mode));
    let ranges = Arc::new(Mutex::new(Vec::new()));
    let layer_gets = Arc::new(AtomicUsize::new(0));
    let state = Arc::new((
        repo.to_string(),
        tag.to_string(),
        manifest,
        blobs,
        layer_digest.clone(),
    ));
    {
        let (mode, ranges, layer_gets) = (mode.clone(), ranges.clone(), layer_gets.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (state, mode, ranges, layer_gets) = (
                    state.clone(),
                    mode.clone(),
                    ranges.clone(),
                    layer_gets.clone(),
                );
                std::thread::spawn(move || {
                    let _ = serve(conn, &state, &mode, &ranges, &layer_gets);
                });
            }
        });
    }
    FakeRegistry {
        addr,
        mode,
        ranges,
        layer_gets,
        layer_digest,
    }
}

type State = (String, String, Vec<u8>, HashMap<String, Vec<u8>>, String);

fn serve(
    conn: TcpStream,
    state: &State,
    mode: &Mutex<BlobMode>,
    ranges: &Mutex<Vec<u64>>,
    layer_gets: &AtomicUsize,
) -> std::io::Result<()> {
    let (repo, tag, manifest, blobs, layer_digest) = state;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut out = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() < 2 {
            return Ok(());
        }
        let (method, path) = (parts[0].to_string(), parts[1].to_string());
        let mut range_start = None;
        let mut content_len = 0usize;
        loop {
            let mut h = String::new();
            reader.read_line(&mut h)?;
            let t = h.trim_end();
            if t.is_empty() {
                break;
            }
            let lower = t.to_ascii_lowercase();
            if let Some(r) = lower.strip_prefix("range: bytes=") {
                range_start = r.split('-').next().and_then(|s| s.parse::<u64>().ok());
            }
            if let Some(l) = lower.strip_prefix("content-length: ") {
                content_len = l.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_len];
        reader.read_exact(&mut body)?;
        let head = method == "HEAD";
        let respond = |out: &mut TcpStream,
                       status: &str,
                       ctype: &str,
                       extra: &str,
                       body: &[u8]|
         -> std::io::Result<()> {
            write!(
                out,
                "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{extra}\r\n",
                body.len()
            )?;
            if !head {
                out.write_all(body)?;
            }
            out.flush()
        };
        if path == "/v2/" {
            respond(&mut out, "200 OK", "application/json", "", b"{}")?;
            continue;
        }
        let man_prefix = format!("/v2/{repo}/manifests/");
        let blob_prefix = format!("/v2/{repo}/blobs/");
        if let Some(r) = path.strip_prefix(&man_prefix) {
            if r == tag || r == digest(manifest) {
                let extra = format!("Docker-Content-Digest: {}\r\n", digest(manifest));
                respond(
                    &mut out,
                    "200 OK",
                    "application/vnd.oci.image.manifest.v1+json",
                    &extra,
                    manifest,
                )?;
            } else {
                respond(
                    &mut out,
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
                )?;
            }
            continue;
        }
        if let Some(d) = path.strip_prefix(&blob_prefix) {
            let Some(data) = blobs.get(d) else {
                respond(
                    &mut out,
                    "404 Not Found",
                    "application/json",
                    "",
                    br#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}"#,
                )?;
                continue;
            };
            let m = *mode.lock().unwrap();
            if d != layer_digest || m == BlobMode::Good {
                if d == layer_digest && !head {
                    layer_gets.fetch_add(1, Ordering::SeqCst);
                    ranges.lock().unwrap().push(range_start.unwrap_or(0));
                }
                match range_start {
                    Some(s) if (s as usize) < data.len() => {
                        let extra = format!(
                            "Content-Range: bytes {s}-{}/{}\r\n",
                            data.len() - 1,
                            data.len()
                        );
                        respond(
                            &mut out,
                            "206 Partial Content",
                            "application/octet-stream",
                            &extra,
                            &data[s as usize..],
                        )?;
                    }
                    _ => respond(&mut out, "200 OK", "application/octet-stream", "", data)?,
                }
                continue;
            }
            layer_gets.fetch_add(1, Ordering::SeqCst);
            match m {
                BlobMode::Corrupt => {
                    let mut bad = data.clone();
                    bad[0] ^= 0xff;
                    respond(&mut out, "200 OK", "application/octet-stream", "", &bad)?;
                }
                BlobMode::StallAfter(n) => {
                    write!(out, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n", data.len())?;
                    out.write_all(&data[..n.min(data.len())])?;
                    out.flush()?;
                    std::thread::sleep(std::time::Duration::from_secs(600));
                    return Ok(());
                }
                BlobMode::Good => unreachable!(),
            }
            continue;
        }
        respond(&mut out, "404 Not Found", "application/json", "", b"{}")?;
    }
}

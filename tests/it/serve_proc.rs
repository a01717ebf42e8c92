//! A running `koord-bundle serve` for the tests that read from it (`serve.rs`, `hostile.rs`):
//! a child process on 127.0.0.1 with a port the kernel picked (`--addr 127.0.0.1:0`; the
//! address is read from its banner), wrapped in a guard that kills it on drop, so a failing
//! test leaves no process behind.

use crate::common::*;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `koord-bundle serve`, killed when dropped.
pub struct Server {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// What it logged so far (one line per request, warnings).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
    /// What it printed so far (its banner).
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }
    /// `SCHEME://127.0.0.1:PORT PATH`.
    pub fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://{}{path}", self.addr)
    }
    /// Wait for the request log to hold `needle` (it is written when a response ends); the
    /// log. Panics with the log if it never does.
    pub fn wait_log(&self, needle: &str) -> String {
        wait_for(
            &format!("the request log of serve to hold {needle:?}"),
            Duration::from_secs(30),
            || {
                let log = self.stderr();
                if log.contains(needle) {
                    Ok(log)
                } else {
                    Err(format!("the log holds:\n{log}"))
                }
            },
        )
    }
    /// The first repository of the bundle manifest `m` (plain HTTP) that serves the blob
    /// `digest`.
    pub fn repo_with_blob(&self, m: &serde_json::Value, digest: &str) -> String {
        image_digests(m)
            .into_iter()
            .map(|(r, _)| r.split(':').next().unwrap_or_default().to_string())
            .find(|r| {
                curl(
                    &["-I"],
                    &self.url("http", &format!("/v2/{r}/blobs/{digest}")),
                )
                .status
                    == 200
            })
            .unwrap_or_else(|| panic!("no repository of the bundle serves {digest}"))
    }
    /// Send SIGTERM and wait for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let o = tool(
            "kill",
            &["-TERM", &self.child.id().to_string()],
            Path::new("/"),
        );
        assert_ok(&o);
        let child = &mut self.child;
        wait_for("serve to exit on SIGTERM", Duration::from_secs(30), || {
            child.try_wait().unwrap().ok_or_else(|| "it runs on".into())
        })
    }
}

/// Why `serve` did not come up: its exit code and stderr.
#[derive(Debug)]
pub struct Refused {
    /// Its exit code.
    pub code: Option<i32>,
    /// All it wrote to stderr.
    pub stderr: String,
}

/// Start `koord-bundle serve ARGS --addr 127.0.0.1:0` and wait until it serves (banner read,
/// `/v2/` answering), or until it exits.
pub fn try_start(home: &Home, args: &[&str]) -> Result<Server, Refused> {
    let mut cmd = home.cmd(&["serve"]);
    cmd.args(args)
        .args(["--addr", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn koord-bundle serve");
    let stdout = Arc::new(Mutex::new(String::new()));
    let stderr = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<String>();
    let stderr_read = {
        let out = child.stdout.take().unwrap();
        let buf = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line).into_owned();
                buf.lock().unwrap().push_str(&format!("{line}\n"));
                let _ = tx.send(line);
            }
        });
        // Drained continuously: the request log must never fill the pipe. Bytes that are not
        // UTF-8 are kept as U+FFFD (a test can look for it) rather than end the reading.
        let err = child.stderr.take().unwrap();
        let buf = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line);
                buf.lock().unwrap().push_str(&format!("{line}\n"));
            }
        })
    };
    let mut server = Server {
        child,
        addr: String::new(),
        stdout,
        stderr,
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) => {
                if let Some(rest) = line.split("registry on ").nth(1) {
                    let url = rest.split_whitespace().next().unwrap_or_default();
                    let addr = url.split("://").nth(1).unwrap_or_default();
                    server.addr = addr.trim_end_matches(',').to_string();
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                assert!(
                    Instant::now() < deadline,
                    "serve printed no banner in 180 s; its stderr:\n{}",
                    server.stderr()
                );
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // stdout closed: the process is exiting.
                let status = server.child.wait().unwrap();
                // All of stderr: read until the pipe's end.
                stderr_read.join().unwrap();
                return Err(Refused {
                    code: status.code(),
                    stderr: server.stderr(),
                });
            }
        }
    }
    assert!(
        server.addr.starts_with("127.0.0.1:"),
        "no address in the banner:\n{}",
        server.stdout()
    );
    // /v2/ answers (any status: 401 under basic auth).
    let scheme = if args.contains(&"--tls-cert") {
        "https"
    } else {
        "http"
    };
    let v2 = server.url(scheme, "/v2/");
    wait_until(&format!("{v2} to answer"), Duration::from_secs(30), || {
        curl(&["-k"], &v2).status != 0
    });
    Ok(server)
}

/// [`try_start`], which must succeed.
pub fn start(home: &Home, args: &[&str]) -> Server {
    try_start(home, args).unwrap_or_else(|r| panic!("serve refused to start: {r:?}"))
}

//! The one way koord-bundle runs another program (helm, a kubeconfig exec plugin, a docker
//! credential helper): each is an outside program that may hang, print without end or leave
//! children behind, so every run here has
//!
//! - a time limit: past it the child is killed and the run fails with [`ChildError::TimedOut`];
//! - a cap on each output stream, checked **while reading**: past it the child is killed and
//!   the run fails with [`ChildError::OutputTooLarge`] (a plugin that prints forever costs at
//!   most the cap, not the machine's memory);
//! - a process group of its own, ended with it: on a timeout, a cap, or after the child itself
//!   exits, the whole group gets `SIGKILL`, so nothing it started is left behind re-parented to
//!   PID 1. Groups still running are ended by [`kill_all`] when koord-bundle is interrupted.
//!
//! Output is read on two threads (no async runtime needed); [`run_async`] hands the blocking run
//! to tokio's blocking pool. Lines can be passed on as they arrive ([`LineSink`]) for programs
//! whose output the user should see live (helm install); this module itself prints nothing.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which output stream of the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "standard output",
            Stream::Stderr => "standard error",
        })
    }
}

/// Receives each line of output (with its newline, if any) as it arrives.
pub type LineSink = Arc<dyn Fn(Stream, &[u8]) + Send + Sync>;

/// The bounds of one run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock time from spawn to the end of all output.
    pub timeout: Duration,
    /// Most bytes kept from standard output; one more ends the child.
    pub max_stdout: usize,
    /// Most bytes kept from standard error; one more ends the child.
    pub max_stderr: usize,
    /// The child's address space (`RLIMIT_AS`, bytes), set between fork and exec: an
    /// allocation past it fails inside the child (a Go program such as helm then ends with
    /// "fatal error: out of memory"), never in koord-bundle. `None`: the limit koord-bundle
    /// itself runs under.
    pub max_memory: Option<u64>,
}

impl Default for Limits {
    /// 60 s, 1 MiB per stream, no memory limit of its own.
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(60),
            max_stdout: 1 << 20,
            max_stderr: 1 << 20,
            max_memory: None,
        }
    }
}

/// What a finished run gave.
#[derive(Debug)]
pub struct Output {
    /// How the child ended.
    pub status: ExitStatus,
    /// Everything it printed on standard output.
    pub stdout: Vec<u8>,
    /// Everything it printed on standard error (when captured).
    pub stderr: Vec<u8>,
}

/// Why a run did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// The program is not there (or not on `PATH`).
    #[error("{program}: not found")]
    NotFound {
        /// The program as given.
        program: PathBuf,
    },
    /// The program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program as given.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// It did not finish (or did not close its output) within the time limit; it and its process
    /// group were killed.
    #[error("{program} did not finish within {} s: it was stopped (with everything it started)", .after.as_secs_f64().ceil())]
    TimedOut {
        /// The program as given.
        program: PathBuf,
        /// The limit.
        after: Duration,
    },
    /// It printed more than the cap on one stream; it and its process group were killed.
    #[error("{program} printed more than {limit} bytes on its {stream}: it was stopped (with everything it started)")]
    OutputTooLarge {
        /// The program as given.
        program: PathBuf,
        /// Which stream.
        stream: Stream,
        /// The cap.
        limit: usize,
    },
    /// Waiting for it failed.
    #[error("waiting for {program} failed: {source}")]
    Wait {
        /// The program as given.
        program: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl crate::exit::Classify for ChildError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // Starting or waiting for it: the kind of I/O error decides.
            ChildError::Spawn { .. } | ChildError::Wait { .. } => None,
            // The program named (--helm PATH, a credential helper) is not there.
            ChildError::NotFound { .. } => Some(C::Input),
            // It ran past its time: a slow peer or machine; a later run may finish.
            ChildError::TimedOut { .. } => Some(C::Machine),
            // It printed past its bound: what it was given made it do so.
            ChildError::OutputTooLarge { .. } => Some(C::Input),
        }
    }
}

/// How standard error is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum StderrMode {
    /// Read and kept (capped), and passed to the line sink.
    Capture,
    /// Left attached to koord-bundle's own standard error (a plugin's prompts and messages reach
    /// the user as they are; nothing is read).
    Inherit,
}

/// Process groups of children still running (their group ids), for [`kill_all`].
static LIVE: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

fn live(f: impl FnOnce(&mut HashSet<i32>)) {
    let mut g = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(HashSet::new));
}

/// `SIGKILL` to every process group started here that is still running: called when
/// koord-bundle itself is interrupted, so that no helm or plugin outlives it.
pub fn kill_all() {
    let groups: Vec<i32> = {
        let mut g = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().map(|s| s.drain().collect()).unwrap_or_default()
    };
    for pgid in groups {
        kill_group(pgid);
    }
}

fn kill_group(pgid: i32) {
    if pgid > 1 {
        if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Spawn, retrying briefly on ETXTBSY (the binary was just written, or is being replaced).
fn spawn_retrying(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut attempt = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 10 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(20 * attempt));
            }
            other => return other,
        }
    }
}

enum Event {
    /// A stream reached its end (or failed to read).
    Eof,
    /// A stream went over its cap.
    TooLarge(Stream, usize),
}

fn reader<R: Read + Send + 'static>(
    mut r: R,
    stream: Stream,
    cap: usize,
    sink: Option<LineSink>,
    done: mpsc::Sender<Event>,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept: Vec<u8> = Vec::new();
        let mut line: Vec<u8> = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let event = loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break Event::Eof,
                Ok(n) => {
                    if kept.len() + n > cap {
                        break Event::TooLarge(stream, cap);
                    }
                    kept.extend_from_slice(&buf[..n]);
                    if let Some(s) = &sink {
                        for piece in buf[..n].split_inclusive(|b| *b == b'\n') {
                            line.extend_from_slice(piece);
                            if piece.ends_with(b"\n") {
                                s(stream, &line);
                                line.clear();
                            }
                        }
                    }
                }
            }
        };
        if let (Some(s), false) = (&sink, line.is_empty()) {
            s(stream, &line);
        }
        let _ = done.send(event);
        kept
    })
}

/// Standard streams, a process group of its own and the address-space limit.
fn prepare(cmd: &mut Command, stdin: bool, stderr: StderrMode, limits: &Limits) {
    cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(match stderr {
            StderrMode::Capture => Stdio::piped(),
            StderrMode::Inherit => Stdio::inherit(),
        })
        .process_group(0);
    if let Some(bytes) = limits.max_memory {
        let lim = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: between fork and exec only async-signal-safe calls are allowed; setrlimit(2)
        // is one, and `lim` is a plain value copied into the closure.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &lim) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
}

/// Wait for `open` streams to end (the child and everything holding its pipes closed them),
/// then for the child; a cap or the deadline is the run's failure.
fn watch(
    rx: &mpsc::Receiver<Event>,
    mut open: usize,
    child: &mut std::process::Child,
    deadline: Instant,
    limits: &Limits,
    program: &std::path::Path,
) -> Option<ChildError> {
    let timed_out = || ChildError::TimedOut {
        program: program.to_path_buf(),
        after: limits.timeout,
    };
    while open > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Eof) => open -= 1,
            Ok(Event::TooLarge(stream, limit)) => {
                return Some(ChildError::OutputTooLarge {
                    program: program.to_path_buf(),
                    stream,
                    limit,
                })
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Some(timed_out()),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Output closed: the child has exited or is about to; it still gets the deadline.
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return None,
            Ok(None) if Instant::now() >= deadline => return Some(timed_out()),
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(source) => {
                return Some(ChildError::Wait {
                    program: program.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// Run `cmd` to its end within `limits`, feeding it `stdin` (else `/dev/null`). Standard output
/// is always read (capped); standard error as `stderr` says. The child gets a process group of
/// its own, which is killed when the run ends, whatever the way.
///
/// The caller sets program, arguments and environment on `cmd`; this sets its standard streams.
pub fn run(
    mut cmd: Command,
    stdin: Option<&[u8]>,
    stderr: StderrMode,
    limits: &Limits,
    sink: Option<LineSink>,
) -> Result<Output, ChildError> {
    let program = PathBuf::from(cmd.get_program());
    prepare(&mut cmd, stdin.is_some(), stderr, limits);
    let start = Instant::now();
    let mut child = spawn_retrying(&mut cmd).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ChildError::NotFound {
            program: program.clone(),
        },
        _ => ChildError::Spawn {
            program: program.clone(),
            source,
        },
    })?;
    let pgid = child.id() as i32;
    live(|s| {
        s.insert(pgid);
    });
    // Whatever happens below, the group is ended and forgotten at the end.
    struct Group(i32);
    impl Drop for Group {
        fn drop(&mut self) {
            kill_group(self.0);
            live(|s| {
                s.remove(&self.0);
            });
        }
    }
    let group = Group(pgid);

    let writer = match (stdin, child.stdin.take()) {
        (Some(bytes), Some(mut pipe)) => {
            let bytes = bytes.to_vec();
            Some(std::thread::spawn(move || {
                // A child that exits without reading gives EPIPE: not our failure.
                let _ = pipe.write_all(&bytes);
            }))
        }
        _ => None,
    };
    let (tx, rx) = mpsc::channel();
    let mut streams = 0;
    let out = child.stdout.take().map(|r| {
        streams += 1;
        let cap = limits.max_stdout;
        reader(r, Stream::Stdout, cap, sink.clone(), tx.clone())
    });
    let err = child.stderr.take().map(|r| {
        streams += 1;
        let cap = limits.max_stderr;
        reader(r, Stream::Stderr, cap, sink.clone(), tx.clone())
    });
    drop(tx);
    let failure = watch(
        &rx,
        streams,
        &mut child,
        start + limits.timeout,
        limits,
        &program,
    );
    // End the group (grandchildren too), then reap the child and join the readers: with the
    // group dead, every pipe is closed and nothing below blocks.
    drop(group);
    if failure.is_some() {
        // The leader too, should the group signal have missed it (it cannot, but a wait must
        // never hang here).
        let _ = child.kill();
    }
    let status = child.wait();
    let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|h| h.join().ok()).unwrap_or_default();
    if let Some(w) = writer {
        let _ = w.join();
    }
    if let Some(f) = failure {
        return Err(f);
    }
    let status = status.map_err(|source| ChildError::Wait { program, source })?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// [`run`] on tokio's blocking pool.
pub async fn run_async(
    cmd: Command,
    stdin: Option<Vec<u8>>,
    stderr: StderrMode,
    limits: Limits,
    sink: Option<LineSink>,
) -> Result<Output, ChildError> {
    let program = PathBuf::from(cmd.get_program());
    tokio::task::spawn_blocking(move || run(cmd, stdin.as_deref(), stderr, &limits, sink))
        .await
        .unwrap_or_else(|e| {
            Err(ChildError::Wait {
                program,
                source: std::io::Error::other(e.to_string()),
            })
        })
}

/// Whether the process whose pid a child wrote into `pid_file` is gone (ended, or a zombie
/// waiting for init) within 2 s. For the tests of every runner of children (here, and the
/// root crate's `cluster::exec` and `helm`): nothing a child started outlives it.
pub fn pid_in_file_is_gone(pid_file: &std::path::Path) -> bool {
    let pid: i32 = std::fs::read_to_string(pid_file)
        .expect("the child wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    let alive = || {
        rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
    };
    let zombie = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
            .unwrap_or(true)
    };
    (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !alive() || zombie()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(secs: u64, cap: usize) -> Limits {
        Limits {
            timeout: Duration::from_secs(secs),
            max_stdout: cap,
            max_stderr: cap,
            max_memory: None,
        }
    }

    fn sh(script: &str) -> Command {
        let mut c = Command::new("/bin/sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn output_status_and_stdin() {
        let out = run(
            sh("cat; echo err >&2; exit 3"),
            Some(b"hello\n"),
            StderrMode::Capture,
            &limits(10, 1024),
            None,
        )
        .unwrap();
        assert_eq!(out.stdout, b"hello\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn endless_output_is_stopped_at_the_cap() {
        let start = Instant::now();
        let e = run(
            sh("yes koord"),
            None,
            StderrMode::Capture,
            &limits(30, 1 << 20),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(e, ChildError::OutputTooLarge { stream: Stream::Stdout, limit, .. } if limit == 1 << 20),
            "{e}"
        );
        assert!(start.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn a_hang_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The grandchild outlives its parent's shell unless the group is killed.
        // The grandchild (its output sent away, so it holds no pipe of ours) outlives the
        // killed leader unless the whole group is killed.
        let script = format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > {}; exec sleep 300",
            pidfile.to_string_lossy()
        );
        let e = run(
            sh(&script),
            None,
            StderrMode::Capture,
            &Limits {
                timeout: Duration::from_millis(500),
                max_stdout: 1024,
                max_stderr: 1024,
                max_memory: None,
            },
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ChildError::TimedOut { .. }), "{e}");
        assert!(
            super::pid_in_file_is_gone(&pidfile),
            "grandchild survived the timeout"
        );
    }

    #[test]
    fn a_background_child_left_by_a_finished_run_is_ended() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // Output redirected away, so the pipes close when the shell exits.
        let script = format!(
            "sleep 300 >/dev/null 2>&1 & echo $! > {}; exit 0",
            pidfile.to_string_lossy()
        );
        let out = run(
            sh(&script),
            None,
            StderrMode::Capture,
            &limits(10, 1024),
            None,
        )
        .unwrap();
        assert!(out.status.success());
        assert!(
            super::pid_in_file_is_gone(&pidfile),
            "background child survived its parent's run"
        );
    }

    #[test]
    fn lines_reach_the_sink_as_they_come() {
        let seen = Arc::new(Mutex::new(Vec::<(Stream, String)>::new()));
        let s2 = seen.clone();
        let sink: LineSink = Arc::new(move |st, l| {
            s2.lock()
                .unwrap()
                .push((st, String::from_utf8_lossy(l).into_owned()))
        });
        run(
            sh("echo a; echo b >&2; printf c"),
            None,
            StderrMode::Capture,
            &limits(10, 1024),
            Some(sink),
        )
        .unwrap();
        let mut got = seen.lock().unwrap().clone();
        got.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got,
            vec![
                (Stream::Stdout, "a\n".into()),
                (Stream::Stderr, "b\n".into()),
                (Stream::Stdout, "c".into())
            ]
        );
    }

    #[test]
    fn the_address_space_limit_reaches_the_child_only() {
        let mut l = limits(10, 1024);
        l.max_memory = Some(256 << 20);
        // `ulimit -v`: the limit in KiB, as the child's shell sees it.
        let out = run(sh("ulimit -v"), None, StderrMode::Capture, &l, None).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "262144");
        let out = run(
            sh("ulimit -v"),
            None,
            StderrMode::Capture,
            &limits(10, 1024),
            None,
        )
        .unwrap();
        assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "262144");
    }

    #[test]
    fn missing_program_is_not_found() {
        let e = run(
            Command::new("/nonexistent/koord-helper"),
            None,
            StderrMode::Capture,
            &limits(5, 16),
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ChildError::NotFound { .. }), "{e}");
    }
}

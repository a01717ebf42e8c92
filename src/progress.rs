//! One printer for long work: progress bars on a TTY (indicatif), plain lines otherwise, and
//! nothing but the final JSON document with `--json`. Messages go to stderr; results to stdout.

use crate::text::terminal_safe;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Arc;

/// Print `line` on stdout, terminal-safe (see [`crate::say!`]).
#[allow(clippy::disallowed_macros)]
pub fn say_line(line: &str) {
    println!("{}", terminal_safe(line));
}

/// Print `line` on stderr, terminal-safe (see [`crate::tell!`]).
#[allow(clippy::disallowed_macros)]
pub fn tell_line(line: &str) {
    eprintln!("{}", terminal_safe(line));
}

/// How to show progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bars on a terminal.
    Tty,
    /// A line per step.
    Plain,
    /// Silent: the command prints one JSON document at the end.
    Json,
}

impl Mode {
    /// Bars when stderr is a terminal, else plain lines; JSON when asked.
    // The printer itself: whether stderr is a terminal (nothing is written).
    #[allow(clippy::disallowed_methods)]
    pub fn detect(json: bool) -> Self {
        if json {
            Mode::Json
        } else if std::io::stderr().is_terminal() {
            Mode::Tty
        } else {
            Mode::Plain
        }
    }
}

/// The printer.
#[derive(Clone)]
pub struct Progress {
    mode: Mode,
    multi: Arc<MultiProgress>,
}

/// A byte counter for one piece of work.
#[derive(Clone)]
pub struct Bar {
    bar: Option<ProgressBar>,
    multi: Arc<MultiProgress>,
    label: String,
    mode: Mode,
}

impl Progress {
    /// A printer in `mode`.
    pub fn new(mode: Mode) -> Self {
        let target = if mode == Mode::Tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress {
            mode,
            multi: Arc::new(MultiProgress::with_draw_target(target)),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Say something (not in JSON mode). Messages quote registries and bundles: they are
    /// made safe for a terminal here.
    #[allow(clippy::disallowed_macros)] // the printer itself: the message is escaped first
    pub fn say(&self, msg: impl AsRef<str>) {
        let msg = terminal_safe(msg.as_ref());
        match self.mode {
            Mode::Tty => {
                let _ = self.multi.println(msg);
            }
            Mode::Plain => eprintln!("{msg}"),
            Mode::Json => {}
        }
    }

    /// A warning: always shown on stderr, JSON mode included.
    #[allow(clippy::disallowed_macros)] // the printer itself: the message is escaped first
    pub fn warn(&self, msg: impl AsRef<str>) {
        let msg = terminal_safe(msg.as_ref());
        match self.mode {
            Mode::Tty => {
                let _ = self.multi.println(format!("warning: {msg}"));
            }
            _ => eprintln!("warning: {msg}"),
        }
    }

    /// An error that is not the command's last word (a failed check among others): always
    /// shown on stderr, JSON mode included, as `error: ...`.
    #[allow(clippy::disallowed_macros)] // the printer itself: the message is escaped first
    pub fn error(&self, msg: impl AsRef<str>) {
        let msg = terminal_safe(msg.as_ref());
        match self.mode {
            Mode::Tty => {
                let _ = self.multi.println(format!("error: {msg}"));
            }
            _ => eprintln!("error: {msg}"),
        }
    }

    /// A byte bar of `total` bytes.
    pub fn bytes(&self, label: &str, total: u64) -> Bar {
        // A label may name an image or a file from a bundle.
        let label = terminal_safe(label);
        let label = label.as_str();
        let bar = (self.mode == Mode::Tty).then(|| {
            let b = self.multi.add(ProgressBar::new(total));
            b.set_style(
                ProgressStyle::with_template(
                    "{msg:32!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {settled_eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .with_key("settled_eta", settled_eta)
                .progress_chars("=> "),
            );
            b.set_message(label.to_string());
            b
        });
        Bar {
            bar,
            multi: self.multi.clone(),
            label: label.to_string(),
            mode: self.mode,
        }
    }
}

impl Progress {
    /// A bar of `total` things (signatures pushed...), counted one by one.
    pub fn count(&self, label: &str, total: u64) -> Bar {
        let bar = self.bytes(label, total);
        if let Some(b) = &bar.bar {
            b.set_style(
                ProgressStyle::with_template("{msg:32!} [{bar:30}] {pos}/{len}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
        }
        bar
    }
}

/// Before this much time has passed, or this part of the work is done, an estimate of the
/// time left is noise (the start of a fast job: `verify` said 34 s for a job of 0.3 s).
const ETA_AFTER: std::time::Duration = std::time::Duration::from_secs(3);
/// See [`ETA_AFTER`].
const ETA_AFTER_FRACTION: f32 = 0.05;

/// The time left, once it means something (see [`ETA_AFTER`]); nothing before.
fn settled_eta(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    if state.elapsed() >= ETA_AFTER && state.fraction() >= ETA_AFTER_FRACTION {
        let _ = write!(w, "{:#}", indicatif::HumanDuration(state.eta()));
    }
}

impl Bar {
    /// Count `n` more bytes; never past the total (work counted twice, such as an upload
    /// restarted, would otherwise show `403.88 MiB/400.88 MiB`).
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            let room = b.length().map_or(n, |len| len.saturating_sub(b.position()));
            b.inc(n.min(room));
        }
    }
    /// Done, with a closing word: the same line on a terminal as in plain mode (the bar's
    /// message column would cut it short).
    #[allow(clippy::disallowed_macros)] // the printer itself: the message is escaped first
    pub fn finish(&self, msg: &str) {
        let msg = terminal_safe(msg);
        match (&self.bar, self.mode) {
            (Some(b), _) => {
                b.finish_and_clear();
                let _ = self.multi.println(format!("{}: {msg}", self.label));
            }
            (None, Mode::Plain) => eprintln!("{}: {msg}", self.label),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21: a re-load's bar showed `403.88 MiB/400.88 MiB`.
    #[test]
    fn a_bar_never_passes_its_total() {
        let p = Progress {
            mode: Mode::Tty,
            multi: Arc::new(MultiProgress::with_draw_target(ProgressDrawTarget::hidden())),
        };
        let b = p.bytes("x", 100);
        b.inc(80);
        b.inc(80);
        assert_eq!(b.bar.as_ref().map(|b| b.position()), Some(100));
    }
}

//! What a failure is, and so the exit code it ends a command with.
//!
//! Each error type says its own class next to its definition, by implementing [`Classify`].
//! A command's error is a chain (anyhow's contexts around the error that happened); the
//! command layer walks it from the outermost error in and the first error that decides
//! decides. An error that forwards to its cause (a wrapper such as "cannot read FILE" around an
//! `io::Error`) answers `None`, and its cause decides. A chain where nothing decides is the
//! input's fault ([`EXIT_USER`]): an untyped error (`anyhow::bail!`) is a check of the input.
//!
//! Rust cannot ask a `dyn Error` for a trait it may implement, only for a concrete type, so
//! each crate names its error types once, in one list ([`exit_classes!`](crate::exit_classes), its `class_of`), and
//! [`code_of`] walks a chain with it. koord-bundle's `tests/it/error_classes.rs` fails when an
//! error type of any crate has no `Classify` beside its definition or is missing from its
//! crate's list, and checks the README's exit-code table against [`ExitClass::ALL`].

/// Exit code of success.
pub const EXIT_OK: i32 = 0;
/// Exit code when the input is wrong: a user error, a verification failure, refused
/// credentials, a failed pre-flight, a bad bundle. Fix the input; a retry as it is fails again.
pub const EXIT_USER: i32 = 1;
/// Exit code of a usage error: an unknown flag or subcommand, a missing or conflicting
/// argument (clap's own code, as most command-line tools).
pub const EXIT_USAGE: i32 = 2;
/// Exit code of an internal or transient failure: a registry, cluster or chart repository
/// unreachable after the retries, a full disk, I/O errors on koord-bundle's own files, a bug.
/// A retry later, or an operator, may help.
pub const EXIT_INTERNAL: i32 = 3;
/// Exit code of a check that could not tell (nothing failed, but not everything could be
/// checked): `verify --cluster` with a container not started yet, or pods it cannot select.
/// Not a success: run the check again once the cluster has settled.
pub const EXIT_COULD_NOT_TELL: i32 = 4;
/// Exit code of a `build` stopped by SIGINT (Ctrl-C): 128 + 2, as shells report it.
pub const EXIT_SIGINT: i32 = 130;
/// Exit code of a `build` stopped by SIGTERM: 128 + 15, as shells report it.
pub const EXIT_SIGTERM: i32 = 143;

/// The class of a failure: what the user can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// The input is wrong (a path, a flag's value, a bundle, credentials, what a registry
    /// served): fix it; the same run fails again. [`EXIT_USER`].
    Input,
    /// The machine's or the network's (a full disk, an I/O error on the tool's own files, a
    /// peer unreachable after the retries, a bug): a retry later, or an operator, may help.
    /// [`EXIT_INTERNAL`].
    Machine,
    /// A check that could not tell: not a success. [`EXIT_COULD_NOT_TELL`].
    CouldNotTell,
    /// Stopped by a signal the user (or a supervisor) sent: [`EXIT_SIGINT`] or
    /// [`EXIT_SIGTERM`].
    Interrupted(Signal),
}

/// The signals a command stops on, keeping what it did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM.
    Term,
}

impl Signal {
    /// Its name, as `kill -l` prints it with `SIG` in front.
    pub const fn name(self) -> &'static str {
        match self {
            Signal::Int => "SIGINT",
            Signal::Term => "SIGTERM",
        }
    }
}

impl ExitClass {
    /// Every class, in the order of the README's exit-code table (one row each; both signals
    /// share the row of [`ExitClass::Interrupted`]).
    pub const ALL: [ExitClass; 4] = [
        ExitClass::Input,
        ExitClass::Machine,
        ExitClass::CouldNotTell,
        ExitClass::Interrupted(Signal::Int),
    ];

    /// The exit code of the class.
    pub const fn code(self) -> i32 {
        match self {
            ExitClass::Input => EXIT_USER,
            ExitClass::Machine => EXIT_INTERNAL,
            ExitClass::CouldNotTell => EXIT_COULD_NOT_TELL,
            ExitClass::Interrupted(Signal::Int) => EXIT_SIGINT,
            ExitClass::Interrupted(Signal::Term) => EXIT_SIGTERM,
        }
    }

    /// The code column of the README's row: the code, or both signals' codes.
    pub fn codes_text(self) -> String {
        match self {
            ExitClass::Interrupted(_) => format!("{EXIT_SIGINT}, {EXIT_SIGTERM}"),
            c => c.code().to_string(),
        }
    }

    /// What the class means, as the README's table says it (its "meaning" column).
    pub const fn meaning(self) -> &'static str {
        match self {
            ExitClass::Input => "the input is wrong",
            ExitClass::Machine => "an internal or transient failure",
            ExitClass::CouldNotTell => "could not tell",
            ExitClass::Interrupted(_) => "a command interrupted by SIGINT (Ctrl-C) or SIGTERM (128 + the signal, as shells report it), also one started with SIGINT ignored (a script's background job)",
        }
    }

    /// What to do about it, as the README's table says it (its last column).
    pub const fn what_to_do(self) -> &'static str {
        match self {
            ExitClass::Input => "fix the input: the same command fails again as it is",
            ExitClass::Machine => "retry later, or have an operator look at the machine or the network",
            ExitClass::CouldNotTell => "run it again once every container runs; a script must not read 4 as success",
            ExitClass::Interrupted(_) => "what the message says: `build` resumes from the `.partial` it kept; `load` names what was pushed, and, when helm was stopped, the `helm rollback` (or `helm uninstall`) that undoes it",
        }
    }
}

/// An error that knows its own class.
pub trait Classify: std::error::Error {
    /// `Some(class)` when this error decides the exit code; `None` when its cause decides
    /// (the error wraps another whose kind tells more, such as an `io::Error`).
    fn exit_class(&self) -> Option<ExitClass>;
}

/// The class of one error of a chain when its type is one of `$t`: `Some(decision)` (the
/// decision itself `None` when its cause decides); `None` when it is of none of them. Each
/// crate lists its error types once with it, in its `class_of`, so that a chain of `dyn
/// Error` can be classified (see [`code_of`]); a type listed without [`Classify`] does not
/// compile.
#[macro_export]
macro_rules! exit_classes {
    ($e:expr; $($t:ty),+ $(,)?) => {{
        let e: &(dyn ::std::error::Error + 'static) = $e;
        ::std::option::Option::None
            $(.or_else(|| e.downcast_ref::<$t>().map($crate::exit::Classify::exit_class)))+
    }};
}

/// The exit code of an error chain (outermost first): a full disk anywhere in it is
/// [`EXIT_INTERNAL`], whoever wrapped it; else the first error `class_of` finds decisive
/// decides; a chain where none decides is the input's ([`EXIT_USER`]).
pub fn code_of<'a>(
    chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)> + Clone,
    class_of: impl Fn(&(dyn std::error::Error + 'static)) -> Option<Option<ExitClass>>,
) -> i32 {
    if chain
        .clone()
        .any(|c| c.downcast_ref().is_some_and(is_disk_full))
    {
        return EXIT_INTERNAL;
    }
    chain
        .filter_map(|c| class_of(c).flatten())
        .next()
        .map_or(EXIT_USER, ExitClass::code)
}

/// No room left: a full disk or an exhausted quota. Anywhere in a chain, whoever wrapped it,
/// this is the machine's ([`ExitClass::Machine`]).
pub fn is_disk_full(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::StorageFull | K::QuotaExceeded | K::FileTooLarge
    )
}

/// An `io::Error` on its own: a path given that is missing, a directory, not allowed, an
/// address in use are the input; everything else (EIO, a full disk, timeouts, resets) is the
/// machine's.
impl Classify for std::io::Error {
    fn exit_class(&self) -> Option<ExitClass> {
        use std::io::ErrorKind as K;
        Some(match self.kind() {
            K::NotFound
            | K::PermissionDenied
            | K::AlreadyExists
            | K::IsADirectory
            | K::NotADirectory
            | K::DirectoryNotEmpty
            | K::ReadOnlyFilesystem
            | K::InvalidFilename
            | K::InvalidInput
            | K::InvalidData
            | K::UnexpectedEof
            | K::AddrInUse
            | K::AddrNotAvailable
            | K::Unsupported => ExitClass::Input,
            _ => ExitClass::Machine,
        })
    }
}

/// A task that panicked or was cancelled: a bug, or the runtime shutting down.
impl Classify for tokio::task::JoinError {
    fn exit_class(&self) -> Option<ExitClass> {
        Some(ExitClass::Machine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn each_class_has_its_code() {
        assert_eq!(ExitClass::Input.code(), 1);
        assert_eq!(ExitClass::Machine.code(), 3);
        assert_eq!(ExitClass::CouldNotTell.code(), 4);
        assert_eq!(ExitClass::Interrupted(Signal::Int).code(), 130);
        assert_eq!(ExitClass::Interrupted(Signal::Term).code(), 143);
    }

    #[test]
    fn io_errors_are_the_input_or_the_machine_by_kind() {
        let class = |k: ErrorKind| Error::from(k).exit_class();
        assert_eq!(class(ErrorKind::NotFound), Some(ExitClass::Input));
        assert_eq!(class(ErrorKind::IsADirectory), Some(ExitClass::Input));
        assert_eq!(class(ErrorKind::StorageFull), Some(ExitClass::Machine));
        assert_eq!(class(ErrorKind::ConnectionReset), Some(ExitClass::Machine));
        assert!(is_disk_full(&Error::from(ErrorKind::QuotaExceeded)));
        assert!(!is_disk_full(&Error::from(ErrorKind::NotFound)));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Error);

    #[test]
    fn a_chain_is_decided_by_its_first_decisive_error_and_a_full_disk_anywhere() {
        // The outer error is of no listed type: its cause, an io::Error, decides by kind.
        let class_of =
            |e: &(dyn std::error::Error + 'static)| crate::exit_classes!(e; std::io::Error);
        let chain = |k: ErrorKind| {
            let outer = Outer(Error::from(k));
            let inner = Error::from(k);
            code_of(
                [&outer as &(dyn std::error::Error + 'static), &inner].into_iter(),
                class_of,
            )
        };
        assert_eq!(chain(ErrorKind::NotFound), EXIT_USER);
        assert_eq!(chain(ErrorKind::ConnectionReset), EXIT_INTERNAL);
        assert_eq!(chain(ErrorKind::StorageFull), EXIT_INTERNAL);
        // Nothing decides: the input's.
        let outer = Outer(Error::from(ErrorKind::NotFound));
        assert_eq!(
            code_of(
                [&outer as &(dyn std::error::Error + 'static)].into_iter(),
                |_| None
            ),
            EXIT_USER
        );
    }
}

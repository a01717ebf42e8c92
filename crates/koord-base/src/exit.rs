//! What a failure is, and so the exit code it ends a command with.
//!
//! Each error type says its own class next to its definition, by implementing [`Classify`].
//! A command's error is a chain (anyhow's contexts around the error that happened); the
//! command layer walks it from the outermost error in and the first error that decides
//! decides. An error that forwards to its cause (a wrapper such as "cannot read FILE" around an
//! `io::Error`) answers `None`, and its cause decides. A chain where nothing decides is the
//! input's fault ([`EXIT_USER`]).

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
}

impl ExitClass {
    /// The exit code of the class.
    pub const fn code(self) -> i32 {
        match self {
            ExitClass::Input => EXIT_USER,
            ExitClass::Machine => EXIT_INTERNAL,
            ExitClass::CouldNotTell => EXIT_COULD_NOT_TELL,
        }
    }
}

/// An error that knows its own class.
pub trait Classify: std::error::Error {
    /// `Some(class)` when this error decides the exit code; `None` when its cause decides
    /// (the error wraps another whose kind tells more, such as an `io::Error`).
    fn exit_class(&self) -> Option<ExitClass>;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    #[test]
    fn each_class_has_its_code() {
        assert_eq!(ExitClass::Input.code(), 1);
        assert_eq!(ExitClass::Machine.code(), 3);
        assert_eq!(ExitClass::CouldNotTell.code(), 4);
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
}

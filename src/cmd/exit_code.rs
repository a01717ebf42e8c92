//! The exit code of a failed command: each error type says its class beside its definition
//! ([`crate::exit::Classify`]); [`class_of`] names the root crate's types once and asks the
//! crates' lists for theirs, and [`exit_code`] walks an error chain with it.

use crate::exit::ExitClass;
#[cfg(doc)]
use crate::exit::{EXIT_COULD_NOT_TELL, EXIT_INTERNAL, EXIT_USAGE, EXIT_USER};

/// The exit code of an error chain: the contract of [`EXIT_USER`], [`EXIT_INTERNAL`],
/// [`EXIT_COULD_NOT_TELL`] and the signals' codes (usage errors, [`EXIT_USAGE`], are clap's).
/// Each error type says its class beside its definition ([`crate::exit::Classify`]); the chain
/// is walked from the outermost error in and the first that decides decides
/// ([`crate::exit::code_of`] with [`class_of`]); a chain with none is the input's fault
/// (`bail!` in the commands checks the input). A full disk anywhere in the chain is always
/// [`EXIT_INTERNAL`], whoever wrapped it.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    crate::exit::code_of(e.chain(), class_of)
}

/// The class of one error of a chain, whatever crate its type is of: `Some(decision)` when it
/// is a type of koord-bundle's (the decision `None` when its cause decides), `None` for a
/// type of no crate of koord-bundle's (serde's, anyhow's own). Every error type is named once
/// here or in its crate's `class_of`; `tests/it/error_classes.rs` fails when one is missing.
/// [`exit_code`] walks a chain with it.
pub fn class_of(e: &(dyn std::error::Error + 'static)) -> Option<Option<ExitClass>> {
    koord_base::exit_classes!(e;
        crate::admission::attach::AttachError,
        crate::admission::cosign::CosignError,
        crate::admission::policy::PolicyError,
        crate::admission::upstream::UpstreamError,
        crate::bundle::checksums::ChecksumsError,
        crate::bundle::emit::EmitError,
        crate::bundle::pack::PackError,
        crate::bundle::plan::BaseError,
        crate::bundle::plan::PlanError,
        crate::bundle::reader::VerifyError,
        crate::bundle::reuse::ReuseError,
        crate::bundle::sbom::SbomError,
        crate::bundle::source::SourceError,
        crate::cmd::Interrupted,
        crate::load::ChecksFailed,
        crate::serve::ServeError,
        crate::sources::NoSourceError,
        crate::sources::SourceError,
        crate::sources::resolve::ResolveError,
    )
    .or_else(|| koord_kube::class_of(e))
    .or_else(|| koord_splitset::class_of(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::Interrupted;
    use crate::exit::{EXIT_INTERNAL, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USER};
    use crate::store::{RegistryError, StoreError};

    fn transport() -> RegistryError {
        RegistryError::Transport {
            registry: "r.example".into(),
            what: "x:1".into(),
            message: "connection reset".into(),
            throttled: false,
            retry_after: None,
            retryable: true,
            attempts: 6,
        }
    }

    /// helm stopped at a bound: 3 when it waited on a registry or cluster, 1 when it rendered
    /// a chart without end; helm crashing on a chart is the chart's (1).
    #[test]
    fn helm_stopped_or_crashed() {
        use crate::helm::HelmError;
        let stopped = |transient| {
            anyhow::Error::from(HelmError::Stopped {
                command: "helm x".into(),
                source: crate::child::ChildError::TimedOut {
                    program: "helm".into(),
                    after: std::time::Duration::from_secs(1),
                },
                transient,
                hint: None,
            })
            .context("could not render")
        };
        assert_eq!(exit_code(&stopped(true)), EXIT_INTERNAL);
        assert_eq!(exit_code(&stopped(false)), EXIT_USER);
        let crashed = anyhow::Error::from(HelmError::Crashed {
            command: "helm template".into(),
            status: "exit status: 2".into(),
            fatal: "fatal error: out of memory".into(),
            what: "run out of memory",
        });
        assert_eq!(exit_code(&crashed), EXIT_USER);
    }

    #[test]
    fn transparent_wrappers_are_looked_into() {
        // WalkError::Store and StoreError::Failed forward their source: the RegistryError
        // is not in the chain of its own, only inside them.
        let e = anyhow::Error::from(crate::copy::WalkError::Store(StoreError::from(transport())))
            .context("push failed");
        assert_eq!(exit_code(&e), EXIT_INTERNAL);
        let e = anyhow::Error::from(crate::copy::WalkError::Store(StoreError::from(
            RegistryError::NotFound {
                what: "x:1".into(),
                registry: "r.example".into(),
            },
        )));
        assert_eq!(exit_code(&e), EXIT_USER);
    }

    #[test]
    fn io_errors_decide_by_kind_and_a_full_disk_always_wins() {
        let io = |k| anyhow::Error::from(std::io::Error::from(k)).context("reading x");
        assert_eq!(exit_code(&io(std::io::ErrorKind::NotFound)), EXIT_USER);
        assert_eq!(exit_code(&io(std::io::ErrorKind::IsADirectory)), EXIT_USER);
        assert_eq!(exit_code(&io(std::io::ErrorKind::Other)), EXIT_INTERNAL);
        // A decisive "input" error outside a full disk does not hide it.
        let e = anyhow::Error::from(koord_splitset::PartsError::Io {
            path: "p".into(),
            source: std::io::ErrorKind::StorageFull.into(),
        });
        assert_eq!(exit_code(&e), EXIT_INTERNAL);
        assert_eq!(exit_code(&anyhow::anyhow!("bad --platform")), EXIT_USER);
        use crate::exit::Signal;
        for (signal, code) in [(Signal::Int, EXIT_SIGINT), (Signal::Term, EXIT_SIGTERM)] {
            let e = anyhow::Error::from(Interrupted {
                signal,
                kept: "nothing was written yet".into(),
            });
            assert_eq!(exit_code(&e), code);
        }
    }

    /// Types the old downcast ladder did not know (they fell to 1 whatever they were) now say
    /// their class: a wrapper lets its cause decide, a transient cause is 3, the system's
    /// randomness missing is the machine's.
    #[test]
    fn types_once_forgotten_say_their_class() {
        use crate::chart::fetch::FetchError;
        use crate::store::http::HttpError;
        let index = |transient| {
            anyhow::Error::from(FetchError::Index {
                url: "http://charts.example/index.yaml".into(),
                source: HttpError::Get {
                    url: "http://charts.example/index.yaml".into(),
                    message: "connection refused".into(),
                    transient,
                },
            })
        };
        assert_eq!(exit_code(&index(true)), EXIT_INTERNAL);
        assert_eq!(exit_code(&index(false)), EXIT_USER);
        let no_digest = anyhow::Error::from(FetchError::NoDigest {
            version: "1.8.0".into(),
            url: "http://charts.example/koordinator-1.8.0.tgz".into(),
            actual: "0".repeat(64),
        });
        assert_eq!(exit_code(&no_digest), EXIT_USER);
        let random = anyhow::Error::from(crate::admission::cosign::CosignError::Random(
            "getrandom: ENOSYS".into(),
        ))
        .context("keygen --cosign");
        assert_eq!(exit_code(&random), EXIT_INTERNAL);
        // An untyped error (a check of the input in a command) is the input's.
        assert_eq!(exit_code(&anyhow::anyhow!("bad --platform")), EXIT_USER);
    }
}

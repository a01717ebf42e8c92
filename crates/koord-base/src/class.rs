//! The class of an error of this crate's types (and `io::Error`, tokio's `JoinError`), found
//! in an error chain ([`class_of`]): the one list of this crate's error types, which the crates
//! above call from theirs. Above every other module of the crate, whose types it names.

/// The class of one error of a chain when its type is one of this crate's (or `io::Error`,
/// `JoinError`): `Some(decision)`; `None` for a type of another crate, which that crate's
/// `class_of` knows.
pub fn class_of(e: &(dyn std::error::Error + 'static)) -> Option<Option<crate::exit::ExitClass>> {
    crate::exit_classes!(e;
        std::io::Error,
        tokio::task::JoinError,
        crate::child::ChildError,
        crate::crd::CrdError,
        crate::fsio::HardLinked,
        crate::oci::DigestError,
        crate::oci::ManifestError,
        crate::oci::RefError,
        crate::oci::TargetError,
        crate::sign::SignError,
        crate::yaml::YamlError,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::ExitClass;
    use crate::{oci, sign};
    use std::io::{Error, ErrorKind};

    #[test]
    fn the_types_of_this_crate_are_found_in_a_chain_and_others_are_not() {
        let io = Error::from(ErrorKind::NotFound);
        assert_eq!(class_of(&io), Some(Some(ExitClass::Input)));
        let sign = sign::SignError::Sign("no".into());
        assert_eq!(class_of(&sign), Some(Some(ExitClass::Machine)));
        let sign_io = sign::SignError::Io {
            path: "k".into(),
            source: Error::from(ErrorKind::StorageFull),
        };
        assert_eq!(class_of(&sign_io), Some(None), "its cause decides");
        let r = oci::ImageRef::parse("UPPER/Case:tag").unwrap_err();
        assert_eq!(class_of(&r), Some(Some(ExitClass::Input)));
        let other = std::fmt::Error;
        assert_eq!(class_of(&other), None);
    }
}

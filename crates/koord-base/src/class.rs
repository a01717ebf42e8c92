//! The class of an error of this crate's types, found in an error chain: the command layer
//! walks a chain of `dyn Error` and asks each error here first ([`base_class`]). Above
//! [`crate::sign`] and [`crate::oci`], whose types it knows; [`crate::exit`] knows none.

/// The class of one error of a chain when its type is one of this crate's (or `io::Error`):
/// `Some(decision)`; `None` for a type of another crate, which that crate's code classifies.
pub fn base_class(e: &(dyn std::error::Error + 'static)) -> Option<Option<crate::exit::ExitClass>> {
    use crate::exit::Classify as _;
    macro_rules! first_of {
        ($($t:ty),* $(,)?) => {
            $(
                if let Some(x) = e.downcast_ref::<$t>() {
                    return Some(x.exit_class());
                }
            )*
        };
    }
    first_of!(
        std::io::Error,
        crate::sign::SignError,
        crate::oci::DigestError,
        crate::oci::RefError,
        crate::oci::ManifestError,
        crate::oci::TargetError,
    );
    None
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
        assert_eq!(base_class(&io), Some(Some(ExitClass::Input)));
        let sign = sign::SignError::Sign("no".into());
        assert_eq!(base_class(&sign), Some(Some(ExitClass::Machine)));
        let sign_io = sign::SignError::Io {
            path: "k".into(),
            source: Error::from(ErrorKind::StorageFull),
        };
        assert_eq!(base_class(&sign_io), Some(None), "its cause decides");
        let r = oci::ImageRef::parse("UPPER/Case:tag").unwrap_err();
        assert_eq!(base_class(&r), Some(Some(ExitClass::Input)));
        let other = std::fmt::Error;
        assert_eq!(base_class(&other), None);
    }
}

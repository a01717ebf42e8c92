//! A bundle opened once per command: `load`, `verify`, `serve`, `inspect` and `diff` each open
//! the file (or the split set) they are given once and pass the handle on, instead of opening
//! it again for each question (is it gzip, is it whole, how large, its head, its verification).
//! A v2 split set is then scanned once, and its repair log, read by `tell_repairs`, holds every
//! block any of those reads rebuilt.
//!
//! Opening reads only what [`BundleFile::open`] reads (a plain file's first block; a split
//! set's header and the size of every part). The rest is read when asked, so each command keeps
//! the order of its checks and the words of its errors: a file that is no tar is refused before
//! a missing `--key` is, the signature after both.

use super::reader::{self, Head, SignaturePolicy, VerifyError, WholeHead};
use koord_splitset::BundleFile;
use std::path::Path;
use std::sync::OnceLock;

/// A bundle file, or a split set, opened once; the key its signature is checked with.
#[derive(Debug)]
pub struct OpenedBundle {
    file: BundleFile,
    /// `None`: the signature is not checked (`--insecure-skip-signature`), the default until
    /// [`OpenedBundle::set_trust`].
    key: Option<minisign::PublicKey>,
    /// The head, read once it was asked for and read whole.
    head: OnceLock<Head>,
}

impl OpenedBundle {
    /// Open the bundle at `path` (a file, or any part of a split set): its split header and the
    /// sizes of its parts; nothing of the archive yet.
    pub fn open(path: &Path) -> Result<Self, VerifyError> {
        let file = BundleFile::open(path).map_err(|source| VerifyError::Parts {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::of(file))
    }

    /// A handle on a bundle opened already.
    pub fn of(file: BundleFile) -> Self {
        OpenedBundle {
            file,
            key: None,
            head: OnceLock::new(),
        }
    }

    /// The key the signature is checked with; `None` skips the check
    /// (`--insecure-skip-signature`). Set after the open, so that a file that is not a bundle
    /// is said to be so before a missing key is.
    pub fn set_trust(&mut self, key: Option<minisign::PublicKey>) {
        self.key = key;
    }

    /// The key set by [`OpenedBundle::set_trust`], if any.
    pub fn key(&self) -> Option<&minisign::PublicKey> {
        self.key.as_ref()
    }

    /// How the readers treat the signature.
    pub fn policy(&self) -> SignaturePolicy<'_> {
        match &self.key {
            Some(k) => SignaturePolicy::Require(k),
            None => SignaturePolicy::Skip,
        }
    }

    /// The path the user named.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The file or the parts, as opened.
    pub fn file(&self) -> &BundleFile {
        &self.file
    }

    /// Whether it is a split set.
    pub fn is_split(&self) -> bool {
        self.file.is_split()
    }

    /// The bytes reading the bundle goes through, what a progress bar of that reading is sized
    /// by: for any part of a split set the joined bundle's (issue 31: a bar sized by the part
    /// given sat at its end after that part), else the file's.
    pub fn size(&self) -> u64 {
        self.file.size
    }

    /// Whether the bundle is gzip-compressed (its first two bytes).
    pub fn is_gzip(&self) -> Result<bool, VerifyError> {
        reader::is_gzip(self.path(), &self.file)
    }

    /// The head (checksum file, signature, bundle manifest), read on the first call. Nothing is
    /// verified: [`reader::read_head_of`].
    pub fn head(&self) -> Result<&Head, VerifyError> {
        if let Some(h) = self.head.get() {
            return Ok(h);
        }
        let h = reader::read_head_of(&self.file)?;
        Ok(self.head.get_or_init(|| h))
    }

    /// Every file before the blobs ([`reader::read_whole_head`]), for `inspect --sbom` and
    /// `diff`.
    pub fn whole_head(&self) -> Result<WholeHead, VerifyError> {
        reader::read_whole_head(&self.file)
    }

    /// Refuse a file that is no tar at all, and a bundle cut short, with a message that says so
    /// ([`reader::check_complete`]), before a long verification would name the files it did
    /// not find. A head that cannot be read for another reason is left to the verification
    /// that follows, which says why.
    pub fn check_complete(&self) -> Result<(), VerifyError> {
        match self.head() {
            Ok(head) => reader::check_complete(&self.file, head),
            Err(e @ VerifyError::NotATar(_)) => Err(e),
            Err(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(n: u32) -> Vec<u8> {
        (0..n)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect()
    }

    /// The progress of reading a split set counts the joined bundle's bytes: a bar sized by
    /// the part given (its file's length) sat at its end after the first part.
    #[test]
    fn a_split_set_is_sized_as_the_bundle_it_joins_to() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b.tar");
        std::fs::write(&bundle, noise(3_000_000)).unwrap();
        assert_eq!(OpenedBundle::open(&bundle).unwrap().size(), 3_000_000);
        let out = dir.path().join("parts");
        let opts = koord_splitset::SplitOptions {
            size: 1 << 20,
            parity: 1,
            spread: false,
            out_dir: &out,
            name: "b.tar",
            signer: None,
        };
        let parts = koord_splitset::split(&bundle, &opts, &|_| {}).unwrap();
        assert!(parts.len() > 3, "{parts:?}");
        for p in &parts[..2] {
            assert!(std::fs::metadata(p).unwrap().len() <= 1 << 20);
            let b = OpenedBundle::open(p).unwrap();
            assert_eq!(b.size(), 3_000_000, "{}", p.display());
            assert!(b.is_split());
        }
    }

    /// Random bytes are "not a tar archive", said before anything else; a tar whose manifest
    /// cannot be read is left to the verification (which says why); the head is read once.
    /// (A bundle cut short: tests/it/firsthour.rs, on real bundles, for every reader.)
    #[test]
    fn check_complete_refuses_random_bytes_and_leaves_the_rest_to_the_verification() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.tar");
        std::fs::write(&junk, noise(4096)).unwrap();
        let b = OpenedBundle::open(&junk).unwrap();
        assert!(matches!(b.check_complete(), Err(VerifyError::NotATar(_))));
        assert!(!b.is_gzip().unwrap());

        let mut ar = tar::Builder::new(Vec::new());
        for (name, bytes) in [
            (super::super::CHECKSUMS_FILE, &b"0 blobs/sha256/x\n"[..]),
            (
                super::super::MANIFEST_FILE,
                &b"{\"not\": \"a manifest\"}"[..],
            ),
        ] {
            let mut h = tar::Header::new_ustar();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_cksum();
            ar.append_data(&mut h, name, bytes).unwrap();
        }
        let odd = dir.path().join("odd.tar");
        std::fs::write(&odd, ar.into_inner().unwrap()).unwrap();
        let b = OpenedBundle::open(&odd).unwrap();
        let h1 = b.head().map(|h| h as *const Head).unwrap();
        let h2 = b.head().map(|h| h as *const Head).unwrap();
        assert_eq!(h1, h2, "the head is read once and kept");
        assert!(b.check_complete().is_ok());
    }
}

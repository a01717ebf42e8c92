//! The checksum file, in `sha256sum` format: `<64 hex>  <path>` per line, sorted by path.

use crate::oci::Digest;
use std::collections::BTreeMap;

/// A relative path with no `..`, no empty or `.` components and no backslash.
pub fn safe_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && !p.contains('\0')
        && p.trim_end_matches('/')
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Path → digest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checksums(pub BTreeMap<String, Digest>);

/// A checksum file that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("SHA256SUMS line {line}: {reason}")]
pub struct ChecksumsError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl crate::exit::Classify for ChecksumsError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        // A SHA256SUMS that does not parse: the bundle's.
        Some(crate::exit::ExitClass::Input)
    }
}

impl Checksums {
    /// Render as `sha256sum` would write it.
    pub fn render(&self) -> String {
        self.0
            .iter()
            .map(|(p, d)| format!("{}  {p}\n", d.hex()))
            .collect()
    }

    /// Parse; duplicate paths, unsafe paths and malformed lines are errors.
    pub fn parse(text: &[u8]) -> Result<Self, ChecksumsError> {
        let text = std::str::from_utf8(text).map_err(|_| ChecksumsError {
            line: 0,
            reason: "not UTF-8".into(),
        })?;
        let mut map = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let err = |reason: &str| ChecksumsError {
                line: i + 1,
                reason: reason.to_string(),
            };
            let (hex, path) = line
                .split_once("  ")
                .ok_or_else(|| err("expected `<sha256>  <path>`"))?;
            let d = Digest::from_hex(hex).map_err(|_| err("not a sha256 hex digest"))?;
            if !safe_path(path) {
                return Err(err(&format!("unsafe path {path:?}")));
            }
            if map.insert(path.to_string(), d).is_some() {
                return Err(err(&format!("{path} listed twice")));
            }
        }
        Ok(Checksums(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_paths() {
        for ok in ["a", "blobs/sha256/ab", "crds/x.yaml", "dir/"] {
            assert!(safe_path(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a\\b"] {
            assert!(!safe_path(bad), "{bad}");
        }
    }

    #[test]
    fn round_trip_and_refuse() {
        let mut c = Checksums::default();
        c.0.insert("b".into(), Digest::of(b"b"));
        c.0.insert("a/x".into(), Digest::of(b"a"));
        let t = c.render();
        assert!(t.starts_with(&Digest::of(b"a").hex().to_string()));
        assert_eq!(Checksums::parse(t.as_bytes()).unwrap(), c);
        assert!(Checksums::parse(format!("{}  ../x\n", Digest::of(b"").hex()).as_bytes()).is_err());
        assert!(
            Checksums::parse(format!("{0}  a\n{0}  a\n", Digest::of(b"").hex()).as_bytes())
                .is_err()
        );
        assert!(Checksums::parse(b"xyz  a\n").is_err());
    }
}

//! minisign keys and signatures, compatible with the `minisign` command
//! (`minisign -Vm SHA256SUMS -p koord-bundle.pub`).

use minisign::{KeyPair, PublicKey, PublicKeyBox, SecretKey, SecretKeyBox, SignatureBox};
use std::io::Cursor;
use std::path::{Path, PathBuf};

/// File name of the secret key.
pub const SECRET_KEY_FILE: &str = "koord-bundle.key";
/// File name of the public key.
pub const PUBLIC_KEY_FILE: &str = "koord-bundle.pub";

/// Signing and verification failures.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// A key file cannot be read or parsed.
    #[error("cannot use key {path}: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The key files already exist.
    #[error("{0} already exists: koord-bundle will not overwrite a key (move it away first)")]
    Exists(PathBuf),
    /// Writing keys failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The signature does not verify.
    #[error("signature check failed: {0}")]
    Bad(String),
    /// Signing failed.
    #[error("signing failed: {0}")]
    Sign(String),
}

impl crate::exit::Classify for SignError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // Reading or writing a key file: the kind of I/O error decides.
            SignError::Io { .. } => None,
            // minisign failed to sign with a key it loaded: not the input.
            SignError::Sign(_) => Some(C::Machine),
            SignError::Key { .. } | SignError::Exists(_) | SignError::Bad(_) => Some(C::Input),
        }
    }
}

/// Write a new key pair into `dir`. Returns (secret, public) paths.
pub fn keygen(dir: &Path, password: Option<String>) -> Result<(PathBuf, PathBuf), SignError> {
    let sk_path = dir.join(SECRET_KEY_FILE);
    let pk_path = dir.join(PUBLIC_KEY_FILE);
    for p in [&sk_path, &pk_path] {
        if p.exists() {
            return Err(SignError::Exists(p.clone()));
        }
    }
    std::fs::create_dir_all(dir).map_err(|source| SignError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let kp = match password {
        Some(pw) => KeyPair::generate_encrypted_keypair(Some(pw)),
        None => KeyPair::generate_unencrypted_keypair(),
    }
    .map_err(|e| SignError::Sign(e.to_string()))?;
    let sk_box = kp
        .sk
        .to_box(Some("koord-bundle secret key"))
        .map_err(|e| SignError::Sign(e.to_string()))?;
    let pk_box = kp.pk.to_box().map_err(|e| SignError::Sign(e.to_string()))?;
    // Both files are written in full to temporary files first, and only then linked into place
    // without replacing anything: a full disk or an error half-way leaves no key at all (not an
    // empty secret key that a later `keygen` then refuses to replace).
    let sk_tmp = write_temp(dir, &sk_box.to_bytes(), 0o600)?;
    let pk_tmp = write_temp(dir, &pk_box.to_bytes(), 0o644)?;
    let place = |tmp: tempfile::NamedTempFile, path: &Path| {
        tmp.persist_noclobber(path).map_err(|e| {
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                SignError::Exists(path.to_path_buf())
            } else {
                SignError::Io {
                    path: path.to_path_buf(),
                    source: e.error,
                }
            }
        })
    };
    place(sk_tmp, &sk_path)?;
    if let Err(e) = place(pk_tmp, &pk_path) {
        let _ = std::fs::remove_file(&sk_path);
        return Err(e);
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok((sk_path, pk_path))
}

/// `bytes` in a new temporary file of `dir` with `mode`, fsynced; removed when dropped.
fn write_temp(dir: &Path, bytes: &[u8], mode: u32) -> Result<tempfile::NamedTempFile, SignError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let io = |source| SignError::Io {
        path: dir.to_path_buf(),
        source,
    };
    // NamedTempFile is created 0600 with O_EXCL; widened (for the public key) only once written.
    let mut f = tempfile::Builder::new()
        .prefix(".koord-bundle-key.")
        .tempfile_in(dir)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.as_file().sync_all().map_err(io)?;
    f.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io)?;
    Ok(f)
}

/// Is the secret key at `path` protected by a password? (Its KDF algorithm is scrypt, `Sc`.)
pub fn secret_key_is_encrypted(path: &Path) -> Result<bool, SignError> {
    use base64::Engine as _;
    let text = read_key(path)?;
    let bad = |reason: &str| SignError::Key {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let line = text
        .lines()
        .nth(1)
        .ok_or_else(|| bad("not a minisign secret key (no key line)"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(line.trim())
        .map_err(|_| bad("not a minisign secret key (bad base64)"))?;
    if raw.len() < 4 || &raw[..2] != b"Ed" {
        return Err(bad("not a minisign Ed25519 secret key"));
    }
    Ok(&raw[2..4] == b"Sc")
}

/// A minisign key file is a few hundred bytes; a bound far above that keeps a wrong path (a
/// device, a huge file) from being read whole.
const MAX_KEY_FILE: usize = 64 * 1024;

/// A key file, opened as every input file is (a regular file only: a FIFO or a device is
/// refused at once instead of blocking) and read to a bound.
fn read_key(path: &Path) -> Result<String, SignError> {
    let bad = |reason: String| SignError::Key {
        path: path.to_path_buf(),
        reason,
    };
    let bytes =
        crate::bounded::read_file_bounded(path, MAX_KEY_FILE).map_err(|e| bad(e.to_string()))?;
    String::from_utf8(bytes).map_err(|_| bad("not a minisign key (not UTF-8 text)".into()))
}

/// Load a secret key (decrypting it with `password` when it is encrypted).
pub fn load_secret_key(path: &Path, password: Option<String>) -> Result<SecretKey, SignError> {
    let text = read_key(path)?;
    let key_err = |e: minisign::PError| SignError::Key {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let sk_box = SecretKeyBox::from_string(&text).map_err(key_err)?;
    if secret_key_is_encrypted(path)? {
        let Some(pw) = password else {
            return Err(SignError::Key {
                path: path.to_path_buf(),
                reason: "the key is encrypted: set KOORD_BUNDLE_KEY_PASSWORD or run on a terminal to be asked".into(),
            });
        };
        let sk = sk_box.into_secret_key(Some(pw)).map_err(key_err)?;
        if sk.is_encrypted() {
            return Err(SignError::Key {
                path: path.to_path_buf(),
                reason: "wrong password".into(),
            });
        }
        Ok(sk)
    } else {
        sk_box.into_unencrypted_secret_key().map_err(key_err)
    }
}

/// Load a public key file (the minisign `.pub` format).
pub fn load_public_key(path: &Path) -> Result<PublicKey, SignError> {
    let text = read_key(path)?;
    PublicKeyBox::from_string(&text)
        .and_then(|b| b.into_public_key())
        .map_err(|e| SignError::Key {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Key id as minisign prints it (16 upper-case hex digits).
pub fn key_id(keynum: &[u8]) -> String {
    let mut n = [0u8; 8];
    let len = keynum.len().min(8);
    n[..len].copy_from_slice(&keynum[..len]);
    format!("{:016X}", u64::from_le_bytes(n))
}

/// Sign `data`; returns the `.minisig` file content (minisign's prehashed `ED` format).
///
/// Deterministic: the same key, data and trusted comment give the same bytes (plain RFC 8032
/// Ed25519, where the minisign crate adds random noise), so a bundle built twice with
/// `SOURCE_DATE_EPOCH` is byte-identical. Checked by `minisign -V` and [`verify`].
pub fn sign(sk: &SecretKey, data: &[u8], trusted_comment: &str) -> Result<String, SignError> {
    use base64::Engine as _;
    use blake2::Digest as _;
    // SecretKey::to_bytes: sig_alg(2) kdf_alg(2) chk_alg(2) salt(32) ops(8) mem(8) keynum(8) sk(64) chk(32)
    let raw = sk.to_bytes();
    if raw.len() < 126 {
        return Err(SignError::Sign("unexpected secret key layout".into()));
    }
    let (keynum, secret) = (&raw[54..62], &raw[62..126]);
    let key = ed25519_compact::SecretKey::from_slice(secret)
        .map_err(|e| SignError::Sign(e.to_string()))?;
    let prehash = blake2::Blake2b512::digest(data);
    let sig = key.sign(prehash, None);
    let mut sig_and_comment = sig.as_ref().to_vec();
    sig_and_comment.extend_from_slice(trusted_comment.as_bytes());
    let global = key.sign(&sig_and_comment, None);
    let mut first = b"ED".to_vec();
    first.extend_from_slice(keynum);
    first.extend_from_slice(sig.as_ref());
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(format!(
        "untrusted comment: signature from koord-bundle\n{}\ntrusted comment: {trusted_comment}\n{}\n",
        b64.encode(first),
        b64.encode(global.as_ref())
    ))
}

/// What a signature file says about itself (without a key).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignatureInfo {
    /// Key id of the signer.
    pub key_id: String,
    /// The trusted comment (signed).
    pub trusted_comment: String,
}

/// Parse a `.minisig` file.
pub fn signature_info(sig: &[u8]) -> Result<SignatureInfo, SignError> {
    let text = std::str::from_utf8(sig)
        .map_err(|_| SignError::Bad("signature file is not UTF-8".into()))?;
    let sb = SignatureBox::from_string(text).map_err(|e| SignError::Bad(e.to_string()))?;
    Ok(SignatureInfo {
        key_id: key_id(sb.keynum()),
        trusted_comment: sb
            .trusted_comment()
            .map_err(|e| SignError::Bad(e.to_string()))?,
    })
}

/// Verify `sig` over `data` with `pk`.
pub fn verify(pk: &PublicKey, sig: &[u8], data: &[u8]) -> Result<SignatureInfo, SignError> {
    let info = signature_info(sig)?;
    let text = std::str::from_utf8(sig)
        .map_err(|_| SignError::Bad("signature file is not UTF-8".into()))?;
    let sb = SignatureBox::from_string(text).map_err(|e| SignError::Bad(e.to_string()))?;
    if sb.keynum() != pk.keynum() {
        return Err(SignError::Bad(format!(
            "the bundle was signed by key {} but the public key given is {}",
            info.key_id,
            key_id(pk.keynum())
        )));
    }
    minisign::verify(pk, &sb, Cursor::new(data), true, false, false)
        .map_err(|e| SignError::Bad(e.to_string()))?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn keygen_sign_verify() {
        let dir = tempfile::tempdir().unwrap();
        let (skp, pkp) = keygen(dir.path(), Some("pw".into())).unwrap();
        assert!(secret_key_is_encrypted(&skp).unwrap());
        assert!(load_secret_key(&skp, None).is_err());
        let sk = load_secret_key(&skp, Some("pw".into())).unwrap();
        let pk = load_public_key(&pkp).unwrap();
        let sig = sign(&sk, b"data", "koord-bundle test").unwrap();
        assert_eq!(
            sig,
            sign(&sk, b"data", "koord-bundle test").unwrap(),
            "deterministic"
        );
        let info = verify(&pk, sig.as_bytes(), b"data").unwrap();
        assert_eq!(info.trusted_comment, "koord-bundle test");
        assert!(verify(&pk, sig.as_bytes(), b"datA").is_err());
        assert!(keygen(dir.path(), None).is_err());
        let d2 = tempfile::tempdir().unwrap();
        let (sk2, pk2) = keygen(d2.path(), None).unwrap();
        assert!(!secret_key_is_encrypted(&sk2).unwrap());
        let other = load_public_key(&pk2).unwrap();
        let e = verify(&other, sig.as_bytes(), b"data")
            .unwrap_err()
            .to_string();
        assert!(e.contains("signed by key"), "{e}");
        load_secret_key(&sk2, None).unwrap();
    }
}

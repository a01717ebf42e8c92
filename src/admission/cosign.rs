//! Cosign's key files and signatures, written from cosign's own source (v2.6, `pkg/cosign/keys.go`
//! and go-securesystemslib's `encrypted` package), so that what this module writes the real
//! cosign reads, and what `cosign generate-key-pair` writes this module reads.
//!
//! - The private key: PEM `ENCRYPTED SIGSTORE PRIVATE KEY` (cosign 2; `ENCRYPTED COSIGN PRIVATE
//!   KEY` of older releases is read too) around JSON `{"kdf": {"name": "scrypt", "params": {"N",
//!   "r", "p"}, "salt"}, "cipher": {"name": "nacl/secretbox", "nonce"}, "ciphertext"}` (byte
//!   strings in standard base64). The secretbox key is scrypt(password, salt, N, r, p, 32); the
//!   plaintext is the key's PKCS#8 DER. Only the three scrypt strengths go-securesystemslib
//!   writes are accepted (N = 2^15, 2^16 or 2^17, r = 8, p = 1), as cosign accepts only them: a
//!   file naming another N cannot make the load allocate gigabytes. New keys use 2^16, cosign's.
//!   An empty password is what cosign writes with `COSIGN_PASSWORD=""`, and is read likewise.
//! - The public key: PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
//! - Signatures: ECDSA P-256 over SHA-256, ASN.1 DER (cosign's default key type; other key
//!   types are refused by name). The payloads: the simple-signing JSON of an image digest
//!   ([`simple_signing_payload`]) and the DSSE envelope of an in-toto statement
//!   ([`dsse_envelope`]).

use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::der::pem::LineEnding;
use p256::pkcs8::EncodePublicKey as _;
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePrivateKey as _};
use std::path::{Path, PathBuf};

/// The PEM label cosign 2 writes its encrypted private keys under.
pub const SIGSTORE_PRIVATE_PEM: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
/// The PEM label of older cosign releases (still read by cosign).
pub const COSIGN_PRIVATE_PEM: &str = "ENCRYPTED COSIGN PRIVATE KEY";
/// The private key's file name, as `cosign generate-key-pair` names it.
pub const PRIVATE_KEY_FILE: &str = "cosign.key";
/// The public key's file name, as `cosign generate-key-pair` names it.
pub const PUBLIC_KEY_FILE: &str = "cosign.pub";
/// The `type` of cosign's simple-signing payload.
pub const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";
/// The DSSE payload type of an in-toto statement.
pub const INTOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto statement type cosign writes.
pub const INTOTO_STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v0.1";
/// The predicate type of a CycloneDX BOM (`cosign attest --type cyclonedx`).
pub const CYCLONEDX_PREDICATE: &str = "https://cyclonedx.org/bom";

/// The scrypt strengths go-securesystemslib writes and reads (log2 N), r = 8, p = 1.
const SCRYPT_LOG_N: [u8; 3] = [15, 16, 17];
/// The strength new keys get (go-securesystemslib's `Standard`, what cosign writes).
const SCRYPT_NEW_LOG_N: u8 = 16;
const SALT_LEN: usize = 32;
const NONCE_LEN: usize = 24;
/// A key file larger than this is no cosign key (one is about 650 bytes).
const MAX_KEY_FILE: u64 = 64 * 1024;

/// A cosign key that cannot be read, made or used. Messages name the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CosignError {
    /// The file cannot be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is something else than a cosign private key.
    #[error("{} is not a cosign private key: it is {what} (give the cosign.key that `cosign generate-key-pair` or `koord-bundle keygen --cosign` wrote); nothing was pushed", path.display())]
    NotACosignKey {
        /// The file.
        path: PathBuf,
        /// What it is.
        what: String,
    },
    /// The password does not open the key.
    #[error("wrong password for the cosign key {}: the key did not decrypt with it (set COSIGN_PASSWORD to the password it was made with, or type it at the prompt); nothing was pushed", path.display())]
    WrongPassword {
        /// The file.
        path: PathBuf,
    },
    /// The key's JSON, its parameters or its decrypted key are not as cosign writes them.
    #[error("the cosign key {} is damaged or not as cosign writes it: {reason}; nothing was pushed", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A key of another type than ECDSA P-256.
    #[error("the cosign key {} is {algorithm}: koord-bundle signs with ECDSA P-256 keys only (what `cosign generate-key-pair` makes by default); nothing was pushed", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The key's algorithm.
        algorithm: String,
    },
    /// A key file that would be overwritten.
    #[error("{} exists: a key is never overwritten (move it away, or write the new pair to another --output-dir)", .0.display())]
    Exists(PathBuf),
    /// The system's randomness failed.
    #[error("no randomness from the system for the key: {0}")]
    Random(String),
    /// A public key that does not parse.
    #[error("{what} is not a PEM public key of ECDSA P-256: {reason}")]
    PublicKey {
        /// Where it came from.
        what: String,
        /// Why.
        reason: String,
    },
}

impl crate::exit::Classify for CosignError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // Reading or writing a key file: the kind of I/O error decides.
            CosignError::Io { .. } => None,
            // The system gave no randomness: the machine's.
            CosignError::Random(_) => Some(C::Machine),
            // A key that is not one, a wrong password, a key that exists.
            _ => Some(C::Input),
        }
    }
}

/// The encrypted key's JSON (go-securesystemslib `encrypted.data`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Encrypted {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    salt: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct KdfParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// A cosign private key file, read and checked but not decrypted yet: what [`CosignKey::open`]
/// needs the password for.
pub struct KeyFile {
    path: PathBuf,
    data: Encrypted,
}

/// A decrypted cosign key: signs, and says its public key.
pub struct CosignKey {
    signing: SigningKey,
    path: PathBuf,
}

impl std::fmt::Debug for CosignKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CosignKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// The first PEM block of `text`: its label and base64 body (lines joined), as Go's
/// `pem.Decode` finds it (text before it is skipped).
fn pem_block(text: &str) -> Option<(String, String)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + "-----BEGIN ".len()..];
    let (label, rest) = rest.split_once("-----")?;
    let end_marker = format!("-----END {label}-----");
    let end = rest.find(&end_marker)?;
    let body: String = rest[..end]
        .lines()
        // Go's PEM allows headers (`Key: value`): none in a cosign key; skipped if there.
        .filter(|l| !l.contains(':'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    Some((label.to_string(), body))
}

/// What a file that is not a cosign key is, in words.
fn describe(bytes: &[u8]) -> String {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return "not text (a binary file)".into();
    };
    if text.starts_with("untrusted comment:") {
        return if text.contains("secret key") {
            "a minisign secret key (the key koord-bundle signs bundles with, not a cosign key)"
                .into()
        } else {
            "a minisign file (a public key or a signature), not a cosign key".into()
        };
    }
    match pem_block(text) {
        Some((label, _)) => match label.as_str() {
            "PUBLIC KEY" => "a public key (cosign.pub?): give the private key, cosign.key".into(),
            "PRIVATE KEY" | "EC PRIVATE KEY" | "RSA PRIVATE KEY" => format!(
                "an unencrypted {label} (`cosign import-key-pair --key FILE` makes a cosign key of it)"
            ),
            "CERTIFICATE" => "a certificate".into(),
            other => format!("a PEM file of another kind ({other:?})"),
        },
        None if text.trim().is_empty() => "empty".into(),
        None => "text without a PEM block".into(),
    }
}

impl KeyFile {
    /// Read `path` and check that it is a cosign private key (PEM label, JSON, parameters).
    pub fn read(path: &Path) -> Result<KeyFile, CosignError> {
        let io = |source| CosignError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut bytes = Vec::new();
        // Opened as every input of load (a FIFO or a device refused at once, not waited on).
        let f = crate::bounded::open_input(path).map_err(io)?;
        use std::io::Read as _;
        f.take(MAX_KEY_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let not = |what: String| CosignError::NotACosignKey {
            path: path.to_path_buf(),
            what,
        };
        if bytes.len() as u64 > MAX_KEY_FILE {
            return Err(not(format!("larger than {MAX_KEY_FILE} bytes")));
        }
        Self::parse(path, &bytes).map_err(|e| match e {
            None => not(describe(&bytes)),
            Some(e) => e,
        })
    }

    /// `None`: not a cosign key at all (the caller says what it is).
    fn parse(path: &Path, bytes: &[u8]) -> Result<KeyFile, Option<CosignError>> {
        let text = std::str::from_utf8(bytes).map_err(|_| None)?;
        let (label, body) = pem_block(text).ok_or(None)?;
        if label != SIGSTORE_PRIVATE_PEM && label != COSIGN_PRIVATE_PEM {
            return Err(None);
        }
        let bad = |reason: String| {
            Some(CosignError::Malformed {
                path: path.to_path_buf(),
                reason,
            })
        };
        let json = b64()
            .decode(body)
            .map_err(|e| bad(format!("its PEM body is not base64 ({e})")))?;
        let data: Encrypted = serde_json::from_slice(&json)
            .map_err(|e| bad(format!("its JSON is not go-securesystemslib's ({e})")))?;
        if data.kdf.name != "scrypt" {
            return Err(bad(format!("unknown key derivation {:?}", data.kdf.name)));
        }
        if data.cipher.name != "nacl/secretbox" {
            return Err(bad(format!("unknown cipher {:?}", data.cipher.name)));
        }
        let p = &data.kdf.params;
        if !(p.r == 8 && p.p == 1 && SCRYPT_LOG_N.iter().any(|l| 1u64 << l == p.n)) {
            return Err(bad(format!(
                "scrypt parameters N={} r={} p={} are none of those cosign writes (N 2^15, 2^16 or 2^17, r 8, p 1)",
                p.n, p.r, p.p
            )));
        }
        Ok(KeyFile {
            path: path.to_path_buf(),
            data,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decrypt the key with `password` (may be empty, as cosign allows).
    pub fn open(&self, password: &[u8]) -> Result<CosignKey, CosignError> {
        let bad = |reason: String| CosignError::Malformed {
            path: self.path.clone(),
            reason,
        };
        let d = &self.data;
        let salt = b64()
            .decode(&d.kdf.salt)
            .map_err(|e| bad(format!("its salt is not base64 ({e})")))?;
        let nonce = b64()
            .decode(&d.cipher.nonce)
            .map_err(|e| bad(format!("its nonce is not base64 ({e})")))?;
        let ciphertext = b64()
            .decode(&d.ciphertext)
            .map_err(|e| bad(format!("its ciphertext is not base64 ({e})")))?;
        if nonce.len() != NONCE_LEN {
            return Err(bad(format!(
                "its nonce has {} bytes, not {NONCE_LEN}",
                nonce.len()
            )));
        }
        let log_n = d.kdf.params.n.trailing_zeros() as u8;
        let box_key = derive(password, &salt, log_n).map_err(bad)?;
        use crypto_secretbox::aead::{Aead as _, KeyInit as _};
        let cipher = crypto_secretbox::XSalsa20Poly1305::new((&box_key).into());
        let nonce = crypto_secretbox::Nonce::from_slice(&nonce);
        let der = cipher.decrypt(nonce, ciphertext.as_slice()).map_err(|_| {
            CosignError::WrongPassword {
                path: self.path.clone(),
            }
        })?;
        // The decrypted key is wiped when dropped.
        let der = p256::elliptic_curve::zeroize::Zeroizing::new(der);
        let signing = match p256::SecretKey::from_pkcs8_der(&der) {
            Ok(k) => SigningKey::from(k),
            Err(e) => {
                return Err(match algorithm_of(&der) {
                    Some(a) => CosignError::Unsupported {
                        path: self.path.clone(),
                        algorithm: a,
                    },
                    None => bad(format!("the decrypted key is not PKCS#8 ({e})")),
                })
            }
        };
        Ok(CosignKey {
            signing,
            path: self.path.clone(),
        })
    }
}

/// The algorithm a PKCS#8 key that is not P-256 holds, in words (`None`: not PKCS#8).
fn algorithm_of(der: &[u8]) -> Option<String> {
    let info = p256::pkcs8::PrivateKeyInfo::try_from(der).ok()?;
    let oid = info.algorithm.oid.to_string();
    let params = info.algorithm.parameters_oid().ok().map(|o| o.to_string());
    Some(match (oid.as_str(), params.as_deref()) {
        ("1.2.840.10045.2.1", Some("1.3.132.0.34")) => "an ECDSA P-384 key".into(),
        ("1.2.840.10045.2.1", Some("1.3.132.0.35")) => "an ECDSA P-521 key".into(),
        ("1.2.840.10045.2.1", p) => format!("an ECDSA key on curve {}", p.unwrap_or("?")),
        ("1.2.840.113549.1.1.1", _) => "an RSA key".into(),
        ("1.3.101.112", _) => "an Ed25519 key".into(),
        (o, _) => format!("a key of algorithm {o}"),
    })
}

/// scrypt(password, salt, 2^log_n, 8, 1) → the secretbox key.
fn derive(password: &[u8], salt: &[u8], log_n: u8) -> Result<[u8; 32], String> {
    let params = scrypt::Params::new(log_n, 8, 1, 32).map_err(|e| e.to_string())?;
    let mut out = [0u8; 32];
    scrypt::scrypt(password, salt, &params, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn random<const N: usize>() -> Result<[u8; N], CosignError> {
    let mut b = [0u8; N];
    use rand_core::RngCore as _;
    rand_core::OsRng
        .try_fill_bytes(&mut b)
        .map_err(|e| CosignError::Random(e.to_string()))?;
    Ok(b)
}

/// A new key pair in cosign's format: (the encrypted private key's PEM, the public key's PEM).
pub fn generate(password: &[u8]) -> Result<(String, String), CosignError> {
    let secret = p256::SecretKey::random(&mut rand_core::OsRng);
    let der = secret
        .to_pkcs8_der()
        .map_err(|e| CosignError::Random(format!("encoding the new key: {e}")))?;
    let private = encrypt(der.as_bytes(), password)?;
    let public = CosignKey {
        signing: SigningKey::from(secret),
        path: PathBuf::new(),
    }
    .public_key_pem();
    Ok((private, public))
}

/// `plaintext` (a PKCS#8 key) encrypted as go-securesystemslib does, in cosign's PEM.
fn encrypt(plaintext: &[u8], password: &[u8]) -> Result<String, CosignError> {
    let salt: [u8; SALT_LEN] = random()?;
    let nonce: [u8; NONCE_LEN] = random()?;
    let box_key = derive(password, &salt, SCRYPT_NEW_LOG_N).map_err(CosignError::Random)?;
    use crypto_secretbox::aead::{Aead as _, KeyInit as _};
    let cipher = crypto_secretbox::XSalsa20Poly1305::new((&box_key).into());
    let ciphertext = cipher
        .encrypt(crypto_secretbox::Nonce::from_slice(&nonce), plaintext)
        .map_err(|e| CosignError::Random(format!("encrypting the new key: {e}")))?;
    let data = Encrypted {
        kdf: Kdf {
            name: "scrypt".into(),
            params: KdfParams {
                n: 1 << SCRYPT_NEW_LOG_N,
                r: 8,
                p: 1,
            },
            salt: b64().encode(salt),
        },
        cipher: Cipher {
            name: "nacl/secretbox".into(),
            nonce: b64().encode(nonce),
        },
        ciphertext: b64().encode(ciphertext),
    };
    let json = serde_json::to_vec(&data).map_err(|e| CosignError::Random(e.to_string()))?;
    Ok(pem(SIGSTORE_PRIVATE_PEM, &json))
}

/// A PEM block of `bytes`, 64 characters a line, as Go's `pem.Encode` writes it.
fn pem(label: &str, bytes: &[u8]) -> String {
    let body = b64().encode(bytes);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Write a new key pair into `dir` as `cosign.key` (0600) and `cosign.pub` (0644), as
/// `cosign generate-key-pair` does; an existing file is never overwritten. Returns both paths.
pub fn write_pair(dir: &Path, password: &[u8]) -> Result<(PathBuf, PathBuf), CosignError> {
    let (sk_path, pk_path) = (dir.join(PRIVATE_KEY_FILE), dir.join(PUBLIC_KEY_FILE));
    for p in [&sk_path, &pk_path] {
        if p.symlink_metadata().is_ok() {
            return Err(CosignError::Exists(p.clone()));
        }
    }
    let (private, public) = generate(password)?;
    write_new(&sk_path, private.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&pk_path, public.as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&sk_path);
        return Err(e);
    }
    Ok((sk_path, pk_path))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CosignError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CosignError::Exists(path.to_path_buf())
        } else {
            CosignError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io)
}

impl CosignKey {
    /// The key's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The public key as cosign writes it (`cosign.pub`, PEM `PUBLIC KEY`): what the cluster's
    /// admission policy names.
    pub fn public_key_pem(&self) -> String {
        self.signing
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap_or_default()
    }

    /// The public key, for checking signatures.
    pub fn verifying_key(&self) -> &VerifyingKey {
        self.signing.verifying_key()
    }

    /// An ECDSA P-256 / SHA-256 signature of `message`, ASN.1 DER (deterministic, RFC 6979).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let s: Signature = self.signing.sign(message);
        s.to_der().as_bytes().to_vec()
    }
}

/// Does `sig` (ASN.1 DER) sign `message` under `key`?
pub fn verify(key: &VerifyingKey, message: &[u8], sig: &[u8]) -> bool {
    Signature::from_der(sig).is_ok_and(|s| key.verify(message, &s).is_ok())
}

/// A public key from its PEM (`cosign.pub`).
pub fn public_key_from_pem(what: &str, pem: &str) -> Result<VerifyingKey, CosignError> {
    VerifyingKey::from_public_key_pem(pem.trim()).map_err(|e| CosignError::PublicKey {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// Cosign's simple-signing payload of `digest` (`sha256:…`) in `repository` (`HOST/PATH`, as
/// cosign writes `docker-reference`), byte for byte as cosign marshals it (keys in this
/// order, `optional` null).
pub fn simple_signing_payload(repository: &str, digest: &str) -> Vec<u8> {
    // serde_json's maps are sorted: critical < optional, identity < image < type, the order
    // of cosign's Go structs.
    let v = serde_json::json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": SIMPLE_SIGNING_TYPE,
        },
        "optional": null,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// The `docker-manifest-digest` of a simple-signing payload of cosign's type, if it is one.
pub fn signed_digest(payload: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    if v["critical"]["type"] != SIMPLE_SIGNING_TYPE {
        return None;
    }
    v["critical"]["image"]["docker-manifest-digest"]
        .as_str()
        .map(str::to_string)
}

/// DSSE's pre-authentication encoding of `body` of `payload_type`: what is signed.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// An in-toto statement (v0.1, as cosign writes it) of `predicate` of `predicate_type` about
/// `digest` (`sha256:…`) in `repository`.
pub fn intoto_statement(
    repository: &str,
    digest: &str,
    predicate_type: &str,
    predicate: &serde_json::Value,
) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let v = serde_json::json!({
        "_type": INTOTO_STATEMENT_TYPE,
        "predicateType": predicate_type,
        "subject": [{"name": repository, "digest": {"sha256": hex}}],
        "predicate": predicate,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// A DSSE envelope of `statement` (in-toto), signed with `key`, as `cosign attest` writes it.
pub fn dsse_envelope(key: &CosignKey, statement: &[u8]) -> Vec<u8> {
    let sig = key.sign(&pae(INTOTO_PAYLOAD_TYPE, statement));
    let v = serde_json::json!({
        "payloadType": INTOTO_PAYLOAD_TYPE,
        "payload": b64().encode(statement),
        "signatures": [{"keyid": "", "sig": b64().encode(sig)}],
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Is `envelope` a DSSE envelope signed by `key` whose in-toto statement has
/// `predicate_type` and names `digest` as a subject?
pub fn envelope_attests(
    key: &VerifyingKey,
    envelope: &[u8],
    digest: &str,
    predicate_type: &str,
) -> bool {
    let Ok(env) = serde_json::from_slice::<serde_json::Value>(envelope) else {
        return false;
    };
    if env["payloadType"] != INTOTO_PAYLOAD_TYPE {
        return false;
    }
    let Some(body) = env["payload"].as_str().and_then(|p| b64().decode(p).ok()) else {
        return false;
    };
    let message = pae(INTOTO_PAYLOAD_TYPE, &body);
    let signed = env["signatures"].as_array().is_some_and(|sigs| {
        sigs.iter().any(|s| {
            s["sig"]
                .as_str()
                .and_then(|x| b64().decode(x).ok())
                .is_some_and(|sig| verify(key, &message, &sig))
        })
    });
    if !signed {
        return false;
    }
    let Ok(st) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return false;
    };
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    st["predicateType"] == predicate_type
        && st["subject"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["digest"]["sha256"] == hex))
}

/// The `predicateType` of the in-toto statement a DSSE envelope carries (not checked: see
/// [`envelope_attests`]).
pub fn envelope_predicate_type(envelope: &[u8]) -> Option<String> {
    let env: serde_json::Value = serde_json::from_slice(envelope).ok()?;
    let body = b64().decode(env["payload"].as_str()?).ok()?;
    let st: serde_json::Value = serde_json::from_slice(&body).ok()?;
    st["predicateType"].as_str().map(str::to_string)
}

/// Base64 (standard, padded), as cosign writes signatures in annotations.
pub fn base64(bytes: &[u8]) -> String {
    b64().encode(bytes)
}

/// Base64 decoded (`None`: not base64).
pub fn unbase64(text: &str) -> Option<Vec<u8>> {
    b64().decode(text.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn generate_open_sign_verify() {
        let d = tempfile::tempdir().unwrap();
        let (sk, pk) = write_pair(d.path(), b"pw").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&sk).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let text = std::fs::read_to_string(&sk).unwrap();
        assert!(text.starts_with("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n"));
        let key = KeyFile::read(&sk).unwrap().open(b"pw").unwrap();
        let pub_pem = std::fs::read_to_string(&pk).unwrap();
        assert_eq!(key.public_key_pem(), pub_pem);
        let vk = public_key_from_pem("pub", &pub_pem).unwrap();
        let sig = key.sign(b"payload");
        assert!(verify(&vk, b"payload", &sig));
        assert!(!verify(&vk, b"payload2", &sig));
        // Wrong password: said as such.
        let e = KeyFile::read(&sk).unwrap().open(b"other").unwrap_err();
        assert!(matches!(e, CosignError::WrongPassword { .. }), "{e}");
        // Never overwritten.
        assert!(matches!(
            write_pair(d.path(), b"pw").unwrap_err(),
            CosignError::Exists(_)
        ));
    }

    #[test]
    fn empty_password_works_as_cosign_allows() {
        let d = tempfile::tempdir().unwrap();
        let (sk, _) = write_pair(d.path(), b"").unwrap();
        KeyFile::read(&sk).unwrap().open(b"").unwrap();
    }

    #[test]
    fn other_files_are_named() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            (
                "untrusted comment: minisign encrypted secret key\nRWQ...\n",
                "minisign secret key",
            ),
            (
                "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                "a public key",
            ),
            (
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n",
                "unencrypted EC PRIVATE KEY",
            ),
            ("hello\n", "text without a PEM block"),
            ("", "empty"),
        ];
        for (text, needle) in cases {
            let p = write(d.path(), "k", text);
            let e = KeyFile::read(&p).err().unwrap().to_string();
            assert!(
                e.contains("is not a cosign private key") && e.contains(needle),
                "{e}"
            );
        }
        // A cosign label around a body that is not the JSON: damaged, said so.
        let p = write(d.path(), "k", &pem(SIGSTORE_PRIVATE_PEM, b"{\"kdf\":1}"));
        let e = KeyFile::read(&p).err().unwrap();
        assert!(matches!(e, CosignError::Malformed { .. }), "{e}");
    }

    #[test]
    fn scrypt_strength_outside_cosigns_is_refused_before_any_work() {
        let d = tempfile::tempdir().unwrap();
        let json = br#"{"kdf":{"name":"scrypt","params":{"N":1073741824,"r":8,"p":1},"salt":"AAAA"},"cipher":{"name":"nacl/secretbox","nonce":"AAAA"},"ciphertext":"AAAA"}"#;
        let p = write(d.path(), "k", &pem(COSIGN_PRIVATE_PEM, json));
        let e = KeyFile::read(&p).err().unwrap().to_string();
        assert!(e.contains("N=1073741824"), "{e}");
    }

    #[test]
    fn payload_is_cosigns_bytes() {
        let p = simple_signing_payload("r.example/a/b", "sha256:00ff");
        assert_eq!(
            String::from_utf8(p.clone()).unwrap(),
            r#"{"critical":{"identity":{"docker-reference":"r.example/a/b"},"image":{"docker-manifest-digest":"sha256:00ff"},"type":"cosign container image signature"},"optional":null}"#
        );
        assert_eq!(signed_digest(&p).as_deref(), Some("sha256:00ff"));
    }

    #[test]
    fn envelope_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let (sk, _) = write_pair(d.path(), b"x").unwrap();
        let key = KeyFile::read(&sk).unwrap().open(b"x").unwrap();
        let st = intoto_statement(
            "r/a",
            "sha256:abcd",
            CYCLONEDX_PREDICATE,
            &serde_json::json!({"bomFormat": "CycloneDX"}),
        );
        let env = dsse_envelope(&key, &st);
        let vk = key.verifying_key();
        assert!(envelope_attests(
            vk,
            &env,
            "sha256:abcd",
            CYCLONEDX_PREDICATE
        ));
        assert!(!envelope_attests(
            vk,
            &env,
            "sha256:abce",
            CYCLONEDX_PREDICATE
        ));
        assert!(!envelope_attests(
            vk,
            &env,
            "sha256:abcd",
            "https://spdx.dev/Document"
        ));
        let d2 = tempfile::tempdir().unwrap();
        let (sk2, _) = write_pair(d2.path(), b"x").unwrap();
        let other = KeyFile::read(&sk2).unwrap().open(b"x").unwrap();
        assert!(!envelope_attests(
            other.verifying_key(),
            &env,
            "sha256:abcd",
            CYCLONEDX_PREDICATE
        ));
    }
}

//! The admission policies `load --sign-images` writes for the site: each admits the images under
//! the load's `REGISTRY[/PREFIX]` only when they carry a cosign signature made with the site's
//! key, and needs neither a transparency log nor the internet.
//!
//! Two engines, one file each ([`render`] makes them, [`write`] puts them in a directory):
//!
//! - **Kyverno**: an `ImageValidatingPolicy` (`policies.kyverno.io/v1`). That is the form the
//!   engine's current release documents for image verification: the CEL policy types are stable
//!   (`v1`) since Kyverno 1.17, which deprecated `ClusterPolicy` (`verifyImages` included; only
//!   critical fixes in 1.18 and 1.19, removal planned for 1.20), and 1.19 is the current
//!   release. The attestor is a cosign public key with `ctlog: {insecureIgnoreTlog: true,
//!   insecureIgnoreSCT: true}`. Before Kyverno 1.19.0 an `ImageValidatingPolicy` initialised
//!   the sigstore TUF client for every verification, even for a key with the log ignored, and
//!   failed offline (kyverno/kyverno #13217, #15690, #16052); 1.19.0 (PR #16298) skips TUF,
//!   Rekor and the CT log for exactly this attestor. The README says what an offline cluster
//!   needs on older releases.
//! - **sigstore policy-controller**: a `ClusterImagePolicy` (`policy.sigstore.dev/v1beta1`)
//!   with one `key` authority and no `ctlog`: with no Rekor client and no Rekor keys the
//!   controller skips the transparency log (`IgnoreTlog`), and a key authority has no
//!   certificate, hence no SCT. The controller itself must run with `--disable-tuf` offline
//!   (README).
//!
//! The images are matched by glob: Kyverno's (gobwas/glob, where `*` also matches `/`)
//! `PREFIX/*`, and the policy-controller's (where `*` stops at `/` and `**` does not)
//! `PREFIX/**`: every repository under the prefix, at any depth, by tag or digest.
//!
//! The YAML is emitted with serde from typed documents, never from string templates, so a key,
//! a prefix or a name is quoted as YAML needs whatever it holds (a name `on` stays a string for
//! the YAML 1.1 reader of the API server). What can be checked before is: the key is one PEM
//! `PUBLIC KEY` block whose body is a DER structure (re-encoded canonically from its bytes), the
//! prefix obeys the `--registry HOST[:PORT][/PREFIX]` rules, and the name is a DNS label.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Serialize;

use crate::oci::Target;

/// The policies' name when the user gives none: the objects' `metadata.name` and the files'
/// `koordinator-signed-kyverno.yaml` and `koordinator-signed-policy-controller.yaml`.
pub const DEFAULT_NAME: &str = "koordinator-signed";

/// The engine a policy file is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// Kyverno, `ImageValidatingPolicy` (`policies.kyverno.io/v1`).
    Kyverno,
    /// The sigstore policy-controller, `ClusterImagePolicy` (`policy.sigstore.dev/v1beta1`).
    PolicyController,
}

impl Engine {
    /// The engine and the kind, for the output naming the file.
    pub fn describe(self) -> &'static str {
        match self {
            Engine::Kyverno => "Kyverno ImageValidatingPolicy (policies.kyverno.io/v1)",
            Engine::PolicyController => {
                "sigstore policy-controller ClusterImagePolicy (policy.sigstore.dev/v1beta1)"
            }
        }
    }
}

/// One policy, as written: its file name (no directory), its engine, its YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFile {
    /// The file name, e.g. `koordinator-signed-kyverno.yaml`.
    pub file_name: String,
    /// The engine the file is for.
    pub engine: Engine,
    /// The YAML document.
    pub yaml: String,
}

/// Why a policy could not be rendered or written; each message says what to give instead.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The public key is not one PEM public key.
    #[error(
        "the signing key's public half is not a PEM public key ({reason}): give the .pub file that `cosign generate-key-pair` wrote beside the private key (-----BEGIN PUBLIC KEY-----)"
    )]
    PublicKey {
        /// What is wrong with it.
        reason: String,
    },
    /// The image prefix breaks a rule of `HOST[:PORT][/PREFIX]`.
    #[error("the image prefix for the admission policies: {0}")]
    Prefix(#[from] crate::oci::TargetError),
    /// The image prefix holds a character an engine's glob cannot hold literally.
    #[error(
        "the image prefix {prefix:?} holds {ch:?}, which the policy engines' image globs cannot match literally (the sigstore policy-controller takes only letters, digits and -_:/.@ in a glob): give the registry by a host name (e.g. an /etc/hosts or DNS name for the address) and load again"
    )]
    GlobCharacter {
        /// The prefix as given.
        prefix: String,
        /// The character.
        ch: char,
    },
    /// The policy name is not a DNS label.
    #[error(
        "the policy name {name:?} is not a Kubernetes name: give lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63 characters (e.g. koordinator-signed)"
    )]
    Name {
        /// The name as given.
        name: String,
    },
    /// A name that YAML 1.1 reads as a boolean.
    #[error(
        "the policy name {name:?} would be read as a boolean by kubectl's YAML 1.1 reader: give another name (e.g. koordinator-signed)"
    )]
    YamlBoolean {
        /// The name as given.
        name: String,
    },
    /// A policy did not serialise (an internal error).
    #[error("the {what} policy could not be written as YAML: {source}")]
    Yaml {
        /// Which policy.
        what: &'static str,
        /// serde_yaml_ng's error.
        source: serde_yaml_ng::Error,
    },
    /// The directory to write into does not exist.
    #[error(
        "the policy directory {} does not exist: create it or give another one with --policy-dir DIR",
        .dir.display()
    )]
    NoDirectory {
        /// The directory.
        dir: PathBuf,
    },
    /// The path to write into is not a directory.
    #[error(
        "{} is not a directory: give a directory for the policy files with --policy-dir DIR",
        .dir.display()
    )]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// A file name that is not a plain name in the directory.
    #[error("{name:?} is not a plain file name: a policy file is written inside its directory")]
    FileName {
        /// The name.
        name: String,
    },
    /// Writing a file failed.
    #[error(
        "writing the policy file {}: {source}: check the directory's free space and permissions",
        .path.display()
    )]
    Write {
        /// The file (or the directory, for its sync).
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl crate::exit::Classify for PolicyError {
    fn exit_class(&self) -> Option<crate::exit::ExitClass> {
        use crate::exit::ExitClass as C;
        match self {
            // The prefix's own error, writing the file: the cause decides.
            PolicyError::Prefix(_) | PolicyError::Write { .. } => None,
            // koord-bundle's own policy that does not serialise: a bug.
            PolicyError::Yaml { .. } => Some(C::Machine),
            // A key, a prefix, a name or a directory that is not right.
            _ => Some(C::Input),
        }
    }
}

/// Render the two policies that admit the images under `image_prefix` (`HOST[:PORT][/PREFIX]`,
/// as `load --registry` takes it) only when signed by `public_key_pem`, named `name` in the
/// cluster and in their file names (`NAME-kyverno.yaml`, `NAME-policy-controller.yaml`), in
/// that order. Nothing is read or written: see [`write`].
pub fn render(
    public_key_pem: &str,
    image_prefix: &str,
    name: &str,
) -> Result<Vec<PolicyFile>, PolicyError> {
    let key = canonical_public_key(public_key_pem)?;
    let target = Target::parse_for("--registry", image_prefix)?;
    let prefix = target.host_and_prefix();
    if let Some(ch) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '/')))
    {
        return Err(PolicyError::GlobCharacter {
            prefix: image_prefix.to_string(),
            ch,
        });
    }
    if !crate::text::is_dns_label(name) {
        return Err(PolicyError::Name {
            name: name.to_string(),
        });
    }
    if YAML11_BOOLEANS.contains(&name) {
        return Err(PolicyError::YamlBoolean {
            name: name.to_string(),
        });
    }

    let kyverno = kyverno_policy(&key, &prefix, name);
    let sigstore = policy_controller_policy(&key, &prefix, name);
    Ok(vec![
        PolicyFile {
            file_name: format!("{name}-kyverno.yaml"),
            engine: Engine::Kyverno,
            yaml: to_yaml("Kyverno", &kyverno)?,
        },
        PolicyFile {
            file_name: format!("{name}-policy-controller.yaml"),
            engine: Engine::PolicyController,
            yaml: to_yaml("policy-controller", &sigstore)?,
        },
    ])
}

/// Write `files` into `dir`, each atomically (a temporary file in `dir`, synced, renamed over
/// the name; an existing file is replaced, a reader sees the old file or the new one whole).
/// Returns the paths written, in order. A directory that does not exist is an error naming it.
pub fn write(dir: &Path, files: &[PolicyFile]) -> Result<Vec<PathBuf>, PolicyError> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(PolicyError::NotADirectory {
                dir: dir.to_path_buf(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PolicyError::NoDirectory {
                dir: dir.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(PolicyError::Write {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    let mut written = Vec::with_capacity(files.len());
    for file in files {
        let plain = Path::new(&file.file_name)
            .file_name()
            .is_some_and(|n| n == file.file_name.as_str());
        if !plain || file.file_name.starts_with('.') {
            return Err(PolicyError::FileName {
                name: file.file_name.clone(),
            });
        }
        let path = dir.join(&file.file_name);
        write_one(dir, &path, file.yaml.as_bytes()).map_err(|source| PolicyError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
    }
    // The renames are durable once the directory is.
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| PolicyError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    Ok(written)
}

fn write_one(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    // A policy is no secret: readable like any file kubectl applies (tempfile makes 0600).
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(fs::Permissions::from_mode(0o644))?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn to_yaml<T: Serialize>(what: &'static str, doc: &T) -> Result<String, PolicyError> {
    let body =
        serde_yaml_ng::to_string(doc).map_err(|source| PolicyError::Yaml { what, source })?;
    Ok(format!("{HEADER}{body}"))
}

/// The comment at the top of each file: fixed text (no value is templated into YAML).
const HEADER: &str =
    "# Written by koord-bundle load --sign-images: admits the images under the load's registry\n\
# prefix only when signed by the site's cosign key; no transparency log, no internet.\n\
# Apply with kubectl apply -f FILE; the engine settings an offline cluster needs are in the\n\
# README (\"Signed for admission: policies for an offline cluster\").\n";

/// The DNS labels a YAML 1.1 reader (kubectl's, the API server's: go-yaml v2) takes for a
/// boolean when plain. serde_yaml_ng quotes what YAML 1.2 reads as another type (`true`,
/// `null`, `0123`) but writes these plain, and has no way to ask for quotes; `kubectl apply`
/// then fails with "cannot unmarshal bool into Go struct field ObjectMeta.metadata.name".
const YAML11_BOOLEANS: &[&str] = &["y", "n", "yes", "no", "on", "off"];

/// The key as one canonical PEM block (64-column base64 of its DER bytes, a final newline):
/// one `PUBLIC KEY` block, its body base64 of a DER SEQUENCE that spans it exactly. Text around
/// the block (a comment line) is not carried over.
fn canonical_public_key(pem: &str) -> Result<String, PolicyError> {
    const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
    const END: &str = "-----END PUBLIC KEY-----";
    let bad = |reason: &str| PolicyError::PublicKey {
        reason: reason.to_string(),
    };
    if pem.contains("PRIVATE KEY-----") {
        return Err(bad(
            "it is a private key; the policy carries only the public key",
        ));
    }
    let Some(start) = pem.find(BEGIN) else {
        return Err(bad("no -----BEGIN PUBLIC KEY----- line"));
    };
    let after = &pem[start + BEGIN.len()..];
    let Some(end) = after.find(END) else {
        return Err(bad("no -----END PUBLIC KEY----- line"));
    };
    if after[end + END.len()..].contains(BEGIN) {
        return Err(bad("more than one public key; give one"));
    }
    let body: String = after[..end]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body.as_bytes())
        .map_err(|e| bad(&format!("its body is not base64: {e}")))?;
    if !is_der_sequence(&der) {
        return Err(bad("its body is not a DER public key structure"));
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    let mut out = String::with_capacity(b64.len() + 80);
    out.push_str(BEGIN);
    out.push('\n');
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    Ok(out)
}

/// A DER SEQUENCE whose length spans `der` exactly (a SubjectPublicKeyInfo is one).
fn is_der_sequence(der: &[u8]) -> bool {
    let (Some(&0x30), Some(&len0)) = (der.first(), der.get(1)) else {
        return false;
    };
    let (len, header) = if len0 < 0x80 {
        (usize::from(len0), 2)
    } else {
        let n = usize::from(len0 & 0x7f);
        if n == 0 || n > 4 || der.len() < 2 + n {
            return false;
        }
        let len = der[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, 2 + n)
    };
    len > 0 && header + len == der.len()
}

// ---- Kyverno: ImageValidatingPolicy, policies.kyverno.io/v1 ----

/// The attestor's name, as the validation's CEL names it (`attestors.site`).
const ATTESTOR: &str = "site";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Document<S> {
    api_version: &'static str,
    kind: &'static str,
    metadata: Metadata,
    spec: S,
}

#[derive(Serialize)]
struct Metadata {
    name: String,
    labels: Labels,
}

#[derive(Serialize)]
struct Labels {
    #[serde(rename = "app.kubernetes.io/managed-by")]
    managed_by: &'static str,
}

fn metadata(name: &str) -> Metadata {
    Metadata {
        name: name.to_string(),
        labels: Labels {
            managed_by: "koord-bundle",
        },
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct IvpolSpec {
    validation_actions: Vec<&'static str>,
    failure_policy: &'static str,
    webhook_configuration: WebhookConfiguration,
    evaluation: Evaluation,
    match_constraints: MatchConstraints,
    match_image_references: Vec<Glob>,
    validation_configurations: ValidationConfigurations,
    attestors: Vec<Attestor>,
    validations: Vec<Validation>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WebhookConfiguration {
    timeout_seconds: u32,
}

#[derive(Serialize)]
struct Evaluation {
    background: Enabled,
}

#[derive(Serialize)]
struct Enabled {
    enabled: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MatchConstraints {
    resource_rules: Vec<ResourceRule>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceRule {
    api_groups: Vec<&'static str>,
    api_versions: Vec<&'static str>,
    operations: Vec<&'static str>,
    resources: Vec<&'static str>,
}

#[derive(Serialize)]
struct Glob {
    glob: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ValidationConfigurations {
    mutate_digest: bool,
    verify_digest: bool,
    required: bool,
}

#[derive(Serialize)]
struct Attestor {
    name: &'static str,
    cosign: Cosign,
}

#[derive(Serialize)]
struct Cosign {
    key: KeyData,
    ctlog: CtLog,
}

#[derive(Serialize)]
struct KeyData {
    data: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CtLog {
    #[serde(rename = "insecureIgnoreTlog")]
    insecure_ignore_tlog: bool,
    #[serde(rename = "insecureIgnoreSCT")]
    insecure_ignore_sct: bool,
}

#[derive(Serialize)]
struct Validation {
    expression: String,
    message: String,
}

fn kyverno_policy(key: &str, prefix: &str, name: &str) -> Document<IvpolSpec> {
    Document {
        api_version: "policies.kyverno.io/v1",
        kind: "ImageValidatingPolicy",
        metadata: metadata(name),
        spec: IvpolSpec {
            validation_actions: vec!["Deny"],
            // A verification that cannot answer (registry down) refuses the pod, as a missing
            // signature does: the policy fails closed.
            failure_policy: "Fail",
            webhook_configuration: WebhookConfiguration {
                timeout_seconds: 30,
            },
            // Admission only: pods already running are neither re-checked nor evicted.
            evaluation: Evaluation {
                background: Enabled { enabled: false },
            },
            // Pods; Kyverno's autogen extends the rule to their controllers (Deployments,
            // DaemonSets, ...), so an unsigned image is refused when its Deployment is applied.
            match_constraints: MatchConstraints {
                resource_rules: vec![ResourceRule {
                    api_groups: vec![""],
                    api_versions: vec!["v1"],
                    operations: vec!["CREATE", "UPDATE"],
                    resources: vec!["pods"],
                }],
            },
            // gobwas/glob: `*` matches any run of characters, `/` included.
            match_image_references: vec![Glob {
                glob: format!("{prefix}/*"),
            }],
            // The chart's images are pinned by tag (load checks their digests); rewriting them
            // to digests would make every helm upgrade see a drift.
            validation_configurations: ValidationConfigurations {
                mutate_digest: false,
                verify_digest: false,
                required: true,
            },
            attestors: vec![Attestor {
                name: ATTESTOR,
                cosign: Cosign {
                    key: KeyData {
                        data: key.to_string(),
                    },
                    ctlog: CtLog {
                        insecure_ignore_tlog: true,
                        insecure_ignore_sct: true,
                    },
                },
            }],
            // Every image the policy matched, in every category Kyverno extracts (containers,
            // initContainers, ephemeralContainers), must verify against the key.
            validations: vec![Validation {
                expression: format!(
                    "images.all(kind, images[kind].all(image, verifyImageSignatures(image, [attestors.{ATTESTOR}]) > 0))"
                ),
                message: format!(
                    "images under {prefix}/ must carry a cosign signature made with the site's key (koord-bundle load --sign-images)"
                ),
            }],
        },
    }
}

// ---- sigstore policy-controller: ClusterImagePolicy, policy.sigstore.dev/v1beta1 ----

#[derive(Serialize)]
struct CipSpec {
    mode: &'static str,
    images: Vec<Glob>,
    authorities: Vec<Authority>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Authority {
    name: &'static str,
    key: CipKey,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CipKey {
    data: String,
    hash_algorithm: &'static str,
}

fn policy_controller_policy(key: &str, prefix: &str, name: &str) -> Document<CipSpec> {
    Document {
        api_version: "policy.sigstore.dev/v1beta1",
        kind: "ClusterImagePolicy",
        metadata: metadata(name),
        spec: CipSpec {
            mode: "enforce",
            // The policy-controller's glob: `*` stops at `/`, `**` does not.
            images: vec![Glob {
                glob: format!("{prefix}/**"),
            }],
            // A key authority without `ctlog`: no Rekor client and no Rekor keys, so the
            // controller skips the transparency log; no certificate, so no SCT.
            authorities: vec![Authority {
                name: "site-key",
                key: CipKey {
                    data: key.to_string(),
                    hash_algorithm: "sha256",
                },
            }],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml_ng::Value;

    // A P-256 public key (SubjectPublicKeyInfo), as cosign generate-key-pair writes it.
    const PUB: &str = "-----BEGIN PUBLIC KEY-----\n\
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEWuZ0+zoiCOv1OhUlgDrBTOOy5WeP\n\
gM26ioZh+7H3DrJZtdA1J2P1aR1qW2FC+7g02ZD6hJV9/wGWU642omoAdQ==\n\
-----END PUBLIC KEY-----\n";

    fn parse(yaml: &str) -> Value {
        crate::yaml::parse_value("policy", yaml.as_bytes(), &crate::yaml::MANIFESTS).unwrap()
    }

    fn at<'a>(v: &'a Value, path: &[&str]) -> &'a Value {
        let mut v = v;
        for p in path {
            v = match p.parse::<usize>() {
                Ok(i) => &v[i],
                Err(_) => &v[*p],
            };
        }
        v
    }

    #[test]
    fn both_policies_carry_the_key_the_prefix_and_no_log() {
        let files = render(PUB, "registry.internal:5000/koordinator-sh", DEFAULT_NAME).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].file_name, "koordinator-signed-kyverno.yaml");
        assert_eq!(files[0].engine, Engine::Kyverno);
        assert_eq!(
            files[1].file_name,
            "koordinator-signed-policy-controller.yaml"
        );

        let k = parse(&files[0].yaml);
        assert_eq!(
            at(&k, &["apiVersion"]).as_str(),
            Some("policies.kyverno.io/v1")
        );
        assert_eq!(at(&k, &["kind"]).as_str(), Some("ImageValidatingPolicy"));
        assert_eq!(
            at(&k, &["metadata", "name"]).as_str(),
            Some("koordinator-signed")
        );
        assert_eq!(
            at(&k, &["spec", "matchImageReferences", "0", "glob"]).as_str(),
            Some("registry.internal:5000/koordinator-sh/*")
        );
        let cosign = at(&k, &["spec", "attestors", "0", "cosign"]);
        assert_eq!(at(cosign, &["key", "data"]).as_str(), Some(PUB));
        assert_eq!(
            at(cosign, &["ctlog", "insecureIgnoreTlog"]).as_bool(),
            Some(true)
        );
        assert_eq!(
            at(cosign, &["ctlog", "insecureIgnoreSCT"]).as_bool(),
            Some(true)
        );
        assert!(cosign.get("tuf").is_none());
        assert_eq!(
            at(&k, &["spec", "validationActions", "0"]).as_str(),
            Some("Deny")
        );
        assert_eq!(at(&k, &["spec", "failurePolicy"]).as_str(), Some("Fail"));
        assert!(at(&k, &["spec", "validations", "0", "expression"])
            .as_str()
            .unwrap()
            .contains("verifyImageSignatures(image, [attestors.site])"));

        let p = parse(&files[1].yaml);
        assert_eq!(
            at(&p, &["apiVersion"]).as_str(),
            Some("policy.sigstore.dev/v1beta1")
        );
        assert_eq!(at(&p, &["kind"]).as_str(), Some("ClusterImagePolicy"));
        assert_eq!(
            at(&p, &["spec", "images", "0", "glob"]).as_str(),
            Some("registry.internal:5000/koordinator-sh/**")
        );
        let auth = at(&p, &["spec", "authorities", "0"]);
        assert_eq!(at(auth, &["key", "data"]).as_str(), Some(PUB));
        // No ctlog: the controller skips the transparency log for a key authority.
        assert!(auth.get("ctlog").is_none());
        assert!(auth.get("keyless").is_none());
        assert_eq!(at(&p, &["spec", "mode"]).as_str(), Some("enforce"));
    }

    #[test]
    fn odd_but_valid_values_stay_strings_through_yaml() {
        // A name YAML reads as a number when plain, a prefix of digits, colons, underscores
        // and dots, a key with CRLF line ends and a comment line around it.
        let key = format!("# cosign.pub\r\n{}", PUB.replace('\n', "\r\n"));
        let files = render(&key, "10.0.0.5:5000/site__1/koord-x.y_z", "0123").unwrap();
        for f in &files {
            let v = parse(&f.yaml);
            assert_eq!(
                at(&v, &["metadata", "name"]).as_str(),
                Some("0123"),
                "{}",
                f.yaml
            );
            assert!(f.yaml.contains("name: '0123'"), "{}", f.yaml);
        }
        let k = parse(&files[0].yaml);
        assert_eq!(
            at(&k, &["spec", "matchImageReferences", "0", "glob"]).as_str(),
            Some("10.0.0.5:5000/site__1/koord-x.y_z/*")
        );
        assert_eq!(
            at(&k, &["spec", "attestors", "0", "cosign", "key", "data"]).as_str(),
            Some(PUB),
            "the key is re-encoded canonically"
        );
        let p = parse(&files[1].yaml);
        assert_eq!(
            at(&p, &["spec", "images", "0", "glob"]).as_str(),
            Some("10.0.0.5:5000/site__1/koord-x.y_z/**")
        );
    }

    #[test]
    fn bad_inputs_are_refused_naming_what_to_give() {
        let e = render("not a key", "r.example/x", "n").unwrap_err();
        assert!(e.to_string().contains("BEGIN PUBLIC KEY"), "{e}");
        let private = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n";
        let e = render(private, "r.example/x", "n").unwrap_err();
        assert!(e.to_string().contains("private key"), "{e}");
        let garbage = "-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n";
        assert!(render(garbage, "r.example/x", "n").is_err());
        let not_der = "-----BEGIN PUBLIC KEY-----\naGVsbG8gd29ybGQ=\n-----END PUBLIC KEY-----\n";
        let e = render(not_der, "r.example/x", "n").unwrap_err();
        assert!(e.to_string().contains("DER"), "{e}");
        let two = format!("{PUB}{PUB}");
        assert!(render(&two, "r.example/x", "n").is_err());

        let e = render(PUB, "registry.internal/Site", "n").unwrap_err();
        assert!(e.to_string().contains("lower case"), "{e}");
        let e = render(PUB, "[fd00::1]:5000/site", "n").unwrap_err();
        assert!(
            matches!(e, PolicyError::GlobCharacter { ch: '[', .. }),
            "{e}"
        );
        let e = render(PUB, "registry.internal/x", "Koord_Signed").unwrap_err();
        assert!(matches!(e, PolicyError::Name { .. }), "{e}");
        assert!(render(PUB, "registry.internal/x", "").is_err());
        // serde_yaml_ng writes `on` plain, which kubectl reads as `true`.
        for name in ["on", "off", "yes", "no", "y", "n"] {
            let e = render(PUB, "registry.internal/x", name).unwrap_err();
            assert!(matches!(e, PolicyError::YamlBoolean { .. }), "{name}: {e}");
        }
        assert!(render(PUB, "registry.internal/x", &"a".repeat(64)).is_err());
    }

    #[test]
    fn write_replaces_atomically_and_names_a_missing_dir() {
        let dir = tempfile::tempdir().unwrap();
        let files = render(PUB, "registry.internal/x", "p").unwrap();
        std::fs::write(dir.path().join("p-kyverno.yaml"), "old").unwrap();
        let paths = write(dir.path(), &files).unwrap();
        assert_eq!(paths.len(), 2);
        for (p, f) in paths.iter().zip(&files) {
            assert_eq!(std::fs::read_to_string(p).unwrap(), f.yaml);
        }
        // Nothing but the two files: no temporary file left behind.
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["p-kyverno.yaml", "p-policy-controller.yaml"]);

        let missing = dir.path().join("nope");
        let e = write(&missing, &files).unwrap_err();
        assert!(matches!(e, PolicyError::NoDirectory { .. }));
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
        let e = write(&paths[0], &files).unwrap_err();
        assert!(matches!(e, PolicyError::NotADirectory { .. }), "{e}");
        let mut evil = files[0].clone();
        evil.file_name = "../x.yaml".into();
        assert!(matches!(
            write(dir.path(), &[evil]).unwrap_err(),
            PolicyError::FileName { .. }
        ));
    }
}

//! The admission policies `koord_bundle::admission::policy` renders, judged by the engines
//! themselves (issue 46): images signed by the real cosign (v2.6.5, `--tlog-upload=false`)
//! in the test environment's registry, the policies rendered and written by the module, and
//! the engine's own CLI asked whether it admits each image:
//!
//! - the sigstore policy-controller: its policy tester (`cmd/tester` of
//!   github.com/sigstore/policy-controller v0.14.0, built from the Go module proxy by
//!   scripts/install-deps.sh) validates the `ClusterImagePolicy` as the controller's webhook
//!   does, then verifies the image as the controller does at admission.
//!
//! No transparency log, no internet: the signatures are made without a Rekor upload and the
//! engine is given nothing but the policy file and the registry.

use crate::common::*;
use koord_bundle::admission::policy;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const COSIGN: &str = "cosign-v2.6.5/cosign";
const POLICY_TESTER: &str = "policy-tester-v0.14.0/policy-tester";

/// A tool scripts/install-deps.sh builds into `$KB_TOOLS` (default `<repo>/.tools`). Missing,
/// the test fails saying how to get it: it never skips.
fn kb_tool(rel: &str) -> PathBuf {
    let tools = std::env::var_os("KB_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools"));
    let p = tools.join(rel);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/install-deps.sh (it builds it from the Go module proxy)",
        p.display()
    );
    p
}

/// A directory of the test's own: cosign's keys, its HOME (no login, no cache from outside),
/// the policy files.
struct Site {
    dir: tempfile::TempDir,
}

impl Site {
    fn new() -> Self {
        Site {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `PROGRAM ARGS` with this directory as HOME, time-limited.
    fn run(&self, program: &Path, args: &[&str]) -> Output {
        let mut c = Command::new(program);
        c.args(args)
            .current_dir(self.path())
            .env("HOME", self.path())
            .env("COSIGN_PASSWORD", "site-password")
            .env_remove("DOCKER_CONFIG")
            .env_remove("SIGSTORE_ROOT_FILE")
            .env_remove("TUF_ROOT");
        output_within(
            c,
            Duration::from_secs(180),
            &format!("{} {}", program.display(), args.join(" ")),
        )
    }

    /// A cosign key pair made by cosign itself, in `name/cosign.{key,pub}`; the public key.
    fn key_pair(&self, name: &str) -> String {
        let d = self.path().join(name);
        std::fs::create_dir(&d).unwrap();
        let o = self.run(
            &kb_tool(COSIGN),
            &[
                "generate-key-pair",
                "--output-key-prefix",
                d.join("cosign").to_str().unwrap(),
            ],
        );
        assert_ok(&o);
        std::fs::read_to_string(d.join("cosign.pub")).unwrap()
    }

    /// `cosign sign` the image at `reference`'s digest with key pair `name`, offline.
    fn sign(&self, name: &str, repository: &str, digest: &str) {
        let key = self.path().join(name).join("cosign.key");
        let o = self.run(
            &kb_tool(COSIGN),
            &[
                "sign",
                "--key",
                key.to_str().unwrap(),
                "--tlog-upload=false",
                "--yes",
                &format!("{repository}@{digest}"),
            ],
        );
        assert_ok(&o);
    }
}

/// Copy the environment's synthetic koord-manager 1.8.0 (every platform) to `dest` (a
/// `HOST/REPO:TAG` on the plain registry); its index digest.
fn copy_image(dest: &str) -> String {
    let e = env();
    let src = format!("docker://{}/koordinator-sh/koord-manager:v1.8.0", e.plain);
    let o = tool(
        "skopeo",
        &[
            "copy",
            "-q",
            "--all",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &src,
            &format!("docker://{dest}"),
        ],
        Path::new("/"),
    );
    assert_ok(&o);
    pushed_digest("koordinator-sh/koord-manager", "v1.8.0")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_policy_controller_admits_only_images_signed_with_the_site_key() {
    let site = Site::new();
    let site_key = site.key_pair("site");
    site.key_pair("other");

    // The load's target: a prefix of the plain registry; the images one level deeper, as the
    // chart names them (koordinator-sh/...), so the glob must reach across a `/`.
    let registry = &env().plain;
    let prefix = format!("{registry}/{}/site", unique_prefix("admission"));
    let signed = format!("{prefix}/koordinator-sh/koord-manager");
    let unsigned = format!("{prefix}/koordinator-sh/koordlet");
    let other = format!("{prefix}/koordinator-sh/koord-scheduler");
    // Beside the prefix, not under it: `site-x` must not be taken for `site`.
    let beside = format!("{prefix}-x/koordinator-sh/koord-manager");
    for repo in [&signed, &unsigned, &other, &beside] {
        let digest = copy_image(&format!("{repo}:v1.8.0"));
        if repo == &signed || repo == &beside {
            site.sign("site", repo, &digest);
        } else if repo == &other {
            site.sign("other", repo, &digest);
        }
    }

    let files = policy::render(&site_key, &prefix, "koordinator-signed").unwrap();
    let written = policy::write(site.path(), &files).unwrap();
    let cip = written
        .iter()
        .zip(&files)
        .find(|(_, f)| f.engine == policy::Engine::PolicyController)
        .map(|(p, _)| p.clone())
        .unwrap();

    let tester = kb_tool(POLICY_TESTER);
    let judge = |image: &str| {
        site.run(
            &tester,
            &["-policy", cip.to_str().unwrap(), "-image", image],
        )
    };

    // Signed with the site's key, by tag (the tester resolves it to the digest, as the
    // controller does): admitted.
    let o = judge(&format!("{signed}:v1.8.0"));
    let said = text(&o);
    assert!(
        o.status.success() && said.contains("Verification was successful"),
        "the policy-controller refused the image signed with the site's key:\n{said}"
    );
    assert!(said.contains("Policy was successfully validated"), "{said}");

    // No signature: refused.
    let o = judge(&format!("{unsigned}:v1.8.0"));
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("no signatures found"),
        "an unsigned image under the prefix was not refused for its missing signature:\n{said}"
    );

    // Signed, but by another key: refused.
    let o = judge(&format!("{other}:v1.8.0"));
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("no matching signatures"),
        "an image signed by another key was not refused for it:\n{said}"
    );

    // Beside the prefix: not this policy's image (the glob stops at the prefix).
    let o = judge(&format!("{beside}:v1.8.0"));
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("uncovered by policy"),
        "an image beside the prefix was taken for one under it:\n{said}"
    );
}

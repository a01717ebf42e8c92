//! The admission policies `koord_bundle::admission::policy` renders, judged by the engines
//! themselves (issue 46): images signed by the real cosign (v2.6.5, `--tlog-upload=false`)
//! in the test environment's registry, the policies rendered and written by the module, and
//! the engine's own CLI asked whether it admits each image:
//!
//! - Kyverno: `kubectl-kyverno apply` (v1.19.1, the current release, built from the Go module
//!   proxy by scripts/install-deps.sh) evaluates the `ImageValidatingPolicy` against a Pod or a
//!   Deployment as the admission controller does, reading the signatures from the registry;
//! - the sigstore policy-controller: its policy tester (`cmd/tester` of
//!   github.com/sigstore/policy-controller v0.14.0, built the same way) validates the
//!   `ClusterImagePolicy` as the controller's webhook does, then verifies the image as the
//!   controller does at admission.
//!
//! And the files as a site applies them: `kubectl apply --dry-run=server` on the real API server
//! of the test environment, under the engines' CRDs (from the same modules, kept by
//! scripts/install-deps.sh with their provenance): kubectl's YAML 1.1 reader, the CRDs' schemas,
//! their CEL rules and strict field validation take both files, and refuse a broken one.
//!
//! No transparency log, no internet: the signatures are made without a Rekor upload and the
//! engine is given nothing but the policy file and the registry.

use crate::cluster;
use crate::common::*;
use koord_bundle::admission::policy;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const POLICY_TESTER: &str = "policy-tester-v0.14.0/policy-tester";
const KYVERNO: &str = "kyverno-v1.19.1/kubectl-kyverno";

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
            &cosign_bin(),
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
            &cosign_bin(),
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
    skopeo_copy_plain(&src, &format!("docker://{dest}"));
    pushed_digest("koordinator-sh/koord-manager", "v1.8.0")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A load's target and its images, signed or not: the site's key pair and another, both made
/// by cosign; copies of a synthetic image under a fresh prefix of the plain registry, one level
/// deeper as the chart names them (`koordinator-sh/...`, so a glob must reach across a `/`);
/// the policies rendered and written by the module.
struct Scene {
    site: Site,
    /// Signed with the site's key.
    signed: String,
    /// Not signed.
    unsigned: String,
    /// Signed with another key.
    other: String,
    /// Beside the prefix (`PREFIX-x`), signed with the site's key: not under the prefix.
    beside: String,
    /// The written policy files and their engines.
    policies: Vec<(PathBuf, policy::Engine)>,
}

impl Scene {
    fn new() -> Self {
        let site = Site::new();
        let site_key = site.key_pair("site");
        site.key_pair("other");
        let registry = &env().plain;
        let prefix = format!("{registry}/{}/site", unique_prefix("admission"));
        let image = |at: &str, repo: &str| format!("{at}/koordinator-sh/{repo}:v1.8.0");
        let scene_images = [
            (image(&prefix, "koord-manager"), Some("site")),
            (image(&prefix, "koordlet"), None),
            (image(&prefix, "koord-scheduler"), Some("other")),
            (image(&format!("{prefix}-x"), "koord-manager"), Some("site")),
        ];
        for (reference, key) in &scene_images {
            let digest = copy_image(reference);
            if let Some(key) = key {
                let repository = reference.rsplit_once(':').unwrap().0;
                site.sign(key, repository, &digest);
            }
        }
        let files = policy::render(&site_key, &prefix, policy::DEFAULT_NAME).unwrap();
        let written = policy::write(site.path(), &files).unwrap();
        let policies = written
            .into_iter()
            .zip(files.iter().map(|f| f.engine))
            .collect();
        let [signed, unsigned, other, beside] = scene_images.map(|(r, _)| r);
        Scene {
            site,
            signed,
            unsigned,
            other,
            beside,
            policies,
        }
    }

    fn policy(&self, engine: policy::Engine) -> &Path {
        &self.policies.iter().find(|(_, e)| *e == engine).unwrap().0
    }
}

#[test]
fn the_policy_controller_admits_only_images_signed_with_the_site_key() {
    let scene = Scene::new();
    let (site, cip) = (&scene.site, scene.policy(policy::Engine::PolicyController));
    let (signed, unsigned, other, beside) =
        (&scene.signed, &scene.unsigned, &scene.other, &scene.beside);

    let tester = kb_tool(POLICY_TESTER);
    let judge = |image: &str| {
        site.run(
            &tester,
            &["-policy", cip.to_str().unwrap(), "-image", image],
        )
    };

    // Signed with the site's key, by tag (the tester resolves it to the digest, as the
    // controller does): admitted.
    let o = judge(signed);
    let said = text(&o);
    assert!(
        o.status.success() && said.contains("Verification was successful"),
        "the policy-controller refused the image signed with the site's key:\n{said}"
    );
    assert!(said.contains("Policy was successfully validated"), "{said}");

    // No signature: refused.
    let o = judge(unsigned);
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("no signatures found"),
        "an unsigned image under the prefix was not refused for its missing signature:\n{said}"
    );

    // Signed, but by another key: refused.
    let o = judge(other);
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("no matching signatures"),
        "an image signed by another key was not refused for it:\n{said}"
    );

    // Beside the prefix: not this policy's image (the glob stops at the prefix).
    let o = judge(beside);
    let said = text(&o);
    assert!(
        !o.status.success() && said.contains("uncovered by policy"),
        "an image beside the prefix was taken for one under it:\n{said}"
    );
}

/// A Pod (or, with `deployment`, a Deployment) named `name` running `images` (`(init, image)`).
fn workload(name: &str, images: &[(bool, &str)], deployment: bool) -> String {
    let containers = |init: bool| -> Vec<serde_json::Value> {
        images
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| *i == init)
            .map(|(n, (_, image))| serde_json::json!({"name": format!("c{n}"), "image": image}))
            .collect()
    };
    let spec =
        serde_json::json!({"containers": containers(false), "initContainers": containers(true)});
    let doc = if deployment {
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "koordinator-system"},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
            },
        })
    } else {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "koordinator-system"},
            "spec": spec,
        })
    };
    doc.to_string()
}

#[test]
fn kyverno_admits_only_images_signed_with_the_site_key() {
    let scene = Scene::new();
    let (site, ivpol) = (&scene.site, scene.policy(policy::Engine::Kyverno));
    let kyverno = kb_tool(KYVERNO);
    // `kubectl-kyverno apply POLICY --resource FILE`: exit 0 and `pass: 1` when the policy
    // admits the object, exit 1 and `fail: 1` with the policy's message when it refuses it.
    let judge = |name: &str, images: &[(bool, &str)], deployment: bool| {
        let file = site.path().join(format!("{name}.json"));
        std::fs::write(&file, workload(name, images, deployment)).unwrap();
        site.run(
            &kyverno,
            &[
                "apply",
                ivpol.to_str().unwrap(),
                "--resource",
                file.to_str().unwrap(),
                "--remove-color",
            ],
        )
    };
    let admitted = |what: &str, o: &Output| {
        let said = text(o);
        assert!(
            o.status.success() && said.contains("pass: 1, fail: 0, warn: 0, error: 0"),
            "Kyverno did not admit {what}:\n{said}"
        );
    };
    let refused = |what: &str, o: &Output| {
        let said = text(o);
        assert!(
            o.status.code() == Some(1)
                && said.contains("pass: 0, fail: 1, warn: 0, error: 0")
                && said.contains("must carry a cosign signature made with the site's key"),
            "Kyverno did not refuse {what} for its signature:\n{said}"
        );
    };

    admitted(
        "a pod whose image is signed with the site's key",
        &judge("signed", &[(false, &scene.signed)], false),
    );
    refused(
        "a pod whose image is unsigned",
        &judge("unsigned", &[(false, &scene.unsigned)], false),
    );
    refused(
        "a pod whose image is signed by another key",
        &judge("other", &[(false, &scene.other)], false),
    );
    // Every image of the pod counts, init containers too.
    refused(
        "a pod with a signed container and an unsigned init container",
        &judge(
            "init",
            &[(false, &scene.signed), (true, &scene.unsigned)],
            false,
        ),
    );
    // Autogen: the Deployment itself is refused, before any pod of it exists.
    refused(
        "a Deployment whose image is unsigned",
        &judge("deployment", &[(false, &scene.unsigned)], true),
    );
    admitted(
        "a Deployment whose image is signed with the site's key",
        &judge("deployment-signed", &[(false, &scene.signed)], true),
    );
    // Beside the prefix: not this policy's image, admitted whatever its signature.
    admitted(
        "a pod whose image is beside the prefix",
        &judge("beside", &[(false, &scene.beside)], false),
    );
}

/// A CRD scripts/install-deps.sh kept beside an engine's CLI (`ROOT/crds/`), and its
/// provenance (module@version, path, sha256), checked against the file.
fn engine_crd(tool: &str, file: &str) -> (PathBuf, String) {
    let root = kb_tool(tool).parent().unwrap().join("crds");
    let crd = root.join(file);
    let provenance = std::fs::read_to_string(root.join("PROVENANCE")).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/install-deps.sh (it keeps the engine's CRD)",
            root.display()
        )
    });
    let bytes = std::fs::read(&crd).unwrap();
    assert!(
        provenance.contains(&format!("sha256 {}", &sha256(&bytes)["sha256:".len()..])),
        "{} is not the file its PROVENANCE names:\n{provenance}",
        crd.display()
    );
    (crd, provenance)
}

#[test]
fn the_api_server_takes_the_policies_under_the_engines_crds() {
    let kube = cluster::lease();
    let dir = tempfile::tempdir().unwrap();

    // The engines' CRDs, as their releases ship them. The policy-controller's converts its
    // versions with its own webhook, which does not run here: the conversion is set to None
    // (the v1beta1 schema the objects are validated against is unchanged).
    let (kyverno_crd, _) = engine_crd(KYVERNO, "policies.kyverno.io_imagevalidatingpolicies.yaml");
    let (cip_crd, _) = engine_crd(POLICY_TESTER, "300-clusterimagepolicy.yaml");
    let mut cip: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&cip_crd).unwrap()).unwrap();
    cip["spec"]["conversion"] = serde_yaml_ng::from_str("strategy: None").unwrap();
    let cip_crd = dir.path().join("cip-crd.json");
    std::fs::write(&cip_crd, serde_json::to_string(&cip).unwrap()).unwrap();
    for crd in [&kyverno_crd, &cip_crd] {
        // Server-side: the Kyverno CRD (434 KiB) is too large for the annotation a
        // client-side apply keeps.
        kube.kubectl(&["apply", "--server-side", "-f", crd.to_str().unwrap()]);
    }
    kube.wait_established(&[
        "imagevalidatingpolicies.policies.kyverno.io",
        "clusterimagepolicies.policy.sigstore.dev",
    ]);

    // Values YAML would misread if they were not quoted: a name of digits, a prefix of digits,
    // colons, underscores and dots; a PEM.
    let site = Site::new();
    let key = site.key_pair("site");
    let files = policy::render(&key, "10.0.0.5:5000/site__1/koord-x.y_z", "0123").unwrap();
    let written = policy::write(dir.path(), &files).unwrap();
    let dry_run = |file: &Path| {
        kube.kubectl_output(
            &[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-o",
                "json",
                "-f",
                file.to_str().unwrap(),
            ],
            None,
        )
    };
    for (file, f) in written.iter().zip(&files) {
        let o = dry_run(file);
        assert_ok(&o);
        // What the API server made of the file: the values as rendered.
        let back: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(back["metadata"]["name"], "0123", "{}", f.yaml);
        let (glob, key_data) = match f.engine {
            policy::Engine::Kyverno => (
                &back["spec"]["matchImageReferences"][0]["glob"],
                &back["spec"]["attestors"][0]["cosign"]["key"]["data"],
            ),
            policy::Engine::PolicyController => (
                &back["spec"]["images"][0]["glob"],
                &back["spec"]["authorities"][0]["key"]["data"],
            ),
        };
        assert!(
            glob.as_str()
                .is_some_and(|g| g.starts_with("10.0.0.5:5000/site__1/koord-x.y_z/*")),
            "{back}"
        );
        assert_eq!(key_data.as_str(), Some(key.as_str()), "{back}");
    }

    // The check can fail: a field the schema does not know (strict field validation), a
    // required field missing, a value of the wrong type.
    let broken = |file: &Path, change: &dyn Fn(&mut serde_yaml_ng::Value), name: &str| {
        let mut v: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        change(&mut v);
        let path = dir.path().join(name);
        std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
        let o = dry_run(&path);
        assert!(
            !o.status.success(),
            "the API server took the broken policy {name}:\n{}",
            text(&o)
        );
        text(&o)
    };
    let kyverno_file = &written[0];
    let cip_file = &written[1];
    let said = broken(
        kyverno_file,
        &|v| {
            let spec = v["spec"].as_mapping_mut().unwrap();
            let c = spec.remove("validationConfigurations").unwrap();
            spec.insert("validationConfiguration".into(), c);
        },
        "typo.json",
    );
    assert!(
        said.contains(r#"unknown field "spec.validationConfiguration""#),
        "{said}"
    );
    let said = broken(
        kyverno_file,
        &|v| {
            v["spec"].as_mapping_mut().unwrap().remove("validations");
        },
        "no-validations.json",
    );
    assert!(said.contains("spec.validations: Required value"), "{said}");
    let said = broken(
        cip_file,
        &|v| {
            v["spec"]["authorities"][0]["key"] = "not a key object".into();
        },
        "key-string.json",
    );
    assert!(
        said.contains("spec.authorities[0].key in body must be of type object"),
        "{said}"
    );
}

/// The whole chain of issue 46 on the real tools: `load --sign-images` signs what it pushed and
/// writes the two policies into `--policy-dir`; each engine's own CLI, given the file load
/// wrote, admits every image load pushed (by the tag@digest load pins the pods to) and refuses an image
/// under the same prefix that load did not sign.
#[test]
fn the_policies_load_writes_admit_what_load_signed_and_refuse_the_rest() {
    let b = Built::new();
    let site = Site::new();
    site.key_pair("site");
    let key = site.path().join("site").join("cosign.key");
    let dir = site.path().join("policies");
    std::fs::create_dir(&dir).unwrap();
    let prefix = format!("{}/{}", env().plain, unique_prefix("e2e"));
    let mut c = b.home.load_cmd(
        &b.bundle,
        &prefix,
        &[
            "--no-install",
            "--json",
            "--plain-http",
            "--sign-images",
            key.to_str().unwrap(),
            "--policy-dir",
            dir.to_str().unwrap(),
        ],
    );
    c.env("COSIGN_PASSWORD", "site-password");
    let o = c.output().unwrap();
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let written: Vec<PathBuf> = r["policies"]
        .as_array()
        .expect("load --json names the policies it wrote")
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect();
    let expected = [
        dir.join(format!("{}-kyverno.yaml", policy::DEFAULT_NAME)),
        dir.join(format!("{}-policy-controller.yaml", policy::DEFAULT_NAME)),
    ];
    assert_eq!(written, expected);
    for f in &written {
        println!(
            "--- {} (as load wrote it)\n{}",
            f.display(),
            std::fs::read_to_string(f).unwrap()
        );
    }

    // What load pushed and signed, as the pods name them (tag@digest, pinned by load).
    let pushed: Vec<String> = r["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["pushedAs"].as_str().unwrap().to_string())
        .collect();
    assert!(!pushed.is_empty(), "{r}");
    // Under the same prefix, not signed by load.
    let unsigned = format!("{prefix}/koordinator-sh/not-from-the-bundle:v1");
    copy_image(&unsigned);

    let tester = kb_tool(POLICY_TESTER);
    let cip = expected[1].to_str().unwrap();
    for image in &pushed {
        let o = site.run(&tester, &["-policy", cip, "-image", image]);
        println!("policy-tester -image {image}:\n{}", text(&o));
        assert!(
            o.status.success() && text(&o).contains("Verification was successful"),
            "the policy-controller refused {image}, which load signed, under the policy load wrote:\n{}",
            text(&o)
        );
    }
    let o = site.run(&tester, &["-policy", cip, "-image", &unsigned]);
    println!("policy-tester -image {unsigned}:\n{}", text(&o));
    assert!(
        !o.status.success() && text(&o).contains("no signatures found"),
        "the policy-controller admitted an unsigned image under the prefix:\n{}",
        text(&o)
    );

    let kyverno = kb_tool(KYVERNO);
    let ivpol = expected[0].to_str().unwrap();
    let judge = |name: &str, images: &[(bool, &str)]| {
        let file = site.path().join(format!("{name}.json"));
        std::fs::write(&file, workload(name, images, true)).unwrap();
        site.run(
            &kyverno,
            &[
                "apply",
                ivpol,
                "--resource",
                file.to_str().unwrap(),
                "--remove-color",
            ],
        )
    };
    let all: Vec<(bool, &str)> = pushed.iter().map(|i| (false, i.as_str())).collect();
    let o = judge("koordinator", &all);
    println!(
        "kubectl-kyverno apply (a Deployment of every image load signed):\n{}",
        text(&o)
    );
    assert!(
        o.status.success() && text(&o).contains("pass: 1, fail: 0, warn: 0, error: 0"),
        "Kyverno refused a Deployment of every image load signed, under the policy load wrote:\n{}",
        text(&o)
    );
    let o = judge("stranger", &[(false, &unsigned)]);
    println!(
        "kubectl-kyverno apply (a Deployment of {unsigned}):\n{}",
        text(&o)
    );
    assert!(
        o.status.code() == Some(1) && text(&o).contains("pass: 0, fail: 1"),
        "Kyverno admitted an unsigned image under the prefix:\n{}",
        text(&o)
    );
}

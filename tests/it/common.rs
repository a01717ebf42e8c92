//! Shared test support: the test environment (started by scripts/test.sh), the real binary,
//! temporary homes with keys.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

#[allow(dead_code)] // helm3/helm4 serve the helm tests
/// The environment written by `scripts/test-env.sh start` (`KB_ENV_JSON`).
pub struct Env {
    pub plain: String,
    pub tls: String,
    pub ca_file: PathBuf,
    pub username: String,
    pub password: String,
    pub helm_repo: String,
    pub helm3: PathBuf,
    pub helm4: PathBuf,
    pub images: Vec<Value>,
}

pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let path = std::env::var("KB_ENV_JSON").unwrap_or_else(|_| {
            format!("{}/target/test-env/env.json", env!("CARGO_MANIFEST_DIR"))
        });
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("cannot read the test environment {path} ({e}): run the tests with scripts/test.sh, or start it with scripts/test-env.sh start")
        });
        let v: Value = serde_json::from_str(&text).expect("env.json is JSON");
        let s = |k: &str| v[k].as_str().unwrap_or_else(|| panic!("env.json lacks {k}")).to_string();
        let images: Value = serde_json::from_str(&std::fs::read_to_string(s("images_json")).expect("images.json")).expect("images.json is JSON");
        Env {
            plain: s("plain_registry"),
            tls: s("tls_registry"),
            ca_file: s("ca_file").into(),
            username: s("username"),
            password: s("password"),
            helm_repo: s("helm_repo"),
            helm3: s("helm3").into(),
            helm4: s("helm4").into(),
            images: images.as_array().cloned().unwrap_or_default(),
        }
    })
}

/// Index digest of a synthetic image as pushed by the environment.
pub fn pushed_digest(repository: &str, tag: &str) -> String {
    env()
        .images
        .iter()
        .find(|i| i["repository"] == repository && i["tag"] == tag)
        .and_then(|i| i["index_digest"].as_str())
        .unwrap_or_else(|| panic!("{repository}:{tag} not in images.json"))
        .to_string()
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts")
}

/// A temporary home: config dir (keys), cache dir, work dir.
pub struct Home {
    pub dir: tempfile::TempDir,
}

impl Home {
    pub fn new() -> Self {
        Home {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    /// A home with an unencrypted default key pair.
    pub fn with_key() -> Self {
        let h = Home::new();
        let out = h.run(&["keygen", "--unencrypted"]);
        assert_ok(&out);
        h
    }
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn config(&self) -> PathBuf {
        self.path().join("config")
    }
    pub fn pubkey(&self) -> PathBuf {
        self.config().join("koord-bundle.pub")
    }
    pub fn cache(&self) -> PathBuf {
        self.path().join("cache")
    }
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_koord-bundle"));
        c.args(args)
            .current_dir(self.path())
            .env("KOORD_BUNDLE_CONFIG_DIR", self.config())
            .env("KOORD_BUNDLE_CACHE_DIR", self.cache())
            .env("HOME", self.path())
            .env_remove("DOCKER_CONFIG")
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("SOURCE_DATE_EPOCH");
        c
    }
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run koord-bundle")
    }
    /// Write a docker config.json with a login for the TLS registry.
    pub fn login_tls(&self) -> PathBuf {
        use base64::Engine as _;
        let e = env();
        let auth = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", e.username, e.password));
        let p = self.path().join("auth.json");
        std::fs::write(
            &p,
            format!(r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#, e.tls),
        )
        .unwrap();
        p
    }
    /// Build the 1.8.0 bundle from the plain registry; returns (path, build JSON).
    pub fn build_plain(&self, version: &str, extra: &[&str]) -> (PathBuf, Value) {
        let e = env();
        let out = self.path().join(format!("koordinator-{version}.tar"));
        let mut args = vec![
            "build",
            version,
            "--repo",
            &e.helm_repo,
            "--source",
            &e.plain,
            "--plain-http",
            "--json",
            "-o",
        ];
        let out_s = out.to_string_lossy().to_string();
        args.push(&out_s);
        args.extend_from_slice(extra);
        let o = self.run(&args);
        assert_ok(&o);
        (
            out,
            serde_json::from_slice(&o.stdout).expect("build --json prints JSON"),
        )
    }
}

pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "command failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

pub fn assert_fails(o: &Output, code: i32, needles: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(
        o.status.code(),
        Some(code),
        "expected exit {code}\nstdout:\n{}\nstderr:\n{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
    err
}

/// Run a peer tool; returns its output.
pub fn tool(cmd: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e} (scripts/install-deps.sh installs it)"))
}

/// Names of the entries of a tar, in order.
pub fn tar_entries(path: &Path) -> Vec<String> {
    let mut ar = tar::Archive::new(std::fs::File::open(path).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().to_string())
        .collect()
}

/// (ref, digest) of every image of a build/inspect JSON document.
pub fn image_digests(v: &serde_json::Value) -> Vec<(String, String)> {
    v["images"]
        .as_array()
        .expect("an images array")
        .iter()
        .map(|i| {
            (
                i["ref"].as_str().unwrap_or_default().to_string(),
                i["digest"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

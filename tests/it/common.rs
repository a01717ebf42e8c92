//! Shared test support, by purpose: the test environment (started by scripts/test.sh), homes
//! and the real binary, running commands, waiting, bundle files, digests read back with
//! skopeo, registries over HTTP with curl.

use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// --- The test environment

/// The environment written by `scripts/test-env.sh start` (`KB_ENV_JSON`).
pub struct Env {
    /// `HOST:PORT` of the plain-HTTP registry.
    pub plain: String,
    /// `HOST:PORT` of the TLS registry with basic auth.
    pub tls: String,
    /// The CA certificate of the TLS registry.
    pub ca_file: PathBuf,
    /// The TLS registry's user.
    pub username: String,
    /// The TLS registry's user's password.
    pub password: String,
    /// The Helm chart repository (`http://HOST:PORT/`), every Koordinator chart version.
    pub helm_repo: String,
    /// helm 3.
    pub helm3: PathBuf,
    /// helm 4.
    pub helm4: PathBuf,
    /// images.json: every synthetic image pushed to the registries (repository, tag,
    /// index_digest...).
    pub images: Vec<Value>,
}

/// env.json as it is, read once (panics saying how to start the environment when it is not
/// there).
pub fn env_json() -> &'static Value {
    static JSON: OnceLock<Value> = OnceLock::new();
    JSON.get_or_init(|| {
        let path = std::env::var("KB_ENV_JSON").unwrap_or_else(|_| {
            format!("{}/target/test-env/env.json", env!("CARGO_MANIFEST_DIR"))
        });
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("cannot read the test environment {path} ({e}): run the tests with scripts/test.sh, or start it with scripts/test-env.sh start")
        });
        serde_json::from_str(&text).expect("env.json is JSON")
    })
}

/// The environment, read once (panics saying how to start it when it is not there).
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let v = env_json();
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("env.json lacks {k}"))
                .to_string()
        };
        let images: Value =
            serde_json::from_str(&std::fs::read_to_string(s("images_json")).expect("images.json"))
                .expect("images.json is JSON");
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

/// `HOST:PORT` of the plain-HTTP registry that serves the OCI 1.1 referrers API
/// (go-containerregistry's, env.json's `referrers_registry`; empty at start). An environment
/// started before it existed lacks it: the test fails saying to restart it.
pub fn referrers_registry() -> String {
    env_json()["referrers_registry"]
        .as_str()
        .unwrap_or_else(|| panic!("env.json lacks referrers_registry: restart the environment (scripts/test-env.sh start, after scripts/install-deps.sh)"))
        .to_string()
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

/// The five components chart 1.8.0 deploys (their image names), sorted.
pub const COMPONENTS_180: [&str; 5] = [
    "koord-descheduler",
    "koord-device-daemon",
    "koord-manager",
    "koord-scheduler",
    "koordlet",
];

/// The chart archives of `tests/fixtures/charts`.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/charts")
}

// --- Homes and the real binary

/// A temporary home: config dir (keys), cache dir, work dir, and the temporary directory of
/// the commands run in it (`TMPDIR`), all removed when the home is dropped (at the end of the
/// test, also when it fails).
pub struct Home {
    /// The home's directory.
    pub dir: tempfile::TempDir,
}

impl Home {
    /// An empty home (no key).
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("tmp")).expect("the home's tmp directory");
        Home { dir }
    }
    /// A home with an unencrypted default key pair.
    pub fn with_key() -> Self {
        let h = Home::new();
        let out = h.run(&["keygen", "--unencrypted"]);
        assert_ok(&out);
        h
    }
    /// The home's directory (the working directory of its commands).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    /// Its configuration directory (`KOORD_BUNDLE_CONFIG_DIR`: the keys).
    pub fn config(&self) -> PathBuf {
        self.path().join("config")
    }
    /// The default public key of [`Home::with_key`].
    pub fn pubkey(&self) -> PathBuf {
        self.config().join("koord-bundle.pub")
    }
    /// Its blob cache (`KOORD_BUNDLE_CACHE_DIR`).
    pub fn cache(&self) -> PathBuf {
        self.path().join("cache")
    }
    /// `koord-bundle ARGS` in this home, not run yet: its directories, `HOME` and `TMPDIR`
    /// are the home's; no registry login or `SOURCE_DATE_EPOCH` comes from outside.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_koord-bundle"));
        c.args(args)
            .current_dir(self.path())
            .env("KOORD_BUNDLE_CONFIG_DIR", self.config())
            .env("KOORD_BUNDLE_CACHE_DIR", self.cache())
            .env("HOME", self.path())
            // What the binary keeps in the temporary directory (`load --dry-run` keeps its
            // values file there) goes with the home.
            .env("TMPDIR", self.path().join("tmp"))
            .env_remove("DOCKER_CONFIG")
            .env_remove("REGISTRY_AUTH_FILE")
            .env_remove("SOURCE_DATE_EPOCH");
        // helm's own release store and cluster settings, which load refuses while set: the
        // binary's own list.
        use koord_bundle::cmd::env::{HELM_CLUSTER, HELM_DRIVER};
        for v in std::iter::once(HELM_DRIVER).chain(HELM_CLUSTER) {
            c.env_remove(v);
        }
        c
    }
    /// Run `koord-bundle ARGS` in this home; its output.
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
    /// `build VERSION --repo <chart repo> --source <plain registry> --plain-http --helm <helm 3>`
    /// in this home: the argument list most tests start from (see [`Build`]).
    pub fn build(&self, version: &str) -> Build<'_> {
        let e = env();
        Build {
            home: self,
            version: Some(version.to_string()),
            repo: Some(e.helm_repo.clone()),
            sources: vec![e.plain.clone()],
            plain_http: true,
            out: None,
            helm: Some(e.helm3.clone()),
            extra: Vec::new(),
        }
    }
    /// `build --repo <chart repo> --source <plain registry> --plain-http --helm <helm 3>`: no
    /// VERSION, the newest chart of the repository.
    pub fn build_latest(&self) -> Build<'_> {
        Build {
            version: None,
            ..self.build("")
        }
    }
    /// Build a signed bundle of `version` from the plain registry into
    /// `koordinator-VERSION.tar` of the home (`extra` added); returns (path, build JSON).
    pub fn build_plain(&self, version: &str, extra: &[&str]) -> (PathBuf, Value) {
        let out = self.path().join(format!("koordinator-{version}.tar"));
        let o = self
            .build(version)
            .arg("--json")
            .out(&out)
            .args(extra)
            .run();
        assert_ok(&o);
        (
            out,
            serde_json::from_slice(&o.stdout).expect("build --json prints JSON"),
        )
    }
    /// `load BUNDLE --registry REGISTRY --key <this home's public key>` plus `extra`, not run
    /// yet (the caller adds stdin, environment, or spawns it).
    pub fn load_cmd(&self, bundle: &Path, registry: &str, extra: &[&str]) -> Command {
        let key = self.pubkey();
        let mut c = self.cmd(&[
            "load",
            bundle.to_str().unwrap(),
            "--registry",
            registry,
            "--key",
            key.to_str().unwrap(),
        ]);
        c.args(extra);
        c
    }
}

/// A `build` command line of a [`Home`]: `build VERSION --repo R --source S --plain-http
/// [-o OUT] --helm HELM EXTRA...`, by default from the test environment's chart repository and plain
/// registry. A test changes the part it is about ([`Build::repo`], [`Build::source`],
/// [`Build::https`], [`Build::chart`], [`Build::out`]), adds the rest
/// ([`Build::arg`], [`Build::args`]) and runs it ([`Build::run`], or [`Build::cmd`] to set
/// environment variables first).
#[derive(Clone)]
pub struct Build<'h> {
    home: &'h Home,
    version: Option<String>,
    repo: Option<String>,
    sources: Vec<String>,
    plain_http: bool,
    out: Option<PathBuf>,
    /// `--helm HELM` (build needs helm; the test environment's helm 3 unless a test changes
    /// it with [`Build::helm`]).
    helm: Option<PathBuf>,
    extra: Vec<String>,
}

#[allow(dead_code)] // not every method is used by every test module
impl Build<'_> {
    /// `--repo REPO` instead of the environment's chart repository (a URL or a directory).
    pub fn repo(mut self, repo: &str) -> Self {
        self.repo = Some(repo.to_string());
        self
    }
    /// `--chart ARCHIVE` instead of VERSION and `--repo`.
    pub fn chart(mut self, chart: &Path) -> Self {
        self.version = None;
        self.repo = None;
        self.extra
            .extend(["--chart".to_string(), chart.to_string_lossy().to_string()]);
        self
    }
    /// `--source SOURCE` instead of the plain registry.
    pub fn source(self, source: &str) -> Self {
        self.sources(&[source])
    }
    /// One `--source` for each of `sources`, in order, instead of the plain registry.
    pub fn sources(mut self, sources: &[&str]) -> Self {
        self.sources = sources.iter().map(|s| s.to_string()).collect();
        self
    }
    /// Without `--plain-http` (a TLS source, or a test of the flag's absence).
    pub fn https(mut self) -> Self {
        self.plain_http = false;
        self
    }
    /// `-o OUT`.
    pub fn out(mut self, out: &Path) -> Self {
        self.out = Some(out.to_path_buf());
        self
    }
    /// `--helm HELM` with this helm instead of the environment's helm 3; `None`: no `--helm`
    /// (helm is then looked for on PATH).
    pub fn helm(mut self, helm: Option<&Path>) -> Self {
        self.helm = helm.map(Path::to_path_buf);
        self
    }
    /// One more argument.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra.push(arg.to_string());
        self
    }
    /// More arguments.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.extra.extend(args.iter().map(|a| a.to_string()));
        self
    }
    /// The argument list (without the program).
    pub fn to_vec(&self) -> Vec<String> {
        let mut v = vec!["build".to_string()];
        v.extend(self.version.clone());
        if let Some(repo) = &self.repo {
            v.extend(["--repo".to_string(), repo.clone()]);
        }
        for s in &self.sources {
            v.extend(["--source".to_string(), s.clone()]);
        }
        if self.plain_http {
            v.push("--plain-http".to_string());
        }
        if let Some(out) = &self.out {
            v.extend(["-o".to_string(), out.to_string_lossy().to_string()]);
        }
        if let Some(helm) = &self.helm {
            v.extend(["--helm".to_string(), helm.to_string_lossy().to_string()]);
        }
        v.extend(self.extra.iter().cloned());
        v
    }
    /// The command line for `sh -c`: the binary and the arguments, each single-quoted. Run it
    /// with the home's variables (see [`Home::cmd`]) where they matter.
    pub fn shell_line(&self) -> String {
        let quote = |a: &str| format!("'{}'", a.replace('\'', r"'\''"));
        std::iter::once(env!("CARGO_BIN_EXE_koord-bundle"))
            .chain(self.to_vec().iter().map(String::as_str))
            .map(quote)
            .collect::<Vec<_>>()
            .join(" ")
    }
    /// The command, in the home (see [`Home::cmd`]).
    pub fn cmd(&self) -> Command {
        let v = self.to_vec();
        let args: Vec<&str> = v.iter().map(String::as_str).collect();
        self.home.cmd(&args)
    }
    /// Run it; its output.
    pub fn run(&self) -> Output {
        self.cmd().output().expect("run koord-bundle")
    }
}

/// A signed 1.8.0 bundle in a home of its own, for one test: built where the test starts (it
/// takes well under a second) and removed with the home when the test ends, also when it fails.
/// (A bundle shared through a static was never removed: statics are not dropped. nextest runs
/// each test in a process of its own, so a static shared nothing there either.)
pub struct Built {
    /// The home, with the key that signed the bundle.
    pub home: Home,
    /// `koordinator-1.8.0.tar` in the home.
    pub bundle: PathBuf,
}

impl Built {
    /// Build it.
    pub fn new() -> Self {
        let home = Home::with_key();
        let (bundle, _) = home.build_plain("1.8.0", &[]);
        Built { home, bundle }
    }
}

/// `NAME-PID-NANOS`: a repository prefix (or directory name) no other test run uses.
pub fn unique_prefix(name: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{}", std::process::id(), n % 1_000_000_000)
}

// --- Running commands and checking their outcome

/// The command succeeded (else its exit code, stdout and stderr in the failure).
pub fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "command failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// [`assert_ok`], and its standard output.
pub fn ok(o: &Output) -> String {
    assert_ok(o);
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// A tool scripts/install-deps.sh builds into `$KB_TOOLS` (default `<repo>/.tools`), e.g.
/// `cosign-v2.6.5/cosign`. Missing, the test fails saying how to get it: it never skips.
pub fn kb_tool(rel: &str) -> PathBuf {
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

/// The cosign binary: env.json's `cosign` (scripts/test-env.sh names the one install-deps
/// built), else [`kb_tool`]'s. Missing, the test fails (it never skips).
pub fn cosign_bin() -> PathBuf {
    match env_json()["cosign"].as_str() {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "cosign is not at {} (env.json)", p.display());
            p
        }
        None => kb_tool("cosign-v2.6.5/cosign"),
    }
}

/// The real cosign ([`cosign_bin`]) in a home of its own, `h/cosign-home` (`HOME`, `TUF_ROOT`),
/// run in `h`: nothing of the caller's environment but `PATH=/usr/bin:/bin`, plus `envs`;
/// within 120 s.
pub fn cosign_with(h: &Home, envs: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> Output {
    let home = cosign_home(h);
    let mut c = Command::new(cosign_bin());
    c.args(args)
        .current_dir(h.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .env("TUF_ROOT", home.join("tuf"))
        .envs(envs.iter().copied());
    output_within(c, Duration::from_secs(120), "cosign")
}

/// The home [`cosign_with`] gives cosign (created).
pub fn cosign_home(h: &Home) -> PathBuf {
    let home = h.path().join("cosign-home");
    std::fs::create_dir_all(&home).unwrap();
    home
}

/// `cosign generate-key-pair --output-key-prefix NAME` in `h` with `password`:
/// (NAME.key, NAME.pub).
pub fn cosign_key_pair(h: &Home, name: &str, password: &str) -> (PathBuf, PathBuf) {
    ok(&cosign_with(
        h,
        &[("COSIGN_PASSWORD", password.as_ref())],
        &["generate-key-pair", "--output-key-prefix", name],
    ));
    (
        h.path().join(format!("{name}.key")),
        h.path().join(format!("{name}.pub")),
    )
}

/// The chart version whose images [`copy_140_images`] copies: the tests of upstream
/// signatures sign these (`V140_IMAGES` at `V140_TAG`).
pub const V140: &str = "1.4.0";
/// The images of the 1.4.0 chart.
pub const V140_IMAGES: [&str; 4] = [
    "koordinator-sh/koord-descheduler",
    "koordinator-sh/koord-manager",
    "koordinator-sh/koord-scheduler",
    "koordinator-sh/koordlet",
];
/// Their tag.
pub const V140_TAG: &str = "v1.4.0";

/// The 1.4.0 images copied (every platform) from the plain registry to `host/PREFIX` (plain
/// HTTP), for upstream signatures to be put on them; each `(repository, index digest)`.
pub fn copy_140_images(host: &str, prefix: &str) -> Vec<(String, String)> {
    let e = env();
    V140_IMAGES
        .iter()
        .map(|repo| {
            skopeo_copy_plain(
                &format!("docker://{}/{repo}:{V140_TAG}", e.plain),
                &format!("docker://{host}/{prefix}/{repo}:{V140_TAG}"),
            );
            (repo.to_string(), pushed_digest(repo, V140_TAG))
        })
        .collect()
}

/// `cosign sign --registry-referrers-mode=oci-1-1` of `image` with `key` (password `pw`),
/// offline, plain HTTP: the signature goes as an OCI 1.1 referrer only (no `.sig` tag).
pub fn cosign_sign_oci11(h: &Home, key: &Path, image: &str) {
    ok(&cosign_with(
        h,
        &[
            ("COSIGN_EXPERIMENTAL", "1".as_ref()),
            ("COSIGN_PASSWORD", "pw".as_ref()),
        ],
        &[
            "sign",
            "--key",
            key.to_str().unwrap(),
            "--tlog-upload=false",
            "--allow-insecure-registry",
            "--yes",
            "--registry-referrers-mode=oci-1-1",
            image,
        ],
    ));
}

/// cosign refused what `what` names (it exited non-zero); its stderr.
pub fn cosign_refused(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success(),
        "{what}: cosign accepted it\nstdout:\n{}\nstderr:\n{err}",
        String::from_utf8_lossy(&o.stdout)
    );
    err
}

/// A cosign signature manifest with one base64 character of its first layer's signature
/// changed (a tampered or forged signature).
pub fn forge_signature(manifest: &mut Value) {
    let ann = &mut manifest["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"];
    let mut b = ann.as_str().unwrap().to_string().into_bytes();
    let i = b.len() / 2;
    b[i] = if b[i] == b'A' { b'B' } else { b'A' };
    *ann = Value::String(String::from_utf8(b).unwrap());
}

/// PUT `manifest` (an OCI image manifest, as JSON) as `reference` (a tag or a digest) of
/// `repo` on the plain-HTTP registry at `host`, through a file of `h`: it must be created (201).
pub fn put_oci_manifest(h: &Home, host: &str, repo: &str, reference: &str, manifest: &Value) {
    let file = h.path().join(format!(
        "put-{}.json",
        sha256(&serde_json::to_vec(manifest).unwrap()).replace(':', "-")
    ));
    std::fs::write(&file, serde_json::to_vec(manifest).unwrap()).unwrap();
    let put = curl(
        &[
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/vnd.oci.image.manifest.v1+json",
            "--data-binary",
            &format!("@{}", file.display()),
        ],
        &format!("http://{host}/v2/{repo}/manifests/{reference}"),
    );
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
}

/// `skopeo copy --all` of `src` to `dest` (`docker://` references), plain HTTP both sides.
pub fn skopeo_copy_plain(src: &str, dest: &str) {
    assert_ok(&tool(
        "skopeo",
        &[
            "copy",
            "-q",
            "--all",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            src,
            dest,
        ],
        Path::new("/"),
    ));
}

/// The entry of `repo` (`images[].repository`) in a bundle manifest.
pub fn bundle_image<'a>(m: &'a Value, repo: &str) -> &'a Value {
    m["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["repository"] == repo)
        .unwrap_or_else(|| panic!("no image {repo} in the bundle manifest"))
}

/// The bundle at `bundle` (its manifest `m`) verified with `h`'s key by `verify` and by the
/// reference reader (bundle-spec/reference/kbread.py), and `m` valid under the spec's JSON
/// schema; the schema, for the caller's own checks.
pub fn spec_accepts(h: &Home, bundle: &Path, m: &Value) -> jsonschema::Validator {
    let key = h.pubkey();
    assert_ok(&h.run(&[
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]));
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("bundle-spec");
    let mut c = Command::new("python3");
    c.arg(spec.join("reference/kbread.py"))
        .arg(bundle)
        .args(["--key", key.to_str().unwrap()]);
    let read = ok(&output_within(c, Duration::from_secs(60), "kbread.py"));
    assert!(read.ends_with("verdict: accepted\n"), "{read}");
    let schema: Value = serde_json::from_slice(
        &std::fs::read(spec.join("schema/koord-bundle.schema.json")).unwrap(),
    )
    .unwrap();
    let schema = jsonschema::draft202012::new(&schema).unwrap();
    let errs: Vec<String> = schema.iter_errors(m).map(|e| e.to_string()).collect();
    assert!(errs.is_empty(), "{errs:#?}");
    schema
}

/// The command exited with `code` and its stderr holds every one of `needles`; its stderr.
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
/// The bundle extracted with tar into `h`'s folder `x`.
pub fn extract(h: &Home, bundle: &Path) -> PathBuf {
    let x = h.path().join("x");
    std::fs::create_dir(&x).unwrap();
    assert_ok(&tool(
        "tar",
        &["xf", bundle.to_str().unwrap(), "-C", x.to_str().unwrap()],
        h.path(),
    ));
    x
}

pub fn tool(cmd: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e} (scripts/install-deps.sh installs it)"))
}

/// Spawn `c` with `input` on its stdin (then closed); its output.
pub fn run_with_stdin(c: &mut Command, input: &str) -> Output {
    use std::process::Stdio;
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Run `script` with `sh -c` in a private mount namespace where `dir` is a tmpfs of `size`
/// (`64k`, `600k`), from the home directory with its config and cache: a disk that fills up.
pub fn in_tmpfs(h: &Home, dir: &Path, size: &str, script: &str) -> Output {
    std::fs::create_dir_all(dir).unwrap();
    let o = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            &format!(
                "mount -t tmpfs -o size={size} tmpfs {} && {script}",
                dir.display()
            ),
        ])
        .current_dir(h.path())
        .env("KOORD_BUNDLE_CONFIG_DIR", h.config())
        .env("KOORD_BUNDLE_CACHE_DIR", h.cache())
        .output()
        .expect("unshare (util-linux) is needed for the disk-full tests");
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("mount:"),
        "cannot mount a tmpfs here: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

// --- Waiting: for a condition, with a deadline that fails loudly; never a sleep

/// Poll `poll` every 50 ms until it returns `Ok`; its value. After `timeout`, panic naming
/// `what` was awaited and what `poll` saw instead (its last `Err`). The deadline only bounds
/// a failure (a shared, noisy machine): it asserts nothing about speed.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut poll: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match poll() {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => {
                panic!("waited {timeout:?} for {what}, in vain: {seen}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// [`wait_for`] `ready` to hold.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    wait_for(what, timeout, || {
        if ready() {
            Ok(())
        } else {
            Err("it never held".to_string())
        }
    })
}

/// Run `cmd`, its stdout and stderr captured, and fail (killing it) if it has not ended
/// after `limit`: a test must fail rather than hang. `what` says what should have ended it.
/// Not a timing assertion on anything that works.
pub fn output_within(mut cmd: Command, limit: Duration, what: &str) -> Output {
    use std::process::{Child, Stdio};
    /// Killed when the wait panics.
    struct Running(Child);
    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Running(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", cmd.get_program())),
    );
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(child.0.stdout.take().map(|r| Box::new(r) as _));
    let err = drain(child.0.stderr.take().map(|r| Box::new(r) as _));
    let status = wait_for(what, limit, || {
        let running = format!("{:?} still running", cmd.get_program());
        child.0.try_wait().unwrap().ok_or(running)
    });
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

// --- Bundle files and chart archives

/// The bundle manifest (`koord-bundle.json`, read from the plain tar).
pub fn bundle_manifest(bundle: &Path) -> Value {
    let mut ar = tar::Archive::new(std::fs::File::open(bundle).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_string_lossy() == "koord-bundle.json" {
            let mut text = String::new();
            e.read_to_string(&mut text).unwrap();
            return serde_json::from_str(&text).unwrap();
        }
    }
    panic!("no koord-bundle.json in {}", bundle.display())
}

/// The largest blob entry of a plain-tar bundle and where its data starts in the file.
pub fn largest_blob(bundle: &Path) -> (String, u64) {
    let mut ar = tar::Archive::new(std::fs::File::open(bundle).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().unwrap().starts_with("blobs/sha256/"))
        .max_by_key(|e| e.size())
        .map(|e| {
            (
                e.path().unwrap().to_string_lossy().into_owned(),
                e.raw_file_position(),
            )
        })
        .unwrap()
}

/// Flip one bit of a file in place (size unchanged).
pub fn flip_byte(path: &Path, at: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut byte).unwrap();
    byte[0] ^= 0x01;
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&byte).unwrap();
    f.sync_all().unwrap();
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

/// Write a chart archive at `path`: `files` under a `koordinator/` top folder, gzipped.
pub fn chart_tgz(path: &Path, files: &[(&str, &[u8])]) {
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(path).unwrap(),
        flate2::Compression::fast(),
    );
    let mut b = tar::Builder::new(gz);
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("koordinator/{name}"), *data)
            .unwrap();
    }
    b.into_inner().unwrap().finish().unwrap();
}

/// Every chart version of the fixtures, oldest first.
pub fn versions() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            name.strip_prefix("koordinator-")
                .and_then(|n| n.strip_suffix(".tgz"))
                .map(str::to_string)
        })
        .collect();
    v.sort_by_key(|s| {
        s.split('.')
            .map(|p| p.parse::<u32>().unwrap())
            .collect::<Vec<_>>()
    });
    v
}

/// The container images of `helm template` output, read with serde_yaml_ng as a peer would.
pub fn images_of(rendered: &str) -> std::collections::BTreeSet<String> {
    fn walk(v: &serde_yaml_ng::Value, out: &mut std::collections::BTreeSet<String>) {
        use serde_yaml_ng::Value as Y;
        match v {
            Y::Mapping(m) => {
                for (k, val) in m {
                    if matches!(
                        k.as_str(),
                        Some("containers" | "initContainers" | "ephemeralContainers")
                    ) {
                        for c in val.as_sequence().into_iter().flatten() {
                            if let Some(i) = c.get("image").and_then(Y::as_str) {
                                out.insert(i.to_string());
                            }
                        }
                    }
                    walk(val, out);
                }
            }
            Y::Sequence(s) => s.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    for doc in rendered.split("\n---") {
        if let Ok(v) = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(doc) {
            walk(&v, &mut out);
        }
    }
    out
}

/// What real helm renders from a fixture chart, with `--set`s.
pub fn helm_images(
    helm: &Path,
    version: &str,
    sets: &[&str],
) -> std::collections::BTreeSet<String> {
    let chart = fixtures().join(format!("koordinator-{version}.tgz"));
    let mut c = std::process::Command::new(helm);
    c.args(["template", "koordinator", chart.to_str().unwrap()]);
    for s in sets {
        c.args(["--set", s]);
    }
    let o = c.output().expect("run helm");
    assert_ok(&o);
    let images = images_of(&String::from_utf8_lossy(&o.stdout));
    assert!(!images.is_empty(), "helm renders no image from {version}");
    images
}

// --- Digests, read back with skopeo

/// `sha256:HEX` of `bytes`: the digest a registry and skopeo give them.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::{Digest as _, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// How skopeo reaches a store: the transport flags of `skopeo inspect` (and, prefixed, of
/// either side of `skopeo copy`). The default has none (an `oci-archive:` or `oci:` path).
#[derive(Clone, Copy, Default)]
pub struct Skopeo<'a> {
    /// `--tls-verify=false`: a plain-HTTP registry.
    pub plain_http: bool,
    /// `--cert-dir DIR`: the CA of a TLS registry.
    pub cert_dir: Option<&'a Path>,
    /// `--creds USER:PASSWORD`.
    pub creds: Option<(&'a str, &'a str)>,
}

#[allow(dead_code)] // not every constructor is used by every test module
impl<'a> Skopeo<'a> {
    /// A plain-HTTP registry (`--tls-verify=false`).
    pub fn plain_http() -> Self {
        Skopeo {
            plain_http: true,
            ..Skopeo::default()
        }
    }
    /// A TLS registry whose CA is in `cert_dir`, with a login (`--cert-dir DIR --creds U:P`).
    pub fn tls(cert_dir: &'a Path, user: &'a str, password: &'a str) -> Self {
        Skopeo {
            cert_dir: Some(cert_dir),
            creds: Some((user, password)),
            ..Skopeo::default()
        }
    }
    /// The flags, each named `--{side}NAME`: `side` is "" for `inspect`, "src-" or "dest-" for
    /// `copy`.
    pub fn flags(&self, side: &str) -> Vec<String> {
        let mut v = Vec::new();
        if self.plain_http {
            v.push(format!("--{side}tls-verify=false"));
        }
        if let Some(d) = self.cert_dir {
            v.extend([format!("--{side}cert-dir"), d.display().to_string()]);
        }
        if let Some((user, password)) = self.creds {
            v.extend([format!("--{side}creds"), format!("{user}:{password}")]);
        }
        v
    }
    /// `skopeo inspect --raw REFERENCE` (a skopeo reference: `docker://HOST/REPO:TAG`,
    /// `oci-archive:PATH:REF`), whatever its outcome.
    pub fn inspect_raw(&self, reference: &str) -> Output {
        let mut args = vec!["inspect".to_string(), "--raw".to_string()];
        args.extend(self.flags(""));
        args.push(reference.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tool("skopeo", &args, Path::new("/"))
    }
}

/// The raw manifest skopeo reads at `reference`, byte for byte (panics naming the reference
/// when skopeo cannot read it).
pub fn skopeo_raw(reference: &str, how: &Skopeo) -> Vec<u8> {
    let o = how.inspect_raw(reference);
    assert!(
        o.status.success(),
        "skopeo inspect --raw {reference} failed ({:?}):\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// The manifest skopeo reads at `reference` has the digest `expected` (the sha256 of the raw
/// bytes: nothing re-encoded on the way).
pub fn assert_digest(reference: &str, how: &Skopeo, expected: &str) {
    assert_eq!(
        sha256(&skopeo_raw(reference, how)),
        expected,
        "the digest of the manifest skopeo reads at {reference}"
    );
}

// --- Registries over HTTP, with curl

/// A curl answer.
pub struct Http {
    /// The HTTP status; 0 when there was no answer (refused, TLS failure...).
    pub status: u16,
    /// Raw header block, lower-cased.
    pub headers: String,
    /// The body.
    pub body: Vec<u8>,
}

impl Http {
    /// The value of a header (`name` in any case), if it is there.
    pub fn header(&self, name: &str) -> Option<String> {
        let prefix = format!("{}:", name.to_ascii_lowercase());
        self.headers
            .lines()
            .find(|l| l.starts_with(&prefix))
            .map(|l| l[prefix.len()..].trim().to_string())
    }
    /// The body, which must be JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// `errors[0].code` of a distribution API error body ("" when there is none).
    pub fn error_code(&self) -> String {
        self.json()["errors"][0]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// `curl -s ARGS URL`.
pub fn curl(args: &[&str], url: &str) -> Http {
    let d = tempfile::tempdir().unwrap();
    let (h, b) = (d.path().join("h"), d.path().join("b"));
    let mut a = vec![
        "-s",
        "-D",
        h.to_str().unwrap(),
        "-o",
        b.to_str().unwrap(),
        "-w",
        "%{http_code}",
    ];
    a.extend_from_slice(args);
    a.push(url);
    let o = tool("curl", &a, d.path());
    Http {
        status: String::from_utf8_lossy(&o.stdout).parse().unwrap_or(0),
        headers: std::fs::read_to_string(&h)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        body: std::fs::read(&b).unwrap_or_default(),
    }
}

/// Which of the bundle's six repositories exist on the plain registry under `prefix`.
pub fn repos_under(prefix: &str) -> Vec<String> {
    let repos = [
        "charts/koordinator",
        "koordinator-sh/koord-descheduler",
        "koordinator-sh/koord-device-daemon",
        "koordinator-sh/koord-manager",
        "koordinator-sh/koord-scheduler",
        "koordinator-sh/koordlet",
    ];
    repos
        .iter()
        .map(|r| format!("{prefix}/{r}"))
        .filter(|r| {
            let url = format!("http://{}/v2/{r}/tags/list", env().plain);
            curl(&[], &url).status == 200
        })
        .collect()
}

// --- The CycloneDX validator (bom.rs, tools.rs)

/// The Python that has `cyclonedx-python-lib[json-validation]`: `KB_CDX_PYTHON`, else the
/// virtual environment scripts/install-deps.sh makes in `$KB_TOOLS/cyclonedx` (default
/// `<repo>/.tools`). Missing, the test fails: it never skips.
pub fn cdx_python() -> PathBuf {
    let p = std::env::var_os("KB_CDX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let tools = std::env::var_os("KB_TOOLS")
                .map(PathBuf::from)
                .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools"));
            tools.join("cyclonedx/bin/python3")
        });
    let ok = std::process::Command::new(&p)
        .args(["-c", "import cyclonedx.validation.json, jsonschema"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "the CycloneDX validator is missing: {} cannot import cyclonedx-python-lib with its json-validation extra. \
         Run scripts/install-deps.sh (it makes $KB_TOOLS/cyclonedx), or set KB_CDX_PYTHON to a python3 that has \
         `pip install 'cyclonedx-python-lib[json-validation]'`",
        p.display()
    );
    p
}

/// Validate a BOM with `JsonStrictValidator(SchemaVersion.V1_6)`: `Ok(())` or its errors.
pub fn validate(bom: &Path) -> Result<String, String> {
    let script = r#"
import sys
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(open(sys.argv[1]).read(), all_errors=True)
if errors:
    for e in errors:
        print("invalid:", e)
    sys.exit(1)
print("valid: CycloneDX 1.6, JsonStrictValidator")
"#;
    let o = std::process::Command::new(cdx_python())
        .args(["-c", script, bom.to_str().unwrap()])
        .output()
        .expect("run the validator");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

// --- Split parts (format v2) read and written back as an attacker would

/// A part's pieces (split format v2): header JSON, signature, block table, data.
pub struct FirstPart {
    pub index: usize,
    pub count: usize,
    pub json: serde_json::Value,
    pub sig: Vec<u8>,
    pub table: Vec<u8>,
    pub data: Vec<u8>,
}

pub fn read_first_part(p: &Path) -> FirstPart {
    let b = std::fs::read(p).unwrap();
    let mut lines = b.splitn(4, |&c| c == b'\n');
    assert_eq!(lines.next().unwrap(), b"koord-bundle-split v2");
    let ident = std::str::from_utf8(lines.next().unwrap())
        .unwrap()
        .to_string();
    let w: Vec<&str> = ident.split(' ').collect();
    let (index, count) = (w[1].parse().unwrap(), w[3].parse().unwrap());
    let len: usize = std::str::from_utf8(lines.next().unwrap())
        .unwrap()
        .parse()
        .unwrap();
    let rest = lines.next().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&rest[..len]).unwrap();
    let rest = &rest[len + 1..];
    let nl = rest.iter().position(|&c| c == b'\n').unwrap();
    let sig_len: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
    let sig = rest[nl + 1..nl + 1 + sig_len].to_vec();
    let rest = &rest[nl + 1 + sig_len + 1..];
    let nl = rest.iter().position(|&c| c == b'\n').unwrap();
    let table_len: usize = std::str::from_utf8(&rest[..nl]).unwrap().parse().unwrap();
    let table = rest[nl + 1..nl + 1 + table_len].to_vec();
    let data = b[json["dataOffset"].as_u64().unwrap() as usize..].to_vec();
    FirstPart {
        index,
        count,
        json,
        sig,
        table,
        data,
    }
}

/// Write a part back as an attacker would: its part line made consistent with the edited JSON
/// (set id and check), the data where the JSON says.
pub fn write_first_part(p: &Path, fp: &FirstPart) {
    use sha2::Digest as _;
    let json = serde_json::to_vec(&fp.json).unwrap();
    let set = hex::encode(&sha2::Sha256::digest(&json)[..16]);
    let rest = format!("part {} of {} set {set}", fp.index, fp.count);
    let check = hex::encode(&sha2::Sha256::digest(rest.as_bytes())[..4]);
    let mut out = format!(
        "koord-bundle-split v2\n{rest} check {check}\n{}\n",
        json.len()
    )
    .into_bytes();
    out.extend_from_slice(&json);
    out.extend_from_slice(format!("\n{}\n", fp.sig.len()).as_bytes());
    out.extend_from_slice(&fp.sig);
    out.extend_from_slice(format!("\n{}\n", fp.table.len()).as_bytes());
    out.extend_from_slice(&fp.table);
    let offset = fp.json["dataOffset"].as_u64().unwrap() as usize;
    assert!(out.len() <= offset, "the edited header still fits its area");
    out.resize(offset, 0);
    out.extend_from_slice(&fp.data);
    std::fs::write(p, out).unwrap();
}

/// `split INPUT --size SIZE --parity N MORE --output-dir <a new folder in h>`, which must
/// succeed: (the folder, the parts it wrote, as `--json` lists them).
pub fn split_set(
    h: &Home,
    input: &Path,
    size: &str,
    parity: usize,
    more: &[&str],
) -> (PathBuf, Vec<PathBuf>) {
    let dir = h.path().join(unique_prefix("set"));
    std::fs::create_dir(&dir).unwrap();
    let parity = parity.to_string();
    let mut args = vec![
        "split",
        input.to_str().unwrap(),
        "--size",
        size,
        "--parity",
        &parity,
        "--output-dir",
        dir.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(more);
    let o = h.run(&args);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let parts = v["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect();
    (dir, parts)
}

/// The sources of the root crate (src/) and of every crate of the workspace (crates/NAME/src):
/// a module moved into a crate stays under the same rules.
pub fn all_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    if let Ok(crates) = std::fs::read_dir(root.join("crates")) {
        for c in crates {
            let src = c.unwrap().path().join("src");
            if src.is_dir() {
                sources(&src, &mut files);
            }
        }
    }
    files
}

/// Every `.rs` file under `dir`, as (its path from the repository's root, its text).
pub fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p
                .strip_prefix(env!("CARGO_MANIFEST_DIR"))
                .unwrap()
                .to_string_lossy()
                .to_string();
            out.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
}

/// The module a source file is (`src/bundle/reader.rs` → `["bundle", "reader"]`,
/// `src/bundle/set/mod.rs` → `["bundle", "set"]`; `crates/NAME/src/oci/mod.rs` → `["oci"]`),
/// `None` for `lib.rs` and `main.rs`.
pub fn module_path(path: &str) -> Option<Vec<String>> {
    let inside = match path.strip_prefix("crates/") {
        Some(rest) => rest.split_once("/src/").map_or(rest, |(_, p)| p),
        None => path.trim_start_matches("src/"),
    };
    let rel = inside.trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    (parts != ["lib"] && parts != ["main"]).then_some(parts)
}

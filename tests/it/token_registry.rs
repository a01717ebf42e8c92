//! The registry that behaves like Docker Hub, ghcr.io, ACR and Harbor: CNCF distribution 2.8
//! with Docker token auth (scripts/token-registry.py's token service: RS256 JWTs with an x5c
//! chain; anonymous callers may pull, `koord` may push, `reader` may only pull, an identity
//! token for `koord`) and every blob GET redirected (307) to a blob server on another host name
//! that refuses any request carrying `Authorization` (as S3/OSS do). Plus the registry error
//! messages, credential helpers, bounded bodies and fast failure on a wrong address.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

/// The token registry's part of env.json.
struct TokenEnv {
    registry: String,
    auth_url: String,
    cdn_url: String,
    ca_file: PathBuf,
    ca_dir: PathBuf,
    push_user: (String, String),
    pull_user: (String, String),
    identity_token: String,
    storage: PathBuf,
    /// (repository:tag, digest, media type) as seeded.
    images: Vec<(String, String, String)>,
}

fn tenv() -> &'static TokenEnv {
    static T: OnceLock<TokenEnv> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("KB_ENV_JSON")
            .unwrap_or_else(|_| format!("{}/target/test-env/env.json", env!("CARGO_MANIFEST_DIR")));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| {
                    panic!("env.json lacks {k}: restart the env with scripts/test-env.sh")
                })
                .to_string()
        };
        let user = |k: &str| {
            (
                v[k]["username"].as_str().unwrap().to_string(),
                v[k]["password"].as_str().unwrap().to_string(),
            )
        };
        let registry = s("token_registry");
        let images: Value =
            serde_json::from_str(&std::fs::read_to_string(s("images_json")).unwrap()).unwrap();
        let images = images
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| {
                let t = i.get("token")?;
                Some((
                    t["ref"]
                        .as_str()?
                        .strip_prefix(&format!("{registry}/"))?
                        .to_string(),
                    t["digest"].as_str()?.to_string(),
                    t["media_type"].as_str()?.to_string(),
                ))
            })
            .collect::<Vec<_>>();
        assert_eq!(
            images.len(),
            5,
            "the token registry holds the five 1.8.0 images"
        );
        TokenEnv {
            registry,
            auth_url: s("token_auth_url"),
            cdn_url: s("token_cdn_url"),
            ca_file: s("ca_file").into(),
            ca_dir: s("ca_dir").into(),
            push_user: user("push_user"),
            pull_user: user("pull_user"),
            identity_token: s("identity_token"),
            storage: s("token_storage").into(),
            images,
        }
    })
}

/// GET a JSON document from one of the env's HTTPS services.
fn get_json(url: &str) -> Value {
    let t = tenv();
    let o = tool(
        "curl",
        &["-sf", "--cacert", t.ca_file.to_str().unwrap(), url],
        Path::new("/"),
    );
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{url} is not JSON"))
}

fn count(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Token service counts, for requests naming a repository under `prefix`.
fn token_stats(prefix: &str) -> Value {
    get_json(&format!("{}/stats?prefix={prefix}", tenv().auth_url))
}

fn cdn_stats() -> Value {
    get_json(&format!("{}/stats", tenv().cdn_url))
}

fn build_from_token(h: &Home, out: &Path) -> Output {
    let t = tenv();
    h.build("1.8.0")
        .source(&t.registry)
        .https()
        .args(&["--ca-file", t.ca_file.to_str().unwrap(), "--json"])
        .out(out)
        .run()
}

/// A signed bundle built from the token registry in a home of its own, for one load test
/// (removed with the home when the test ends; see `crate::common::Built`).
struct TokenBuilt {
    home: Home,
    bundle: PathBuf,
    /// (ref, digest) of its images.
    images: Vec<(String, String)>,
}

impl TokenBuilt {
    fn new() -> Self {
        let home = Home::with_key();
        let bundle = home.path().join("koordinator-1.8.0.tar");
        let o = build_from_token(&home, &bundle);
        assert_ok(&o);
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        TokenBuilt {
            images: image_digests(&v),
            home,
            bundle,
        }
    }
}

/// `load BUNDLE --registry TOKEN/prefix --key KEY --ca-file CA` plus `extra`, not run yet.
fn token_load_cmd(b: &TokenBuilt, prefix: &str, extra: &[&str]) -> std::process::Command {
    let t = tenv();
    let mut c = b.home.load_cmd(
        &b.bundle,
        &format!("{}/{prefix}", t.registry),
        &["--ca-file", t.ca_file.to_str().unwrap()],
    );
    c.args(extra);
    c
}

/// `load BUNDLE --registry TOKEN/prefix --ca-file CA --no-install --json` plus `extra`, with
/// `stdin` (for --password-stdin) and `envs`.
fn load_token(
    b: &TokenBuilt,
    prefix: &str,
    extra: &[&str],
    stdin: Option<&str>,
    envs: &[(&str, &str)],
) -> Output {
    let mut args = vec!["--no-install", "--json"];
    args.extend_from_slice(extra);
    let mut c = token_load_cmd(b, prefix, &args);
    for (k, v) in envs {
        c.env(k, v);
    }
    match stdin {
        Some(s) => run_with_stdin(&mut c, s),
        None => c.stdin(std::process::Stdio::null()).output().unwrap(),
    }
}

fn as_push_user(b: &TokenBuilt, prefix: &str) -> Output {
    let t = tenv();
    load_token(
        b,
        prefix,
        &["--username", &t.push_user.0, "--password-stdin"],
        Some(&format!("{}\n", t.push_user.1)),
        &[],
    )
}

/// Every image of the bundle under `prefix`, read back by skopeo with the push user.
fn assert_digests_with_skopeo(b: &TokenBuilt, prefix: &str) {
    let t = tenv();
    let skopeo = Skopeo::tls(&t.ca_dir, &t.push_user.0, &t.push_user.1);
    for (r, d) in &b.images {
        assert_digest(&format!("docker://{}/{prefix}/{r}", t.registry), &skopeo, d);
    }
}

fn all_output(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn build_from_token_registry_anonymous_tokens_and_redirected_blobs() {
    let t = tenv();
    let before_tokens = token_stats("koordinator-sh/");
    let before_cdn = cdn_stats();
    let h = Home::with_key();
    let out = h.path().join("b.tar");
    let o = build_from_token(&h, &out);
    assert_ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Every image as the registry serves it: Docker manifest lists and OCI indexes alike.
    let got = image_digests(&v);
    for (r, d, mt) in &t.images {
        assert!(
            got.contains(&(r.clone(), d.clone())),
            "{r} {d} not in {got:?}"
        );
        let rec = v["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["ref"] == r.as_str())
            .unwrap();
        assert_eq!(rec["mediaType"], mt.as_str(), "{r}");
    }
    assert!(t
        .images
        .iter()
        .any(|(_, _, mt)| mt.contains("docker.distribution.manifest.list")));
    let koordlet = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["ref"] == "koordinator-sh/koordlet:v1.8.0")
        .unwrap();
    assert_eq!(koordlet["attestations"], 1, "buildx attestation kept");
    assert_ok(&h.run(&["verify", out.to_str().unwrap()]));
    // What the servers saw: anonymous pull tokens, blob GETs at the CDN (ranges), and no
    // request that carried the registry's Authorization there.
    let after_tokens = token_stats("koordinator-sh/");
    let after_cdn = cdn_stats();
    let anon = count(&after_tokens, "anonymous_tokens") - count(&before_tokens, "anonymous_tokens");
    let gets = count(&after_cdn, "blob_gets") - count(&before_cdn, "blob_gets");
    let ranges = count(&after_cdn, "range_gets") - count(&before_cdn, "range_gets");
    eprintln!(
        "build from the token registry: {anon} anonymous tokens, {gets} redirected blob GETs ({ranges} with Range), {} Authorization-on-CDN refusals in all",
        count(&after_cdn, "refused_authorization")
    );
    assert!(anon > 0, "{after_tokens}");
    assert!(gets > 0 && ranges > 0, "{after_cdn}");
    assert_eq!(count(&after_cdn, "refused_authorization"), 0, "{after_cdn}");
}

#[test]
fn load_into_token_registry_as_push_user_under_a_prefix_mounts_and_reloads_nothing() {
    let b = TokenBuilt::new();
    let t = tenv();
    let prefix = unique_prefix("harbor");
    let o = as_push_user(&b, &prefix);
    assert_ok(&o);
    assert!(
        !all_output(&o).contains(&t.push_user.1),
        "the password was echoed"
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["push"]["uploaded"].as_u64().unwrap() > 0, "{}", r["push"]);
    // The shared base layers are mounted across repositories: the mount needs a token for
    // both repositories (the scopes the challenge names).
    assert!(r["push"]["mounted"].as_u64().unwrap() > 0, "{}", r["push"]);
    assert_digests_with_skopeo(&b, &prefix);
    let stats = token_stats(&prefix);
    eprintln!("load as the push user under {prefix}: token service saw {stats}");
    assert!(count(&stats, "user_tokens") > 0, "{stats}");
    assert_eq!(count(&stats, "anonymous_tokens"), 0, "{stats}");
    assert_eq!(count(&stats, "refused"), 0, "{stats}");
    // Re-load: nothing is pushed.
    let o = as_push_user(&b, &prefix);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["push"]["uploaded"], 0, "{}", r["push"]);
    assert_eq!(r["push"]["mounted"], 0, "{}", r["push"]);
    assert_eq!(r["push"]["manifestsPushed"], 0, "{}", r["push"]);
    assert_eq!(count(&cdn_stats(), "refused_authorization"), 0);
}

#[test]
fn load_signs_images_behind_token_auth_in_the_tag_scheme() {
    let b = TokenBuilt::new();
    let t = tenv();
    let (key, _) = cosign_key_pair(&b.home, "site", "pw");
    let prefix = unique_prefix("token-sign");
    let o = load_token(
        &b,
        &prefix,
        &[
            "--username",
            &t.push_user.0,
            "--password-stdin",
            "--sign-images",
            key.to_str().unwrap(),
        ],
        Some(&format!("{}\n", t.push_user.1)),
        &[("COSIGN_PASSWORD", "pw")],
    );
    assert_ok(&o);
    let s = serde_json::from_slice::<Value>(&o.stdout).unwrap()["signed"].clone();
    // distribution 2.8 behind the token service serves no referrers API: asked with a token
    // (pull scope), it answers 404, and the signatures go to cosign's tag scheme only.
    assert!(s["referrersSaid"].as_str().unwrap().contains("404"), "{s}");
    assert_eq!(s["referrersPushed"], 0, "{s}");
    let images = s["images"].as_array().unwrap();
    assert_eq!(images.len(), b.images.len(), "{s}");
    // Each index signature and attestation is where `signed` says, read back by skopeo as the
    // push user: the manifest it names.
    let skopeo = Skopeo::tls(&t.ca_dir, &t.push_user.0, &t.push_user.1);
    for i in images {
        assert_eq!(i["referrers"], false, "{i}");
        for kind in ["signature", "attestation"] {
            let a = &i["index"][kind];
            assert_eq!(a["added"], true, "{i}");
            assert_digest(
                &format!("docker://{}", a["reference"].as_str().unwrap()),
                &skopeo,
                a["manifest"].as_str().unwrap(),
            );
        }
    }
    let stats = token_stats(&prefix);
    assert_eq!(count(&stats, "refused"), 0, "{stats}");
    assert_eq!(count(&stats, "anonymous_tokens"), 0, "{stats}");
}

/// Referrers a bundle carries (upstream cosign signatures in OCI 1.1 form, `build
/// --with-signatures`) loaded behind token auth: distribution 2.8 serves no referrers API (asked
/// with a pull token: 404), so each goes by its digest, byte for byte, and into the referrers
/// tag schema's `sha256-<hex>` index of its subject, both with the push user's token; a second
/// load adds nothing and changes no index.
#[test]
fn load_pushes_carried_referrers_behind_token_auth() {
    let t = tenv();
    let h = Home::with_key();
    let (up_key, up_pub) = cosign_key_pair(&h, "upstream", "pw");
    let rr = referrers_registry();
    let src = unique_prefix("token-refs-up");
    for (repo, digest) in copy_140_images(&rr, &src) {
        cosign_sign_oci11(&h, &up_key, &format!("{rr}/{src}/{repo}@{digest}"));
    }
    let out = h.path().join("referrers.tar");
    assert_ok(
        &h.build(V140)
            .source(&format!("{rr}/{src}"))
            .out(&out)
            .args(&[
                "--with-signatures",
                "--verify-key",
                up_pub.to_str().unwrap(),
            ])
            .run(),
    );
    // (repository, subject digest, referrer digest) of each carried referrer.
    let m = bundle_manifest(&out);
    let carried: Vec<(String, String, String)> = V140_IMAGES
        .iter()
        .flat_map(|repo| {
            let sigs = bundle_image(&m, repo)["signatures"].as_array().unwrap();
            sigs.iter()
                .filter(|s| s["scheme"] == "referrer")
                .map(|s| {
                    let field = |k: &str| s[k].as_str().unwrap().to_string();
                    (repo.to_string(), field("signs"), field("digest"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(carried.len(), V140_IMAGES.len(), "{carried:?}");

    let prefix = unique_prefix("token-refs");
    let load = || {
        let mut c = h.load_cmd(
            &out,
            &format!("{}/{prefix}", t.registry),
            &[
                "--ca-file",
                t.ca_file.to_str().unwrap(),
                "--no-install",
                "--username",
                &t.push_user.0,
                "--password-stdin",
            ],
        );
        let o = run_with_stdin(&mut c, &format!("{}\n", t.push_user.1));
        ok(&o) + &String::from_utf8_lossy(&o.stderr)
    };
    let said = load();
    assert!(
        said.contains("the registry serves no referrers API (404): 4 added to the referrers tag schema's sha256-<hex> index"),
        "{said}"
    );
    let skopeo = Skopeo::tls(&t.ca_dir, &t.push_user.0, &t.push_user.1);
    let mut indexes = Vec::new();
    for (repo, subject, referrer) in &carried {
        let at = format!("docker://{}/{prefix}/{repo}", t.registry);
        assert_digest(&format!("{at}@{referrer}"), &skopeo, referrer);
        let tag = format!("{at}:sha256-{}", subject.trim_start_matches("sha256:"));
        let index = skopeo_raw(&tag, &skopeo);
        let v: Value = serde_json::from_slice(&index).unwrap();
        assert_eq!(v["manifests"][0]["digest"], referrer.as_str(), "{tag}: {v}");
        assert_eq!(
            v["manifests"][0]["artifactType"],
            "application/vnd.dev.cosign.artifact.sig.v1+json"
        );
        indexes.push((tag, index));
    }
    let stats = token_stats(&prefix);
    assert!(count(&stats, "user_tokens") > 0, "{stats}");
    assert_eq!(count(&stats, "refused"), 0, "{stats}");

    let said = load();
    assert!(
        said.contains("0 added") && said.contains("4 listed there already"),
        "{said}"
    );
    for (tag, index) in &indexes {
        assert_eq!(&skopeo_raw(tag, &skopeo), index, "{tag} changed");
    }
}

/// Blob links the registry holds under `prefix` (one per blob in each repository).
fn layer_links(prefix: &str) -> usize {
    fn walk(p: &Path, n: &mut usize) {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, n);
                } else if path.file_name().is_some_and(|f| f == "link")
                    && path.to_string_lossy().contains("/_layers/")
                {
                    *n += 1;
                }
            }
        }
    }
    let mut n = 0;
    walk(
        &tenv()
            .storage
            .join("docker/registry/v2/repositories")
            .join(prefix),
        &mut n,
    );
    n
}

#[test]
fn load_into_token_registry_killed_half_way_then_finished() {
    let t = tenv();
    let b = TokenBuilt::new();
    let prefix = unique_prefix("tokkill");
    // Every token for this prefix comes 300 ms late, so the load is slow enough to be caught
    // in the middle.
    get_json(&format!(
        "{}/control?slow_prefix={prefix}&delay_ms=300",
        t.auth_url
    ));
    let mut child = token_load_cmd(
        &b,
        &prefix,
        &[
            "--no-install",
            "--jobs",
            "1",
            "--username",
            &t.push_user.0,
            "--password-stdin",
        ],
    )
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("{}\n", t.push_user.1).as_bytes())
            .unwrap();
    }
    // Wait until some blobs are in (a condition, not a timer), then SIGKILL.
    wait_until(
        "some blobs of the load to be in",
        std::time::Duration::from_secs(120),
        || {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the load ended before it could be killed"
            );
            layer_links(&prefix) >= 3
        },
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the load ended before it could be killed"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let links_at_kill = layer_links(&prefix);
    // Finish it (at full speed).
    get_json(&format!(
        "{}/control?slow_prefix={prefix}&delay_ms=0",
        t.auth_url
    ));
    let o = as_push_user(&b, &prefix);
    assert_ok(&o);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["push"]["skipped"].as_u64().unwrap() > 0,
        "the re-run reused what the killed run pushed ({links_at_kill} blob links): {}",
        r["push"]
    );
    assert!(
        r["push"]["uploaded"].as_u64().unwrap() + r["push"]["mounted"].as_u64().unwrap() > 0,
        "the killed run was half-way: {}",
        r["push"]
    );
    assert_digests_with_skopeo(&b, &prefix);
}

/// A `docker-credential-NAME` script that answers `user`/`secret` for `host` (and logs the
/// server it was asked about), "not found" for any other.
fn write_helper(bin: &Path, name: &str, host: &str, user: &str, secret: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(bin).unwrap();
    let log = bin.join(format!("{name}.log"));
    let p = bin.join(format!("docker-credential-{name}"));
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 2\nread -r server\necho \"$server\" >> '{log}'\nif [ \"$server\" = '{host}' ]; then\n  printf '{{\"ServerURL\":\"%s\",\"Username\":\"{user}\",\"Secret\":\"{secret}\"}}\\n' \"$server\"\nelse\n  echo 'credentials not found in native keychain'\n  exit 1\nfi\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    log
}

/// `load_token` with the docker config directory `cfg` (its config.json is `config_json`) and
/// the credential helpers of `bin` first on PATH.
fn load_with_docker_config(
    b: &TokenBuilt,
    prefix: &str,
    cfg: &Path,
    config_json: &str,
    bin: &Path,
) -> Output {
    std::fs::create_dir_all(cfg).unwrap();
    std::fs::write(cfg.join("config.json"), config_json).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    load_token(
        b,
        prefix,
        &[],
        None,
        &[("DOCKER_CONFIG", cfg.to_str().unwrap()), ("PATH", &path)],
    )
}

#[test]
fn credential_helpers_creds_store_and_cred_helpers() {
    let b = TokenBuilt::new();
    let t = tenv();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    // credsStore: the default helper for every registry.
    let log = write_helper(&bin, "kbstore", &t.registry, &t.push_user.0, &t.push_user.1);
    let prefix = unique_prefix("credstore");
    let o = load_with_docker_config(
        &b,
        &prefix,
        &dir.path().join("store"),
        r#"{"auths":{},"credsStore":"kbstore"}"#,
        &bin,
    );
    assert_ok(&o);
    assert!(!all_output(&o).contains(&t.push_user.1));
    let asked = std::fs::read_to_string(&log).unwrap();
    assert!(asked.lines().any(|l| l == t.registry), "{asked}");
    assert!(count(&token_stats(&prefix), "user_tokens") > 0);
    assert_digests_with_skopeo(&b, &prefix);
    // credHelpers: a helper for this registry wins over credsStore (which knows nothing here).
    let log2 = write_helper(&bin, "kbhost", &t.registry, &t.push_user.0, &t.push_user.1);
    write_helper(&bin, "kbempty", "nothing.example", "x", "y");
    let cfg2 = dir.path().join("helpers");
    let prefix = unique_prefix("credhelpers");
    let o = load_with_docker_config(
        &b,
        &prefix,
        &cfg2,
        &format!(
            r#"{{"credsStore":"kbempty","credHelpers":{{"{}":"kbhost"}}}}"#,
            t.registry
        ),
        &bin,
    );
    assert_ok(&o);
    assert!(std::fs::read_to_string(&log2)
        .unwrap()
        .lines()
        .any(|l| l == t.registry));
    assert_digests_with_skopeo(&b, &prefix);
    // A helper with nothing for the host: "no credentials", naming the helper it asked.
    let o = load_with_docker_config(
        &b,
        &unique_prefix("credempty"),
        &cfg2,
        r#"{"credsStore":"kbempty"}"#,
        &bin,
    );
    let err = assert_fails(&o, 1, &["no credentials for", "docker-credential-kbempty"]);
    assert!(!err.contains("refused the credentials"), "{err}");
}

/// A `docker-credential-NAME` script: `body` after it logs each run (the server asked about)
/// to `NAME.runs`, which the caller counts.
fn write_broken_helper(bin: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(bin).unwrap();
    let runs = bin.join(format!("{name}.runs"));
    let p = bin.join(format!("docker-credential-{name}"));
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 2\nread -r server\necho \"$server\" >> '{}'\n{body}\n",
            runs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    runs
}

fn runs(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Issue 21 and issue 17 on credential helpers, with `load`: a failing helper's own words are
/// shown (its first line on stdout, where helpers answer) with the command to see them again;
/// a helper that hangs is stopped at the 30 s its message names, with what it started; one that
/// prints without end is stopped at its cap. Each runs once per host in the whole load (it ran
/// 3 to 5 times: once before verification, then once per parallel push).
#[test]
fn broken_credential_helpers_run_once_and_say_why() {
    let b = TokenBuilt::new();
    let t = tenv();
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let hint = |name: &str| format!("`echo {} | docker-credential-{name} get`", t.registry);
    // Fails, saying why on stdout (as docker-credential-gcloud does).
    let log = write_broken_helper(
        &bin,
        "kbfail",
        "echo 'You do not currently have an active account selected.'\necho 'second line' >&2\nexit 1",
    );
    let o = load_with_docker_config(
        &b,
        &unique_prefix("credfail"),
        &dir.path().join("fail"),
        r#"{"credsStore":"kbfail"}"#,
        &bin,
    );
    assert_fails(
        &o,
        1,
        &[
            "credential helper docker-credential-kbfail",
            "exited with exit status: 1: \"You do not currently have an active account selected.\"",
            &hint("kbfail"),
        ],
    );
    assert_eq!(runs(&log), vec![t.registry.as_str()], "one run per host");
    // Prints without end: stopped at 64 KiB; never its output in the message.
    let log = write_broken_helper(&bin, "kbendless", "exec yes '{\"Secret\":\"s3cr3t-x\"}'");
    let o = load_with_docker_config(
        &b,
        &unique_prefix("credendless"),
        &dir.path().join("endless"),
        r#"{"credsStore":"kbendless"}"#,
        &bin,
    );
    let err = assert_fails(
        &o,
        1,
        &[
            "docker-credential-kbendless",
            "printed more than 65536 bytes on its standard output",
        ],
    );
    assert!(!err.contains("s3cr3t-x"), "{err}");
    assert_eq!(runs(&log), vec![t.registry.as_str()], "one run per host");
    // Hangs, with a child of its own: stopped at 30 s, the child too.
    let pid = dir.path().join("hang.pid");
    let log = write_broken_helper(
        &bin,
        "kbhang",
        &format!(
            "sleep 600 >/dev/null 2>&1 &\necho $! > '{}'\nexec sleep 600",
            pid.display()
        ),
    );
    let o = load_with_docker_config(
        &b,
        &unique_prefix("credhang"),
        &dir.path().join("hang"),
        r#"{"credsStore":"kbhang"}"#,
        &bin,
    );
    assert_fails(
        &o,
        1,
        &[
            "docker-credential-kbhang",
            "did not finish within 30 s",
            "with everything it started",
        ],
    );
    assert_eq!(runs(&log), vec![t.registry.as_str()], "one run per host");
    let pid = std::fs::read_to_string(&pid).unwrap().trim().to_string();
    let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    assert!(!alive, "the helper's child {pid} outlived it");
}

#[test]
fn identity_token_from_auths_and_from_a_helper() {
    let b = TokenBuilt::new();
    let t = tenv();
    let dir = tempfile::tempdir().unwrap();
    // `identitytoken` in an auths entry (what `docker login` writes for token logins).
    let auth = dir.path().join("auth.json");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"","identitytoken":"{}"}}}}}}"#,
            t.registry, t.identity_token
        ),
    )
    .unwrap();
    let prefix = unique_prefix("idtoken");
    let o = load_token(
        &b,
        &prefix,
        &[],
        None,
        &[("REGISTRY_AUTH_FILE", auth.to_str().unwrap())],
    );
    assert_ok(&o);
    assert!(!all_output(&o).contains(&t.identity_token));
    let stats = token_stats(&prefix);
    eprintln!("identity token load: {stats}");
    assert!(count(&stats, "refresh_grants") > 0, "{stats}");
    assert_eq!(count(&stats, "user_tokens"), 0, "{stats}");
    assert_eq!(count(&stats, "anonymous_tokens"), 0, "{stats}");
    assert_digests_with_skopeo(&b, &prefix);
    // A helper answering Username `<token>` hands over an identity token too.
    let bin = dir.path().join("bin");
    write_helper(&bin, "kbtoken", &t.registry, "<token>", &t.identity_token);
    let prefix = unique_prefix("idhelper");
    let o = load_with_docker_config(
        &b,
        &prefix,
        &dir.path().join("cfg"),
        r#"{"credsStore":"kbtoken"}"#,
        &bin,
    );
    assert_ok(&o);
    assert!(count(&token_stats(&prefix), "refresh_grants") > 0);
    // A wrong identity token is refused, and the message does not show it.
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"identitytoken":"not-the-token-42"}}}}}}"#,
            t.registry
        ),
    )
    .unwrap();
    let o = load_token(
        &b,
        &unique_prefix("idbad"),
        &[],
        None,
        &[("REGISTRY_AUTH_FILE", auth.to_str().unwrap())],
    );
    let err = assert_fails(
        &o,
        1,
        &["refused the credentials of the identity token", &t.registry],
    );
    assert!(!err.contains("not-the-token-42"), "{err}");
}

#[test]
fn error_messages_say_no_credentials_refused_or_lacks_push() {
    let b = TokenBuilt::new();
    let t = tenv();
    // No credentials anywhere: pulls would be allowed, a push is not.
    let o = load_token(&b, &unique_prefix("nocreds"), &[], None, &[]);
    let err = assert_fails(
        &o,
        1,
        &[
            &format!("no credentials for {} were found", t.registry),
            "looked at",
            "docker login",
        ],
    );
    assert!(!err.contains("refused the credentials"), "{err}");
    // A wrong password: refused, naming the user and the registry, never the password.
    let o = load_token(
        &b,
        &unique_prefix("refused"),
        &["--username", &t.push_user.0, "--password-stdin"],
        Some("not-the-password-7\n"),
        &[],
    );
    let err = assert_fails(
        &o,
        1,
        &[&format!(
            "{} refused the credentials of user \"{}\"",
            t.registry, t.push_user.0
        )],
    );
    assert!(!all_output(&o).contains("not-the-password-7"), "{err}");
    // A user who may only pull: "denies push", with the scope.
    let prefix = unique_prefix("pullonly");
    let o = load_token(
        &b,
        &prefix,
        &["--username", &t.pull_user.0, "--password-stdin"],
        Some(&format!("{}\n", t.pull_user.1)),
        &[],
    );
    let err = assert_fails(
        &o,
        1,
        &[
            &format!("accepted the credentials of user \"{}\"", t.pull_user.0),
            "denies push",
            &format!("repository:{prefix}/"),
        ],
    );
    assert!(!err.contains("refused the credentials"), "{err}");
    assert!(!all_output(&o).contains(&t.pull_user.1));
    // The htpasswd registry without credentials: a login is needed, nothing was refused.
    let h = Home::new();
    let o = h
        .build("1.8.0")
        .source(&env().tls)
        .https()
        .args(&["--ca-file", env().ca_file.to_str().unwrap(), "--dry-run"])
        .run();
    let err = assert_fails(&o, 1, &["no credentials for", "docker login"]);
    assert!(!err.contains("refused the credentials"), "{err}");
}

#[test]
fn plain_http_registry_without_the_flag_says_so() {
    let e = env();
    let b = Built::new();
    let o = b
        .home
        .load_cmd(
            &b.bundle,
            &format!("{}/{}", e.plain, unique_prefix("noflag")),
            &["--no-install"],
        )
        .output()
        .unwrap();
    let err = assert_fails(&o, 1, &["speaks plain HTTP", "--plain-http", &e.plain]);
    assert!(!err.contains("InvalidContentType"), "{err}");
    let h = Home::new();
    let o = h.build("1.8.0").https().arg("--dry-run").run();
    assert_fails(&o, 1, &["speaks plain HTTP", "--plain-http"]);
}

#[test]
fn registry_with_user_and_password_is_refused_and_never_echoed() {
    let b = Built::new();
    let secret = "S3cr3t-pw-91";
    for value in [
        format!("koord:{secret}@{}/site", env().plain),
        format!("https://koord:{secret}@{}/site", env().plain),
        format!("koord:{secret}@{}", env().plain),
    ] {
        for json in [false, true] {
            let mut args = vec!["--no-install", "--plain-http"];
            if json {
                args.push("--json");
            }
            let o = b.home.load_cmd(&b.bundle, &value, &args).output().unwrap();
            assert_fails(&o, 1, &["--username", "--password-stdin"]);
            assert!(
                !all_output(&o).contains(secret),
                "{value}: the password was echoed:\n{}",
                all_output(&o)
            );
        }
    }
    // The same for build's --source and --image.
    let h = Home::new();
    let source = format!("koord:{secret}@{}", env().plain);
    let image = format!("koord:{secret}@{}/x/y:v1", env().plain);
    for build in [
        h.build("1.8.0").source(&source),
        h.build("1.8.0").args(&["--image", &image]),
    ] {
        let build = build.args(&["--dry-run", "--json"]);
        let o = build.run();
        assert_fails(&o, 1, &["docker login"]);
        assert!(
            !all_output(&o).contains(secret),
            "{:?}: the password was echoed:\n{}",
            build.to_vec(),
            all_output(&o)
        );
    }
}

/// A registry whose manifest is an endless chunked body; records the most bytes one response
/// got out before the client hung up.
fn endless_manifest_registry() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let s = sent.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                    }
                    if path == "/v2/" {
                        let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
                        continue;
                    }
                    let _ = w.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.index.v1+json\r\nTransfer-Encoding: chunked\r\n\r\n");
                    let chunk = vec![b' '; 64 * 1024];
                    let mut mine = 0u64;
                    // At most 256 MiB; a client that stops at 4 MiB hangs up long before.
                    for _ in 0..4096 {
                        let head = format!("{:x}\r\n", chunk.len());
                        if w.write_all(head.as_bytes()).is_err()
                            || w.write_all(&chunk).is_err()
                            || w.write_all(b"\r\n").is_err()
                        {
                            return;
                        }
                        mine += chunk.len() as u64;
                        s.fetch_max(mine, Ordering::SeqCst);
                    }
                    let _ = w.write_all(b"0\r\n\r\n");
                    return;
                }
            });
        }
    });
    (addr, sent)
}

#[test]
fn endless_chunked_manifest_stops_at_the_cap_while_reading() {
    let (addr, sent) = endless_manifest_registry();
    let h = Home::new();
    let o = h
        .build("1.8.0")
        .source(&addr)
        .args(&["--dry-run", "--image", &format!("{addr}/x/endless:v1")])
        .run();
    assert_fails(&o, 1, &["larger than 4194304 bytes"]);
    let n = sent.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        n < 32 * 1024 * 1024,
        "one response got {n} bytes of an endless manifest out before the client gave up"
    );
}

#[test]
fn connection_refused_on_loopback_gives_up_at_once_with_the_hint() {
    // A port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let b = Built::new();
    let o = b
        .home
        .load_cmd(
            &b.bundle,
            &format!("{addr}/x"),
            &["--no-install", "--plain-http"],
        )
        .output()
        .unwrap();
    let err = assert_fails(
        &o,
        3,
        &[
            "gave up after 1 attempt",
            &format!("nothing listens on {addr}"),
        ],
    );
    assert!(
        !err.contains("retrying"),
        "a refused loopback address was retried:\n{err}"
    );
    let h = Home::new();
    let o = h.build("1.8.0").source(&addr).arg("--dry-run").run();
    let err = assert_fails(&o, 3, &["gave up after 1 attempt", "nothing listens on"]);
    assert!(!err.contains("retrying"), "{err}");
}

/// What the in-process registry + CDN pair saw.
#[derive(Default, Debug)]
struct RedirectSeen {
    registry_blob_gets: usize,
    cdn_gets: usize,
    cdn_with_authorization: usize,
    cdn_range_starts: Vec<u64>,
}

/// A registry that wants basic auth and redirects (307) its one layer to a blob server on
/// another port; the blob server cuts its first answer half-way and refuses `Authorization`.
fn redirecting_registry(
    layer: Vec<u8>,
) -> (
    String,
    String,
    std::sync::Arc<std::sync::Mutex<RedirectSeen>>,
) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(RedirectSeen::default()));
    let reg = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cdn = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let reg_addr = reg.local_addr().unwrap().to_string();
    let cdn_addr = cdn.local_addr().unwrap().to_string();
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let (cd, ld) = (sha256(&config), sha256(&layer));
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{ld}","size":{}}}]}}"#,
        config.len(),
        layer.len()
    )
    .into_bytes();
    // Request line and headers (lower-cased names) of one request, or None at EOF.
    fn read_head(r: &mut impl BufRead) -> Option<(String, Vec<(String, String)>)> {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let path = line.split_whitespace().nth(1)?.to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.trim_end().split_once(':') {
                headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        Some((path, headers))
    }
    fn respond(w: &mut impl Write, status: &str, extra: &str, body: &[u8]) -> bool {
        write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}\r\n",
            body.len()
        )
        .is_ok()
            && w.write_all(body).is_ok()
            && w.flush().is_ok()
    }
    {
        let (seen, cdn_addr) = (seen.clone(), cdn_addr.clone());
        let (manifest, config, cd, ld) = (manifest, config, cd, ld.clone());
        std::thread::spawn(move || {
            for conn in reg.incoming().flatten() {
                let (seen, cdn_addr) = (seen.clone(), cdn_addr.clone());
                let (manifest, config, cd, ld) =
                    (manifest.clone(), config.clone(), cd.clone(), ld.clone());
                std::thread::spawn(move || {
                    let mut r = BufReader::new(conn.try_clone().unwrap());
                    let mut w = conn;
                    while let Some((path, headers)) = read_head(&mut r) {
                        let authed = headers
                            .iter()
                            .any(|(k, v)| k == "authorization" && v.starts_with("Basic "));
                        let ok = if !authed {
                            respond(
                                &mut w,
                                "401 Unauthorized",
                                "WWW-Authenticate: Basic realm=\"fake\"\r\n",
                                b"{}",
                            )
                        } else if path == "/v2/" {
                            respond(&mut w, "200 OK", "", b"{}")
                        } else if path == "/v2/x/big/manifests/v1" {
                            respond(
                                &mut w,
                                "200 OK",
                                "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n",
                                &manifest,
                            )
                        } else if path == format!("/v2/x/big/blobs/{cd}") {
                            respond(&mut w, "200 OK", "", &config)
                        } else if path == format!("/v2/x/big/blobs/{ld}") {
                            seen.lock().unwrap().registry_blob_gets += 1;
                            respond(
                                &mut w,
                                "307 Temporary Redirect",
                                &format!("Location: http://{cdn_addr}/blobs/{ld}/data?sig=x\r\n"),
                                b"",
                            )
                        } else {
                            respond(&mut w, "404 Not Found", "", b"{}")
                        };
                        if !ok {
                            return;
                        }
                    }
                });
            }
        });
    }
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            for conn in cdn.incoming().flatten() {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                let Some((_, headers)) = read_head(&mut r) else {
                    continue;
                };
                let mut s = seen.lock().unwrap();
                s.cdn_gets += 1;
                if headers.iter().any(|(k, _)| k == "authorization") {
                    s.cdn_with_authorization += 1;
                    drop(s);
                    respond(
                        &mut w,
                        "400 Bad Request",
                        "",
                        b"only one auth mechanism allowed",
                    );
                    continue;
                }
                let start = headers
                    .iter()
                    .find(|(k, _)| k == "range")
                    .and_then(|(_, v)| v.strip_prefix("bytes="))
                    .and_then(|v| v.split('-').next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                s.cdn_range_starts.push(start);
                let first = s.cdn_range_starts.len() == 1;
                drop(s);
                let body = &layer[start as usize..];
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{}\r\n\r\n",
                    body.len(),
                    layer.len() - 1,
                    layer.len()
                );
                let _ = w.write_all(head.as_bytes());
                // The first answer breaks off half-way (a CDN connection reset).
                let n = if first { body.len() / 2 } else { body.len() };
                let _ = w.write_all(&body[..n]);
                let _ = w.flush();
                let _ = w.shutdown(std::net::Shutdown::Both);
                let mut sink = Vec::new();
                let _ = r.read_to_end(&mut sink);
            }
        });
    }
    (reg_addr, cdn_addr, seen)
}

#[test]
fn redirected_blob_goes_without_credentials_and_resumes_at_the_redirected_url() {
    use base64::Engine as _;
    let layer: Vec<u8> = (0..2_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let (reg, _cdn, seen) = redirecting_registry(layer);
    let h = Home::new();
    let auth = h.path().join("auth.json");
    let basic = base64::engine::general_purpose::STANDARD.encode("u:secret-pw");
    std::fs::write(
        &auth,
        format!(r#"{{"auths":{{"{reg}":{{"auth":"{basic}"}}}}}}"#),
    )
    .unwrap();
    let out = h.path().join("r.tar");
    let o = h
        .build("1.8.0")
        .args(&["--image", &format!("{reg}/x/big:v1"), "--unsigned"])
        .out(&out)
        .cmd()
        .env("REGISTRY_AUTH_FILE", &auth)
        .output()
        .unwrap();
    assert_ok(&o);
    let s = seen.lock().unwrap();
    eprintln!("{s:?}");
    assert_eq!(s.cdn_with_authorization, 0, "{s:?}");
    assert_eq!(
        s.registry_blob_gets, 1,
        "the resume went back to the registry instead of the redirected URL: {s:?}"
    );
    assert_eq!(s.cdn_range_starts.len(), 2, "{s:?}");
    assert_eq!(s.cdn_range_starts[0], 0, "{s:?}");
    assert_eq!(
        s.cdn_range_starts[1], 1_000_000,
        "resumed where it broke: {s:?}"
    );
    // The retry was reported.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("retrying blob"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

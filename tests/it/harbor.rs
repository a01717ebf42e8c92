//! `load` into Harbor: the stand-in of the test environment (`scripts/token-registry.py harbor`
//! in front of a real distribution 2.8 with token auth) answers as Harbor does: projects, its
//! token service granting push only inside existing projects to their members, 500 for a
//! one-component repository, `/api/v2.0/systeminfo`, `HEAD /api/v2.0/projects?project_name=`,
//! `POST /api/v2.0/projects`, robot accounts named `robot$koord+ci`. Results are checked with
//! skopeo, helm 3 and helm 4, and the registry's storage (nothing pushed means no repository
//! directory).

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

/// The Harbor part of env.json.
struct HarborEnv {
    /// TLS entrance (`ca_file`).
    host: String,
    /// Plain-HTTP entrance, same state (helm 3 speaks plain HTTP on loopback).
    http_host: String,
    storage: PathBuf,
    ca_file: PathBuf,
    ca_dir: PathBuf,
    /// A Developer of `koord`.
    user: (String, String),
    /// A Guest of `koord`.
    reader: (String, String),
    /// `robot$koord+ci`: push and pull on `koord` only.
    robot: (String, String),
}

fn harbor() -> &'static HarborEnv {
    static H: OnceLock<HarborEnv> = OnceLock::new();
    H.get_or_init(|| {
        let path = std::env::var("KB_ENV_JSON").unwrap_or_else(|_| {
            format!("{}/target/test-env/env.json", env!("CARGO_MANIFEST_DIR"))
        });
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("{path} lacks {k}: the environment predates the Harbor stand-in; restart it (scripts/test-env.sh start)"))
                .to_string()
        };
        let pair = |k: &str| {
            (
                v[k]["username"].as_str().unwrap().to_string(),
                v[k]["password"].as_str().unwrap().to_string(),
            )
        };
        HarborEnv {
            host: s("harbor_registry"),
            http_host: s("harbor_http_registry"),
            storage: s("harbor_storage").into(),
            ca_file: s("ca_file").into(),
            ca_dir: s("ca_dir").into(),
            user: pair("push_user"),
            reader: pair("pull_user"),
            robot: pair("harbor_robot"),
        }
    })
}

/// A signed 1.8.0 bundle (plus `extra` build flags) in a home of its own, and its `inspect
/// --json`.
fn bundle(extra: &[&str]) -> (Home, PathBuf, Value) {
    let h = Home::with_key();
    let (b, _) = h.build_plain("1.8.0", extra);
    let o = h.run(&["inspect", b.to_str().unwrap(), "--json"]);
    assert_ok(&o);
    let m = serde_json::from_slice(&o.stdout).unwrap();
    (h, b, m)
}

/// `load BUNDLE --registry REGISTRY --ca-file CA --no-install --json --username U
/// --password-stdin` plus `extra`, the password on stdin.
fn load_as(h: &Home, b: &Path, registry: &str, who: &(String, String), extra: &[&str]) -> Output {
    let mut args = vec!["--json"];
    args.extend_from_slice(extra);
    load_text_as(h, b, registry, who, &args)
}

/// [`load_as`] without `--json`: what a person reads.
fn load_text_as(
    h: &Home,
    b: &Path,
    registry: &str,
    who: &(String, String),
    extra: &[&str],
) -> Output {
    let ca = harbor().ca_file.to_str().unwrap().to_string();
    let mut args = vec![
        "--ca-file",
        &ca,
        "--no-install",
        "--username",
        &who.0,
        "--password-stdin",
    ];
    args.extend_from_slice(extra);
    let mut c = h.load_cmd(b, registry, &args);
    run_with_stdin(&mut c, &format!("{}\n", who.1))
}

/// The repository directory of the registry behind the stand-in (exists once anything was
/// pushed there, even an unfinished upload).
fn stored(repository: &str) -> bool {
    harbor()
        .storage
        .join("docker/registry/v2/repositories")
        .join(repository)
        .exists()
}

/// Every image of the bundle under `registry` has the bundle's digest (skopeo, with `who`).
fn assert_digests(m: &Value, registry: &str, who: &(String, String)) {
    let skopeo = Skopeo::tls(&harbor().ca_dir, &who.0, &who.1);
    for (r, digest) in image_digests(m) {
        assert_digest(&format!("docker://{registry}/{r}"), &skopeo, &digest);
    }
}

/// `curl` status of a Harbor API request with basic auth.
fn api_status(method: &str, path: &str, who: &(String, String)) -> u16 {
    let hb = harbor();
    let url = format!("https://{}{path}", hb.host);
    let creds = format!("{}:{}", who.0, who.1);
    let verb: &[&str] = if method == "HEAD" {
        &["-I"]
    } else {
        &["-X", method]
    };
    let mut args = verb.to_vec();
    args.extend_from_slice(&["--cacert", hb.ca_file.to_str().unwrap(), "-u", &creds]);
    curl(&args, &url).status
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

#[test]
fn harbor_load_into_an_existing_project_keeps_every_digest() {
    let hb = harbor();
    let (h, b, m) = bundle(&[]);
    let path = format!("koord/{}", unique_prefix("existing"));
    let registry = format!("{}/{path}", hb.host);
    let o = load_as(&h, &b, &registry, &hb.user, &[]);
    assert_ok(&o);
    let r = json(&o);
    assert_eq!(r["harbor"]["projects"][0]["name"], "koord", "{r}");
    assert_eq!(r["harbor"]["projects"][0]["state"], "exists", "{r}");
    assert_eq!(r["harbor"]["projects"][0]["mayPush"], true, "{r}");
    assert!(r["push"]["uploaded"].as_u64().unwrap() > 0, "{r}");
    assert_digests(&m, &registry, &hb.user);
    // A re-load pushes nothing, and a Guest (pull only) may do that.
    let o = load_as(&h, &b, &registry, &hb.reader, &[]);
    assert_ok(&o);
    let r = json(&o);
    assert_eq!(r["push"]["uploaded"], 0, "{r}");
    assert_eq!(r["harbor"]["projects"][0]["mayPush"], false, "{r}");
}

#[test]
fn harbor_missing_project_is_1_names_it_and_pushes_nothing() {
    let hb = harbor();
    let (h, b, _) = bundle(&[]);
    let project = unique_prefix("missing");
    for extra in [&[][..], &["--dry-run"][..]] {
        let o = load_as(&h, &b, &format!("{}/{project}", hb.host), &hb.user, extra);
        let err = assert_fails(
            &o,
            1,
            &[
                &format!("Harbor at {} has no project {project}", hb.host),
                &format!("{project}/charts/koordinator"),
                "New Project",
                "--create-project",
                "nothing was pushed",
            ],
        );
        assert!(!err.contains("denies pull"), "{err}");
    }
    assert!(!stored(&project), "something was pushed into {project}");
    assert_eq!(
        api_status(
            "HEAD",
            &format!("/api/v2.0/projects?project_name={project}"),
            &hb.user
        ),
        404,
        "a push must never create a project"
    );
    // Without a prefix the projects are the chart's own paths: both named.
    let o = load_as(&h, &b, &hb.host, &hb.user, &[]);
    assert_fails(&o, 1, &["has no projects charts, koordinator-sh"]);
    assert!(!stored("koordinator-sh") && !stored("charts"));
}

#[test]
fn harbor_create_project_creates_it_private_then_loads() {
    let hb = harbor();
    let (h, b, m) = bundle(&[]);
    let project = unique_prefix("created");
    let registry = format!("{}/{project}", hb.host);
    let head = format!("/api/v2.0/projects?project_name={project}");
    // A dry run says it would create it, checks the rest, and creates nothing.
    let o = load_as(
        &h,
        &b,
        &registry,
        &hb.user,
        &["--create-project", "--dry-run"],
    );
    assert_ok(&o);
    let r = json(&o);
    assert_eq!(r["harbor"]["projects"][0]["state"], "wouldCreate", "{r}");
    assert!(r["push"]["uploaded"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(api_status("HEAD", &head, &hb.user), 404);
    // A robot account may not create projects: 403, named, nothing pushed.
    let o = load_as(&h, &b, &registry, &hb.robot, &["--create-project"]);
    assert_fails(
        &o,
        1,
        &[
            &format!("refused to create project {project}"),
            "robot$koord+ci",
            "403",
        ],
    );
    assert_eq!(api_status("HEAD", &head, &hb.user), 404);
    assert!(!stored(&project));
    // The user may: created (private, and said so), then loaded.
    let o = load_text_as(&h, &b, &registry, &hb.user, &["--create-project"]);
    assert_ok(&o);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        said.contains(&format!(
            "created private project {project} (--create-project)"
        )),
        "{said}"
    );
    assert_eq!(api_status("HEAD", &head, &hb.user), 200);
    let detail = curl(
        &[
            "--cacert",
            hb.ca_file.to_str().unwrap(),
            "-u",
            &format!("{}:{}", hb.user.0, hb.user.1),
        ],
        &format!("https://{}/api/v2.0/projects/{project}", hb.host),
    );
    assert_eq!(detail.status, 200);
    let p: Value = serde_json::from_slice(&detail.body).unwrap();
    assert_eq!(p["metadata"]["public"], "false", "{p}");
    assert_digests(&m, &registry, &hb.user);
    // Again: the project is there now; nothing to create, nothing to push.
    let o = load_as(&h, &b, &registry, &hb.user, &["--create-project"]);
    assert_ok(&o);
    let r = json(&o);
    assert_eq!(r["harbor"]["projects"][0]["state"], "exists", "{r}");
    assert_eq!(r["push"]["uploaded"], 0, "{r}");
}

#[test]
fn harbor_user_without_push_right_is_1_before_any_push() {
    let hb = harbor();
    let (h, b, _) = bundle(&[]);
    let sub = unique_prefix("guest");
    for extra in [&[][..], &["--dry-run"][..]] {
        let o = load_as(
            &h,
            &b,
            &format!("{}/koord/{sub}", hb.host),
            &hb.reader,
            extra,
        );
        assert_fails(
            &o,
            1,
            &[
                &format!(
                    "user \"{}\" may not push to Harbor project koord on {}",
                    hb.reader.0, hb.host
                ),
                "granted [pull]",
                "not push",
                "Developer",
                "nothing was pushed",
            ],
        );
    }
    assert!(!stored(&format!("koord/{sub}")), "something was pushed");
}

#[test]
fn harbor_one_component_repository_is_1_and_a_project_prefix_takes_it() {
    let e = env();
    let hb = harbor();
    // The stand-in answers a one-component repository as Harbor does: 500.
    let lone = unique_prefix("lone");
    let o = curl(
        &["-I", "--cacert", hb.ca_file.to_str().unwrap()],
        &format!("https://{}/v2/{lone}/manifests/v1", hb.host),
    );
    assert_eq!(o.status, 500);
    // A bundle with an image whose repository has one component (--image HOST/name:tag).
    let h0 = Home::new();
    assert_ok(&tool(
        "skopeo",
        &[
            "copy",
            "--all",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &format!("docker://{}/koordinator-sh/koordlet:v1.8.0", e.plain),
            &format!("docker://{}/{lone}:v1", e.plain),
        ],
        h0.path(),
    ));
    let image = format!("{}/{lone}:v1", e.plain);
    let (h, b, m) = bundle(&["--image", &image]);
    let o = load_as(&h, &b, &hb.host, &hb.user, &[]);
    assert_fails(
        &o,
        1,
        &[
            &format!("{lone} has none"),
            &format!("--registry {}/PROJECT", hb.host),
            "nothing was pushed",
        ],
    );
    assert!(!stored(&lone));
    // One project as the prefix: every repository, the lone one too, goes into it.
    let registry = format!("{}/koord", hb.host);
    let sub = unique_prefix("prefixed");
    let registry = format!("{registry}/{sub}");
    let o = load_as(&h, &b, &registry, &hb.user, &[]);
    assert_ok(&o);
    assert!(stored(&format!("koord/{sub}/{lone}")));
    assert_digests(&m, &registry, &hb.user);
}

#[test]
fn harbor_robot_account_in_username_docker_config_and_helm() {
    use base64::Engine as _;
    use koord_bundle::helm::{Helm, RegistryAccess};
    let hb = harbor();
    let e = env();
    let (h, b, m) = bundle(&[]);
    assert!(hb.robot.0.contains('$'), "{}", hb.robot.0);
    // --username with --password-stdin.
    let registry = format!("{}/koord/{}", hb.host, unique_prefix("robot"));
    assert_ok(&load_as(&h, &b, &registry, &hb.robot, &[]));
    assert_digests(&m, &registry, &hb.robot);
    // A docker config: `auth` (base64 of robot$koord+ci:secret), then username/password.
    let ca = hb.ca_file.to_str().unwrap().to_string();
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", hb.robot.0, hb.robot.1));
    for entry in [
        serde_json::json!({"auth": auth}),
        serde_json::json!({"username": hb.robot.0, "password": hb.robot.1}),
    ] {
        let dir = h.path().join(unique_prefix("docker"));
        std::fs::create_dir(&dir).unwrap();
        let cfg = serde_json::json!({"auths": {hb.host.clone(): entry}});
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let registry = format!("{}/koord/{}", hb.host, unique_prefix("robotcfg"));
        let o = h
            .load_cmd(&b, &registry, &["--ca-file", &ca, "--no-install", "--json"])
            .env("DOCKER_CONFIG", &dir)
            .output()
            .unwrap();
        assert_ok(&o);
        assert_digests(&m, &registry, &hb.robot);
    }
    // What helm is given: koord-bundle's own login path (`helm registry login --username
    // robot$koord+ci --password-stdin` into a throw-away registry config), then `helm pull`:
    // helm 4 over TLS, helm 3 over the plain entrance (it speaks plain HTTP on loopback).
    let chart_digest = m["chart"]["digest"].as_str().unwrap().to_string();
    let path = registry
        .trim_start_matches(&format!("{}/", hb.host))
        .to_string();
    for (helm, host, plain) in [(&e.helm4, &hb.host, false), (&e.helm3, &hb.http_host, true)] {
        let helm = Helm::find(Some(helm), None, &koord_bundle::helm::FOR_LOAD).unwrap();
        let access = RegistryAccess {
            host: host.clone(),
            username: Some(hb.robot.0.clone()),
            password: Some(koord_bundle::secret::Secret::new(hb.robot.1.clone())),
            ca_file: (!plain).then(|| hb.ca_file.clone()),
            plain_http: plain,
            insecure_skip_tls_verify: false,
        };
        let dest = tempfile::tempdir().unwrap();
        let got = helm
            .pull(
                &format!("oci://{host}/{path}/charts/koordinator"),
                "1.8.0",
                dest.path(),
                Some(&access),
            )
            .unwrap_or_else(|err| panic!("helm {}: {err}", helm.major()));
        assert_eq!(
            sha256(&std::fs::read(&got).unwrap()),
            chart_digest,
            "helm {}",
            helm.major()
        );
    }
}

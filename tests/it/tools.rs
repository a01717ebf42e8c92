//! One file crosses (`build --with-tools`): the bundle carries this koord-bundle and the helm
//! that rendered the chart under `tools/<os>-<arch>/`, listed in the signed checksum file. A
//! site with neither program checks them with minisign and sha256sum and loads with them,
//! into the test registry and the real control plane (`cluster`).

use crate::cluster;
use crate::common::*;
use std::path::{Path, PathBuf};

/// This machine's platform as Go names it, and as the bundle's folder does.
fn platform() -> (String, String) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let p = format!("{}/{arch}", std::env::consts::OS);
    let dir = format!("tools/{}", p.replace('/', "-"));
    (p, dir)
}

/// A `PATH` with no helm on it (the system's folders only; helm is never installed there by
/// the test environment: asserted).
fn path_without_helm() -> &'static str {
    let path = "/usr/bin:/bin";
    for d in path.split(':') {
        assert!(
            !Path::new(d).join("helm").exists(),
            "{d}/helm exists: this test needs a PATH without helm"
        );
    }
    path
}

/// The site's folder: only the bundle and the public key, as they crossed.
fn site(h: &Home, bundle: &Path) -> PathBuf {
    let site = h.path().join("site");
    std::fs::create_dir_all(site.join("home")).unwrap();
    std::fs::copy(bundle, site.join("koordinator-1.8.0.tar")).unwrap();
    std::fs::copy(h.pubkey(), site.join("koord-bundle.pub")).unwrap();
    site
}

#[test]
fn one_file_bootstraps_a_site_with_neither_tool() {
    let h = Home::with_key();
    let (bundle, built) = h.build_plain("1.8.0", &["--with-tools"]);
    let (plat, dir) = platform();
    let tools = built["tools"]
        .as_array()
        .expect("build --json lists the tools");
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["koord-bundle", "helm"], "{built}");
    assert!(
        tools.iter().all(|t| t["platform"] == plat.as_str()),
        "{built}"
    );
    // In the tar: executable files of their own folder, listed in the signed checksum file.
    let listing = tool("tar", &["tvf", bundle.to_str().unwrap()], h.path());
    assert_ok(&listing);
    let listing = String::from_utf8_lossy(&listing.stdout).to_string();
    for name in ["koord-bundle", "helm"] {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!("{dir}/{name}")))
            .unwrap_or_else(|| panic!("no {dir}/{name} in\n{listing}"));
        assert!(line.starts_with("-rwxr-xr-x"), "{line}");
    }
    let bom = h.run(&["inspect", bundle.to_str().unwrap(), "--sbom"]);
    assert_ok(&bom);
    let bom_file = h.path().join("bom.cdx.json");
    std::fs::write(&bom_file, &bom.stdout).unwrap();
    validate(&bom_file).expect("the BOM with the tools is valid CycloneDX 1.6");
    let bom: serde_json::Value = serde_json::from_slice(&bom.stdout).unwrap();
    let helm_version = tools[1]["version"].as_str().unwrap();
    let c = bom["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "helm")
        .expect("the BOM lists the carried helm");
    assert_eq!(c["version"], helm_version, "{c}");
    assert_eq!(
        c["hashes"][0]["content"].as_str().unwrap(),
        tools[1]["sha256"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:")
    );

    // The site: the bundle and the key, no koord-bundle and no helm on PATH, an empty HOME.
    let site = site(&h, &bundle);
    let path = path_without_helm();
    let at_site = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .current_dir(&site)
            .env_clear()
            .env("PATH", path)
            .env("HOME", site.join("home"))
            .env("TMPDIR", h.path().join("tmp"))
            .output()
            .unwrap()
    };
    // 1. Only the checksum file, its signature and the tools out of the bundle.
    assert_ok(&at_site(
        "tar",
        &[
            "xf",
            "koordinator-1.8.0.tar",
            "--no-same-owner",
            "--no-same-permissions",
            "SHA256SUMS",
            "SHA256SUMS.minisig",
            "tools",
        ],
    ));
    // 2. Checked with standard tools before anything runs.
    assert_ok(&at_site(
        "minisign",
        &["-Vm", "SHA256SUMS", "-p", "koord-bundle.pub"],
    ));
    let sums = at_site("sha256sum", &["-c", "--ignore-missing", "SHA256SUMS"]);
    assert_ok(&sums);
    let sums = String::from_utf8_lossy(&sums.stdout);
    for name in ["koord-bundle", "helm"] {
        assert!(sums.contains(&format!("{dir}/{name}: OK")), "{sums}");
    }
    // 3. The carried koord-bundle loads with the carried helm.
    let kube = cluster::lease();
    kube.seed_nodes("kubeadm");
    let registry = format!("{}/{}", env().plain, unique_prefix("tools"));
    let kb = format!("{dir}/koord-bundle");
    let kubeconfig = kube.kubeconfig.to_str().unwrap().to_string();
    let o = at_site(
        &site.join(&kb).to_string_lossy(),
        &[
            "load",
            "koordinator-1.8.0.tar",
            "--key",
            "koord-bundle.pub",
            "--registry",
            &registry,
            "--plain-http",
            "--kubeconfig",
            &kubeconfig,
        ],
    );
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("using the one the bundle carries ({dir}/helm")),
        "{err}"
    );
    let releases = kube.releases("default");
    assert!(
        releases
            .iter()
            .any(|(n, s, _)| n == "koordinator" && s == "deployed"),
        "{releases:?}"
    );
    // The carried helm's folder went with the load.
    let left: Vec<_> = std::fs::read_dir(h.path().join("tmp"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("koord-bundle-tools-")
                || e.file_name()
                    .to_string_lossy()
                    .starts_with("koord-bundle-helm-")
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // 4. The printed helm command runs as printed after the load: it names the bundle's helm
    // copied next to the bundle (not the folder that went), with the kept files, private.
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let cmd = out
        .lines()
        .find_map(|l| l.strip_prefix("helm     "))
        .unwrap_or_else(|| panic!("no helm command printed: {out}"))
        .to_string();
    let kept = site.join("koord-bundle-helm-koordinator");
    assert!(
        cmd.contains(&format!("{}/helm ", kept.display())),
        "the command does not name the kept helm: {cmd}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&kept), 0o700, "{}", kept.display());
    assert_eq!(mode(&kept.join("helm")), 0o700);
    assert_eq!(mode(&kept.join("koord-bundle-values.yaml")), 0o600);
    assert!(
        out.contains(&format!("rm -r {}", kept.display())),
        "the output does not say to delete the kept folder: {out}"
    );
    let again = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .current_dir(&site)
        .env_clear()
        .env("PATH", path)
        .env("HOME", site.join("home"))
        .env("TMPDIR", h.path().join("tmp"))
        .output()
        .unwrap();
    assert_ok(&again);
    let releases = kube.releases("default");
    assert!(
        releases
            .iter()
            .any(|(n, s, r)| n == "koordinator" && s == "deployed" && r == "2"),
        "the printed command made no second revision: {releases:?}"
    );
}

#[test]
fn without_helm_or_carried_tools_load_says_what_to_do_and_pushes_nothing() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &[]);
    let kube = cluster::lease();
    let prefix = unique_prefix("notools");
    let registry = format!("{}/{prefix}", env().plain);
    let o = h
        .load_cmd(
            &bundle,
            &registry,
            &[
                "--plain-http",
                "--kubeconfig",
                kube.kubeconfig.to_str().unwrap(),
            ],
        )
        .env("PATH", path_without_helm())
        .output()
        .unwrap();
    assert_fails(
        &o,
        1,
        &[
            "helm not found on PATH",
            "it carries no tools (build it with --with-tools)",
            "nothing was pushed",
        ],
    );
    let tags = tool(
        "curl",
        &[
            "-s",
            &format!(
                "http://{}/v2/{prefix}/koordinator-sh/koordlet/tags/list",
                env().plain
            ),
        ],
        h.path(),
    );
    assert!(
        String::from_utf8_lossy(&tags.stdout).contains("NAME_UNKNOWN"),
        "{}",
        String::from_utf8_lossy(&tags.stdout)
    );
}

#[test]
fn a_carried_tool_that_differs_from_its_checksum_is_refused() {
    let h = Home::with_key();
    let (bundle, built) = h.build_plain("1.8.0", &["--with-tools"]);
    let (_, dir) = platform();
    let v = built["tools"][1].clone();
    assert_eq!(v["file"], format!("{dir}/helm"));
    // One byte of the carried helm changed in the bundle: verify names the file.
    let at = tool_offset(&bundle, &format!("{dir}/helm"));
    flip_byte(&bundle, at + 1000);
    let o = h.run(&[
        "verify",
        bundle.to_str().unwrap(),
        "--key",
        h.pubkey().to_str().unwrap(),
    ]);
    assert_fails(&o, 1, &[&format!("{dir}/helm")]);
}

/// Where the data of entry `name` starts in the plain tar `bundle`.
fn tool_offset(bundle: &Path, name: &str) -> u64 {
    let mut ar = tar::Archive::new(std::fs::File::open(bundle).unwrap());
    for e in ar.entries().unwrap() {
        let e = e.unwrap();
        if e.path().unwrap().to_string_lossy() == name {
            return e.raw_file_position();
        }
    }
    panic!("{name} not in {}", bundle.display())
}

/// Rewrite the tar header of entry `name` in the plain tar `bundle` with `edit` (its checksum
/// made again: a header as any tar writes it).
fn rewrite_header(bundle: &Path, name: &str, edit: impl Fn(&mut tar::Header)) {
    use std::os::unix::fs::FileExt as _;
    let at = tool_offset(bundle, name) - 512;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(bundle)
        .unwrap();
    let mut h = tar::Header::new_old();
    f.read_exact_at(h.as_mut_bytes(), at).unwrap();
    assert_eq!(h.path().unwrap().to_string_lossy(), name);
    edit(&mut h);
    h.set_cksum();
    f.write_all_at(h.as_bytes(), at).unwrap();
}

/// The tar headers are held to the format (mode 0755 for the tools, 0644 for files, uid/gid
/// 0): the carried helm rewritten to mode 6777 (setuid, setgid, world-writable), or
/// a file to uid 1000, is refused by `verify --key`, naming the entry and the field (before:
/// exit 0, and the README's `tar xf … tools` as root made a setuid, world-writable helm).
#[test]
fn a_tar_header_other_than_the_format_gives_is_refused() {
    let h = Home::with_key();
    let (bundle, _) = h.build_plain("1.8.0", &["--with-tools"]);
    let (_, dir) = platform();
    let helm = format!("{dir}/helm");
    let key = h.pubkey();
    let verify = |b: &Path| {
        h.run(&[
            "verify",
            b.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ])
    };
    assert_ok(&verify(&bundle));
    let setuid = h.path().join("setuid.tar");
    std::fs::copy(&bundle, &setuid).unwrap();
    rewrite_header(&setuid, &helm, |h| h.set_mode(0o6777));
    let err = assert_fails(
        &verify(&setuid),
        1,
        &[
            &helm,
            "mode 6777 (setuid, setgid, world-writable, group-writable)",
            "0755",
        ],
    );
    assert!(!err.contains("verified"), "{err}");
    let owned = h.path().join("owned.tar");
    std::fs::copy(&bundle, &owned).unwrap();
    rewrite_header(&owned, "koord-bundle.json", |h| {
        h.set_uid(1000);
        h.set_gid(1000);
    });
    assert_fails(&verify(&owned), 1, &["koord-bundle.json", "uid 1000"]);
    // inspect and diff read the head with the same rule.
    assert_fails(
        &h.run(&["inspect", owned.to_str().unwrap()]),
        1,
        &["koord-bundle.json", "uid 1000"],
    );
}

use super::*;

const TOKEN_CFG: &str = r#"
apiVersion: v1
kind: Config
current-context: kind-kind
clusters:
- name: kind-kind
  cluster:
    server: https://127.0.0.1:40123
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=
- name: other
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: ca/other.crt
    insecure-skip-tls-verify: true
    tls-server-name: kubernetes.default
    proxy-url: http://user:pw@proxy:3128
contexts:
- name: kind-kind
  context: {cluster: kind-kind, user: kind-kind}
- name: other
  context: {cluster: other, user: basic, namespace: tools}
- name: anon
  context: {cluster: kind-kind}
users:
- name: kind-kind
  user:
    token: abc.def.ghi
- name: basic
  user:
    username: admin
    password: "123456"
    as: jane
    as-groups: [devs]
"#;

fn p() -> PathBuf {
    PathBuf::from("/nonexistent/kube/config")
}

#[test]
fn current_context_with_token_and_ca_data() {
    let k = parse(TOKEN_CFG, &p(), None).unwrap();
    assert_eq!(k.context, "kind-kind");
    assert_eq!(k.cluster, "kind-kind");
    assert_eq!(k.user, "kind-kind");
    assert_eq!(k.server, "https://127.0.0.1:40123");
    assert_eq!(
        k.credentials,
        Credentials::Bearer(Secret::new("abc.def.ghi"))
    );
    assert!(k
        .ca_pem
        .as_deref()
        .unwrap()
        .starts_with(b"-----BEGIN CERTIFICATE-----"));
    assert!(!k.insecure_skip_tls_verify);
    // Debug shows no token.
    assert!(!format!("{k:?}").contains("abc.def.ghi"));
}

#[test]
fn explicit_context_basic_auth_tls_server_name_proxy_and_impersonation() {
    let e = parse(TOKEN_CFG, &p(), Some("other"))
        .unwrap_err()
        .to_string();
    // The CA file is resolved against the kubeconfig's directory.
    assert!(e.contains("/nonexistent/kube/ca/other.crt"), "{e}");
    assert!(e.contains("certificate-authority"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ca")).unwrap();
    std::fs::write(dir.path().join("ca/other.crt"), b"PEM").unwrap();
    let cfg = dir.path().join("config");
    std::fs::write(&cfg, TOKEN_CFG).unwrap();
    let k = load(&cfg, Some("other")).unwrap();
    assert_eq!(k.ca_pem.as_deref(), Some(&b"PEM"[..]));
    assert!(k.insecure_skip_tls_verify);
    assert_eq!(k.namespace.as_deref(), Some("tools"));
    assert_eq!(k.tls_server_name.as_deref(), Some("kubernetes.default"));
    assert_eq!(
        k.proxy_url.as_ref().map(Secret::expose),
        Some("http://user:pw@proxy:3128")
    );
    assert_eq!(k.impersonation.user.as_deref(), Some("jane"));
    assert_eq!(k.impersonation.groups, ["devs"]);
    match &k.credentials {
        Credentials::Basic { username, password } => {
            assert_eq!(username, "admin");
            assert_eq!(password.expose(), "123456");
        }
        c => panic!("expected basic, got {c:?}"),
    }
    let dbg = format!("{k:?}");
    assert!(!dbg.contains("123456") && !dbg.contains("user:pw"), "{dbg}");
}

#[test]
fn anonymous_context() {
    let k = parse(TOKEN_CFG, &p(), Some("anon")).unwrap();
    assert_eq!(k.user, "");
    assert_eq!(k.credentials, Credentials::None);
}

#[test]
fn unknown_context_lists_the_known_ones() {
    let e = parse(TOKEN_CFG, &p(), Some("prod"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"prod\" not found"), "{e}");
    assert!(e.contains("kind-kind, other, anon"), "{e}");
    assert!(e.contains("/nonexistent/kube/config"), "{e}");
}

#[test]
fn exec_plugin_entries_are_read_as_client_go_reads_them() {
    let cfg = r#"
current-context: arn:aws:eks:eu-west-1:111122223333:cluster/prod
clusters:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  cluster: {server: "https://ABCD.gr7.eu-west-1.eks.amazonaws.com", certificate-authority-data: UEVN}
contexts:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  context: {cluster: "arn:aws:eks:eu-west-1:111122223333:cluster/prod", user: "arn:aws:eks:eu-west-1:111122223333:cluster/prod"}
users:
- name: arn:aws:eks:eu-west-1:111122223333:cluster/prod
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: [--region, eu-west-1, eks, get-token, --cluster-name, prod]
      env: [{name: AWS_PROFILE, value: prod}]
      installHint: install the AWS CLI
      provideClusterInfo: true
"#;
    let k = parse(cfg, &p(), None).unwrap();
    let Credentials::Exec(e) = &k.credentials else {
        panic!("{:?}", k.credentials)
    };
    assert_eq!(e.command, "aws");
    assert_eq!(e.args.len(), 6);
    assert_eq!(e.env[0].0, "AWS_PROFILE");
    assert_eq!(e.env[0].1.expose(), "prod");
    assert_eq!(e.interactive_mode, "IfAvailable");
    assert!(e.provide_cluster_info);
    assert_eq!(e.ca_pem.as_deref(), Some(&b"PEM"[..]));
    assert_eq!(e.install_hint.as_deref(), Some("install the AWS CLI"));
    // v1 needs interactiveMode; unknown versions are refused, naming the command.
    let v1 = cfg.replace("v1beta1", "v1");
    let m = parse(&v1, &p(), None).unwrap_err().to_string();
    assert!(m.contains("interactiveMode must be set"), "{m}");
    assert!(
        m.contains("aws --region eu-west-1 eks get-token --cluster-name prod"),
        "{m}"
    );
    let old = cfg.replace("v1beta1", "v1alpha1");
    let m = parse(&old, &p(), None).unwrap_err().to_string();
    assert!(m.contains("v1alpha1") && m.contains("not supported"), "{m}");
    // A relative command with a slash is resolved against the kubeconfig's directory; a bare
    // one is left to PATH.
    let rel = cfg.replace("command: aws", "command: ./bin/aws");
    let k = parse(&rel, &p(), None).unwrap();
    let Credentials::Exec(e) = &k.credentials else {
        panic!()
    };
    assert_eq!(e.command, "/nonexistent/kube/./bin/aws");
}

#[test]
fn oidc_auth_provider_gives_its_id_token_and_gcp_is_refused() {
    let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: oidc-user}}]
users:
- name: oidc-user
  user:
    auth-provider:
      name: oidc
      config: {id-token: eyJsecret, client-secret: shh, idp-issuer-url: "https://idp"}
"#;
    let k = parse(cfg, &p(), None).unwrap();
    assert_eq!(k.credentials, Credentials::Bearer(Secret::new("eyJsecret")));
    let gcp = cfg.replace("name: oidc\n", "name: gcp\n");
    let m = parse(&gcp, &p(), None).unwrap_err().to_string();
    assert!(m.contains("\"gcp\" auth-provider"), "{m}");
    assert!(
        m.contains("oidc-user") && m.contains("gke-gcloud-auth-plugin"),
        "{m}"
    );
    assert!(!m.contains("eyJsecret") && !m.contains("shh"), "{m}");
}

#[test]
fn merged_debug_shows_no_credential() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kc");
    std::fs::write(
        &path,
        "current-context: c\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {auth-provider: {name: oidc, config: {id-token: eyJ-secret, client-secret: shh}}, exec: {command: x, env: [{name: T, value: env-secret}]}}}]\n",
    )
    .unwrap();
    let m = read(&Files::one(&path)).unwrap();
    let d = format!("{m:?}");
    assert!(d.contains("\"c\""), "{d}");
    for s in ["eyJ-secret", "shh", "env-secret"] {
        assert!(!d.contains(s), "{d}");
    }
}

#[test]
fn token_file_wins_and_client_cert_files_resolve_relative() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "from-file\n").unwrap();
    std::fs::write(dir.path().join("client.crt"), "CERT").unwrap();
    std::fs::write(dir.path().join("client.key"), "KEY").unwrap();
    let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users:
- name: u
  user: {token: inline, tokenFile: token, client-certificate: client.crt, client-key: client.key}
"#;
    let path = dir.path().join("kc.yaml");
    std::fs::write(&path, cfg).unwrap();
    let k = load(&path, None).unwrap();
    assert_eq!(k.credentials, Credentials::Bearer(Secret::new("from-file")));
    let id = k.client_identity.unwrap();
    assert_eq!(id.certificate_pem, b"CERT");
    assert_eq!(id.key_pem.expose(), b"KEY");
}

#[test]
fn half_a_client_identity_is_an_error() {
    let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {client-certificate-data: Q0VSVA==}}]
"#;
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(m.contains("no client key"), "{m}");
}

#[test]
fn bad_key_data_does_not_echo_it() {
    let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {client-certificate-data: Q0VSVA==, client-key-data: "not*base64*SECRET"}}]
"#;
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(m.contains("client-key-data is not valid base64"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");
}

#[test]
fn missing_server_and_missing_user_entry() {
    let cfg = "current-context: c\nclusters: [{name: c, cluster: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n";
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(m.contains("cluster \"c\" has no server"), "{m}");
    let cfg = "current-context: c\nclusters: [{name: c, cluster: {server: 'https://k'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n";
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(m.contains("user \"u\" (of context \"c\") not found"), "{m}");
}

#[test]
fn no_current_context() {
    let cfg = "clusters: []\ncontexts: [{name: a, context: {cluster: a}}]\n";
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(
        m.contains("no current-context") && m.contains("--context") && m.contains("a"),
        "{m}"
    );
}

#[test]
fn token_and_basic_together_is_an_error() {
    let cfg = r#"
current-context: c
clusters: [{name: c, cluster: {server: "https://k:6443"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t0k3n, username: a, password: p4ss}}]
"#;
    let m = parse(cfg, &p(), None).unwrap_err().to_string();
    assert!(m.contains("both a token and a username/password"), "{m}");
    assert!(!m.contains("t0k3n") && !m.contains("p4ss"), "{m}");
}

/// The issue's case: a.yaml holds the cluster and the user, b.yaml the context and
/// current-context. kubectl answers `stub`; so must we, with a.yaml's entries.
#[test]
fn a_list_is_merged_first_file_wins() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("certs");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("ca.crt"), "CA-OF-A").unwrap();
    let a = sub.join("a.yaml");
    std::fs::write(
        &a,
        "clusters: [{name: stub, cluster: {server: 'https://a:6443', certificate-authority: ca.crt}}]\nusers: [{name: u, user: {token: from-a}}]\ncurrent-context: ''\n",
    )
    .unwrap();
    let b = dir.path().join("b.yaml");
    std::fs::write(
        &b,
        "current-context: stub\ncontexts: [{name: stub, context: {cluster: stub, user: u}}]\nclusters: [{name: stub, cluster: {server: 'https://b:6443'}}]\nusers: [{name: u, user: {token: from-b}}]\n",
    )
    .unwrap();
    let missing = dir.path().join("missing.yaml");
    let list = std::env::join_paths([&a, &missing, &b]).unwrap();
    let files = locate(None, Some(&list), None).unwrap();
    assert_eq!(files.origin, Origin::Env);
    let merged = read(&files).unwrap();
    assert_eq!(merged.current_context(), Some("stub"));
    let k = merged.select(None).unwrap();
    assert_eq!(k.server, "https://a:6443");
    assert_eq!(k.credentials, Credentials::Bearer(Secret::new("from-a")));
    // a.yaml's relative CA, resolved against a.yaml's directory, not b.yaml's.
    assert_eq!(k.ca_pem.as_deref(), Some(&b"CA-OF-A"[..]));
    assert_eq!(k.kubeconfig, files.display());
    assert!(k.kubeconfig.contains("a.yaml") && k.kubeconfig.contains("b.yaml"));
}

#[test]
fn locate_order() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    std::fs::write(home.join(".kube/config"), "x").unwrap();
    let a = dir.path().join("a.yaml");
    let b = dir.path().join("b.yaml");
    std::fs::write(&b, "x").unwrap();

    // --kubeconfig wins, and must exist.
    assert_eq!(locate(Some(&b), None, Some(&home)).unwrap(), Files::one(&b));
    let e = locate(Some(&a), None, Some(&home)).unwrap_err().to_string();
    assert!(e.contains("--kubeconfig") && e.contains("a.yaml"), "{e}");
    // $KUBECONFIG: the whole list, as long as one of them exists.
    let list = std::env::join_paths([&a, &b]).unwrap();
    let f = locate(None, Some(&list), Some(&home)).unwrap();
    assert_eq!(f.paths, [a.clone(), b.clone()]);
    assert_eq!(f.env_value().as_deref(), Some(list.as_os_str()));
    let only_a = std::env::join_paths([&a]).unwrap();
    let e = locate(None, Some(&only_a), Some(&home))
        .unwrap_err()
        .to_string();
    assert!(e.contains("KUBECONFIG=") && e.contains("a.yaml"), "{e}");
    // Else ~/.kube/config.
    assert_eq!(
        locate(None, None, Some(&home)).unwrap().paths,
        [home.join(".kube/config")]
    );
    assert_eq!(
        locate(None, Some(OsStr::new("")), Some(&home))
            .unwrap()
            .origin,
        Origin::Default
    );
    let e = locate(None, None, Some(dir.path()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no kubeconfig found") && e.contains("--no-install"),
        "{e}"
    );
}

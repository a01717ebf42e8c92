use super::*;
use crate::cluster::test_server::{cfg, serve};
use koord_base::secret::Secret;
use std::net::TcpListener;

#[tokio::test]
async fn ok_404_and_no_credentials_over_plain_http() {
    let (url, seen) = serve(
        "200 OK",
        r#"{"major":"1","minor":"29","gitVersion":"v1.29.2"}"#,
    );
    let c = KubeClient::new(&cfg(
        url.clone() + "/",
        Credentials::Bearer(Secret::new("tok-123")),
    ))
    .unwrap();
    assert!(c.credentials_withheld().unwrap().contains("plain http://"));
    let v = c.get_json("/version").await.unwrap().unwrap();
    assert_eq!(v["gitVersion"], "v1.29.2");
    let head = seen.lock().unwrap()[0].clone();
    assert!(head.starts_with("GET /version HTTP/1.1"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("authorization"),
        "no credentials over plain HTTP: {head}"
    );

    let (url, _) = serve(
        "404 Not Found",
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"namespaces"},"code":404}"#,
    );
    let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
    assert!(c.credentials_withheld().is_none());
    assert!(c.get_json("/api/v1/namespaces/x").await.unwrap().is_none());
}

#[tokio::test]
async fn withheld_basic_credentials_explain_a_401() {
    let (url, seen) = serve("401 Unauthorized", "{}");
    let c = KubeClient::new(&cfg(
        url.clone(),
        Credentials::Basic {
            username: "admin".into(),
            password: Secret::new("pw"),
        },
    ))
    .unwrap();
    let e = c.get_json("/version").await.unwrap_err();
    assert!(
        matches!(e, ClusterError::CredentialsWithheld { .. }),
        "{e:?}"
    );
    let m = e.to_string();
    assert!(
        m.contains("were not sent") && m.contains("https://") && m.contains(&url),
        "{m}"
    );
    let head = seen.lock().unwrap()[0].to_ascii_lowercase();
    assert!(!head.contains("authorization"), "{head}");
}

#[tokio::test]
async fn unauthorized_and_forbidden_name_user_and_resource() {
    let (url, _) = serve(
        "401 Unauthorized",
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#,
    );
    let c = KubeClient::new(&cfg(url.clone(), Credentials::None)).unwrap();
    let e = c.get_json("/api/v1/nodes").await.unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, ClusterError::Unauthorized { .. }));
    assert!(
        m.contains("ci-bot") && m.contains("/api/v1/nodes") && m.contains(&url),
        "{m}"
    );
    assert!(!m.contains("expired-tok"), "{m}");

    let (url, _) = serve(
        "403 Forbidden",
        r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"nodes is forbidden: User \"system:serviceaccount:default:ci\" cannot list resource \"nodes\" in API group \"\" at the cluster scope","reason":"Forbidden","details":{"kind":"nodes"},"code":403}"#,
    );
    let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
    let m = c.get_json("/api/v1/nodes").await.unwrap_err().to_string();
    assert!(
        m.contains("403 Forbidden") && m.contains("ci-bot") && m.contains("/api/v1/nodes"),
        "{m}"
    );
    assert!(
        m.contains("cannot list resource \\\"nodes\\\"")
            || m.contains("cannot list resource \"nodes\""),
        "{m}"
    );
}

#[tokio::test]
async fn unreachable_names_the_server() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("https://127.0.0.1:{port}");
    let c = KubeClient::new(&cfg(server.clone(), Credentials::None)).unwrap();
    let m = c.get_json("/version").await.unwrap_err().to_string();
    assert!(
        m.contains("no cluster reachable at") && m.contains(&server),
        "{m}"
    );
}

#[tokio::test]
async fn non_json_answer_is_reported() {
    let (url, _) = serve("200 OK", "<html>login</html>");
    let c = KubeClient::new(&cfg(url, Credentials::None)).unwrap();
    let m = c.get_json("/version").await.unwrap_err().to_string();
    assert!(m.contains("not JSON") && m.contains("/version"), "{m}");
}

#[tokio::test]
async fn bad_ca_and_identity_are_setup_errors_without_key_material() {
    let mut k = cfg("https://k:6443".into(), Credentials::None);
    k.ca_pem = Some(b"not a pem".to_vec());
    let m = KubeClient::new(&k).unwrap_err().to_string();
    assert!(
        m.contains("holds no PEM certificate") && m.contains("https://k:6443"),
        "{m}"
    );

    let mut k = cfg("https://k:6443".into(), Credentials::None);
    k.client_identity = Some(crate::cluster::ClientIdentity {
        certificate_pem: b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
        key_pem: koord_base::secret::SecretBytes::new(
            b"-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----\n".to_vec(),
        ),
    });
    match KubeClient::new(&k) {
        Ok(_) => {} // rustls may only reject the pair at handshake time
        Err(e) => {
            let m = e.to_string();
            assert!(!m.contains("U0VDUkVU"), "{m}");
        }
    }
}

#[tokio::test]
async fn debug_has_no_token() {
    let c = KubeClient::new(&cfg(
        "https://k:6443".into(),
        Credentials::Bearer(Secret::new("tok-xyz")),
    ))
    .unwrap();
    assert!(!format!("{c:?}").contains("tok-xyz"));
}

#[test]
fn status_message_falls_back_to_text() {
    assert_eq!(
        status_message(br#"{"kind":"Status","message":"boom"}"#).as_deref(),
        Some("boom")
    );
    assert_eq!(
        status_message(b"404 page not found\n").as_deref(),
        Some("404 page not found")
    );
    assert_eq!(status_message(b"").as_deref(), None);
}

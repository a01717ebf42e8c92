//! A one-shot HTTP server and a kubeconfig pointing at it, for the unit tests of the API client
//! and of the lists (one place, so that neither test module uses the other's module).

use crate::cluster::{Credentials, Kubeconfig};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// A kubeconfig for `server` with `credentials`, plain names.
pub(crate) fn cfg(server: String, credentials: Credentials) -> Kubeconfig {
    Kubeconfig {
        kubeconfig: "/tmp/kc".into(),
        context: "ctx".into(),
        cluster: "c".into(),
        user: "ci-bot".into(),
        namespace: None,
        server,
        ca_pem: None,
        insecure_skip_tls_verify: false,
        tls_server_name: None,
        proxy_url: None,
        credentials,
        client_identity: None,
        impersonation: Default::default(),
    }
}

/// One-shot HTTP server: answers each connection with `status` and `body`, records the
/// request heads.
pub(crate) fn serve(status: &'static str, body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten().take(8) {
            let mut c = c;
            let mut buf = [0u8; 4096];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            s2.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).to_string());
            let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    });
    (url, seen)
}

//! Issue 10 item 3 and the chart-repository half of item 2, through the binary: every YAML the
//! tool reads is bounded (depth, nodes, size) whatever its source, and the Helm repository
//! fetch stops at its cap while reading. Each hostile input used to run for minutes (or grow
//! without bound); each must now be refused with a message naming the input.

use crate::common::{assert_fails, output_within, Home};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `a: it's` hid the brackets below it from the old guard, which took any `'` for the start
/// of a quoted scalar.
fn walk_around(levels: usize) -> Vec<u8> {
    let mut v = b"walk: it's\nb: ".to_vec();
    v.extend(std::iter::repeat_n(b'[', levels));
    v.push(b'\n');
    v
}

const CHART_YAML: &[u8] = b"apiVersion: v2\nname: koordinator\nversion: 9.9.9\n";

use crate::common::chart_tgz as tgz;

/// Run, and fail (killing it) if it has not finished after two minutes: before the bound these
/// inputs took minutes, and a test must fail then rather than hang. Not a timing assertion on
/// anything that works.
fn run_bounded(cmd: Command) -> std::process::Output {
    output_within(
        cmd,
        Duration::from_secs(120),
        "the build to end (the YAML input is bounded)",
    )
}

fn build_chart(h: &Home, chart: &Path, extra: &[&str]) -> std::process::Output {
    let helm = crate::common::env().helm3.to_str().unwrap();
    let mut c = h.cmd(&[
        "build",
        "--chart",
        chart.to_str().unwrap(),
        "--dry-run",
        "--helm",
        helm,
    ]);
    c.args(extra);
    run_bounded(c)
}

#[test]
fn regression_values_yaml_in_a_chart_is_bounded() {
    let h = Home::new();
    let chart = h.path().join("values-deep.tgz");
    tgz(
        &chart,
        &[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", &walk_around(300_000)),
        ],
    );
    let o = build_chart(&h, &chart, &[]);
    assert_fails(
        &o,
        1,
        &["values.yaml", "line 2", "nested deeper than 100 levels"],
    );
}

#[test]
fn regression_chart_yaml_is_bounded() {
    let h = Home::new();
    let chart = h.path().join("chart-deep.tgz");
    let mut meta = CHART_YAML.to_vec();
    meta.extend(walk_around(300_000));
    tgz(&chart, &[("Chart.yaml", &meta)]);
    let o = build_chart(&h, &chart, &[]);
    assert_fails(&o, 1, &["Chart.yaml", "nested deeper than 100 levels"]);
}

#[test]
fn regression_crd_template_is_bounded() {
    let h = Home::new();
    let chart = h.path().join("crd-deep.tgz");
    let mut crd = b"apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: it's\nspec: "
        .to_vec();
    crd.extend(std::iter::repeat_n(b'[', 300_000));
    tgz(
        &chart,
        &[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", b"{}\n"),
            ("templates/crd/x.yaml", &crd),
        ],
    );
    let o = build_chart(&h, &chart, &[]);
    assert_fails(
        &o,
        1,
        &[
            "CRD file templates/crd/x.yaml",
            "nested deeper than 100 levels",
        ],
    );
}

#[test]
fn regression_values_file_is_bounded() {
    let h = Home::new();
    let deep = h.path().join("deep.yaml");
    let mut v = b"a: ".to_vec();
    v.extend(std::iter::repeat_n(b'[', 200_000));
    std::fs::write(&deep, v).unwrap();
    let chart = crate::common::fixtures().join("koordinator-1.8.0.tgz");
    let o = build_chart(&h, &chart, &["--values", deep.to_str().unwrap()]);
    assert_fails(
        &o,
        1,
        &["values file", "deep.yaml", "nested deeper than 100 levels"],
    );
    // An alias bomb is counted as what it expands to.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [{}]\n",
            vec![format!("*a{p}"); 10].join(", ")
        ));
    }
    std::fs::write(&deep, bomb).unwrap();
    let o = build_chart(&h, &chart, &["--values", deep.to_str().unwrap()]);
    assert_fails(&o, 1, &["deep.yaml", "YAML nodes (aliases expanded)"]);
}

#[test]
fn regression_repository_index_is_bounded() {
    let h = Home::new();
    let repo = h.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let mut index = b"apiVersion: v1\ngenerated: it's\nserverInfo: ".to_vec();
    index.extend(std::iter::repeat_n(b'[', 600_000));
    std::fs::write(repo.join("index.yaml"), index).unwrap();
    let c = h.cmd(&[
        "build",
        "1.8.0",
        "--repo",
        repo.to_str().unwrap(),
        "--dry-run",
        "--helm",
        crate::common::env().helm3.to_str().unwrap(),
    ]);
    let o = run_bounded(c);
    assert_fails(&o, 1, &["index.yaml", "nested deeper than 100 levels"]);
}

/// A chart repository that answers `index.yaml` with an endless chunked body (valid YAML,
/// so only the size cap can stop it). Serves one request; stops by itself after 512 MiB.
fn endless_index_server() -> (String, std::thread::JoinHandle<u64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return 0;
        };
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/yaml\r\nTransfer-Encoding: chunked\r\n\r\n";
        if s.write_all(head.as_bytes()).is_err() {
            return 0;
        }
        let mut chunk = String::from("apiVersion: v1\ngenerated:\n");
        let line = "- some generated text that goes on and on\n";
        while chunk.len() < 64 * 1024 {
            chunk.push_str(line);
        }
        let mut sent = 0u64;
        let mut first = true;
        while sent < 512 * 1024 * 1024 {
            let body = if first {
                first = false;
                chunk.clone()
            } else {
                chunk.replacen("apiVersion: v1\ngenerated:\n", "", 1)
            };
            let framed = format!("{:x}\r\n{body}\r\n", body.len());
            if s.write_all(framed.as_bytes()).is_err() {
                break; // the client stopped reading
            }
            sent += body.len() as u64;
        }
        sent
    });
    (format!("http://{addr}/"), handle)
}

#[test]
fn regression_endless_chunked_index_stops_at_its_cap() {
    let h = Home::new();
    let (url, server) = endless_index_server();
    let helm = crate::common::env().helm3.to_str().unwrap();
    let c = h.cmd(&[
        "build",
        "1.8.0",
        "--repo",
        &url,
        "--dry-run",
        "--helm",
        helm,
    ]);
    let o = run_bounded(c);
    assert_fails(
        &o,
        1,
        &["index.yaml", "larger than the 134217728 bytes allowed"],
    );
    let sent = server.join().unwrap();
    assert!(
        sent < 512 * 1024 * 1024,
        "the client read the whole endless body ({sent} bytes)"
    );
}

//! Compare `koord_base::yaml` (libyaml guard + serde_yaml_ng) with serde-saphyr 2.2.0 budgets.
//!
//! Usage: yaml-budgets <case> [data dir]   (cases: see `main`; the data directory, holding
//! `koordinator/` and `index.upstream.yaml`, defaults to $YAML_BUDGETS_DATA, then `data`)
//! Every timing is the median of RUNS runs (release build).

#![allow(dead_code)]
// A benchmark printing its tables to stdout: the repository's clippy.toml refuses println!
// for koord-bundle's commands (terminal-safe printer), which this tool is not.
#![allow(clippy::disallowed_macros)]

mod granit_guard;
mod saphyr;
use koord_base::yaml;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_yaml_ng::Value;
use yaml::{Limits, YamlError};

fn runs() -> usize {
    std::env::var("RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn median<R>(mut f: impl FnMut() -> R) -> (Duration, R) {
    let n = runs();
    let mut times = Vec::with_capacity(n);
    let mut last = None;
    for _ in 0..n {
        let t = Instant::now();
        let r = f();
        times.push(t.elapsed());
        last = Some(r);
    }
    times.sort();
    (times[n / 2], last.expect("ran"))
}

fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1000.0;
    if v < 1.0 {
        format!("{:.3} ms", v)
    } else {
        format!("{:.1} ms", v)
    }
}

fn short(s: &str) -> String {
    let s = s.replace('\n', " ⏎ ");
    if s.chars().count() > 220 {
        format!("{}…", s.chars().take(220).collect::<String>())
    } else {
        s
    }
}

fn outcome<T>(r: &Result<T, YamlError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("REFUSED: {}", short(&e.to_string())),
    }
}

fn row(case: &str, approach: &str, d: Duration, what: &str) {
    println!("| {case} | {approach} | {} | {what} |", ms(d));
}

/// First path where two values differ.
fn diff(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            if x.len() != y.len() {
                return Some(format!("{path}: {} vs {} keys", x.len(), y.len()));
            }
            for ((ka, va), (kb, vb)) in x.iter().zip(y.iter()) {
                if ka != kb {
                    return Some(format!("{path}: key order/value {ka:?} vs {kb:?}"));
                }
                let k = match ka {
                    Value::String(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                if let Some(d) = diff(va, vb, &format!("{path}.{k}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Sequence(x), Value::Sequence(y)) => {
            if x.len() != y.len() {
                return Some(format!("{path}: {} vs {} items", x.len(), y.len()));
            }
            x.iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (p, q))| diff(p, q, &format!("{path}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: {a:?} vs {b:?}")),
    }
}

fn json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<not JSON: {e}>"))
}

/// Template directives on their own line dropped, a glued trailing `{{- end }}` cut.
fn strip_template(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("{{") && t.ends_with("}}") {
            continue;
        }
        let line = line.strip_suffix("{{- end }}").unwrap_or(line);
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("dir").flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            out.push(p);
        }
    }
}

enum Mode {
    One(Limits),
    Stream(Limits),
}

fn compare(
    case: &str,
    text: &[u8],
    mode: &Mode,
    show: bool,
) -> (Duration, Duration, Duration, bool, String) {
    let (tc, rc) = match mode {
        Mode::One(l) => {
            let (t, r) = median(|| granit_guard::parse_value(case, text, l));
            (t, r.map(|v| vec![v]))
        }
        Mode::Stream(l) => median(|| granit_guard::parse_documents(case, text, l)),
    };
    let (tg, rg, ts, rs, tn) = match mode {
        Mode::One(l) => {
            let (tg, rg) = median(|| yaml::parse_value(case, text, l));
            let (ts, rs) = median(|| saphyr::parse_value(case, text, l));
            #[allow(clippy::disallowed_methods)]
            let (tn, _) = median(|| serde_yaml_ng::from_slice::<Value>(text).ok());
            (tg, rg.map(|v| vec![v]), ts, rs.map(|v| vec![v]), tn)
        }
        Mode::Stream(l) => {
            let (tg, rg) = median(|| yaml::parse_documents(case, text, l));
            let (ts, rs) = median(|| saphyr::parse_documents(case, text, l));
            let (tn, _) = median(|| {
                use serde::Deserialize as _;
                let s = std::str::from_utf8(text).unwrap();
                serde_yaml_ng::Deserializer::from_str(s)
                    .map(|d| Value::deserialize(d).ok())
                    .collect::<Vec<_>>()
            });
            (tg, rg, ts, rs, tn)
        }
    };
    let c_same = match (&rs, &rc) {
        (Ok(a), Ok(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| json(x) == json(y)),
        (Err(_), Err(_)) => true,
        _ => false,
    };
    C_ROWS.with(|c| c.borrow_mut().push((case.to_string(), tc, c_same)));
    let (same, note) = match (&rg, &rs) {
        (Ok(a), Ok(b)) => {
            if a.len() != b.len() {
                (false, format!("{} vs {} documents", a.len(), b.len()))
            } else {
                let mut note = String::new();
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    if json(x) != json(y) {
                        note = format!(
                            "doc {}: {}",
                            i + 1,
                            diff(x, y, "").unwrap_or_else(|| "JSON differs (order?)".into())
                        );
                        break;
                    }
                }
                (
                    note.is_empty(),
                    if note.is_empty() {
                        "same JSON".into()
                    } else {
                        note
                    },
                )
            }
        }
        (Err(a), Err(b)) => (
            true,
            format!(
                "both refused: [{}] / [{}]",
                short(&a.to_string()),
                short(&b.to_string())
            ),
        ),
        (Ok(_), Err(b)) => (
            false,
            format!("only saphyr refused: {}", short(&b.to_string())),
        ),
        (Err(a), Ok(_)) => (
            false,
            format!("only guard+ng refused: {}", short(&a.to_string())),
        ),
    };
    if show {
        row(case, "guard+ng", tg, &outcome(&rg));
        row(case, "saphyr", ts, &outcome(&rs));
        row(case, "ng alone (no guard)", tn, "");
        row(
            case,
            "granit guard + saphyr (option C)",
            tc,
            &format!("{} (same as saphyr: {c_same})", outcome(&rc)),
        );
        println!("|   | equal? | | {note} |");
    }
    (tg, ts, tn, same, note)
}

thread_local! {
    static C_ROWS: std::cell::RefCell<Vec<(String, Duration, bool)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn real(data: &Path) {
    let chart = data.join("koordinator");
    let mut files = Vec::new();
    yaml_files(&chart, &mut files);
    files.push(data.join("index.upstream.yaml"));
    // Warm-up pass (page cache, allocator), not reported.
    for f in &files {
        let t = strip_template(&std::fs::read_to_string(f).expect("read"));
        let _ = yaml::parse_documents("w", t.as_bytes(), &yaml::MANIFESTS);
        let _ = saphyr::parse_documents("w", t.as_bytes(), &yaml::MANIFESTS);
    }
    let (mut sg, mut ss, mut sn) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut n = 0;
    let mut bytes = 0;
    println!("| file | bytes | guard+ng | saphyr | ng alone | comparison |");
    println!("|---|---|---|---|---|---|");
    for f in &files {
        let rel = f.strip_prefix(data).unwrap().display().to_string();
        let raw = std::fs::read_to_string(f).expect("read");
        let is_template = rel.contains("/templates/");
        let text = if is_template {
            strip_template(&raw)
        } else {
            raw.clone()
        };
        let mode = if rel.contains("/crd/") {
            Mode::One(yaml::CRD)
        } else if is_template {
            Mode::Stream(yaml::MANIFESTS)
        } else if rel.ends_with("Chart.yaml") {
            Mode::One(yaml::CHART_YAML)
        } else if rel.ends_with("index.upstream.yaml") {
            Mode::One(yaml::INDEX)
        } else {
            Mode::One(yaml::VALUES)
        };
        let (tg, ts, tn, same, note) = compare(&rel, text.as_bytes(), &mode, false);
        if !note.starts_with("both refused") {
            sg += tg;
            ss += ts;
            sn += tn;
            n += 1;
            bytes += text.len();
        }
        println!(
            "| {rel}{} | {} | {} | {} | {} | {}{} |",
            if is_template { " (stripped)" } else { "" },
            text.len(),
            ms(tg),
            ms(ts),
            ms(tn),
            if same { "" } else { "**DIFF** " },
            note
        );
    }
    println!(
        "| TOTAL {n} parsed files | {bytes} | {} | {} | {} | |",
        ms(sg),
        ms(ss),
        ms(sn)
    );
    C_ROWS.with(|c| {
        let c = c.borrow();
        let total: Duration = c.iter().map(|r| r.1).sum();
        let all_same = c.iter().all(|r| r.2);
        let big = c.iter().filter(|r| r.0.contains("nodeslos") || r.0.contains("values.yaml") || r.0.contains("index")).map(|r| format!("{} {}", r.0, ms(r.1))).collect::<Vec<_>>().join("; ");
        println!("option C (granit guard + saphyr): total {} over {} files, same values as saphyr: {all_same}; {big}", ms(total), c.len());
    });
}

fn refusal(case: &str, text: &[u8], l: &Limits) {
    println!("case {case}: {} bytes", text.len());
    let (tg, rg) = median(|| yaml::parse_value(case, text, l));
    row(case, "guard+ng parse_value", tg, &outcome(&rg));
    let (tc, rc) = median(|| yaml::check(case, text, l));
    row(case, "guard only (yaml::check)", tc, &outcome(&rc));
    let (ts, rs) = median(|| saphyr::parse_value(case, text, l));
    row(case, "saphyr parse_value (Budget)", ts, &outcome(&rs));
    let (tk, rk) = median(|| saphyr::check(case, text, l));
    row(case, "saphyr check (IgnoredAny)", tk, &outcome(&rk));
    let s = std::str::from_utf8(text).unwrap();
    let (tq, rq) = median(|| granit_guard::parse_value(case, text, l));
    row(case, "granit guard + saphyr (option C)", tq, &outcome(&rq));
    let (tb, rb) = median(|| saphyr::budget_scan(s, l));
    row(
        case,
        "saphyr check_yaml_budget (no replay)",
        tb,
        &format!("{rb:?}"),
    );
}

fn deep_flow(prefix: &str, n: usize) -> Vec<u8> {
    let mut t = prefix.as_bytes().to_vec();
    t.extend(std::iter::repeat_n(b'[', n));
    t
}

fn bomb() -> Vec<u8> {
    let mut s = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let refs = vec![format!("*{}", w[0]); 9].join(", ");
        s.push_str(&format!("{}: &{} [{}]\n", w[1], w[1], refs));
    }
    s.into_bytes()
}

/// A values.yaml-like document of about `target` bytes: many components, each with
/// images, resources, env lists, nested feature maps, quoted strings, comments.
fn values_like(target: usize) -> Vec<u8> {
    let mut s = String::from("# generated values-like file\nimageRepositoryHost: registry.example.com\ninstallation:\n  namespace: koordinator-system\n  roleListGroups:\n    - '*'\n");
    let mut i = 0;
    while s.len() < target {
        s.push_str(&format!(
            "component{i}:\n  enabled: true\n  replicas: {r}\n  image:\n    repository: koordinator-sh/component-{i}\n    tag: \"v1.{i}.0\"\n    pullPolicy: IfNotPresent\n  resources:\n    limits:\n      cpu: 1000m\n      memory: 1Gi\n    requests:\n      cpu: 500m\n      memory: 256Mi\n  # feature gates of component {i}\n  featureGates: \"A=true,B=false,C{i}=true\"\n  env:\n    - name: LOG_LEVEL\n      value: \"4\"\n    - name: SOME_RATIO\n      value: '0.{r}'\n  nodeSelector: {{}}\n  tolerations: []\n  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n          - matchExpressions:\n              - key: node-role.kubernetes.io/worker-{i}\n                operator: In\n                values: [\"true\", \"yes\"]\n  config: |\n    line one of {i}\n    line two: with: colons\n  ports: [{p}, {q}]\n  threshold: 1.5e3\n",
            r = i % 7 + 1,
            p = 8000 + i,
            q = 9000 + i
        ));
        i += 1;
    }
    s.into_bytes()
}

fn crd_stream(data: &Path, times: usize) -> Vec<u8> {
    let mut files = Vec::new();
    yaml_files(&data.join("koordinator/templates/crd"), &mut files);
    let mut s = String::new();
    for _ in 0..times {
        for f in &files {
            let t = strip_template(&std::fs::read_to_string(f).unwrap());
            let t = t.trim_start().strip_prefix("---").unwrap_or(&t).to_string();
            s.push_str("---\n");
            s.push_str(t.trim_start_matches('\n'));
        }
    }
    s.into_bytes()
}

fn probes() {
    let cases: &[(&str, &str)] = &[
        ("yes", "a: yes\n"),
        ("on/off/y/n", "a: [on, off, y, n, Yes, NO]\n"),
        ("True/TRUE", "a: [True, TRUE, tRuE]\n"),
        ("0777", "a: 0777\n"),
        ("0o17/0x1F/0X1F/0b101", "a: [0o17, 0x1F, 0X1F, 0b101]\n"),
        ("+12/-0/007", "a: [+12, -0, 007, 08]\n"),
        ("1_000", "a: 1_000\n"),
        ("sexagesimal 1:30", "a: 1:30\n"),
        ("2^63", "a: [9223372036854775808, -9223372036854775808]\n"),
        ("-0.0/+.inf/-.nan", "a: [-0.0, +.inf, -.nan]\n"),
        ("1e3/1.5E+3/.5", "a: [1e3, 1.5E+3, .5, 1.]\n"),
        ("2^64", "a: [18446744073709551616, -9223372036854775809]\n"),
        ("~/null/empty", "a: ~\nb: null\nc:\nd: Null\ne: NULL\n"),
        (".inf/.nan", "a: [.inf, -.Inf, .NaN, 1e999]\n"),
        (
            "timestamp",
            "a: 2001-12-14t21:59:43.10-05:00\nb: 2002-12-14\n",
        ),
        (
            "merge <<",
            "base: &b {x: 1, y: 2}\nm:\n  y: 0\n  <<: *b\n  z: 3\n",
        ),
        ("quoted '<<'", "m:\n  '<<': {x: 1}\n"),
        ("!!binary", "a: !!binary aGVsbG8=\n"),
        ("!!binary invalid utf8", "a: !!binary /w==\n"),
        ("!!str 1", "a: !!str 1\nb: !!int \"2\"\nc: !!float 3\n"),
        ("custom !foo", "a: !foo bar\nb: !foo {x: 1}\nc: !foo [1]\n"),
        ("!!set/!!omap", "a: !!set {x, y}\nb: !!omap [{x: 1}]\n"),
        ("duplicate key", "a: 1\na: 2\n"),
        ("dup int keys 0xB/11", "0xB: 1\n11: 2\n"),
        ("non-string keys", "1: a\ntrue: b\n~: c\n1.5: d\n"),
        ("complex key", "? [a, b]\n: c\n"),
        ("empty input", ""),
        ("comment only", "# nothing\n"),
        ("explicit empty doc", "---\n"),
        ("two docs to parse_value", "a: 1\n---\nb: 2\n"),
        ("BOM", "\u{feff}a: 1\n"),
        ("tab indentation", "a:\n\tb: 1\n"),
        ("long key > 1024", &format!("{}: 1\n", "k".repeat(1100))),
        ("unknown alias", "a: *nope\n"),
        ("recursive alias", "a: &a [*a]\n"),
        ("flow under-indented", "a: [\n1,\n2\n]\n"),
        ("helm glued end", "a: b{{- end }}\n"),
        ("template line", "{{- if .Values.x }}\na: 1\n{{- end }}\n"),
        ("%YAML 1.1 directive", "%YAML 1.1\n---\na: yes\n"),
        ("anchor on key", "&k a: 1\nb: *k\n"),
        ("trailing garbage", "a: 1\n]\n"),
        ("C1/escape in scalar", "a: \"\\x1b[31mred\"\n"),
    ];
    println!("| probe | input | serde_yaml_ng (guard) | serde-saphyr (study Options) | serde-saphyr defaults |");
    println!("|---|---|---|---|---|");
    for (name, text) in cases {
        let g = match yaml::parse_value("p", text.as_bytes(), &yaml::VALUES) {
            Ok(v) => short(&format!("{v:?}")),
            Err(e) => format!("ERR {}", short(&e.reason())),
        };
        let s = match saphyr::probe(text) {
            Ok(v) => short(&format!("{v:?}")),
            Err(e) => format!("ERR {}", short(&e)),
        };
        let d = match saphyr::probe_defaults(text) {
            Ok(v) => short(&format!("{v:?}")),
            Err(e) => format!("ERR {}", short(&e)),
        };
        let mark = if g == s { "" } else { "**≠** " };
        println!(
            "| {mark}{name} | `{}` | {g} | {s} | {d} |",
            short(&text.escape_debug().to_string())
        );
    }
}

/// A typed target, like kubeconfig's: null into String, etc.
fn typed_probe() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct T {
        name: Option<String>,
        s: String,
        n: Option<u16>,
        b: Option<bool>,
    }
    for text in [
        "s:\n",
        "s: ~\n",
        "s: 0777\nn: 0x10\nb: yes\n",
        "s: x\nunknown: 1\n",
        "s: x\nb: on\n",
    ] {
        let g: Result<T, _> = yaml::parse("t", text.as_bytes(), &yaml::KUBECONFIG);
        let o = saphyr::options(&yaml::KUBECONFIG, 1);
        let s: Result<T, _> = serde_saphyr::from_str_with_options(text, o);
        println!(
            "| typed `{}` | {} | {} |",
            text.escape_debug(),
            g.map(|v| format!("{v:?}"))
                .unwrap_or_else(|e| format!("ERR {}", e.reason())),
            s.map(|v| format!("{v:?}"))
                .unwrap_or_else(|e| format!("ERR {}", short(&e.to_string())))
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map(String::as_str).unwrap_or("all");
    let data = args
        .get(2)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("YAML_BUDGETS_DATA").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("data"));
    match case {
        "real" => real(&data),
        "index" => {
            let t = std::fs::read(data.join("index.upstream.yaml")).unwrap();
            compare("index.upstream.yaml", &t, &Mode::One(yaml::INDEX), true);
            refusal("index.upstream.yaml (scan only)", &t, &yaml::INDEX);
        }
        "flow300k" => refusal("300000 [", &deep_flow("", 300_000), &yaml::VALUES),
        "quote" => refusal(
            "a: it's + 300000 [",
            &deep_flow("a: it's\nb: ", 300_000),
            &yaml::VALUES,
        ),
        "block10k" => {
            let mut t = b"a:\n".to_vec();
            t.extend("- ".repeat(10_000).as_bytes());
            t.extend(b"x\n");
            refusal("block - ×10000", &t, &yaml::VALUES)
        }
        "blockmap" => {
            let mut s = String::new();
            for i in 0..2_000 {
                s.push_str(&" ".repeat(i));
                s.push_str("k:\n");
            }
            refusal("block mapping 2000 levels", s.as_bytes(), &yaml::VALUES)
        }
        "bomb" => refusal("billion laughs 9×9", &bomb(), &yaml::VALUES),
        // saphyr only, one source's limits: bomb:values | bomb:manifests | bomb:index
        c if c.starts_with("bomb:") => {
            let l = match &c[5..] {
                "chart" => yaml::CHART_YAML,
                "values" => yaml::VALUES,
                "manifests" => yaml::MANIFESTS,
                "index" => yaml::INDEX,
                _ => panic!("limits?"),
            };
            let t = bomb();
            let (d, r) = median(|| saphyr::parse_value(c, &t, &l));
            row(
                c,
                &format!("saphyr parse_value, max_nodes {}", l.max_nodes),
                d,
                &outcome(&r),
            );
            let (d, r) = median(|| yaml::parse_value(c, &t, &l));
            row(c, "guard+ng parse_value", d, &outcome(&r));
            let (d, r) = median(|| granit_guard::parse_value(c, &t, &l));
            row(c, "granit guard + saphyr (option C)", d, &outcome(&r));
        }
        "values200k" => {
            let t = values_like(200 * 1024);
            println!("values-like: {} bytes", t.len());
            compare("values 200 KB", &t, &Mode::One(yaml::VALUES), true);
        }
        "values2m" => {
            let t = values_like(2 * 1024 * 1024);
            println!("values-like: {} bytes", t.len());
            compare("values 2 MB", &t, &Mode::One(yaml::VALUES), true);
        }
        "stream" => {
            let t = crd_stream(&data, 1);
            println!("CRD stream: {} bytes", t.len());
            compare("13 CRDs ---", &t, &Mode::Stream(yaml::MANIFESTS), true);
        }
        "stream20" => {
            let t = crd_stream(&data, 20);
            println!("CRD stream ×20: {} bytes", t.len());
            compare("13 CRDs ×20 ---", &t, &Mode::Stream(yaml::MANIFESTS), true);
        }
        // yaml.rs's own unit-test inputs through the saphyr replacement.
        "unit" => {
            const SMALL: Limits = Limits {
                max_bytes: 1 << 20,
                max_depth: 10,
                max_nodes: 1000,
            };
            let inputs: &[(&str, &[u8])] = &[
                ("bomb 10x3", b"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"),
                ("deep alias", b"a: &a [[[[[[[[x]]]]]]]]\nb: [[[*a]]]\n"),
                ("block 11", b"a:\n - - - - - - - - - - - x\n"),
                ("block 8 ok", b"a:\n - - - - - - - x\n"),
                ("anchors ok", b"a: [1, {b: 'x'}]\nc: &x {d: 1}\ne: *x\n"),
                ("unterminated quote", b"a: \"x\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[\n"),
            ];
            for (n, t) in inputs {
                let g = yaml::parse_value(n, t, &SMALL);
                let s = saphyr::parse_value(n, t, &SMALL);
                let c = granit_guard::parse_value(n, t, &SMALL);
                println!(
                    "| {n} | {} | {} | {} |",
                    outcome(&g),
                    outcome(&s),
                    outcome(&c)
                );
            }
        }
        // Flow nesting just under the depth limit, then many tokens at the deepest level:
        // libyaml re-checks every open flow level per token (depth × tokens).
        c if c.starts_with("flowdense:") => {
            let mut it = c[10..].split(':');
            let mb: usize = it.next().unwrap().parse().unwrap();
            let depth: usize = it.next().map(|d| d.parse().unwrap()).unwrap_or(98);
            let mut t = b"a: ".to_vec();
            t.extend(std::iter::repeat_n(b'[', depth));
            while t.len() < mb * 1024 * 1024 - 200 {
                t.extend(b"x, ");
            }
            t.extend(b"x");
            t.extend(std::iter::repeat_n(b']', depth));
            t.push(b'\n');
            let l = Limits {
                max_nodes: 16_000_000,
                ..yaml::VALUES
            };
            println!("{} bytes, nodes ~{}", t.len(), t.len() / 3);
            compare(c, &t, &Mode::One(l), true);
        }
        // One mapping with N keys (duplicate-key bookkeeping; big index.yaml `entries`).
        c if c.starts_with("flatkeys:") => {
            let n: usize = c[9..].parse().unwrap();
            let mut s = String::new();
            for i in 0..n {
                s.push_str(&format!("key-{i}: value {i}\n"));
            }
            println!("{} bytes, {n} keys", s.len());
            compare(c, s.as_bytes(), &Mode::One(yaml::VALUES), true);
        }
        // What the post-renderer's JSON output (serde_json of the Value) makes of a custom tag.
        "tagjson" => {
            let t = b"a: !foo bar\nb: !!binary aGVsbG8=\n";
            let g = yaml::parse_value("t", t, &yaml::VALUES).unwrap();
            let s = saphyr::parse_value("t", t, &yaml::VALUES).unwrap();
            println!("guard+ng: {}\nsaphyr:   {}", json(&g), json(&s));
        }
        "probes" => {
            probes();
            typed_probe();
        }
        other => eprintln!("unknown case {other}"),
    }
}

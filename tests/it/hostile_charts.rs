//! Issue 17, through the binary: the hostile charts of the issue, each a few hundred bytes to
//! a few KB, which aborted `build` (exit 134) or ran for minutes in the built-in template
//! engine. helm renders every chart now, bounded (koord-kube's `helm.rs`: 120 s, 64 MiB of output, a
//! 4 GiB address space, its process group killed with it): each ends with exit 1 and a message
//! saying what happened, and nothing is written at the output path. The figures (time, peak
//! memory of koord-bundle and of helm, before and after) are in the issue's closing note, not
//! here: timings are no test's business.

use crate::common::{assert_fails, assert_ok, chart_tgz, output_within, Home};
use std::process::{Command, Output};
use std::time::Duration;

/// Run, and fail (killing it) if it has not finished after five minutes: a test must fail
/// rather than hang. Not a timing assertion on anything that works.
fn run_bounded(cmd: Command) -> Output {
    output_within(
        cmd,
        Duration::from_secs(300),
        "the build to end (helm is bounded)",
    )
}

const CHART_YAML: &[u8] = b"apiVersion: v2\nname: koordinator\nversion: 9.9.9\n";

/// `build --chart CHART --unsigned -o OUT` (a real build, not a dry run: the output would be
/// written if discovery let it through) in `h`, with `extra`.
fn build_chart(h: &Home, name: &str, values: &[u8], template: &[u8], extra: &[&str]) -> Output {
    build_chart_with(h, name, values, template, extra, |c| c)
}

/// [`build_chart`], its command changed by `wrap` first.
fn build_chart_with(
    h: &Home,
    name: &str,
    values: &[u8],
    template: &[u8],
    extra: &[&str],
    wrap: impl FnOnce(Command) -> Command,
) -> Output {
    let chart = h.path().join(format!("{name}.tgz"));
    chart_tgz(
        &chart,
        &[
            ("Chart.yaml", CHART_YAML),
            ("values.yaml", values),
            ("templates/x.yaml", template),
        ],
    );
    let out = h.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let cmd = h
        .build("")
        .chart(&chart)
        .out(&out.join("k.tar"))
        .arg("--unsigned")
        .args(extra)
        .cmd();
    run_bounded(wrap(cmd))
}

/// `cmd` run by `nice -n 19` (same arguments, environment and directory; nice execs it, so
/// its exit status is the command's).
fn niced(cmd: Command) -> Command {
    let mut n = Command::new("nice");
    n.arg("-n")
        .arg("19")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        n.current_dir(d);
    }
    n
}

/// Nothing at the output path, and nothing half-written next to it.
fn nothing_written(h: &Home) {
    let left: Vec<_> = std::fs::read_dir(h.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in the output directory: {left:?}");
}

/// No process of this home's is left running: helm and what it started are gone (helm's chart
/// is a file under the home's temporary directory, so its command line names the home).
fn nothing_left_running(h: &Home) {
    let home = h.path().to_string_lossy().to_string();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if cmdline.contains(&home) && !zombie {
            left.push(format!("{name}: {cmdline}"));
        }
    }
    assert!(left.is_empty(), "still running: {left:?}");
}

fn fails_with(o: &Output, needles: &[&str]) -> String {
    // Never an abort (134), a panic (101) or a signal: exit 1, the chart's fault.
    let err = assert_fails(o, 1, needles);
    assert!(
        err.contains("helm 3.17.3 could not render chart koordinator 9.9.9 (--chart "),
        "{err}"
    );
    err
}

/// The six charts of the issue.
#[test]
fn the_hostile_charts_of_the_issue_end_with_exit_1_and_a_message() {
    let h = Home::new();
    let helm_crashed = [
        "crashed (exit status: 2)",
        "fatal error: out of memory",
        "4 GiB",
    ];
    // `tpl` of a value that calls `tpl` on itself: the engine overflowed its stack; helm, with
    // no limit, grew to 11 GB before its own stack overflow.
    let o = build_chart(
        &h,
        "tpl",
        b"t: \"{{ tpl .Values.t . }}\"\n",
        b"{{ tpl .Values.t . }}\n",
        &[],
    );
    fails_with(&o, &helm_crashed);
    nothing_written(&h);
    // 20 000 nested `if` blocks: helm renders them (and refuses the output, which is no YAML).
    let mut t = b"{{ if true }}".repeat(20_000);
    t.extend_from_slice(b"x");
    t.extend(b"{{ end }}".repeat(20_000));
    let o = build_chart(&h, "ifs", b"{}\n", &t, &[]);
    fails_with(
        &o,
        &["helm template koordinator", "failed", "YAML parse error"],
    );
    nothing_written(&h);
    // `nindent 100000000000`: 100 GB asked for at once.
    let o = build_chart(
        &h,
        "nindent",
        b"{}\n",
        b"a: {{ nindent 100000000000 \"x\" }}\n",
        &[],
    );
    fails_with(&o, &helm_crashed);
    nothing_written(&h);
    // A string doubled forty times with printf.
    let mut t = b"{{ $s := \"ab\" }}".to_vec();
    t.extend(b"{{ $s = printf \"%s%s\" $s $s }}".repeat(40));
    t.extend_from_slice(b"a: {{ $s }}\n");
    let o = build_chart(&h, "doubling", b"{}\n", &t, &[]);
    fails_with(&o, &helm_crashed);
    nothing_written(&h);
    // 200 000 one-line actions (the engine took 55 s: its line numbers rescanned the file).
    let t = b"{{ \"x\" }}\n".repeat(200_000);
    let o = build_chart(&h, "actions", b"{}\n", &t, &[]);
    fails_with(
        &o,
        &["helm template koordinator", "failed", "YAML parse error"],
    );
    nothing_written(&h);
    // 10 000 nested parentheses: a chart helm renders as any other, so it is bundled.
    let mut t = b"kind: Pod\nspec:\n  containers:\n  - name: a\n    image: {{ ".to_vec();
    t.extend(b"(".repeat(10_000));
    t.extend_from_slice(b"\"koordinator-sh/koordlet:v1.8.0\"");
    t.extend(b")".repeat(10_000));
    t.extend_from_slice(b" }}\n");
    let o = build_chart(&h, "parens", b"{}\n", &t, &["--dry-run", "--json"]);
    assert_ok(&o);
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        plan["images"][0]["original"],
        "koordinator-sh/koordlet:v1.8.0"
    );
    nothing_left_running(&h);
}

/// helm's bounds themselves: a chart that renders without end is stopped at 120 s, one that
/// prints without end at 64 MiB (read with the cap); helm and everything it started are gone
/// after.
#[test]
fn a_chart_that_renders_or_prints_without_end_is_stopped() {
    let h = Home::new();
    // helm renders for the whole 120 s of its bound, on a core of its own: at the lowest
    // priority (nice 19, inherited by helm), so that the tests beside it keep both cores. The
    // bound is wall-clock time, so the test checks the same thing and takes as long.
    let o = build_chart_with(
        &h,
        "forever",
        b"{}\n",
        b"{{ range until 100000 }}{{ range until 100000 }}{{ end }}{{ end }}a: 1\n",
        &[],
        niced,
    );
    fails_with(
        &o,
        &[
            "helm template koordinator",
            "was stopped",
            "did not finish within 120 s",
        ],
    );
    nothing_written(&h);
    nothing_left_running(&h);
    let o = build_chart(
        &h,
        "big",
        b"{}\n",
        b"{{ range $i, $e := until 70000 }}k{{ $i }}: {{ printf \"%01000d\" 0 }}\n{{ end }}",
        &[],
    );
    fails_with(
        &o,
        &[
            "was stopped",
            "printed more than 67108864 bytes on its standard output",
        ],
    );
    nothing_written(&h);
    nothing_left_running(&h);
}

/// A `--set` nested 10 000 levels deep overflowed the stack of the former `--set` parser
/// (fuzz regression chart_archive-set-deep-keys): it goes to helm now, which refuses it.
#[test]
fn a_set_nested_ten_thousand_levels_deep_is_refused_by_helm() {
    let h = Home::new();
    let deep = format!("{}a=1", "a.".repeat(10_000));
    let chart = crate::common::fixtures().join("koordinator-1.8.0.tgz");
    let o = run_bounded(
        h.build("")
            .chart(&chart)
            .args(&["--dry-run", "--set", &deep])
            .cmd(),
    );
    assert_fails(
        &o,
        1,
        &[
            "helm template koordinator",
            "nested level is greater than maximum supported nested level of 30",
        ],
    );
}

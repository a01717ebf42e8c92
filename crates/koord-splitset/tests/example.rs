//! The example program of `examples/`, run as a user runs it (`cargo run --example`), so the
//! program the README points to keeps working.

#[path = "../examples/split_repair_join.rs"]
#[allow(dead_code)] // its `main`: the test calls `run`, as `main` does.
mod example;

#[test]
fn the_example_splits_repairs_and_joins() {
    let dir = tempfile::tempdir().unwrap();
    example::run(dir.path()).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for want in [
        "big.tar.part000",
        "big.tar.part001",
        "big.tar.part002",
        "big.tar.parity000",
        "again.tar",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
}

//! Split a file into parts with one parity part; damage one block of a part, read through the
//! damage and repair it; lose a whole part and repair it; join the parts and check every byte.
//!
//! `cargo run -p koord-splitset --example split_repair_join [DIR]` (a temporary directory when
//! DIR is not given). koord-splitset's `tests/example.rs` runs it.

// A program of its own: it prints its own words (names of files it made), not koord-bundle's.
#![allow(clippy::disallowed_macros)]

use koord_splitset::{join, open, repair, split, BundleFile, SplitOptions};
use std::io::Read as _;
use std::path::Path;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    match std::env::args_os().nth(1) {
        Some(dir) => run(Path::new(&dir)),
        None => run(tempfile::tempdir()?.path()),
    }
}

/// The whole walk, in `dir`.
pub fn run(dir: &Path) -> Result<()> {
    // 5 MiB to carry, in parts of at most 2 MiB: three data parts and one parity part.
    let file = dir.join("big.tar");
    let bytes: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &bytes)?;
    let opts = SplitOptions {
        size: 2 << 20,
        parity: 1,
        spread: false,
        out_dir: dir,
        name: "big.tar",
        signer: None,
    };
    let parts = split(&file, &opts, &|_| {})?;
    for p in &parts {
        println!(
            "wrote {} ({} bytes)",
            p.display(),
            std::fs::metadata(p)?.len()
        );
    }

    // One byte flipped in the middle of the last data part: a reader finds the damaged block
    // by its digest and rebuilds it from the parity part on the fly.
    let last = &parts[2];
    let mut part = std::fs::read(last)?;
    let at = part.len() / 2;
    part[at] ^= 0xff;
    std::fs::write(last, &part)?;
    let whole = BundleFile::open(&parts[0])?;
    let mut read = Vec::new();
    whole.reader()?.read_to_end(&mut read)?;
    if read != bytes {
        return Err("reading through a damaged block gave other bytes".into());
    }
    let set = whole.set.as_ref().ok_or("a set of parts")?;
    for r in set.repairs() {
        println!("rebuilt while reading: {r}");
    }

    // Reading does not change the parts; repair writes the damaged one back whole.
    let done = repair(&open(&parts[0])?, None, &|_| {})?;
    println!(
        "repaired {:?}: {} block(s) rebuilt",
        done.written, done.rebuilt
    );
    if std::fs::read(last)? == part {
        return Err("the damaged part was not written back".into());
    }

    // A part lost altogether (a lost disc): rebuilt from the others and the parity part.
    std::fs::remove_file(&parts[1])?;
    let done = repair(&open(&parts[0])?, None, &|_| {})?;
    println!(
        "repaired {:?}: {} block(s) rebuilt",
        done.written, done.rebuilt
    );

    // Joined again, every byte checked.
    let again = dir.join("again.tar");
    let n = join(&BundleFile::open(&parts[0])?, &again)?;
    if std::fs::read(&again)? != bytes {
        return Err("the joined file differs from the original".into());
    }
    println!("joined {n} bytes into {}: identical", again.display());
    Ok(())
}

//! What every reader of a split set (verify, inspect, load, serve, join, repair) says about the
//! parts it found and the blocks it rebuilt from parity.

use crate::progress::Progress;
use koord_splitset::BundleFile;

/// What was found when the parts of a set were looked for (renamed, swapped, missing,
/// foreign, damaged headers): one line each.
pub fn set_notes(bf: &BundleFile) -> Vec<String> {
    bf.set
        .as_ref()
        .map(|s| s.notes.iter().map(|n| n.to_string()).collect())
        .unwrap_or_default()
}

/// What was rebuilt from parity while the set was read: one line per part.
pub fn repair_lines(bf: &BundleFile) -> Vec<String> {
    bf.set
        .as_ref()
        .map(|s| s.repairs().iter().map(|r| r.to_string()).collect())
        .unwrap_or_default()
}

/// Say what a reader of `bf` found and rebuilt, as warnings (they name parts to copy again or
/// repair), with the command that writes the damaged parts back.
pub fn tell_repairs(progress: &Progress, bf: &BundleFile) {
    for n in set_notes(bf) {
        progress.warn(n);
    }
    let lines = repair_lines(bf);
    for l in &lines {
        progress.warn(l);
    }
    // A stray file of another set is not this set's damage: moving it away is the user's.
    let notes = bf.set.as_ref().is_some_and(|s| {
        s.notes
            .iter()
            .any(|n| !matches!(n, koord_splitset::Note::Stray { .. }))
    });
    if !lines.is_empty() || notes {
        progress.warn(format!(
            "to write the damaged, missing or misplaced parts back whole: koord-bundle repair {}",
            bf.path.display()
        ));
    }
}

//! Opening a v2 set from any of its parts: the header from the part named (or, when its copy is
//! damaged, from another part next to it), then every part where the header puts it, checked
//! by the part line it starts with; a part that is not there is looked for among the other
//! files of the folder by that line, so a renamed or swapped part is found by its content, and a
//! part of another set in its place is named.

use super::header::{self, Copy, Ident};
use super::{io_err, OtherSet, SetError, Slot};
use std::fmt;
use std::path::{Path, PathBuf};

/// Most directory entries looked at when a part is not where the header puts it.
pub const MAX_SCAN: usize = 10_000;

/// What was found when a set's parts were looked for (for the commands to tell the user).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Note {
    /// A part is neither where the header puts it nor anywhere next to it.
    Missing {
        /// Its index.
        part: usize,
        /// Its file name.
        file: String,
    },
    /// A part was found under another name (renamed, or swapped with another part).
    Moved {
        /// Its index.
        part: usize,
        /// Its file name in the header.
        file: String,
        /// Where it was found.
        found: PathBuf,
    },
    /// The file where a part should be belongs to another split set.
    Foreign {
        /// The file.
        path: PathBuf,
        /// The part that should be there.
        part: usize,
        /// The bundle of the set it belongs to, when its header could be read.
        bundle: Option<String>,
    },
    /// A file next to the set, named as a part of its bundle (`NAME.partNNN`,
    /// `NAME.parityNNN`), that belongs to another split set: not read. (Two sets of one bundle
    /// copied into one folder: the set read is not the one the user may think.)
    Stray {
        /// The file.
        path: PathBuf,
        /// The bundle of the set it belongs to, when its header could be read.
        bundle: Option<String>,
    },
    /// A part's own copy of the header is damaged (its data is still read, block by block).
    HeaderDamaged {
        /// Its index.
        part: usize,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A part's file has another length than the header says.
    Size {
        /// Its index.
        part: usize,
        /// The file.
        path: PathBuf,
        /// Its length.
        actual: u64,
        /// The length the header gives.
        expected: u64,
    },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Missing { part, file } => write!(f, "{file} (part {part}) is missing"),
            Note::Moved { part, file, found } => write!(
                f,
                "{} holds {file} (part {part}; renamed or swapped): read as part {part}",
                found.display()
            ),
            Note::Foreign { path, part, bundle } => write!(
                f,
                "{} belongs to another split set{}, not to this one: part {part} is read as missing",
                path.display(),
                bundle
                    .as_deref()
                    .map(|b| format!(" (of {})", crate::text::printable(b)))
                    .unwrap_or_default()
            ),
            Note::Stray { path, bundle } => write!(
                f,
                "{} is named as a part of this set but belongs to another split set{}: it is not read (move it away, so the two sets are not mixed up)",
                path.display(),
                bundle
                    .as_deref()
                    .map(|b| format!(" (of {})", crate::text::printable(b)))
                    .unwrap_or_default()
            ),
            Note::HeaderDamaged { part, path, reason } => write!(
                f,
                "{} (part {part}): its copy of the header is damaged ({reason}); its data is checked block by block",
                path.display()
            ),
            Note::Size {
                part,
                path,
                actual,
                expected,
            } => write!(
                f,
                "{} (part {part}) is {actual} bytes, the header says {expected}{}",
                path.display(),
                if actual < expected {
                    ": the blocks beyond its end are read as missing"
                } else {
                    ": the bytes beyond are ignored"
                }
            ),
        }
    }
}

/// The folder of a part.
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `path` as [`files_in`] lists it and [`open`] joins the header's names to its folder
/// (`x.part002` is listed as `./x.part002`): what a found part is compared with to know it is
/// the one named.
fn as_listed(path: &Path) -> PathBuf {
    dir_of(path).join(path.file_name().unwrap_or(path.as_os_str()))
}

/// Regular files of `dir`, sorted by name (at most [`MAX_SCAN`]).
fn files_in(dir: &Path) -> Result<Vec<PathBuf>, SetError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_err(dir))?.take(MAX_SCAN) {
        let e = e.map_err(io_err(dir))?;
        if e.file_type().map(|t| t.is_file()).unwrap_or(false) {
            out.push(e.path());
        }
    }
    out.sort();
    Ok(out)
}

/// An intact header copy for the part `named`: its own, else another part's next to it: of
/// the same set when the part line of `named` says which; when that line is damaged too, of a
/// set whose header names `named` as one of its parts (of the length `named` has, first). A
/// part of another set is never taken for the set of `named` (it was: a damaged part lying
/// next to another set had `repair` report that other set whole, and `join` write its bundle):
/// the error names the parts of other sets seen.
fn find_copy(named: &Path) -> Result<(Copy, Option<String>), SetError> {
    let reason = match header::read_copy(named) {
        Ok(c) => return Ok((c, None)),
        Err(r) => r,
    };
    let want = header::read_ident(named).ok().flatten().map(|i| i.set);
    let file_name = named.file_name().and_then(|f| f.to_str());
    let len = std::fs::metadata(named).map(|m| m.len()).ok();
    let mut tried = Vec::new();
    let mut others = Vec::new();
    let mut by_name = None;
    let listed = as_listed(named);
    for p in files_in(&dir_of(named))? {
        if p == listed {
            continue;
        }
        let Ok(Some(ident)) = header::read_ident(&p) else {
            continue;
        };
        if want.as_ref().is_some_and(|w| *w != ident.set) {
            others.push(other_set(p, ident.set, others.len()));
            continue;
        }
        let c = match header::read_copy(&p) {
            Ok(c) => c,
            Err(_) => {
                tried.push(p);
                continue;
            }
        };
        if want.is_some() {
            return Ok((c, Some(reason)));
        }
        match c
            .header
            .parts
            .iter()
            .position(|e| Some(e.file.as_str()) == file_name)
        {
            Some(i) if len == Some(c.geometry.file_len(i)) => return Ok((c, Some(reason))),
            Some(_) => {
                by_name.get_or_insert(c);
            }
            None => others.push(OtherSet {
                path: p,
                set: ident.set,
                bundle: Some(c.header.bundle.file),
            }),
        }
    }
    if let Some(c) = by_name {
        return Ok((c, Some(reason)));
    }
    Err(SetError::Header {
        path: named.to_path_buf(),
        reason,
        seen: Box::new(super::Seen {
            tried,
            want,
            others,
        }),
    })
}

/// A part of another set seen next to a part whose header is damaged: its set and bundle (the
/// bundle read for the first few only).
fn other_set(path: PathBuf, set: String, seen: usize) -> OtherSet {
    let bundle = (seen < super::MAX_LISTED)
        .then(|| header::read_copy(&path).ok().map(|c| c.header.bundle.file))
        .flatten();
    OtherSet { path, set, bundle }
}

/// Whether a set can be opened from `named` whose own first line is not the v2 magic line (a
/// part whose header is damaged): only when other v2 parts are next to it.
pub(crate) fn has_v2_siblings(named: &Path) -> bool {
    let listed = as_listed(named);
    files_in(&dir_of(named)).is_ok_and(|files| {
        files
            .iter()
            .any(|p| *p != listed && matches!(header::read_ident(p), Ok(Some(_))))
    })
}

/// Open the set the part `named` belongs to.
pub fn open(named: &Path) -> Result<super::Set, SetError> {
    let (copy, own_damage) = find_copy(named)?;
    let id = header::set_id(&copy.json);
    let dir = dir_of(named);
    let listed = as_listed(named);
    let g = copy.geometry.clone();
    let count = g.parts();
    let mut found: Vec<Option<PathBuf>> = vec![None; count];
    let mut notes = Vec::new();
    // Files where a part should be whose part line cannot be read: used when nothing better.
    let mut unreadable: Vec<Option<PathBuf>> = vec![None; count];
    let mut misplaced = false;
    for (p, entry) in copy.header.parts.iter().enumerate() {
        let path = dir.join(&entry.file);
        match header::read_ident(&path) {
            Ok(Some(Ident { index, set, .. })) if set == id && index == p => found[p] = Some(path),
            Ok(Some(Ident { set, .. })) if set == id => misplaced = true,
            Ok(Some(_)) => {
                misplaced = true;
                notes.push(super::Note::Foreign {
                    bundle: header::read_copy(&path).ok().map(|c| c.header.bundle.file),
                    path,
                    part: p,
                });
            }
            Ok(None) => unreadable[p] = Some(path),
            Err(_) => misplaced = true,
        }
    }
    if misplaced || found.iter().any(|f| f.is_none()) {
        look_around(&dir, &id, &copy, &mut found, &mut notes)?;
    }
    strays(&dir, &id, &copy, &found, &mut notes)?;
    let mut slots = Vec::with_capacity(count);
    for p in 0..count {
        let expected = dir.join(&copy.header.parts[p].file);
        let (path, rewrite) = match (found[p].take(), unreadable[p].take()) {
            (Some(f), _) => {
                let moved = f != expected;
                (f, moved)
            }
            (None, Some(u)) => {
                if own_damage.is_none() || u != listed {
                    let reason = header::read_copy(&u)
                        .err()
                        .unwrap_or_else(|| "its part line is damaged".into());
                    notes.push(super::Note::HeaderDamaged {
                        part: p,
                        path: u.clone(),
                        reason,
                    });
                }
                (u, true)
            }
            (None, None) => {
                notes.push(super::Note::Missing {
                    part: p,
                    file: copy.header.parts[p].file.clone(),
                });
                slots.push(Slot {
                    path: expected,
                    file: None,
                    len: 0,
                    rewrite: true,
                });
                continue;
            }
        };
        let file = crate::bounded::open_input(&path).map_err(io_err(&path))?;
        let len = file.metadata().map_err(io_err(&path))?.len();
        let mut rewrite = rewrite;
        if len != g.file_len(p) {
            rewrite = true;
            notes.push(super::Note::Size {
                part: p,
                path: path.clone(),
                actual: len,
                expected: g.file_len(p),
            });
        }
        if path == listed {
            if let Some(reason) = &own_damage {
                rewrite = true;
                notes.push(super::Note::HeaderDamaged {
                    part: p,
                    path: path.clone(),
                    reason: reason.clone(),
                });
            }
        }
        slots.push(Slot {
            path,
            file: Some(file),
            len,
            rewrite,
        });
    }
    Ok(super::Set {
        path: named.to_path_buf(),
        signature: (!copy.sig.is_empty()).then(|| copy.sig.clone()),
        header: copy.header,
        json: copy.json,
        table: copy.table,
        geometry: g,
        notes,
        slots,
        log: Default::default(),
        observer: Default::default(),
        coder: Default::default(),
        spill: Default::default(),
    })
}

/// Parts not where the header puts them: looked for among the folder's files by their part line.
fn look_around(
    dir: &Path,
    id: &str,
    copy: &Copy,
    found: &mut [Option<PathBuf>],
    notes: &mut Vec<super::Note>,
) -> Result<(), SetError> {
    // A set, not a scan of `found` per file: 10,000 files by 16,384 parts.
    let taken: std::collections::HashSet<PathBuf> = found.iter().flatten().cloned().collect();
    for path in files_in(dir)? {
        if taken.contains(&path) {
            continue;
        }
        let Ok(Some(ident)) = header::read_ident(&path) else {
            continue;
        };
        if ident.set != id || ident.index >= found.len() || found[ident.index].is_some() {
            continue;
        }
        let file = copy.header.parts[ident.index].file.clone();
        notes.push(super::Note::Moved {
            part: ident.index,
            file,
            found: path.clone(),
        });
        found[ident.index] = Some(path);
    }
    Ok(())
}

/// Files of `dir` named as parts of this set's bundle (any number, data or parity) that are
/// not among its parts (`found`, or named by its header) and whose part line names another
/// set: noted, never read.
fn strays(
    dir: &Path,
    id: &str,
    copy: &Copy,
    found: &[Option<PathBuf>],
    notes: &mut Vec<super::Note>,
) -> Result<(), SetError> {
    let name = &copy.header.bundle.file;
    let mut ours: std::collections::HashSet<PathBuf> = found.iter().flatten().cloned().collect();
    ours.extend(copy.header.parts.iter().map(|e| dir.join(&e.file)));
    let named_as_part = |file: &str| {
        file.strip_prefix(name.as_str())
            .and_then(|rest| rest.strip_prefix(".part").or(rest.strip_prefix(".parity")))
            .is_some_and(|num| num.len() >= 3 && num.bytes().all(|b| b.is_ascii_digit()))
    };
    for path in files_in(dir)? {
        let is_named = path
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(named_as_part);
        if !is_named || ours.contains(&path) {
            continue;
        }
        if let Ok(Some(ident)) = header::read_ident(&path) {
            if ident.set != id {
                notes.push(super::Note::Stray {
                    bundle: header::read_copy(&path).ok().map(|c| c.header.bundle.file),
                    path,
                });
            }
        }
    }
    Ok(())
}

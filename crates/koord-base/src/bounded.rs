//! Bounded reads of what comes from outside: a file or stream stops at its cap while it is read
//! (an HTTP body's cap is `store::registry::body`'s). Local input files are opened in one
//! way, [`open_input`]: regular files only, an open that never waits.

/// Read at most `max` bytes from `r`; more is an error ("larger than the MAX bytes allowed for
/// it"), found without reading the rest.
pub fn read_bounded(r: impl std::io::Read, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    r.take(max as u64 + 1).read_to_end(&mut out)?;
    if out.len() > max {
        return Err(std::io::Error::other(format!(
            "larger than the {max} bytes allowed for it"
        )));
    }
    Ok(out)
}

/// [`read_bounded`] of a file (a regular file only: [`open_input`]).
pub fn read_file_bounded(path: &std::path::Path, max: usize) -> std::io::Result<Vec<u8>> {
    open_input(path).and_then(|f| read_bounded(f, max))
}

/// What a path names when it is not a regular file, in words.
pub fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt as _;
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Open a file the program reads as input (a bundle, a part, a chart, a values file, an
/// earlier bundle): a regular file only, found out before a byte is read. The open itself
/// never waits: `O_NONBLOCK`, so a FIFO (whose `open` would block until a writer comes, with
/// the runtime thread, and with it the signal handlers, stuck) is opened, seen for what it is
/// by `fstat`, and refused. A block device is refused too: every reader here takes the length
/// of a file from its metadata, which a device does not give (copy the bundle off it first).
/// Symbolic links are followed: the user may name a file by a link; what it points to must
/// be a regular file.
pub fn open_input(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let t = file.metadata()?.file_type();
    if !t.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "it is {}, not a regular file: give the file itself",
                kind_of(t)
            ),
        ));
    }
    clear_nonblock(&file);
    Ok(file)
}

/// Back to blocking reads (a regular file ignores `O_NONBLOCK`; cleared all the same, so the
/// descriptor behaves as any other).
pub fn clear_nonblock(file: &std::fs::File) {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    if let Ok(fl) = fcntl_getfl(file) {
        let _ = fcntl_setfl(file, fl - OFlags::NONBLOCK);
    }
}

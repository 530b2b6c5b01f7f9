//! A data dir is private to the service user: directories 0700, files 0600.
//!
//! Logs, snapshots and the identity hold every lock's owner, session ids and namespace
//! configuration. lockd creates its directories 0700 and its own files 0600 whatever the
//! umask; at every start it tightens what is wider (a dir from an older lockd, or made by
//! hand) and logs a warning. raft-log creates its chunk files under the process umask; they
//! are tightened right after the log opens, and a chunk started later lives in a 0700
//! directory until the next start tightens it.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use tracing::warn;

/// Mode of every directory lockd makes.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file lockd writes.
pub const FILE_MODE: u32 = 0o600;

/// Clears the bits of `path`'s mode outside `allowed`; whether it had any.
fn tighten(path: &Path, allowed: u32) -> io::Result<bool> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & !allowed == 0 {
        return Ok(false);
    }
    std::fs::set_permissions(path, Permissions::from_mode(mode & allowed))?;
    Ok(true)
}

/// Makes `path` a private directory: created (with any missing parents) 0700, or an existing
/// one tightened to 0700, and the files directly in it tightened to 0600; each tightening is
/// logged as a warning.
pub(crate) fn dir(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(_) => {
            if tighten(path, DIR_MODE)? {
                warn!(dir = %path.display(), "the data dir was open to other users; made it 0700");
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(path)?;
        }
        Err(e) => return Err(e),
    }
    for path in regular_files(path)? {
        if tighten(&path, FILE_MODE)? {
            warn!(file = %path.display(), "a data file was open to other users; made it 0600");
        }
    }
    Ok(())
}

/// Tightens the files directly in `dir` to 0600 without a warning: files that a library just
/// created under the process umask (raft-log's chunks and lock file).
pub(crate) fn files_quietly(dir: &Path) -> io::Result<()> {
    for path in regular_files(dir)? {
        tighten(&path, FILE_MODE)?;
    }
    Ok(())
}

fn regular_files(dir: &Path) -> io::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for ent in std::fs::read_dir(dir)? {
        let ent = ent?;
        if ent.file_type()?.is_file() {
            files.push(ent.path());
        }
    }
    Ok(files)
}

/// Creates (or truncates) `path` for writing, mode 0600 even if it existed wider.
pub(crate) fn create_file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?;
    if f.metadata()?.permissions().mode() & 0o7777 & !FILE_MODE != 0 {
        f.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(f)
}

/// Makes `path` a private directory (created 0700, or tightened to it, its files to 0600), for
/// tools that prepare a data dir.
pub fn make_private_dir(path: &Path) -> io::Result<()> {
    dir(path)
}

/// Writes `bytes` to `path` durably and privately: a 0600 temporary file, fsync'd, renamed over
/// `path`, and the directory fsync'd (a crash leaves the old file or the whole new one).
pub fn write_private_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    let parent = path.parent().unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = parent.join(tmp_name);
    let mut f = create_file(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    File::open(parent)?.sync_all()
}

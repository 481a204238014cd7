//! One path of a workspace at a time, for APIs that name entries rather than move trees (E2B's
//! filesystem, DESIGN 15): what a path is, a directory's entries, and making, removing,
//! renaming, reading and writing one. Every path is resolved beneath the workspace as the tar
//! paths are, links are never followed, and a file is written aside and renamed into place.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat2, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::{FilesError, Kind, aside, beneath, invalid, io_error, kind_of, open_dir, open_root, resolve_error};

/// What one path of the workspace is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the workspace.
    pub path: PathBuf,
    pub kind: Kind,
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Unix seconds.
    pub modified: i64,
    /// A link's target, as written.
    pub link: Option<PathBuf>,
}

fn entry(dir: &OwnedFd, name: &OsStr, path: PathBuf, stat: &FileStat) -> Result<Option<Entry>, FilesError> {
    let Some(kind) = kind_of(stat) else { return Ok(None) };
    let link = match kind {
        Kind::Symlink => Some(PathBuf::from(readlinkat(dir, name).map_err(|e| resolve_error(&path, e))?)),
        _ => None,
    };
    Ok(Some(Entry {
        path,
        kind,
        size: if kind == Kind::File { u64::try_from(stat.st_size).unwrap_or(0) } else { 0 },
        mode: stat.st_mode & 0o7777,
        modified: stat.st_mtime,
        link,
    }))
}

/// `path`'s directory, opened beneath the workspace, and its last name; the workspace itself
/// has none.
fn split(root: &OwnedFd, path: &Path, create: bool) -> Result<(OwnedFd, PathBuf), FilesError> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((open_dir(root, parent, create)?, PathBuf::from(name))),
        _ => Err(invalid("path", "the workspace itself cannot be named here")),
    }
}

/// What `path` (relative to the workspace at `root`; empty: the workspace) is, its final link
/// not followed.
pub fn stat(root: &Path, path: &Path) -> Result<Entry, FilesError> {
    let root = open_root(root)?;
    let found = if path.as_os_str().is_empty() {
        let stat = fstat(root.as_fd()).map_err(|e| io_error("the workspace", e))?;
        entry(&root, OsStr::new("."), PathBuf::new(), &stat)?
    } else {
        let (dir, name) = split(&root, path, false)?;
        let stat = fstatat(&dir, &name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| resolve_error(path, e))?;
        entry(&dir, name.as_os_str(), path.to_path_buf(), &stat)?
    };
    found.ok_or_else(|| invalid("path", format!("{} is not a file, a directory or a link", path.display())))
}

/// The entries of directory `path`, `depth` levels down (1: its own), in name order, at most
/// `max_entries` of them. Links are listed, never followed.
pub fn list(root: &Path, path: &Path, depth: usize, max_entries: usize) -> Result<Vec<Entry>, FilesError> {
    let root = open_root(root)?;
    let mut listed = Vec::new();
    let mut pending = vec![(open_dir(&root, path, false)?, path.to_path_buf(), 1)];
    while let Some((dir, at, level)) = pending.pop() {
        let listing = nix::dir::Dir::from_fd(dir.try_clone().map_err(|e| io_error("listing", e))?)
            .map_err(|e| io_error(&format!("listing {}", at.display()), e))?;
        let mut names = Vec::new();
        for name in listing {
            let name = name.map_err(|e| io_error(&format!("listing {}", at.display()), e))?;
            let name = name.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_os_string());
            }
        }
        names.sort();
        for name in names {
            if listed.len() == max_entries {
                return Err(FilesError::TooLarge(format!("{} holds over {max_entries} entries", path.display())));
            }
            let named = at.join(&name);
            let Ok(stat) = fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
            let Some(found) = entry(&dir, &name, named.clone(), &stat)? else { continue };
            if found.kind == Kind::Directory && level < depth {
                let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
                let child = openat2(&dir, name.as_os_str(), beneath(flags)).map_err(|e| resolve_error(&named, e))?;
                pending.push((child, named, level + 1));
            }
            listed.push(found);
        }
    }
    listed.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(listed)
}

/// Makes directory `path` and its parents: false when it was there already.
pub fn make_dir(root: &Path, path: &Path) -> Result<bool, FilesError> {
    let root = open_root(root)?;
    let (dir, name) = split(&root, path, true)?;
    match mkdirat(&dir, &name, Mode::from_bits_truncate(0o755)) {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => match fstatat(&dir, &name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) if kind_of(&stat) == Some(Kind::Directory) => Ok(false),
            _ => Err(invalid("path", format!("{} exists and is not a directory", path.display()))),
        },
        Err(e) => Err(resolve_error(path, e)),
    }
}

/// Removes `path`, a directory with everything in it (links removed, never followed).
pub fn remove(root: &Path, path: &Path) -> Result<(), FilesError> {
    let root = open_root(root)?;
    let (dir, name) = split(&root, path, false)?;
    remove_at(&dir, &name, path)
}

fn remove_at(dir: &OwnedFd, name: &Path, shown: &Path) -> Result<(), FilesError> {
    // The walk's own stack: a tree as deep as the sandbox made it cannot overflow the thread's.
    let mut pending = vec![(dir.try_clone().map_err(|e| io_error("removing", e))?, name.to_path_buf(), false)];
    while let Some((parent, name, emptied)) = pending.pop() {
        let stat = fstatat(&parent, &name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| resolve_error(shown, e))?;
        if kind_of(&stat) != Some(Kind::Directory) {
            unlinkat(&parent, &name, UnlinkatFlags::NoRemoveDir).map_err(|e| resolve_error(shown, e))?;
            continue;
        }
        if emptied {
            unlinkat(&parent, &name, UnlinkatFlags::RemoveDir).map_err(|e| resolve_error(shown, e))?;
            continue;
        }
        let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
        let opened = openat2(&parent, &name, beneath(flags)).map_err(|e| resolve_error(shown, e))?;
        let listing = nix::dir::Dir::from_fd(opened.try_clone().map_err(|e| io_error("removing", e))?)
            .map_err(|e| io_error("removing", e))?;
        pending.push((parent, name, true));
        for child in listing {
            let child = child.map_err(|e| io_error("removing", e))?;
            let child = child.file_name().to_bytes();
            if child != b"." && child != b".." {
                let handle = opened.try_clone().map_err(|e| io_error("removing", e))?;
                pending.push((handle, PathBuf::from(OsStr::from_bytes(child)), false));
            }
        }
    }
    Ok(())
}

/// Renames `from` to `to` (its parents made), replacing a file there; what `to` is then.
pub fn rename(root: &Path, from: &Path, to: &Path) -> Result<Entry, FilesError> {
    let opened = open_root(root)?;
    let (from_dir, from_name) = split(&opened, from, false)?;
    let (to_dir, to_name) = split(&opened, to, true)?;
    renameat(&from_dir, &from_name, &to_dir, &to_name).map_err(|e| resolve_error(from, e))?;
    drop(opened);
    stat(root, to)
}

/// The content of file `path`, up to `max` bytes (more is refused, not cut).
pub fn read(root: &Path, path: &Path, max: u64) -> Result<Vec<u8>, FilesError> {
    let root = open_root(root)?;
    let (dir, name) = split(&root, path, false)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let fd = openat2(&dir, &name, beneath(flags)).map_err(|e| resolve_error(path, e))?;
    let stat = fstat(fd.as_fd()).map_err(|e| io_error(&path.display().to_string(), e))?;
    if kind_of(&stat) != Some(Kind::File) {
        return Err(invalid("path", format!("{} is not a file", path.display())));
    }
    let mut content = Vec::new();
    File::from(fd).take(max + 1).read_to_end(&mut content).map_err(|e| io_error(&path.display().to_string(), e))?;
    if content.len() as u64 > max {
        return Err(FilesError::TooLarge(format!("{} is larger than {max} bytes", path.display())));
    }
    Ok(content)
}

/// Writes `content` as file `path` (its parents made), whole or not at all; what it is then.
pub fn write(root: &Path, path: &Path, content: &mut impl Read) -> Result<Entry, FilesError> {
    let opened = open_root(root)?;
    let (dir, name) = split(&opened, path, true)?;
    let temp = aside(name.as_os_str(), 0);
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
    let fd = openat2(&dir, &temp, beneath(flags).mode(Mode::from_bits_truncate(0o600)))
        .map_err(|e| resolve_error(path, e))?;
    let written = super::write_file(File::from(fd), content, Mode::from_bits_truncate(0o644))
        .and_then(|_| renameat(&dir, &temp, &dir, &name).map_err(|e| resolve_error(path, e)));
    if let Err(e) = written {
        let _ = unlinkat(&dir, &temp, UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    drop(opened);
    stat(root, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("d/e")).unwrap();
        std::fs::write(dir.path().join("d/a.txt"), b"hello").unwrap();
        std::fs::write(dir.path().join("d/e/b.txt"), b"x").unwrap();
        std::os::unix::fs::symlink("a.txt", dir.path().join("d/link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("out")).unwrap();
        dir
    }

    fn names(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(|e| e.path.display().to_string()).collect()
    }

    #[test]
    fn a_path_is_told_as_it_is_and_a_link_is_never_followed() {
        let ws = workspace();
        let file = stat(ws.path(), Path::new("d/a.txt")).unwrap();
        assert_eq!((file.kind, file.size, file.mode), (Kind::File, 5, 0o644));
        let link = stat(ws.path(), Path::new("d/link")).unwrap();
        assert_eq!((link.kind, link.link.as_deref()), (Kind::Symlink, Some(Path::new("a.txt"))));
        assert_eq!(stat(ws.path(), Path::new("")).unwrap().kind, Kind::Directory);
        assert_eq!(stat(ws.path(), Path::new("d/none")), Err(FilesError::NotFound("d/none".into())));
        // A link out of the workspace is told as a link, and nothing is read through it.
        assert_eq!(stat(ws.path(), Path::new("out")).unwrap().kind, Kind::Symlink);
        assert!(matches!(
            read(ws.path(), Path::new("out"), 1 << 20),
            Err(FilesError::Io(_) | FilesError::Invalid { .. })
        ));
        assert!(matches!(stat(ws.path(), Path::new("out/x")), Err(FilesError::Invalid { .. })));
    }

    #[test]
    fn a_listing_goes_as_deep_as_asked_in_name_order() {
        let ws = workspace();
        assert_eq!(names(&list(ws.path(), Path::new("d"), 1, 100).unwrap()), ["d/a.txt", "d/e", "d/link"]);
        assert_eq!(names(&list(ws.path(), Path::new("d"), 2, 100).unwrap()), ["d/a.txt", "d/e", "d/e/b.txt", "d/link"]);
        assert!(matches!(list(ws.path(), Path::new("d"), 2, 3), Err(FilesError::TooLarge(_))));
        assert!(matches!(list(ws.path(), Path::new("d/a.txt"), 1, 100), Err(FilesError::Invalid { .. })));
    }

    #[test]
    fn directories_are_made_files_written_whole_renamed_read_and_removed() {
        let ws = workspace();
        assert!(make_dir(ws.path(), Path::new("n/m")).unwrap());
        assert!(!make_dir(ws.path(), Path::new("n/m")).unwrap(), "there already");
        assert!(make_dir(ws.path(), Path::new("d/a.txt")).is_err(), "a file is no directory");
        let written = write(ws.path(), Path::new("n/m/f.txt"), &mut &b"content"[..]).unwrap();
        assert_eq!((written.kind, written.size), (Kind::File, 7));
        assert_eq!(read(ws.path(), Path::new("n/m/f.txt"), 100).unwrap(), b"content");
        assert!(matches!(read(ws.path(), Path::new("n/m/f.txt"), 3), Err(FilesError::TooLarge(_))));
        let moved = rename(ws.path(), Path::new("n/m/f.txt"), Path::new("o/g.txt")).unwrap();
        assert_eq!(moved.path, Path::new("o/g.txt"));
        remove(ws.path(), Path::new("d")).unwrap();
        assert_eq!(stat(ws.path(), Path::new("d")), Err(FilesError::NotFound("d".into())));
        // The link out was not followed by anything: its target is untouched.
        assert!(Path::new("/etc/passwd").exists());
        // Nothing written aside is left.
        let left = names(&list(ws.path(), Path::new(""), 8, 100).unwrap());
        assert_eq!(left, ["n", "n/m", "o", "o/g.txt", "out"]);
    }
}

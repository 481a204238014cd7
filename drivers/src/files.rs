//! Files in and out of a sandbox's workspace as tar streams (DESIGN 8.3), on the host that
//! keeps it: the process driver's workspace directory, a container's workspace volume.
//!
//! The workspace is the sandbox's to change while it runs, so nothing in it is trusted: every
//! path is resolved by the kernel beneath the workspace (`openat2` with `RESOLVE_BENEATH`), which
//! refuses `..` past it, absolute symbolic links and links that lead out of it, with no window
//! between a check and its use; files are opened without following a final link. An upload is
//! checked whole before anything is written (a bad entry writes nothing), and each file is
//! written aside and renamed into place, so a reader sees it whole or not at all.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};
use sha2::{Digest, Sha256};

/// Where a workspace is mounted in a container; in a path given to the files API, the
/// workspace on every driver.
pub use berth_core::spec::WORKSPACE;

/// How deep a download walks.
const MAX_DEPTH: usize = 256;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most an upload's tar stream may hold.
    pub max_bytes: u64,
    /// The most entries an upload or a download may hold.
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_bytes: 1 << 30, max_entries: 100_000 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("{0} does not exist in the workspace")]
    NotFound(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Io(String),
}

fn invalid(field: &str, reason: impl Into<String>) -> FilesError {
    FilesError::Invalid { field: field.to_string(), reason: reason.into() }
}

/// Whether a write failed for want of space (the disk, or a quota): that does not pass by
/// itself, so it is refused as a write too large is, never retried.
pub(crate) fn no_space(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

fn io_error(context: &str, e: impl Into<std::io::Error>) -> FilesError {
    let e = e.into();
    if no_space(&e) {
        FilesError::TooLarge(format!("{context}: {e}"))
    } else {
        FilesError::Io(format!("{context}: {e}"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
    Symlink,
}

/// One entry written or read, with the SHA-256 of a file's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSum {
    /// Relative to where the upload went, or as named in the download.
    pub path: String,
    pub kind: Kind,
    pub size: u64,
    /// Hex; empty for a directory or link.
    pub sha256: String,
}

/// A path in the workspace, relative to it: `field`'s value, relative or under [`WORKSPACE`],
/// with no `..`.
pub fn workspace_path(field: &str, path: &str) -> Result<PathBuf, FilesError> {
    if path.contains('\0') {
        return Err(invalid(field, "a path holds no NUL byte"));
    }
    let path = Path::new(path);
    let relative = if path.is_absolute() {
        path.strip_prefix(WORKSPACE)
            .map_err(|_| invalid(field, format!("{} is outside the workspace ({WORKSPACE})", path.display())))?
    } else {
        path
    };
    relative_path(field, relative)
}

/// `path` as plain names, refusing anything that could climb out.
fn relative_path(field: &str, path: &Path) -> Result<PathBuf, FilesError> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir => return Err(invalid(field, format!("{} climbs out with ..", path.display()))),
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(field, format!("{} is absolute", path.display())));
            }
        }
    }
    Ok(out)
}

fn beneath(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS)
}

/// What an `openat2` beneath the workspace refusing a path means to a caller.
fn resolve_error(shown: &Path, e: Errno) -> FilesError {
    match e {
        Errno::ENOENT => FilesError::NotFound(shown.display().to_string()),
        Errno::EXDEV | Errno::ELOOP => {
            invalid("path", format!("{} leads out of the workspace through a symbolic link", shown.display()))
        }
        Errno::ENOTDIR => invalid("path", format!("a part of {} is not a directory", shown.display())),
        e => io_error(&format!("opening {}", shown.display()), e),
    }
}

/// The workspace's root directory, trusted: it is the driver's.
fn open_root(root: &Path) -> Result<OwnedFd, FilesError> {
    // Its place on the host is no client's business.
    let file = File::open(root).map_err(|e| io_error("opening the workspace", e))?;
    Ok(file.into())
}

/// The directory `path` beneath `root`, made (with its parents) if `create`.
fn open_dir(root: &OwnedFd, path: &Path, create: bool) -> Result<OwnedFd, FilesError> {
    let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY;
    let mut dir = openat2(root, ".", beneath(flags)).map_err(|e| resolve_error(path, e))?;
    for (i, name) in path.iter().enumerate() {
        let so_far: PathBuf = path.iter().take(i + 1).collect();
        if create {
            match mkdirat(&dir, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(resolve_error(&so_far, e)),
            }
        }
        dir = openat2(&dir, name, beneath(flags)).map_err(|e| resolve_error(&so_far, e))?;
    }
    Ok(dir)
}

/// An entry of an upload, checked.
struct Checked {
    path: PathBuf,
    kind: Kind,
    mode: u32,
    size: u64,
    link: Option<PathBuf>,
}

fn entry_kind(entry_type: tar::EntryType, name: &Path) -> Result<Kind, FilesError> {
    match entry_type {
        tar::EntryType::Regular | tar::EntryType::Continuous => Ok(Kind::File),
        tar::EntryType::Directory => Ok(Kind::Directory),
        tar::EntryType::Symlink => Ok(Kind::Symlink),
        other => Err(invalid(
            "archive",
            format!("{} is a {other:?} entry: only files, directories and symbolic links are taken", name.display()),
        )),
    }
}

/// A link's target must stay in the workspace: relative, and never climbing above it from
/// where the link is.
fn check_link(link_at: &Path, target: &Path) -> Result<(), FilesError> {
    let field = format!("archive entry {}", link_at.display());
    if target.is_absolute() {
        return Err(invalid(&field, format!("its target {} is absolute", target.display())));
    }
    let mut depth = link_at.parent().map_or(0, |p| p.iter().count());
    for component in target.components() {
        match component {
            Component::ParentDir if depth == 0 => {
                return Err(invalid(&field, format!("its target {} leads out of the workspace", target.display())));
            }
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    Ok(())
}

/// The most a long name or a pax header may hold: the tar reader takes one whole into memory.
const MAX_EXTENSION: u64 = 64 * 1024;

/// Refuses long names and pax headers too large to hold, before any is read whole.
fn check_extensions(archive: &mut File) -> Result<(), FilesError> {
    let mut tar = tar::Archive::new(&mut *archive);
    for entry in tar.entries().map_err(|e| invalid("archive", e.to_string()))?.raw(true) {
        let entry = entry.map_err(|e| invalid("archive", e.to_string()))?;
        let kind = entry.header().entry_type();
        let extension = kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_pax_local_extensions()
            || kind.is_pax_global_extensions();
        if extension && entry.size() > MAX_EXTENSION {
            return Err(FilesError::TooLarge(format!(
                "the archive holds a {kind:?} header of {} bytes (at most {MAX_EXTENSION})",
                entry.size()
            )));
        }
    }
    archive.seek(SeekFrom::Start(0)).map_err(|e| io_error("rereading the archive", e))?;
    Ok(())
}

/// Every entry of the archive, checked, before anything is written; `None` for the archive's
/// own `./`.
fn check(archive: &mut File, into: &Path, limits: Limits) -> Result<Vec<Option<Checked>>, FilesError> {
    check_extensions(archive)?;
    let mut checked = Vec::new();
    // What the archive makes of each path so far: a later entry may not go through a file or a
    // link it made (a link to `.` would let a lexically harmless target climb out), nor make
    // the same path something else.
    let mut made: std::collections::BTreeMap<PathBuf, Kind> = std::collections::BTreeMap::new();
    let mut tar = tar::Archive::new(&mut *archive);
    for entry in tar.entries().map_err(|e| invalid("archive", e.to_string()))? {
        let entry = entry.map_err(|e| invalid("archive", e.to_string()))?;
        if checked.len() == limits.max_entries {
            return Err(FilesError::TooLarge(format!("the archive holds over {} entries", limits.max_entries)));
        }
        // A pax global header (`git archive` writes one, with the commit) is no file.
        if entry.header().entry_type() == tar::EntryType::XGlobalHeader {
            checked.push(None);
            continue;
        }
        let name = entry.path().map_err(|e| invalid("archive", e.to_string()))?.into_owned();
        let field = format!("archive entry {}", name.display());
        let relative = relative_path(&field, &name)?;
        if relative.as_os_str().is_empty() {
            checked.push(None);
            continue;
        }
        let header = entry.header();
        let kind = entry_kind(header.entry_type(), &name)?;
        if let Some(long) = relative.iter().find(|c| c.len() > 255) {
            return Err(invalid(&field, format!("{} is longer than a name may be (255 bytes)", long.display())));
        }
        for ancestor in relative.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
            if let Some(other) = made.get(ancestor).filter(|k| **k != Kind::Directory) {
                let other = if *other == Kind::File { "a file" } else { "a symbolic link" };
                return Err(invalid(
                    &field,
                    format!("it goes through {}, which the archive makes {other}", ancestor.display()),
                ));
            }
        }
        if let Some(other) = made.insert(relative.clone(), kind).filter(|k| *k != kind) {
            return Err(invalid(&field, format!("the archive makes it a {other:?} and a {kind:?}")));
        }
        let path = into.join(&relative);
        let link = match kind {
            Kind::Symlink => {
                let target = entry.link_name().map_err(|e| invalid(&field, e.to_string()))?;
                let target = target.ok_or_else(|| invalid(&field, "a symbolic link with no target"))?.into_owned();
                check_link(&path, &target)?;
                Some(target)
            }
            _ => None,
        };
        let mode = header.mode().map_err(|e| invalid(&field, e.to_string()))?;
        checked.push(Some(Checked { path, kind, mode, size: entry.size(), link }));
    }
    Ok(checked)
}

/// A name for a file being written beside its final one, apart from every other upload's.
fn aside(name: &OsStr, n: usize) -> PathBuf {
    static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let upload = UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut aside = format!(".berth-upload-{}-{upload}-{n}-", std::process::id()).into_bytes();
    aside.extend(name.as_bytes().iter().take(180));
    PathBuf::from(OsStr::from_bytes(&aside))
}

/// Unpacks the tar stream in `archive` into `into` (relative to the workspace at `root`).
pub fn unpack(root: &Path, into: &Path, archive: &mut File, limits: Limits) -> Result<Vec<FileSum>, FilesError> {
    let entries = check(archive, into, limits)?;
    archive.seek(SeekFrom::Start(0)).map_err(|e| io_error("rereading the archive", e))?;
    let root = open_root(root)?;
    open_dir(&root, into, true)?;
    let mut sums = Vec::new();
    // Set once everything is in them: a directory without write permission still takes its
    // entries.
    let mut modes = Vec::new();
    let mut tar = tar::Archive::new(&mut *archive);
    let contents = tar.entries().map_err(|e| io_error("rereading the archive", e))?;
    // The second walk sees the entries the first one checked, in the same order.
    for (n, (content, entry)) in contents.zip(entries).enumerate() {
        let Some(entry) = entry else { continue };
        let mut content = content.map_err(|e| io_error("rereading the archive", e))?;
        let shown = entry.path.strip_prefix(into).unwrap_or(&entry.path).display().to_string();
        let (parent, name) = match (entry.path.parent(), entry.path.file_name()) {
            (Some(parent), Some(name)) => (parent, name),
            _ => continue,
        };
        let dir = open_dir(&root, parent, true)?;
        let mode = Mode::from_bits_truncate(entry.mode & 0o1777);
        let sum = match entry.kind {
            Kind::Directory => {
                match mkdirat(&dir, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(resolve_error(&entry.path, e)),
                }
                modes.push((entry.path.clone(), mode));
                FileSum { path: shown, kind: Kind::Directory, size: 0, sha256: String::new() }
            }
            Kind::Symlink => {
                let temp = aside(name, n);
                let target = entry.link.as_deref().expect("a checked link has a target");
                symlinkat(target, &dir, &temp).map_err(|e| io_error(&shown, e))?;
                renameat(&dir, &temp, &dir, name).map_err(|e| {
                    let _ = unlinkat(&dir, &temp, UnlinkatFlags::NoRemoveDir);
                    resolve_error(&entry.path, e)
                })?;
                FileSum { path: shown, kind: Kind::Symlink, size: 0, sha256: String::new() }
            }
            Kind::File => {
                let temp = aside(name, n);
                let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
                let fd = openat2(&dir, &temp, beneath(flags).mode(Mode::from_bits_truncate(0o600)))
                    .map_err(|e| resolve_error(&entry.path, e))?;
                let written = write_file(File::from(fd), &mut content, mode).and_then(|sum| {
                    renameat(&dir, &temp, &dir, name).map_err(|e| resolve_error(&entry.path, e))?;
                    Ok(sum)
                });
                let sha256 = written.inspect_err(|_| {
                    let _ = unlinkat(&dir, &temp, UnlinkatFlags::NoRemoveDir);
                })?;
                FileSum { path: shown, kind: Kind::File, size: entry.size, sha256 }
            }
        };
        sums.push(sum);
    }
    // Deepest first: a parent made read-only does not stop its child's mode being set.
    for (path, mode) in modes.into_iter().rev() {
        let made = open_dir(&root, &path, false)?;
        fchmod(&made, mode).map_err(|e| io_error(&path.display().to_string(), e))?;
    }
    Ok(sums)
}

/// Writes a file's content, durably; its SHA-256.
fn write_file(mut file: File, content: &mut impl Read, mode: Mode) -> Result<String, FilesError> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = content.read(&mut buf).map_err(|e| io_error("reading the archive", e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| io_error("writing a file", e))?;
    }
    fchmod(&file, mode).map_err(|e| io_error("setting a file's mode", e))?;
    file.sync_data().map_err(|e| io_error("writing a file", e))?;
    Ok(hex::encode(hasher.finalize()))
}

fn kind_of(stat: &FileStat) -> Option<Kind> {
    match SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFREG => Some(Kind::File),
        SFlag::S_IFDIR => Some(Kind::Directory),
        SFlag::S_IFLNK => Some(Kind::Symlink),
        _ => None,
    }
}

fn header(kind: Kind, stat: &FileStat, size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(match kind {
        Kind::File => tar::EntryType::Regular,
        Kind::Directory => tar::EntryType::Directory,
        Kind::Symlink => tar::EntryType::Symlink,
    });
    header.set_mode(stat.st_mode & 0o7777);
    header.set_size(size);
    header.set_mtime(u64::try_from(stat.st_mtime).unwrap_or(0));
    header
}

/// Packs `path` (relative to the workspace at `root`; empty: all of it) into a tar stream on
/// `out`, named by its last component (the workspace's content at the top for the whole of
/// it). Links are packed as links, never followed.
pub fn pack(root: &Path, path: &Path, out: impl Write, limits: Limits) -> Result<Vec<FileSum>, FilesError> {
    pack_all(root, path, out, limits).map_err(|e| match e {
        // Named as asked, whichever part of it is missing.
        FilesError::NotFound(_) => FilesError::NotFound(path.display().to_string()),
        e => e,
    })
}

fn pack_all(root: &Path, path: &Path, out: impl Write, limits: Limits) -> Result<Vec<FileSum>, FilesError> {
    let root = open_root(root)?;
    let mut packer = Packer { builder: tar::Builder::new(out), sums: Vec::new(), limits };
    packer.builder.follow_symlinks(false);
    // The walk's own stack, not the thread's: a tree the sandbox made as deep as it liked
    // cannot overflow it. Each entry: its directory, its name there, its name in the archive.
    let mut pending: Vec<(Rc<OwnedFd>, OsString, PathBuf)> = Vec::new();
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            pending.push((Rc::new(open_dir(&root, parent, false)?), name.to_os_string(), PathBuf::from(name)));
        }
        _ => packer.children(Rc::new(open_dir(&root, Path::new(""), false)?), Path::new(""), &mut pending)?,
    }
    while let Some((dir, name, named)) = pending.pop() {
        if let Some(opened) = packer.entry(&dir, &name, &named)? {
            packer.children(Rc::new(opened), &named, &mut pending)?;
        }
    }
    let mut out = packer.builder.into_inner().map_err(|e| io_error("writing the archive", e))?;
    out.flush().map_err(|e| io_error("writing the archive", e))?;
    Ok(packer.sums)
}

struct Packer<W: Write> {
    builder: tar::Builder<W>,
    sums: Vec<FileSum>,
    limits: Limits,
}

impl<W: Write> Packer<W> {
    fn too_many(&self, named: &Path) -> FilesError {
        FilesError::TooLarge(format!("{} holds over {} entries", named.display(), self.limits.max_entries))
    }

    /// Puts the entries of `dir` (named `named` in the archive) on `pending`, to be packed in
    /// name order: the same tree packs the same way.
    fn children(
        &self,
        dir: Rc<OwnedFd>,
        named: &Path,
        pending: &mut Vec<(Rc<OwnedFd>, OsString, PathBuf)>,
    ) -> Result<(), FilesError> {
        if named.components().count() >= MAX_DEPTH {
            return Err(FilesError::TooLarge(format!("{} is deeper than {MAX_DEPTH} levels", named.display())));
        }
        let listing = nix::dir::Dir::from_fd(dir.try_clone().map_err(|e| io_error("listing", e))?)
            .map_err(|e| io_error(&format!("listing {}", named.display()), e))?;
        let mut names: Vec<OsString> = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| io_error(&format!("listing {}", named.display()), e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            // Held in memory only up to what may be packed.
            if self.sums.len() + pending.len() + names.len() >= self.limits.max_entries {
                return Err(self.too_many(named));
            }
            names.push(OsStr::from_bytes(name).to_os_string());
        }
        names.sort();
        // Popped from the end: the first name goes on last.
        for name in names.into_iter().rev() {
            let in_archive = named.join(&name);
            pending.push((dir.clone(), name, in_archive));
        }
        Ok(())
    }

    /// Packs one entry; a directory's opened descriptor, for its children.
    fn entry(&mut self, dir: &OwnedFd, name: &OsStr, named: &Path) -> Result<Option<OwnedFd>, FilesError> {
        if self.sums.len() == self.limits.max_entries {
            return Err(self.too_many(named));
        }
        let shown = named.display().to_string();
        let stat = nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| resolve_error(named, e))?;
        let append = |e: io::Error| io_error("writing the archive", e);
        match kind_of(&stat) {
            Some(Kind::Symlink) => {
                let target = readlinkat(dir, name).map_err(|e| io_error(&shown, e))?;
                self.builder.append_link(&mut header(Kind::Symlink, &stat, 0), named, &target).map_err(append)?;
                self.sums.push(FileSum { path: shown, kind: Kind::Symlink, size: 0, sha256: String::new() });
                Ok(None)
            }
            Some(Kind::Directory) => {
                let fd = openat2(dir, name, beneath(OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW))
                    .map_err(|e| resolve_error(named, e))?;
                self.builder.append_data(&mut header(Kind::Directory, &stat, 0), named, io::empty()).map_err(append)?;
                self.sums.push(FileSum { path: shown, kind: Kind::Directory, size: 0, sha256: String::new() });
                Ok(Some(fd))
            }
            Some(Kind::File) => {
                let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
                let fd = openat2(dir, name, beneath(flags)).map_err(|e| resolve_error(named, e))?;
                // What was opened, not what the name showed a moment before.
                let stat = fstat(fd.as_fd()).map_err(|e| io_error(&shown, e))?;
                if kind_of(&stat) != Some(Kind::File) {
                    return Err(FilesError::Io(format!("{shown}: it changed while it was read")));
                }
                let size = u64::try_from(stat.st_size).unwrap_or(0);
                let mut hashing = Hashing { inner: File::from(fd).take(size), hasher: Sha256::new(), read: 0 };
                self.builder.append_data(&mut header(Kind::File, &stat, size), named, &mut hashing).map_err(append)?;
                if hashing.read != size {
                    return Err(FilesError::Io(format!("{shown}: it shrank while it was read")));
                }
                let sha256 = hex::encode(hashing.hasher.finalize());
                self.sums.push(FileSum { path: shown, kind: Kind::File, size, sha256 });
                Ok(None)
            }
            // A socket, a FIFO or a device: not a file to copy.
            None => Ok(None),
        }
    }
}

/// A reader that hashes what it reads.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

pub mod entries;

#[cfg(test)]
mod tests;

//! The sandbox image, built without a registry: a root filesystem with Debian's static busybox
//! as its userland and a static `berth-supervisor`, as a tarball each runtime imports through
//! its API. Any other image works too: the driver mounts the supervisor into every container.

use std::path::Path;

/// Where the busybox-static package puts its binary.
pub const BUSYBOX: &str = "/bin/busybox";
/// The commands linked to busybox in the image.
const APPLETS: &[&str] = &[
    "sh", "ash", "sleep", "echo", "cat", "ls", "true", "false", "printf", "test", "[", "touch", "mkdir", "rm", "cp",
    "mv", "id", "date", "kill", "ps", "env", "head", "tail", "grep", "sed", "wc", "seq", "expr", "wget", "nc",
];

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

/// The root filesystem as an uncompressed tarball.
pub fn rootfs(busybox: &Path, supervisor: &Path) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for dir in ["bin", "etc", "tmp", "usr", "usr/local", "usr/local/bin", "workspace", "run", "proc", "sys", "dev"] {
        let mode = if dir == "tmp" { 0o1777 } else { 0o755 };
        tar.append_data(&mut header(tar::EntryType::Directory, 0, mode), dir, std::io::empty())?;
    }
    let busybox = std::fs::read(busybox)?;
    tar.append_data(&mut header(tar::EntryType::Regular, busybox.len() as u64, 0o755), "bin/busybox", &busybox[..])?;
    for applet in APPLETS {
        let mut h = header(tar::EntryType::Symlink, 0, 0o777);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    let supervisor = std::fs::read(supervisor)?;
    let path = "usr/local/bin/berth-supervisor";
    tar.append_data(&mut header(tar::EntryType::Regular, supervisor.len() as u64, 0o755), path, &supervisor[..])?;
    for (path, body) in [("etc/passwd", "root:x:0:0:root:/workspace:/bin/sh\n"), ("etc/group", "root:x:0:\n")] {
        tar.append_data(&mut header(tar::EntryType::Regular, body.len() as u64, 0o644), path, body.as_bytes())?;
    }
    tar.into_inner()
}

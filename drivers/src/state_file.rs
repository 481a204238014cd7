//! The small files a driver keeps its own bookkeeping in, beside the runtime's: written whole
//! and durably, so a reader (this gateway after a crash, another gateway on the host) never
//! sees half of one, and read whole. Every look at a sandbox reads two or three of them, so a
//! read asks the kernel for nothing but the bytes: `std::fs::read` first asks for the file's
//! size, one system call more per file on the path every reconcile poll takes.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{DriverError, io};

/// Room for any of the files read here in one `read`.
const TYPICAL_SIZE: usize = 512;

/// The file's bytes, `None` when it is not there.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>, DriverError> {
    let read = || -> std::io::Result<Vec<u8>> {
        let file = std::fs::File::open(path)?;
        let mut bytes = Vec::with_capacity(TYPICAL_SIZE);
        // Through `Take`, which has no size hint to ask for: `File`'s own `read_to_end` asks.
        file.take(u64::MAX).read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&format!("reading {}", path.display()), e)),
    }
}

/// The file's record, `None` when it is not there.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, DriverError> {
    let Some(bytes) = read(path)? else { return Ok(None) };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| DriverError::Failed(format!("{} is unreadable: {e}", path.display())))
}

/// Writes `bytes` for the file's owner alone to read (they may hold a token or credentials),
/// atomically: a temporary file, synced, then renamed over the old.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> Result<(), DriverError> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| io(&format!("writing {}", path.display()), e))
}

/// Writes `value` as JSON, as [`write`] does.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), DriverError> {
    let bytes = serde_json::to_vec(value).map_err(|e| DriverError::Failed(e.to_string()))?;
    write(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_reads_back_for_its_owner_alone_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), None);
        write_json(&path, &vec![1u32, 2, 3]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), Some(vec![1, 2, 3]));
        assert!(!path.with_extension("tmp").exists(), "the temporary file is renamed away");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "only the owner reads it");
    }

    #[test]
    fn a_file_larger_than_one_read_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        let bytes: Vec<u8> = (0..TYPICAL_SIZE * 9 + 7).map(|i| (i % 251) as u8).collect();
        write(&path, &bytes).unwrap();
        assert_eq!(read(&path).unwrap(), Some(bytes));
    }

    #[test]
    fn an_unreadable_record_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit.json");
        write(&path, b"{not json").unwrap();
        let error = read_json::<Vec<u32>>(&path).unwrap_err().to_string();
        assert!(error.contains("exit.json"), "{error}");
    }
}

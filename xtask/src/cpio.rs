//! A minimal writer for the `newc` cpio format the kernel unpacks as an initramfs.
//!
//! Written here rather than shelling out to `cpio` so that every entry is owned by root whatever
//! user builds it, entries come in a stable order, and the host needs one package less. The
//! archive is left uncompressed: the kernel unpacks it directly, which under TCG is faster than
//! decompressing gzip.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, Result};

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;

/// Accumulates archive entries in memory.
#[derive(Debug, Default)]
pub struct Archive {
    bytes: Vec<u8>,
    next_inode: u32,
}

impl Archive {
    /// Adds every entry below `root` (not `root` itself), parents before children, names sorted.
    pub fn add_tree(&mut self, root: &Path) -> Result<()> {
        self.add_dir_contents(root, "")
    }

    fn add_dir_contents(&mut self, dir: &Path, prefix: &str) -> Result<()> {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .map_err(Error::io("list", dir))?
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        entries.sort();
        for name in entries {
            let path = dir.join(&name);
            let archived = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let meta = fs::symlink_metadata(&path).map_err(Error::io("stat", &path))?;
            let permissions = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).map_err(Error::io("read link", &path))?;
                self.add(&archived, S_IFLNK | 0o777, target.to_string_lossy().as_bytes(), meta.mtime());
            } else if meta.is_dir() {
                self.add(&archived, S_IFDIR | permissions, &[], meta.mtime());
                self.add_dir_contents(&path, &archived)?;
            } else if meta.is_file() {
                let data = fs::read(&path).map_err(Error::io("read", &path))?;
                self.add(&archived, S_IFREG | permissions, &data, meta.mtime());
            }
        }
        Ok(())
    }

    /// Adds one entry with the given mode (type and permission bits), owned by root.
    pub fn add(&mut self, name: &str, mode: u32, data: &[u8], mtime: i64) {
        self.next_inode += 1;
        let nlink = if mode & S_IFDIR == S_IFDIR { 2 } else { 1 };
        let mtime = u32::try_from(mtime.max(0)).unwrap_or(u32::MAX);
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            nlink,
            mtime,
            len32(data.len()),
            0,
            0,
            0,
            0,
            len32(name.len() + 1),
            0, // check
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            // Writing into a Vec cannot fail.
            let _ = write!(self.bytes, "{field:08x}");
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// Ends the archive with the trailer entry and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.add("TRAILER!!!", 0, &[], 0);
        self.bytes
    }

    fn pad(&mut self) {
        while self.bytes.len() % 4 != 0 {
            self.bytes.push(0);
        }
    }
}

fn len32(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_newc_with_aligned_names_and_data() {
        let mut archive = Archive::default();
        archive.add("init", S_IFREG | 0o755, b"#!/bin/sh\n", 0);
        let bytes = archive.finish();
        assert!(bytes.starts_with(b"070701"));
        // header (110) + "init\0" (5) padded to 116, then 10 bytes of data padded to 128.
        assert_eq!(&bytes[110..115], b"init\0");
        assert_eq!(&bytes[116..126], b"#!/bin/sh\n");
        assert_eq!(&bytes[128..134], b"070701");
        let trailer = &bytes[128 + 110..128 + 110 + 11];
        assert_eq!(trailer, b"TRAILER!!!\0");
        assert_eq!(bytes.len() % 4, 0);
        // mode field of the first entry: regular file 0755.
        assert_eq!(&bytes[14..22], b"000081ed");
    }
}

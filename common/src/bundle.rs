//! Code bundles: the folder a task was submitted from, packed by the client (a `.tar.gz`, a
//! `.tar` or a `.zip`) and named by the SHA-256 of its bytes, so an unchanged folder is
//! stored once and a task always runs exactly the code it was submitted with.
//!
//! One set of rules serves both ends: the server refuses a bundle that breaks them before
//! storing it, and the agent applies them again while unpacking (it trusts no bytes it is
//! sent). Only regular files and folders are kept; a link, an absolute path or a `..` is
//! refused, so unpacking can write nowhere but below the folder it is given.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The prefix of a bundle id, as in `sha256:<64 hex digits>`.
pub const ID_PREFIX: &str = "sha256:";

/// What a bundle may hold once unpacked. Entries of every kind count (150,000 empty folders
/// pack into 705 KB and are as many folders to make on a node), and files are never read whole
/// into memory (a 1 MB archive of zeros unpacks to gigabytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Files and folders together.
    pub max_files: u64,
    pub max_unpacked_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_files: 100_000,
            max_unpacked_bytes: 2 << 30,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    TarGz,
    Tar,
    Zip,
}

impl Format {
    /// Told by the bytes, not by a file name the user chose.
    pub fn detect(bytes: &[u8]) -> Option<Format> {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            Some(Format::TarGz)
        } else if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
            Some(Format::Zip)
        } else if bytes.len() >= 262 && &bytes[257..262] == b"ustar" {
            Some(Format::Tar)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::TarGz => "tar.gz",
            Format::Tar => "tar",
            Format::Zip => "zip",
        }
    }
}

/// What a bundle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub format: Format,
    pub files: u64,
    pub unpacked_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("not a .tar.gz, .tar or .zip archive")]
    NotAnArchive,
    #[error("the archive is damaged: {0}")]
    Damaged(String),
    #[error("{0:?} is not a path inside the folder (absolute, '..' or an odd character)")]
    UnsafePath(String),
    #[error("{0:?} is a link; bundles hold only files and folders")]
    Link(String),
    #[error("more than {0} files and folders")]
    TooManyFiles(u64),
    #[error("more than {0} bytes once unpacked")]
    TooLarge(u64),
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The id of a bundle with these bytes.
pub fn id_of(bytes: &[u8]) -> String {
    format!("{ID_PREFIX}{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex digest of a well-formed id (`sha256:` and 64 lower-case hex digits).
pub fn parse_id(id: &str) -> Option<&str> {
    let hex = id.strip_prefix(ID_PREFIX)?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// Checks every entry of the bundle without writing anything (file contents are read
/// through, never held).
pub fn inspect(bytes: &[u8], limits: Limits) -> Result<Summary, BundleError> {
    walk(bytes, limits, |_, content| match content {
        None => Ok(0),
        Some(r) => {
            std::io::copy(r, &mut std::io::sink()).map_err(|e| BundleError::Damaged(e.to_string()))
        }
    })
}

/// Unpacks the bundle below `dest`, which must be a fresh folder: nothing in it may have been
/// made by a task (a link planted there would be followed). Files are streamed to disk.
pub fn unpack(bytes: &[u8], dest: &Path, limits: Limits) -> Result<Summary, BundleError> {
    walk(bytes, limits, |entry, content| {
        let target = dest.join(&entry.path);
        let failed = |source| BundleError::Write {
            path: entry.path.display().to_string(),
            source,
        };
        match content {
            None => std::fs::create_dir_all(&target).map_err(failed).map(|()| 0),
            Some(r) => {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(failed)?;
                }
                let mut f = std::fs::File::create(&target).map_err(failed)?;
                let n = std::io::copy(r, &mut f).map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => {
                        BundleError::Damaged(e.to_string())
                    }
                    _ => failed(e),
                })?;
                f.flush().map_err(failed)?;
                set_mode(&target, entry.executable).map_err(failed)?;
                Ok(n)
            }
        }
    })
}

#[cfg(unix)]
fn set_mode(path: &Path, executable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_: &Path, _: bool) -> std::io::Result<()> {
    Ok(())
}

struct Entry {
    path: PathBuf,
    executable: bool,
}

enum Kind {
    File,
    Dir,
    Link,
}

/// A path of an archive entry as a relative path below the bundle's root; `None` for the
/// root itself (`./`).
fn relative(name: &str) -> Result<Option<PathBuf>, BundleError> {
    let bad = || BundleError::UnsafePath(name.to_string());
    if name.starts_with('/') || name.contains('\\') || name.chars().any(char::is_control) {
        return Err(bad());
    }
    let mut out = PathBuf::new();
    for seg in name.split('/') {
        match seg {
            "" | "." => continue,
            ".." => return Err(bad()),
            s if s.len() > 255 => return Err(bad()),
            s => out.push(s),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Calls `visit` for each folder (`None`) and file (a reader of its bytes, which `visit`
/// reads through and whose length it returns) in archive order, after the entry passed every
/// rule; no file may take more than the room left.
fn walk(
    bytes: &[u8],
    limits: Limits,
    mut visit: impl FnMut(&Entry, Option<&mut dyn Read>) -> Result<u64, BundleError>,
) -> Result<Summary, BundleError> {
    let format = Format::detect(bytes).ok_or(BundleError::NotAnArchive)?;
    let mut files = 0u64;
    let mut entries = 0u64;
    let mut total = 0u64;
    let mut one = |name: &str, kind: Kind, executable: bool, content: &mut dyn Read| {
        let Some(path) = relative(name)? else {
            return Ok(());
        };
        let entry = Entry { path, executable };
        if matches!(kind, Kind::Link) {
            return Err(BundleError::Link(name.to_string()));
        }
        entries += 1;
        if entries > limits.max_files {
            return Err(BundleError::TooManyFiles(limits.max_files));
        }
        match kind {
            Kind::Link => Err(BundleError::Link(name.to_string())),
            Kind::Dir => visit(&entry, None).map(|_| ()),
            Kind::File => {
                files += 1;
                let room = limits.max_unpacked_bytes - total;
                let mut limited = content.take(room.saturating_add(1));
                let n = visit(&entry, Some(&mut limited))?;
                if n > room {
                    return Err(BundleError::TooLarge(limits.max_unpacked_bytes));
                }
                total += n;
                Ok(())
            }
        }
    };
    match format {
        Format::TarGz => tar_entries(flate2::read::GzDecoder::new(bytes), &mut one)?,
        Format::Tar => tar_entries(bytes, &mut one)?,
        Format::Zip => {
            let damaged = |e: zip::result::ZipError| BundleError::Damaged(e.to_string());
            let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(damaged)?;
            for i in 0..archive.len() {
                let mut f = archive.by_index(i).map_err(damaged)?;
                let name = String::from_utf8_lossy(f.name_raw()).into_owned();
                let mode = f.unix_mode().unwrap_or(0);
                let kind = if f.is_dir() {
                    Kind::Dir
                } else if mode & 0o170000 == 0o120000 {
                    Kind::Link
                } else {
                    Kind::File
                };
                one(&name, kind, mode & 0o111 != 0, &mut f)?;
            }
        }
    }
    Ok(Summary {
        format,
        files,
        unpacked_bytes: total,
    })
}

type Visit<'a> = dyn FnMut(&str, Kind, bool, &mut dyn Read) -> Result<(), BundleError> + 'a;

fn tar_entries(r: impl Read, one: &mut Visit<'_>) -> Result<(), BundleError> {
    let damaged = |e: std::io::Error| BundleError::Damaged(e.to_string());
    let mut archive = tar::Archive::new(r);
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Symlink | tar::EntryType::Link => Kind::Link,
            // pax and GNU long-name headers are read by `tar` itself; anything else (devices,
            // fifos) has no place in a code folder.
            _ => return Err(BundleError::Link(name)),
        };
        let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
        one(&name, kind, executable, &mut entry)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tar_gz(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::default(),
        ));
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(if name.ends_with(".sh") { 0o755 } else { 0o644 });
            h.set_entry_type(tar::EntryType::Regular);
            // Written raw so that a bad name reaches the reader as an attacker would send it.
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn a_tar_gz_unpacks_with_its_modes() {
        let bytes = tar_gz(&[
            ("./train.py", b"print(1)\n"),
            ("bin/run.sh", b"#!/bin/sh\n"),
        ]);
        let d = tempfile::tempdir().unwrap();
        let s = unpack(&bytes, d.path(), Limits::default()).unwrap();
        assert_eq!(
            (s.format, s.files, s.unpacked_bytes),
            (Format::TarGz, 2, 19)
        );
        assert_eq!(
            std::fs::read(d.path().join("train.py")).unwrap(),
            b"print(1)\n"
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &str| {
                std::fs::metadata(d.path().join(p))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!((mode("bin/run.sh"), mode("train.py")), (0o755, 0o644));
        }
    }

    #[test]
    fn escaping_paths_and_links_are_refused_before_anything_is_written() {
        for name in ["../evil", "/etc/passwd", "a/../../b", "a\\b"] {
            let bytes = tar_gz(&[("ok.txt", b"1"), (name, b"x")]);
            assert!(
                matches!(
                    inspect(&bytes, Limits::default()),
                    Err(BundleError::UnsafePath(_))
                ),
                "{name}"
            );
        }
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "data", "/etc").unwrap();
        let bytes = b.into_inner().unwrap();
        assert!(matches!(
            inspect(&bytes, Limits::default()),
            Err(BundleError::Link(_))
        ));
    }

    #[test]
    fn a_zip_unpacks_and_a_zip_bomb_stops_at_the_limit() {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        w.start_file("src/model.py", opts).unwrap();
        w.write_all(&vec![b'a'; 10_000]).unwrap();
        let bytes = w.finish().unwrap().into_inner();
        let d = tempfile::tempdir().unwrap();
        let s = unpack(&bytes, d.path(), Limits::default()).unwrap();
        assert_eq!((s.format, s.files), (Format::Zip, 1));
        assert_eq!(
            std::fs::read(d.path().join("src/model.py")).unwrap().len(),
            10_000
        );
        let small = Limits {
            max_files: 10,
            max_unpacked_bytes: 5_000,
        };
        assert!(matches!(
            inspect(&bytes, small),
            Err(BundleError::TooLarge(5_000))
        ));
    }

    #[test]
    fn too_many_files_and_garbage_are_refused() {
        let bytes = tar_gz(&[("a", b"1"), ("b", b"2"), ("c", b"3")]);
        let two = Limits {
            max_files: 2,
            max_unpacked_bytes: 1 << 20,
        };
        assert!(matches!(
            inspect(&bytes, two),
            Err(BundleError::TooManyFiles(2))
        ));
        assert!(matches!(
            inspect(b"hello", Limits::default()),
            Err(BundleError::NotAnArchive)
        ));
        assert!(matches!(
            inspect(&[0x1f, 0x8b, 0, 0], Limits::default()),
            Err(BundleError::Damaged(_))
        ));
    }

    #[test]
    fn folders_count_as_entries() {
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::default(),
        ));
        for i in 0..300 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            h.set_mode(0o755);
            b.append_data(&mut h, format!("d{i}/"), std::io::empty())
                .unwrap();
        }
        let bytes = b.into_inner().unwrap().finish().unwrap();
        let small = Limits {
            max_files: 100,
            max_unpacked_bytes: 1 << 20,
        };
        assert!(matches!(
            inspect(&bytes, small),
            Err(BundleError::TooManyFiles(100))
        ));
        let d = tempfile::tempdir().unwrap();
        assert!(unpack(&bytes, d.path(), small).is_err());
        assert!(
            std::fs::read_dir(d.path()).unwrap().count() <= 100,
            "no more folders are made than allowed"
        );
    }

    #[test]
    fn a_small_archive_of_zeros_stops_at_the_limit_as_it_streams() {
        // 64 MiB of zeros packs into about 64 KB.
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::best(),
        ));
        let mut h = tar::Header::new_gnu();
        h.set_size(64 << 20);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, "zeros.bin", std::io::repeat(0).take(64 << 20))
            .unwrap();
        let bytes = b.into_inner().unwrap().finish().unwrap();
        assert!(bytes.len() < 1 << 20, "{}", bytes.len());
        let limits = Limits {
            max_files: 10,
            max_unpacked_bytes: 8 << 20,
        };
        assert!(matches!(
            inspect(&bytes, limits),
            Err(BundleError::TooLarge(_))
        ));
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            unpack(&bytes, d.path(), limits),
            Err(BundleError::TooLarge(_))
        ));
        let written = std::fs::metadata(d.path().join("zeros.bin")).map_or(0, |m| m.len());
        assert!(written <= (8 << 20) + 1, "{written} bytes written");
        let roomy = Limits {
            max_files: 10,
            max_unpacked_bytes: 128 << 20,
        };
        assert_eq!(inspect(&bytes, roomy).unwrap().unpacked_bytes, 64 << 20);
    }

    #[test]
    fn ids_are_checked() {
        let id = id_of(b"x");
        assert!(parse_id(&id).is_some());
        assert!(parse_id("sha256:ABC").is_none());
        assert!(parse_id(&id.to_uppercase()).is_none());
        assert!(parse_id(&id[..id.len() - 1]).is_none());
    }
}

//! File work inside folders a task can change while the agent works in them: its checkpoint
//! and results folders during the run, what a uid left in the shared `/tmp` of a uid node.
//!
//! The agent runs as root in the host's mount namespace, so any path it follows could lead
//! anywhere on the host: a task that swaps a folder the agent has just listed for a link to
//! `/etc` would have root read (or write, or chown) there for it. Everything here therefore
//! starts from a handle on a folder and resolves names beneath it with no symbolic link
//! followed at any component: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or one
//! `openat(O_NOFOLLOW)` per component on kernels older than 5.6. What is opened is then
//! judged by its handle (`fstat`), never by its path again.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Deepest folder nesting the agent walks into: a task could nest folders far deeper than a
/// checkpoint ever does, to make the agent hold a handle per level.
pub const MAX_DEPTH: usize = 128;

/// Deepest nesting removal goes into: a task may nest folders this deep to outlast its
/// cleanup (what is left then keeps its uid from being handed on; see `uids`).
pub const MAX_REMOVE_DEPTH: usize = 1024;

/// Most entries one walk visits.
pub const MAX_ENTRIES: usize = 1_000_000;

/// A folder held open; names are resolved beneath it.
#[derive(Debug)]
pub struct Folder {
    fd: OwnedFd,
}

/// A regular file found by [`Folder::files`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileInfo {
    /// Relative to the folder, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: u128,
    pub uid: u32,
}

impl FileInfo {
    fn of(path: String, meta: &std::fs::Metadata) -> FileInfo {
        FileInfo {
            path,
            size: meta.len(),
            mtime_ns: mtime_ns(meta),
            uid: meta.uid(),
        }
    }
}

/// Modification time of `meta` in nanoseconds since the epoch (0 before it).
pub fn mtime_ns(meta: &std::fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

fn errno(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// Whether `rel` is a relative `/`-separated path of plain names: no empty, `.` or `..`
/// component, nothing absolute.
pub fn is_plain_relative(rel: &str) -> bool {
    !rel.is_empty()
        && !rel.starts_with('/')
        && rel
            .split('/')
            .all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\0'))
}

fn plain(rel: &str) -> io::Result<&str> {
    if is_plain_relative(rel) {
        Ok(rel)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{rel:?} is not a plain relative path"),
        ))
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// A file to read, opened without side effects: never a terminal to take, never a pipe to
/// wait on.
const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NOFOLLOW)
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

impl Folder {
    /// Opens a folder by path. Every component but the last must be the agent's own (its
    /// state folder, `/tmp`): only the last is refused when it is a link.
    pub fn open(path: &Path) -> io::Result<Folder> {
        let fd = rfs::open(path, DIR_FLAGS, Mode::empty()).map_err(errno)?;
        Ok(Folder { fd })
    }

    /// The same folder, held twice.
    pub fn try_clone(&self) -> io::Result<Folder> {
        Ok(Folder {
            fd: self.fd.try_clone()?,
        })
    }

    /// Opens `rel` beneath this folder, following no link anywhere in it.
    fn resolve(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let rel = plain(rel)?;
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        match rfs::openat2(&self.fd, rel, flags, mode, resolve) {
            // Missing, or refused by a seccomp profile that predates it.
            Err(Errno::NOSYS | Errno::PERM) => self.resolve_by_component(rel, flags, mode),
            r => r.map_err(errno),
        }
    }

    /// `resolve` where `openat2` is missing: one `openat(O_NOFOLLOW)` per component, each
    /// from the handle of the one before.
    fn resolve_by_component(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let mut parts = rel.split('/').peekable();
        let mut dir: Option<OwnedFd> = None;
        while let Some(part) = parts.next() {
            let at = dir.as_ref().map_or(self.fd.as_fd(), AsFd::as_fd);
            if parts.peek().is_none() {
                return rfs::openat(at, part, flags, mode).map_err(errno);
            }
            dir = Some(rfs::openat(at, part, DIR_FLAGS, Mode::empty()).map_err(errno)?);
        }
        Err(io::Error::new(io::ErrorKind::InvalidInput, "empty path"))
    }

    /// The folder `rel` beneath this one.
    pub fn open_dir(&self, rel: &str) -> io::Result<Folder> {
        Ok(Folder {
            fd: self.resolve(rel, DIR_FLAGS, Mode::empty())?,
        })
    }

    /// The regular file `rel`, opened for reading; anything else (a link, a folder, a pipe)
    /// is refused.
    pub fn open_file(&self, rel: &str) -> io::Result<(File, std::fs::Metadata)> {
        let f = File::from(self.resolve(rel, READ_FLAGS, Mode::empty())?);
        let meta = f.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{rel} is not a regular file"),
            ));
        }
        Ok((f, meta))
    }

    /// Reads the regular file `rel` if it holds at most `max` bytes.
    pub fn read_small(&self, rel: &str, max: u64) -> io::Result<Vec<u8>> {
        let (f, _) = self.open_file(rel)?;
        let mut out = Vec::new();
        f.take(max + 1).read_to_end(&mut out)?;
        if out.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{rel} is larger than {max} bytes"),
            ));
        }
        Ok(out)
    }

    /// Makes the folder `rel` and any missing parents (mode `mode`, before the umask).
    pub fn create_dir_all(&self, rel: &str, mode: u32) -> io::Result<Folder> {
        let rel = plain(rel)?;
        let mut cur = self.try_clone()?;
        for part in rel.split('/') {
            match rfs::mkdirat(&cur.fd, part, Mode::from_bits_truncate(mode)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(errno(e)),
            }
            cur = Folder {
                fd: rfs::openat(&cur.fd, part, DIR_FLAGS, Mode::empty()).map_err(errno)?,
            };
        }
        Ok(cur)
    }

    /// Creates the new file `name` in this folder; fails if anything has that name.
    pub fn create_file(&self, name: &str, mode: u32) -> io::Result<File> {
        let name = single(name)?;
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(errno)?;
        Ok(File::from(fd))
    }

    /// Gives `file` (open, anywhere on this file system) the name `name` in this folder: a
    /// hard link made from the handle, so that what the handle was checked to be is what is
    /// linked. Where the file system or the agent's privileges allow no link, the bytes are
    /// copied. Returns whether it was a link.
    pub fn link_or_copy(&self, file: &File, name: &str) -> io::Result<bool> {
        let name = single(name)?;
        // Root may link an open file directly (CAP_DAC_READ_SEARCH).
        if rfs::linkat(file, c"", &self.fd, name, AtFlags::EMPTY_PATH).is_ok() {
            return Ok(true);
        }
        let magic = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
        if rfs::linkat(
            rfs::CWD,
            magic.as_str(),
            &self.fd,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
        .is_ok()
        {
            return Ok(true);
        }
        // A copy takes what the file held when it was opened, no more (a task may keep
        // appending), and never a sparse file (a terabyte of holes would be a terabyte here).
        let meta = file.metadata()?;
        if meta.blocks().saturating_mul(512) < meta.len() {
            return Err(io::Error::other(format!(
                "{name} is sparse; it is not copied"
            )));
        }
        let mut out = self.create_file(name, 0o600)?;
        io::copy(&mut file.take(meta.len()), &mut out)?;
        Ok(false)
    }

    /// Removes `name` from this folder: a file or link as it is, a folder with everything
    /// below it. Nothing is followed; a missing name is no error.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let name = single(name)?;
        let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
        self.remove_entry(&name, 0)
    }

    /// Removes the entry `name` (any bytes), everything below it first; goes on past what it
    /// cannot remove and reports the first failure.
    pub fn remove_raw(&self, name: &CStr) -> io::Result<()> {
        self.remove_entry(name, 0)
    }

    fn remove_entry(&self, name: &CStr, depth: usize) -> io::Result<()> {
        match rfs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::ISDIR | Errno::PERM) => {}
            Err(e) => return Err(errno(e)),
        }
        if depth >= MAX_REMOVE_DEPTH {
            return Err(io::Error::other(format!(
                "folders nested deeper than {MAX_REMOVE_DEPTH} levels"
            )));
        }
        let sub = match rfs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Folder { fd },
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(errno(e)),
        };
        let mut first = None;
        for child in sub.raw_names()? {
            if let Err(e) = sub.remove_entry(&child, depth + 1) {
                first.get_or_insert(e);
            }
        }
        drop(sub);
        match rfs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => first.map_or(Ok(()), Err),
            Err(e) => Err(first.unwrap_or_else(|| errno(e))),
        }
    }

    /// Renames `from` to `to`, both names in this folder.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        rfs::renameat(&self.fd, single(from)?, &self.fd, single(to)?).map_err(errno)
    }

    /// The names in this folder (not `.` and `..`), whatever bytes they hold.
    fn raw_names(&self) -> io::Result<Vec<std::ffi::CString>> {
        let mut out = Vec::new();
        let dir = rfs::Dir::read_from(&self.fd).map_err(errno)?;
        for entry in dir {
            let entry = entry.map_err(errno)?;
            let name: &CStr = entry.file_name();
            if name != c"." && name != c".." {
                out.push(name.to_owned());
            }
        }
        Ok(out)
    }

    /// Each entry of this folder (not below it), whatever bytes its name holds: its name, its
    /// owner, and whether it is a folder everyone may write to.
    pub fn entries(&self) -> io::Result<Vec<(std::ffi::CString, u32, bool)>> {
        let mut out = Vec::new();
        for raw in self.raw_names()? {
            let Ok(meta) = self.entry_meta(&raw) else {
                continue;
            };
            let shared = meta.is_dir() && meta.mode() & 0o002 != 0;
            out.push((raw, meta.uid(), shared));
        }
        Ok(out)
    }

    /// The folder `name` (any bytes) in this one, not followed if a link.
    pub fn open_dir_raw(&self, name: &CStr) -> io::Result<Folder> {
        Ok(Folder {
            fd: rfs::openat(&self.fd, name, DIR_FLAGS, Mode::empty()).map_err(errno)?,
        })
    }

    /// The owner and mode of this folder itself.
    pub fn owner_and_mode(&self) -> io::Result<(u32, u32)> {
        let meta = File::from(self.fd.try_clone()?).metadata()?;
        Ok((meta.uid(), meta.mode()))
    }

    /// Metadata of the entry `name` itself (a link is not followed).
    fn entry_meta(&self, name: &CStr) -> io::Result<std::fs::Metadata> {
        let fd = rfs::openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        File::from(fd).metadata()
    }

    /// Every regular file below this folder, in no particular order. Links, pipes and the
    /// like are left out; names that are not UTF-8 are passed to `skipped`.
    pub fn files(&self, skipped: &mut dyn FnMut(&str)) -> io::Result<Vec<FileInfo>> {
        let mut out = Vec::new();
        let mut budget = MAX_ENTRIES;
        self.walk(
            "",
            0,
            &mut budget,
            &mut |path, meta| {
                if meta.is_file() {
                    out.push(FileInfo::of(path.to_owned(), meta));
                }
                Ok(())
            },
            skipped,
        )?;
        Ok(out)
    }

    /// Every entry below this folder (folders before what they hold), with its own metadata:
    /// no link is followed, and entries that are not UTF-8 or too deep go to `skipped`.
    pub fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &std::fs::Metadata) -> io::Result<()>,
        skipped: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        let mut budget = MAX_ENTRIES;
        self.walk("", 0, &mut budget, visit, skipped)
    }

    /// Sets this folder's own permission bits.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        rfs::fchmod(&self.fd, Mode::from_bits_truncate(mode)).map_err(errno)
    }

    /// Gives this folder itself (not what is in it) to `uid`/`gid`.
    pub fn chown_self(&self, uid: u32, gid: u32) -> io::Result<()> {
        rfs::fchown(
            &self.fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(errno)
    }

    /// Gives this folder and everything below it (links themselves, not what they point at)
    /// to `uid`/`gid`.
    pub fn chown_all(&self, uid: u32, gid: u32) -> io::Result<()> {
        let (owner, group) = (
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
        rfs::fchown(&self.fd, owner, group).map_err(errno)?;
        let mut budget = MAX_ENTRIES;
        self.chown_below(owner, group, 0, &mut budget)
    }

    fn chown_below(
        &self,
        owner: Option<rustix::fs::Uid>,
        group: Option<rustix::fs::Gid>,
        depth: usize,
        budget: &mut usize,
    ) -> io::Result<()> {
        for name in self.raw_names()? {
            *budget = budget.checked_sub(1).ok_or_else(too_many)?;
            // A file with other names may be another's file linked in (a task's `ln
            // /etc/shadow x` where hard links are not protected): never given away.
            if self
                .entry_meta(&name)
                .is_ok_and(|m| !m.is_dir() && m.nlink() > 1)
            {
                continue;
            }
            match rfs::chownat(&self.fd, &*name, owner, group, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(errno(e)),
            }
            if let Ok(fd) = rfs::openat(&self.fd, &*name, DIR_FLAGS, Mode::empty()) {
                if depth + 1 >= MAX_DEPTH {
                    return Err(io::Error::other(format!(
                        "folders nested deeper than {MAX_DEPTH} levels"
                    )));
                }
                Folder { fd }.chown_below(owner, group, depth + 1, budget)?;
            }
        }
        Ok(())
    }

    fn walk(
        &self,
        prefix: &str,
        depth: usize,
        budget: &mut usize,
        visit: &mut dyn FnMut(&str, &std::fs::Metadata) -> io::Result<()>,
        skipped: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        for raw in self.raw_names()? {
            *budget = budget.checked_sub(1).ok_or_else(too_many)?;
            let name = match raw.to_str() {
                Ok(n) => n.to_owned(),
                Err(_) => {
                    skipped(&format!("{prefix}{}", raw.to_string_lossy()));
                    continue;
                }
            };
            let path = format!("{prefix}{name}");
            let meta = match self.entry_meta(&raw) {
                Ok(m) => m,
                // Removed by the task meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    skipped(&path);
                    continue;
                }
                // Swapped for a link or a file since: not followed, left out.
                let Ok(fd) = rfs::openat(&self.fd, &*raw, DIR_FLAGS, Mode::empty()) else {
                    continue;
                };
                visit(&path, &meta)?;
                Folder { fd }.walk(&format!("{path}/"), depth + 1, budget, visit, skipped)?;
            } else {
                visit(&path, &meta)?;
            }
        }
        Ok(())
    }
}

fn too_many() -> io::Error {
    io::Error::other(format!("more than {MAX_ENTRIES} entries"))
}

/// A single name (no `/`).
fn single(name: &str) -> io::Result<&str> {
    if is_plain_relative(name) && !name.contains('/') {
        Ok(name)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single name"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn folder(d: &Path) -> Folder {
        Folder::open(d).unwrap()
    }

    #[test]
    fn links_are_never_followed_at_any_component() {
        let d = tempfile::tempdir().unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s").unwrap();
        let inside = d.path().join("inside");
        std::fs::create_dir_all(inside.join("real")).unwrap();
        std::fs::write(inside.join("real/f"), b"ok").unwrap();
        symlink(&outside, inside.join("dir-link")).unwrap();
        symlink(outside.join("secret"), inside.join("file-link")).unwrap();
        symlink("real", inside.join("relative-link")).unwrap();
        let f = folder(&inside);
        assert_eq!(f.read_small("real/f", 10).unwrap(), b"ok");
        for bad in [
            "dir-link/secret",
            "file-link",
            "relative-link/f",
            "../outside/secret",
            "/etc/passwd",
            "real/../real/f",
        ] {
            assert!(f.open_file(bad).is_err(), "{bad}");
        }
        assert!(f.open_dir("dir-link").is_err());
        assert!(
            Folder::open(&inside.join("dir-link")).is_err(),
            "last component"
        );
        let mut skipped = Vec::new();
        let files = f.files(&mut |p| skipped.push(p.to_owned())).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["real/f"], "links are neither listed nor entered");
    }

    #[test]
    fn a_folder_swapped_for_a_link_after_opening_stays_the_one_opened() {
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("w.pt"), b"SECRET").unwrap();
        let ck = d.path().join("ck");
        std::fs::create_dir_all(ck.join("sub")).unwrap();
        std::fs::write(ck.join("sub/w.pt"), b"decoy!").unwrap();
        let f = folder(&ck);
        // The task swaps `sub` for a link to the secret folder.
        std::fs::rename(ck.join("sub"), ck.join("old")).unwrap();
        symlink(&secret, ck.join("sub")).unwrap();
        assert!(f.open_file("sub/w.pt").is_err());
        assert_eq!(f.read_small("old/w.pt", 100).unwrap(), b"decoy!");
    }

    #[test]
    fn removal_takes_links_not_their_targets() {
        let d = tempfile::tempdir().unwrap();
        let keep = d.path().join("keep");
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::write(keep.join("precious"), b"1").unwrap();
        let t = d.path().join("t");
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        std::fs::write(t.join("a/b/x"), b"1").unwrap();
        symlink(&keep, t.join("a/link")).unwrap();
        let f = folder(&t);
        f.remove("a").unwrap();
        f.remove("missing").unwrap();
        assert!(!t.join("a").exists());
        assert!(keep.join("precious").exists());
        assert!(f.remove("../keep").is_err());
    }

    #[test]
    fn files_are_made_new_and_linked_from_their_handle() {
        let d = tempfile::tempdir().unwrap();
        let f = folder(d.path());
        let sub = f.create_dir_all("x/y", 0o700).unwrap();
        let mut w = sub.create_file("n", 0o600).unwrap();
        std::io::Write::write_all(&mut w, b"data").unwrap();
        assert!(
            sub.create_file("n", 0o600).is_err(),
            "never over an existing name"
        );
        symlink("/etc/passwd", d.path().join("x/y/l")).unwrap();
        assert!(sub.create_file("l", 0o600).is_err(), "never through a link");
        let (file, _) = f.open_file("x/y/n").unwrap();
        let staging = f.create_dir_all("staging", 0o700).unwrap();
        staging.link_or_copy(&file, "copy").unwrap();
        assert_eq!(
            std::fs::read(d.path().join("staging/copy")).unwrap(),
            b"data"
        );
        assert!(
            f.create_dir_all("x/y/l/z", 0o700).is_err(),
            "no folder made through a link"
        );
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let f = folder(d.path());
        let deep = vec!["d"; MAX_DEPTH + 5].join("/");
        f.create_dir_all(&deep, 0o700).unwrap();
        let mut skipped = Vec::new();
        f.files(&mut |p| skipped.push(p.to_owned())).unwrap();
        assert_eq!(skipped.len(), 1, "the too-deep folder is reported");
    }
}

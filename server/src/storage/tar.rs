//! Files of an artifact as one tar archive, streamed from object storage file by file: the
//! archive is never held whole, and its length is known before the first byte (headers and
//! padding are fixed by the recorded sizes), so a download shows its progress.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::{ByteStream, ObjectStore};

/// One file of an archive: where it is stored, and its path and size in the archive.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub bucket: String,
    pub key: String,
    pub path: String,
    pub size: u64,
}

/// The archive's length and its bytes. A file that is shorter or longer in storage than
/// recorded ends the stream with an error rather than a corrupt archive.
pub fn archive(
    store: Arc<dyn ObjectStore>,
    files: Vec<Entry>,
    mtime: u64,
) -> (u64, impl Stream<Item = std::io::Result<Bytes>>) {
    let files = Arc::new(files);
    let length: u64 = files
        .iter()
        .map(|f| header(&f.path, f.size, mtime).len() as u64 + f.size + padding(f.size) as u64)
        .sum::<u64>()
        + 1024;
    let stream = futures_util::stream::unfold(TarState::Header(0), move |st| {
        let (store, files) = (store.clone(), files.clone());
        async move {
            let io = std::io::Error::other;
            match st {
                TarState::Done => None,
                TarState::Header(i) if i >= files.len() => {
                    Some((Ok(Bytes::from(vec![0u8; 1024])), TarState::Done))
                }
                TarState::Header(i) => {
                    let f = &files[i];
                    match store.get(&f.bucket, &f.key).await {
                        Ok((_, body)) => Some((
                            Ok(Bytes::from(header(&f.path, f.size, mtime))),
                            TarState::Body(i, body, 0),
                        )),
                        Err(e) => Some((Err(io(e.to_string())), TarState::Done)),
                    }
                }
                TarState::Body(i, mut body, seen) => match body.next().await {
                    Some(Ok(chunk)) => {
                        let seen = seen + chunk.len() as u64;
                        if seen > files[i].size {
                            return Some((
                                Err(io("a result file grew".to_owned())),
                                TarState::Done,
                            ));
                        }
                        Some((Ok(chunk), TarState::Body(i, body, seen)))
                    }
                    Some(Err(e)) => Some((Err(e), TarState::Done)),
                    None if seen != files[i].size => Some((
                        Err(io("a result file is shorter than recorded".to_owned())),
                        TarState::Done,
                    )),
                    None => Some((
                        Ok(Bytes::from(vec![0u8; padding(seen)])),
                        TarState::Header(i + 1),
                    )),
                },
            }
        }
    });
    (length, stream)
}

/// A ustar/GNU header for one regular file (with a GNU long-name entry before it when the
/// path does not fit the 100 bytes of the classic header).
fn header(path: &str, size: u64, mtime: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    let mut h = ::tar::Header::new_gnu();
    let name = path.as_bytes();
    if name.len() > 100 {
        let mut l = ::tar::Header::new_gnu();
        let long = b"././@LongLink";
        l.as_old_mut().name[..long.len()].copy_from_slice(long);
        l.set_mode(0o644);
        l.set_size(name.len() as u64 + 1);
        l.set_entry_type(::tar::EntryType::GNULongName);
        l.set_cksum();
        out.extend_from_slice(l.as_bytes());
        out.extend_from_slice(name);
        out.push(0);
        out.resize(out.len() + padding(name.len() as u64 + 1), 0);
        h.as_old_mut().name.copy_from_slice(&name[..100]);
    } else {
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
    }
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_entry_type(::tar::EntryType::Regular);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out
}

fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

enum TarState {
    Header(usize),
    Body(usize, ByteStream, u64),
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tar_headers_round_trip_through_the_tar_reader() {
        let long = format!("{}/model.pt", "d".repeat(120));
        let mut archive = Vec::new();
        for (p, body) in [
            ("a.txt", b"hello".to_vec()),
            (long.as_str(), vec![7u8; 700]),
        ] {
            archive.extend(header(p, body.len() as u64, 1_700_000_000));
            archive.extend(&body);
            archive.resize(archive.len() + padding(body.len() as u64), 0);
        }
        archive.extend([0u8; 1024]);
        let mut r = ::tar::Archive::new(archive.as_slice());
        let got: Vec<(String, u64)> = r
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.size())
            })
            .collect();
        assert_eq!(got, vec![("a.txt".to_string(), 5), (long, 700)]);
    }
}

//! Faults of the database's storage (a full disk, a file made read-only, I/O errors, a lock
//! held past the busy timeout), told apart from ordinary errors so that the API answers 503
//! "try again" instead of 500, and so that the pool recovers by itself once the fault is gone.
//!
//! Recovery: a SQLite connection opened while its file could not be written stays read-only
//! for its whole life, and one whose rollback failed may keep holding the write lock. Every
//! connection that was open when a fault was seen is therefore closed instead of being reused
//! (`is_stale`, checked by the pool before handing a connection out and when taking one back).
//! The next request opens a fresh connection, which works as soon as the disk does.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What kept the database from writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    Full,
    ReadOnly,
    Io,
    Locked,
}

impl std::fmt::Display for StoreFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreFault::Full => "the database's disk is full",
            StoreFault::ReadOnly => "the database is read-only",
            StoreFault::Io => "the database's disk failed to read or write",
            StoreFault::Locked => "the database stayed locked",
        })
    }
}

impl StoreFault {
    /// The fault an error shows, if it is one. SQLite result codes (primary code in the low
    /// byte) and PostgreSQL SQLSTATEs.
    pub fn of(e: &sqlx::Error) -> Option<StoreFault> {
        match e {
            sqlx::Error::Io(io) => Some(match io.raw_os_error() {
                Some(28) => StoreFault::Full,     // ENOSPC
                Some(30) => StoreFault::ReadOnly, // EROFS
                _ => StoreFault::Io,
            }),
            sqlx::Error::Database(db) => {
                let code = db.code()?;
                if let Ok(n) = code.parse::<i64>() {
                    return match n & 0xff {
                        13 => Some(StoreFault::Full),
                        8 => Some(StoreFault::ReadOnly),
                        10 | 14 => Some(StoreFault::Io),
                        5 | 6 => Some(StoreFault::Locked),
                        _ => None,
                    };
                }
                match code.as_ref() {
                    "53100" => Some(StoreFault::Full),
                    "25006" => Some(StoreFault::ReadOnly),
                    "58030" => Some(StoreFault::Io),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// When a fault was last seen in this process. One process serves one database, so a single
/// clock is enough; a second store in the process (tests) only reconnects once more.
static LAST_FAULT: Mutex<Option<Instant>> = Mutex::new(None);

pub fn record(fault: StoreFault) {
    tracing::warn!(%fault, "database fault; its connections will be replaced");
    *LAST_FAULT.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
}

/// A connection of this age was already open at the last fault, and is not to be used again.
pub fn is_stale(age: Duration) -> bool {
    LAST_FAULT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_some_and(|at| age >= at.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_open_at_a_fault_are_stale_newer_ones_are_not() {
        record(StoreFault::Full);
        std::thread::sleep(Duration::from_millis(20));
        assert!(is_stale(Duration::from_secs(5)));
        assert!(!is_stale(Duration::from_millis(1)));
    }

    #[test]
    fn disk_errors_are_faults_other_errors_are_not() {
        let io = |code| sqlx::Error::Io(std::io::Error::from_raw_os_error(code));
        assert_eq!(StoreFault::of(&io(28)), Some(StoreFault::Full));
        assert_eq!(StoreFault::of(&io(30)), Some(StoreFault::ReadOnly));
        assert_eq!(StoreFault::of(&sqlx::Error::RowNotFound), None);
    }
}

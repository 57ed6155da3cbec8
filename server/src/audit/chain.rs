//! The hash chain that makes the audit trail tamper-evident: each record's hash covers its
//! fields and the hash of the record before it, and the chain's head remembers the last one.
//! Editing, removing, reordering or cutting off records breaks a link that [`verify`] finds.
//! (Whoever can rewrite the whole database can rewrite the whole chain: operators who need
//! more note the head hash that `autodl-server audit verify` prints somewhere else.)

use sha2::{Digest, Sha256};

use crate::store::{AuditRecord, NewAuditRecord};

/// The hash of record `seq` at `at` following `prev`: SHA-256 (hex) over a JSON array of every
/// field, so no two different records share the bytes hashed.
pub fn link(prev: &str, seq: i64, at: i64, r: &NewAuditRecord) -> String {
    let fields = serde_json::json!([
        seq,
        at,
        r.tenant_id,
        r.actor_id,
        r.actor_email,
        r.action,
        r.target,
        r.detail,
        r.ip,
        prev
    ]);
    hex::encode(Sha256::digest(fields.to_string().as_bytes()))
}

/// Where and why a chain does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the audit trail is broken at record {seq}: {reason}")]
pub struct Broken {
    pub seq: i64,
    pub reason: String,
}

/// Checks records as they follow each other from the start (fed in pages, in order).
#[derive(Debug, Default)]
pub struct Verifier {
    seq: i64,
    hash: String,
}

impl Verifier {
    pub fn check(&mut self, r: &AuditRecord) -> Result<(), Broken> {
        let broken = |reason: &str| Broken {
            seq: r.seq,
            reason: reason.to_owned(),
        };
        if r.seq != self.seq + 1 {
            return Err(Broken {
                seq: self.seq + 1,
                reason: format!(
                    "record {} is missing (the next one is {})",
                    self.seq + 1,
                    r.seq
                ),
            });
        }
        if r.prev_hash != self.hash {
            return Err(broken("it does not follow the record before it"));
        }
        if link(&r.prev_hash, r.seq, r.at, &r.fields()) != r.hash {
            return Err(broken("its content was changed after it was written"));
        }
        self.seq = r.seq;
        self.hash = r.hash.clone();
        Ok(())
    }

    /// After the last record: the head must name it, or records were cut off the end.
    pub fn finish(self, head_seq: i64, head_hash: &str) -> Result<Verified, Broken> {
        if head_seq != self.seq || head_hash != self.hash {
            return Err(Broken {
                seq: self.seq + 1,
                reason: format!(
                    "the trail ends at record {} but {head_seq} were written",
                    self.seq
                ),
            });
        }
        Ok(Verified {
            records: self.seq,
            head: self.hash,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub records: i64,
    pub head: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: i64) -> Vec<AuditRecord> {
        let mut prev = String::new();
        (1..=n)
            .map(|seq| {
                let new = NewAuditRecord {
                    tenant_id: Some("t".into()),
                    actor_id: Some("u".into()),
                    actor_email: Some("a@example.com".into()),
                    action: "api_key.created".into(),
                    target: format!("key {seq}"),
                    detail: "{}".into(),
                    ip: Some("127.0.0.1".into()),
                };
                let hash = link(&prev, seq, seq * 10, &new);
                let r = AuditRecord::from_new(new, seq, seq * 10, prev.clone(), hash.clone());
                prev = hash;
                r
            })
            .collect()
    }

    fn verify(records: &[AuditRecord], head_seq: i64, head: &str) -> Result<Verified, Broken> {
        let mut v = Verifier::default();
        for r in records {
            v.check(r)?;
        }
        v.finish(head_seq, head)
    }

    #[test]
    fn an_intact_chain_verifies() {
        let c = chain(5);
        let head = c[4].hash.clone();
        assert_eq!(verify(&c, 5, &head).unwrap().records, 5);
        assert_eq!(verify(&[], 0, "").unwrap().records, 0);
    }

    #[test]
    fn edits_removals_and_cuts_are_found() {
        let c = chain(5);
        let head = c[4].hash.clone();
        let mut edited = c.clone();
        edited[2].target = "someone else".into();
        assert_eq!(verify(&edited, 5, &head).unwrap_err().seq, 3);
        let mut removed = c.clone();
        removed.remove(1);
        assert_eq!(verify(&removed, 5, &head).unwrap_err().seq, 2);
        // Rehashing an edited record does not help: the next one no longer follows it.
        let mut rehashed = c.clone();
        rehashed[2].ip = Some("10.0.0.1".into());
        let fields = NewAuditRecord {
            ip: rehashed[2].ip.clone(),
            ..rehashed[2].fields()
        };
        rehashed[2].hash = link(&rehashed[2].prev_hash, 3, rehashed[2].at, &fields);
        assert_eq!(verify(&rehashed, 5, &head).unwrap_err().seq, 4);
        assert_eq!(verify(&c[..4], 5, &head).unwrap_err().seq, 5);
    }
}

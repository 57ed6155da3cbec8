//! Trace-driven simulators. They run the library's policy code in virtual time and are
//! deterministic for a given input and seed; the `autodl-sim` binary is a thin wrapper.

pub mod jobs;
pub mod oracle;
pub mod packing;

/// Errors reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Parses a seed list such as `42-51` or `1,2,7`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, SimError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || SimError::Invalid(format!("bad seed range {part:?}"));
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (u64, u64) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a > b {
                return Err(bad());
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|_| bad())?);
        }
    }
    if out.is_empty() {
        return Err(SimError::Invalid("no seeds".into()));
    }
    Ok(out)
}

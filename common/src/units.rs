//! Sizes and lengths of time as people write them, read by one grammar everywhere: task specs
//! on the server, the agent's flags and its simulated GPUs.

use std::str::FromStr;
use std::time::Duration;

/// Bytes in `s`: a whole number of bytes, or a number and a unit. `KB`, `MB`, `GB`, `TB` are
/// powers of 1000 and `KiB`, `MiB`, `GiB`, `TiB` powers of 1024 (any case, a space allowed);
/// a bare letter is binary, as `--mem=40G` is in Slurm and `--memory 40g` in Docker: `40G` is
/// 40 GiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let unit_at = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = (s[..unit_at].trim(), s[unit_at..].trim());
    let bare_letter = unit.len() == 1 && "kmgtpe".contains(unit.to_ascii_lowercase().as_str());
    let text = if bare_letter {
        format!("{number} {unit}iB")
    } else {
        format!("{number} {unit}")
    };
    bytesize::ByteSize::from_str(text.trim())
        .map(|b| b.as_u64())
        .map_err(|_| format!("{s:?} is not a size (use e.g. \"20GiB\", \"512MiB\" or bytes)"))
}

/// A length of time: seconds as a number (`90`, `0.5`), or text such as `2h30m`, `90m`,
/// `1d 12h`, `500ms` (humantime's units).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || {
        format!(
            "{s:?} is not a length of time; write seconds or e.g. \"2h30m\", \"90m\", \"1d 12h\""
        )
    };
    if s.starts_with(|c: char| c.is_ascii_digit() || c == '.') && s.parse::<f64>().is_ok() {
        let secs: f64 = s.parse().map_err(|_| bad())?;
        return Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    humantime::parse_duration(s).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("40G"), Ok(40 * GIB));
        assert_eq!(parse_size("40g"), Ok(40 * GIB));
        assert_eq!(parse_size("40GiB"), Ok(40 * GIB));
        assert_eq!(parse_size("40 GiB"), Ok(40 * GIB));
        assert_eq!(parse_size("40GB"), Ok(40_000_000_000));
        assert_eq!(parse_size("1.5 MiB"), Ok(3 << 19));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in ["", "G", "lots", "1 GX", "-1G", "1..2G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1d 12h"), Ok(Duration::from_secs(36 * 3600)));
        assert_eq!(parse_duration("2h30m"), Ok(Duration::from_secs(9000)));
        for bad in ["", "x", "5 parsecs", "-1", "nan", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}

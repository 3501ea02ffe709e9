//! Small parsing helpers shared by the entry points, and the allocator's settings
//! ([`allocator`]).

pub(crate) mod allocator;

/// Parses a byte size such as `4GiB`, `512MiB`, `1.5GB`, `1000000` (plain bytes).
/// Binary (`KiB`, `MiB`, `GiB`, `TiB`) and decimal (`KB`, `MB`, `GB`, `TB`) suffixes, any case.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("invalid byte size {s:?}: expected e.g. 4GiB, 512MiB or 1000000"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => return Err(format!("invalid byte size {s:?}: unknown unit {other:?}")),
    };
    Ok((value * mult) as u64)
}

/// A `Name:  1234 kB` field of a Linux /proc file (`/proc/meminfo`, `/proc/self/status`),
/// in bytes; `None` where the file or the field is missing.
pub fn proc_kib_field(path: &str, name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.split(':').next() == Some(name))?;
    let kib: u64 = line[name.len() + 1..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The process's resident memory at a stage of start-up, in the debug log (where a model's
/// memory goes: `MINIVLLM_LOG=minivllm=debug`).
pub(crate) fn log_rss(stage: &str) {
    let bytes = |field| proc_kib_field("/proc/self/status", field);
    if let (Some(rss), Some(peak)) = (bytes("VmRSS"), bytes("VmHWM")) {
        tracing::debug!(rss_mib = rss >> 20, peak_mib = peak >> 20, "{stage}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_byte_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_byte_size("512mib").unwrap(), 512 << 20);
        assert_eq!(parse_byte_size("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_byte_size("1000").unwrap(), 1000);
        assert!(parse_byte_size("lots").unwrap_err().contains("lots"));
        assert!(parse_byte_size("3 parsecs")
            .unwrap_err()
            .contains("parsecs"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_fields_in_bytes() {
        let total = proc_kib_field("/proc/meminfo", "MemTotal").unwrap();
        assert!(total > 1 << 20);
        // A field is matched whole, not by prefix.
        assert_eq!(proc_kib_field("/proc/meminfo", "MemTot"), None);
        assert_eq!(proc_kib_field("/proc/no-such-file", "MemTotal"), None);
    }
}

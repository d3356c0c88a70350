//! Kubernetes resource quantities as runner-manager reads them: CPU in millicores, memory in
//! bytes. The text of a `Quantity` (`k8s_openapi`'s newtype), so placement and validation read
//! one grammar without the Kubernetes type.

/// A CPU quantity in millicores: `4`, `0.5`, `1500m`.
pub fn cpu_millis(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(m) = s.strip_suffix('m') {
        return m.parse().ok();
    }
    let v: f64 = s.parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| (v * 1000.0).round() as u64)
}

/// A memory quantity in bytes: `8Gi`, `512Mi`, `1G`, `1048576`.
pub fn memory_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<u64>().ok()?.checked_mul(mult);
        }
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_read_as_kubernetes_writes_them() {
        assert_eq!(cpu_millis("1500m"), Some(1500));
        assert_eq!(cpu_millis(" 2 "), Some(2000));
        assert_eq!(cpu_millis("0.5"), Some(500));
        assert_eq!(cpu_millis("-1"), None);
        assert_eq!(memory_bytes("2Gi"), Some(2 << 30));
        assert_eq!(memory_bytes("1G"), Some(1_000_000_000));
        assert_eq!(memory_bytes("1048576"), Some(1 << 20));
        assert_eq!(memory_bytes("99999999999Ti"), None);
    }
}

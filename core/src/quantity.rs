//! Kubernetes memory quantities (`12Gi`, `8000Mi`, `16G`, `1.5Gi`) in MiB.

use thiserror::Error;

/// A memory quantity that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// Empty string.
    #[error("empty memory quantity")]
    Empty,
    /// Not a number followed by a known suffix.
    #[error("memory quantity {0:?} is not a number with a suffix such as Mi, Gi, M or G")]
    Malformed(String),
    /// Negative or zero.
    #[error("memory quantity {0:?} must be positive")]
    NotPositive(String),
}

/// Parse a Kubernetes quantity into whole MiB, rounding up.
pub fn parse_mib(text: &str) -> Result<u64, QuantityError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(QuantityError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| QuantityError::Malformed(text.to_string()))?;
    let bytes_per_unit: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0_f64.powi(4),
        _ => return Err(QuantityError::Malformed(text.to_string())),
    };
    if !value.is_finite() || value <= 0.0 {
        return Err(QuantityError::NotPositive(text.to_string()));
    }
    let mib = (value * bytes_per_unit / (1024.0 * 1024.0)).ceil();
    if mib > u64::MAX as f64 {
        return Err(QuantityError::Malformed(text.to_string()));
    }
    Ok(mib as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases = [
            ("12Gi", Ok(12288)),
            ("8000Mi", Ok(8000)),
            ("1.5Gi", Ok(1536)),
            ("16G", Ok(15259)),
            ("1048576Ki", Ok(1024)),
            ("1073741824", Ok(1024)),
            (" 2Gi ", Ok(2048)),
            ("", Err(QuantityError::Empty)),
            ("12GB", Err(QuantityError::Malformed("12GB".into()))),
            ("lots", Err(QuantityError::Malformed("lots".into()))),
            ("-1Gi", Err(QuantityError::NotPositive("-1Gi".into()))),
            ("0", Err(QuantityError::NotPositive("0".into()))),
        ];
        for (input, want) in cases {
            assert_eq!(parse_mib(input), want, "{input:?}");
        }
    }
}

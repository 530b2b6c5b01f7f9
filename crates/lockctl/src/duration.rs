//! Durations as people type them: `500ms`, `10s`, `1m30s`, `2h`, `1.5s`, `1h2m3s`; a bare
//! number is seconds. `--wait` also takes `forever`.

use std::time::Duration;

/// One duration: a sequence of `NUMBER UNIT` parts (units `ms`, `s`, `m`, `h`, `d`), or a bare
/// number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = || format!("'{s}' is not a duration like 500ms, 10s, 1m30s or 2h");
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = t.parse::<f64>() {
        return secs(n).ok_or_else(|| format!("'{s}' is out of range"));
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_end);
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            _ => return Err(format!("'{s}': units are ms, s, m, h and d")),
        };
        total += n * scale;
        rest = next;
    }
    secs(total).ok_or_else(|| format!("'{s}' is out of range"))
}

/// A `--wait`: a duration, or `forever` (`Duration::MAX`).
pub fn parse_wait(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "forever" | "inf" => Ok(Duration::MAX),
        _ => parse_duration(s),
    }
}

fn secs(n: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go_and_systemd() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h2m3s"), Ok(Duration::from_secs(3723)));
        assert_eq!(parse_duration("2s500ms"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_wait("forever"), Ok(Duration::MAX));
        assert_eq!(parse_wait("1h"), Ok(Duration::from_secs(3600)));
    }
}

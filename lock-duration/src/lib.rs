//! The one duration grammar of `lock-runtime`: the `lease` and `wait` arguments of
//! `#[distributed_lock]` and the durations of `lock.toml` are read by [`parse_millis`].
//!
//! A duration is a number and a unit, without spaces: `"500ms"`, `"5s"`, `"1.5s"`, `"2m"`,
//! `"1h"`, `"7d"`. The number is decimal, with an optional fraction; the unit is `ms`, `s`,
//! `m`, `h` or `d`. Redis expires keys with millisecond resolution, so the value must be a whole
//! number of milliseconds (`"1.5s"` is, `"1.0005s"` is not). Zero is a valid duration here;
//! whoever reads one decides whether zero makes sense (a zero wait means "try once", a zero
//! lease is refused).
//!
//! ```
//! assert_eq!(lock_duration::parse_millis("1.5s"), Ok(1_500));
//! assert_eq!(lock_duration::parse_millis("7d"), Ok(604_800_000));
//! assert!(lock_duration::parse_millis("5 s").is_err());
//! ```

/// The units and how many milliseconds each is.
pub const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Parses a duration into milliseconds; the error is a message to show the user, quoting
/// `text`.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    if text.contains(char::is_whitespace) {
        return Err(format!(
            "invalid duration \"{text}\": write the number and the unit without spaces, e.g. \"5s\""
        ));
    }
    let number_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let well_formed = !whole.is_empty()
        && !fraction.contains('.')
        && (!number.contains('.') || !fraction.is_empty());
    if !well_formed {
        return Err(format!(
            "invalid duration \"{text}\": expected a number followed by a unit, e.g. \"500ms\", \
             \"1.5s\", \"2m\", \"1h\" or \"7d\""
        ));
    }
    let expected = UNITS.map(|(name, _)| name).join(", ");
    if unit.is_empty() {
        return Err(format!(
            "missing unit in duration \"{text}\", expected one of: {expected}"
        ));
    }
    let Some(&(_, unit_millis)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "unknown unit `{unit}` in duration \"{text}\", expected one of: {expected}"
        ));
    };
    let too_large = || {
        format!(
            "duration \"{text}\" is too large: at most {} milliseconds are supported",
            u64::MAX
        )
    };
    // exact: whole * unit + fraction * unit / 10^digits, in integers
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let scale = 10u128
        .checked_pow(u32::try_from(fraction.len()).map_err(|_| too_large())?)
        .ok_or_else(too_large)?;
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| too_large())?
    };
    let unit_millis = u128::from(unit_millis);
    let fraction_millis = fraction * unit_millis;
    if !fraction_millis.is_multiple_of(scale) {
        return Err(format!(
            "duration \"{text}\" is not a whole number of milliseconds (the finest unit is `ms`)"
        ));
    }
    let millis = whole
        .checked_mul(unit_millis)
        .and_then(|m| m.checked_add(fraction_millis / scale))
        .ok_or_else(too_large)?;
    u64::try_from(millis).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_fractions_convert_to_milliseconds() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("5s"), Ok(5_000));
        assert_eq!(parse_millis("1.5s"), Ok(1_500));
        assert_eq!(parse_millis("0.25m"), Ok(15_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
        assert_eq!(parse_millis("007s"), Ok(7_000));
        assert_eq!(parse_millis("0s"), Ok(0));
        assert_eq!(parse_millis("1.000s"), Ok(1_000));
    }

    #[test]
    fn malformed_durations_say_what_is_wrong() {
        let unknown = parse_millis("5x").unwrap_err();
        assert!(unknown.contains("unknown unit `x`"), "{unknown}");
        assert!(unknown.contains("ms, s, m, h, d"), "{unknown}");
        assert!(
            parse_millis("250us")
                .unwrap_err()
                .contains("unknown unit `us`")
        );
        assert!(parse_millis("5 s").unwrap_err().contains("without spaces"));
        assert!(parse_millis(" 5s").unwrap_err().contains("without spaces"));
        assert!(parse_millis("5").unwrap_err().contains("missing unit"));
        for text in ["", "s", "ms", "-5s", "forever", ".5s", "5.s", "1.2.3s"] {
            let message = parse_millis(text).unwrap_err();
            assert!(message.contains("expected a number"), "{text}: {message}");
        }
        assert!(
            parse_millis("1.0005s")
                .unwrap_err()
                .contains("whole number of milliseconds")
        );
        assert!(parse_millis("0.5ms").unwrap_err().contains("whole number"));
    }

    #[test]
    fn overflow_is_rejected() {
        assert_eq!(parse_millis("18446744073709551615ms"), Ok(u64::MAX));
        for text in [
            "18446744073709551616ms",
            "18446744073709551615s",
            "99999999999999999999999h",
            "999999999999999999999999999999999999999999d",
            "1.00000000000000000000000000000000000000001s",
        ] {
            let message = parse_millis(text).unwrap_err();
            assert!(
                message.contains("too large") || message.contains("whole number"),
                "{text}: {message}"
            );
        }
    }
}

/// The crate's README, whose examples are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

//! Durations of the `lease` and `wait` arguments, parsed at compile time.
//!
//! Grammar: one unsigned decimal integer followed by one unit, no spaces:
//! `ms` (milliseconds), `s` (seconds), `m` (minutes), `h` (hours). Redis expires keys with
//! millisecond resolution, so there is no unit below `ms`. The value must be greater than zero and
//! fit in a `u64` of milliseconds.

use syn::{Error, LitStr};

/// The accepted units and how many milliseconds each one is.
const UNITS: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// What a `wait` argument asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitArg {
    /// Wait without a limit: `wait = "forever"`.
    Forever,
    /// Wait at most this many milliseconds.
    Millis(u64),
}

/// Parses `lease = ".."`: a duration in milliseconds.
pub(crate) fn parse_lease(lit: &LitStr) -> syn::Result<u64> {
    let text = lit.value();
    if text == "forever" {
        return Err(Error::new(
            lit.span(),
            "`lease` cannot be \"forever\"; leave `lease` out to have the watchdog renew the lock",
        ));
    }
    parse_millis(&text).map_err(|message| Error::new(lit.span(), message))
}

/// Parses `wait = ".."`: a duration or `"forever"`.
pub(crate) fn parse_wait(lit: &LitStr) -> syn::Result<WaitArg> {
    let text = lit.value();
    if text == "forever" {
        return Ok(WaitArg::Forever);
    }
    parse_millis(&text)
        .map(WaitArg::Millis)
        .map_err(|message| Error::new(lit.span(), message))
}

/// Parses `"<digits><unit>"` into milliseconds; the error is the message to show at the literal.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let expected = expected_units();
    if text.contains(char::is_whitespace) {
        return Err(format!(
            "invalid duration \"{text}\": write the number and the unit without spaces, e.g. \"5s\""
        ));
    }
    if number.is_empty() {
        return Err(format!(
            "invalid duration \"{text}\": expected a whole number followed by a unit, \
             e.g. \"500ms\", \"5s\", \"2m\" or \"1h\""
        ));
    }
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
    let count: u64 = number.parse().map_err(|_| too_large())?;
    let millis = count.checked_mul(unit_millis).ok_or_else(too_large)?;
    if millis == 0 {
        return Err(format!(
            "duration \"{text}\" is zero; it must be greater than zero"
        ));
    }
    Ok(millis)
}

fn expected_units() -> String {
    UNITS.map(|(name, _)| name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_converts_to_milliseconds() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("5s"), Ok(5_000));
        assert_eq!(parse_millis("2m"), Ok(120_000));
        assert_eq!(parse_millis("1h"), Ok(3_600_000));
        assert_eq!(parse_millis("007s"), Ok(7_000));
    }

    #[test]
    fn unknown_or_missing_units_are_rejected() {
        let unknown = parse_millis("5x").unwrap_err();
        assert!(unknown.contains("unknown unit `x`"), "{unknown}");
        assert!(unknown.contains("ms, s, m, h"), "{unknown}");
        assert!(
            parse_millis("250us")
                .unwrap_err()
                .contains("unknown unit `us`")
        );
        assert!(parse_millis("5 s").unwrap_err().contains("without spaces"));
        assert!(parse_millis(" 5s").unwrap_err().contains("without spaces"));
        assert!(
            parse_millis("1.5s")
                .unwrap_err()
                .contains("unknown unit `.5s`")
        );
        assert!(parse_millis("5").unwrap_err().contains("missing unit"));
    }

    #[test]
    fn missing_number_is_rejected() {
        for text in ["", "s", "ms", "-5s", "forever"] {
            let message = parse_millis(text).unwrap_err();
            assert!(
                message.contains("expected a whole number"),
                "{text}: {message}"
            );
        }
    }

    #[test]
    fn zero_is_rejected() {
        assert!(parse_millis("0s").unwrap_err().contains("is zero"));
        assert!(parse_millis("000ms").unwrap_err().contains("is zero"));
    }

    #[test]
    fn overflow_is_rejected() {
        assert_eq!(parse_millis("18446744073709551615ms"), Ok(u64::MAX));
        assert!(
            parse_millis("18446744073709551616ms")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_millis("18446744073709551615s")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_millis("99999999999999999999999h")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn wait_accepts_forever_and_lease_does_not() {
        let forever = LitStr::new("forever", proc_macro2::Span::call_site());
        assert_eq!(parse_wait(&forever).unwrap(), WaitArg::Forever);
        let message = parse_lease(&forever).unwrap_err().to_string();
        assert!(message.contains("cannot be \"forever\""), "{message}");
        let two_seconds = LitStr::new("2s", proc_macro2::Span::call_site());
        assert_eq!(parse_wait(&two_seconds).unwrap(), WaitArg::Millis(2_000));
        assert_eq!(parse_lease(&two_seconds).unwrap(), 2_000);
    }
}

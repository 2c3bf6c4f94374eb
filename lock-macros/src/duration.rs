//! Durations of the `lease`, `hold_at_least` and `wait` arguments, parsed at compile time with the grammar of
//! the config file (`lock-duration`): a number (fractions allowed) and a unit `ms`, `s`, `m`,
//! `h` or `d`, e.g. `"500ms"`, `"1.5s"`, `"7d"`. A lease must be greater than zero; a zero wait
//! (`"0s"`) tries once and gives up at once when the lock is taken.

use syn::{Error, LitStr};

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
    positive(
        lit,
        "`lease` cannot be \"forever\"; leave `lease` out to have the watchdog renew the lock",
        "`lease` \"{}\" is zero; a lease must be greater than zero",
    )
}

/// Parses `hold_at_least = ".."`: a duration in milliseconds.
pub(crate) fn parse_hold(lit: &LitStr) -> syn::Result<u64> {
    positive(
        lit,
        "`hold_at_least` cannot be \"forever\"; give how long the lock stays taken after its \
         grant, e.g. \"30s\"",
        "`hold_at_least` \"{}\" is zero; leave it out to free the lock when the body ends",
    )
}

/// A duration greater than zero; `forever` and `zero` (`{}`: the text) are the messages for
/// those mistakes.
fn positive(lit: &LitStr, forever: &str, zero: &str) -> syn::Result<u64> {
    let text = lit.value();
    if text == "forever" {
        return Err(Error::new(lit.span(), forever));
    }
    match parse_millis(&text) {
        Ok(0) => Err(Error::new(lit.span(), zero.replace("{}", &text))),
        other => other.map_err(|message| Error::new(lit.span(), message)),
    }
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

/// Parses a duration into milliseconds; the error is the message to show at the literal.
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    lock_duration::parse_millis(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(text: &str) -> LitStr {
        LitStr::new(text, proc_macro2::Span::call_site())
    }

    #[test]
    fn wait_accepts_forever_and_zero_and_lease_does_not() {
        assert_eq!(parse_wait(&lit("forever")).unwrap(), WaitArg::Forever);
        assert_eq!(parse_wait(&lit("0s")).unwrap(), WaitArg::Millis(0));
        let message = parse_lease(&lit("forever")).unwrap_err().to_string();
        assert!(message.contains("cannot be \"forever\""), "{message}");
        let message = parse_lease(&lit("0ms")).unwrap_err().to_string();
        assert!(message.contains("is zero"), "{message}");
        assert_eq!(parse_wait(&lit("1.5s")).unwrap(), WaitArg::Millis(1_500));
        assert_eq!(parse_lease(&lit("1d")).unwrap(), 86_400_000);
    }
}

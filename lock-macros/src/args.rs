//! The attribute's `key = "..", lease = "..", ..` arguments.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Error, Expr, ExprLit, Ident, Lit, LitStr, Token};

use crate::duration::{self, WaitArg};

/// Every argument the attribute accepts, in the order the docs list them.
const ARGUMENTS: &[&str] = &["key", "lease", "wait", "on_lost", "crate"];

/// What happens when the lock is lost while the body runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnLostArg {
    /// Stop the body and return the lost error (the default).
    Fail,
    /// Let the body finish and log a warning.
    Continue,
}

/// The parsed arguments of one `#[distributed_lock(..)]`.
pub(crate) struct LockArgs {
    /// The key template, still unparsed: `key.rs` checks it against the fn's parameters.
    pub(crate) key: LitStr,
    /// Fixed lease in milliseconds; `None` means watchdog renewal.
    pub(crate) lease_millis: Option<u64>,
    /// `None` means the config's `default_wait`.
    pub(crate) wait: Option<WaitArg>,
    pub(crate) on_lost: OnLostArg,
    /// The path generated code uses to reach the runtime; `::lock_runtime` unless overridden.
    pub(crate) krate: syn::Path,
}

impl LockArgs {
    /// Parses the attribute's argument tokens; `#[distributed_lock]` itself is the error span
    /// for arguments that are missing.
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Self> {
        Parser::parse2(parse_args, tokens)
    }
}

/// One argument's value, remembering that it was set so a second `name = ..` is an error.
struct Slot<T> {
    value: Option<T>,
}

impl<T> Slot<T> {
    const fn new() -> Self {
        Self { value: None }
    }

    /// Stores what `parse` returns, or fails at `name` when the argument was already given
    /// (checked first, so a repeated argument is reported as such whatever its value).
    fn set(&mut self, name: &Ident, parse: impl FnOnce() -> syn::Result<T>) -> syn::Result<()> {
        if self.value.is_some() {
            return Err(Error::new(
                name.span(),
                format!("`{name}` set multiple times"),
            ));
        }
        self.value = Some(parse()?);
        Ok(())
    }
}

fn parse_args(input: ParseStream<'_>) -> syn::Result<LockArgs> {
    let mut key = Slot::new();
    let mut lease = Slot::new();
    let mut wait = Slot::new();
    let mut on_lost = Slot::new();
    let mut krate = Slot::new();

    // A positional key, as lock4j users write it: `#[distributed_lock("goods:<id>", ..)]`.
    if input.peek(LitStr) {
        let value: LitStr = input.parse()?;
        let name = Ident::new("key", value.span());
        key.set(&name, || Ok(value))?;
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    while !input.is_empty() {
        // `parse_any` so that the keyword `crate` is read as an argument name.
        let name = input.call(Ident::parse_any)?;
        let name_text = name.to_string();
        if !ARGUMENTS.contains(&name_text.as_str()) {
            return Err(Error::new(
                name.span(),
                format!(
                    "unknown argument `{name}`, expected one of: {}",
                    ARGUMENTS.join(", ")
                ),
            ));
        }
        input.parse::<Token![=]>()?;
        let value = parse_string_value(input, &name)?;
        match name_text.as_str() {
            "key" => key.set(&name, || Ok(value))?,
            "lease" => lease.set(&name, || duration::parse_lease(&value))?,
            "wait" => wait.set(&name, || duration::parse_wait(&value))?,
            "on_lost" => on_lost.set(&name, || parse_on_lost(&value))?,
            _ => krate.set(&name, || parse_crate_path(&value))?,
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }

    let Some(key) = key.value else {
        return Err(Error::new(
            Span::call_site(),
            "missing `key` argument, e.g. #[distributed_lock(key = \"order:<id>\")]",
        ));
    };
    Ok(LockArgs {
        key,
        lease_millis: lease.value,
        wait: wait.value,
        on_lost: on_lost.value.unwrap_or(OnLostArg::Fail),
        krate: krate
            .value
            .unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
    })
}

/// Every argument takes a string literal; anything else is an error at the value.
fn parse_string_value(input: ParseStream<'_>, name: &Ident) -> syn::Result<LitStr> {
    match input.parse::<Expr>()? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        other => Err(Error::new_spanned(
            other,
            format!("`{name}` takes a string literal, e.g. {}", example(name)),
        )),
    }
}

fn example(name: &Ident) -> &'static str {
    match name.to_string().as_str() {
        "key" => "`key = \"order:<id>\"`",
        "lease" => "`lease = \"5s\"`",
        "wait" => "`wait = \"2s\"` or `wait = \"forever\"`",
        "on_lost" => "`on_lost = \"continue\"`",
        _ => "`crate = \"my_crate::lock_runtime\"`",
    }
}

fn parse_on_lost(lit: &LitStr) -> syn::Result<OnLostArg> {
    match lit.value().as_str() {
        "fail" => Ok(OnLostArg::Fail),
        "continue" => Ok(OnLostArg::Continue),
        other => Err(Error::new(
            lit.span(),
            format!("unknown `on_lost` value \"{other}\", expected \"fail\" or \"continue\""),
        )),
    }
}

fn parse_crate_path(lit: &LitStr) -> syn::Result<syn::Path> {
    lit.parse_with(syn::Path::parse_mod_style).map_err(|_| {
        Error::new(
            lit.span(),
            format!(
                "`crate` must be a path to the runtime crate, e.g. \"::lock_runtime\", not \"{}\"",
                lit.value()
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn error(tokens: TokenStream) -> String {
        match LockArgs::parse(tokens) {
            Ok(_) => panic!("the arguments were accepted"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn all_arguments_are_read() {
        let args = LockArgs::parse(quote!(
            key = "goods:<id>",
            lease = "5s",
            wait = "2s",
            on_lost = "continue",
            crate = "my::rt",
        ))
        .unwrap();
        assert_eq!(args.key.value(), "goods:<id>");
        assert_eq!(args.lease_millis, Some(5_000));
        assert_eq!(args.wait, Some(WaitArg::Millis(2_000)));
        assert_eq!(args.on_lost, OnLostArg::Continue);
        let krate = &args.krate;
        assert_eq!(quote!(#krate).to_string(), "my :: rt");
    }

    #[test]
    fn defaults_apply_when_only_the_key_is_given() {
        let args = LockArgs::parse(quote!(key = "k")).unwrap();
        assert_eq!(args.lease_millis, None);
        assert_eq!(args.wait, None);
        assert_eq!(args.on_lost, OnLostArg::Fail);
        let krate = &args.krate;
        assert_eq!(quote!(#krate).to_string(), ":: lock_runtime");
        let forever = LockArgs::parse(quote!(wait = "forever", key = "k")).unwrap();
        assert_eq!(forever.wait, Some(WaitArg::Forever));
    }

    #[test]
    fn unknown_and_duplicate_arguments_are_rejected() {
        assert_eq!(
            error(quote!(key = "k", timeout = "5s")),
            "unknown argument `timeout`, expected one of: key, lease, wait, on_lost, crate"
        );
        assert_eq!(error(quote!(key = "k", forever)), error(quote!(forever)));
        assert_eq!(
            error(quote!(key = "k", lease = "1s", lease = "2s")),
            "`lease` set multiple times"
        );
        assert_eq!(
            error(quote!(key = "a", key = "b")),
            "`key` set multiple times"
        );
        assert_eq!(
            error(quote!(key = "k", wait = "1s", wait = "0s")),
            "`wait` set multiple times"
        );
    }

    #[test]
    fn missing_key_is_rejected() {
        assert!(error(quote!()).starts_with("missing `key` argument"));
        assert!(error(quote!(lease = "5s")).starts_with("missing `key` argument"));
    }

    #[test]
    fn values_must_be_valid_string_literals() {
        assert!(error(quote!(key = k)).contains("`key` takes a string literal"));
        assert!(error(quote!(key = "k", lease = 5)).contains("`lease` takes a string literal"));
        assert!(error(quote!(key = "k", on_lost = "retry")).contains("unknown `on_lost` value"));
        assert!(error(quote!(key = "k", crate = "not a path")).contains("`crate` must be a path"));
        assert!(error(quote!(key = "k", lease = "0s")).contains("is zero"));
        assert!(error(quote!(key = "k" lease = "1s")).contains("expected `,`"));
    }
}

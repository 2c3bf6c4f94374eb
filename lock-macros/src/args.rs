//! The attribute's `key = "..", lease = "..", ..` arguments.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Error, Expr, ExprLit, Ident, Lit, LitStr, Token};

use crate::duration::{self, WaitArg};

/// Every argument the attribute accepts, in the order the docs list them.
const ARGUMENTS: &[&str] = &[
    "key",
    "keys",
    "with",
    "kind",
    "lease",
    "wait",
    "hold_at_least",
    "on_lost",
    "crate",
];

/// The values of `kind`, as the error for an unknown one lists them.
const KINDS: &str = "\"lock\", \"read\", \"write\"";

/// Which lock of a single `key` the body runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KindArg {
    /// The mutex: `kind = "lock"`, the default.
    Lock,
    /// A read (shared) hold of the read-write lock.
    Read,
    /// The write (exclusive) hold of the read-write lock.
    Write,
}

/// The locks the body runs under.
pub(crate) enum LocksArg {
    /// `key = ".."`, with its `kind`. The template is still unparsed: `key.rs` checks it against
    /// the fn's parameters.
    One { key: LitStr, kind: KindArg },
    /// `keys = [..]`: mutexes, all or none; never empty.
    All(Vec<LitStr>),
}

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
    pub(crate) locks: LocksArg,
    /// Fixed lease in milliseconds; `None` means watchdog renewal.
    pub(crate) lease_millis: Option<u64>,
    /// `None` means the config's `default_wait`.
    pub(crate) wait: Option<WaitArg>,
    /// Minimum hold in milliseconds (the mutex of one key only).
    pub(crate) hold_millis: Option<u64>,
    pub(crate) on_lost: OnLostArg,
    /// The path generated code uses to reach the runtime; `::lock_runtime` unless overridden.
    pub(crate) krate: syn::Path,
    /// `with(name = expr, ..)`: values computed from the arguments, which placeholders name.
    pub(crate) with: Vec<WithBinding>,
}

/// `name = expr` in `with(..)`.
pub(crate) struct WithBinding {
    pub(crate) name: Ident,
    pub(crate) expr: Expr,
}

impl LockArgs {
    /// The key templates: the one `key`, or each of `keys` in the order given.
    pub(crate) fn key_literals(&self) -> impl Iterator<Item = &LitStr> {
        match &self.locks {
            LocksArg::One { key, .. } => std::slice::from_ref(key).iter(),
            LocksArg::All(keys) => keys.iter(),
        }
    }

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
    let mut keys = Slot::new();
    let mut kind: Slot<(KindArg, LitStr)> = Slot::new();
    let mut lease = Slot::new();
    let mut wait = Slot::new();
    let mut hold: Slot<(u64, LitStr)> = Slot::new();
    let mut on_lost = Slot::new();
    let mut krate = Slot::new();
    let mut with = Slot::new();

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
        if name_text == "with" {
            with.set(&name, || parse_with(input))?;
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
            continue;
        }
        input.parse::<Token![=]>()?;
        // `key` and `keys` exclude each other: the second one given is the mistake.
        let other = match name_text.as_str() {
            "key" => keys.value.is_some().then_some("keys"),
            "keys" => key.value.is_some().then_some("key"),
            _ => None,
        };
        if let Some(other) = other {
            return Err(Error::new(
                name.span(),
                format!(
                    "`{name}` cannot be combined with `{other}`: give `key = \"..\"` for one \
                     lock or `keys = [..]` for several, not both"
                ),
            ));
        }
        if name_text == "keys" {
            keys.set(&name, || parse_keys(input))?;
        } else {
            let value = parse_string_value(input, &name)?;
            match name_text.as_str() {
                "key" => key.set(&name, || Ok(value))?,
                "kind" => kind.set(&name, || Ok((parse_kind(&value)?, value)))?,
                "lease" => lease.set(&name, || duration::parse_lease(&value))?,
                "wait" => wait.set(&name, || duration::parse_wait(&value))?,
                "hold_at_least" => {
                    hold.set(&name, || Ok((duration::parse_hold(&value)?, value.clone())))?
                }
                "on_lost" => on_lost.set(&name, || parse_on_lost(&value))?,
                _ => krate.set(&name, || parse_crate_path(&value))?,
            }
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }

    let locks = match (key.value, keys.value) {
        (Some(key), _) => LocksArg::One {
            key,
            kind: kind.value.map_or(KindArg::Lock, |(kind, _)| kind),
        },
        (None, Some(keys)) => match kind.value {
            Some((KindArg::Read | KindArg::Write, lit)) => {
                return Err(Error::new(
                    lit.span(),
                    format!(
                        "`kind = \"{}\"` cannot be combined with `keys`: only the mutex locks \
                         several keys at once; lock one key with `key = \"..\"` to use a {} lock",
                        lit.value(),
                        lit.value()
                    ),
                ));
            }
            _ => LocksArg::All(keys),
        },
        (None, None) => {
            return Err(Error::new(
                Span::call_site(),
                "missing `key` argument, e.g. #[distributed_lock(key = \"order:<id>\")], or \
                 `keys = [..]` for several locks",
            ));
        }
    };
    // a minimum hold keeps a mutex after its release; the other kinds have no such state
    let hold_millis = match (&hold.value, &locks) {
        (None, _) => None,
        (
            Some((millis, _)),
            LocksArg::One {
                kind: KindArg::Lock,
                ..
            },
        ) => Some(*millis),
        (Some((_, lit)), _) => {
            return Err(Error::new(
                lit.span(),
                "`hold_at_least` applies to the mutex of one `key` (the default `kind`): a \
                 read-write lock or `keys = [..]` is freed when the body ends",
            ));
        }
    };
    Ok(LockArgs {
        locks,
        lease_millis: lease.value,
        wait: wait.value,
        hold_millis,
        on_lost: on_lost.value.unwrap_or(OnLostArg::Fail),
        krate: krate
            .value
            .unwrap_or_else(|| syn::parse_quote!(::lock_runtime)),
        with: with.value.unwrap_or_default(),
    })
}

/// `with(email = user.email(), n = items.len())`: one or more `name = expression`, each name
/// once.
fn parse_with(input: ParseStream<'_>) -> syn::Result<Vec<WithBinding>> {
    const EXAMPLE: &str = "`key = \"user:<email>\", with(email = user.email())`";
    if !input.peek(syn::token::Paren) {
        return Err(input.error(format!(
            "`with` takes `name = expression` pairs in parentheses, e.g. {EXAMPLE}"
        )));
    }
    let content;
    let parens = syn::parenthesized!(content in input);
    let mut bindings: Vec<WithBinding> = Vec::new();
    while !content.is_empty() {
        let name: Ident = content.parse()?;
        if name == "self" || name.to_string().starts_with("__lock") {
            return Err(Error::new(
                name.span(),
                format!("`{name}` cannot be a name in `with(..)`; choose another"),
            ));
        }
        if bindings.iter().any(|b| b.name == name) {
            return Err(Error::new(
                name.span(),
                format!("`{name}` is bound twice in `with(..)`"),
            ));
        }
        content.parse::<Token![=]>()?;
        let expr: Expr = content.parse()?;
        bindings.push(WithBinding { name, expr });
        if content.is_empty() {
            break;
        }
        content.parse::<Token![,]>()?;
    }
    if bindings.is_empty() {
        return Err(Error::new(
            parens.span.join(),
            format!("`with(..)` binds nothing; e.g. {EXAMPLE}"),
        ));
    }
    Ok(bindings)
}

/// `keys = ["..", ".."]`: an array of one or more string literals; anything else is an error
/// at the value, or at the element that is not a string literal.
fn parse_keys(input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
    const EXAMPLE: &str = "`keys = [\"account:<from>\", \"account:<to>\"]`";
    let array = match input.parse::<Expr>()? {
        Expr::Array(array) => array,
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => {
            return Err(Error::new(
                lit.span(),
                format!(
                    "`keys` takes an array of key templates, e.g. {EXAMPLE}; for one lock write \
                     `key = \"{}\"`",
                    lit.value()
                ),
            ));
        }
        other => {
            return Err(Error::new_spanned(
                other,
                format!("`keys` takes an array of string literals, e.g. {EXAMPLE}"),
            ));
        }
    };
    if array.elems.is_empty() {
        return Err(Error::new_spanned(
            array,
            format!("`keys` must name at least one key, e.g. {EXAMPLE}"),
        ));
    }
    array
        .elems
        .into_iter()
        .map(|element| match element {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => Ok(lit),
            other => Err(Error::new_spanned(
                other,
                format!("each of `keys` must be a string literal, e.g. {EXAMPLE}"),
            )),
        })
        .collect()
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
        "key" => "`key = \"order:<id>\"` (or `keys = [..]` for several locks)",
        "kind" => "`kind = \"read\"`",
        "lease" => "`lease = \"5s\"`",
        "wait" => "`wait = \"2s\"` or `wait = \"forever\"`",
        "hold_at_least" => "`hold_at_least = \"30s\"`",
        "on_lost" => "`on_lost = \"continue\"`",
        _ => "`crate = \"my_crate::lock_runtime\"`",
    }
}

fn parse_kind(lit: &LitStr) -> syn::Result<KindArg> {
    match lit.value().as_str() {
        "lock" => Ok(KindArg::Lock),
        "read" => Ok(KindArg::Read),
        "write" => Ok(KindArg::Write),
        other => Err(Error::new(
            lit.span(),
            format!("unknown `kind` \"{other}\", expected one of: {KINDS}"),
        )),
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
    fn a_minimum_hold_is_for_the_mutex_of_one_key() {
        let args = LockArgs::parse(quote!(
            key = "job:<name>",
            wait = "0s",
            hold_at_least = "30s"
        ))
        .unwrap();
        assert_eq!(args.hold_millis, Some(30_000));
        for (tokens, message) in [
            (
                quote!(key = "k", kind = "write", hold_at_least = "1s"),
                "applies to the mutex of one `key`",
            ),
            (
                quote!(keys = ["a", "b"], hold_at_least = "1s"),
                "applies to the mutex of one `key`",
            ),
            (quote!(key = "k", hold_at_least = "0s"), "is zero"),
            (
                quote!(key = "k", hold_at_least = "forever"),
                "cannot be \"forever\"",
            ),
            (
                quote!(key = "k", hold_at_least = 30),
                "`hold_at_least = \"30s\"`",
            ),
            (
                quote!(key = "k", hold_at_least = "1s", hold_at_least = "2s"),
                "set multiple times",
            ),
        ] {
            let e = error(tokens.clone());
            assert!(e.contains(message), "{tokens}: {e}");
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
        let LocksArg::One { key, kind } = &args.locks else {
            panic!("one key")
        };
        assert_eq!(key.value(), "goods:<id>");
        assert_eq!(*kind, KindArg::Lock);
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
    fn with_binds_names_to_expressions() {
        let args = LockArgs::parse(quote!(
            key = "u:<email>",
            with(email = user.email(), n = 1 + 2)
        ))
        .unwrap();
        let names: Vec<String> = args.with.iter().map(|b| b.name.to_string()).collect();
        assert_eq!(names, ["email", "n"]);
        let expr = &args.with[0].expr;
        assert_eq!(quote!(#expr).to_string(), "user . email ()");
        for (tokens, message) in [
            (quote!(key = "k", with()), "binds nothing"),
            (quote!(key = "k", with = "x"), "in parentheses"),
            (quote!(key = "k", with(a = 1, a = 2)), "bound twice"),
            (quote!(key = "k", with(self = 1)), "expected identifier"),
            (quote!(key = "k", with(__lock_x = 1)), "cannot be a name"),
            (
                quote!(key = "k", with(a = 1), with(b = 2)),
                "set multiple times",
            ),
        ] {
            let e = error(tokens.clone());
            assert!(e.contains(message), "{tokens}: {e}");
        }
    }

    #[test]
    fn unknown_and_duplicate_arguments_are_rejected() {
        assert_eq!(
            error(quote!(key = "k", timeout = "5s")),
            "unknown argument `timeout`, expected one of: key, keys, with, kind, lease, wait, \
             hold_at_least, on_lost, crate"
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

    fn kind(tokens: TokenStream) -> Option<KindArg> {
        match LockArgs::parse(tokens).unwrap().locks {
            LocksArg::One { kind, .. } => Some(kind),
            LocksArg::All(_) => None,
        }
    }

    fn keys(tokens: TokenStream) -> Vec<String> {
        match LockArgs::parse(tokens).unwrap().locks {
            LocksArg::One { .. } => panic!("one key"),
            LocksArg::All(keys) => keys.iter().map(LitStr::value).collect(),
        }
    }

    #[test]
    fn kind_names_the_lock_of_one_key() {
        assert_eq!(kind(quote!(key = "k")), Some(KindArg::Lock));
        assert_eq!(kind(quote!(key = "k", kind = "lock")), Some(KindArg::Lock));
        assert_eq!(kind(quote!(kind = "read", key = "k")), Some(KindArg::Read));
        assert_eq!(kind(quote!("k", kind = "write")), Some(KindArg::Write));
        assert_eq!(
            error(quote!(key = "k", kind = "mutex")),
            "unknown `kind` \"mutex\", expected one of: \"lock\", \"read\", \"write\""
        );
        assert_eq!(
            error(quote!(key = "k", kind = "read", kind = "write")),
            "`kind` set multiple times"
        );
        assert!(error(quote!(key = "k", kind = read)).contains("`kind` takes a string literal"));
    }

    #[test]
    fn keys_take_an_array_of_templates_instead_of_key() {
        assert_eq!(keys(quote!(keys = ["a:<x>", "b"])), ["a:<x>", "b"]);
        assert_eq!(keys(quote!(keys = ["a",], kind = "lock")), ["a"]);
        let both = "cannot be combined with";
        assert!(
            error(quote!(key = "a", keys = ["b"])).starts_with(&format!("`keys` {both} `key`"))
        );
        assert!(
            error(quote!(keys = ["b"], key = "a")).starts_with(&format!("`key` {both} `keys`"))
        );
        assert!(error(quote!("a", keys = ["b"])).starts_with(&format!("`keys` {both} `key`")));
        assert!(
            error(quote!(kind = "read", keys = ["a"]))
                .starts_with(&format!("`kind = \"read\"` {both} `keys`"))
        );
        assert!(error(quote!(keys = ["a"], kind = "write")).contains("only the mutex"));
        assert!(error(quote!(keys = [])).starts_with("`keys` must name at least one key"));
        assert!(error(quote!(keys = "a")).contains("for one lock write `key = \"a\"`"));
        assert!(error(quote!(keys = ["a", b])).starts_with("each of `keys` must be a string"));
        assert!(error(quote!(keys = a)).starts_with("`keys` takes an array of string literals"));
        assert_eq!(
            error(quote!(keys = ["a"], keys = ["b"])),
            "`keys` set multiple times"
        );
        assert!(error(quote!(kind = "read")).starts_with("missing `key` argument"));
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

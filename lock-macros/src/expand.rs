//! The rewrite of an annotated `async fn`.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Error, GenericArgument, ItemFn, LitStr, PathArguments, ReturnType, Type};

use crate::args::{KindArg, LockArgs, LocksArg, OnLostArg};
use crate::duration::WaitArg;
use crate::key::{Bindings, KeyTemplate, respan};

/// The message for a missing return type.
const RETURN_TYPE_MESSAGE: &str =
    "#[distributed_lock] fns must return Result<T, E> where E: From<lock_runtime::LockError>";

/// The message for an `impl Trait` return type, which a lock error cannot be turned into.
const IMPL_TRAIT_MESSAGE: &str = "#[distributed_lock] cannot turn a lock error into an `impl Trait` \
     return type: return `Result<impl Trait, E>` with `E: From<lock_runtime::LockError>` \
     (`LockError` itself is a response with the web features), or a concrete response type \
     such as `axum::response::Response` or `actix_web::HttpResponse`";

/// The environment variable that prints expansions to stderr: `1` for every annotated fn, or
/// the name of one fn.
const DEBUG_VAR: &str = "LOCK_MACROS_DEBUG";

/// Expands `#[distributed_lock(args)] item`. On any mistake the output is the item unchanged
/// plus the errors, so the user sees the mistake and nothing that follows from it.
pub(crate) fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let function = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = Error::new(
                Span::call_site(),
                "#[distributed_lock] can only be applied to an `async fn` with a body",
            );
            return with_error(item, error);
        }
    };
    match expand(args, &function) {
        Ok(expanded) => {
            debug_print(&function, &expanded);
            expanded
        }
        Err(error) => with_error(item, error),
    }
}

fn with_error(item: TokenStream, error: Error) -> TokenStream {
    let error = error.into_compile_error();
    quote!(#item #error)
}

// Input:
//
//     #[distributed_lock(key = "goods:<id>", lease = "5s", wait = "2s")]
//     pub async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
//         body
//     }
//
// Output (`krate` is `::lock_runtime` unless `crate = ".."` says otherwise):
//
//     pub async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
//         krate::__private::assert_error_type::<AppError>();             // span: `AppError`
//         let __lock_key = ::std::format!(
//             "goods:{}",
//             ::std::string::ToString::to_string(krate::__private::key_part(&id)), // span: key
//         );
//         let __lock_spec = krate::__private::LockSpec {
//             locks: krate::__private::Locks::Lock(__lock_key),     // `Read` / `Write` by `kind`
//             lease: ::core::option::Option::Some(krate::__private::Duration::from_millis(5000u64)),
//             wait: krate::__private::Wait::For(krate::__private::Duration::from_millis(2000u64)),
//             hold_at_least: ::core::option::Option::None,
//             on_lost: krate::__private::OnLost::Fail,
//             metric_label: "goods:<id>",                              // the key as written
//         };
//         krate::__private::run_locked(__lock_spec, async move {        // span: `AppError`
//             #[allow(unreachable_code, ..)]
//             if false {                                                 // span: return type
//                 let __lock_ret: Result<u32, AppError> = loop {};
//                 return __lock_ret;
//             }
//             body's statements
//         })
//         .await
//     }
//
// With `keys = ["account:<from>", "account:<to>"]` the keys are one `Vec`, each built like the
// key above:
//
//         let __lock_keys = ::std::vec![::std::format!("account:{}", ..), ::std::format!(..)];
//         let __lock_spec = krate::__private::LockSpec {
//             locks: krate::__private::Locks::All(__lock_keys),
//             metric_label: "account:<from>,account:<to>",
//             ..
//         };
//
// The signature, attributes, visibility, generics and receiver are kept as they are. The key is
// built before the body runs, because the body may move the values it is built from, and only
// the finished `String` is kept across the await. The `if false` return gives the async block
// the fn's return type before the body is checked, so `?` and `return` in the body infer as
// they did in the fn; it is left out when the return type contains `impl Trait`, which a `let`
// cannot name.
//
// One mistake, one error: the compiler drops an unmet bound that another unmet bound at the
// same span implies. So `run_locked` (bound `E: From<LockError>`) carries the span of
// `assert_error_type` (bound `E: LockErrorTarget`, which implies it), and each placeholder's
// `to_string` (bound `T: Display`) the span of its `key_part` (bound `T: KeyPart`). `format!`
// gets finished strings because its own `Display` bound would be reported separately.
//
// With a one-argument alias such as `io::Result<T>` there is no `E` to name; the `if false`
// block then also calls a local `fn __lock_error_type<T, E: LockErrorTarget>(_: &Result<T, E>)`
// with `&__lock_ret`, at the span of `Result`, which is also the span of `run_locked`.
fn expand(args: TokenStream, function: &ItemFn) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let args = errors.take(LockArgs::parse(args));
    // An `async fn` of an `#[async_trait]` impl reaches us already rewritten (the impl's
    // attribute runs first): lock inside the boxed future it returns.
    let async_trait = function
        .sig
        .asyncness
        .is_none()
        .then(|| AsyncTraitFn::of(function))
        .flatten();
    if function.sig.asyncness.is_none() && async_trait.is_none() {
        errors.push(Error::new(
            function.sig.fn_token.span,
            "#[distributed_lock] can only be applied to an `async fn`; add `async` here",
        ));
    }
    let output_of_future: ReturnType;
    let output = match &async_trait {
        Some(shape) => {
            let output = shape.output;
            output_of_future = syn::parse_quote!(-> #output);
            &output_of_future
        }
        None => &function.sig.output,
    };
    let result_type = errors.take(Output::of(output, &function.sig.ident));
    // Every template is checked, so each bad one is reported.
    let mut bindings = Bindings::of(&function.sig);
    if let Some(args) = &args
        && let Some(with) = errors.take(Bindings::of(&function.sig).with(&args.with))
    {
        bindings = with;
    }
    let templates: Option<Vec<KeyTemplate>> = args.as_ref().map(|args| {
        args.key_literals()
            .filter_map(|lit| errors.take(KeyTemplate::parse(lit, &bindings)))
            .collect()
    });
    // a `with(..)` value no template uses is a mistake (a misspelt placeholder, most likely)
    if let (Some(args), Some(templates)) = (&args, &templates)
        && templates.len() == args.key_literals().count()
    {
        for binding in &args.with {
            let name = binding.name.unraw().to_string();
            if !templates.iter().any(|t| t.uses(&name)) {
                errors.push(Error::new(
                    binding.name.span(),
                    format!(
                        "`{name}` is computed in `with(..)` but no key placeholder uses it: \
                         write `<{name}>` in the key, or remove it"
                    ),
                ));
            }
        }
    }
    errors.finish()?;
    let (Some(args), Some(result_type), Some(templates)) = (args, result_type, templates) else {
        unreachable!("every missing part recorded an error");
    };

    let krate = &args.krate;
    let private = quote!(#krate::__private);
    let key_exprs = templates
        .iter()
        .zip(args.key_literals())
        .map(|(template, lit)| template.to_expr(lit, krate, &bindings));
    // `with(..)` values, computed once each before the key, in hygienic locals
    let with_lets = args.with.iter().map(|binding| {
        let var = crate::key::with_var(&binding.name);
        let expr = &binding.expr;
        quote!(let #var = #expr;)
    });
    let keys_var = match &args.locks {
        LocksArg::One { .. } => quote::format_ident!("__lock_key", span = Span::mixed_site()),
        LocksArg::All(_) => quote::format_ident!("__lock_keys", span = Span::mixed_site()),
    };
    let (keys_value, locks) = match &args.locks {
        LocksArg::One { kind, .. } => {
            let variant = match kind {
                KindArg::Lock => quote!(Lock),
                KindArg::Read => quote!(Read),
                KindArg::Write => quote!(Write),
            };
            (
                quote!(#(#key_exprs)*),
                quote!(#private::Locks::#variant(#keys_var)),
            )
        }
        LocksArg::All(_) => (
            quote!(::std::vec![#(#key_exprs),*]),
            quote!(#private::Locks::All(#keys_var)),
        ),
    };
    // the templates as written name the lock in metrics: `keys = [..]` joins them
    let label_text: Vec<String> = args.key_literals().map(LitStr::value).collect();
    let metric_label = LitStr::new(&label_text.join(","), Span::call_site());
    let lease = match args.lease_millis {
        Some(millis) => {
            let millis = Literal::u64_suffixed(millis);
            quote!(::core::option::Option::Some(#private::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    };
    let hold_at_least = match args.hold_millis {
        Some(millis) => {
            let millis = Literal::u64_suffixed(millis);
            quote!(::core::option::Option::Some(#private::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    };
    let wait = match args.wait {
        None => quote!(#private::Wait::Default),
        Some(WaitArg::Forever) => quote!(#private::Wait::Forever),
        Some(WaitArg::Millis(millis)) => {
            let millis = Literal::u64_suffixed(millis);
            quote!(#private::Wait::For(#private::Duration::from_millis(#millis)))
        }
    };
    let on_lost = match args.on_lost {
        OnLostArg::Fail => quote!(#private::OnLost::Fail),
        OnLostArg::Continue => quote!(#private::OnLost::Continue),
    };

    // The error type is checked at one span, and `run_locked` (whose bound `E: From<LockError>`
    // fails at the same time) is called with that same span, so only one error is shown. An
    // error type written out is checked with `assert_error_type`; for an alias such as
    // `io::Result<T>` a local helper names `E` by unifying it with the return type. Any other
    // return type (`AppResult<T>`, a web response) is checked as a whole with
    // `assert_output_type` and run by `run_locked_output`.
    let (ret, run_fn) = match &result_type {
        Output::Result(result) => (result.ret, quote!(run_locked)),
        Output::Other(ret) => (*ret, quote!(run_locked_output)),
    };
    let (check_span, error_check, alias_check) = match &result_type {
        Output::Other(ret) => {
            let span = type_span(ret);
            let check = quote!(#private::assert_output_type::<#ret>(););
            (span, Some(respan(check, span)), None)
        }
        Output::Result(ResultType {
            error: Some(error), ..
        }) if contains_impl_trait(error) => (type_span(error), None, None),
        Output::Result(ResultType {
            error: Some(error), ..
        }) => {
            let span = type_span(error);
            let check = quote!(#private::assert_error_type::<#error>(););
            (span, Some(respan(check, span)), None)
        }
        Output::Result(ResultType {
            error: None, name, ..
        }) => {
            let span = name.span();
            let check = quote!(__lock_error_type(&__lock_ret););
            (span, None, Some(respan(check, span)))
        }
    };
    // `impl Trait` cannot be written in a `let` type; such fns keep plain inference.
    let return_hint = (!contains_impl_trait(ret)).then(|| {
        let alias_helper = alias_check.is_some().then(|| {
            quote! {
                fn __lock_error_type<__T, __E: #private::LockErrorTarget>(
                    _: &::core::result::Result<__T, __E>,
                ) {
                }
            }
        });
        quote_spanned! {ret.span()=>
            #[allow(
                unknown_lints,
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::let_with_type_underscore,
                clippy::needless_return,
                clippy::unreachable
            )]
            if false {
                #alias_helper
                let __lock_ret: #ret = loop {};
                #alias_check
                return __lock_ret;
            }
        }
    });

    let spec_var = quote::format_ident!("__lock_spec", span = Span::mixed_site());
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    // The body's statements go straight into the async block: wrapped in a block of their own,
    // a one-line body such as `{ Ok(id) }` would draw an `unused_braces` warning the user did
    // not cause.
    let statements = match &async_trait {
        Some(shape) => &shape.body.stmts,
        None => &block.stmts,
    };
    let body = quote! {
        async move {
            #return_hint
            #(#statements)*
        }
    };
    let run_locked = respan(quote!(#private::#run_fn), check_span);
    let run = quote_spanned!(check_span=> #run_locked(#spec_var, #body).await);
    let locked = quote! {
        #error_check
        #(#with_lets)*
        let #keys_var = #keys_value;
        let #spec_var = #private::LockSpec {
            locks: #locks,
            lease: #lease,
            wait: #wait,
            hold_at_least: #hold_at_least,
            on_lost: #on_lost,
            metric_label: #metric_label,
        };
        #run
    };
    Ok(match async_trait {
        Some(_) => quote! {
            #(#attrs)*
            #vis #sig {
                ::std::boxed::Box::pin(async move { #locked })
            }
        },
        None => quote! {
            #(#attrs)*
            #vis #sig {
                #locked
            }
        },
    })
}

/// A method as `#[async_trait]` leaves it: `fn f(..) -> Pin<Box<dyn Future<Output = R> + ..>>`
/// whose body ends in `Box::pin(async move { .. })`.
struct AsyncTraitFn<'a> {
    /// `R`.
    output: &'a Type,
    /// The block of the `async move`.
    body: &'a syn::Block,
}

impl<'a> AsyncTraitFn<'a> {
    fn of(function: &'a ItemFn) -> Option<Self> {
        let ReturnType::Type(_, ret) = &function.sig.output else {
            return None;
        };
        let output = boxed_future_output(ret)?;
        let [syn::Stmt::Expr(syn::Expr::Call(call), None)] = function.block.stmts.as_slice() else {
            return None;
        };
        let syn::Expr::Path(func) = &*call.func else {
            return None;
        };
        let names: Vec<String> = func
            .path
            .segments
            .iter()
            .map(|s| s.ident.to_string())
            .collect();
        if !names.ends_with(&["Box".to_owned(), "pin".to_owned()]) {
            return None;
        }
        let [syn::Expr::Async(block)] = call.args.iter().collect::<Vec<_>>().as_slice() else {
            return None;
        };
        Some(AsyncTraitFn {
            output,
            body: &block.block,
        })
    }
}

/// `R` of `Pin<Box<dyn Future<Output = R> + ..>>`.
fn boxed_future_output(ty: &Type) -> Option<&Type> {
    let pin = single_generic(ty, "Pin")?;
    let Type::TraitObject(object) = single_generic(pin, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let syn::TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        if last.ident != "Future" {
            return None;
        }
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// `T` of `…Name<T>`.
fn single_generic<'t>(ty: &'t Type, name: &str) -> Option<&'t Type> {
    let Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    if last.ident != name {
        return None;
    }
    args.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    })
}

/// What an annotated fn returns.
enum Output<'a> {
    /// `…Result<T, E>` or a one-argument `…Result<T>` alias.
    Result(ResultType<'a>),
    /// Any other type: it must carry a lock error itself (`LockOutput`).
    Other(&'a Type),
}

impl<'a> Output<'a> {
    fn of(output: &'a ReturnType, name: &syn::Ident) -> syn::Result<Self> {
        let ReturnType::Type(_, ret) = output else {
            return Err(Error::new(name.span(), RETURN_TYPE_MESSAGE));
        };
        let mut inner: &Type = ret;
        while let Type::Paren(paren) = inner {
            inner = &paren.elem;
        }
        if let Type::ImplTrait(_) = inner {
            return Err(Error::new_spanned(ret, IMPL_TRAIT_MESSAGE));
        }
        if let Some(result) = ResultType::of(ret, inner) {
            if let Some(Type::Tuple(tuple)) = result.error {
                // the orphan rule forbids `impl From<LockError> for (A, B)` in any crate
                let written = quote!(#tuple).to_string();
                return Err(Error::new_spanned(
                    tuple,
                    format!(
                        "the error type `{written}` cannot carry a lock error: a tuple can never \
                         implement `From<lock_runtime::LockError>`; return \
                         `Result<T, lock_runtime::LockError>` (with the web features it answers \
                         409 / 503 by itself) or an error type of your own with \
                         `impl From<lock_runtime::LockError>`"
                    ),
                ));
            }
            return Ok(Output::Result(result));
        }
        Ok(Output::Other(ret))
    }
}

/// The parts of a `Result<T, E>` return type the expansion needs.
struct ResultType<'a> {
    ret: &'a Type,
    /// The `Result` of the path.
    name: &'a syn::Ident,
    /// `E` when written out; `None` for a one-argument alias such as `io::Result<T>`.
    error: Option<&'a Type>,
}

impl<'a> ResultType<'a> {
    /// `ret` (`inner` without parentheses) when it is `…Result<T, E>` or `…Result<T>`.
    fn of(ret: &'a Type, inner: &'a Type) -> Option<Self> {
        let Type::Path(path) = inner else {
            return None;
        };
        let last = path
            .path
            .segments
            .last()
            .filter(|last| last.ident == "Result")?;
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        let types: Vec<&Type> = args
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect();
        let error = match types.as_slice() {
            [_] => None,
            [_, error] => Some(*error),
            _ => return None,
        };
        Some(Self {
            ret,
            name: &last.ident,
            error,
        })
    }
}

/// One token's span standing for `ty` in errors: the last segment of a path (`AppError` in
/// `errors::AppError`), the first token otherwise. A single token, because spans of several
/// tokens cannot be joined on stable compilers.
fn type_span(ty: &Type) -> Span {
    match ty {
        Type::Path(path) => path.path.segments.last().map(|s| s.ident.span()),
        _ => None,
    }
    .unwrap_or_else(|| ty.span())
}

fn contains_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl Visit<'_> for Finder {
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}

/// Collects independent mistakes so each one is reported, once.
#[derive(Default)]
struct Errors(Option<Error>);

impl Errors {
    fn push(&mut self, error: Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

fn debug_print(function: &ItemFn, expanded: &TokenStream) {
    let Ok(wanted) = std::env::var(DEBUG_VAR) else {
        return;
    };
    let name = function.sig.ident.to_string();
    if wanted == "1" || wanted == name {
        eprintln!("#[distributed_lock] expansion of `{name}`:\n{expanded}\n");
    }
}

#[cfg(test)]
mod tests;

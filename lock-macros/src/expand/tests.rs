use super::*;

fn expand_str(args: TokenStream, item: TokenStream) -> String {
    distributed_lock(args, item).to_string()
}

fn error_messages(args: TokenStream, item: TokenStream) -> Vec<String> {
    let function: ItemFn = syn::parse2(item).unwrap();
    let error = expand(args, &function).unwrap_err();
    error.into_iter().map(|e| e.to_string()).collect()
}

#[test]
fn body_runs_inside_run_locked_after_the_key_is_built() {
    let out = expand_str(
        quote!(key = "goods:<id>", lease = "5s", wait = "2s"),
        quote! {
            /// Docs stay.
            #[inline]
            pub(crate) async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
                Ok(qty)
            }
        },
    );
    let expected = quote! {
        #[doc = r" Docs stay."]
        #[inline]
        pub(crate) async fn decrease_stock(id: u64, qty: u32) -> Result<u32, AppError> {
            ::lock_runtime::__private::assert_error_type::<AppError>();
            let __lock_key = ::std::format!(
                "goods:{}",
                ::std::string::ToString::to_string(::lock_runtime::__private::key_part(&id))
            );
            let __lock_spec = ::lock_runtime::__private::LockSpec {
                locks: ::lock_runtime::__private::Locks::Lock(__lock_key),
                lease: ::core::option::Option::Some(
                    ::lock_runtime::__private::Duration::from_millis(5000u64)
                ),
                wait: ::lock_runtime::__private::Wait::For(
                    ::lock_runtime::__private::Duration::from_millis(2000u64)
                ),
                hold_at_least: ::core::option::Option::None,
                on_lost: ::lock_runtime::__private::OnLost::Fail,
                metric_label: "goods:<id>",
            };
            ::lock_runtime::__private::run_locked(__lock_spec, async move {
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
                    let __lock_ret: Result<u32, AppError> = loop {};
                    return __lock_ret;
                }
                Ok(qty)
            })
            .await
        }
    };
    assert_eq!(out, expected.to_string());
}

#[test]
fn defaults_crate_path_and_aliases() {
    let out = expand_str(
        quote!(
            key = "k",
            wait = "forever",
            on_lost = "continue",
            crate = "my::rt"
        ),
        quote!(
            async fn f(&self) -> io::Result<()> {
                Ok(())
            }
        ),
    );
    assert!(
        out.contains("lease : :: core :: option :: Option :: None"),
        "{out}"
    );
    assert!(
        out.contains("wait : my :: rt :: __private :: Wait :: Forever"),
        "{out}"
    );
    assert!(
        out.contains("on_lost : my :: rt :: __private :: OnLost :: Continue"),
        "{out}"
    );
    assert!(
        out.contains(":: std :: string :: String :: from (\"k\")"),
        "{out}"
    );
    // No written-out error type: the bound of `run_locked` checks the alias.
    assert!(!out.contains("assert_error_type"), "{out}");
    let default_wait = expand_str(
        quote!(key = "k"),
        quote!(
            async fn f() -> Result<(), E> {
                x
            }
        ),
    );
    assert!(default_wait.contains("Wait :: Default"), "{default_wait}");
}

#[test]
fn kind_picks_the_lock_and_keys_build_one_vec() {
    let item = quote!(
        async fn f(from: u64, to: u64) -> Result<(), E> {
            Ok(())
        }
    );
    for (kind, variant) in [("lock", "Lock"), ("read", "Read"), ("write", "Write")] {
        let out = expand_str(quote!(key = "account:<from>", kind = #kind), item.clone());
        let locks =
            format!("locks : :: lock_runtime :: __private :: Locks :: {variant} (__lock_key)");
        assert!(out.contains(&locks), "{out}");
    }
    let out = expand_str(
        quote!(keys = ["account:<from>", "account:<to>", "ledger"]),
        item.clone(),
    );
    let keys = quote!(
        let __lock_keys = ::std::vec![
            ::std::format!(
                "account:{}",
                ::std::string::ToString::to_string(::lock_runtime::__private::key_part(&from))
            ),
            ::std::format!(
                "account:{}",
                ::std::string::ToString::to_string(::lock_runtime::__private::key_part(&to))
            ),
            ::std::string::String::from("ledger")
        ];
    );
    assert!(out.contains(&keys.to_string()), "{out}");
    let locks = quote!(locks: ::lock_runtime::__private::Locks::All(__lock_keys),);
    assert!(out.contains(&locks.to_string()), "{out}");
}

#[test]
fn every_bad_template_of_keys_is_reported() {
    let messages = error_messages(
        quote!(keys = ["a:<from>", "b:<nope>", "c:<too>"]),
        quote!(
            async fn f(from: u64, to: u64) -> Result<(), E> {
                Ok(())
            }
        ),
    );
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[0].starts_with("unknown placeholder `<nope>`"));
    assert!(messages[1].starts_with("unknown placeholder `<too>`"));
}

#[test]
fn impl_trait_in_the_return_type_skips_the_typed_binding() {
    let out = expand_str(
        quote!(key = "k"),
        quote!(
            async fn f() -> Result<impl Display, E> {
                Ok(1)
            }
        ),
    );
    assert!(!out.contains("__lock_ret"), "{out}");
    assert!(out.contains("assert_error_type :: < E >"), "{out}");
}

#[test]
fn return_types_are_checked_by_the_compiler_unless_missing_or_impl_trait() {
    // no return type, or one a lock error cannot become: one error from the attribute
    assert_eq!(
        error_messages(
            quote!(key = "k"),
            quote!(
                async fn f() {}
            )
        ),
        [RETURN_TYPE_MESSAGE]
    );
    assert_eq!(
        error_messages(
            quote!(key = "k"),
            quote!(
                async fn f() -> impl IntoResponse {
                    x
                }
            )
        ),
        [IMPL_TRAIT_MESSAGE]
    );
    // anything else: `…Result<T, E>` is checked on `E`, other types as a whole (the compiler
    // reports `LockOutput` once when they cannot carry a lock error)
    for (item, check) in [
        (
            quote!(
                async fn f() -> Result<u8, E> {
                    Ok(1)
                }
            ),
            "assert_error_type",
        ),
        (
            quote!(
                async fn f() -> (Result<u8, E>) {
                    Ok(1)
                }
            ),
            "assert_error_type",
        ),
        (
            quote!(
                async fn f() -> AppResult<u8> {
                    Ok(1)
                }
            ),
            "assert_output_type",
        ),
        (
            quote!(
                async fn f() -> Response {
                    x
                }
            ),
            "assert_output_type",
        ),
        (
            quote!(
                async fn f() -> Option<u32> {
                    None
                }
            ),
            "assert_output_type",
        ),
        (
            quote!(
                async fn f() -> Result<A, B, C> {
                    x
                }
            ),
            "assert_output_type",
        ),
    ] {
        let out = expand_str(quote!(key = "k"), item);
        assert!(out.contains(check), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }
}

#[test]
fn independent_mistakes_are_each_reported_once() {
    assert_eq!(
        error_messages(
            quote!(key = "k"),
            quote!(
                fn f() -> Result<(), E> {
                    Ok(())
                }
            )
        ),
        ["#[distributed_lock] can only be applied to an `async fn`; add `async` here"]
    );
    let messages = error_messages(
        quote!(key = "<nope>", bogus = "1"),
        quote!(
            fn f() {}
        ),
    );
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert!(messages[0].starts_with("unknown argument `bogus`"));
    let messages = error_messages(
        quote!(key = "<nope>"),
        quote!(
            async fn f() -> Result<(), E> {}
        ),
    );
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(messages[0].starts_with("unknown placeholder `<nope>`"));
}

#[test]
fn errors_keep_the_item() {
    let item = quote!(
        async fn f() -> Result<u32, E> {
            Ok(1)
        }
    );
    let out = expand_str(quote!(key = ""), item.clone());
    assert!(out.starts_with(&item.to_string()), "{out}");
    assert!(out.contains("compile_error"), "{out}");
    let not_a_fn = expand_str(
        quote!(key = "k"),
        quote!(
            struct S;
        ),
    );
    assert!(not_a_fn.starts_with("struct S ;"), "{not_a_fn}");
    assert!(not_a_fn.contains("can only be applied to an `async fn` with a body"));
}

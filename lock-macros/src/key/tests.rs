use super::*;
use quote::quote;

fn bindings(sig: TokenStream) -> Bindings {
    let sig: Signature = syn::parse2(sig).unwrap();
    Bindings::of(&sig)
}

fn template(key: &str, sig: TokenStream) -> syn::Result<KeyTemplate> {
    KeyTemplate::parse(&LitStr::new(key, Span::call_site()), &bindings(sig))
}

fn error(key: &str, sig: TokenStream) -> String {
    match template(key, sig) {
        Ok(_) => panic!("{key:?} was accepted"),
        Err(error) => error.to_string(),
    }
}

fn expr(key: &str, sig: TokenStream) -> String {
    let lit = LitStr::new(key, Span::call_site());
    let krate: syn::Path = syn::parse_quote!(::lock_runtime);
    let sig_bindings = bindings(sig.clone());
    template(key, sig)
        .map_err(|e| e.to_string())
        .unwrap()
        .to_expr(&lit, &krate, &sig_bindings)
        .to_string()
}

#[test]
fn patterns_bind_every_name_they_introduce() {
    let found = bindings(quote!(fn f(
        &self,
        id: u64,
        mut count: u32,
        ref r#type: u8,
        Path(order_id): Path<u64>,
        (a, (b, _)): (u8, (u8, u8)),
        Point { x, y: renamed, .. }: Point,
        [first, ..]: [u8; 3],
        whole @ Wrapper(inner): Wrapper,
        &borrowed: &u8,
        _: u8,
    )));
    assert!(found.has_self);
    assert_eq!(
        found.names,
        [
            "id", "count", "type", "order_id", "a", "b", "x", "renamed", "first", "whole", "inner",
            "borrowed"
        ]
    );
    assert!(!bindings(quote!(fn f(id: u64))).has_self);
}

#[test]
fn text_and_placeholders_are_split() {
    let parsed = template(
        "a:<id>:<user.id>:<pair.0><<x>",
        quote!(fn f(id: u64, user: U, pair: P)),
    );
    let Ok(parsed) = parsed else {
        panic!("rejected")
    };
    let segments = parsed.segments;
    let names: Vec<String> = segments
        .iter()
        .map(|segment| match segment {
            Segment::Text(text) => format!("text {text}"),
            Segment::Placeholder(p) => {
                let fields = p.fields.iter().map(|access| match access {
                    Access::Field(field) => quote!(.#field),
                    Access::Method(method) => quote!(.#method()),
                });
                format!("{} {} {:?}", p.root, quote!(#(#fields)*), p.range)
            }
        })
        .collect();
    assert_eq!(
        names,
        [
            "text a:",
            "id  2..6",
            "text :",
            "user . id 7..16",
            "text :",
            "pair . 0 17..25",
            "text <x>"
        ]
    );
}

#[test]
fn generated_expression_formats_each_placeholder_with_key_part() {
    assert_eq!(
        expr("goods:<id>", quote!(fn f(id: u64))),
        quote!(::std::format!(
            "goods:{}",
            ::std::string::ToString::to_string(::lock_runtime::__private::key_part(&id))
        ))
        .to_string()
    );
    assert_eq!(
        expr("{tag}:<self.id>", quote!(fn f(&self))),
        quote!(::std::format!(
            "{{tag}}:{}",
            ::std::string::ToString::to_string(::lock_runtime::__private::key_part(&self.id))
        ))
        .to_string()
    );
    assert_eq!(
        expr("fixed<<", quote!(fn f())),
        quote!(::std::string::String::from("fixed<")).to_string()
    );
}

#[test]
fn unknown_placeholders_name_what_is_available() {
    assert_eq!(
        error("goods:<idd>", quote!(fn f(&self, id: u64))),
        "unknown placeholder `<idd>`: no parameter of this fn (nor `with(..)`) binds `idd` (available: `self`, `id`)"
    );
    assert_eq!(
        error("<self.id>", quote!(fn f(id: u64))),
        "unknown placeholder `<self.id>`: `self` is not a parameter of this fn (available: `id`)"
    );
    assert!(error("<id>", quote!(fn f())).contains("(this fn has no parameters)"));
    // A placeholder names a binding, not a type or a pattern's constructor.
    assert!(error("<Path>", quote!(fn f(Path(id): Path<u64>))).contains("binds `Path`"));
}

#[test]
fn malformed_templates_are_rejected() {
    let sig = || quote!(fn f(id: u64, user: U));
    assert!(error("", sig()).contains("must not be empty"));
    assert!(error("goods:<id", sig()).starts_with("unclosed placeholder"));
    assert!(error("goods:<>", sig()).starts_with("empty placeholder"));
    for bad in [
        "<1id>",
        "<id.>",
        "<.id>",
        "<user..id>",
        "<user.type>",
        "< id>",
        "<a-b>",
        "<a<b>",
    ] {
        assert!(
            error(bad, sig()).starts_with("invalid placeholder"),
            "{bad}"
        );
    }
}

#[test]
fn lone_closing_brackets_are_text() {
    let Ok(parsed) = template("a>b", quote!(fn f())) else {
        panic!("rejected")
    };
    assert!(matches!(parsed.segments.as_slice(), [Segment::Text(text)] if text == "a>b"));
}

#[test]
fn placeholders_call_methods_without_arguments() {
    let generated = expr(
        "user:<user.email()>:<user.profile.name().len()>",
        quote!(fn f(user: U)),
    );
    assert!(generated.contains("& user . email ()"), "{generated}");
    assert!(
        generated.contains("& user . profile . name () . len ()"),
        "{generated}"
    );
    // arguments, spaces, a method as the root: refused with the way out
    for bad in [
        "<user.email(1)>",
        "<user.email( )>",
        "<email()>",
        "<user.()>",
    ] {
        let e = error(bad, quote!(fn f(user: U)));
        assert!(e.contains("with("), "{bad}: {e}");
    }
}

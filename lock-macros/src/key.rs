//! The key template: `"goods:<id>"` -> literal text and `<name.field>` placeholders, checked
//! against the names the fn's parameters bind, then turned into a `format!` call.

use std::ops::Range;

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::quote;
use syn::ext::IdentExt;
use syn::parse::Parser;
use syn::{Error, FnArg, Ident, LitStr, Member, Pat, Signature};

/// A parsed key template.
pub(crate) struct KeyTemplate {
    segments: Vec<Segment>,
}

enum Segment {
    /// Text copied into the key as it is.
    Text(String),
    Placeholder(Placeholder),
}

/// `<root.field.method()>`: a binding of the fn's parameters (or `self`, or a name of
/// `with(..)`) and a path of fields and argument-less method calls.
struct Placeholder {
    /// What is between `<` and `>`, for messages.
    path: String,
    root: Ident,
    fields: Vec<Access>,
    /// Byte range of `<..>` in the key's value, for error spans.
    range: Range<usize>,
}

/// One step of a placeholder's path.
enum Access {
    /// `.field` or `.0`.
    Field(Member),
    /// `.method()`: a method that takes no argument.
    Method(Ident),
}

/// A template error before it is given a span: the message and where in the key it is.
struct TemplateError {
    message: String,
    range: Range<usize>,
}

/// The names a fn's parameters bind, walking patterns such as `Path((a, b)): Path<(u64, u64)>`.
#[derive(Debug, Default)]
pub(crate) struct Bindings {
    names: Vec<String>,
    has_self: bool,
    /// The names of `with(..)` and the span of each one's expression.
    with: Vec<(String, Span)>,
}

impl Bindings {
    /// Collects the bindings of every parameter of `sig`, including the receiver.
    pub(crate) fn of(sig: &Signature) -> Self {
        let mut bindings = Self::default();
        for input in &sig.inputs {
            match input {
                FnArg::Receiver(_) => bindings.has_self = true,
                FnArg::Typed(typed) => collect_pattern(&typed.pat, &mut bindings.names),
            }
        }
        bindings
    }

    /// Adds the names of `with(..)`; a name that a parameter binds too is an error at it.
    pub(crate) fn with(mut self, with: &[crate::args::WithBinding]) -> syn::Result<Self> {
        for binding in with {
            let name = binding.name.unraw().to_string();
            if self.names.contains(&name) {
                return Err(Error::new(
                    binding.name.span(),
                    format!(
                        "`{name}` in `with(..)` is also a parameter of this fn: name the \
                         computed value otherwise (a placeholder `<{name}>` would be ambiguous)"
                    ),
                ));
            }
            self.with
                .push((name, syn::spanned::Spanned::span(&binding.expr)));
        }
        Ok(self)
    }

    /// The span of the expression of the `with(..)` name `name`, if it is one.
    fn with_span(&self, name: &str) -> Option<Span> {
        self.with
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, span)| *span)
    }
}

/// The local that holds the value of the `with(..)` name `name` (hygienic: the fn's body cannot
/// see it).
pub(crate) fn with_var(name: &Ident) -> Ident {
    quote::format_ident!("__lock_with_{}", name.unraw(), span = Span::mixed_site())
}

fn collect_pattern(pat: &Pat, names: &mut Vec<String>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.unraw().to_string());
            if let Some((_, sub)) = &ident.subpat {
                collect_pattern(sub, names);
            }
        }
        // Every case of an or-pattern binds the same names.
        Pat::Or(or) => or
            .cases
            .iter()
            .take(1)
            .for_each(|p| collect_pattern(p, names)),
        Pat::Paren(paren) => collect_pattern(&paren.pat, names),
        Pat::Reference(reference) => collect_pattern(&reference.pat, names),
        Pat::Type(typed) => collect_pattern(&typed.pat, names),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| collect_pattern(p, names)),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| collect_pattern(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| collect_pattern(p, names)),
        Pat::Struct(strukt) => strukt
            .fields
            .iter()
            .for_each(|field| collect_pattern(&field.pat, names)),
        _ => {}
    }
}

impl KeyTemplate {
    /// Parses `lit` and checks every placeholder against `bindings`; errors point at the literal
    /// (at the offending placeholder where the compiler supports sub-spans).
    pub(crate) fn parse(lit: &LitStr, bindings: &Bindings) -> syn::Result<Self> {
        let to_error = |error: TemplateError| Error::new(subspan(lit, error.range), error.message);
        let segments = parse_segments(&lit.value()).map_err(to_error)?;
        for segment in &segments {
            if let Segment::Placeholder(placeholder) = segment {
                check_binding(placeholder, bindings).map_err(to_error)?;
            }
        }
        check_foreign_placeholders(&lit.value(), &segments, bindings).map_err(to_error)?;
        Ok(Self { segments })
    }

    /// The expression that builds the key `String`, e.g.
    /// `::std::format!("goods:{}", ::lock_runtime::__private::key_part(&id))`. Each `key_part`
    /// call carries the span of its placeholder so a value that is not `Display` is reported
    /// there, once.
    pub(crate) fn to_expr(
        &self,
        lit: &LitStr,
        krate: &syn::Path,
        bindings: &Bindings,
    ) -> TokenStream {
        let mut format = String::new();
        let mut values = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Segment::Placeholder(placeholder) => {
                    format.push_str("{}");
                    let at_key = subspan(lit, placeholder.range.clone());
                    let with = bindings.with_span(&placeholder.root.unraw().to_string());
                    // a `with(..)` value is checked at its expression, a parameter at the key
                    let span = with.unwrap_or(at_key);
                    let root = match with {
                        Some(_) => {
                            // the local's hygiene at the expression's place: the bounds fail at
                            // one span, so only one error is shown
                            // (in parentheses: an expression that begins and ends in different
                            // hygiene contexts would be reported at the whole attribute)
                            let mut var = with_var(&placeholder.root);
                            var.set_span(Span::mixed_site().located_at(span));
                            let mut value =
                                Group::new(proc_macro2::Delimiter::Parenthesis, quote!(#var));
                            value.set_span(span);
                            let and = respan(quote!(&), span);
                            quote!(#and #value)
                        }
                        None => {
                            let placeholder_root = &placeholder.root;
                            respan(quote!(&#placeholder_root), span)
                        }
                    };
                    // Field names carry a span from this expansion: a misspelt field is still
                    // reported at the key, but the compiler does not suggest replacing the
                    // whole key literal with the field it meant.
                    let field_span = Span::mixed_site().located_at(span);
                    let fields = placeholder.fields.iter().map(|access| {
                        let dot = respan(quote!(.), span);
                        match access {
                            Access::Field(field) => {
                                let mut field = field.clone();
                                match &mut field {
                                    Member::Named(name) => name.set_span(field_span),
                                    Member::Unnamed(index) => index.span = field_span,
                                }
                                quote!(#dot #field)
                            }
                            Access::Method(method) => {
                                let mut method = method.clone();
                                method.set_span(field_span);
                                let mut call =
                                    Group::new(proc_macro2::Delimiter::Parenthesis, quote!());
                                call.set_span(span);
                                quote!(#dot #method #call)
                            }
                        }
                    });
                    let to_string = respan(quote!(::std::string::ToString::to_string), span);
                    let key_part = respan(quote!(#krate::__private::key_part), span);
                    let parens = |inner: TokenStream| {
                        let mut group = Group::new(proc_macro2::Delimiter::Parenthesis, inner);
                        group.set_span(span);
                        group
                    };
                    let argument = parens(quote!(#root #(#fields)*));
                    let call = parens(quote!(#key_part #argument));
                    values.push(quote!(#to_string #call));
                }
            }
        }
        if values.is_empty() {
            let text = LitStr::new(&self.text(), lit.span());
            return quote!(::std::string::String::from(#text));
        }
        let format = LitStr::new(&format, lit.span());
        quote!(::std::format!(#format, #(#values),*))
    }

    /// Whether a placeholder of this template starts at `name`.
    pub(crate) fn uses(&self, name: &str) -> bool {
        self.segments.iter().any(|segment| match segment {
            Segment::Placeholder(p) => p.root.unraw() == name,
            Segment::Text(_) => false,
        })
    }

    /// The literal text of a template without placeholders.
    fn text(&self) -> String {
        self.segments
            .iter()
            .map(|segment| match segment {
                Segment::Text(text) => text.as_str(),
                Segment::Placeholder(_) => "",
            })
            .collect()
    }
}

fn parse_segments(key: &str) -> Result<Vec<Segment>, TemplateError> {
    if key.is_empty() {
        return Err(TemplateError {
            message: "`key` must not be empty; write the lock's name, e.g. \"order:<id>\"".into(),
            range: 0..0,
        });
    }
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut rest = key;
    let mut offset = 0;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        if let Some(escaped) = after.strip_prefix('<') {
            // `<<` is a literal `<`.
            text.push('<');
            rest = escaped;
            offset += open + 2;
            continue;
        }
        let start = offset + open;
        let Some(close) = after.find('>') else {
            return Err(TemplateError {
                message: "unclosed placeholder: `<` without a matching `>` \
                          (write `<<` for a literal `<`)"
                    .into(),
                range: start..key.len(),
            });
        };
        let range = start..start + close + 2;
        let placeholder = parse_placeholder(&after[..close], range)?;
        if !text.is_empty() {
            segments.push(Segment::Text(std::mem::take(&mut text)));
        }
        segments.push(Segment::Placeholder(placeholder));
        rest = &after[close + 1..];
        offset = start + close + 2;
    }
    text.push_str(rest);
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

fn parse_placeholder(inner: &str, range: Range<usize>) -> Result<Placeholder, TemplateError> {
    let invalid = |message: String| TemplateError {
        message,
        range: range.clone(),
    };
    if inner.is_empty() {
        return Err(invalid(
            "empty placeholder `<>`: name a parameter, e.g. `<id>` or `<user.id>`".into(),
        ));
    }
    let bad_path = || {
        invalid(format!(
            "invalid placeholder `<{inner}>`: expected a parameter name, then fields and \
             methods without arguments, such as `<id>`, `<user.id>`, `<pair.0>` or \
             `<user.email()>`; for any other expression, compute it in `with(..)`: \
             `key = \"user:<email>\", with(email = user.email().to_lowercase())`"
        ))
    };
    // Only identifier characters, dots and `()`: no spaces or comments around the names.
    let allowed = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '#' | '(' | ')');
    if !inner.chars().all(allowed) {
        return Err(bad_path());
    }
    let mut parts = inner.split('.');
    let root = parts
        .next()
        .and_then(|root| Ident::parse_any.parse_str(root).ok())
        .ok_or_else(bad_path)?;
    let fields = parts
        .map(|part| match part.strip_suffix("()") {
            Some(method) => Ident::parse_any
                .parse_str(method)
                .map(Access::Method)
                .map_err(|_| bad_path()),
            None => syn::parse_str::<Member>(part)
                .map(Access::Field)
                .map_err(|_| bad_path()),
        })
        .collect::<Result<_, _>>()?;
    Ok(Placeholder {
        path: inner.to_owned(),
        root,
        fields,
        range,
    })
}

fn check_binding(placeholder: &Placeholder, bindings: &Bindings) -> Result<(), TemplateError> {
    let root = placeholder.root.unraw().to_string();
    let known = if root == "self" {
        bindings.has_self
    } else {
        bindings.names.contains(&root) || bindings.with_span(&root).is_some()
    };
    if known {
        return Ok(());
    }
    let mut available: Vec<String> = bindings
        .names
        .iter()
        .chain(bindings.with.iter().map(|(n, _)| n))
        .map(|n| format!("`{n}`"))
        .collect();
    if bindings.has_self {
        available.insert(0, "`self`".into());
    }
    let available = if available.is_empty() {
        "this fn has no parameters".to_owned()
    } else {
        format!("available: {}", available.join(", "))
    };
    let what = if root == "self" {
        "`self` is not a parameter of this fn".to_owned()
    } else {
        format!("no parameter of this fn (nor `with(..)`) binds `{root}`")
    };
    Err(TemplateError {
        message: format!(
            "unknown placeholder `<{}>`: {what} ({available})",
            placeholder.path
        ),
        range: placeholder.range.clone(),
    })
}

/// Placeholders written in other libraries' syntax - `{id}` (the `format!` habit) and `#id` or
/// `#{id}` (lock4j, Spring) - that name a parameter would silently be literal text, locking one
/// constant key for every call: an error that says to write `<id>`. Braces and `#` that do not
/// name a parameter stay literal text.
fn check_foreign_placeholders(
    key: &str,
    segments: &[Segment],
    bindings: &Bindings,
) -> Result<(), TemplateError> {
    let inside_placeholder = |at: usize| {
        segments.iter().any(|s| match s {
            Segment::Placeholder(p) => p.range.contains(&at),
            Segment::Text(_) => false,
        })
    };
    let binds = |path: &str| {
        let root = path.split('.').next().unwrap_or("");
        let root = root.strip_prefix("r#").unwrap_or(root);
        !root.is_empty()
            && if root == "self" {
                bindings.has_self
            } else {
                bindings.names.iter().any(|n| n == root) || bindings.with_span(root).is_some()
            }
    };
    let path_len = |text: &str| {
        text.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(text.len())
    };
    for (at, c) in key.char_indices() {
        if inside_placeholder(at) {
            continue;
        }
        let (written, path, end) = match c {
            '{' => {
                let inner = &key[at + 1..];
                let len = path_len(inner);
                if !inner[len..].starts_with('}') {
                    continue;
                }
                (&key[at..at + len + 2], &inner[..len], at + len + 2)
            }
            '#' => {
                let after = &key[at + 1..];
                let braced = after.starts_with('{');
                let inner = if braced { &after[1..] } else { after };
                let len = path_len(inner);
                if braced && !inner[len..].starts_with('}') {
                    continue;
                }
                let end = at + 1 + usize::from(braced) * 2 + len;
                (&key[at..end], &inner[..len], end)
            }
            _ => continue,
        };
        let path = path.trim_end_matches('.');
        if binds(path) {
            let syntax = if c == '{' {
                "`format!`"
            } else {
                "lock4j/Spring"
            };
            return Err(TemplateError {
                message: format!(
                    "`{written}` is not a placeholder here ({syntax} syntax): it would lock the \
                     same literal key for every call; write `<{path}>` to put the value of \
                     `{path}` in the key (braces and `#` are literal text in a key)"
                ),
                range: at..end,
            });
        }
    }
    Ok(())
}

/// The span of `range` (byte offsets into the literal's value) inside `lit`, when the compiler
/// can give sub-spans and the literal has no escapes; the whole literal otherwise.
fn subspan(lit: &LitStr, range: Range<usize>) -> Span {
    let token = lit.token();
    let source = token.to_string();
    let Some(quote) = source.find('"') else {
        return lit.span();
    };
    if source.contains('\\') || range.is_empty() {
        return lit.span();
    }
    let start = quote + 1 + range.start;
    token
        .subspan(start..start + range.len())
        .unwrap_or_else(|| lit.span())
}

/// `tokens` with every span set to `span`, so an expression built from them has that span.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

#[cfg(test)]
mod tests;

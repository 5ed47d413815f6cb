//! `#[derive(Decode)]`: the console's JSON reader for a wire type, from the same `#[serde(...)]`
//! attributes its `Deserialize` reads, so the two agree on every name and default.
//!
//! serde's derived readers are generic over the format and reach the input through visitors: in
//! WebAssembly each type's reader costs kilobytes. What is derived here for a struct is mostly
//! data: a table of its fields (key, `offset_of!`, the field type's shared read and drop, its
//! default), which one function, `ringside_shared::decode::decode_struct`, reads every struct by.
//!
//! Supported: structs with named fields, type parameters bound `Decode` (`rename`, `default`, `default = "path"`, `skip`,
//! `flatten`, `skip_serializing_if` (ignored: a reader takes what is there),
//! `deny_unknown_fields`) and enums of unit variants (`rename`, `rename_all`). Anything else
//! fails to compile, naming the attribute, rather than read differently from serde.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::{parse_macro_input, Data, DeriveInput, Error, Expr, Fields, Lit};

#[proc_macro_derive(Decode, attributes(serde))]
pub fn derive_decode(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input).unwrap_or_else(Error::into_compile_error).into()
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    if input.generics.lifetimes().next().is_some() || input.generics.const_params().next().is_some() {
        return Err(Error::new_spanned(&input.generics, "Decode: only type parameters are supported"));
    }
    let container = Container::read(&input.attrs)?;
    match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => expand_struct(input, &container, fields),
            _ => Err(Error::new_spanned(&input.ident, "Decode: only structs with named fields are supported")),
        },
        Data::Enum(data) => expand_enum(input, &container, data),
        Data::Union(_) => Err(Error::new_spanned(&input.ident, "Decode: unions are not supported")),
    }
}

/// The container's `#[serde(...)]` attributes that matter to a reader.
#[derive(Default)]
struct Container {
    rename_all: Option<String>,
    deny_unknown_fields: bool,
}

impl Container {
    fn read(attrs: &[syn::Attribute]) -> syn::Result<Container> {
        let mut container = Container::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename_all") {
                    container.rename_all = Some(lit_str(meta.value()?.parse()?)?);
                } else if meta.path.is_ident("deny_unknown_fields") {
                    container.deny_unknown_fields = true;
                } else {
                    return Err(meta.error("Decode: this container attribute is not supported"));
                }
                Ok(())
            })?;
        }
        Ok(container)
    }
}

/// A field's `#[serde(...)]` attributes.
#[derive(Default)]
struct FieldAttrs {
    rename: Option<String>,
    default: Option<Option<syn::Path>>,
    skip: bool,
    flatten: bool,
}

impl FieldAttrs {
    fn read(attrs: &[syn::Attribute]) -> syn::Result<FieldAttrs> {
        let mut field = FieldAttrs::default();
        for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    field.rename = Some(lit_str(meta.value()?.parse()?)?);
                } else if meta.path.is_ident("default") {
                    field.default = Some(if meta.input.peek(syn::Token![=]) {
                        Some(syn::parse_str::<syn::Path>(&lit_str(meta.value()?.parse()?)?)?)
                    } else {
                        None
                    });
                } else if meta.path.is_ident("skip") {
                    field.skip = true;
                } else if meta.path.is_ident("flatten") {
                    field.flatten = true;
                } else if meta.path.is_ident("skip_serializing_if") {
                    let _: Expr = meta.value()?.parse()?;
                } else {
                    return Err(meta.error("Decode: this field attribute is not supported"));
                }
                Ok(())
            })?;
        }
        Ok(field)
    }
}

/// A string literal, also where a `macro_rules!` passed it in (an invisible group).
fn lit_str(expr: Expr) -> syn::Result<String> {
    match expr {
        Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }) => Ok(s.value()),
        Expr::Group(group) => lit_str(*group.expr),
        Expr::Paren(paren) => lit_str(*paren.expr),
        other => Err(Error::new_spanned(other, "Decode: expected a string literal")),
    }
}

/// Whether a field's type is written `Option<...>` (serde reads such a field, absent, as `None`).
fn is_option(ty: &syn::Type) -> bool {
    match ty {
        syn::Type::Path(path) => path.qself.is_none() && path.path.segments.last().is_some_and(|s| s.ident == "Option"),
        syn::Type::Group(group) => is_option(&group.elem),
        _ => false,
    }
}

/// serde's `rename_all` applied to a variant's name.
fn rename_variant(name: &str, rule: Option<&str>, span: &syn::Ident) -> syn::Result<String> {
    let snake = || {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        }
        out
    };
    Ok(match rule {
        None => name.to_string(),
        Some("snake_case") => snake(),
        Some("kebab-case") => snake().replace('_', "-"),
        Some("lowercase") => name.to_lowercase(),
        Some(other) => {
            return Err(Error::new_spanned(span, format!("Decode: rename_all = {other:?} is not supported")))
        }
    })
}

fn expand_struct(input: &DeriveInput, container: &Container, fields: &syn::FieldsNamed) -> syn::Result<TokenStream> {
    let name = &input.ident;
    if container.rename_all.as_deref().is_some_and(|r| r != "snake_case") {
        return Err(Error::new_spanned(name, "Decode: rename_all on a struct is supported as snake_case only"));
    }
    // Each type parameter reads as itself: `T: Decode`, as serde bounds it `T: Deserialize`.
    let mut generics = input.generics.clone();
    let type_params: Vec<syn::Ident> = generics.type_params().map(|p| p.ident.clone()).collect();
    let clause = generics.make_where_clause();
    for param in type_params {
        clause.predicates.push(syn::parse_quote! { #param: ::ringside_shared::decode::Decode });
    }
    let (impl_generics, type_generics, where_clause) = generics.split_for_impl();
    let decode = quote! { ::ringside_shared::decode };
    let mut table = Vec::new();
    let mut defaults = Vec::new();
    for field in &fields.named {
        let attrs = FieldAttrs::read(&field.attrs)?;
        let ident = field.ident.as_ref().expect("named field");
        let ty = &field.ty;
        let offset = quote! { ::core::mem::offset_of!(Self, #ident) };
        let key = attrs.rename.unwrap_or_else(|| ident.to_string().trim_start_matches("r#").to_string());
        // As serde: an absent `Option` is `None`.
        let absent = match (&attrs.default, attrs.skip || is_option(ty)) {
            (Some(Some(path)), _) => {
                let writer = format_ident!("__decode_default_{}", ident);
                defaults.push(quote! {
                    #[doc(hidden)]
                    unsafe fn #writer(place: *mut u8) {
                        // SAFETY: `decode_struct` hands the field's own place.
                        unsafe { place.cast::<#ty>().write(#path()) }
                    }
                });
                quote! { ::core::option::Option::Some(Self::#writer) }
            }
            (Some(None), _) | (None, true) => {
                quote! { ::core::option::Option::Some(#decode::SlotOf::<#ty>::DEFAULT) }
            }
            (None, false) => quote! { ::core::option::Option::None },
        };
        let how = if attrs.skip {
            quote! { #decode::How::Skip }
        } else if attrs.flatten {
            if attrs.default.is_some() {
                return Err(Error::new_spanned(ident, "Decode: a flattened field takes no default"));
            }
            quote! { #decode::How::Flatten(<#ty as #decode::DecodeFields>::FIELDS) }
        } else {
            quote! { #decode::How::Read(&#decode::SlotOf::<#ty>::SLOT) }
        };
        let absent = if attrs.flatten {
            quote! { ::core::option::Option::None }
        } else {
            absent
        };
        table.push(quote! { #decode::Field { key: #key, offset: #offset, how: #how, absent: #absent } });
    }
    let deny = container.deny_unknown_fields;
    let inherent = (!defaults.is_empty()).then(|| {
        quote! {
            impl #impl_generics #name #type_generics #where_clause {
                #(#defaults)*
            }
        }
    });
    Ok(quote! {
        const _: () = {
            #inherent

            impl #impl_generics #decode::DecodeFields for #name #type_generics #where_clause {
                const FIELDS: &'static [#decode::Field] = &[#(#table),*];
            }

            impl #impl_generics #decode::Decode for #name #type_generics #where_clause {
                fn decode(r: &mut #decode::Reader<'_>) -> #decode::Result<Self> {
                    let mut value = ::core::mem::MaybeUninit::<Self>::uninit();
                    // SAFETY: `value` is a `Self`'s own place; on `Ok` it is written.
                    unsafe {
                        <Self as #decode::Decode>::decode_into(r, value.as_mut_ptr())?;
                        ::core::result::Result::Ok(value.assume_init())
                    }
                }

                unsafe fn decode_into(r: &mut #decode::Reader<'_>, place: *mut Self) -> #decode::Result<()> {
                    // SAFETY: `FIELDS` holds each field of `Self` once, with its offset, its
                    // type's slot and its default; on `Ok` all of them are written, on `Err`
                    // none is left behind. `place` is as the caller promises.
                    unsafe {
                        #decode::decode_struct(r, <Self as #decode::DecodeFields>::FIELDS, #deny, place.cast::<u8>())
                    }
                }
            }
        };
    })
}

fn expand_enum(input: &DeriveInput, container: &Container, data: &syn::DataEnum) -> syn::Result<TokenStream> {
    let name = &input.ident;
    if !input.generics.params.is_empty() {
        return Err(Error::new_spanned(&input.generics, "Decode: generic enums are not supported"));
    }
    let mut arms = Vec::new();
    let mut names = Vec::new();
    for variant in &data.variants {
        if !matches!(variant.fields, Fields::Unit) {
            return Err(Error::new_spanned(variant, "Decode: only enums of unit variants are supported"));
        }
        let attrs = FieldAttrs::read(&variant.attrs)?;
        if attrs.default.is_some() || attrs.skip || attrs.flatten {
            return Err(Error::new_spanned(variant, "Decode: a variant takes `rename` only"));
        }
        let ident = &variant.ident;
        let text = match attrs.rename {
            Some(text) => text,
            None => rename_variant(&ident.to_string(), container.rename_all.as_deref(), ident)?,
        };
        let index = names.len();
        names.push(text);
        arms.push(quote! { #index => #name::#ident });
    }
    Ok(quote! {
        impl ::ringside_shared::decode::Decode for #name {
            fn decode(r: &mut ::ringside_shared::decode::Reader<'_>) -> ::ringside_shared::decode::Result<Self> {
                const NAMES: &[&str] = &[#(#names),*];
                ::core::result::Result::Ok(match r.variant(NAMES)? {
                    #(#arms,)*
                    _ => ::core::unreachable!(),
                })
            }
        }
    })
}

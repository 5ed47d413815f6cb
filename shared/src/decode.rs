//! The console's JSON reader: the wire types read from the daemon's frames and answers in a
//! fraction of the WebAssembly serde's derived readers take.
//!
//! serde's `Deserialize` is generic over the format and reaches the input through visitors, so
//! each type's reader becomes kilobytes of code in the console. Here one concrete [`Reader`]
//! parses JSON, and each type's [`Decode`] — derived from the very `#[serde(...)]` attributes its
//! `Deserialize` reads (`ringside_shared_derive`) — matches keys to fields and calls it. The
//! daemon keeps serde; the console reads with this. `tests.rs` reads every pinned example frame
//! and answer both ways and requires the same value.
//!
//! What it accepts is JSON as serde_json accepts it for these types: unknown keys skipped (unless
//! the type denies them), missing `Option`s as `None`, missing `#[serde(default)]` fields as
//! their default, any other missing field an error; nesting deeper than 128 refused.
//!
//! ```
//! use ringside_shared::decode::{from_str, Decode};
//!
//! #[derive(Debug, PartialEq, Decode)]
//! struct Reading {
//!     #[serde(rename = "type")]
//!     kind: String,
//!     value: f64,
//!     #[serde(default)]
//!     tags: Vec<String>,
//!     unit: Option<String>,
//! }
//!
//! let read: Reading = from_str(r#"{"type": "temp", "value": 21.5, "other": [1, {"x": null}]}"#).unwrap();
//! assert_eq!(read, Reading { kind: "temp".into(), value: 21.5, tags: vec![], unit: None });
//! let error = from_str::<Reading>(r#"{"type": "temp"}"#).unwrap_err();
//! assert_eq!(error.to_string(), "missing field `value` at byte 16");
//! ```
//!
//! What serde would read some other way does not compile, rather than read differently:
//!
//! ```compile_fail
//! #[derive(ringside_shared::decode::Decode)]
//! #[serde(untagged)]
//! enum Either { A, B }
//! ```
//!
//! ```compile_fail
//! #[derive(ringside_shared::decode::Decode)]
//! struct Stamp {
//!     #[serde(with = "custom")]
//!     at: u64,
//! }
//! ```
//!
//! ```compile_fail
//! #[derive(ringside_shared::decode::Decode)]
//! enum Shape { Circle { r: f64 } }
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;

pub use ringside_shared_derive::Decode;

/// Why a text could not be read, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub message: String,
    /// Byte offset into the text.
    pub at: usize,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.at)
    }
}

impl std::error::Error for DecodeError {}

pub type Result<T> = std::result::Result<T, DecodeError>;

/// As serde_json: a text nested this deep is refused rather than allowed to exhaust the stack.
const MAX_DEPTH: u32 = 128;

/// A JSON text being read, value by value.
pub struct Reader<'a> {
    text: &'a str,
    at: usize,
    depth: u32,
}

/// A type read from JSON by [`Reader`].
pub trait Decode: Sized {
    fn decode(r: &mut Reader<'_>) -> Result<Self>;

    /// Reads `key`'s value into a struct's field being read (what derived structs call per key):
    /// one function per type, not a copy per field. A key given twice is refused, as serde does.
    #[inline(never)]
    fn decode_into(slot: &mut Option<Self>, r: &mut Reader<'_>, key: &str) -> Result<()> {
        if slot.is_some() {
            return Err(r.duplicate(key));
        }
        *slot = Some(Self::decode(r)?);
        Ok(())
    }
}

/// A struct read key by key, so that another can take its keys as its own (`#[serde(flatten)]`).
pub trait DecodeFields: Sized {
    /// The fields read so far.
    type Fields: Default;
    /// Reads `key`'s value into `fields` if it is one of this type's; false if not (unread).
    fn field(fields: &mut Self::Fields, r: &mut Reader<'_>, key: &str) -> Result<bool>;
    /// The value, from the fields read, with defaults for the absent ones.
    fn finish(fields: Self::Fields, r: &Reader<'_>) -> Result<Self>;
}

/// Reads the whole of `text` as a `T`.
pub fn from_str<T: Decode>(text: &str) -> Result<T> {
    let mut r = Reader::new(text);
    let value = T::decode(&mut r)?;
    r.end()?;
    Ok(value)
}

/// Where `key` is in `keys`.
fn key_index(keys: &[&str], key: &str) -> Option<usize> {
    keys.iter().position(|k| *k == key)
}

/// One JSON object as a `T`, key by key (what derived structs' `decode` calls).
pub fn decode_object<T: DecodeFields>(r: &mut Reader<'_>) -> Result<T> {
    let mut fields = T::Fields::default();
    r.object(&mut |r, key| T::field(&mut fields, r, key))?;
    T::finish(fields, r)
}

impl<'a> Reader<'a> {
    pub fn new(text: &'a str) -> Reader<'a> {
        Reader { text, at: 0, depth: 0 }
    }

    #[cold]
    #[inline(never)]
    pub fn error(&self, message: String) -> DecodeError {
        DecodeError { message, at: self.at }
    }

    #[cold]
    pub fn unknown_field(&self, key: &str) -> DecodeError {
        self.error(format!("unknown field `{key}`"))
    }

    /// A unit variant's name, as its index in `names`.
    pub fn variant(&mut self, names: &[&str]) -> Result<usize> {
        let text = self.string()?;
        key_index(names, &text).ok_or_else(|| self.error(format!("unknown variant `{text}`")))
    }

    #[cold]
    #[inline(never)]
    fn duplicate(&self, key: &str) -> DecodeError {
        self.error(format!("duplicate field `{key}`"))
    }

    #[cold]
    #[inline(never)]
    pub fn missing(&self, key: &str) -> DecodeError {
        self.error(format!("missing field `{key}`"))
    }

    #[cold]
    #[inline(never)]
    fn expected(&self, what: &str) -> DecodeError {
        match self.text[self.at..].chars().next() {
            None => self.error(format!("EOF while expecting {what}")),
            Some(c) => self.error(format!("invalid type: expected {what}, found `{c}`")),
        }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not white space, not consumed.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes().get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    /// Only white space is left.
    pub fn end(&mut self) -> Result<()> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.error("trailing characters".into())),
        }
    }

    fn literal(&mut self, word: &str) -> Result<()> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(self.error("expected a JSON value".into()))
        }
    }

    /// Consumes a `null` if one is next.
    pub fn null(&mut self) -> Result<bool> {
        if self.peek() == Some(b'n') {
            self.literal("null")?;
            return Ok(true);
        }
        Ok(false)
    }

    pub fn bool(&mut self) -> Result<bool> {
        match self.peek() {
            Some(b't') => self.literal("true").map(|()| true),
            Some(b'f') => self.literal("false").map(|()| false),
            _ => Err(self.expected("a boolean")),
        }
    }

    fn enter(&mut self, open: u8, what: &str) -> Result<()> {
        if self.peek() != Some(open) {
            return Err(self.expected(what));
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error("recursion limit exceeded".into()));
        }
        self.at += 1;
        Ok(())
    }

    /// After an object's or array's item: true at its end (consumed), false before the next.
    fn next_or_end(&mut self, close: u8) -> Result<bool> {
        match self.peek() {
            Some(b',') => {
                self.at += 1;
                Ok(false)
            }
            Some(b) if b == close => {
                self.at += 1;
                self.depth -= 1;
                Ok(true)
            }
            Some(_) => Err(self.error("expected `,` or the end".into())),
            None => Err(self.error("EOF while parsing".into())),
        }
    }

    /// Reads an object, handing each key to `field`, which reads its value and answers true, or
    /// answers false and the value is skipped.
    pub fn object(&mut self, field: &mut dyn FnMut(&mut Reader<'a>, &str) -> Result<bool>) -> Result<()> {
        self.enter(b'{', "an object")?;
        if self.peek() == Some(b'}') {
            self.at += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.expected("a key"));
            }
            let key = self.string()?;
            if self.peek() != Some(b':') {
                return Err(self.expected("`:`"));
            }
            self.at += 1;
            if !field(self, &key)? {
                self.skip()?;
            }
            if self.next_or_end(b'}')? {
                return Ok(());
            }
        }
    }

    /// Reads an array, `item` reading each value.
    pub fn array(&mut self, item: &mut dyn FnMut(&mut Reader<'a>) -> Result<()>) -> Result<()> {
        self.enter(b'[', "an array")?;
        if self.peek() == Some(b']') {
            self.at += 1;
            self.depth -= 1;
            return Ok(());
        }
        loop {
            item(self)?;
            if self.next_or_end(b']')? {
                return Ok(());
            }
        }
    }

    /// Skips one value of any kind.
    pub fn skip(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'{') => self.object(&mut |_, _| Ok(false)),
            Some(b'[') => self.array(&mut |r| r.skip()),
            Some(b'"') => self.string().map(drop),
            Some(b't' | b'f') => self.bool().map(drop),
            Some(b'n') => self.literal("null"),
            _ => self.number("a value").map(drop),
        }
    }

    /// A string, borrowed from the text where it holds no escape.
    pub fn string(&mut self) -> Result<Cow<'a, str>> {
        if self.peek() != Some(b'"') {
            return Err(self.expected("a string"));
        }
        self.at += 1;
        let text = self.text;
        let mut owned: Option<String> = None;
        let mut run = self.at;
        loop {
            let Some(&b) = text.as_bytes().get(self.at) else {
                return Err(self.error("EOF while parsing a string".into()));
            };
            match b {
                b'"' => {
                    let tail = &text[run..self.at];
                    self.at += 1;
                    return Ok(match owned {
                        None => Cow::Borrowed(tail),
                        Some(mut s) => {
                            s.push_str(tail);
                            Cow::Owned(s)
                        }
                    });
                }
                b'\\' => {
                    let before = &text[run..self.at];
                    self.at += 1;
                    let c = self.escape()?;
                    let s = owned.get_or_insert_with(String::new);
                    s.push_str(before);
                    s.push(c);
                    run = self.at;
                }
                0..=0x1f => return Err(self.error("control character found while parsing a string".into())),
                _ => self.at += 1,
            }
        }
    }

    /// The character an escape (after its `\`) stands for.
    fn escape(&mut self) -> Result<char> {
        let Some(&b) = self.bytes().get(self.at) else { return Err(self.error("EOF while parsing a string".into())) };
        self.at += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let first = self.hex4()?;
                let code = if (0xd800..0xdc00).contains(&first) {
                    if !self.text[self.at..].starts_with("\\u") {
                        return Err(self.error("lone leading surrogate in hex escape".into()));
                    }
                    self.at += 2;
                    let second = self.hex4()?;
                    if !(0xdc00..0xe000).contains(&second) {
                        return Err(self.error("lone leading surrogate in hex escape".into()));
                    }
                    0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00)
                } else {
                    first
                };
                char::from_u32(code).ok_or_else(|| self.error("invalid unicode code point".into()))?
            }
            _ => return Err(self.error("invalid escape".into())),
        })
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits =
            self.text.get(self.at..self.at + 4).ok_or_else(|| self.error("EOF while parsing a string".into()))?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.error("invalid escape".into()));
        }
        self.at += 4;
        u32::from_str_radix(digits, 16).map_err(|_| self.error("invalid escape".into()))
    }

    /// A number's text, checked against JSON's grammar, and whether it is an integer.
    fn number(&mut self, what: &str) -> Result<(&'a str, bool)> {
        let start = match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.at,
            _ => return Err(self.expected(what)),
        };
        let bytes = self.bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let mut at = start;
        if bytes[at] == b'-' {
            at += 1;
        }
        let int_start = at;
        if !digits(&mut at) || (bytes[int_start] == b'0' && at - int_start > 1) {
            self.at = at;
            return Err(self.error("invalid number".into()));
        }
        let mut integer = true;
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            integer = false;
            if !digits(&mut at) {
                self.at = at;
                return Err(self.error("invalid number".into()));
            }
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            integer = false;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                self.at = at;
                return Err(self.error("invalid number".into()));
            }
        }
        self.at = at;
        let text = &self.text[start..at];
        // serde_json reads `-0` as the float -0.0, which no integer field takes.
        Ok((text, integer && text != "-0"))
    }

    pub fn f64(&mut self) -> Result<f64> {
        let (text, _) = self.number("a number")?;
        match parse_f64(text) {
            Some(value) if value.is_finite() => Ok(value),
            _ => Err(self.error("number out of range".into())),
        }
    }

    pub fn u64(&mut self) -> Result<u64> {
        let (text, integer) = self.number("an unsigned integer")?;
        if !integer || text.starts_with('-') {
            return Err(self.error(format!("invalid type: expected an unsigned integer, found {text}")));
        }
        text.parse().map_err(|_| self.error(format!("invalid value: {text} is out of range")))
    }

    pub fn i64(&mut self) -> Result<i64> {
        let (text, integer) = self.number("an integer")?;
        if !integer {
            return Err(self.error(format!("invalid type: expected an integer, found {text}")));
        }
        text.parse().map_err(|_| self.error(format!("invalid value: {text} is out of range")))
    }
}

/// The value of a number's text, already checked against JSON's grammar, correctly rounded.
///
/// Most numbers on the wire have at most 15 significant digits and a small exponent: their
/// digits and the power of ten are then both exact in an `f64`, and one multiplication or
/// division rounds correctly (Clinger's fast path). The rest go to the platform's own reader:
/// the browser's `parseFloat` (correctly rounded up to 20 significant digits, and the daemon
/// writes at most 17), so the console carries no reader of its own and no 10 KB table of
/// powers of five; `str::parse` elsewhere.
fn parse_f64(text: &str) -> Option<f64> {
    const EXACT: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
        1e20, 1e21, 1e22,
    ];
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (digits, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()),
        None => (unsigned, Some(0)),
    };
    let mut mantissa: u64 = 0;
    let mut significant = 0;
    // An exponent beyond `i64` is left to the platform, which reads it as zero or infinity.
    let Some(mut scale) = exponent else {
        return parse_f64_slow(text);
    };
    let mut after_point = false;
    for b in digits.bytes() {
        if b == b'.' {
            after_point = true;
            continue;
        }
        if after_point {
            scale -= 1;
        }
        if mantissa > 0 || b != b'0' {
            significant += 1;
            if significant > 15 {
                return parse_f64_slow(text);
            }
            mantissa = mantissa * 10 + u64::from(b - b'0');
        }
    }
    let mut value = mantissa as f64;
    if scale.unsigned_abs() as usize >= EXACT.len() {
        if mantissa != 0 {
            return parse_f64_slow(text);
        }
    } else if scale < 0 {
        value /= EXACT[scale.unsigned_abs() as usize];
    } else {
        value *= EXACT[scale as usize];
    }
    Some(if negative { -value } else { value })
}

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
fn parse_f64_slow(text: &str) -> Option<f64> {
    Some(js_sys::parse_float(text)).filter(|v| !v.is_nan())
}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
fn parse_f64_slow(text: &str) -> Option<f64> {
    text.parse().ok()
}

impl Decode for bool {
    fn decode(r: &mut Reader<'_>) -> Result<bool> {
        r.bool()
    }
}

impl Decode for String {
    fn decode(r: &mut Reader<'_>) -> Result<String> {
        r.string().map(Cow::into_owned)
    }
}

impl Decode for f64 {
    fn decode(r: &mut Reader<'_>) -> Result<f64> {
        r.f64()
    }
}

impl Decode for f32 {
    fn decode(r: &mut Reader<'_>) -> Result<f32> {
        r.f64().map(|v| v as f32)
    }
}

macro_rules! integers {
    ($via:ident: $($t:ty),+) => {$(
        impl Decode for $t {
            fn decode(r: &mut Reader<'_>) -> Result<$t> {
                let value = r.$via()?;
                <$t>::try_from(value).map_err(|_| r.error(format!("invalid value: {value} is out of range")))
            }
        }
    )+};
}
integers!(u64: u8, u16, u32, u64, usize);
integers!(i64: i8, i16, i32, i64, isize);

impl<T: Decode> Decode for Option<T> {
    fn decode(r: &mut Reader<'_>) -> Result<Option<T>> {
        if r.null()? {
            return Ok(None);
        }
        T::decode(r).map(Some)
    }
}

impl<T: Decode> Decode for Vec<T> {
    fn decode(r: &mut Reader<'_>) -> Result<Vec<T>> {
        let mut items = Vec::new();
        r.array(&mut |r| {
            items.push(T::decode(r)?);
            Ok(())
        })?;
        Ok(items)
    }
}

impl<T: Decode> Decode for Box<T> {
    fn decode(r: &mut Reader<'_>) -> Result<Box<T>> {
        T::decode(r).map(Box::new)
    }
}

impl<V: Decode> Decode for BTreeMap<String, V> {
    fn decode(r: &mut Reader<'_>) -> Result<BTreeMap<String, V>> {
        let mut map = BTreeMap::new();
        r.object(&mut |r, key| {
            map.insert(key.to_owned(), V::decode(r)?);
            Ok(true)
        })?;
        Ok(map)
    }
}

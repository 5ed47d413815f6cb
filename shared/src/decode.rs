//! The console's JSON reader: the wire types read from the daemon's frames and answers in a
//! fraction of the WebAssembly serde's derived readers take.
//!
//! serde's `Deserialize` is generic over the format and reaches the input through visitors, so
//! each type's reader becomes kilobytes of code in the console. Here one concrete [`Reader`]
//! parses JSON, and each struct's [`Decode`] — derived from the very `#[serde(...)]` attributes
//! its `Deserialize` reads (`ringside_shared_derive`) — is a table of its fields that one
//! function, [`decode_struct`], reads every struct by, writing each field in place. The daemon
//! keeps serde; the console reads with this. `tests.rs` reads every pinned example frame and
//! answer both ways and requires the same value; this module's tests, run under Miri by
//! `cargo xtask miri`, end reads every way they can end and check that each field is written,
//! dropped or defaulted once.
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

    /// Reads a value into `place`: written on `Ok`; on `Err`, nothing there needs dropping.
    /// Structs and options read in place, so that the code reading a field, an option or a
    /// list element does not move the value again.
    ///
    /// # Safety
    /// `place` is valid for writes of `Self` and holds nothing that needs dropping.
    #[doc(hidden)]
    unsafe fn decode_into(r: &mut Reader<'_>, place: *mut Self) -> Result<()> {
        let value = Self::decode(r)?;
        // SAFETY: as the caller promises.
        unsafe { place.write(value) };
        Ok(())
    }
}

/// A struct read in place, field by field, from a table of its fields (what `#[derive(Decode)]`
/// writes for a struct). One function, [`decode_struct`], reads every struct: a struct's own code
/// is its table and a call, and each field type's code (read, drop, default) is shared by every
/// struct with a field of that type.
pub trait DecodeFields: Sized {
    /// Every field of the struct, once, in declaration order.
    const FIELDS: &'static [Field];
}

/// One field of a struct, as [`decode_struct`] reads it.
#[doc(hidden)]
pub struct Field {
    /// The key the field is read from (unused for `Skip` and `Flatten`).
    pub key: &'static str,
    /// Where the field lies in its struct (`offset_of!`).
    pub offset: usize,
    pub how: How,
    /// What an absent field becomes; `None`: it is required.
    pub absent: Option<unsafe fn(*mut u8)>,
}

/// How a field is read.
#[doc(hidden)]
pub enum How {
    /// From its key, by its type's [`Slot`].
    Read(&'static Slot),
    /// Never: it takes its default (`#[serde(skip)]`).
    Skip,
    /// Its struct's fields are read as the container's own (`#[serde(flatten)]`).
    Flatten(&'static [Field]),
}

/// How a value of one type is written into its place and dropped from it.
#[doc(hidden)]
pub struct Slot {
    read: unsafe fn(*mut u8, &mut Reader<'_>) -> Result<()>,
    drop: unsafe fn(*mut u8),
}

/// The [`Slot`] and default of a field type `T`.
#[doc(hidden)]
pub struct SlotOf<T>(std::marker::PhantomData<T>);

impl<T: Decode> SlotOf<T> {
    pub const SLOT: Slot = Slot { read: read_at::<T>, drop: drop_at::<T> };
}

impl<T: Default> SlotOf<T> {
    pub const DEFAULT: unsafe fn(*mut u8) = default_at::<T>;
}

/// # Safety
/// `place` is valid for writes of a `T`.
unsafe fn read_at<T: Decode>(place: *mut u8, r: &mut Reader<'_>) -> Result<()> {
    // SAFETY: as the caller promises.
    unsafe { T::decode_into(r, place.cast::<T>()) }
}

/// # Safety
/// `place` holds a `T`, which is not used again.
unsafe fn drop_at<T>(place: *mut u8) {
    // SAFETY: as the caller promises.
    unsafe { place.cast::<T>().drop_in_place() }
}

/// # Safety
/// `place` is valid for writes of a `T`.
unsafe fn default_at<T: Default>(place: *mut u8) {
    // SAFETY: as the caller promises.
    unsafe { place.cast::<T>().write(T::default()) }
}

/// The most fields (flattened ones counted) a struct may have.
const MAX_FIELDS: usize = 256;

/// Which fields have been read, by their index in declaration order (flattened structs' fields
/// in their place).
#[derive(Default)]
struct Seen([u64; MAX_FIELDS / 64]);

impl Seen {
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }
}

/// The field read from `key`: its index (in declaration order, flattened structs' fields in
/// their place), its offset from the outermost struct and its slot. `next` counts the fields
/// passed, `base` is the offset of `fields`' struct.
fn find<'f>(fields: &'f [Field], key: &str, next: &mut usize, base: usize) -> Option<(usize, usize, &'f Slot)> {
    for field in fields {
        match field.how {
            How::Read(slot) => {
                if field.key == key {
                    return Some((*next, base + field.offset, slot));
                }
                *next += 1;
            }
            How::Skip => *next += 1,
            How::Flatten(inner) => {
                if let Some(hit) = find(inner, key, next, base + field.offset) {
                    return Some(hit);
                }
            }
        }
    }
    None
}

/// The key of the first field neither read nor given a default, if any.
fn missing(fields: &'static [Field], seen: &Seen, next: &mut usize) -> Option<&'static str> {
    for field in fields {
        if let How::Flatten(inner) = field.how {
            if let Some(key) = missing(inner, seen, next) {
                return Some(key);
            }
            continue;
        }
        if !seen.has(*next) && field.absent.is_none() {
            return Some(field.key);
        }
        *next += 1;
    }
    None
}

/// Drops the fields read (`read`) or writes the absent ones' defaults (not `read`).
///
/// # Safety
/// As [`decode_struct`]'s, with every field in `seen` written and no other.
unsafe fn finish(fields: &[Field], seen: &Seen, read: bool, next: &mut usize, base: *mut u8) {
    for field in fields {
        // SAFETY: the field's place in the struct at `base`.
        let place = unsafe { base.add(field.offset) };
        match field.how {
            // SAFETY: as this function's.
            How::Flatten(inner) => unsafe { finish(inner, seen, read, next, place) },
            How::Read(slot) if read && seen.has(*next) => {
                // SAFETY: written, and dropped once.
                unsafe { (slot.drop)(place) }
            }
            _ if !read && !seen.has(*next) => {
                if let Some(default) = field.absent {
                    // SAFETY: the field's place, not written, of the default's type.
                    unsafe { default(place) }
                }
            }
            _ => {}
        }
        if !matches!(field.how, How::Flatten(_)) {
            *next += 1;
        }
    }
}

/// Reads a JSON object into the struct at `out`, field by field, as `fields` describes it: each
/// key to its field (skipped if unknown, or refused where `deny_unknown`), a key given twice
/// refused, absent fields given their default or, where they have none, refused.
///
/// # Safety
/// `fields` describes every field of the struct at `out` once, with its offset, its type's slot
/// and its default (what `#[derive(Decode)]` writes), at most [`MAX_FIELDS`] of them; `out` is
/// valid for writes of that struct. On `Ok` every field has been written; on `Err` none is left
/// written.
pub unsafe fn decode_struct(
    r: &mut Reader<'_>,
    fields: &'static [Field],
    deny_unknown: bool,
    out: *mut u8,
) -> Result<()> {
    let mut seen = Seen::default();
    // Writers (serde among them) give a struct's keys in the order of its fields, some left
    // out: in a struct with no flattened field, where a field's index is its place in `fields`,
    // the search starts after the field last read.
    let flat = !fields.iter().any(|f| matches!(f.how, How::Flatten(_)));
    let mut after = 0;
    let read = r.object(&mut |r, key| {
        let hit = if flat {
            (after..fields.len()).chain(0..after.min(fields.len())).find_map(|i| match fields[i].how {
                How::Read(slot) if fields[i].key == key => Some((i, fields[i].offset, slot)),
                _ => None,
            })
        } else {
            find(fields, key, &mut 0, 0)
        };
        let Some((index, offset, slot)) = hit else {
            return if deny_unknown { Err(r.unknown_field(key)) } else { Ok(false) };
        };
        after = index + 1;
        if seen.has(index) {
            return Err(r.duplicate(key));
        }
        // SAFETY: the field's place in `out`, not written yet (not seen), of the slot's type.
        unsafe { (slot.read)(out.add(offset), r)? };
        seen.set(index);
        Ok(true)
    });
    let failed = match read {
        Err(error) => Some(error),
        Ok(()) => missing(fields, &seen, &mut 0).map(|key| r.missing(key)),
    };
    // SAFETY: `seen` holds exactly the fields written.
    unsafe { finish(fields, &seen, failed.is_some(), &mut 0, out) };
    failed.map_or(Ok(()), Err)
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
            // Skipped, but still a number an `f64` holds: serde reads a flattened struct's
            // unknown keys as values, and refuses `6e536` there.
            _ => {
                let (text, _) = self.number("a value")?;
                self.finite(text).map(drop)
            }
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
        self.finite(text)
    }

    /// The value of a number's text (from [`Self::number`]), which an `f64` must hold.
    fn finite(&self, text: &str) -> Result<f64> {
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

    unsafe fn decode_into(r: &mut Reader<'_>, place: *mut Option<T>) -> Result<()> {
        if r.null()? {
            // SAFETY: as the caller promises.
            unsafe { place.write(None) };
            return Ok(());
        }
        let mut value = std::mem::MaybeUninit::<T>::uninit();
        // SAFETY: `value` is a `T`'s own place; on `Ok` it is written.
        unsafe {
            T::decode_into(r, value.as_mut_ptr())?;
            place.write(Some(value.assume_init()));
        }
        Ok(())
    }
}

impl<T: Decode> Decode for Vec<T> {
    fn decode(r: &mut Reader<'_>) -> Result<Vec<T>> {
        let layout = std::alloc::Layout::new::<T>();
        if layout.size() == 0 {
            let mut items = Vec::new();
            r.array(&mut |r| {
                items.push(T::decode(r)?);
                Ok(())
            })?;
            return Ok(items);
        }
        // SAFETY: `SLOT` reads and drops `T`s, `layout` is a `T`'s, not zero-sized; the parts
        // are an allocation of the global allocator for `capacity` `T`s (what `Vec` makes), the
        // first `length` of them written.
        unsafe {
            let (ptr, length, capacity) = read_seq(r, &SlotOf::<T>::SLOT, layout)?;
            Ok(Vec::from_raw_parts(ptr.cast::<T>(), length, capacity))
        }
    }
}

/// Values being read into one allocation, as a `Vec` holds them; dropped and freed unless the
/// read ends well.
struct Seq<'s> {
    ptr: *mut u8,
    length: usize,
    capacity: usize,
    item: std::alloc::Layout,
    slot: &'s Slot,
}

impl Seq<'_> {
    fn layout(&self, capacity: usize) -> Option<std::alloc::Layout> {
        let size = self.item.size().checked_mul(capacity)?;
        std::alloc::Layout::from_size_align(size, self.item.align()).ok()
    }

    /// Room for at least one more value: twice the capacity, 4 at first.
    fn grow(&mut self) -> bool {
        let capacity = if self.capacity == 0 { 4 } else { self.capacity.saturating_mul(2) };
        // `Layout` refuses a size beyond `isize::MAX`; nor is it zero (the item is not).
        let Some(layout) = self.layout(capacity) else { return false };
        let ptr = match self.layout(self.capacity) {
            // SAFETY: as above; the old block was allocated with `old`.
            Some(old) if self.capacity > 0 => unsafe { std::alloc::realloc(self.ptr, old, layout.size()) },
            // SAFETY: as above.
            _ => unsafe { std::alloc::alloc(layout) },
        };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        self.ptr = ptr;
        self.capacity = capacity;
        true
    }
}

impl Drop for Seq<'_> {
    fn drop(&mut self) {
        for i in 0..self.length {
            // SAFETY: the first `length` values are written and dropped only here.
            unsafe { (self.slot.drop)(self.ptr.add(i * self.item.size())) };
        }
        if let Some(layout) = self.layout(self.capacity).filter(|_| self.capacity > 0) {
            // SAFETY: allocated with this layout by `grow`.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// Reads an array of values of one type (`slot`, of layout `item`) into one allocation, and
/// returns its pointer, length and capacity: the code of every `Vec<T>`'s read, written once.
///
/// # Safety
/// `slot` reads and drops values of layout `item`, which is not zero-sized.
unsafe fn read_seq(r: &mut Reader<'_>, slot: &Slot, item: std::alloc::Layout) -> Result<(*mut u8, usize, usize)> {
    let dangling = std::ptr::without_provenance_mut::<u8>(item.align());
    let mut seq = Seq { ptr: dangling, length: 0, capacity: 0, item, slot };
    r.array(&mut |r| {
        if seq.length == seq.capacity && !seq.grow() {
            return Err(r.error("array too large".to_string()));
        }
        // SAFETY: below the capacity, a value's own place.
        unsafe { (slot.read)(seq.ptr.add(seq.length * item.size()), r)? };
        seq.length += 1;
        Ok(())
    })?;
    let parts = (seq.ptr, seq.length, seq.capacity);
    std::mem::forget(seq);
    Ok(parts)
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

/// Structs read in place: every way a read ends, with values that own memory, so that Miri
/// (`cargo xtask miri`) sees any field dropped twice, left behind or read before it is written.
#[cfg(test)]
mod tests {
    use super::{from_str, Decode};

    fn fallback() -> Vec<String> {
        vec!["fallback".into()]
    }

    #[derive(Debug, PartialEq, Decode)]
    struct Inner {
        name: String,
        #[serde(default)]
        tags: Vec<String>,
    }

    #[derive(Debug, PartialEq, Decode)]
    struct Outer {
        id: Box<u64>,
        #[serde(flatten)]
        inner: Inner,
        note: Option<String>,
        #[serde(skip)]
        cache: Vec<u8>,
        #[serde(default = "fallback")]
        extra: Vec<String>,
        #[serde(rename = "type")]
        kind: String,
    }

    #[derive(Debug, Decode)]
    struct Nothing {}

    #[derive(Debug, Decode)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        #[allow(dead_code)]
        a: String,
    }

    #[test]
    fn decode_struct_writes_every_field_once() {
        let read: Outer = from_str(r#"{"type":"t","id":1,"tags":["x"],"name":"n","ignored":[{"a":1}]}"#).unwrap();
        let expected = Outer {
            id: Box::new(1),
            inner: Inner { name: "n".into(), tags: vec!["x".into()] },
            note: None,
            cache: vec![],
            extra: fallback(),
            kind: "t".into(),
        };
        assert_eq!(read, expected);
        let full: Outer =
            from_str(r#"{"id":1,"name":"n","tags":[],"note":"o","extra":["e"],"type":"t","cache":"read as unknown"}"#)
                .unwrap();
        assert_eq!((full.note.as_deref(), full.extra, full.cache), (Some("o"), vec!["e".to_string()], vec![]));
    }

    #[test]
    fn decode_struct_drops_what_it_read_when_a_read_fails() {
        let cases = [
            // A required field missing, after fields that own memory (flattened ones too).
            (r#"{"id":1,"tags":["x","y"],"note":"o","extra":["e"]}"#, "missing field `name`"),
            (r#"{"id":1,"name":"n","tags":["x"]}"#, "missing field `type`"),
            // A key twice: the first value is dropped with the rest, not overwritten.
            (r#"{"id":1,"name":"n","name":"m","type":"t"}"#, "duplicate field `name`"),
            (r#"{"id":1,"id":2}"#, "duplicate field `id`"),
            // A value of the wrong type halfway through, inside a field and after it.
            (r#"{"id":1,"tags":["x",1],"name":"n","type":"t"}"#, "invalid type"),
            (r#"{"note":"o","id":1,"name":7}"#, "invalid type"),
            // The text ends inside the object.
            (r#"{"id":1,"name":"n","type":"t","extra":["e""#, "EOF"),
            (r#"{"id":1,"name":"n","type":"t""#, "EOF"),
        ];
        for (text, why) in cases {
            let error = from_str::<Outer>(text).unwrap_err().to_string();
            assert!(error.contains(why), "{text}: {error}");
        }
        let error = from_str::<Strict>(r#"{"a":"kept","b":1}"#).unwrap_err().to_string();
        assert!(error.contains("unknown field `b`"), "{error}");
        // In a struct without flattened fields the search starts after the field last read: a
        // key out of order, or given again, is still found, and refused the second time.
        let inner: Inner = from_str(r#"{"tags":["t"],"name":"n"}"#).unwrap();
        assert_eq!(inner, Inner { name: "n".into(), tags: vec!["t".into()] });
        for text in [r#"{"name":"n","tags":["t"],"name":"m"}"#, r#"{"tags":["t"],"name":"n","tags":[]}"#] {
            let error = from_str::<Inner>(text).unwrap_err().to_string();
            assert!(error.contains("duplicate field"), "{text}: {error}");
        }
        let error = from_str::<Strict>(r#"{"a":"x","a":"y"}"#).unwrap_err().to_string();
        assert!(error.contains("duplicate field `a`"), "{error}");
        let nested = from_str::<Vec<Outer>>(r#"[{"id":1,"name":"n","type":"t"},{"id":2,"name":"m"}]"#);
        assert!(nested.unwrap_err().to_string().contains("missing field `type`"));
    }

    /// Lists are read into one allocation that grows (4, 8, 16 values), options in place.
    #[test]
    fn lists_and_options_read_in_place() {
        let item = |i: usize| format!(r#"{{"name":"n{i}","tags":["t{i}"]}}"#);
        for count in [0, 1, 4, 5, 9, 17] {
            let text = format!("[{}]", (0..count).map(item).collect::<Vec<_>>().join(","));
            let read: Vec<Inner> = from_str(&text).unwrap();
            let expected: Vec<Inner> =
                (0..count).map(|i| Inner { name: format!("n{i}"), tags: vec![format!("t{i}")] }).collect();
            assert_eq!(read, expected);
            // Every value read so far is dropped, and the block freed, when one fails: in the
            // first block, after a growth, and at the end.
            for bad in [0, count / 2, count] {
                let mut items: Vec<String> = (0..count).map(item).collect();
                items.insert(bad, r#"{"tags":["no name"]}"#.into());
                let error = from_str::<Vec<Inner>>(&format!("[{}]", items.join(","))).unwrap_err();
                assert!(error.to_string().contains("missing field `name`"), "{error}");
            }
        }
        let nested: Vec<Vec<Option<String>>> = from_str(r#"[[null,"a"],[],["b","c","d","e","f"]]"#).unwrap();
        assert_eq!(nested[2].len(), 5);
        assert_eq!(nested[0], vec![None, Some("a".to_string())]);
        assert!(from_str::<Vec<Vec<String>>>(r#"[["a","b"],["c",1]]"#).is_err());
        let some: Option<Inner> = from_str(r#"{"name":"n"}"#).unwrap();
        assert_eq!(some, Some(Inner { name: "n".into(), tags: vec![] }));
        assert_eq!(from_str::<Option<Inner>>("null").unwrap(), None);
        assert!(from_str::<Option<Inner>>(r#"{"tags":["x"]}"#).is_err());
        // Values of no size take the plain path.
        assert_eq!(from_str::<Vec<Nothing>>("[{},{},{}]").unwrap().len(), 3);
        assert!(from_str::<Vec<Nothing>>("[{},1]").is_err());
    }

    /// An unknown key's number is skipped only where an `f64` holds it, as serde does for a
    /// flattened struct's keys (the `console_decode` fuzz target found `6e536` read by one and
    /// refused by the other).
    #[test]
    fn skipped_numbers_must_be_in_range() {
        for fine in ["1e308", "-1.5e-400", "0e99999999999999999999", "123456789012345678901234567890"] {
            let text = format!(r#"{{"name":"n","other":{fine}}}"#);
            assert!(from_str::<Inner>(&text).is_ok(), "{text}");
        }
        for out in ["6e536", "-1e309", &"9".repeat(400)] {
            let text = format!(r#"{{"name":"n","other":[{out}]}}"#);
            let error = from_str::<Inner>(&text).unwrap_err();
            assert!(error.to_string().contains("number out of range"), "{text}: {error}");
        }
    }
}

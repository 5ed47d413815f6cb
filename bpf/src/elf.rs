//! Just enough ELF to find where a shared library's functions start in its file (from its
//! `.dynsym`), so uprobes are attached only to entry points that exist — a library version
//! without one is normal.
//!
//! The file is someone else's: it is read with positioned reads of the headers and the two
//! tables needed, each bounded ([`MAX_SECTION_HEADER_BYTES`], [`MAX_SYMBOL_BYTES`]), never in
//! full, and every offset is checked against the file's size.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The section header table read at most (65535 headers of 64 bytes would be 4 MiB; real
/// libraries have a few dozen).
pub const MAX_SECTION_HEADER_BYTES: u64 = 256 * 1024;
/// The dynamic symbol tables and their string tables of one file together, at most (libcuda's
/// are well under 1 MiB, NCCL's 2.32 about 100 KiB).
pub const MAX_SYMBOL_BYTES: u64 = 16 * 1024 * 1024;

const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const SHDR_SIZE: u64 = 64;
const SYM_SIZE: u64 = 24;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Where positioned reads come from: a file, or bytes in a test.
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let src = start.checked_add(buf.len()).and_then(|end| self.get(start..end));
        buf.copy_from_slice(src.ok_or(std::io::ErrorKind::UnexpectedEof)?);
        Ok(())
    }
}

/// Why a file's functions could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not a 64-bit little-endian ELF file")]
    NotElf,
    #[error("malformed ELF: {0}")]
    Malformed(&'static str),
    #[error("its {what} take {bytes} bytes, over the {limit} read at most")]
    TooLarge { what: &'static str, bytes: u64, limit: u64 },
    #[error("cannot read it: {0}")]
    Io(String),
}

/// Reads `len` bytes at `offset`, after checking the range lies within `size` bytes.
fn read(
    file: &(impl ReadAt + ?Sized),
    size: u64,
    offset: u64,
    len: u64,
    what: &'static str,
) -> Result<Vec<u8>, ElfError> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(ElfError::Malformed(what));
    }
    let mut buf = vec![0; len as usize];
    file.read_exact_at(&mut buf, offset).map_err(|e| ElfError::Io(e.to_string()))?;
    Ok(buf)
}

/// The file offsets of the functions named in `wanted` that the library (of `size` bytes)
/// defines in its dynamic symbol table, in the order of `wanted`; names it does not define are
/// left out. The offset is what a uprobe is attached at: the symbol's address translated
/// through the section that holds it.
pub fn function_offsets(
    file: &(impl ReadAt + ?Sized),
    size: u64,
    wanted: &[&str],
) -> Result<Vec<(usize, u64)>, ElfError> {
    let mut found: Vec<(usize, u64)> = Vec::new();
    for_each_function(file, size, |name, at| {
        if let Some(index) = wanted.iter().position(|w| w.as_bytes() == name) {
            if !found.iter().any(|(i, _)| *i == index) {
                found.push((index, at));
            }
        }
    })?;
    found.sort_unstable();
    Ok(found)
}

/// Every function the library defines in its dynamic symbol table (its exports), with its file
/// offset, in table order; names that are not UTF-8 are left out.
pub fn exported_functions(file: &(impl ReadAt + ?Sized), size: u64) -> Result<Vec<(String, u64)>, ElfError> {
    let mut all = Vec::new();
    for_each_function(file, size, |name, at| {
        if let Ok(name) = std::str::from_utf8(name) {
            all.push((name.to_string(), at));
        }
    })?;
    Ok(all)
}

/// Calls `f` with the name and file offset of every defined function of the dynamic symbol
/// tables. The tables are read within one budget for the whole file ([`MAX_SYMBOL_BYTES`]):
/// a file that declares many of them cannot make the reader take more.
fn for_each_function(file: &(impl ReadAt + ?Sized), size: u64, mut f: impl FnMut(&[u8], u64)) -> Result<(), ElfError> {
    let header = read(file, size, 0, 64, "header").map_err(|_| ElfError::NotElf)?;
    if header.get(0..4) != Some(b"\x7fELF") || header[4] != 2 || header[5] != 1 {
        return Err(ElfError::NotElf);
    }
    let shoff = u64_at(&header, 0x28).ok_or(ElfError::NotElf)?;
    let shentsize = u64::from(u16_at(&header, 0x3a).ok_or(ElfError::NotElf)?);
    let shnum = u64::from(u16_at(&header, 0x3c).ok_or(ElfError::NotElf)?);
    if shentsize < SHDR_SIZE {
        return Err(ElfError::Malformed("section header size"));
    }
    let table_bytes = shentsize * shnum;
    if table_bytes > MAX_SECTION_HEADER_BYTES {
        return Err(ElfError::TooLarge {
            what: "section headers",
            bytes: table_bytes,
            limit: MAX_SECTION_HEADER_BYTES,
        });
    }
    let sections = read(file, size, shoff, table_bytes, "section header table")?;
    let section = |i: u64| -> Option<&[u8]> {
        let at = usize::try_from(i.checked_mul(shentsize)?).ok()?;
        sections.get(at..at + SHDR_SIZE as usize)
    };
    // (address, offset) of section `i`, to translate symbol addresses.
    let placement = |i: u64| section(i).and_then(|s| Some((u64_at(s, 0x10)?, u64_at(s, 0x18)?)));
    // What the symbol tables read so far took, against the one budget of the file.
    let mut spent: u64 = 0;
    for i in 0..shnum {
        let Some(dynsym) = section(i) else { break };
        if u32_at(dynsym, 4) != Some(SHT_DYNSYM) {
            continue;
        }
        let bad = ElfError::Malformed("dynamic symbol table");
        let (offset, bytes) = (u64_at(dynsym, 0x18).ok_or(bad.clone())?, u64_at(dynsym, 0x20).ok_or(bad.clone())?);
        let entsize = u64_at(dynsym, 0x38).ok_or(bad.clone())?.max(SYM_SIZE);
        let strtab = section(u64::from(u32_at(dynsym, 0x28).ok_or(bad.clone())?)).ok_or(bad)?;
        let str_bad = ElfError::Malformed("dynamic string table");
        let (str_offset, str_bytes) =
            (u64_at(strtab, 0x18).ok_or(str_bad.clone())?, u64_at(strtab, 0x20).ok_or(str_bad)?);
        spent = spent.saturating_add(bytes).saturating_add(str_bytes);
        if spent > MAX_SYMBOL_BYTES {
            return Err(ElfError::TooLarge { what: "symbol tables", bytes: spent, limit: MAX_SYMBOL_BYTES });
        }
        let symbols = read(file, size, offset, bytes, "dynamic symbol table")?;
        let names = read(file, size, str_offset, str_bytes, "dynamic string table")?;
        for sym in symbols.chunks_exact(entsize as usize) {
            let kind = sym[4] & 0xf;
            let shndx = u16_at(sym, 6).unwrap_or(0);
            if shndx == 0 || !(kind == STT_FUNC || kind == STT_GNU_IFUNC) {
                continue;
            }
            let Some(start) = u32_at(sym, 0).map(|n| n as usize) else { continue };
            let Some(name) = names.get(start..).and_then(|rest| rest.split(|c| *c == 0).next()) else { continue };
            let Some((address, section_offset)) = placement(u64::from(shndx)) else { continue };
            let Some(value) = u64_at(sym, 8) else { continue };
            // Address -> file offset, through the section holding the function.
            let Some(at) = value.checked_sub(address).and_then(|d| d.checked_add(section_offset)) else { continue };
            if at < size {
                f(name, at);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn libc_path() -> &'static str {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a libc.so.6")
    }

    #[test]
    fn finds_the_functions_of_a_real_library_by_positioned_reads() {
        // The C library every test machine has; it defines `read` and `write`, and not this.
        let file = File::open(libc_path()).unwrap();
        let size = file.metadata().unwrap().len();
        let found = function_offsets(&file, size, &["cuLaunchKernel", "read", "write"]).expect("an ELF64 library");
        let indices: Vec<usize> = found.iter().map(|(i, _)| *i).collect();
        assert_eq!(indices, vec![1, 2]);
        // The entry of `read` holds code: endbr64 (f3 0f 1e fa) on CET builds, else anything but
        // zeros; and it is the same offset whether read from the file or from its bytes.
        let bytes = std::fs::read(libc_path()).unwrap();
        assert_eq!(function_offsets(bytes.as_slice(), size, &["read", "write"]).unwrap()[0].1, found[0].1);
        let at = found[0].1 as usize;
        assert_ne!(&bytes[at..at + 4], &[0, 0, 0, 0]);
        assert!(found.iter().all(|(_, at)| *at < size));
    }

    /// A crafted file: a valid ELF header and `sections` section headers, every one a dynamic
    /// symbol table of `table_bytes` (all at the same place) with a one-byte string table: a
    /// file's worth of claims that would cost `sections` x `table_bytes` to read in full.
    struct Crafted {
        header: Vec<u8>,
        size: u64,
        read: std::cell::Cell<u64>,
    }

    impl Crafted {
        fn new(sections: u16, table_bytes: u64) -> Crafted {
            let shoff: u64 = 4096;
            let data_at = shoff + u64::from(sections) * SHDR_SIZE;
            let mut header = vec![0u8; data_at as usize];
            header[..4].copy_from_slice(b"\x7fELF");
            header[4] = 2;
            header[5] = 1;
            header[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
            header[0x3a..0x3c].copy_from_slice(&(SHDR_SIZE as u16).to_le_bytes());
            header[0x3c..0x3e].copy_from_slice(&sections.to_le_bytes());
            for i in 0..u64::from(sections) {
                let at = (shoff + i * SHDR_SIZE) as usize;
                let sh = &mut header[at..at + SHDR_SIZE as usize];
                sh[4..8].copy_from_slice(&SHT_DYNSYM.to_le_bytes());
                sh[0x18..0x20].copy_from_slice(&data_at.to_le_bytes());
                sh[0x20..0x28].copy_from_slice(&table_bytes.to_le_bytes());
                // Its string table: section 0 (a one-byte table at the same place).
                sh[0x28..0x2c].copy_from_slice(&0u32.to_le_bytes());
                sh[0x38..0x40].copy_from_slice(&SYM_SIZE.to_le_bytes());
            }
            // Section 0 doubles as the string table: one byte at data_at.
            let first = shoff as usize;
            header[first + 0x20..first + 0x28].copy_from_slice(&table_bytes.to_le_bytes());
            Crafted { header, size: data_at + table_bytes + 1, read: std::cell::Cell::new(0) }
        }
    }

    impl ReadAt for Crafted {
        fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            if offset + buf.len() as u64 > self.size {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.read.set(self.read.get() + buf.len() as u64);
            // Sparse past the headers: zeros.
            for (i, b) in buf.iter_mut().enumerate() {
                *b = self.header.get(offset as usize + i).copied().unwrap_or(0);
            }
            Ok(())
        }
    }

    #[test]
    fn a_file_declaring_thousands_of_symbol_tables_is_refused_within_one_budget() {
        // 4,096 tables of 4 MiB each: 16 GiB of claims, each table alone within the budget.
        let crafted = Crafted::new(4096, 4 << 20);
        let refused = function_offsets(&crafted, crafted.size, &["cuLaunchKernel"]);
        assert!(matches!(refused, Err(ElfError::TooLarge { what: "symbol tables", .. })), "{refused:?}");
        let read = crafted.read.get();
        assert!(read <= MAX_SYMBOL_BYTES + 4096 + 4096 * SHDR_SIZE, "read {read} bytes");
    }

    #[test]
    fn refuses_what_is_not_a_sound_elf_file() {
        assert_eq!(function_offsets(b"not an elf file".as_slice(), 15, &["read"]), Err(ElfError::NotElf));
        let bytes = std::fs::read(libc_path()).unwrap();
        // Truncated: the section headers lie past the end.
        let cut = &bytes[..4096];
        assert!(matches!(function_offsets(cut, 4096, &["read"]), Err(ElfError::Malformed(_))));
        // A header claiming 65535 sections of 64 KiB each is refused before reading them.
        let mut huge = bytes[..64].to_vec();
        huge[0x3a..0x3c].copy_from_slice(&u16::MAX.to_le_bytes());
        huge[0x3c..0x3e].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(function_offsets(huge.as_slice(), 64, &["read"]), Err(ElfError::TooLarge { .. })));
        // Zeros (a sparse file) are not ELF.
        assert_eq!(function_offsets(vec![0u8; 4096].as_slice(), 4096, &["read"]), Err(ElfError::NotElf));
    }
}

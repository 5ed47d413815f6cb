//! Just enough ELF to list the functions a shared library defines (its `.dynsym`), so uprobes
//! are attached only to entry points that exist — a library version without one is normal.

use std::collections::HashSet;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

/// Names of the functions a 64-bit little-endian ELF file defines in its dynamic symbol
/// table; `None` if it is not such a file.
pub fn defined_functions(bytes: &[u8]) -> Option<HashSet<String>> {
    if bytes.get(0..4)? != b"\x7fELF" || *bytes.get(4)? != 2 || *bytes.get(5)? != 1 {
        return None;
    }
    let shoff = u64_at(bytes, 0x28)? as usize;
    let shentsize = u16_at(bytes, 0x3a)? as usize;
    let shnum = u16_at(bytes, 0x3c)? as usize;
    let section = |i: usize| shoff.checked_add(i.checked_mul(shentsize)?);
    let mut names = HashSet::new();
    for i in 0..shnum {
        let header = section(i)?;
        if u32_at(bytes, header + 4)? != SHT_DYNSYM {
            continue;
        }
        let (offset, size) = (u64_at(bytes, header + 0x18)? as usize, u64_at(bytes, header + 0x20)? as usize);
        let entsize = (u64_at(bytes, header + 0x38)? as usize).max(24);
        let strtab = section(u32_at(bytes, header + 0x28)? as usize)?;
        let str_offset = u64_at(bytes, strtab + 0x18)? as usize;
        for sym in (offset..offset.checked_add(size)?).step_by(entsize) {
            let name = u32_at(bytes, sym)? as usize;
            let kind = *bytes.get(sym + 4)? & 0xf;
            let shndx = u16_at(bytes, sym + 6)?;
            if shndx == 0 || !(kind == STT_FUNC || kind == STT_GNU_IFUNC) {
                continue;
            }
            let start = str_offset.checked_add(name)?;
            let end = start + bytes.get(start..)?.iter().position(|c| *c == 0)?;
            names.insert(String::from_utf8_lossy(&bytes[start..end]).into_owned());
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_functions_of_a_real_library() {
        // The C library every test machine has; it defines `read` and `write`, and not this.
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .expect("a libc.so.6");
        let names = defined_functions(&libc).expect("an ELF64 library");
        assert!(names.contains("read") && names.contains("write"));
        assert!(!names.contains("cuLaunchKernel"));
        assert_eq!(defined_functions(b"not an elf file"), None);
        assert_eq!(defined_functions(&libc[..100]), None, "truncated");
    }
}

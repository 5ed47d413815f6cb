//! Where in a function a uprobe costs least.
//!
//! A uprobe replaces an instruction with a breakpoint. When it fires, the kernel must still
//! run the instruction it replaced: a few kinds it *emulates* (pushes, jumps, calls, conditional
//! jumps, nops), every other it copies to a page of the process and *single-steps*, which takes
//! a second trap (#DB). On the VMs measured here that second trap makes a probe hit cost about
//! 15 µs instead of about 1 µs. NVIDIA's driver begins every API function with a RIP-relative
//! compare (`cmpl $imm, disp(%rip)`, a check of its tools callbacks) followed by a conditional
//! jump: single-stepped at the entry, emulated ten bytes on.
//!
//! So the probe goes on the first instruction the kernel emulates, when only instructions that
//! cannot branch and do not touch the stack pointer come before it: every call passes through
//! it, with the registers and the stack as they were at the entry — the return address still on
//! top, which a return probe relies on. Anything not recognised keeps the probe at the entry.
//! The bytes are someone else's: at most [`PROLOGUE_BYTES`] are looked at, and nothing in them
//! is trusted beyond choosing between offsets inside that window.

/// Bytes of a function's start that are looked at.
pub const PROLOGUE_BYTES: usize = 32;

/// How many bytes into `code` (a function's first bytes) a probe may go on an instruction the
/// kernel emulates; 0 (the entry) when that is the first instruction or nothing fits.
pub fn emulated_offset(code: &[u8]) -> usize {
    if !cfg!(target_arch = "x86_64") {
        return 0;
    }
    let code = &code[..code.len().min(PROLOGUE_BYTES)];
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        if emulated(rest) {
            return at;
        }
        match neutral_length(rest) {
            Some(n) => at += n,
            None => return 0,
        }
    }
    0
}

/// Whether the instruction at the start of `code` is one the kernel's x86 uprobes emulate
/// (`branch_setup_xol_ops`, `push_setup_xol_ops`), not prefixed.
fn emulated(code: &[u8]) -> bool {
    match code {
        // jcc rel8, jmp rel8, jmp rel32, call rel32, nop, push r64
        [0x70..=0x7f, _, ..] | [0xeb, _, ..] | [0xe9 | 0xe8, _, _, _, _, ..] | [0x90, ..] | [0x50..=0x57, ..] => true,
        // jcc rel32; push r8..r15
        [0x0f, 0x80..=0x8f, _, _, _, _, ..] | [0x41, 0x50..=0x57, ..] => true,
        _ => false,
    }
}

/// The length of the instruction at the start of `code` if it cannot branch and leaves the
/// stack pointer and the stack alone (so a probe after it sees what one at the entry would):
/// `endbr64`; a compare or test of RIP-relative memory with an immediate; a load of a register
/// other than `rsp` from RIP-relative memory. `None` for anything else.
fn neutral_length(code: &[u8]) -> Option<usize> {
    // RIP-relative memory operand: mod 00, r/m 101.
    let rip_relative = |modrm: u8| modrm & 0xc7 == 0x05;
    let (rex, body) = match code {
        [rex @ 0x40..=0x4f, body @ ..] => (Some(*rex), body),
        _ => (None, code),
    };
    let length = match body {
        [0xf3, 0x0f, 0x1e, 0xfa, ..] if rex.is_none() => 4,
        // cmp r/m32, imm32 (/7) and test r/m32, imm32 (/0)
        [0x81, modrm, ..] if rip_relative(*modrm) && (modrm >> 3) & 7 == 7 => 10,
        [0xf7, modrm, ..] if rip_relative(*modrm) && (modrm >> 3) & 7 == 0 => 10,
        // cmp r/m32, imm8 (/7); cmp r/m8, imm8 (/7); test r/m8, imm8 (/0)
        [0x83 | 0x80, modrm, ..] if rip_relative(*modrm) && (modrm >> 3) & 7 == 7 => 7,
        [0xf6, modrm, ..] if rip_relative(*modrm) && (modrm >> 3) & 7 == 0 => 7,
        // mov r, [rip + disp32], except into rsp
        [0x8b, modrm, ..] if rip_relative(*modrm) => {
            let rsp = (modrm >> 3) & 7 == 4 && rex.is_none_or(|r| r & 0x04 == 0);
            if rsp {
                return None;
            }
            6
        }
        _ => return None,
    };
    let length = length + usize::from(rex.is_some());
    (length <= code.len()).then_some(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_drivers_entry_stub_is_probed_on_its_conditional_jump() {
        // cuLaunchKernel in libcuda.so.535.261.03:
        //   cmpl $0x321cba00, 0x18d933e(%rip); je +0xc; ...
        let stub = [0x81, 0x3d, 0x3e, 0x93, 0x8d, 0x01, 0x00, 0xba, 0x1c, 0x32, 0x74, 0x0c, 0x48, 0x8b];
        assert_eq!(emulated_offset(&stub), 10);
        // With endbr64 in front (a CET build), and as a 64-bit compare.
        let cet = [&[0xf3, 0x0f, 0x1e, 0xfa][..], &stub].concat();
        assert_eq!(emulated_offset(&cet), 14);
        let wide = [0x48, 0x81, 0x3d, 0, 0, 0, 0, 1, 2, 3, 4, 0x0f, 0x84, 0, 0, 0, 0];
        assert_eq!(emulated_offset(&wide), 11);
        // A load then a push (NCCL-like prologues start with the push: the entry itself).
        assert_eq!(emulated_offset(&[0x48, 0x8b, 0x05, 1, 2, 3, 4, 0x41, 0x57]), 7);
        assert_eq!(emulated_offset(&[0x55, 0x48, 0x89, 0xe5]), 0);
        assert_eq!(emulated_offset(&[0x41, 0x56, 0x41, 0x55]), 0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn anything_unrecognised_or_touching_the_stack_keeps_the_probe_at_the_entry() {
        // xor eax, eax; ret: single-stepped, but nothing after it is safe to use.
        assert_eq!(emulated_offset(&[0x31, 0xc0, 0xc3]), 0);
        // sub rsp, 8 before the push: the return address is no longer on top.
        assert_eq!(emulated_offset(&[0x48, 0x83, 0xec, 0x08, 0x55]), 0);
        // mov rsp, [rip+x]
        assert_eq!(emulated_offset(&[0x48, 0x8b, 0x25, 0, 0, 0, 0, 0x55]), 0);
        // A compare cut short by the end of the window, and an empty one.
        assert_eq!(emulated_offset(&[0x81, 0x3d, 0, 0, 0]), 0);
        assert_eq!(emulated_offset(&[]), 0);
        // Thirty-two bytes of neutral loads and no emulated instruction: the entry.
        let loads: Vec<u8> = std::iter::repeat_n([0x8b, 0x05, 0, 0, 0, 0], 8).flatten().collect();
        assert_eq!(emulated_offset(&loads), 0);
    }

    #[test]
    fn never_panics_and_never_leaves_the_window() {
        // Every byte pattern of a few lengths, and a pseudo-random sweep.
        for a in 0..=255u8 {
            for b in [0u8, 0x05, 0x3d, 0x74, 0xff] {
                for len in 0..4 {
                    let code = [a, b, 0x74, 0x00];
                    assert!(emulated_offset(&code[..len]) < PROLOGUE_BYTES);
                }
            }
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let code: Vec<u8> = (0..40)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            let at = emulated_offset(&code);
            assert!(at < PROLOGUE_BYTES && (at == 0 || emulated(&code[at..])));
        }
    }
}

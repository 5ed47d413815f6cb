//! How the probe's programs are attached: the attach modes tried in order, the tracepoints of
//! each, and what each program's state is.

use std::path::Path;

/// How the scheduling programs are attached, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    TpBtf,
    RawTp,
    Tracepoint,
}

impl AttachMode {
    pub const ALL: [AttachMode; 3] = [AttachMode::TpBtf, AttachMode::RawTp, AttachMode::Tracepoint];

    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "tp_btf",
            AttachMode::RawTp => "raw_tp",
            AttachMode::Tracepoint => "tracepoint",
        }
    }

    pub(crate) fn prefix(self) -> &'static str {
        match self {
            AttachMode::TpBtf => "btf_",
            AttachMode::RawTp => "raw_",
            AttachMode::Tracepoint => "tp_",
        }
    }
}

/// The state of one program (or one attach point of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramStatus {
    /// What it observes, e.g. `sched_switch`, `sys_enter_read`.
    pub name: String,
    /// How it is (or was to be) attached.
    pub attach: Attachment,
    pub state: AttachState,
    pub detail: Option<String>,
}

/// How a program is (or was to be) attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// A scheduling or syscall program, in one of the attach modes.
    Mode(AttachMode),
    /// Syscall waits classified from the task's registers at the context switch.
    SchedSwitch,
    /// CUDA/NCCL entry points.
    Uprobe,
}

/// Whether a program (or one attach point of it) is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachState {
    Attached,
    /// A better attach mode was refused; `detail` says why.
    Fallback,
    Failed,
}

/// The scheduling and lifecycle programs of one attach mode: (tracepoint, program suffix).
pub(crate) const SCHED_POINTS: [(&str, &str); 6] = [
    ("sched_wakeup", "wakeup"),
    ("sched_wakeup_new", "wakeup_new"),
    ("sched_switch", "switch"),
    ("sched_process_fork", "fork"),
    ("sched_process_exec", "exec"),
    ("sched_process_exit", "exit"),
];

/// Syscall tracepoints of tracked processes: (tracepoint, program).
pub(crate) const SYSCALL_POINTS: [(&str, &str); 16] = [
    ("sys_enter_futex", "sys_enter_futex"),
    ("sys_enter_read", "sys_enter_read"),
    ("sys_enter_pread64", "sys_enter_read"),
    ("sys_enter_readv", "sys_enter_read"),
    ("sys_enter_preadv", "sys_enter_read"),
    ("sys_enter_recvfrom", "sys_enter_read"),
    ("sys_enter_recvmsg", "sys_enter_read"),
    ("sys_enter_ioctl", "sys_enter_ioctl"),
    ("sys_exit_futex", "sys_exit_any"),
    ("sys_exit_read", "sys_exit_any"),
    ("sys_exit_pread64", "sys_exit_any"),
    ("sys_exit_readv", "sys_exit_any"),
    ("sys_exit_preadv", "sys_exit_any"),
    ("sys_exit_recvfrom", "sys_exit_any"),
    ("sys_exit_recvmsg", "sys_exit_any"),
    ("sys_exit_ioctl", "sys_exit_any"),
];

/// Where libbpf finds tracepoint ids; mounted if missing (root only), since the classic and
/// syscall tracepoints need it.
pub(crate) fn ensure_tracefs() {
    let mounted = |p: &str| Path::new(p).join("events").is_dir();
    if mounted("/sys/kernel/tracing") || mounted("/sys/kernel/debug/tracing") {
        return;
    }
    let _ = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .stderr(std::process::Stdio::null())
        .status();
}

// SPDX-License-Identifier: GPL-2.0
/* Ringside's observation programs.
 *
 * - Scheduling, every thread: on-CPU time, run-queue wait, voluntary/involuntary switches and
 *   block-I/O wait, in the `threads` hash keyed by thread id. An exiting thread's entry is
 *   deleted, so a reused id never inherits stale counters.
 * - Process lifecycle: fork/exec/exit records on the `events` ring buffer. A process forked by
 *   a tracked (ML) process is tracked from birth (DataLoader workers are child processes).
 * - Tracked processes only (user space writes their tgids into `tracked`): time in futex waits,
 *   reads and bytes read, ioctls on NVIDIA device files (syscall tracepoints); calls and time in
 *   CUDA synchronizes, blocking copies and NCCL calls (uprobes, attached once per library file
 *   for every process, or per process where the kernel has no uprobe_multi; the attach cookie
 *   says which kind of call), kernel launches only when asked; at every timer tick, whether the
 *   thread on the CPU runs the GPU driver's code (`gpu_text`); run-queue latency samples on
 *   `runq_events`.
 *
 * The scheduling and lifecycle programs come in three variants, tp_btf, raw_tp and tracepoint;
 * user space loads the first that the kernel accepts. The bodies are shared and take ids. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_THREADS 65536
#define MAX_ML_THREADS 16384
#define MAX_TRACKED 4096
/* TASK_RUNNING: a task switched out in this state was preempted. */
#define TASK_RUNNING_STATE 0
/* Set early in do_exit(), before sched_process_exit. */
#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000

/* futex(2) commands that wait. */
#define FUTEX_CMD_MASK 0x7f
#define FUTEX_WAIT 0
#define FUTEX_LOCK_PI 6
#define FUTEX_WAIT_BITSET 9
#define FUTEX_WAIT_REQUEUE_PI 11
#define FUTEX_LOCK_PI2 13

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, struct thread_stats);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ML_THREADS);
	__type(key, __u32);
	__type(value, struct ml_thread_stats);
} ml_threads SEC(".maps");

/* tgid -> tgid of the ML process whose job it belongs to (itself, or an ancestor). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TRACKED);
	__type(key, __u32);
	__type(value, __u32);
} tracked SEC(".maps");

/* tgid -> the executable mappings of the CUDA driver and runtime in that process. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TRACKED);
	__type(key, __u32);
	__type(value, struct gpu_text);
} gpu_text SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} runq_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LOST_KINDS);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Set by user space: count syscalls with the syscall tracepoints rather than at blocking. */
bool syscall_tracepoints = false;
/* Bumped whenever `tracked` changes (by user space, and by the fork and exit programs), so a
 * thread's cached `tracked` flag is re-read only then, not on every context switch. */
__u32 tracked_generation = 1;

/* Make the skeleton generate the Rust types of the values that cross. */
struct thread_stats thread_stats_layout = {};
struct ml_thread_stats ml_thread_stats_layout = {};
struct event event_layout = {};
struct gpu_text gpu_text_layout = {};

static __always_inline void count_lost(__u32 kind)
{
	__u64 *n = bpf_map_lookup_elem(&lost, &kind);
	if (n)
		*n += 1;
}

static __always_inline struct thread_stats *stats_of(__u32 tid, __u32 tgid, bool exiting)
{
	struct thread_stats *s = bpf_map_lookup_elem(&threads, &tid);
	if (s)
		return s;
	/* An exiting thread can still be woken and scheduled after sched_process_exit deleted its
	 * entry: never create one for it, or it would outlive the thread. */
	if (exiting)
		return 0;
	struct thread_stats zero = {};
	zero.tgid = tgid;
	if (bpf_map_update_elem(&threads, &tid, &zero, BPF_NOEXIST) && bpf_map_lookup_elem(&threads, &tid) == 0)
		count_lost(LOST_THREADS);
	return bpf_map_lookup_elem(&threads, &tid);
}

/* One syscall of `kind` that took `spent` ns. */
static __always_inline void add_wait(struct ml_thread_stats *m, __u32 kind, __u64 spent)
{
	switch (kind) {
	case SYS_KIND_FUTEX:
		m->futex_wait_ns += spent;
		m->futex_waits += 1;
		break;
	case SYS_KIND_READ:
		m->read_ns += spent;
		m->reads += 1;
		break;
	case SYS_KIND_NV_IOCTL:
		m->nv_ioctl_ns += spent;
		m->nv_ioctls += 1;
		break;
	}
}

static __always_inline bool is_tracked(struct thread_stats *s)
{
	__u32 generation = tracked_generation;
	if (s->tracked_gen != generation) {
		__u32 tgid = s->tgid;
		s->tracked = tgid && bpf_map_lookup_elem(&tracked, &tgid) != 0;
		s->tracked_gen = generation;
	}
	return s->tracked;
}

static __always_inline void end_blocking(struct thread_stats *s, __u32 tid, __u64 now)
{
	if (!s->blocked_kind)
		return;
	struct ml_thread_stats *m = bpf_map_lookup_elem(&ml_threads, &tid);
	if (m && s->blocked_since_ns)
		add_wait(m, s->blocked_kind, now - s->blocked_since_ns);
	s->blocked_kind = SYS_KIND_NONE;
	s->blocked_since_ns = 0;
}

static __always_inline struct ml_thread_stats *ml_entry(__u32 tid, __u32 tgid);

static __always_inline void on_runnable(__u32 tid, __u32 tgid, bool exiting)
{
	struct thread_stats *s = stats_of(tid, tgid, exiting);
	if (!s)
		return;
	__u64 now = bpf_ktime_get_ns();
	end_blocking(s, tid, now);
	if (s->io_since_ns) {
		s->iowait_ns += now - s->io_since_ns;
		s->io_since_ns = 0;
	}
	if (!s->runnable_since_ns)
		s->runnable_since_ns = now;
}

static __always_inline void emit_runq(__u32 tid, __u32 tgid, __u64 now, __u64 wait)
{
	struct event *e = bpf_ringbuf_reserve(&runq_events, sizeof(*e), 0);
	if (!e) {
		count_lost(LOST_RUNQ);
		return;
	}
	e->kind = EVENT_RUNQ;
	e->tid = tid;
	e->tgid = tgid;
	e->parent_tgid = 0;
	e->at_ns = now;
	e->value = wait;
	e->comm[0] = 0;
	bpf_ringbuf_submit(e, 0);
}


/* Syscall numbers of the waits that are classified. */
#if defined(__TARGET_ARCH_x86)
#define NR_READ 0
#define NR_POLL 7
#define NR_IOCTL 16
#define NR_PREAD64 17
#define NR_READV 19
#define NR_SELECT 23
#define NR_RECVFROM 45
#define NR_RECVMSG 47
#define NR_FUTEX 202
#define NR_EPOLL_WAIT 232
#define NR_PSELECT6 270
#define NR_PPOLL 271
#define NR_EPOLL_PWAIT 281
#define NR_PREADV 295
#define NR_RECVMMSG 299
#define NR_PREADV2 327
#define NR_EPOLL_PWAIT2 441
#define NR_FUTEX_WAITV 449
#define SYSCALL_NR(regs) BPF_CORE_READ(regs, orig_ax)
#define SYSCALL_ARG0(regs) BPF_CORE_READ(regs, di)
#define SYSCALL_ARG1(regs) BPF_CORE_READ(regs, si)
#define CAN_CLASSIFY 1
#elif defined(__TARGET_ARCH_arm64)
#define NR_READ 63
#define NR_POLL -1
#define NR_IOCTL 29
#define NR_PREAD64 67
#define NR_READV 65
#define NR_SELECT -1
#define NR_RECVFROM 207
#define NR_RECVMSG 212
#define NR_FUTEX 98
#define NR_EPOLL_WAIT -1
#define NR_PSELECT6 72
#define NR_PPOLL 73
#define NR_EPOLL_PWAIT 22
#define NR_PREADV 69
#define NR_RECVMMSG 243
#define NR_PREADV2 286
#define NR_EPOLL_PWAIT2 441
#define NR_FUTEX_WAITV 449
#define SYSCALL_NR(regs) BPF_CORE_READ(regs, syscallno)
#define SYSCALL_ARG0(regs) BPF_CORE_READ(regs, orig_x0)
#define SYSCALL_ARG1(regs) BPF_CORE_READ(regs, regs[1])
#define CAN_CLASSIFY 1
#else
#define CAN_CLASSIFY 0
#endif

static bool is_nvidia_file_of(struct task_struct *task, __u64 fd);

/* tgid 0 for a side whose process is not known here (tracepoint variant): an existing entry
 * keeps its own, a new one gets it when the thread next runs as `current`. */

static __always_inline __u32 btf_blocking_kind(struct task_struct *prev);

/* classify: find the syscall a tracked `prev_task` blocks in (tp_btf only: it reads the task's
 * registers). A constant at each call site, so other variants never contain that code. */
/* runtime: the variant reads the tasks' own runtime (se.sum_exec_runtime: tp_btf, raw_tp) into
 * prev_runtime and next_runtime; a constant at each call site. */
static __always_inline void on_switch(__u32 prev_tid, __u32 prev_tgid, long prev_state, bool prev_iowait,
				      struct task_struct *prev_task, bool classify, __u32 next_tid, __u32 next_tgid,
				      bool next_exiting, bool runtime, __u64 prev_runtime, __u64 next_runtime)
{
	__u64 now = bpf_ktime_get_ns();
	/* Thread 0 is each CPU's idle task: not a thread of anyone's. */
	if (prev_tid) {
		/* Look up only: an exiting thread's last switch-out must not re-create the entry
		 * that sched_process_exit deleted. */
		struct thread_stats *p = bpf_map_lookup_elem(&threads, &prev_tid);
		if (p) {
			if (!p->tgid)
				p->tgid = prev_tgid;
			if (runtime && p->runtime_known && prev_runtime >= p->runtime_base) {
				/* The kernel's own count: a switch event missed, or seen out of order
				 * across CPUs (a switch-in traced before the switch-out that preceded
				 * it, measured here under contention), cannot lose an interval. */
				p->on_cpu_ns = prev_runtime - p->runtime_base;
			} else {
				if (p->last_in_ns)
					p->on_cpu_ns += now - p->last_in_ns;
				if (runtime && prev_runtime >= p->on_cpu_ns) {
					p->runtime_base = prev_runtime - p->on_cpu_ns;
					p->runtime_known = 1;
				}
			}
			p->last_in_ns = 0;
			if (prev_state == TASK_RUNNING_STATE) {
				p->involuntary += 1;
				p->runnable_since_ns = now;
			} else {
				p->voluntary += 1;
				p->runnable_since_ns = 0;
				if (prev_iowait)
					p->io_since_ns = now;
				if (classify && !syscall_tracepoints && is_tracked(p)) {
					__u32 kind = btf_blocking_kind(prev_task);
					if (kind && ml_entry(prev_tid, p->tgid)) {
						p->blocked_kind = kind;
						p->blocked_since_ns = now;
					}
				}
			}
		}
	}
	if (next_tid) {
		struct thread_stats *n = stats_of(next_tid, next_tgid, next_exiting);
		if (n) {
			end_blocking(n, next_tid, now);
			if (n->io_since_ns) {
				n->iowait_ns += now - n->io_since_ns;
				n->io_since_ns = 0;
			}
			if (n->runnable_since_ns) {
				__u64 wait = now - n->runnable_since_ns;
				n->runq_wait_ns += wait;
				if (is_tracked(n))
					emit_runq(next_tid, n->tgid, now, wait);
			}
			n->runnable_since_ns = 0;
			n->last_in_ns = now;
			if (runtime && !n->runtime_known && next_runtime >= n->on_cpu_ns) {
				n->runtime_base = next_runtime - n->on_cpu_ns;
				n->runtime_known = 1;
			}
		}
	}
}

static __always_inline void emit(enum event_kind kind, __u32 tid, __u32 tgid, __u32 parent_tgid, __u64 value, const char *comm)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_lost(LOST_EVENTS);
		return;
	}
	e->kind = kind;
	e->tid = tid;
	e->tgid = tgid;
	e->parent_tgid = parent_tgid;
	e->at_ns = bpf_ktime_get_ns();
	e->value = value;
	bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), comm);
	bpf_ringbuf_submit(e, 0);
}

/* child_tgid 0: not known here (tracepoint variant); user space resolves it and tracks it. */
static __always_inline void on_fork(__u32 parent_tgid, __u32 child_tid, __u32 child_tgid, const char *comm)
{
	/* A new thread of an existing process is not a fork of a process. */
	if (child_tgid && child_tid != child_tgid)
		return;
	__u64 inherited = 0;
	__u32 *root = child_tgid ? bpf_map_lookup_elem(&tracked, &parent_tgid) : 0;
	if (root) {
		__u32 job = *root;
		bpf_map_update_elem(&tracked, &child_tgid, &job, BPF_ANY);
		__sync_fetch_and_add(&tracked_generation, 1);
		inherited = 1;
	}
	emit(EVENT_FORK, child_tid, child_tgid, parent_tgid, inherited, comm);
}

/* `status`: (1 << 32) | the task's exit code (as wait() reports it: a signal in the low 7
 * bits, else the code << 8), or 0 where the attach mode cannot read it. */
static __always_inline void on_exit(__u32 tid, __u32 tgid, const char *comm, __u64 status)
{
	bpf_map_delete_elem(&threads, &tid);
	bpf_map_delete_elem(&ml_threads, &tid);
	if (tid == tgid) {
		bpf_map_delete_elem(&gpu_text, &tgid);
		if (bpf_map_delete_elem(&tracked, &tgid) == 0)
			__sync_fetch_and_add(&tracked_generation, 1);
		emit(EVENT_EXIT, tid, tgid, 0, status, comm);
	}
}

/* ---- tp_btf and raw_tp: task pointers, read with CO-RE ---- */

/* tp_btf reads task fields directly (BTF-typed pointers: plain loads); raw_tp goes through
 * bpf_probe_read_kernel. */
#define READ_btf(t, field) ((t)->field)
#define READ_raw(t, field) BPF_CORE_READ(t, field)
#define IOWAIT_btf(t) BPF_CORE_READ_BITFIELD(t, in_iowait)
#define IOWAIT_raw(t) BPF_CORE_READ_BITFIELD_PROBED(t, in_iowait)
#define CLASSIFY_btf CAN_CLASSIFY
#define CLASSIFY_raw 0
#define TASK_TID(t) ((__u32)BPF_CORE_READ(t, pid))
#define TASK_TGID(t) ((__u32)BPF_CORE_READ(t, tgid))
#define TASK_EXITING(t) ((BPF_CORE_READ(t, flags) & PF_EXITING) != 0)

#define SCHED_PROGRAMS(kind, prefix)                                                               \
	SEC(kind "/sched_wakeup")                                                                  \
	int BPF_PROG(prefix##_wakeup, struct task_struct *task)                                    \
	{                                                                                          \
		on_runnable(READ_##prefix(task, pid), READ_##prefix(task, tgid),                   \
			    (READ_##prefix(task, flags) & PF_EXITING) != 0);                       \
		return 0;                                                                          \
	}                                                                                          \
	SEC(kind "/sched_wakeup_new")                                                              \
	int BPF_PROG(prefix##_wakeup_new, struct task_struct *task)                                \
	{                                                                                          \
		on_runnable(READ_##prefix(task, pid), READ_##prefix(task, tgid),                   \
			    (READ_##prefix(task, flags) & PF_EXITING) != 0);                       \
		return 0;                                                                          \
	}                                                                                          \
	SEC(kind "/sched_switch")                                                                  \
	int BPF_PROG(prefix##_switch, bool preempt, struct task_struct *prev, struct task_struct *next, \
		     unsigned int prev_state)                                                      \
	{                                                                                          \
		bool iowait = prev_state != TASK_RUNNING_STATE && IOWAIT_##prefix(prev);           \
		on_switch(READ_##prefix(prev, pid), READ_##prefix(prev, tgid), prev_state, iowait, prev, \
			  CLASSIFY_##prefix, READ_##prefix(next, pid), READ_##prefix(next, tgid),   \
			  (READ_##prefix(next, flags) & PF_EXITING) != 0, true,                    \
			  READ_##prefix(prev, se.sum_exec_runtime),                                \
			  READ_##prefix(next, se.sum_exec_runtime));                               \
		return 0;                                                                          \
	}                                                                                          \
	SEC(kind "/sched_process_fork")                                                            \
	int BPF_PROG(prefix##_fork, struct task_struct *parent, struct task_struct *child)         \
	{                                                                                          \
		on_fork(TASK_TGID(parent), TASK_TID(child), TASK_TGID(child), child->comm);        \
		return 0;                                                                          \
	}                                                                                          \
	SEC(kind "/sched_process_exec")                                                            \
	int BPF_PROG(prefix##_exec, struct task_struct *task)                                      \
	{                                                                                          \
		emit(EVENT_EXEC, TASK_TID(task), TASK_TGID(task), 0, 0, task->comm);               \
		return 0;                                                                          \
	}                                                                                          \
	SEC(kind "/sched_process_exit")                                                            \
	int BPF_PROG(prefix##_exit, struct task_struct *task)                                      \
	{                                                                                          \
		on_exit(TASK_TID(task), TASK_TGID(task), task->comm,                               \
			(1ULL << 32) | (__u32)READ_##prefix(task, exit_code));                     \
		return 0;                                                                          \
	}

/* What a tracked task switched out blocked in, from its user registers (tp_btf: the kernel's
 * BTF-typed pt_regs). */
static __always_inline __u32 btf_blocking_kind(struct task_struct *prev)
{
#if CAN_CLASSIFY
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	if (!regs)
		return SYS_KIND_NONE;
	long nr = SYSCALL_NR(regs);
	if (nr == NR_FUTEX) {
		__u32 cmd = SYSCALL_ARG1(regs) & FUTEX_CMD_MASK;
		bool waits = cmd == FUTEX_WAIT || cmd == FUTEX_WAIT_BITSET || cmd == FUTEX_LOCK_PI ||
			     cmd == FUTEX_LOCK_PI2 || cmd == FUTEX_WAIT_REQUEUE_PI;
		return waits ? SYS_KIND_FUTEX : SYS_KIND_NONE;
	}
	if (nr == NR_FUTEX_WAITV)
		return SYS_KIND_FUTEX;
	if (nr == NR_READ || nr == NR_PREAD64 || nr == NR_READV || nr == NR_PREADV || nr == NR_PREADV2 ||
	    nr == NR_RECVFROM || nr == NR_RECVMSG || nr == NR_RECVMMSG || nr == NR_POLL || nr == NR_PPOLL ||
	    nr == NR_SELECT || nr == NR_PSELECT6 || nr == NR_EPOLL_WAIT || nr == NR_EPOLL_PWAIT ||
	    nr == NR_EPOLL_PWAIT2)
		return SYS_KIND_READ;
	if (nr == NR_IOCTL && is_nvidia_file_of(prev, SYSCALL_ARG0(regs)))
		return SYS_KIND_NV_IOCTL;
#endif
	return SYS_KIND_NONE;
}

SCHED_PROGRAMS("tp_btf", btf)
SCHED_PROGRAMS("raw_tp", raw)

/* ---- tracepoint: the trace event records, which carry ids, not task pointers ---- */

static __always_inline __u32 current_tgid(void)
{
	return bpf_get_current_pid_tgid() >> 32;
}

SEC("tracepoint/sched/sched_wakeup")
int tp_wakeup(struct trace_event_raw_sched_wakeup_template *ctx)
{
	on_runnable(ctx->pid, 0, false);
	return 0;
}

SEC("tracepoint/sched/sched_wakeup_new")
int tp_wakeup_new(struct trace_event_raw_sched_wakeup_template *ctx)
{
	on_runnable(ctx->pid, 0, false);
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int tp_switch(struct trace_event_raw_sched_switch *ctx)
{
	/* `current` is still the previous task here. */
	struct task_struct *prev = (struct task_struct *)bpf_get_current_task();
	bool iowait = BPF_CORE_READ_BITFIELD_PROBED(prev, in_iowait);
	on_switch(ctx->prev_pid, current_tgid(), ctx->prev_state, iowait, prev, false, ctx->next_pid, 0, false, false, 0, 0);
	return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int tp_fork(struct trace_event_raw_sched_process_fork *ctx)
{
	/* The record does not say whether the child is a new thread or a new process, nor its
	 * tgid: user space reads it from /proc and drops threads. */
	char comm[16];
	bpf_get_current_comm(comm, sizeof(comm));
	on_fork(current_tgid(), ctx->child_pid, 0, comm);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int tp_exec(struct trace_event_raw_sched_process_exec *ctx)
{
	char comm[16];
	bpf_get_current_comm(comm, sizeof(comm));
	__u64 id = bpf_get_current_pid_tgid();
	emit(EVENT_EXEC, (__u32)id, id >> 32, 0, 0, comm);
	return 0;
}

SEC("tracepoint/sched/sched_process_exit")
int tp_exit(void *ctx)
{
	char comm[16];
	bpf_get_current_comm(comm, sizeof(comm));
	__u64 id = bpf_get_current_pid_tgid();
	on_exit((__u32)id, id >> 32, comm, 0);
	return 0;
}

/* ---- tracked processes: syscalls ---- */

/* The call counters of a thread of a tracked process, created on first use; 0 otherwise. */
static __always_inline struct ml_thread_stats *ml_entry(__u32 tid, __u32 tgid)
{
	if (!bpf_map_lookup_elem(&tracked, &tgid))
		return 0;
	struct ml_thread_stats *s = bpf_map_lookup_elem(&ml_threads, &tid);
	if (s)
		return s;
	struct ml_thread_stats zero = {};
	zero.tgid = tgid;
	bpf_map_update_elem(&ml_threads, &tid, &zero, BPF_NOEXIST);
	s = bpf_map_lookup_elem(&ml_threads, &tid);
	if (!s)
		count_lost(LOST_ML_THREADS);
	return s;
}

static __always_inline struct ml_thread_stats *ml_current(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	return ml_entry((__u32)id, id >> 32);
}

static __always_inline void sys_begin(__u32 kind)
{
	struct ml_thread_stats *s = ml_current();
	if (s) {
		s->sys_kind = kind;
		s->sys_since_ns = bpf_ktime_get_ns();
	}
}

SEC("tracepoint/syscalls/sys_enter_futex")
int sys_enter_futex(struct trace_event_raw_sys_enter *ctx)
{
	__u32 cmd = ctx->args[1] & FUTEX_CMD_MASK;
	if (cmd == FUTEX_WAIT || cmd == FUTEX_WAIT_BITSET || cmd == FUTEX_LOCK_PI || cmd == FUTEX_LOCK_PI2 ||
	    cmd == FUTEX_WAIT_REQUEUE_PI)
		sys_begin(SYS_KIND_FUTEX);
	return 0;
}

/* Attached to sys_enter_{read,pread64,readv,preadv,recvfrom,recvmsg}. */
SEC("tracepoint/syscalls/sys_enter_read")
int sys_enter_read(void *ctx)
{
	sys_begin(SYS_KIND_READ);
	return 0;
}

/* Is `fd` of `task` an NVIDIA device file (/dev/nvidia0, nvidiactl, nvidia-uvm)? */
static bool is_nvidia_file_of(struct task_struct *task, __u64 fd)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return false;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *file = 0;
	if (bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return false;
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	umode_t mode = BPF_CORE_READ(inode, i_mode);
	if ((mode & 00170000) != 0020000) /* S_IFCHR */
		return false;
	const unsigned char *name = BPF_CORE_READ(file, f_path.dentry, d_name.name);
	char prefix[7] = {};
	if (bpf_probe_read_kernel(prefix, 6, name))
		return false;
	return prefix[0] == 'n' && prefix[1] == 'v' && prefix[2] == 'i' && prefix[3] == 'd' && prefix[4] == 'i' &&
	       prefix[5] == 'a';
}

SEC("tracepoint/syscalls/sys_enter_ioctl")
int sys_enter_ioctl(struct trace_event_raw_sys_enter *ctx)
{
	__u32 tgid = current_tgid();
	if (!bpf_map_lookup_elem(&tracked, &tgid))
		return 0;
	if (is_nvidia_file_of((struct task_struct *)bpf_get_current_task(), ctx->args[0]))
		sys_begin(SYS_KIND_NV_IOCTL);
	return 0;
}

/* Attached to the sys_exit_* of every syscall above. */
SEC("tracepoint/syscalls/sys_exit_futex")
int sys_exit_any(struct trace_event_raw_sys_exit *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ml_thread_stats *s = bpf_map_lookup_elem(&ml_threads, &tid);
	if (!s || !s->sys_since_ns)
		return 0;
	add_wait(s, s->sys_kind, bpf_ktime_get_ns() - s->sys_since_ns);
	if (s->sys_kind == SYS_KIND_READ && ctx->ret > 0)
		s->read_bytes += ctx->ret;
	s->sys_since_ns = 0;
	s->sys_kind = SYS_KIND_NONE;
	return 0;
}

/* ---- tracked processes: CUDA and NCCL calls (uprobes; the cookie is the call kind) ---- */

/* CPU time a thread spends after its collective returned and before it waits for the GPU: past
 * this it has enqueued other work since (launches are not probed by default), and the wait is
 * for that work as much as for the collective. A launch costs a few µs of CPU. */
#define ENQUEUE_WORK_NS 200000ULL

/* The thread's on-CPU time now: as of its last switch-out, plus the run in progress. */
static __always_inline __u64 cpu_time_now(__u32 tid, __u64 now)
{
	struct thread_stats *t = bpf_map_lookup_elem(&threads, &tid);
	if (!t)
		return 0;
	return t->on_cpu_ns + (t->last_in_ns && now > t->last_in_ns ? now - t->last_in_ns : 0);
}

static __always_inline int call_entry(struct pt_regs *ctx, __u32 kind)
{
	struct ml_thread_stats *s = ml_current();
	if (!s)
		return 0;
	__u64 sp = PT_REGS_SP(ctx);
	/* Stacks grow down: a call nested in the outer one has a lower stack pointer. One at or
	 * above it comes after the outer call returned, unseen: start afresh. */
	if (s->call_depth && sp >= s->call_sp) {
		s->call_depth = 0;
		s->call_since_ns = 0;
		s->call_kind = CALL_NONE;
	}
	bool inside_nccl = s->call_depth && s->call_kind == CALL_NCCL;
	if (kind == CALL_LAUNCH) {
		/* A collective launches its own kernels: those are part of the collective. */
		if (!inside_nccl) {
			s->launches += 1;
			s->last_enqueue = CALL_LAUNCH;
		}
		return 0;
	}
	if (kind == CALL_NCCL && !inside_nccl) {
		s->nccl_calls += 1;
		s->last_enqueue = CALL_NCCL;
	}
	if (s->call_depth == 0) {
		__u64 now = bpf_ktime_get_ns();
		if ((kind == CALL_SYNC || kind == CALL_COPY) && s->last_enqueue == CALL_NCCL) {
			__u32 tid = (__u32)bpf_get_current_pid_tgid();
			if (cpu_time_now(tid, now) > s->nccl_end_cpu_ns + ENQUEUE_WORK_NS)
				s->last_enqueue = CALL_LAUNCH;
		}
		s->call_since_ns = now;
		s->call_kind = kind;
		s->call_sp = sp;
	}
	if (s->call_depth < 64)
		s->call_depth += 1;
	return 0;
}

static __always_inline int call_return(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ml_thread_stats *s = bpf_map_lookup_elem(&ml_threads, &tid);
	if (!s || !s->call_depth)
		return 0;
	s->call_depth -= 1;
	if (s->call_depth || !s->call_since_ns)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 spent = now - s->call_since_ns;
	bool waits = s->call_kind == CALL_SYNC || s->call_kind == CALL_COPY;
	/* Waiting for the GPU after enqueueing a collective is waiting for the collective. */
	if (s->call_kind == CALL_NCCL || (waits && s->last_enqueue == CALL_NCCL)) {
		s->nccl_ns += spent;
	} else if (waits) {
		s->sync_ns += spent;
	}
	if (s->call_kind == CALL_SYNC)
		s->syncs += 1;
	else if (s->call_kind == CALL_COPY)
		s->copies += 1;
	if (s->call_kind == CALL_NCCL)
		s->nccl_end_cpu_ns = cpu_time_now(tid, now);
	s->call_since_ns = 0;
	s->call_kind = CALL_NONE;
	return 0;
}

/* Attached per process (kernels without uprobe_multi). */
SEC("uprobe")
int BPF_UPROBE(on_call)
{
	return call_entry(ctx, bpf_get_attach_cookie(ctx));
}

SEC("uretprobe")
int BPF_URETPROBE(on_call_return)
{
	return call_return();
}

/* Attached once per library file, for every process that maps it: the breakpoint is in every
 * such process, and threads of untracked ones leave at once (ml_current). */
SEC("uprobe.multi")
int BPF_UPROBE(on_call_multi)
{
	return call_entry(ctx, bpf_get_attach_cookie(ctx));
}

SEC("uretprobe.multi")
int BPF_URETPROBE(on_call_return_multi)
{
	return call_return();
}

/* ---- tracked processes: where their CPU time goes, sampled at timer ticks ---- */

/* Every expiring high-resolution timer, the scheduler tick among them (HZ times a second on a
 * busy CPU, none on an idle one): the thread it interrupts is sampled. A sample costs no
 * interrupt of its own, and none at all to a thread that is not tracked beyond a map lookup.
 * The user-space instruction pointer comes from the registers saved at the thread's entry to
 * the kernel: where it was running, or where it made the syscall it is in. */
SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(btf_tick, struct hrtimer *timer, ktime_t *now)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u32 tid = task->pid;
	__u32 tgid = task->tgid;
	/* An exiting thread's entries are already deleted (sched_process_exit): never re-create
	 * them. */
	if (!tid || (task->flags & (PF_KTHREAD | PF_EXITING)))
		return 0;
	if (!bpf_map_lookup_elem(&tracked, &tgid))
		return 0;
	struct ml_thread_stats *s = ml_entry(tid, tgid);
	/* Time inside a probed call is accounted by the call itself. */
	if (!s || s->call_depth)
		return 0;
	s->samples += 1;
	struct gpu_text *text = bpf_map_lookup_elem(&gpu_text, &tgid);
	if (!text)
		return 0;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!regs)
		return 0;
	__u64 ip = PT_REGS_IP_CORE(regs);
	for (int i = 0; i < MAX_TEXT_RANGES; i++) {
		if (ip >= text->start[i] && ip < text->end[i]) {
			s->driver_samples += 1;
			break;
		}
	}
	return 0;
}

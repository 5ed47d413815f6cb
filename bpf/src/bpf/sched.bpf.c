// SPDX-License-Identifier: GPL-2.0
/* Per-thread scheduling observation: on-CPU time, run-queue wait, voluntary and involuntary
 * switches, kept in a hash map keyed by thread id; an exiting thread's entry is deleted so a
 * reused id never inherits stale counters. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "intf.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_THREADS 65536
/* TASK_RUNNING: a task switched out in this state was preempted. */
#define TASK_RUNNING_STATE 0
/* Set early in do_exit(), before sched_process_exit. */
#define PF_EXITING 0x00000004

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, struct thread_stats);
} threads SEC(".maps");

/* Makes the skeleton generate the Rust type of the map's values. */
struct thread_stats thread_stats_layout = {};

static __always_inline struct thread_stats *stats_of(struct task_struct *task)
{
	__u32 tid = BPF_CORE_READ(task, pid);
	struct thread_stats *s = bpf_map_lookup_elem(&threads, &tid);
	if (s)
		return s;
	/* An exiting thread can still be woken and scheduled after sched_process_exit deleted its
	 * entry: never create one for it, or it would outlive the thread. */
	if (BPF_CORE_READ(task, flags) & PF_EXITING)
		return 0;
	struct thread_stats zero = {};
	zero.tgid = BPF_CORE_READ(task, tgid);
	bpf_map_update_elem(&threads, &tid, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &tid);
}

static __always_inline void mark_runnable(struct task_struct *task)
{
	struct thread_stats *s = stats_of(task);
	if (s && !s->runnable_since_ns)
		s->runnable_since_ns = bpf_ktime_get_ns();
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *task)
{
	mark_runnable(task);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(on_wakeup_new, struct task_struct *task)
{
	mark_runnable(task);
	return 0;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	/* Thread 0 is each CPU's idle task: not a thread of anyone's. */
	__u32 prev_tid = BPF_CORE_READ(prev, pid);
	if (prev_tid) {
		/* Look up only: an exiting thread's last switch-out must not re-create the entry
		 * that sched_process_exit deleted. */
		struct thread_stats *p = bpf_map_lookup_elem(&threads, &prev_tid);
		if (p) {
			if (p->last_in_ns)
				p->on_cpu_ns += now - p->last_in_ns;
			p->last_in_ns = 0;
			if (prev_state == TASK_RUNNING_STATE) {
				p->involuntary += 1;
				p->runnable_since_ns = now;
			} else {
				p->voluntary += 1;
				p->runnable_since_ns = 0;
			}
		}
	}
	if (BPF_CORE_READ(next, pid)) {
		struct thread_stats *n = stats_of(next);
		if (n) {
			if (n->runnable_since_ns)
				n->runq_wait_ns += now - n->runnable_since_ns;
			n->runnable_since_ns = 0;
			n->last_in_ns = now;
		}
	}
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *task)
{
	__u32 tid = BPF_CORE_READ(task, pid);
	bpf_map_delete_elem(&threads, &tid);
	return 0;
}

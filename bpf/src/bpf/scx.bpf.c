// SPDX-License-Identifier: GPL-2.0
/* Ringside's sched_ext scheduler: carries out the daemon's per-thread decisions in the kernel.
 *
 * - Weighted virtual-time fairness: every task's virtual time advances by the time it ran,
 *   scaled by 100/weight; the dispatch queues are ordered by it. The weight is the decision's
 *   (the daemon's map, keyed by thread id) or the task's own (from its nice value).
 * - One dispatch queue per NUMA node: a task is queued on its decision's node, else on the node
 *   of the CPU it last ran on; a CPU takes from its node's queue and, when that is empty,
 *   steals from the other nodes' queues.
 * - Latency class (data loading, optimizer step): the decision's short slice, and on wake-up it
 *   preempts the task running on its CPU (SCX_ENQ_PREEMPT on that CPU's local queue) unless
 *   that task is of the latency class too. Feeder class (threads feeding the GPU): the
 *   decision's long slice.
 * - A task on an idle CPU at wake-up goes straight to it.
 * - Per-CPU counters and the exit reason for the daemon.
 *
 * Built against a vmlinux header of a kernel with sched_ext (vmlinux_scx.h, see
 * docs/scheduler.md); runs on 6.12 (scx_bpf_dispatch/consume) and 6.13+ (scx_bpf_dsq_insert/
 * dsq_move_to_local): the kfuncs are weak and the branch not taken is removed at load. */
#include "vmlinux_scx.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "scx_intf.h"

char LICENSE[] SEC("license") = "GPL";

#define MAX_CPUS 1024
#define MAX_NODES 64
#define MAX_DECISIONS 65536
#define SLICE_DFL_NS 20000000ULL /* SCX_SLICE_DFL */

/* 6.12 names */
void scx_bpf_dispatch(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym __weak;
void scx_bpf_dispatch_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime, u64 enq_flags) __ksym __weak;
bool scx_bpf_consume(u64 dsq_id) __ksym __weak;
/* 6.13+ names */
void scx_bpf_dsq_insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags) __ksym __weak;
void scx_bpf_dsq_insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime, u64 enq_flags) __ksym __weak;
bool scx_bpf_dsq_move_to_local(u64 dsq_id) __ksym __weak;
/* both */
s32 scx_bpf_create_dsq(u64 dsq_id, s32 node) __ksym;
s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags, bool *is_idle) __ksym;
s32 scx_bpf_task_cpu(const struct task_struct *p) __ksym;
void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
bool bpf_cpumask_test_cpu(u32 cpu, const struct cpumask *cpumask) __ksym;

/* Set by user space before load. */
const volatile u32 nr_nodes = 1;
const volatile u32 nr_cpus = 1;
const volatile u8 cpu_node[MAX_CPUS];

/* Largest virtual time a task has run at; a task waking after a long sleep starts at most one
 * slice behind it (it cannot bank its sleep). */
u64 vtime_now;
struct scx_exit_record exit_record;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DECISIONS);
	__type(key, u32);
	__type(value, struct scx_decision);
} decisions SEC(".maps");

struct cpu_state {
	u64 started_ns; /* when the running task went on this CPU */
	u32 class;      /* its class */
	u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_CPUS);
	__type(key, u32);
	__type(value, struct cpu_state);
} cpus SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct scx_counters);
} counters SEC(".maps");

static struct scx_counters *count(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&counters, &zero);
}

static __always_inline bool vtime_before(u64 a, u64 b)
{
	return (s64)(a - b) < 0;
}

static void insert(struct task_struct *p, u64 dsq_id, u64 slice, u64 enq_flags)
{
	if (bpf_ksym_exists(scx_bpf_dsq_insert))
		scx_bpf_dsq_insert(p, dsq_id, slice, enq_flags);
	else
		scx_bpf_dispatch(p, dsq_id, slice, enq_flags);
}

static void insert_vtime(struct task_struct *p, u64 dsq_id, u64 slice, u64 vtime, u64 enq_flags)
{
	if (bpf_ksym_exists(scx_bpf_dsq_insert_vtime))
		scx_bpf_dsq_insert_vtime(p, dsq_id, slice, vtime, enq_flags);
	else
		scx_bpf_dispatch_vtime(p, dsq_id, slice, vtime, enq_flags);
}

static bool move_to_local(u64 dsq_id)
{
	if (bpf_ksym_exists(scx_bpf_dsq_move_to_local))
		return scx_bpf_dsq_move_to_local(dsq_id);
	return scx_bpf_consume(dsq_id);
}

static u32 node_of(s32 cpu)
{
	if (cpu < 0 || cpu >= MAX_CPUS)
		return 0;
	/* The mask keeps the index provably in bounds for the verifier, whatever the compiler
	 * makes of the check above. */
	u32 node = cpu_node[(u32)cpu & (MAX_CPUS - 1)];
	return node < nr_nodes ? node : 0;
}

static struct scx_decision *decision_of(const struct task_struct *p)
{
	u32 tid = p->pid;
	return bpf_map_lookup_elem(&decisions, &tid);
}

static u64 slice_of(const struct scx_decision *d)
{
	return d && d->slice_us ? (u64)d->slice_us * 1000 : SLICE_DFL_NS;
}

SEC("struct_ops/ringside_select_cpu")
s32 BPF_PROG(ringside_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
	bool idle = false;
	s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &idle);
	if (idle) {
		struct scx_counters *c = count();
		insert(p, SCX_DSQ_LOCAL, slice_of(decision_of(p)), 0);
		if (c)
			c->direct++;
	}
	return cpu;
}

SEC("struct_ops/ringside_enqueue")
void BPF_PROG(ringside_enqueue, struct task_struct *p, u64 enq_flags)
{
	struct scx_counters *c = count();
	struct scx_decision *d = decision_of(p);
	s32 cpu = scx_bpf_task_cpu(p);
	u64 slice = slice_of(d);
	u32 node = node_of(cpu);

	if (c) {
		c->enqueued++;
		if (d)
			c->decided++;
	}
	if (d && d->node >= 0) {
		if ((u32)d->node < nr_nodes)
			node = d->node;
		else if (c)
			c->fallbacks++;
	}
	if (d && d->class == SCX_CLASS_LATENCY && (enq_flags & SCX_ENQ_WAKEUP) && cpu >= 0 && cpu < MAX_CPUS) {
		u32 key = cpu;
		struct cpu_state *running = bpf_map_lookup_elem(&cpus, &key);
		if (running && running->class != SCX_CLASS_LATENCY) {
			if (bpf_cpumask_test_cpu(cpu, p->cpus_ptr)) {
				/* SCX_ENQ_PREEMPT on a CPU's local queue ends the running task's slice. */
				insert(p, SCX_DSQ_LOCAL_ON | cpu, slice, enq_flags | SCX_ENQ_PREEMPT);
				if (c)
					c->preempted++;
				return;
			}
			if (c)
				c->fallbacks++;
		}
	}

	u64 vtime = p->scx.dsq_vtime;
	if (vtime_before(vtime, vtime_now - SLICE_DFL_NS))
		vtime = vtime_now - SLICE_DFL_NS;
	insert_vtime(p, node, slice, vtime, enq_flags);
}

SEC("struct_ops/ringside_dispatch")
void BPF_PROG(ringside_dispatch, s32 cpu, struct task_struct *prev)
{
	struct scx_counters *c = count();
	u32 home = node_of(cpu);

	if (move_to_local(home)) {
		if (c)
			c->dispatched++;
		return;
	}
	for (u32 i = 1; i < MAX_NODES; i++) {
		if (i >= nr_nodes)
			break;
		u32 node = home + i;
		if (node >= nr_nodes)
			node -= nr_nodes;
		if (move_to_local(node)) {
			if (c)
				c->stolen++;
			return;
		}
	}
}

SEC("struct_ops/ringside_running")
void BPF_PROG(ringside_running, struct task_struct *p)
{
	u32 cpu = bpf_get_smp_processor_id();
	struct scx_decision *d = decision_of(p);
	struct cpu_state *state = bpf_map_lookup_elem(&cpus, &cpu);
	struct scx_counters *c = count();
	u32 class = d ? d->class : SCX_CLASS_DEFAULT;

	if (vtime_before(vtime_now, p->scx.dsq_vtime))
		vtime_now = p->scx.dsq_vtime;
	if (state) {
		state->started_ns = bpf_ktime_get_ns();
		state->class = class;
	}
	if (c) {
		if (class == SCX_CLASS_LATENCY)
			c->latency_runs++;
		else if (class == SCX_CLASS_FEEDER)
			c->feeder_runs++;
	}
}

SEC("struct_ops/ringside_stopping")
void BPF_PROG(ringside_stopping, struct task_struct *p, bool runnable)
{
	u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *state = bpf_map_lookup_elem(&cpus, &cpu);
	struct scx_decision *d = decision_of(p);
	u64 weight = d && d->weight ? d->weight : p->scx.weight;

	if (!state || !state->started_ns)
		return;
	u64 ran = bpf_ktime_get_ns() - state->started_ns;
	state->started_ns = 0;
	state->class = SCX_CLASS_DEFAULT;
	p->scx.dsq_vtime += ran * 100 / (weight ? weight : 100);
}

SEC("struct_ops/ringside_enable")
void BPF_PROG(ringside_enable, struct task_struct *p)
{
	p->scx.dsq_vtime = vtime_now;
}

SEC("struct_ops.s/ringside_init")
s32 BPF_PROG(ringside_init)
{
	for (u32 node = 0; node < MAX_NODES; node++) {
		if (node >= nr_nodes)
			break;
		s32 err = scx_bpf_create_dsq(node, node);
		if (err)
			return err;
	}
	return 0;
}

SEC("struct_ops/ringside_exit")
void BPF_PROG(ringside_exit, struct scx_exit_info *ei)
{
	exit_record.exit_code = ei->exit_code;
	bpf_probe_read_kernel_str(exit_record.reason, sizeof(exit_record.reason), ei->reason);
	bpf_probe_read_kernel_str(exit_record.msg, sizeof(exit_record.msg), ei->msg);
	/* Written last (BPF has no store-release before LLVM 20: a compiler barrier orders the
	 * stores here, and the JIT keeps them in order on x86): user space reads the record once
	 * kind is set. */
	asm volatile("" ::: "memory");
	*(volatile s32 *)&exit_record.kind = ei->kind;
}

SEC(".struct_ops.link")
struct sched_ext_ops ringside_ops = {
	.select_cpu = (void *)ringside_select_cpu,
	.enqueue = (void *)ringside_enqueue,
	.dispatch = (void *)ringside_dispatch,
	.running = (void *)ringside_running,
	.stopping = (void *)ringside_stopping,
	.enable = (void *)ringside_enable,
	.init = (void *)ringside_init,
	.exit = (void *)ringside_exit,
	/* The kernel's watchdog ejects the scheduler when a runnable task waits this long. */
	.timeout_ms = 10000,
	.name = "ringside",
};

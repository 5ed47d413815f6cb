// SPDX-License-Identifier: GPL-2.0
/* Ringside's sched_ext scheduler: carries out the daemon's per-thread decisions in the kernel.
 *
 * - Weighted virtual-time fairness: every task's virtual time advances by the time it ran,
 *   scaled by 100/weight; the dispatch queues are ordered by it. The weight is the decision's
 *   (the daemon's map, keyed by thread id) or the task's own (from its nice value).
 * - One dispatch queue per NUMA node: a task is queued on its decision's node, else on the node
 *   of the CPU it last ran on unless another node's queue is clearly shorter; a CPU takes from
 *   its node's queue and, when that is empty, steals from the other nodes' queues.
 * - Latency class (data loading, optimizer step): the decision's short slice, and on wake-up it
 *   preempts the task running on its CPU (SCX_ENQ_PREEMPT on that CPU's local queue) unless
 *   that task is of the latency class too. Feeder class (threads feeding the GPU): the
 *   decision's long slice.
 * - Other threads of ML jobs (with a decision, or of a process the daemon marked as a job's)
 *   preempt a task of no ML job on wake-up when fairness owes them the CPU, on their own CPU or
 *   another (see takes_cpu, preempt_target); at the end of a slice they keep their CPU while
 *   still owed it.
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
/* The slice of a task without a decision: about what EEVDF gives on a small machine (its
 * 0.75 ms base slice times 1 + log2 of the CPUs, at most 3 ms). SCX_SLICE_DFL's 20 ms makes a
 * waiting thread of an ML job sit behind a CPU-bound task's whole slice. */
#define SLICE_DFL_NS 3000000ULL
/* How far behind the others a task that slept may start: it cannot bank its sleep. */
#define SLEEP_CREDIT_NS 20000000ULL
#define WAKEUP_GRAN_NS 1000000ULL
/* CPUs a waking thread of an ML job looks at for one to take (see preempt_target). */
#define SCAN_CPUS 64

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
s32 scx_bpf_dsq_nr_queued(u64 dsq_id) __ksym;
s32 scx_bpf_select_cpu_dfl(struct task_struct *p, s32 prev_cpu, u64 wake_flags, bool *is_idle) __ksym;
s32 scx_bpf_task_cpu(const struct task_struct *p) __ksym;
void scx_bpf_kick_cpu(s32 cpu, u64 flags) __ksym;
bool bpf_cpumask_test_cpu(u32 cpu, const struct cpumask *cpumask) __ksym;

/* Set by user space before load. */
const volatile u32 nr_nodes = 1;
const volatile u32 nr_cpus = 1;
const volatile u8 cpu_node[MAX_CPUS];

/* Largest virtual time a task has run at; a task waking after a long sleep starts at most
 * SLEEP_CREDIT_NS behind it (it cannot bank its sleep). */
u64 vtime_now;
struct scx_exit_record exit_record;
/* CPUs per node, counted at init from cpu_node. */
u32 node_cpus[MAX_NODES];

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_DECISIONS);
	__type(key, u32);
	__type(value, struct scx_decision);
} decisions SEC(".maps");

/* Processes of ML jobs (by tgid), from the daemon: their threads without a decision of their
 * own (a phase not yet or no longer known, helper threads) are still threads of the job. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u32);
} jobs SEC(".maps");

struct cpu_state {
	u64 started_ns; /* when the running task went on this CPU; 0 while none runs */
	u64 vtime;      /* its virtual time then */
	u32 class;      /* its class */
	u32 weight;     /* its weight */
	u32 tgid;       /* its process */
	u32 ml;         /* whether it is a thread of an ML job (is_ml) */
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
	/* The mask keeps the index provably in bounds for the verifier; the empty asm hides the
	 * check above from the compiler, which would otherwise drop the mask as redundant (and
	 * did, where the index came from a loop). */
	u32 index = (u32)cpu;
	asm volatile("" : "+r"(index));
	u32 node = cpu_node[index & (MAX_CPUS - 1)];
	return node < nr_nodes ? node : 0;
}

static u32 cpus_in(u32 node)
{
	u32 n = node_cpus[node & (MAX_NODES - 1)];
	return n ? n : 1;
}

/* The node a task without a node of its own is queued on: the node it last ran on, unless
 * another node's queue is shorter by more than one task per CPU (queues compared per CPU of
 * their node). Without this, each CPU-bound task stays on the node it first ran on -- a CPU
 * steals only from an empty queue, and a node whose queue always holds its own running task's
 * successor never is -- and one node can carry three times the load of another. Only a task
 * that may run on every CPU is moved. */
static u32 balanced_node(const struct task_struct *p, u32 home)
{
	if (nr_nodes < 2 || (u32)p->nr_cpus_allowed < nr_cpus)
		return home;
	s32 queued = scx_bpf_dsq_nr_queued(home);
	u64 best_queued = queued > 0 ? queued : 0;
	u64 best_cpus = cpus_in(home);
	u32 best = home;
	for (u32 node = 0; node < MAX_NODES; node++) {
		if (node >= nr_nodes)
			break;
		if (node == home)
			continue;
		s32 other = scx_bpf_dsq_nr_queued(node);
		if (other < 0)
			continue;
		u64 cpus = cpus_in(node);
		/* (other + 1) / cpus < best_queued / best_cpus */
		if (((u64)other + 1) * best_cpus < best_queued * cpus) {
			best = node;
			best_queued = other;
			best_cpus = cpus;
		}
	}
	return best;
}

static struct scx_decision *decision_of(const struct task_struct *p)
{
	u32 tid = p->pid;
	return bpf_map_lookup_elem(&decisions, &tid);
}

/* Whether a task is a thread of an ML job: it has a decision, or its process is a job's. */
static bool is_ml(const struct task_struct *p, const struct scx_decision *d)
{
	u32 tgid = p->tgid;
	return d || bpf_map_lookup_elem(&jobs, &tgid);
}

static u64 slice_of(const struct scx_decision *d)
{
	return d && d->slice_us ? (u64)d->slice_us * 1000 : SLICE_DFL_NS;
}

static u64 weight_of(const struct task_struct *p, const struct scx_decision *d)
{
	u64 weight = d && d->weight ? d->weight : p->scx.weight;
	return weight ? weight : 100;
}

/* Whether a thread of an ML job, waking with virtual time `vtime` (and class `class`), takes
 * the CPU from the task running there now. A latency-class thread preempts any task not of its
 * class. A thread of another class preempts only a task of no ML job, and only when it is owed
 * the CPU: its virtual time is more than WAKEUP_GRAN_NS behind that task's as of now (which
 * has advanced by the time that task has run, scaled by its weight) -- so a thread handing work to another (a collective's ranks, a
 * GPU feeder back from a synchronize) does not wait out a CPU-bound task's whole slice, and
 * fairness still bounds what it takes. A thread of the running task's own process never
 * preempts it: that task is most likely the one waking it, and may hold the lock the woken
 * thread is about to take (a mutex and condition variable hand-off). */
static bool takes_cpu(const struct cpu_state *running, const struct task_struct *p, u32 class, u64 vtime)
{
	if (!running->started_ns || running->tgid == (u32)p->tgid)
		return false;
	if (class == SCX_CLASS_LATENCY)
		return running->class != SCX_CLASS_LATENCY;
	if (running->ml)
		return false;
	u64 ran = bpf_ktime_get_ns() - running->started_ns;
	u64 running_vtime = running->vtime + ran * 100 / (running->weight ? running->weight : 100);
	return vtime_before(vtime + WAKEUP_GRAN_NS, running_vtime);
}

/* The CPU a waking thread of an ML job takes: its own CPU where takes_cpu allows, else the
 * first of up to SCAN_CPUS others (from the next one on, within its decision's node if it has
 * one) running a task of no ML job that it may take the CPU from. A thread whose own CPU runs
 * the thread that woke it runs beside it rather than waiting for it, as it would have under the
 * kernel's own scheduler. -1: none; the thread is queued. */
static s32 preempt_target(const struct task_struct *p, const struct scx_decision *d, u32 class, u64 vtime, s32 first)
{
	for (u32 i = 0; i < SCAN_CPUS; i++) {
		if (i >= nr_cpus)
			break;
		u32 cpu = (u32)first + i;
		if (cpu >= nr_cpus)
			cpu -= nr_cpus;
		if (cpu >= MAX_CPUS)
			break;
		if (d && d->node >= 0 && node_of(cpu) != (u32)d->node)
			continue;
		struct cpu_state *running = bpf_map_lookup_elem(&cpus, &cpu);
		if (!running)
			continue;
		/* On another CPU than its own, a thread takes only a task of no ML job: a latency
		 * thread (a DataLoader worker prefetching) must not cut into the GPU feeder the
		 * job runs elsewhere. */
		if (i > 0 && running->ml)
			continue;
		if (takes_cpu(running, p, class, vtime) && bpf_cpumask_test_cpu(cpu, p->cpus_ptr))
			return cpu;
	}
	return -1;
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
	bool ml = is_ml(p, d);

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
	} else if (!ml || (enq_flags & SCX_ENQ_WAKEUP)) {
		/* A thread of an ML job whose slice ran out stays: its CPU picks again right now,
		 * and its weight makes that pick likely its own. */
		node = balanced_node(p, node);
	}
	/* A task cannot bank the time it slept: it wakes at most SLEEP_CREDIT_NS behind the others. */
	u64 vtime = p->scx.dsq_vtime;
	if (vtime_before(vtime, vtime_now - SLEEP_CREDIT_NS))
		vtime = vtime_now - SLEEP_CREDIT_NS;
	p->scx.dsq_vtime = vtime;

	u32 class = d ? d->class : SCX_CLASS_DEFAULT;
	if (ml && (enq_flags & SCX_ENQ_WAKEUP) && cpu >= 0 && cpu < MAX_CPUS) {
		s32 target = preempt_target(p, d, class, vtime, cpu);
		if (target >= 0) {
			/* SCX_ENQ_PREEMPT on a CPU's local queue ends the running task's slice;
			 * SCX_ENQ_HEAD puts this one first there. */
			insert(p, SCX_DSQ_LOCAL_ON | target, slice, enq_flags | SCX_ENQ_PREEMPT | SCX_ENQ_HEAD);
			if (c)
				c->preempted++;
			return;
		}
	}

	/* A thread of an ML job whose slice ran out while fairness still owes it the CPU (its
	 * virtual time more than WAKEUP_GRAN_NS behind the latest any task started at) carries on
	 * where it is: going round its node's queue would put it behind a CPU-bound task's whole
	 * slice in the middle of a step. Its weight still bounds what it takes. */
	if (ml && !(enq_flags & SCX_ENQ_WAKEUP) && vtime_before(vtime + WAKEUP_GRAN_NS, vtime_now)) {
		insert(p, SCX_DSQ_LOCAL, slice, enq_flags);
		if (c)
			c->continued++;
		return;
	}
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
		state->vtime = p->scx.dsq_vtime;
		state->class = class;
		state->weight = weight_of(p, d);
		state->tgid = p->tgid;
		state->ml = is_ml(p, d);
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
	if (!state || !state->started_ns)
		return;
	u64 ran = bpf_ktime_get_ns() - state->started_ns;
	state->started_ns = 0;
	state->class = SCX_CLASS_DEFAULT;
	/* The weight it went on the CPU with (running), not a second look-up of its decision. */
	p->scx.dsq_vtime += ran * 100 / (state->weight ? state->weight : 100);
}

SEC("struct_ops/ringside_enable")
void BPF_PROG(ringside_enable, struct task_struct *p)
{
	p->scx.dsq_vtime = vtime_now;
}

SEC("struct_ops.s/ringside_init")
s32 BPF_PROG(ringside_init)
{
	for (u32 cpu = 0; cpu < MAX_CPUS; cpu++) {
		if (cpu >= nr_cpus)
			break;
		node_cpus[node_of(cpu) & (MAX_NODES - 1)]++;
	}
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

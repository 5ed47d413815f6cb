/* Types shared by the sched_ext scheduler (scx.bpf.c) and Rust (the skeleton generates the Rust
 * side from BTF). */
#ifndef RINGSIDE_SCX_INTF_H
#define RINGSIDE_SCX_INTF_H

/* How a thread is treated beyond its weight. */
enum scx_class {
	SCX_CLASS_DEFAULT = 0,  /* weighted fair share, the slice of its decision */
	SCX_CLASS_LATENCY = 1,  /* data loading, optimizer step: short slice, preempts on wake-up */
	SCX_CLASS_FEEDER = 2,   /* feeds the GPU: long slice, preempts on wake-up only when owed
				 * the CPU (as the default class does) */
};

/* The daemon's decision for one thread, keyed by thread id in the `decisions` map. */
struct scx_decision {
	__u32 weight;           /* sched_ext weight: 100 at nice 0 (the kernel's weight / 10.24) */
	__u32 slice_us;         /* time slice; 0 for the default */
	__s32 node;             /* preferred NUMA node; -1 for the node it last ran on */
	__u32 class;            /* enum scx_class */
	__u32 phase;            /* the phase it was decided for (for display) */
	__u32 pad;
};

/* Per-CPU counters in the `counters` map (one entry, summed over CPUs by user space). */
struct scx_counters {
	__u64 enqueued;         /* tasks queued on a node's dispatch queue */
	__u64 decided;          /* ... of which had a decision of the daemon */
	__u64 direct;           /* put straight on an idle CPU at wake-up */
	__u64 dispatched;       /* moved from the CPU's own node queue to the CPU */
	__u64 stolen;           /* moved from another node's queue: this node's queue was empty */
	__u64 preempted;        /* wake-ups that preempted the running thread: a latency-class
				 * thread, or one fairness owed the CPU */
	__u64 continued;        /* threads of ML jobs that kept their CPU when their slice ran
				 * out, fairness still owing it to them */
	__u64 latency_runs;     /* times a latency-class thread went on a CPU */
	__u64 feeder_runs;      /* times a feeder-class thread went on a CPU */
	__u64 fallbacks;        /* a decision could not be followed as written (its node does
				 * not exist, its preemption target was not allowed) */
};

/* Why the scheduler stopped, written by ops.exit (kind 0 while it runs). */
struct scx_exit_record {
	__s32 kind;             /* enum scx_exit_kind */
	__s32 pad;
	__s64 exit_code;
	char reason[128];
	char msg[256];
};

#endif

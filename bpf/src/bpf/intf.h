/* Types shared by the BPF programs and Rust (the skeleton generates the Rust side from BTF). */
#ifndef RINGSIDE_INTF_H
#define RINGSIDE_INTF_H

/* Per-thread scheduling counters, keyed by thread id in the `threads` map. */
struct thread_stats {
	__u64 on_cpu_ns;        /* time on a CPU */
	__u64 runq_wait_ns;     /* time runnable but waiting for a CPU (wake-up or preemption to switch-in) */
	__u64 voluntary;        /* switches out while not runnable (blocked) */
	__u64 involuntary;      /* switches out while still runnable (preempted) */
	__u64 last_in_ns;       /* when it last went on a CPU; 0 while off */
	__u64 runnable_since_ns;/* when it became runnable; 0 while not waiting */
	__u32 tgid;
	__u32 pad;
};

#endif

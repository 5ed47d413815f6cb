/* Types shared by the BPF programs and Rust (the skeleton generates the Rust side from BTF). */
#ifndef RINGSIDE_INTF_H
#define RINGSIDE_INTF_H

enum sys_kind {
	SYS_KIND_NONE = 0,
	SYS_KIND_FUTEX = 1,
	SYS_KIND_READ = 2,      /* the read family, and poll/select/epoll waits (waiting for input) */
	SYS_KIND_NV_IOCTL = 3,
};

/* The attach cookie of each uprobe says which kind of call it is. */
enum call_kind {
	CALL_NONE = 0,
	CALL_LAUNCH = 1, /* kernel and graph launches (probed only when asked: a trap per launch) */
	CALL_SYNC = 2,   /* stream, event and context synchronize */
	CALL_NCCL = 3,   /* NCCL collectives, point-to-point, group end, communicator set-up */
	CALL_COPY = 4,   /* copies the host waits for (device to host) */
};

/* The executable mappings of the GPU driver and runtime in one process (`gpu_text`, keyed by
 * tgid, written by user space): a tick that finds a thread running code in one of them finds
 * it driving the GPU. */
#define MAX_TEXT_RANGES 8
struct gpu_text {
	__u64 start[MAX_TEXT_RANGES];
	__u64 end[MAX_TEXT_RANGES];
};

enum event_kind {
	EVENT_FORK = 1,  /* a new process (not a thread); `value` = 1 if tracked from birth */
	EVENT_EXEC = 2,
	EVENT_EXIT = 3,  /* a process's last thread (its leader) exited */
	EVENT_RUNQ = 4,  /* a tracked thread went on a CPU after `value` ns in the run queue */
};

/* Per-thread scheduling counters, keyed by thread id in the `threads` map (every thread). */
struct thread_stats {
	__u64 on_cpu_ns;        /* time on a CPU */
	__u64 runq_wait_ns;     /* time runnable but waiting for a CPU (wake-up or preemption to switch-in) */
	__u64 voluntary;        /* switches out while not runnable (blocked) */
	__u64 involuntary;      /* switches out while still runnable (preempted) */
	__u64 last_in_ns;       /* when it last went on a CPU; 0 while off */
	__u64 runnable_since_ns;/* when it became runnable; 0 while not waiting */
	__u64 io_since_ns;      /* when it blocked in I/O wait (in_iowait); 0 otherwise */
	__u64 iowait_ns;        /* time blocked in I/O wait (block I/O) */
	__u64 blocked_since_ns; /* tracked threads: when it blocked in a classified syscall */
	enum sys_kind blocked_kind; /* of that syscall; SYS_KIND_NONE if none */
	__u32 tgid;
	__u32 tracked;          /* its process is tracked, as of `tracked_gen` */
	__u32 tracked_gen;      /* the `tracked_generation` that flag was read at */
	__u64 runtime_base;     /* the kernel's own runtime of the thread (se.sum_exec_runtime) less
				 * on_cpu_ns, once known (tp_btf, raw_tp): on_cpu_ns is then that
				 * runtime less this at each switch-out */
	__u32 runtime_known;    /* runtime_base is set */
	__u32 pad;
};

/* What a tracked (ML) thread does in system and library calls, keyed by thread id in the
 * `ml_threads` map; only threads of tracked processes have an entry.
 *
 * Syscalls are classified when the thread blocks in one (sched_switch reads the syscall number
 * and arguments from its registers): the counts and times below are of *blocking* waits, which
 * costs nothing outside context switches. With `syscall_tracepoints` set, the syscall
 * tracepoints count every call instead, at the price of the slow syscall path for every task. */
struct ml_thread_stats {
	__u64 futex_wait_ns;    /* time in futex waits (FUTEX_WAIT*, LOCK_PI) */
	__u64 futex_waits;
	__u64 read_ns;          /* time in read/pread64/readv/preadv/recvfrom/recvmsg */
	__u64 reads;
	__u64 read_bytes;
	__u64 nv_ioctl_ns;      /* time in ioctl() on NVIDIA device files (/dev/nvidia*) */
	__u64 nv_ioctls;
	__u64 launches;         /* kernel launches (only with the launch probes attached) */
	__u64 sync_ns;          /* time in synchronize calls and copies the host waits for */
	__u64 syncs;            /* synchronize calls */
	__u64 copies;           /* copies the host waits for (device to host) */
	__u64 nccl_ns;          /* time in NCCL calls, and in synchronizing on them */
	__u64 nccl_calls;
	/* Scheduler-tick samples of the thread on a CPU outside the probed calls, and of those
	 * the ones that found it running the GPU driver's or runtime's code (`gpu_text`). */
	__u64 samples;
	__u64 driver_samples;
	__u64 nccl_end_cpu_ns;  /* its on-CPU time when its latest NCCL call returned */
	/* In flight: */
	__u64 sys_since_ns;     /* entry time of the syscall being accounted; 0 if none */
	__u64 call_since_ns;    /* entry time of the outermost probed library call */
	__u64 call_sp;          /* the stack pointer at that entry: a later entry at or above it
				 * means its return was missed (a skipped uretprobe run) */
	enum sys_kind sys_kind;   /* of the syscall in flight */
	enum call_kind call_kind; /* of the outermost library call in flight */
	__u32 call_depth;       /* nesting (cudaDeviceSynchronize calls cuCtxSynchronize) */
	enum call_kind last_enqueue; /* CALL_LAUNCH or CALL_NCCL: what the GPU queue got last (a
				      * launch, or work the thread did since its collective) */
	__u32 tgid;
	__u32 pad;
};

/* One record on the `events` (lifecycle) or `runq_events` ring buffer. */
struct event {
	enum event_kind kind;   /* an enum (4 bytes) so that BTF, and the Rust skeleton, carry it */
	__u32 tid;
	__u32 tgid;
	__u32 parent_tgid;      /* EVENT_FORK: the parent process */
	__u64 at_ns;            /* CLOCK_MONOTONIC */
	__u64 value;            /* EVENT_FORK: inherited; EVENT_RUNQ: the wait (ns); EVENT_EXIT:
				 * (1 << 32) | exit code, or 0 where unknown */
	char comm[16];
};

/* Counters of what the programs could not record, indexed by `enum lost_kind` (per CPU). */
enum lost_kind {
	LOST_EVENTS = 0,        /* lifecycle ring buffer full */
	LOST_RUNQ = 1,          /* run-queue sample ring buffer full */
	LOST_THREADS = 2,       /* `threads` map full */
	LOST_ML_THREADS = 3,    /* `ml_threads` map full */
	LOST_KINDS = 4,
};

#endif

// The device side of a ring kernel: the persistent loop, the one-shot variant used as a
// baseline, and the ring and control-block accesses they share.
//
// The host prepends the layout (struct ControlBlock, struct RingIndices and the RS_* constants,
// generated from kernels/src/cuda/layout.rs) and appends one .cu file per kernel; NVRTC compiles
// the whole as one program, with no headers. Each kernel file defines a struct with
//
//   static constexpr bool in_place;   // the result is the input itself (echo)
//   __device__ static void process(Message& m, const u64* in, u64* out, u64* kernel_state,
//                                  u64* kernel_histogram);
//
// called by every thread of the block; thread 0 sets m.error (0, or rs_error(code, arg)) and
// m.out_len, and the function ends with __syncthreads() so every thread sees them.
//
// Memory: the control block and both rings are in pinned host memory mapped into the device.
// Everything the host also touches is accessed with system-scope operations: relaxed loads and
// stores, plus fence.acq_rel.sys where an index publishes or takes over slot contents, the same
// Release/Acquire pairs as the CPU ring (kernels/src/ring.rs). The kernel's own state (telemetry
// shadows, ring cursors, the stats histogram, the message being processed) is in device memory.

typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 rs_load_relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ u64 rs_load_acquire(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void rs_store_relaxed(u64* p, u64 v) {
    asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void rs_store_release(u64* p, u64 v) {
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/// Orders earlier loads and stores (of this thread, and those made visible to it, e.g. by
/// __syncthreads) before later ones, at system scope.
__device__ __forceinline__ void rs_fence() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

/// The device's nanosecond clock (%globaltimer); the host stamps enqueue times in it.
__device__ __forceinline__ u64 rs_now() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void rs_sleep(u32 ns) {
    asm volatile("nanosleep.u32 %0;" ::"r"(ns));
}

__device__ __forceinline__ u64 rs_error(u64 code, u64 arg) {
    return code << 56 | (arg & ((1ull << 56) - 1));
}

/// Same buckets as kernels/src/telemetry.rs: exact below RS_SUB, then RS_SUB linear
/// sub-buckets per power of two.
__device__ __forceinline__ u32 rs_bucket_of(u64 value) {
    if (value < RS_SUB) {
        return (u32)value;
    }
    u32 power = 63u - (u32)__clzll((long long)value);
    u32 sub = (u32)(value >> (power - RS_SUB_BITS)) & (RS_SUB - 1);
    u32 index = (power - RS_SUB_BITS + 1) * RS_SUB + sub;
    return index < RS_BUCKETS - 1 ? index : RS_BUCKETS - 1;
}

__device__ __forceinline__ u64 rs_bucket_floor(u32 bucket) {
    if (bucket < RS_SUB) {
        return bucket;
    }
    u32 power = bucket / RS_SUB + RS_SUB_BITS - 1;
    u64 sub = bucket % RS_SUB;
    return (1ull << power) | (sub << (power - RS_SUB_BITS));
}

/// What one message's processing shares between the block's threads (shared memory).
struct Message {
    u64 op;
    u64 stamp;
    u64 error;
    u32 len;
    u32 out_len;
    u32 first_bad;
    u32 pushed;
    const unsigned char* in_slot;
    unsigned char* out_slot;
};

/// The launch's arguments and the ring geometry, the same in every thread.
struct Rings {
    ControlBlock* cb;
    RingIndices* in;
    unsigned char* in_slots;
    RingIndices* out;
    unsigned char* out_slots;
    u64* state;
    u64 mask;
    u64 slot_size;
    u64 message_size;
    u64 wait_ns;

    __device__ u64* telemetry() const { return state + RS_DS_TELEMETRY; }
    __device__ u64* kernel_state() const { return state + RS_DS_KERNEL; }
    __device__ u64* cursors() const { return state + RS_DS_CURSORS; }
    __device__ u64* telemetry_histogram() const { return state + RS_DS_TELEMETRY_HISTOGRAM; }
    __device__ u64* kernel_histogram() const { return state + RS_DS_KERNEL_HISTOGRAM; }
    __device__ u64* staging_in() const { return state + RS_DS_STAGING; }
    __device__ u64* staging_out() const { return state + RS_DS_STAGING + staging_words(); }
    __device__ u64 staging_words() const {
        u64 words = (message_size + 7) / 8;
        return words < RS_MIN_STAGING_WORDS ? RS_MIN_STAGING_WORDS : words;
    }
};

/// Thread 0's working copy of the counters and cursors; loaded from and saved to the device
/// state, so a one-shot launch continues where the previous one stopped.
struct Thread0 {
    u64 processed, dropped, failed, total_latency, min_latency, max_latency, bytes_in, bytes_out;
    u64 in_tail, out_head, out_tail_cache;

    __device__ void load(const Rings& r) {
        const u64* t = r.telemetry();
        processed = t[0];
        dropped = t[1];
        failed = t[2];
        total_latency = t[3];
        min_latency = t[4];
        max_latency = t[5];
        bytes_in = t[6];
        bytes_out = t[7];
        const u64* c = r.cursors();
        in_tail = c[0];
        out_head = c[1];
        out_tail_cache = c[2];
    }

    __device__ void save(const Rings& r) const {
        u64* t = r.telemetry();
        t[0] = processed;
        t[1] = dropped;
        t[2] = failed;
        t[3] = total_latency;
        t[4] = min_latency;
        t[5] = max_latency;
        t[6] = bytes_in;
        t[7] = bytes_out;
        u64* c = r.cursors();
        c[0] = in_tail;
        c[1] = out_head;
        c[2] = out_tail_cache;
    }
};

__device__ Rings rs_rings(ControlBlock* cb, RingIndices* in, unsigned char* in_slots, RingIndices* out,
                          unsigned char* out_slots, u64* state) {
    // The configuration was written by the host before the launch, which orders it.
    Rings r;
    r.cb = cb;
    r.in = in;
    r.in_slots = in_slots;
    r.out = out;
    r.out_slots = out_slots;
    r.state = state;
    r.mask = cb->capacity_mask;
    r.slot_size = cb->slot_size;
    r.message_size = cb->message_size;
    r.wait_ns = cb->wait_ns;
    return r;
}

/// Thread 0: waits for a free output slot as the backpressure policy says; true if there is one.
__device__ bool rs_output_room(const Rings& r, Thread0& t) {
    u64 capacity = r.mask + 1;
    if (t.out_head - t.out_tail_cache < capacity) {
        return true;
    }
    // The acquire orders our writes to the slot after the host's reads of it.
    t.out_tail_cache = rs_load_acquire(&r.out->tail);
    if (t.out_head - t.out_tail_cache < capacity || r.wait_ns == 0) {
        return t.out_head - t.out_tail_cache < capacity;
    }
    u64 deadline = rs_now() + r.wait_ns;
    while (rs_now() < deadline) {
        rs_sleep(200);
        t.out_tail_cache = rs_load_acquire(&r.out->tail);
        if (t.out_head - t.out_tail_cache < capacity) {
            return true;
        }
    }
    return false;
}

/// Processes the message at thread 0's `in_tail` (which the caller saw published); every
/// thread calls it.
template <class K>
__device__ void rs_process(const Rings& r, Message& m, Thread0& t) {
    if (threadIdx.x == 0) {
        const unsigned char* slot = r.in_slots + (t.in_tail & r.mask) * r.slot_size;
        u64 header = *(const volatile u64*)slot;
        u64 len = header >> RS_TIME_BITS;
        m.in_slot = slot;
        m.len = (u32)(len < r.message_size ? len : r.message_size);
        m.stamp = header & RS_TIME_MASK;
        m.error = 0;
        m.out_len = 0;
    }
    __syncthreads();

    // Copy the payload into device memory: processing reads it from there, not across the
    // bus, and the input slot is free as soon as the copy is done.
    const volatile u64* src = (const volatile u64*)(m.in_slot + RS_SLOT_HEADER);
    u64* in = r.staging_in();
    u32 words = (m.len + 7) / 8;
    for (u32 i = threadIdx.x; i < words; i += blockDim.x) {
        in[i] = src[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        t.in_tail += 1;
        rs_store_release(&r.in->tail, t.in_tail);
    }

    K::process(m, in, r.staging_out(), r.kernel_state(), r.kernel_histogram());

    if (m.error != 0) {
        if (threadIdx.x == 0) {
            t.failed += 1;
            rs_store_relaxed(&r.cb->failed, t.failed);
            rs_store_relaxed(&r.cb->last_error, m.error);
        }
        __syncthreads();
        return;
    }
    if (threadIdx.x == 0) {
        if (m.out_len > r.message_size) {
            rs_store_relaxed(&r.cb->last_error, rs_error(RS_ERROR_RESULT_TOO_LARGE, m.out_len));
            m.pushed = 0;
        } else {
            m.pushed = rs_output_room(r, t) ? 1 : 0;
        }
        if (m.pushed) {
            m.out_slot = r.out_slots + (t.out_head & r.mask) * r.slot_size;
        } else {
            t.dropped += 1;
            rs_store_relaxed(&r.cb->dropped, t.dropped);
        }
    }
    __syncthreads();
    if (!m.pushed) {
        return;
    }

    const u64* result = K::in_place ? in : r.staging_out();
    volatile u64* dst = (volatile u64*)(m.out_slot + RS_SLOT_HEADER);
    u32 out_words = (m.out_len + 7) / 8;
    for (u32 i = threadIdx.x; i < out_words; i += blockDim.x) {
        dst[i] = result[i];
    }
    // Each writer orders its own words before the barrier (thread 0 fences after writing the
    // header), so the head published below covers every word, whatever the fence's reach.
    if (threadIdx.x != 0 && threadIdx.x < out_words) {
        rs_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        *(volatile u64*)m.out_slot = (u64)m.out_len << RS_TIME_BITS | m.stamp;
        // Enqueue-to-completion in the device clock; the host stamped the enqueue time with
        // its calibrated offset. A negative difference (calibration error) counts as 0.
        u64 latency = (rs_now() - m.stamp) & RS_TIME_MASK;
        if (latency >> (RS_TIME_BITS - 1)) {
            latency = 0;
        }
        t.min_latency = t.processed == 0 || latency < t.min_latency ? latency : t.min_latency;
        t.max_latency = latency > t.max_latency ? latency : t.max_latency;
        t.processed += 1;
        t.total_latency += latency;
        t.bytes_in += m.len;
        t.bytes_out += m.out_len;
        u32 bucket = rs_bucket_of(latency);
        u64 count = r.telemetry_histogram()[bucket] + 1;
        r.telemetry_histogram()[bucket] = count;
        ControlBlock* cb = r.cb;
        rs_store_relaxed(&cb->histogram[bucket], count);
        rs_store_relaxed(&cb->processed, t.processed);
        rs_store_relaxed(&cb->total_latency_ns, t.total_latency);
        rs_store_relaxed(&cb->min_latency_ns, t.min_latency);
        rs_store_relaxed(&cb->max_latency_ns, t.max_latency);
        rs_store_relaxed(&cb->bytes_in, t.bytes_in);
        rs_store_relaxed(&cb->bytes_out, t.bytes_out);
        // Publish: the slot (written by the whole block, ordered by __syncthreads) and the
        // telemetry before the new head.
        rs_fence();
        t.out_head += 1;
        rs_store_relaxed(&r.out->head, t.out_head);
    }
    __syncthreads();
}

enum : u64 { RS_OP_IDLE = 0, RS_OP_PROCESS = 1, RS_OP_EXIT = 2, RS_OP_ABORT = 3 };

/// The persistent loop: polls the control word and the input ring until told to stop.
template <class K>
__device__ void rs_persistent(ControlBlock* cb, RingIndices* in, unsigned char* in_slots, RingIndices* out,
                              unsigned char* out_slots, u64* state) {
    __shared__ Message m;
    __shared__ Rings shared_rings;
    Thread0 t;
    u64 head_seen = 0;
    u64 control_seen = ~0ull;
    u32 idle = 0;
    if (threadIdx.x == 0) {
        shared_rings = rs_rings(cb, in, in_slots, out, out_slots, state);
        t.load(shared_rings);
        head_seen = t.in_tail;
    }
    __syncthreads();
    const Rings r = shared_rings;

    for (;;) {
        if (threadIdx.x == 0) {
            // The control word first, with acquire: the host publishes messages (head) before
            // a stop request (control), so a head read after it is at least as new as the one
            // the request was made after -- a drain cannot miss what was sent before it, nor
            // an abort undercount what it drops. The fence then acquires the new slots.
            u64 control = rs_load_acquire(&cb->control);
            u64 head = rs_load_relaxed(&r.in->head);
            if (head != head_seen) {
                rs_fence();
            }
            head_seen = head;
            if (control != control_seen) {
                u64 calibration = (control >> RS_CONTROL_CALIBRATION_SHIFT) & 0xffff;
                if (calibration != ((control_seen >> RS_CONTROL_CALIBRATION_SHIFT) & 0xffff)) {
                    rs_store_relaxed(&cb->calibration_gpu_ns, rs_now());
                    rs_store_release(&cb->calibration_reply, calibration);
                }
                rs_store_release(&cb->seen, control);
                control_seen = control;
            }
            u64 lifecycle = control & 0xff;
            u64 stop = (control >> RS_CONTROL_STOP_SHIFT) & 0xff;
            bool running = lifecycle == RS_STATE_ACTIVE || (stop == RS_STOP_DRAIN && lifecycle == RS_STATE_TERMINATING);
            // A state outside the lifecycle the loop serves (Failed: the host gave up waiting
            // for it) means: stop now, whatever is queued.
            bool alive = lifecycle == RS_STATE_LAUNCHED || lifecycle == RS_STATE_ACTIVE ||
                         lifecycle == RS_STATE_DEACTIVATED || lifecycle == RS_STATE_TERMINATING;
            u64 op = RS_OP_IDLE;
            if (stop == RS_STOP_ABORT || !alive) {
                op = RS_OP_ABORT;
            } else if (running && t.in_tail != head) {
                op = RS_OP_PROCESS;
            } else if (stop == RS_STOP_DRAIN && t.in_tail == head) {
                op = RS_OP_EXIT;
            }
            if (op == RS_OP_ABORT) {
                // What is still queued will never be processed.
                t.dropped += head - t.in_tail;
                rs_store_relaxed(&cb->dropped, t.dropped);
                t.in_tail = head;
                rs_store_release(&r.in->tail, t.in_tail);
            }
            if (op == RS_OP_IDLE) {
                // Right after work, spin: more is likely. Then poll gently; when not running,
                // a control change is all that can come, and 10 us is soon enough for it.
                idle += 1;
                if (!running) {
                    rs_sleep(10000);
                } else if (idle > RS_SPIN_POLLS) {
                    rs_sleep(1000);
                }
            } else {
                idle = 0;
            }
            m.op = op;
        }
        __syncthreads();
        u64 op = m.op;
        if (op == RS_OP_EXIT || op == RS_OP_ABORT) {
            break;
        }
        if (op == RS_OP_PROCESS) {
            rs_process<K>(r, m, t);
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        t.save(r);
        rs_store_release(&cb->exited, 1);
    }
}

/// One launch that processes what is queued when it starts, then returns: the baseline the
/// persistent kernel is measured against (launch per message, or a CUDA graph of it).
template <class K>
__device__ void rs_once(ControlBlock* cb, RingIndices* in, unsigned char* in_slots, RingIndices* out,
                        unsigned char* out_slots, u64* state) {
    __shared__ Message m;
    __shared__ Rings shared_rings;
    __shared__ u64 queued;
    Thread0 t;
    if (threadIdx.x == 0) {
        shared_rings = rs_rings(cb, in, in_slots, out, out_slots, state);
        t.load(shared_rings);
        queued = rs_load_acquire(&in->head) - t.in_tail;
    }
    __syncthreads();
    const Rings r = shared_rings;
    u64 n = queued;
    for (u64 i = 0; i < n; i++) {
        rs_process<K>(r, m, t);
    }
    if (threadIdx.x == 0) {
        t.save(r);
    }
}

#define RS_KERNEL_ENTRIES(NAME, K)                                                                              \
    extern "C" __global__ void __launch_bounds__(RS_THREADS)                                                   \
        ringside_##NAME(ControlBlock* cb, RingIndices* in, unsigned char* in_slots, RingIndices* out,          \
                        unsigned char* out_slots, u64* state) {                                                \
        rs_persistent<K>(cb, in, in_slots, out, out_slots, state);                                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(RS_THREADS)                                                   \
        ringside_##NAME##_once(ControlBlock* cb, RingIndices* in, unsigned char* in_slots, RingIndices* out,   \
                               unsigned char* out_slots, u64* state) {                                         \
        rs_once<K>(cb, in, in_slots, out, out_slots, state);                                                   \
    }

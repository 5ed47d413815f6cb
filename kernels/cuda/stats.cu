// stats: input f32 samples; keeps a streaming histogram of every sample seen and answers with
// [count: u64][mean, p50, p90, p99, max: f32]. Twin of `Stats` in kernels/src/builtin.rs, and
// bit for bit the same: samples are scaled by RS_STATS_SCALE and truncated as Rust's `as u64`
// does (saturating), the sum is a double added in sample order by one thread, and quantiles
// are bucket midpoints found the way telemetry.rs's quantiles_of finds them, kept within the
// largest sample.
//
// Kernel state (device memory): [0] count, [1] sum (double bits), [2] max (float bits); the
// histogram is the kernel histogram, RS_BUCKETS counts.

__device__ __forceinline__ bool rs_is_valid_sample(float x) {
    // Finite (exponent not all ones) and not below zero (-0.0 is not below zero).
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u && !(x < 0.0f);
}

struct Stats {
    static constexpr bool in_place = false;

    __device__ static void process(Message& m, const u64* in, u64* out, u64* state, u64* histogram) {
        u32 len = m.len;
        if (len % 4 != 0) {
            if (threadIdx.x == 0) {
                m.error = rs_error(RS_ERROR_NOT_WHOLE_F32, len);
            }
            __syncthreads();
            return;
        }
        const float* samples = (const float*)in;
        u32 n = len / 4;

        // Samples before the first invalid one are recorded, as the CPU twin's loop does.
        if (threadIdx.x == 0) {
            m.first_bad = n;
        }
        __syncthreads();
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
            if (!rs_is_valid_sample(samples[i])) {
                atomicMin(&m.first_bad, i);
            }
        }
        __syncthreads();
        u32 valid = m.first_bad;
        for (u32 i = threadIdx.x; i < valid; i += blockDim.x) {
            u64 scaled = __float2ull_rz(__fmul_rn(samples[i], RS_STATS_SCALE));
            atomicAdd(&histogram[rs_bucket_of(scaled)], 1ull);
        }
        if (threadIdx.x == 0) {
            u64 count = state[0];
            double sum = __longlong_as_double((long long)state[1]);
            float max = __uint_as_float((u32)state[2]);
            for (u32 i = 0; i < valid; i++) {
                float x = samples[i];
                count += 1;
                sum += (double)x;
                if (x > max) {
                    max = x;
                }
            }
            state[0] = count;
            state[1] = (u64)__double_as_longlong(sum);
            state[2] = __float_as_uint(max);
        }
        __syncthreads();

        if (threadIdx.x == 0) {
            if (valid < n) {
                m.error = rs_error(RS_ERROR_STATS_SAMPLE, __float_as_uint(samples[valid]));
            } else {
                u64 count = state[0];
                double sum = __longlong_as_double((long long)state[1]);
                float max = __uint_as_float((u32)state[2]);
                const double qs[3] = {0.5, 0.9, 0.99};
                u64 ranks[3];
                float at[3] = {0.0f, 0.0f, 0.0f};
                for (int k = 0; k < 3; k++) {
                    // ceil(q * count), at least 1, as (q * total as f64).ceil() as u64 .max(1).
                    double x = qs[k] * (double)count;
                    u64 rank = (u64)x;
                    if ((double)rank < x) {
                        rank += 1;
                    }
                    ranks[k] = rank < 1 ? 1 : rank;
                }
                if (count > 0) {
                    u64 seen = 0;
                    int k = 0;
                    for (u32 bucket = 0; bucket < RS_BUCKETS && k < 3; bucket++) {
                        seen += histogram[bucket];
                        while (k < 3 && seen >= ranks[k]) {
                            u64 low = rs_bucket_floor(bucket);
                            u64 high = bucket + 1 < RS_BUCKETS ? rs_bucket_floor(bucket + 1) : low;
                            u64 mid = low + (high > low ? high - low : 0) / 2;
                            // Within the largest sample, as the twin's f32::min.
                            at[k] = fminf(__fdiv_rn(__ull2float_rn(mid), RS_STATS_SCALE), max);
                            k++;
                        }
                    }
                }
                float mean = count == 0 ? 0.0f : __double2float_rn(sum / (double)count);
                out[0] = count;
                float* f = (float*)(out + 1);
                f[0] = mean;
                f[1] = at[0];
                f[2] = at[1];
                f[3] = at[2];
                f[4] = max;
                m.out_len = 8 + 5 * 4;
            }
        }
        __syncthreads();
    }
};

RS_KERNEL_ENTRIES(stats, Stats)

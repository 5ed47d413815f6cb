// saxpy: input [a][x0, y0, x1, y1, ...] (f32, little-endian); answers a * x + y for each pair.
// Twin of `Saxpy` in kernels/src/builtin.rs: the same checks in the same order, and a * x + y
// rounded twice (multiply, then add), never fused, as Rust computes it.

struct Saxpy {
    static constexpr bool in_place = false;

    __device__ static void process(Message& m, const u64* in, u64* out, u64*, u64*) {
        u32 len = m.len;
        u64 error = 0;
        u32 n = len / 4;
        if (len % 4 != 0) {
            error = rs_error(RS_ERROR_NOT_WHOLE_F32, len);
        } else if (n == 0) {
            error = rs_error(RS_ERROR_SAXPY_NO_A, 0);
        } else if ((n - 1) % 2 != 0) {
            error = rs_error(RS_ERROR_SAXPY_UNPAIRED, 0);
        }
        if (error == 0) {
            const float* v = (const float*)in;
            float* result = (float*)out;
            float a = v[0];
            u32 pairs = (n - 1) / 2;
            for (u32 i = threadIdx.x; i < pairs; i += blockDim.x) {
                result[i] = __fadd_rn(__fmul_rn(a, v[1 + 2 * i]), v[2 + 2 * i]);
            }
        }
        if (threadIdx.x == 0) {
            m.error = error;
            m.out_len = error == 0 ? 4 * ((n - 1) / 2) : 0;
        }
        __syncthreads();
    }
};

RS_KERNEL_ENTRIES(saxpy, Saxpy)

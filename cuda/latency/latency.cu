// Pointer chasing: the latency of one load per memory level.
//
// One thread follows a chain of dependent loads, j = next[j]: each load's address is the
// value the previous load returned, so no two loads overlap and the time per step is the
// latency of one load from wherever the chain lives. The host builds the chain (a random
// single cycle through nodes `stride` bytes apart, so every step touches a new cache line)
// and stores, for each node, where the next one is: a device pointer for the global
// chains, a byte offset for the shared and constant chains.
//
// Every launch continues where the previous one stopped (state[0] holds the byte offset of
// the current node), first walks `warm` steps untimed (so a chain small enough for L1 or
// the constant cache is resident: they start empty in each launch), then times `steps`
// steps with the SM's cycle counter (clock64) and the global nanosecond timer
// (%globaltimer) around the same loop. It writes [start offset, final offset, cycles, ns]
// to slots[4 * slot ...]: the host follows the same chain on the CPU from the start and
// must land on the final offset (the correctness check, and what keeps the loads alive).
//
// The clocks are read when the instruction issues, right after the last load of the
// previous loop issues; so the first timed load waits for the last untimed one and the last
// timed load completes after the second reading: the interval is exactly `steps` latencies.
// Every load is inline PTX (asm volatile), in program order with the clock readings.

#define SHARED_MAX_BYTES 32768
#define CONSTANT_MAX_BYTES 65536

__constant__ unsigned int latency_constant_chain[CONSTANT_MAX_BYTES / 4];

__device__ __forceinline__ unsigned long long clock_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}

__device__ __forceinline__ unsigned long long globaltimer_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
    return t;
}

// Default caching (L1 and L2): what a plain load of global memory does.
struct GlobalCa {
    __device__ __forceinline__ unsigned long long operator()(unsigned long long p) const
    {
        unsigned long long r;
        asm volatile("ld.global.ca.u64 %0, [%1];" : "=l"(r) : "l"(p) : "memory");
        return r;
    }
};

// Cache global: L2 only, bypassing L1.
struct GlobalCg {
    __device__ __forceinline__ unsigned long long operator()(unsigned long long p) const
    {
        unsigned long long r;
        asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(r) : "l"(p) : "memory");
        return r;
    }
};

// The chain holds shared-window addresses (converted once, when it is copied in).
struct Shared {
    __device__ __forceinline__ unsigned int operator()(unsigned int p) const
    {
        unsigned int r;
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r) : "r"(p) : "memory");
        return r;
    }
};

// The chain holds byte offsets into latency_constant_chain: one LDC with a register index.
struct Constant {
    __device__ __forceinline__ unsigned int operator()(unsigned int p) const
    {
        unsigned int r;
        asm volatile("{\n\t.reg .u64 a, b;\n\t"
                     "mov.u64 b, latency_constant_chain;\n\t"
                     "cvt.u64.u32 a, %1;\n\t"
                     "add.u64 a, a, b;\n\t"
                     "ld.const.u32 %0, [a];\n\t}"
                     : "=r"(r) : "r"(p) : "memory");
        return r;
    }
};

// Walks warm + steps steps from p, timing the last `steps`; returns where it stopped.
template <class Step, class T>
__device__ __forceinline__ T chase(Step step, T p, int warm, int steps,
                                   unsigned long long* cycles, unsigned long long* ns)
{
    for (int i = 0; i < warm; ++i)
        p = step(p);
    unsigned long long c0 = clock_now();
    unsigned long long g0 = globaltimer_now();
#pragma unroll 8
    for (int i = 0; i < steps; ++i)
        p = step(p);
    unsigned long long c1 = clock_now();
    unsigned long long g1 = globaltimer_now();
    *cycles = c1 - c0;
    *ns = g1 - g0;
    return p;
}

__device__ __forceinline__ void record(unsigned long long* state, unsigned long long* slots,
                                       int slot, unsigned long long start,
                                       unsigned long long final_offset,
                                       unsigned long long cycles, unsigned long long ns)
{
    unsigned long long* out = slots + 4 * (long long)slot;
    out[0] = start;
    out[1] = final_offset;
    out[2] = cycles;
    out[3] = ns;
    state[0] = final_offset;
}

template <class Step>
__device__ __forceinline__ void chase_global_impl(const unsigned long long* chain,
                                                  unsigned long long* state,
                                                  unsigned long long* slots, int slot,
                                                  int warm, int steps)
{
    unsigned long long base = (unsigned long long)chain;
    unsigned long long start = state[0];
    unsigned long long cycles, ns;
    unsigned long long p = chase(Step(), base + start, warm, steps, &cycles, &ns);
    record(state, slots, slot, start, p - base, cycles, ns);
}

// Launch with one block of one thread.
extern "C" __global__ void chase_global(const unsigned long long* chain,
                                        unsigned long long* state,
                                        unsigned long long* slots, int slot, int warm,
                                        int steps)
{
    chase_global_impl<GlobalCa>(chain, state, slots, slot, warm, steps);
}

extern "C" __global__ void chase_global_cg(const unsigned long long* chain,
                                           unsigned long long* state,
                                           unsigned long long* slots, int slot, int warm,
                                           int steps)
{
    chase_global_impl<GlobalCg>(chain, state, slots, slot, warm, steps);
}

// Launch with one block of any size: its threads copy the chain (nwords 32-bit words of
// byte offsets, at most SHARED_MAX_BYTES) into shared memory, then thread 0 chases alone.
extern "C" __global__ void chase_shared(const unsigned int* chain, int nwords,
                                        unsigned long long* state,
                                        unsigned long long* slots, int slot, int warm,
                                        int steps)
{
    __shared__ unsigned int s[SHARED_MAX_BYTES / 4];
    unsigned int sbase = (unsigned int)__cvta_generic_to_shared(s);
    for (int i = threadIdx.x; i < nwords; i += blockDim.x)
        s[i] = sbase + chain[i];
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    unsigned int start = (unsigned int)state[0];
    unsigned long long cycles, ns;
    unsigned int p = chase(Shared(), sbase + start, warm, steps, &cycles, &ns);
    record(state, slots, slot, start, p - sbase, cycles, ns);
}

// The chain is set from the host in latency_constant_chain (byte offsets). One thread.
extern "C" __global__ void chase_constant(unsigned long long* state,
                                          unsigned long long* slots, int slot, int warm,
                                          int steps)
{
    unsigned int start = (unsigned int)state[0];
    unsigned long long cycles, ns;
    unsigned int p = chase(Constant(), start, warm, steps, &cycles, &ns);
    record(state, slots, slot, start, p, cycles, ns);
}

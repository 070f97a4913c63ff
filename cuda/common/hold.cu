// Holds a stream so the launches behind it queue up before any of them runs: the harness's
// queued timing (cudalab/gpu.py QueuedEventTimer). One thread spins on flag[0], a word of
// host-mapped memory the host sets to release the stream. The clock64() timeout bounds the
// hold when the host blocks (a stalled process, a fn that synchronizes): the kernel then
// writes flag[1] = 1 and returns, and the host discards that sample.
extern "C" __global__ void hold(volatile int *flag, long long timeout_cycles)
{
    const long long t0 = clock64();
    while (flag[0] == 0) {
        if (clock64() - t0 > timeout_cycles) {
            flag[1] = 1;
            break;
        }
    }
}

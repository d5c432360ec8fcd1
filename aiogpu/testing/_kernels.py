"""Hand-written PTX for the test instruments on a GPU: no compiler needed.

The driver JIT-compiles PTX for whatever GPU it runs on, so these load on any device of
compute capability 7.0 or newer (``nanosleep`` needs 7.0).
"""

from __future__ import annotations

SPIN_KERNEL = "aiogpu_spin"
HOLD_KERNEL = "aiogpu_hold"
FAULT_KERNEL = "aiogpu_fault"
NAMES = (SPIN_KERNEL, HOLD_KERNEL, FAULT_KERNEL)

PTX = b"""
.version 7.0
.target sm_70
.address_size 64

// Busy-wait on the device for duration_ns nanoseconds (one thread is enough).
.visible .entry aiogpu_spin(.param .u64 duration_ns)
{
    .reg .pred %p;
    .reg .u64 %start, %now, %elapsed, %duration;
    ld.param.u64 %duration, [duration_ns];
    mov.u64 %start, %globaltimer;
SPIN:
    nanosleep.u32 1000;
    mov.u64 %now, %globaltimer;
    sub.u64 %elapsed, %now, %start;
    setp.lt.u64 %p, %elapsed, %duration;
    @%p bra SPIN;
    ret;
}

// Spin until the 32-bit word at flag (mapped pinned host memory) is non-zero: the Latch. A
// running kernel holds its stream the way real work does; a stream memory wait
// (cuStreamWaitValue32) would also stall other streams' work queued behind it in the same
// hardware queue, work the test never meant to hold.
.visible .entry aiogpu_hold(.param .u64 flag)
{
    .reg .pred %p;
    .reg .u64 %flag;
    .reg .u32 %value;
    ld.param.u64 %flag, [flag];
HOLD:
    ld.relaxed.sys.global.u32 %value, [%flag];
    setp.ne.u32 %p, %value, 0;
    @%p bra DONE;
    nanosleep.u32 1000;
    bra HOLD;
DONE:
    ret;
}

// Store to an address that is not mapped: CUDA_ERROR_ILLEGAL_ADDRESS, a sticky context error.
.visible .entry aiogpu_fault(.param .u64 address)
{
    .reg .u64 %address;
    .reg .u32 %value;
    ld.param.u64 %address, [address];
    mov.u32 %value, 1;
    st.global.u32 [%address], %value;
    ret;
}
\x00"""

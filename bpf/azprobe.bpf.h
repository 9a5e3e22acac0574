/* BPF-only helpers of bpf/azprobe.bpf.c (the libbpf-tools split: record layouts shared
 * with Python live in azprobe.h, code that only the kernel side runs lives here). Plain
 * C, so tests/unit/test_agent_bucket_c.py compiles the bucket arithmetic natively too. */
#ifndef AZPROBE_BPF_H
#define AZPROBE_BPF_H

#include "azprobe.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/* floor(log2(v)) for v > 0, branchless as in libbpf-tools' bits.bpf.h. */
static __always_inline u64 azp_log2_32(u32 v)
{
    u32 shift, r;
    r = (v > 0xFFFF) << 4; v >>= r;
    shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
    shift = (v > 0xF) << 2; v >>= shift; r |= shift;
    shift = (v > 0x3) << 1; v >>= shift; r |= shift;
    r |= (v >> 1);
    return r;
}

static __always_inline u64 azp_log2_64(u64 v)
{
    u32 hi = v >> 32;
    if (hi)
        return azp_log2_32(hi) + 32;
    return azp_log2_32((u32)v);
}

/* The bucket index of sketch.bucket_index(v). */
static __always_inline u32 azp_bucket_index(u64 v)
{
    const u64 max_value = (1ULL << AZP_MAX_VALUE_BITS) - 1;
    if (v > max_value)
        v = max_value;
    if (v < (1 << AZP_SUB_BUCKET_BITS))
        return (u32)v;
    u64 octave = azp_log2_64(v);
    u64 sub = (v >> (octave - AZP_SUB_BUCKET_BITS)) & ((1 << AZP_SUB_BUCKET_BITS) - 1);
    return (u32)((octave - AZP_SUB_BUCKET_BITS + 1) * (1 << AZP_SUB_BUCKET_BITS) + sub);
}

/* The host RTT bucket (host_rtt_bucket) of a value whose sketch bucket is `index`:
 * bucket i holds values below 256 us x 4^i, so it follows from the value's octave, which
 * the index carries (index / 16 + 3 from 16 us up): tcp_probe pays two shifts for it. */
static __always_inline u32 azp_host_rtt_bucket(u32 index)
{
    u32 octave = index < (1U << AZP_SUB_BUCKET_BITS) ? 0 : (index >> AZP_SUB_BUCKET_BITS) + AZP_SUB_BUCKET_BITS - 1;
    if (octave < AZP_HOST_RTT_FIRST_OCTAVE)
        return 0;
    u32 bucket = (octave - AZP_HOST_RTT_FIRST_OCTAVE) / 2 + 1;
    return bucket < AZP_HOST_RTT_BUCKETS - 1 ? bucket : AZP_HOST_RTT_BUCKETS - 1;
}

#endif /* AZPROBE_BPF_H */

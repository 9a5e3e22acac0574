/* Record layouts and constants shared by bpf/azprobe.bpf.c and the Python agent (the
 * libbpf-tools split: this header holds only what both sides read; BPF-only helpers are
 * in azprobe.bpf.h).
 *
 * The agent reads the `#define AZP_*` integer constants from this file (azprobe.bpf.constant, bpf/__init__.py),
 * so a constant changes in one place only. Map keys and values reach Python through
 * BCC, which builds ctypes from these structs. Keep every struct 8-byte aligned: BCC's
 * per-CPU readers require it.
 */
#ifndef AZPROBE_H
#define AZPROBE_H

/* AZ ids: 0 is "other" (destination outside the topology); 1..AZP_MAX_AZ-1 are AZs.
 * Small on purpose: the RTT histogram is a dense per-CPU array of paths x buckets. */
#define AZP_MAX_AZ 16
#define AZP_AZ_OTHER 0
#define AZP_MAX_PREFIXES 4096      /* LPM trie entries (CIDRs over all AZs) */
#define AZP_MAX_PATHS 256          /* AZP_MAX_AZ * AZP_MAX_AZ */
/* Per-socket state the state-change handlers keep in arrays indexed by a hash of the
 * socket's id, not in hash maps: an LRU-hash update, lookup or delete cost ~250-
 * 350 ns each here, an array slot one line (docs/probe.md "What a connection costs").
 * Connects in flight: 1 << AZP_CONNECT_SET_BITS sets of 2 slots (32 bytes each, a set is one
 * line); a connect that finds both slots of its set held is not tracked (counted in
 * probe_stats.untracked_connects). 64 KB. */
#ifndef AZP_CONNECT_SET_BITS /* the agent passes it (Probe.load); tests shrink it */
#define AZP_CONNECT_SET_BITS 10
#endif
#define AZP_CONNECT_SLOTS (2 << AZP_CONNECT_SET_BITS)
/* A slot held longer than this is free again: its socket's outcome was never seen (the
 * program was loaded mid-connect, or a transition was missed). Longer than the kernel's
 * longest SYN retry sequence (tcp_syn_retries 6: ~127 s). */
#define AZP_CONNECT_EXPIRY_S 180
/* Sockets inside a Loss episode (`in_loss`): one socket id per slot, 4096 x 8
 * bytes = 32 KB, so the kernel allocates it with kmalloc, not vmalloc (see the flow
 * cache below). */
#define AZP_LOSS_SLOT_BITS 12
#define AZP_LOSS_SLOTS 4096 /* 1 << AZP_LOSS_SLOT_BITS */
#define AZP_MAX_NODE_ADDRS 64      /* [node] addresses: this node's local addresses */
/* Flows this node opened (local address, remote address, remote port), found by
 * tcp_probe without a hash-map lookup: a direct-mapped array. Few distinct endpoints
 * keep its lines hot in cache, unlike any per-socket table; and at 512 x 40 bytes the
 * kernel allocates it with kmalloc (<= 32 KB), not vmalloc: measured ~50 ns cheaper
 * per event here (fewer TLB misses). */
#define AZP_FLOW_CACHE_BITS 9
#define AZP_FLOW_CACHE_SLOTS 512 /* 1 << AZP_FLOW_CACHE_BITS */
/* The helper id tcp_probe's tp_btf handler calls for the kfunc bpf_rdonly_cast, which
 * BCC cannot emit; the agent links it to the kfunc before loading. No helper has it. */
#define AZP_KFUNC_RDONLY_CAST 32752
/* Per destination host ([agent] max_hosts; docs/probe.md "Hosts"): a per-CPU hash keyed
 * (path, destination address) of at most AZP_MAX_HOSTS entries, for destinations in the
 * topology. A connect to a host the full table has no room for is not inserted and is
 * counted in probe_stats.hosts_dropped. 0 compiles the host code out. */
#ifndef AZP_MAX_HOSTS /* the agent passes it (Probe.load) */
#define AZP_MAX_HOSTS 256
#endif
/* A host's RTT sketch, azprobe/contracts/window.py host_rtt_bucket: bucket i counts srtt
 * samples below 2^AZP_HOST_RTT_FIRST_OCTAVE (256) us x 4^i, the last one everything above. */
#define AZP_HOST_RTT_BUCKETS 8
#define AZP_HOST_RTT_FIRST_OCTAVE 8
/* Event ring buffer (BPF_MAP_TYPE_RINGBUF), in pages: a power of two. */
#define AZP_RINGBUF_PAGES 64

/* loglin-16, exactly azprobe/contracts/sketch.py: < 16 exact; then 16 linear sub-buckets per octave. */
#define AZP_SUB_BUCKET_BITS 4
#define AZP_MAX_VALUE_BITS 34
#define AZP_NUM_BUCKETS 512

/* Histogram kinds (the agent's Snapshot keys: (path, kind)). */
#define AZP_HIST_RTT 1
#define AZP_HIST_CONNECT 2

/* Event kinds on the ring buffer (azp_event.kind). */
#define AZP_EV_SYN_RETRANS 1
#define AZP_EV_RTO 2          /* data RTO: entry into TCP_CA_Loss outside SYN_SENT */
#define AZP_EV_SYN_RTO 3      /* SYN timeout: entry into TCP_CA_Loss in SYN_SENT */
#define AZP_EV_CONN_REFUSED 4 /* SYN_SENT -> CLOSE after an RST */
#define AZP_EV_CONN_TIMEOUT 5 /* SYN_SENT -> CLOSE without an RST */

/* Kernel values the program compares tracepoint fields with (stable UAPI/ABI). */
#define AZP_TCP_ESTABLISHED 1
#define AZP_TCP_SYN_SENT 2
#define AZP_TCP_CLOSE 7
#define AZP_TCP_CA_LOSS 4
#define AZP_IPPROTO_TCP 6
#define AZP_AF_INET 2
#define AZP_AF_INET6 10
#define AZP_EEXIST 17 /* bpf_map_update_elem(BPF_NOEXIST) on a key another CPU just inserted */

/* One LPM key serves IPv4 and IPv6: IPv4 is stored as ::ffff:a.b.c.d (prefix + 96). */
struct azp_lpm_key {
    u32 prefixlen;
    u8 addr[16];
};

/* Per-agent settings the program reads: the agent's own AZ for unknown sources. */
struct azp_config {
    u32 own_az;
    u32 pad;
};

/* Per-CPU cumulative counters per path; key = src_az * AZP_MAX_AZ + dst_az. */
struct azp_path_counters {
    u64 conn_attempts;
    u64 conn_ok;
    u64 conn_refused;
    u64 conn_timeout;
    u64 syn_retrans;
    u64 retrans;
    u64 rto;       /* data RTOs: entries into Loss outside SYN_SENT */
    u64 syn_rto;   /* SYN timeouts: entries into Loss while SYN_SENT */
};

/* One slot of the flow cache. Addresses as two u64 halves of the 16-byte (IPv4:
 * ::ffff:a.b.c.d) form; valid == 0 is an empty slot. */
struct azp_flow_slot {
    u64 saddr_hi;
    u64 saddr_lo;
    u64 daddr_hi;
    u64 daddr_lo;
    u16 dport;
    u16 valid;
    u32 path;
};

/* Program-wide counters (a one-element per-CPU array). */
struct azp_probe_stats {
    u64 ring_drops;   /* events the ring buffer had no room for */
    u64 untracked_connects; /* connects whose set in `connecting` was full: no outcome counted */
    u64 hosts_dropped; /* connects to a host the full `hosts` table had no room for */
};

/* A destination host of one path: a key of `hosts`. Addresses as elsewhere (IPv4 as
 * ::ffff:a.b.c.d); pad is 0. */
struct azp_host_key {
    u32 path;
    u32 pad;
    u8 addr[16];
};

/* Per-CPU cumulative counters of one host (a value of `hosts`). */
struct azp_host_counters {
    u64 connects; /* connects started (SYN_SENT) */
    u64 failures; /* connects refused or timed out */
    u64 retrans;
    u64 rto;      /* data RTOs, as the path's rto */
};

/* srtt samples of one flow-cache slot's flow by host RTT bucket (`flow_rtt`, per CPU):
 * tcp_probe already holds the slot, so a host's RTT costs it no hash lookup; the agent
 * files each slot's samples under the host the slot holds (agent/hosts.py). 64 bytes:
 * one line per slot. */
struct azp_host_rtt {
    u64 buckets[AZP_HOST_RTT_BUCKETS];
};

/* One path's histogram, counts by sketch bucket index: an array element per path, so a
 * handler touches one line of one row (rtt_rows: per-CPU; connect_rows: shared). */
struct azp_hist_row {
    u64 buckets[AZP_NUM_BUCKETS];
};

/* A socket between SYN_SENT and ESTABLISHED/CLOSE: a slot of `connecting`. */
struct azp_connect_slot {
    u64 sock_id;   /* the socket's id (azprobe.bpf.c sock_slot); 0: free */
    u64 ts_ns;     /* when it entered SYN_SENT */
    u32 path;
    u32 got_reset; /* an RST arrived while in SYN_SENT: the coming CLOSE is a refusal */
    u64 pad;       /* 32 bytes: the two slots of a set share a line */
};

struct azp_event {
    u64 ts_ns;
    u8 saddr[16]; /* IPv4 as ::ffff:a.b.c.d */
    u8 daddr[16];
    u16 sport;
    u16 dport;
    u16 family;
    u8 kind;
    u8 pad;
    u32 path;
    u32 pad2;
};

#endif /* AZPROBE_H */

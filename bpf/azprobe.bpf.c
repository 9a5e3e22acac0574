/* azprobe: per-path (source AZ -> destination AZ) TCP health from tracepoints only.
 *
 * Only tracepoint context fields are read (BCC builds the `args` structs from tracefs):
 * the installed kernel headers belong to another kernel, so struct sock offsets from
 * them would be wrong. Maps are per-CPU and cumulative; the agent sums CPUs and takes
 * deltas each interval. Dense ids (paths 0..AZP_MAX_PATHS-1) index per-CPU arrays: an
 * inlined lookup, no hashing, no lookup_or_try_init. Handlers never nest on one CPU (the
 * kernel skips a tracepoint program while another runs there), so per-CPU values take
 * plain increments.
 */
#include "azprobe.bpf.h"

#ifndef AZP_RTT_SAMPLE_MASK
#define AZP_RTT_SAMPLE_MASK 0 /* every segment: the agent passes rtt_sample_ticks - 1 */
#endif

BPF_LPM_TRIE(az_trie, struct azp_lpm_key, u32, AZP_MAX_PREFIXES);
BPF_ARRAY(agent_config, struct azp_config, 1);
BPF_PERCPU_ARRAY(path_counters, struct azp_path_counters, AZP_MAX_PATHS);
/* Connect latency per path: one shared (not per-CPU) row per path, 1 MB in all, added to
 * atomically. It was a per-CPU hash with lookup_or_try_init: ~100-150 ns more per
 * connect measured, and memory that grew with the CPU count. */
BPF_ARRAY(connect_rows, struct azp_hist_row, AZP_MAX_PATHS);
/* Connects in flight and sockets inside a Loss episode, in arrays indexed by a hash of
 * the socket's address (sock_slot): each test is one line, where a hash-map operation
 * cost ~300 ns here (docs/probe.md "What a connection costs"). What a full set or a
 * collision costs is stated at each. */
BPF_ARRAY(connecting, struct azp_connect_slot, AZP_CONNECT_SLOTS);
BPF_ARRAY(in_loss, u64, AZP_LOSS_SLOTS);
/* Flows this node opened (SYN_SENT -> ESTABLISHED) toward an AZ of the topology:
 * (local address, remote address, remote port) -> path. tcp_probe, the hot handler (every
 * received segment), only looks here with one inlined array lookup (no hash map, no LPM).
 * So the RTT of a path is that of connections this node opens *to* the destination AZ;
 * sockets accepted from clients (their remote port is ephemeral) do not match. The
 * mapping only depends on the topology, so entries need no expiry; the agent empties the
 * array when it reloads the topology. */
BPF_ARRAY(flow_cache, struct azp_flow_slot, AZP_FLOW_CACHE_SLOTS);
BPF_PERCPU_ARRAY(rtt_rows, struct azp_hist_row, AZP_MAX_PATHS);
BPF_PERCPU_ARRAY(probe_stats, struct azp_probe_stats, 1);
BPF_RINGBUF_OUTPUT(events, AZP_RINGBUF_PAGES);



/* ---- node addresses (issue 9: one agent per node) ------------------------------------
 * Which sockets belong to this node. The tracepoints are global: on a host with several
 * network namespaces (the lab's client nodes) every agent's program sees every socket.
 * node_addrs holds this node's local addresses (16-byte form, IPv4 as ::ffff:a.b.c.d),
 * filled by the agent from `[node] addresses`; node_filter[0] != 0 turns the check on.
 * Off (the default, `addresses` empty): every socket this kernel sees is the node's, as
 * on a real host. The check runs where a socket is first attributed to a path (connect
 * start, retransmit, RTO); the later handlers only find sockets that passed it
 * (`connecting`, `flow_cache`). */
struct azp_node_addr {
    u8 addr[16];
};
BPF_HASH(node_addrs, struct azp_node_addr, u8, AZP_MAX_NODE_ADDRS);
BPF_ARRAY(node_filter, u32, 1);

/* True when the socket with local address `saddr16` belongs to this node. */
static __always_inline int node_owns(const u8 *saddr16)
{
    u32 zero = 0;
    u32 *on = node_filter.lookup(&zero);
    if (!on || !*on)
        return 1;
    struct azp_node_addr key = {};
    __builtin_memcpy(key.addr, saddr16, 16);
    return node_addrs.lookup(&key) != NULL;
}
/* ---- end node addresses ------------------------------------------------------------ */

/* Copied out of the context first: the verifier rejects loads through a ctx pointer an
 * inlined helper has offset. */
struct addr_pair {
    u8 saddr[16];
    u8 daddr[16];
};

#define COPY_ADDRS(pair, args)                                         \
    do {                                                               \
        __builtin_memcpy((pair).saddr, (args)->saddr_v6, 16);          \
        __builtin_memcpy((pair).daddr, (args)->daddr_v6, 16);          \
        /* keep clang from forwarding the ctx loads past the copy */   \
        asm volatile("" ::: "memory");                                 \
    } while (0)

static __always_inline u32 own_az(void)
{
    u32 zero = 0;
    struct azp_config *cfg = agent_config.lookup(&zero);
    return cfg ? cfg->own_az : AZP_AZ_OTHER;
}

static __always_inline u32 *az_lookup(const u8 *addr16)
{
    struct azp_lpm_key key = {.prefixlen = 128};
    __builtin_memcpy(key.addr, addr16, 16);
    return az_trie.lookup(&key);
}

/* Unknown source -> this agent's AZ; unknown destination -> "other". */
static __always_inline u32 path_of(const struct addr_pair *a)
{
    u32 *src = az_lookup(a->saddr);
    u32 *dst = az_lookup(a->daddr);
    u32 src_id = src ? *src : own_az();
    u32 dst_id = dst ? *dst : AZP_AZ_OTHER;
    return src_id * AZP_MAX_AZ + dst_id;
}

static __always_inline struct azp_path_counters *counters(u32 path)
{
    return path_counters.lookup(&path);
}

/* Count one connect latency (µs) in the path's shared row: connects on two CPUs may
 * land in one bucket at once, hence the atomic add. */
static __always_inline void connect_add(u32 path, u64 latency_us)
{
    struct azp_hist_row *row = connect_rows.lookup(&path);
    if (row)
        __sync_fetch_and_add(&row->buckets[azp_bucket_index(latency_us) & (AZP_NUM_BUCKETS - 1)], 1);
}

/* Count srtt samples of one bucket in the path's per-CPU RTT row. */
static __always_inline void rtt_add(u32 path, u64 bucket, u64 count)
{
    struct azp_hist_row *row = rtt_rows.lookup(&path);
    if (row)
        row->buckets[bucket & (AZP_NUM_BUCKETS - 1)] += count;
}

/* The top `bits` bits of a socket address's Fibonacci hash: socket addresses are slab
 * objects with their low bits in common, and the product mixes every bit into the top. */
static __always_inline u32 sock_slot(u64 sk, u32 bits)
{
    if (bits == 0) /* one set (tests): a shift by 64 is undefined */
        return 0;
    return (u32)((sk * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

/* Loss marks. Two sockets in Loss at once in one slot: the later mark evicts the
 * earlier, whose next Loss entry of the same episode (the kernel re-enters Loss at every
 * further timeout) then counts once more. So a collision can only over-count RTOs of a
 * socket that keeps timing out, never invent one on a healthy socket; at 4096 slots it
 * needs hundreds of sockets in Loss at once to matter. */
static __always_inline u64 *loss_slot(u64 sk)
{
    u32 slot = sock_slot(sk, AZP_LOSS_SLOT_BITS);
    return in_loss.lookup(&slot);
}

static __always_inline int loss_marked(u64 sk)
{
    u64 *e = loss_slot(sk);
    return e && *e == sk;
}

/* Most sockets never enter Loss: one line read and no write on every close and every
 * congestion-state change. */
static __always_inline void forget_loss(u64 sk)
{
    u64 *e = loss_slot(sk);
    if (e && *e == sk)
        *e = 0;
}

/* The slot of a connect in flight: a set is 2 slots in one line. */
static __always_inline struct azp_connect_slot *connect_find(u64 sk)
{
    u32 i = sock_slot(sk, AZP_CONNECT_SET_BITS) * 2;
    struct azp_connect_slot *e = connecting.lookup(&i);
    if (e && e->sk == sk)
        return e;
    i += 1;
    e = connecting.lookup(&i);
    if (e && e->sk == sk)
        return e;
    return NULL;
}

/* Take a slot for a socket entering SYN_SENT: its own (a socket that connects again), a
 * free one, or one held past AZP_CONNECT_EXPIRY_S; NULL when both are held. A held slot
 * is never taken over: which connect goes untracked is then decided when it starts,
 * before its outcome is known, so a full set drops a sample without bias. Evicting the
 * oldest would drop the connects that wait longest, the failing ones, and make a zone
 * in trouble look healthier. The compare-and-swap settles two CPUs claiming one slot;
 * a claim that reads a just-taken slot's old ts_ns (the taker writes it right after its
 * swap) can still take it over, losing that one connect's outcome: nanoseconds wide. */
static __always_inline struct azp_connect_slot *connect_claim(u64 sk, u64 now_ns)
{
    u32 i = sock_slot(sk, AZP_CONNECT_SET_BITS) * 2;
#pragma unroll
    for (int way = 0; way < 2; way++, i++) {
        struct azp_connect_slot *e = connecting.lookup(&i);
        if (!e)
            continue;
        u64 held = e->sk;
        if (held == sk)
            return e;
        if (held && now_ns - e->ts_ns < AZP_CONNECT_EXPIRY_S * 1000000000ULL)
            continue;
        if (__sync_val_compare_and_swap(&e->sk, held, sk) == held)
            return e;
    }
    return NULL;
}

struct flow_id {
    u64 saddr_hi, saddr_lo, daddr_hi, daddr_lo;
    u16 dport;
};

static __always_inline u32 flow_slot(const struct flow_id *f)
{
    u64 h = f->saddr_lo ^ (f->daddr_lo * 31) ^ f->saddr_hi ^ (f->daddr_hi * 7) ^ f->dport;
    /* Fibonacci hashing: the product's top bits mix every input bit. */
    return (u32)((h * 0x9E3779B97F4A7C15ULL) >> (64 - AZP_FLOW_CACHE_BITS));
}

static __always_inline struct flow_id flow_of(const struct addr_pair *a, u16 dport)
{
    struct flow_id f = {.dport = dport};
    __builtin_memcpy(&f.saddr_hi, &a->saddr[0], 8);
    __builtin_memcpy(&f.saddr_lo, &a->saddr[8], 8);
    __builtin_memcpy(&f.daddr_hi, &a->daddr[0], 8);
    __builtin_memcpy(&f.daddr_lo, &a->daddr[8], 8);
    return f;
}

/* The cached slot of flow `f`, or NULL. Every key field is compared: a slot holds
 * whichever colliding flow connected last. */
static __always_inline struct azp_flow_slot *flow_cache_get(const struct flow_id *f)
{
    u32 slot = flow_slot(f);
    struct azp_flow_slot *e = flow_cache.lookup(&slot);
    if (!e || !e->valid || e->dport != f->dport || e->daddr_lo != f->daddr_lo || e->saddr_lo != f->saddr_lo ||
        e->daddr_hi != f->daddr_hi || e->saddr_hi != f->saddr_hi)
        return NULL;
    return e;
}

/* Remember an opened flow's path (a colliding flow takes the slot over: the other then
 * goes without RTT samples until it is seen connecting again).
 *
 * Readers on other CPUs take no lock: tcp_probe reads `valid`, then the key fields, then
 * `path`, with nothing re-checked afterwards. So while a slot is being taken over, a
 * reader can see a mix of the old and the new flow; it counts a sample only if every
 * field it read equals its own flow, which can pair the new flow's key with the old
 * path. The cost is bounded and harmless: it needs a hash collision at the instant of a
 * connect, it mis-files at most the samples of that instant, and it never invents a
 * sample. A sequence re-check would cost the hot path
 * a second read of the line on every segment to protect against that. */
static __always_inline void flow_cache_put(const struct flow_id *f, u32 path)
{
    u32 slot = flow_slot(f);
    struct azp_flow_slot *e = flow_cache.lookup(&slot);
    if (!e)
        return;
    if (e->valid && e->path == path && e->dport == f->dport && e->saddr_lo == f->saddr_lo &&
        e->daddr_lo == f->daddr_lo && e->saddr_hi == f->saddr_hi && e->daddr_hi == f->daddr_hi)
        return; /* the common case: keep the line clean for the other CPUs */
    e->valid = 0;
    asm volatile("" ::: "memory");
    e->saddr_hi = f->saddr_hi;
    e->saddr_lo = f->saddr_lo;
    e->daddr_hi = f->daddr_hi;
    e->daddr_lo = f->daddr_lo;
    e->dport = f->dport;
    e->path = path;
    asm volatile("" ::: "memory"); /* the key and path before the flag that publishes them */
    e->valid = 1;
}

static __always_inline void emit(void *ctx, u8 kind, u32 path, const struct addr_pair *a,
                                 u16 sport, u16 dport, u16 family)
{
    struct azp_event ev = {};
    ev.ts_ns = bpf_ktime_get_ns();
    __builtin_memcpy(ev.saddr, a->saddr, 16);
    __builtin_memcpy(ev.daddr, a->daddr, 16);
    ev.sport = sport;
    ev.dport = dport;
    ev.family = family;
    ev.kind = kind;
    ev.path = path;
    if (events.ringbuf_output(&ev, sizeof(ev), 0) != 0) {
        u32 zero = 0;
        struct azp_probe_stats *st = probe_stats.lookup(&zero);
        if (st)
            st->ring_drops += 1;
    }
}

/* Smoothed RTT per received segment on flows this node opened to an AZ: the per-segment
 * path. Segments of sockets whose local port is outside the node's ephemeral port range
 * (accepted server sockets: their local port is the service's) cannot be in the flow
 * cache, so they are dropped from the context alone, before any map is touched: on a
 * busy machine every map line a handler touches costs a cache miss. */
TRACEPOINT_PROBE(tcp, tcp_probe)
{
#ifdef AZP_EPHEMERAL_LO
    if (args->sport < AZP_EPHEMERAL_LO || args->sport > AZP_EPHEMERAL_HI)
        return 0;
#endif
#if AZP_RTT_SAMPLE_MASK
    /* RTT sampling ([agent] rtt_sample_ticks, docs/probe.md "RTT sampling"): only
     * segments that arrive during one kernel tick in every AZP_RTT_SAMPLE_MASK + 1 go
     * on. Whole ticks, not every Nth segment: the sampled segments come in bursts, so
     * the flow-cache and RTT-row lines they touch are still in the cache for the next
     * one; spreading the same number of samples evenly made each cost a miss
     * (docs/probe.md has the figures). jiffies is one load, no clock read. */
    if (bpf_jiffies64() & AZP_RTT_SAMPLE_MASK)
        return 0;
#endif
    struct flow_id f = {.dport = args->dport};
    /* saddr/daddr hold a sockaddr_in (address at 4) or sockaddr_in6 (address at 8). */
    if (args->family == AZP_AF_INET) {
        u32 s4, d4;
        __builtin_memcpy(&s4, &args->saddr[4], 4);
        __builtin_memcpy(&d4, &args->daddr[4], 4);
        /* bytes 8..15 of ::ffff:a.b.c.d are 00 00 ff ff a b c d (read little-endian) */
        f.saddr_lo = 0xffff0000ULL | ((u64)s4 << 32);
        f.daddr_lo = 0xffff0000ULL | ((u64)d4 << 32);
    } else if (args->family == AZP_AF_INET6) {
        __builtin_memcpy(&f.saddr_hi, &args->saddr[8], 8);
        __builtin_memcpy(&f.saddr_lo, &args->saddr[16], 8);
        __builtin_memcpy(&f.daddr_hi, &args->daddr[8], 8);
        __builtin_memcpy(&f.daddr_lo, &args->daddr[16], 8);
    } else {
        return 0;
    }
    struct azp_flow_slot *e = flow_cache_get(&f);
    if (!e)
        return 0;
    rtt_add(e->path, azp_bucket_index(args->srtt), 1);
    return 0;
}

/* Connect attempts, outcomes and latency from the socket state machine. */
TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != AZP_IPPROTO_TCP)
        return 0;
    u64 sk = (u64)args->skaddr;
    int newstate = args->newstate;
    int oldstate = args->oldstate;
    if (newstate != AZP_TCP_SYN_SENT && oldstate != AZP_TCP_SYN_SENT) {
        /* Most changes (a server socket's whole life, a client's close): only a Loss
         * mark may need forgetting, and the addresses are not even copied. */
        if (newstate == AZP_TCP_CLOSE)
            forget_loss(sk);
        return 0;
    }
    struct addr_pair addrs;
    COPY_ADDRS(addrs, args);

    if (newstate == AZP_TCP_SYN_SENT) {
        /* A flow this node opened before (a pool's new connection, a retry) has its
         * path cached: no node-address check and no LPM lookups. The cache only holds
         * flows that passed both, and the agent empties it whenever either changes. */
        struct flow_id f = flow_of(&addrs, args->dport);
        struct azp_flow_slot *cached = flow_cache_get(&f);
        u32 path;
        if (cached) {
            path = cached->path;
        } else {
            if (!node_owns(addrs.saddr)) /* node addresses */
                return 0;
            path = path_of(&addrs);
        }
        u64 now_ns = bpf_ktime_get_ns();
        struct azp_connect_slot *slot = connect_claim(sk, now_ns);
        if (slot) {
            slot->ts_ns = now_ns;
            slot->path = path;
            slot->got_reset = 0;
        } else {
            u32 zero = 0;
            struct azp_probe_stats *st = probe_stats.lookup(&zero);
            if (st)
                st->untracked_connects += 1;
        }
        struct azp_path_counters *c = counters(path);
        if (c)
            c->conn_attempts += 1;
        return 0;
    }
    /* Leaving SYN_SENT (the only case left): the connect's outcome. */
    struct azp_connect_slot *found = connect_find(sk);
    if (found) {
        struct azp_connect_slot start = *found;
        asm volatile("" ::: "memory"); /* the copy before the release */
        found->sk = 0;
        struct azp_path_counters *c = counters(start.path);
        if (newstate == AZP_TCP_ESTABLISHED) {
            /* A SYN timeout leaves the socket in Loss; the first data RTO must count. */
            forget_loss(sk);
            if (start.path % AZP_MAX_AZ != AZP_AZ_OTHER) {
                struct flow_id f = flow_of(&addrs, args->dport);
                flow_cache_put(&f, start.path);
            }
            if (c)
                c->conn_ok += 1;
            connect_add(start.path, (bpf_ktime_get_ns() - start.ts_ns) / 1000);
        } else if (newstate == AZP_TCP_CLOSE) {
            u8 kind = start.got_reset ? AZP_EV_CONN_REFUSED : AZP_EV_CONN_TIMEOUT;
            if (c) {
                if (start.got_reset)
                    c->conn_refused += 1;
                else
                    c->conn_timeout += 1;
            }
            emit(args, kind, start.path, &addrs, args->sport,
                 args->dport, args->family);
        }
    }
    if (newstate == AZP_TCP_CLOSE)
        forget_loss(sk);
    return 0;
}

/* An RST while in SYN_SENT makes the coming SYN_SENT -> CLOSE a refusal. */
TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
    u64 sk = (u64)args->skaddr;
    struct azp_connect_slot *start = connect_find(sk);
    if (start)
        start->got_reset = 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#ifdef AZP_HAVE_RETRANSMIT_ERR
    /* A retransmit the stack failed to send never reached the wire. */
    if (args->err != 0)
        return 0;
#endif
    struct addr_pair addrs;
    COPY_ADDRS(addrs, args);
    if (!node_owns(addrs.saddr)) /* node addresses */
        return 0;
    u32 path = path_of(&addrs);
    struct azp_path_counters *c = counters(path);
    if (!c)
        return 0;
    c->retrans += 1;
    if (args->state == AZP_TCP_SYN_SENT) {
        c->syn_retrans += 1;
        emit(args, AZP_EV_SYN_RETRANS, path, &addrs, args->sport,
             args->dport, args->family);
    }
    return 0;
}

/* RTO events: entries into TCP_CA_Loss, once per entry (the kernel re-sets Loss on every
 * further timeout). The tracepoint has no TCP state, so "in SYN_SENT" means "has a
 * pending connect": those are SYN timeouts, kept apart from data RTOs. */
TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
    u64 sk = (u64)args->skaddr;
    if (args->cong_state != AZP_TCP_CA_LOSS) {
        forget_loss(sk);
        return 0;
    }
    if (loss_marked(sk))
        return 0;
    struct addr_pair addrs;
    COPY_ADDRS(addrs, args);
    if (!node_owns(addrs.saddr)) /* node addresses */
        return 0;
    u64 *mark = loss_slot(sk);
    if (mark)
        *mark = sk;
    u32 path = path_of(&addrs);
    struct azp_path_counters *c = counters(path);
    u8 kind = connect_find(sk) ? AZP_EV_SYN_RTO : AZP_EV_RTO;
    if (c) {
        if (kind == AZP_EV_SYN_RTO)
            c->syn_rto += 1;
        else
            c->rto += 1;
    }
    emit(args, kind, path, &addrs, args->sport, args->dport,
         args->family);
    return 0;
}

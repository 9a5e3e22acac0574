/* azprobe: per-path (source AZ -> destination AZ) TCP health from tracepoints only.
 *
 * Never through the installed kernel headers' struct layouts: they belong to another
 * kernel. The classic tracepoints' fields come from tracefs (BCC builds the `args`
 * structs from it); the BTF-typed tracepoints' handlers (AZP_BTF_HOOKS) read the socket
 * at offsets from the running kernel's BTF (agent/btf.py).
 *
 * Maps are cumulative; the agent sums CPUs and takes deltas each interval. Dense ids
 * (paths 0..AZP_MAX_PATHS-1) index arrays: an inlined lookup, no hashing, no
 * lookup_or_try_init. A handler never nests in itself on one CPU (the kernel skips a
 * program already running there), but on tp_btf hooks one handler can interrupt another
 * (a softirq's tcp_probe inside a connect()'s inet_sock_set_state). So every per-CPU
 * field is written by one handler only and takes plain increments; the one that several
 * write (probe_stats.ring_drops) takes an atomic add.
 */
#include "azprobe.bpf.h"

#ifndef AZP_RTT_SAMPLE_MASK
#define AZP_RTT_SAMPLE_MASK 0 /* every segment: the agent passes rtt_sample_ticks - 1 */
#endif

BPF_LPM_TRIE(az_trie, struct azp_lpm_key, u32, AZP_MAX_PREFIXES);
BPF_ARRAY(agent_config, struct azp_config, 1);
BPF_PERCPU_ARRAY(path_counters, struct azp_path_counters, AZP_MAX_PATHS);
/* Connect latency per path: one shared (not per-CPU) row per path, 1 MB in all, added to
 * atomically. Not a per-CPU hash with lookup_or_try_init: that costs ~100-150 ns more
 * per connect (measured) and memory that grows with the CPU count. */
BPF_ARRAY(connect_rows, struct azp_hist_row, AZP_MAX_PATHS);
/* Connects in flight and sockets inside a Loss episode, in arrays indexed by a hash of
 * the socket's id (sock_slot): each test is one line, where a hash-map operation
 * cost ~300 ns here (docs/probe.md "What a connection costs"). What a full set or a
 * collision costs is stated at each. */
BPF_ARRAY(connecting, struct azp_connect_slot, AZP_CONNECT_SLOTS);
BPF_ARRAY(in_loss, u64, AZP_LOSS_SLOTS);
#ifdef AZP_BTF_HOOKS
BPF_ARRAY(sock_id_anchor, u64, 1); /* its one value's address: see sock_id_of */
#endif
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
#if AZP_MAX_HOSTS > 0
/* Per destination host of a path (azprobe.h): connects insert, the rarer handlers only
 * look up, and tcp_probe never touches the hash: it counts a host's srtt in the per-CPU
 * row of the flow-cache slot it already holds. The agent deletes hosts idle for a while
 * (agent/hosts.py), so a full table is one of that many hosts at once, not ever. */
BPF_PERCPU_HASH(hosts, struct azp_host_key, struct azp_host_counters, AZP_MAX_HOSTS);
BPF_PERCPU_ARRAY(flow_rtt, struct azp_host_rtt, AZP_FLOW_CACHE_SLOTS);
#endif
BPF_RINGBUF_OUTPUT(events, AZP_RINGBUF_PAGES);



/* ---- node addresses (one agent per node) --------------------------------------------
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

/* Sockets are known by a u64 `sock_id`, never 0: the socket's address (classic hooks:
 * the record's skaddr), or on tp_btf hooks its address relative to a map value's
 * (sock_id_of). Either is unique among live sockets; a freed socket's id can come back.
 *
 * The top `bits` bits of a socket id's Fibonacci hash: sockets are slab objects with
 * their low address bits in common, and the product mixes every bit into the top. */
static __always_inline u32 sock_slot(u64 sock_id, u32 bits)
{
    if (bits == 0) /* one set (tests): a shift by 64 is undefined */
        return 0;
    return (u32)((sock_id * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

/* Loss marks. Two sockets in Loss at once in one slot: the later mark evicts the
 * earlier, whose next Loss entry of the same episode (the kernel re-enters Loss at every
 * further timeout) then counts once more. So a collision can only over-count RTOs of a
 * socket that keeps timing out, never invent one on a healthy socket; at 4096 slots it
 * needs hundreds of sockets in Loss at once to matter. */
static __always_inline u64 *loss_slot(u64 sock_id)
{
    u32 slot = sock_slot(sock_id, AZP_LOSS_SLOT_BITS);
    return in_loss.lookup(&slot);
}

static __always_inline int loss_marked(u64 sock_id)
{
    u64 *e = loss_slot(sock_id);
    return e && *e == sock_id;
}

/* Most sockets never enter Loss: one line read and no write on every close and every
 * congestion-state change. */
static __always_inline void forget_loss(u64 sock_id)
{
    u64 *e = loss_slot(sock_id);
    if (e && *e == sock_id)
        *e = 0;
}

/* The slot of a connect in flight: a set is 2 slots in one line. */
static __always_inline struct azp_connect_slot *connect_find(u64 sock_id)
{
    u32 i = sock_slot(sock_id, AZP_CONNECT_SET_BITS) * 2;
    struct azp_connect_slot *e = connecting.lookup(&i);
    if (e && e->sock_id == sock_id)
        return e;
    i += 1;
    e = connecting.lookup(&i);
    if (e && e->sock_id == sock_id)
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
static __always_inline struct azp_connect_slot *connect_claim(u64 sock_id, u64 now_ns)
{
    u32 i = sock_slot(sock_id, AZP_CONNECT_SET_BITS) * 2;
#pragma unroll
    for (int way = 0; way < 2; way++, i++) {
        struct azp_connect_slot *e = connecting.lookup(&i);
        if (!e)
            continue;
        u64 held = e->sock_id;
        if (held == sock_id)
            return e;
        if (held && now_ns - e->ts_ns < AZP_CONNECT_EXPIRY_S * 1000000000ULL)
            continue;
        if (__sync_val_compare_and_swap(&e->sock_id, held, sock_id) == held)
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

/* The low half of ::ffff:a.b.c.d (`addr` as the kernel stores it): bytes 8..15 are
 * 00 00 ff ff a b c d, read little-endian. The high half is 0. */
static __always_inline u64 v4_mapped_lo(u32 addr)
{
    return 0xffff0000ULL | ((u64)addr << 32);
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

/* Slot `slot` of the flow cache when it holds flow `f`, or NULL. Every key field is
 * compared: a slot holds whichever colliding flow connected last. */
static __always_inline struct azp_flow_slot *flow_cache_at(u32 slot, const struct flow_id *f)
{
    struct azp_flow_slot *e = flow_cache.lookup(&slot);
    if (!e || !e->valid || e->dport != f->dport || e->daddr_lo != f->daddr_lo || e->saddr_lo != f->saddr_lo ||
        e->daddr_hi != f->daddr_hi || e->saddr_hi != f->saddr_hi)
        return NULL;
    return e;
}

static __always_inline struct azp_flow_slot *flow_cache_get(const struct flow_id *f)
{
    return flow_cache_at(flow_slot(f), f);
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

/* ---- hosts (AZP_MAX_HOSTS > 0) ------------------------------------------------------
 * Only destinations in the topology: "other" is everything else, and would fill the table
 * with hosts no zone has. Every per-CPU field has one writer (connects, failures and
 * hosts_dropped: inet_sock_set_state; retrans: tcp_retransmit_skb; rto:
 * tcp_cong_state_set; flow_rtt: tcp_probe), so all take plain increments. */
#if AZP_MAX_HOSTS > 0
static __always_inline struct azp_host_key host_key(u32 path, const u8 *daddr16)
{
    struct azp_host_key key = {.path = path};
    __builtin_memcpy(key.addr, daddr16, 16);
    return key;
}
#endif

/* The host's counters, or NULL when it is not in the table (or not in the topology). */
static __always_inline struct azp_host_counters *host_find(u32 path, const u8 *daddr16)
{
#if AZP_MAX_HOSTS > 0
    if (path % AZP_MAX_AZ == AZP_AZ_OTHER)
        return NULL;
    struct azp_host_key key = host_key(path, daddr16);
    return hosts.lookup(&key);
#else
    return NULL;
#endif
}

/* A connect's host: found, or inserted while the table has room. A full table leaves the
 * host out and counts it: never silent. Like a full connect set, which host is left out is
 * decided before any outcome is known, so the hosts kept are not biased toward health. */
static __always_inline struct azp_host_counters *host_claim(u32 path, const u8 *daddr16)
{
    struct azp_host_counters *h = host_find(path, daddr16);
#if AZP_MAX_HOSTS > 0
    if (h || path % AZP_MAX_AZ == AZP_AZ_OTHER)
        return h;
    struct azp_host_key key = host_key(path, daddr16);
    struct azp_host_counters zero = {};
    int err = hosts.insert(&key, &zero);
    if (err == 0 || err == -AZP_EEXIST)
        return hosts.lookup(&key);
    u32 zero_idx = 0;
    struct azp_probe_stats *st = probe_stats.lookup(&zero_idx);
    if (st)
        st->hosts_dropped += 1;
#endif
    return h;
}

/* One srtt sample (its sketch bucket `bucket`) of the flow in flow-cache slot `slot`. */
static __always_inline void host_rtt_add(u32 slot, u64 bucket)
{
#if AZP_MAX_HOSTS > 0
    struct azp_host_rtt *r = flow_rtt.lookup(&slot);
    if (r)
        r->buckets[azp_host_rtt_bucket((u32)bucket) & (AZP_HOST_RTT_BUCKETS - 1)] += 1;
#endif
}
/* ---- end hosts ---------------------------------------------------------------------- */

static __always_inline void emit(u8 kind, u32 path, const struct addr_pair *a, u16 sport, u16 dport,
                                 u16 family)
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
        if (st) /* every handler that emits writes it: atomic, see the top of the file */
            __sync_fetch_and_add(&st->ring_drops, 1);
    }
}

/* ---- what the handlers do, whichever hook feeds them -------------------------------- */

/* Connect attempts, outcomes and latency from the socket state machine. */

/* True for a state change that neither enters nor leaves SYN_SENT: nothing to count. */
static __always_inline int state_change_outside_connect(int oldstate, int newstate)
{
    return newstate != AZP_TCP_SYN_SENT && oldstate != AZP_TCP_SYN_SENT;
}

/* True for a state change that needs nothing at all, not even the socket's id: outside a
 * connect and not a close (a server socket's whole life but its end, a client's shutdown).
 * Handlers whose socket reads cost a line dismiss these on their arguments first. */
static __always_inline int state_change_needs_nothing(int oldstate, int newstate)
{
    return state_change_outside_connect(oldstate, newstate) && newstate != AZP_TCP_CLOSE;
}

/* State changes outside a connect need nothing but a close's Loss mark forgotten: true
 * when this is one. */
static __always_inline int state_change_dismissed(u64 sock_id, int oldstate, int newstate)
{
    if (state_change_outside_connect(oldstate, newstate)) {
        if (newstate == AZP_TCP_CLOSE)
            forget_loss(sock_id);
        return 1;
    }
    return 0;
}

/* A TCP socket entering or leaving SYN_SENT, its addresses and ports in hand. */
static __always_inline void connect_state_change(u64 sock_id, int newstate, const struct addr_pair *addrs,
                                                 u16 sport, u16 dport, u16 family)
{
    if (newstate == AZP_TCP_SYN_SENT) {
        /* A flow this node opened before (a pool's new connection, a retry) has its
         * path cached: no node-address check and no LPM lookups. The cache only holds
         * flows that passed both, and the agent empties it whenever either changes. */
        struct flow_id f = flow_of(addrs, dport);
        struct azp_flow_slot *cached = flow_cache_get(&f);
        u32 path;
        if (cached) {
            path = cached->path;
        } else {
            if (!node_owns(addrs->saddr)) /* node addresses */
                return;
            path = path_of(addrs);
        }
        u64 now_ns = bpf_ktime_get_ns();
        struct azp_connect_slot *slot = connect_claim(sock_id, now_ns);
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
        struct azp_host_counters *h = host_claim(path, addrs->daddr);
        if (h)
            h->connects += 1;
        return;
    }
    /* Leaving SYN_SENT (the only case left): the connect's outcome. */
    struct azp_connect_slot *found = connect_find(sock_id);
    if (found) {
        struct azp_connect_slot start = *found;
        asm volatile("" ::: "memory"); /* the copy before the release */
        found->sock_id = 0;
        struct azp_path_counters *c = counters(start.path);
        if (newstate == AZP_TCP_ESTABLISHED) {
            /* A SYN timeout leaves the socket in Loss; the first data RTO must count. */
            forget_loss(sock_id);
            if (start.path % AZP_MAX_AZ != AZP_AZ_OTHER) {
                struct flow_id f = flow_of(addrs, dport);
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
            struct azp_host_counters *h = host_find(start.path, addrs->daddr);
            if (h)
                h->failures += 1;
            emit(kind, start.path, addrs, sport, dport, family);
        }
    }
    if (newstate == AZP_TCP_CLOSE)
        forget_loss(sock_id);
}

/* An RST while in SYN_SENT makes the coming SYN_SENT -> CLOSE a refusal. */
static __always_inline void reset_received(u64 sock_id)
{
    struct azp_connect_slot *start = connect_find(sock_id);
    if (start)
        start->got_reset = 1;
}

/* RTO events: entries into TCP_CA_Loss, once per entry (the kernel re-sets Loss on every
 * further timeout). The hook has no TCP state, so "in SYN_SENT" means "has a pending
 * connect": those are SYN timeouts, kept apart from data RTOs. True when the change
 * needs the socket's addresses (loss_entered). */
static __always_inline int loss_needs_addrs(u64 sock_id, u8 cong_state)
{
    if (cong_state != AZP_TCP_CA_LOSS) {
        forget_loss(sock_id);
        return 0;
    }
    return !loss_marked(sock_id);
}

static __always_inline void loss_entered(u64 sock_id, const struct addr_pair *addrs, u16 sport, u16 dport, u16 family)
{
    if (!node_owns(addrs->saddr)) /* node addresses */
        return;
    u64 *mark = loss_slot(sock_id);
    if (mark)
        *mark = sock_id;
    u32 path = path_of(addrs);
    struct azp_path_counters *c = counters(path);
    u8 kind = connect_find(sock_id) ? AZP_EV_SYN_RTO : AZP_EV_RTO;
    if (c) {
        if (kind == AZP_EV_SYN_RTO)
            c->syn_rto += 1;
        else
            c->rto += 1;
    }
    if (kind == AZP_EV_RTO) {
        struct azp_host_counters *h = host_find(path, addrs->daddr);
        if (h)
            h->rto += 1;
    }
    emit(kind, path, addrs, sport, dport, family);
}

/* RTT sampling ([agent] rtt_sample_ticks, docs/probe.md "RTT sampling"): only segments
 * that arrive during one kernel tick in every AZP_RTT_SAMPLE_MASK + 1 go on. Whole ticks,
 * not every Nth segment: the sampled segments come in bursts, so the flow-cache and
 * RTT-row lines they touch are still in the cache for the next one; spreading the same
 * number of samples evenly made each cost a miss (docs/probe.md has the figures).
 * jiffies is one load, no clock read. */
static __always_inline int rtt_tick_skipped(void)
{
#if AZP_RTT_SAMPLE_MASK
    return (bpf_jiffies64() & AZP_RTT_SAMPLE_MASK) != 0;
#else
    return 0;
#endif
}

/* Segments of sockets whose local port is outside the node's ephemeral port range
 * (accepted server sockets: their local port is the service's) cannot be in the flow
 * cache: dropped before any map is touched. */
static __always_inline int port_not_ephemeral(u16 sport)
{
#ifdef AZP_EPHEMERAL_LO
    return sport < AZP_EPHEMERAL_LO || sport > AZP_EPHEMERAL_HI;
#else
    return 0;
#endif
}

#ifdef AZP_BTF_HOOKS
/* ---- BTF-typed tracepoints (tp_btf; docs/probe.md "BTF-typed tracepoints") ----------
 * The kernel hands the program its own arguments, typed by its BTF: no trace record is
 * built for the event (~190 ns a classic one cost per event here), changes that need
 * nothing are dismissed on the arguments alone, and the socket is read with plain loads
 * that the verifier checks against the kernel's `struct sock` (a raw tracepoint's handler
 * has to call bpf_probe_read_kernel, ~200 ns a call here). The offsets come from the
 * running kernel's BTF (agent/btf.py). BCC compiles these functions but cannot load them
 * (its loader has no tp_btf): the agent loads their bytecode itself
 * (agent/bpf_syscall.py), so each is named tp_btf__<tracepoint> and BCC leaves it be. */
#define BTF_TRACEPOINT(tp) int tp_btf__##tp(u64 *ctx)

/* A field of the socket at `sk`, a BTF-typed `struct sock *`, read with one load. */
#define SK_FIELD(type, sk, off) (*(const type *)((const u8 *)(sk) + (off)))

/* The socket at `sk` typed as a struct tcp_sock, whose srtt_us lies past struct sock
 * (the verifier checks every load against the type it knows). tcp_probe only fires for
 * TCP sockets, so no check is needed: bpf_rdonly_cast (a kfunc, Linux >= 6.2) retypes
 * the pointer and the verifier turns the call into a register copy. BCC cannot emit a
 * kfunc call, so the program calls a placeholder helper id, AZP_KFUNC_RDONLY_CAST, that
 * the agent links to the kfunc before loading (agent/bpf_syscall.py link_kfuncs).
 * Without the kfunc: bpf_skc_to_tcp_sock, a helper that checks the socket first, ~30 ns
 * more per sampled segment here. */
#ifdef AZP_TCP_SOCK_BTF_ID
static void *(*azp_rdonly_cast)(const void *obj, u32 btf_id) = (void *)AZP_KFUNC_RDONLY_CAST;
#define as_tcp_sock(sk) ((const u8 *)azp_rdonly_cast((sk), AZP_TCP_SOCK_BTF_ID))
#else
#define as_tcp_sock(sk) ((const u8 *)bpf_skc_to_tcp_sock((void *)(sk)))
#endif

/* The socket's addresses (IPv4 as ::ffff:a.b.c.d); 0 for a family other than IPv4/IPv6. */
static __always_inline int sock_addrs(const u8 *sk, u16 family, struct addr_pair *addrs)
{
    if (family == AZP_AF_INET) {
        u32 saddr = SK_FIELD(u32, sk, AZP_SK_RCV_SADDR), daddr = SK_FIELD(u32, sk, AZP_SK_DADDR);
        __builtin_memset(addrs, 0, sizeof(*addrs));
        addrs->saddr[10] = addrs->saddr[11] = 0xff;
        addrs->daddr[10] = addrs->daddr[11] = 0xff;
        __builtin_memcpy(&addrs->saddr[12], &saddr, 4);
        __builtin_memcpy(&addrs->daddr[12], &daddr, 4);
        return 1;
    }
    if (family == AZP_AF_INET6) {
        u64 half[4] = {SK_FIELD(u64, sk, AZP_SK_V6_RCV_SADDR), SK_FIELD(u64, sk, AZP_SK_V6_RCV_SADDR + 8),
                       SK_FIELD(u64, sk, AZP_SK_V6_DADDR), SK_FIELD(u64, sk, AZP_SK_V6_DADDR + 8)};
        __builtin_memcpy(addrs->saddr, &half[0], 16);
        __builtin_memcpy(addrs->daddr, &half[2], 16);
        return 1;
    }
    return 0;
}

/* A socket's addresses, ports (local in host order) and family; 0 for a family other
 * than IPv4/IPv6. */
struct sock_endpoints {
    struct addr_pair addrs;
    u16 sport, dport, family;
};

static __always_inline int read_endpoints(const u8 *sk, struct sock_endpoints *ep)
{
    ep->sport = SK_FIELD(u16, sk, AZP_SK_NUM);
    ep->dport = bpf_ntohs(SK_FIELD(u16, sk, AZP_SK_DPORT));
    ep->family = SK_FIELD(u16, sk, AZP_SK_FAMILY);
    return sock_addrs(sk, ep->family, &ep->addrs);
}

/* TP_PROTO(const struct sock *sk, const struct sk_buff *skb): every received segment. */
BTF_TRACEPOINT(tcp_probe)
{
    if (rtt_tick_skipped()) /* before any read: the common case touches nothing */
        return 0;
    const u8 *sk = (const u8 *)ctx[0];
    if (port_not_ephemeral(SK_FIELD(u16, sk, AZP_SK_NUM)))
        return 0;
    struct flow_id f = {.dport = bpf_ntohs(SK_FIELD(u16, sk, AZP_SK_DPORT))};
    u16 family = SK_FIELD(u16, sk, AZP_SK_FAMILY);
    if (family == AZP_AF_INET) {
        f.saddr_lo = v4_mapped_lo(SK_FIELD(u32, sk, AZP_SK_RCV_SADDR));
        f.daddr_lo = v4_mapped_lo(SK_FIELD(u32, sk, AZP_SK_DADDR));
    } else if (family == AZP_AF_INET6) {
        f.saddr_hi = SK_FIELD(u64, sk, AZP_SK_V6_RCV_SADDR);
        f.saddr_lo = SK_FIELD(u64, sk, AZP_SK_V6_RCV_SADDR + 8);
        f.daddr_hi = SK_FIELD(u64, sk, AZP_SK_V6_DADDR);
        f.daddr_lo = SK_FIELD(u64, sk, AZP_SK_V6_DADDR + 8);
    } else {
        return 0;
    }
    u32 slot = flow_slot(&f);
    struct azp_flow_slot *e = flow_cache_at(slot, &f);
    if (!e)
        return 0;
    /* tcp_sock.srtt_us holds 8 x the smoothed RTT in µs. */
    const u8 *tp = as_tcp_sock(sk);
    if (tp) {
        u64 bucket = azp_bucket_index(SK_FIELD(u32, tp, AZP_TP_SRTT_US) >> 3);
        rtt_add(e->path, bucket, 1);
        host_rtt_add(slot, bucket);
    }
    return 0;
}

/* The socket's id (see sock_slot): its address, relative to a fixed map value's. The
 * verifier lets a privileged program subtract one pointer from another but not turn a
 * pointer into an integer, and a relative address is as unique as the address. Not the
 * socket's cookie (bpf_get_socket_cookie): that costs 40-100 ns more per state change
 * here and gives every socket a cookie as a side effect. */
static __always_inline u64 sock_id_of(u64 *ctx)
{
    u32 zero = 0;
    u64 *anchor = sock_id_anchor.lookup(&zero);
    return anchor ? ctx[0] - (u64)anchor : 0;
}

/* TP_PROTO(const struct sock *sk, const int oldstate, const int newstate) */
BTF_TRACEPOINT(inet_sock_set_state)
{
    int oldstate = (int)ctx[1], newstate = (int)ctx[2];
    if (state_change_needs_nothing(oldstate, newstate)) /* most changes: before any line is touched */
        return 0;
    const u8 *sk = (const u8 *)ctx[0];
    if (SK_FIELD(u16, sk, AZP_SK_PROTOCOL) != AZP_IPPROTO_TCP)
        return 0;
    u64 sock_id = sock_id_of(ctx);
    if (state_change_dismissed(sock_id, oldstate, newstate))
        return 0;
    struct sock_endpoints ep;
    if (read_endpoints(sk, &ep))
        connect_state_change(sock_id, newstate, &ep.addrs, ep.sport, ep.dport, ep.family);
    return 0;
}

/* TP_PROTO(struct sock *sk) */
BTF_TRACEPOINT(tcp_receive_reset)
{
    reset_received(sock_id_of(ctx));
    return 0;
}

/* TP_PROTO(struct sock *sk, const u8 ca_state) */
BTF_TRACEPOINT(tcp_cong_state_set)
{
    u64 sock_id = sock_id_of(ctx);
    if (!loss_needs_addrs(sock_id, (u8)ctx[1]))
        return 0;
    struct sock_endpoints ep;
    if (read_endpoints((const u8 *)ctx[0], &ep))
        loss_entered(sock_id, &ep.addrs, ep.sport, ep.dport, ep.family);
    return 0;
}

#else
/* ---- classic tracepoints, where the kernel's BTF cannot give the offsets ------------ */

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    if (port_not_ephemeral(args->sport) || rtt_tick_skipped())
        return 0;
    struct flow_id f = {.dport = args->dport};
    /* saddr/daddr hold a sockaddr_in (address at 4) or sockaddr_in6 (address at 8). */
    if (args->family == AZP_AF_INET) {
        u32 s4, d4;
        __builtin_memcpy(&s4, &args->saddr[4], 4);
        __builtin_memcpy(&d4, &args->daddr[4], 4);
        f.saddr_lo = v4_mapped_lo(s4);
        f.daddr_lo = v4_mapped_lo(d4);
    } else if (args->family == AZP_AF_INET6) {
        __builtin_memcpy(&f.saddr_hi, &args->saddr[8], 8);
        __builtin_memcpy(&f.saddr_lo, &args->saddr[16], 8);
        __builtin_memcpy(&f.daddr_hi, &args->daddr[8], 8);
        __builtin_memcpy(&f.daddr_lo, &args->daddr[16], 8);
    } else {
        return 0;
    }
    u32 slot = flow_slot(&f);
    struct azp_flow_slot *e = flow_cache_at(slot, &f);
    if (e) {
        u64 bucket = azp_bucket_index(args->srtt);
        rtt_add(e->path, bucket, 1);
        host_rtt_add(slot, bucket);
    }
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != AZP_IPPROTO_TCP)
        return 0;
    u64 sock_id = (u64)args->skaddr;
    int newstate = args->newstate;
    if (state_change_dismissed(sock_id, args->oldstate, newstate))
        return 0;
    struct addr_pair addrs;
    COPY_ADDRS(addrs, args);
    connect_state_change(sock_id, newstate, &addrs, args->sport, args->dport, args->family);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
    reset_received((u64)args->skaddr);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
    u64 sock_id = (u64)args->skaddr;
    if (!loss_needs_addrs(sock_id, args->cong_state))
        return 0;
    struct addr_pair addrs;
    COPY_ADDRS(addrs, args);
    loss_entered(sock_id, &addrs, args->sport, args->dport, args->family);
    return 0;
}
#endif

/* Retransmits stay on the classic tracepoint: they are rare (no cost worth a second
 * variant), and whether the tracepoint's arguments carry `err` depends on the kernel. */
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
    struct azp_host_counters *h = host_find(path, addrs.daddr);
    if (h)
        h->retrans += 1;
    if (args->state == AZP_TCP_SYN_SENT) {
        c->syn_retrans += 1;
        emit(AZP_EV_SYN_RETRANS, path, &addrs, args->sport,
             args->dport, args->family);
    }
    return 0;
}

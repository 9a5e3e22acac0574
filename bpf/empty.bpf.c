/* Baseline for bench/probe_overhead.py: the cheapest possible tcp_probe handler, on the
 * hook kind the agent's handler uses (BTF-typed where the agent hooks tp_btf: the bench
 * compiles it with the agent's -DAZP_BTF_HOOKS and loads it as the agent does), so its
 * bpf_stats run time is the fixed cost every handler there pays. */
#ifdef AZP_BTF_HOOKS
int tp_btf__tcp_probe(u64 *ctx)
{
    return 0;
}
#else
TRACEPOINT_PROBE(tcp, tcp_probe)
{
    return 0;
}
#endif

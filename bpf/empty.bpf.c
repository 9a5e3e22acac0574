/* Baseline for bench/probe_overhead.py: the cheapest possible tcp_probe handler, on the
 * hook the agent's handler uses (raw where the agent hooks raw tracepoints: the bench
 * compiles it with the agent's -DAZP_RAW_HOOKS), so its bpf_stats run time is the fixed
 * cost every handler there pays. */
#ifdef AZP_RAW_HOOKS
RAW_TRACEPOINT_PROBE(tcp_probe)
{
    return 0;
}
#else
TRACEPOINT_PROBE(tcp, tcp_probe)
{
    return 0;
}
#endif

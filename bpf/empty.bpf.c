/* Baseline for bench/probe_overhead.py: the cheapest possible tcp:tcp_probe handler, so
 * its bpf_stats run time is the fixed cost every handler pays. */
TRACEPOINT_PROBE(tcp, tcp_probe)
{
    return 0;
}

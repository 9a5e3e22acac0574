"""The Prometheus face of both daemons: the name, type, help text and labels of every
series the agent's and the controller's /metrics export, and the histogram buckets the
controller's Prometheus source reads back.

The exporters and the reader import this module (agent and controller never import each
other), so a name or a bucket bound cannot drift between writer and reader.

Histograms are *classic* Prometheus histograms with a small fixed set of buckets, not
native ones (docs/prometheus.md says why). Every bucket bound is a loglin-16 bucket
lower bound (azprobe.contracts.sketch), so each classic bucket is a union of whole
loglin-16 buckets and the exported cumulative counts are exact; only resolution is lost:
4 buckets per octave from 64 µs to 2^22 µs (~4.2 s), i.e. a bucket is at most 25 % of its
lower bound wide. Values are integer µs, so a bucket `le=B` holds the values < B (the
loglin-16 buckets below B), which differs from Prometheus's "≤ B" by at most 1 µs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from azprobe.contracts.sketch import Histogram, bucket_index, bucket_lower_bound
from azprobe.contracts.window import COUNTER_FIELDS, HISTOGRAM_FIELDS

# -- names ---------------------------------------------------------------------------
# Every series both daemons export is named here, with its type and help text; the
# exporters take all three from here, and `defined_families` lists them. Naming rules
# (Prometheus's): base units (seconds, not ms or ns) as the name's last word; a counter's
# family name has no `_total` (the exposition appends it); no gauge ends in `_total`; one
# series per fact; help says what the series means.
LABEL_NODE = "node"
LABEL_SRC = "src_az"
LABEL_DST = "dst_az"
LABEL_AZ = "az"
LABEL_BOOT_ID = "boot_id"
LABEL_KIND = "kind"
LABEL_PROG = "prog"
LABEL_STATE = "state"
LABEL_UPPER = "upper"
PATH_LABELS = (LABEL_NODE, LABEL_SRC, LABEL_DST)
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


def counter_family_name(name: str) -> str:
    """A counter's family name: `name` without a trailing `_total` (the exposition adds
    it back, once)."""
    return name.removesuffix("_total")


@dataclass(frozen=True)
class Family:
    """One metric family: its name (a counter's without `_total`), type, help and labels."""

    name: str
    kind: str  # COUNTER, GAUGE or HISTOGRAM
    help: str
    labels: tuple[str, ...] = ()

    @property
    def series(self) -> str:
        """The name as scraped: a counter's with `_total` (a histogram's samples add
        `_bucket`, `_sum` and `_count`)."""
        return f"{counter_family_name(self.name)}_total" if self.kind == COUNTER else self.name


# ---- agent, per path (node, src_az, dst_az), cumulative since the agent started ----
_PATH_COUNTER_HELP = {
    "conn_attempts": "Connects this node started on the path (SYN sent)",
    "conn_ok": "Connects on the path that reached ESTABLISHED",
    "conn_refused": "Connects on the path refused by the peer (RST in SYN_SENT)",
    "conn_timeout": "Connects on the path that closed in SYN_SENT without a reset (timed out or aborted)",
    "syn_retrans": "SYN retransmits of connects on the path",
    "retrans": "TCP segments retransmitted on the path, SYNs included",
    "rto": "Retransmission timeouts of established connections on the path (entries into TCP_CA_Loss)",
    "syn_rto": "Retransmission timeouts of connects still in SYN_SENT on the path (SYN timeouts)",
}
assert set(COUNTER_FIELDS) <= set(_PATH_COUNTER_HELP)
# The window contract's counters and the agent's extra ones (syn_rto), by field name.
PATH_COUNTERS = {name: Family(f"azprobe_path_{name}", COUNTER, text, PATH_LABELS)
                 for name, text in _PATH_COUNTER_HELP.items()}
COUNTER_SERIES = {name: f.series for name, f in PATH_COUNTERS.items()}
# Histograms in seconds (Prometheus's base unit); the window holds µs.
PATH_HISTOGRAMS = {
    "rtt_us": Family("azprobe_path_rtt_seconds", HISTOGRAM, "Smoothed RTT (srtt) samples of the node's TCP "
                     "connections on the path, seconds; _sum is approximate (bucket lower bounds)", PATH_LABELS),
    "connect_us": Family("azprobe_path_connect_seconds", HISTOGRAM, "Connect latency (SYN sent to ESTABLISHED) "
                         "on the path, seconds; _sum is approximate (bucket lower bounds)", PATH_LABELS),
}
assert tuple(PATH_HISTOGRAMS) == HISTOGRAM_FIELDS
HISTOGRAM_FAMILY = {name: f.name for name, f in PATH_HISTOGRAMS.items()}
HISTOGRAM_BUCKET_SERIES = {name: f"{family}_bucket" for name, family in HISTOGRAM_FAMILY.items()}
# The same buckets, *not* cumulative and only those with samples: what the controller's
# Prometheus source reads. A classic histogram is dense (every bucket above the data
# changes with it: 66 series per histogram); these are ~3-6 per path, so the controller
# decodes ~8x less. Label `upper` (the bucket's upper bound, like `le`), not `le`, so no
# tool mistakes them for a histogram.
PATH_HITS = {name: Family(f"{family}_hits", COUNTER, f"Samples in each bucket of {family} (by upper bound, not "
                          "cumulative; only buckets with samples)", (*PATH_LABELS, LABEL_UPPER))
             for name, family in HISTOGRAM_FAMILY.items()}
HITS_SERIES = {name: f.series for name, f in PATH_HITS.items()}

# ---- agent, per node: each with the `node` label, so the controller can group by node ----
INFO = Family("azprobe_agent_info", GAUGE, "Always 1; the labels name the agent's node, AZ and boot (a new "
              "boot_id: the agent restarted)", (LABEL_NODE, LABEL_AZ, LABEL_BOOT_ID))
CPU = Family("azprobe_agent_cpu_utilisation", GAUGE, "Node CPU utilisation (0..1) over the agent's latest "
             "window", (LABEL_NODE,))
MEM = Family("azprobe_agent_mem_utilisation", GAUGE, "Node memory utilisation (0..1) at the agent's latest "
             "window", (LABEL_NODE,))
LOST = Family("azprobe_agent_lost_events", COUNTER, "Probe event records the kernel dropped because the ring "
              "buffer was full (counters and histograms are unaffected)", (LABEL_NODE,))
INFO_SERIES, CPU_SERIES, MEM_SERIES, LOST_SERIES = INFO.series, CPU.series, MEM.series, LOST.series

# ---- agent: the probe and the agent itself ----
EVENTS = Family("azprobe_events", COUNTER, "Connection events the probe reported with their addresses "
                "(/v1/events), by kind", (LABEL_KIND,))
BPF_RUN_TIME = Family("azprobe_bpf_run_time_seconds", COUNTER, "CPU time spent in each BPF handler (stays 0 "
                      "unless sysctl kernel.bpf_stats_enabled=1)", (LABEL_PROG,))
BPF_RUN_COUNT = Family("azprobe_bpf_run_count", COUNTER, "Runs of each BPF handler (stays 0 unless sysctl "
                       "kernel.bpf_stats_enabled=1)", (LABEL_PROG,))
# The agent's scalars (`MetricsSource.gauges()` keys), exported by one rule: a key ending
# in `_total` is a count since start, counter `azprobe_<key>`; any other key is gauge
# `azprobe_<key>`. Each needs its help text here. NODE_SCALARS are exported with the
# `node` label instead, as the family given.
_AGENT_SCALAR_HELP = {
    "window_seq": "Sequence number of the agent's latest window (1, 2, ... per boot; stuck: the agent stopped "
                  "reading the probe)",
    "untracked_connects_total": "Connects whose outcome the BPF probe could not track (their set of in-flight "
                                "slots was full); their attempts still count",
    "handler_misses_total": "Runs of the BPF probe's handlers the kernel skipped (its recursion guard: another BPF "
                            "program, or a map read, was under way on that CPU); what they would have counted "
                            "is lost",
    "hosts_dropped_total": "Per-destination-host summaries the BPF probe could not keep because its host table "
                           "([agent] max_hosts) was full: connects to a host left out, and readings of samples of "
                           "such a host",
    "topology_prefixes": "Address prefixes in the agent's topology (all AZs)",
    "rtt_sample_ticks": "The BPF probe takes RTT samples during one kernel tick in this many (0: the sock_diag "
                        "collector)",
    "btf_hooks": "1 when the BPF probe hooks BTF-typed tracepoints (tp_btf), 0 for classic tracepoints or the "
                 "sock_diag collector",
}
NODE_SCALARS = {"lost_events_total": LOST}
HTTP_CONNECTIONS = Family("azprobe_http_connections", GAUGE, "Connections open to the agent's HTTP server now")
HTTP_CLOSED = Family("azprobe_http_connections_closed", COUNTER, "Connections the agent's HTTP server closed: "
                     "evicted for a newer one when its cap was reached, timeout at a whole-request or idle "
                     "deadline, refused when it could not take them, tls when its TLS handshake failed or the client's "
                     "certificate lacks agent.tls.client_identity, rotated when its TLS material was "
                     "replaced", ("reason",))
HTTP_BUSY = Family("azprobe_http_busy", COUNTER, "Requests the agent answered 503 because every slot of their pool "
                   "was taken", ("pool",))


def agent_scalar(key: str) -> Family:
    """The family of agent scalar `key`, by the rule above; KeyError naming the fix when
    the key has no help text."""
    if key in NODE_SCALARS:
        return NODE_SCALARS[key]
    text = _AGENT_SCALAR_HELP.get(key)
    if text is None:
        raise KeyError(f"agent scalar {key!r} has no help text: add it to azprobe.contracts.prom._AGENT_SCALAR_HELP")
    is_counter = key.endswith("_total")
    return Family(f"azprobe_{counter_family_name(key)}", COUNTER if is_counter else GAUGE, text)


# ---- controller: its own global decision (leader or standby) and its loop ----
ZONE_HEALTH = Family("azprobe_zone_health", GAUGE, "Health H (0..1) of the destination AZ in this controller's "
                     "global decision", (LABEL_AZ,))
ZONE_WEIGHT = Family("azprobe_zone_weight", GAUGE, "Decay weight exp(-2 (1 - H)) of the destination AZ",
                     (LABEL_AZ,))
ZONE_SHARE = Family("azprobe_zone_share", GAUGE, "Traffic share of the destination AZ, integer percent (the AZs "
                    "sum to 100)", (LABEL_AZ,))
ZONE_RTT_P95 = Family("azprobe_zone_rtt_p95_seconds", GAUGE, "P95 smoothed RTT towards the destination AZ, "
                      "seconds (NaN without RTT samples)", (LABEL_AZ,))
ZONE_SUCCESS = Family("azprobe_zone_success", GAUGE, "Connect success rate (0..1) towards the destination AZ: "
                      "ok / (ok + refused + timed out); NaN when no connect completed", (LABEL_AZ,))
ZONE_STATE = Family("azprobe_zone_state", GAUGE, "1 for the destination AZ's current state, 0 for the others",
                    (LABEL_AZ, LABEL_STATE))
CYCLE = Family("azprobe_controller_cycle_seconds", HISTOGRAM, "Wall time of one controller cycle (collect, "
               "decide, publish)")
PULL = Family("azprobe_controller_pull_seconds", HISTOGRAM, "Wall time of one cycle's reads of the agents (or "
              "of Prometheus)")
AGENTS = Family("azprobe_controller_agents", GAUGE, "Agents by state: up (new windows), stale (no new window "
                "for stale_after_s), failing (the last read failed)", (LABEL_STATE,))
LEADER = Family("azprobe_controller_leader", GAUGE, "1 while this controller holds the leader lock, else 0")
CONSUL_UP = Family("azprobe_controller_consul_up", GAUGE, "1 while Consul answers this controller, else 0")
GENERATION = Family("azprobe_controller_generation", GAUGE, "Generation of the last weights document this "
                    "controller wrote")
LAST_WRITE = Family("azprobe_controller_last_write_timestamp_seconds", GAUGE, "Unix time (generated_at) of the "
                    "last weights document this controller wrote")
SICK_HOSTS = Family("azprobe_controller_sick_hosts", GAUGE, "Hosts of the destination AZ this controller's "
                    "global decision names sick (after operator pins): the data plane demotes them", (LABEL_AZ,))
PINNED_HOSTS = Family("azprobe_controller_pinned_hosts", GAUGE, "Operator host pins (control/host/<addr>) in force: "
                      "hosts the controller never names")
HOST_NAMING_OFF = Family("azprobe_controller_host_naming_off", GAUGE, "1 while control/hosts-off is in force (no "
                         "host named, zones judged without host evidence), else 0")
CONTROL_KEYS_IGNORED = Family("azprobe_controller_control_keys_ignored", GAUGE, "Keys under control/ the last read "
                              "ignored (a bad value, an unknown name, a bound exceeded): the log says why")
CATALOG_READ_ERRORS = Family("azprobe_controller_catalog_read_errors", COUNTER, "Reads of the agents' catalog "
                             "service (agents.discover = \"consul\") that failed; the last agent list stayed in force")
SPIKE = Family("azprobe_detector_spike", GAUGE, "1 while the failures towards the AZ in the current detector "
               "bucket are a spike, else 0", (LABEL_AZ,))
SPIKE_LAMBDA = Family("azprobe_detector_lambda", GAUGE, "Mean failures per detector bucket towards the AZ over "
                      "the detector's window (the Poisson baseline a spike is judged against)", (LABEL_AZ,))
SPIKES = Family("azprobe_detector_spikes", COUNTER, "Failure spikes towards the AZ that started", (LABEL_AZ,))

# `azprobe xds`, the xDS management server.
LABEL_VIEW = "view"  # the weights document a stream gets: "global" or the client's zone
LABEL_TYPE = "type"  # an xDS resource type, short: Listener, RouteConfiguration, Cluster, ClusterLoadAssignment
LABEL_REASON = "reason"
LABEL_SERVICE = "service"
XDS_STREAMS = Family("azprobe_xds_streams", GAUGE, "xDS streams open now, by kind (ads-sotw, ads-delta, eds-sotw, "
                     "eds-delta) and by the view they get", (LABEL_KIND, LABEL_VIEW))
XDS_PUSHES = Family("azprobe_xds_pushes", COUNTER, "xDS responses sent, by resource type", (LABEL_TYPE,))
XDS_NACKS = Family("azprobe_xds_nacks", COUNTER, "xDS responses a client rejected (its error_detail is logged); the "
                   "same version is not sent to that stream again", (LABEL_TYPE,))
XDS_REFUSED = Family("azprobe_xds_refused_streams", COUNTER, "xDS streams closed with an error status, by reason "
                     "(streams, per_client, protocol, first_request_timeout, idle, draining)", (LABEL_REASON,))
XDS_PUSH_DELAY = Family("azprobe_xds_push_seconds", HISTOGRAM, "Time from this server reading a weights or "
                        "endpoints change from Consul to a stream's write of it")
XDS_UNZONED = Family("azprobe_xds_endpoints_outside_topology", GAUGE, "Catalog instances of the service whose "
                     "address is in no AZ of [topology]: left out of the assignment", (LABEL_SERVICE,))
XDS_ENDPOINTS = Family("azprobe_xds_endpoints", GAUGE, "Endpoints of the service in the assignment being served",
                       (LABEL_SERVICE,))
XDS_WEIGHTS = Family("azprobe_xds_view_weights", GAUGE, "1 for the weights each view serves now: document (a "
                     "fresh weights document) or equal (none usable: equal weights), 0 for the other",
                     (LABEL_VIEW, LABEL_STATE))
XDS_CONSUL_ERRORS = Family("azprobe_xds_consul_errors", COUNTER, "Failed Consul reads (weights or catalog); the "
                           "last good state keeps being served")

# ---- the scheduler extender (azprobe.consumers.scheduler) ----
LABEL_VERB = "verb"
EXTENDER_REQUESTS = Family("azprobe_extender_requests", COUNTER, "Extender requests answered, by verb (filter, "
                           "prioritize) and HTTP status code", (LABEL_VERB, "code"))
EXTENDER_NEUTRAL = Family("azprobe_extender_neutral_answers", COUNTER, "Extender answers that removed no node and "
                          "gave every node the same score because the weights could not be used, by verb and "
                          "reason (stale, absent, unreachable, rejected, waiting, would_leave_no_node)",
                          (LABEL_VERB, LABEL_REASON))
EXTENDER_WEIGHTS = Family("azprobe_extender_weights_state", GAUGE, "1 for the state of the weights the extender "
                          "answers from, 0 for the others: fresh (its answers follow them), or why its answers are "
                          "neutral (stale, absent, unreachable, rejected, waiting)", (LABEL_STATE,))
EXTENDER_FILTERED = Family("azprobe_extender_filtered_nodes", COUNTER, "Nodes the extender's filter removed "
                           "because their zone is failover only")
EXTENDER_UNKNOWN_ZONE = Family("azprobe_extender_unknown_zone_nodes", COUNTER, "Nodes the extender could give no "
                               "zone of the weights document (no zone label, no name mapping, or a zone outside "
                               "the document): neutral score, never filtered")
EXTENDER_SECONDS = Family("azprobe_extender_request_seconds", HISTOGRAM, "Wall time of one extender answer, from "
                          "the whole body read to the answer encoded, by verb", (LABEL_VERB,))

# ---- the controller's pulls over mutual TLS (controller/agent_identity.py) ----
AGENT_IDENTITY_REFUSED = Family("azprobe_controller_agent_identity_refused", COUNTER, "Agent answers refused whole "
                                "because the agent's certificate may not speak for the node the answer names, by "
                                "reason (mismatch: another node's certificate; no_identity: no SAN of the "
                                "agents.identity form; shared_certificate: a certificate another URL answers "
                                "with; not_tls)", (LABEL_REASON,))
AGENT_TLS_FAILURES = Family("azprobe_controller_agent_tls_failures", COUNTER, "Pulls whose TLS handshake with the "
                            "agent failed, by reason (unknown_ca, expired, client_certificate_refused, not_tls, "
                            "other)", (LABEL_REASON,))

# The controller's totals (`ControllerMetrics.add_totals`), one rule: every int field `f`
# of a counters dataclass registered under a prefix is counter `<prefix>_<f>` (exposition
# `_total`), with its help text from here.
COLLECT_PREFIX = "azprobe_controller_collect"
KV_PREFIX = "azprobe_controller_kv"
TOPOLOGY_PREFIX = "azprobe_controller_topology"
_TOTALS_HELP: dict[str, dict[str, str]] = {
    COLLECT_PREFIX: {
        "windows_ingested": "Agent windows accepted into the window store",
        "windows_garbage": "Agent windows (or Prometheus series) dropped because they break the window contract",
        "windows_duplicate": "Agent windows dropped because their seq or their node's window for that end was "
                             "already held",
        "windows_too_old": "Agent windows skipped because they end too long before the agent's newest one (older "
                           "than the window store holds)",
        "windows_over_cap": "Agent windows dropped because their node already holds an evaluation window's worth "
                            "of windows",
        "answers_refused": "Agent answers refused whole: no node name, a name other than the one the URL spoke for "
                           "first, or a name another URL holds",
        "gap_windows": "Agent windows lost before this controller read them (the agent's ring wrapped)",
        "gap_events": "Times a read found a gap in an agent's window sequence",
        "agent_restarts": "Agent restarts seen (a new boot_id)",
        "pull_errors": "Reads of an agent (or of Prometheus) that failed: refused, HTTP error, bad body",
        "pull_timeouts": "Reads of an agent (or of Prometheus) that timed out",
        "pull_overruns": "Prometheus source cycles that found the previous query still being read, so sent no "
                         "second one",
    },
    KV_PREFIX: {
        "writes": "Weights transactions this controller committed to Consul",
        "conflicts": "Weights transactions Consul rolled back because this controller no longer held the lock",
        "invalid_docs": "Weights views this controller refused to write because they break the weights contract "
                        "(a bug: the log says which)",
        "skipped_unchanged": "Leader cycles that wrote nothing because no share or state changed and no heartbeat "
                             "was due",
        "write_errors": "Weights transactions Consul failed (not conflicts); retried with backoff",
        "generation_restarts": "Times the leader found an implausible generation in KV and restarted the "
                               "numbering at 1",
        "control_read_errors": "Reads of the operator controls (control/) that failed; the last good controls "
                               "stayed in force",
    },
    TOPOLOGY_PREFIX: {
        "windows_unknown_az": "Agent windows dropped whole because their own AZ is not configured",
        "paths_foreign_src": "Window paths dropped because their source is not the window's own AZ",
        "paths_unknown_dst": "Window paths dropped because their destination is neither configured nor other",
        "hosts_foreign": "Window host summaries dropped because their source is not the window's own AZ or their "
                         "destination is not configured",
    },
}


def controller_total(prefix: str, field_name: str) -> Family:
    """The counter of field `field_name` of the totals registered under `prefix`, by the
    rule above; KeyError naming the fix when it has no help text."""
    text = _TOTALS_HELP.get(prefix, {}).get(field_name)
    if text is None:
        raise KeyError(f"{prefix}_{field_name}: no help text; add {field_name!r} to "
                       f"azprobe.contracts.prom._TOTALS_HELP[{prefix!r}]")
    return Family(f"{prefix}_{counter_family_name(field_name)}", COUNTER, text)


def defined_families() -> list[Family]:
    """Every family defined here: what the agent's and the controller's /metrics may
    export (docs/contracts.md "Metrics" lists them)."""
    fixed = [v for v in globals().values() if isinstance(v, Family)]
    return [*PATH_COUNTERS.values(), *PATH_HISTOGRAMS.values(), *PATH_HITS.values(), *fixed,
            *(agent_scalar(key) for key in _AGENT_SCALAR_HELP),
            *(controller_total(prefix, name) for prefix, names in _TOTALS_HELP.items() for name in names)]


MAX_AZ_NAMES = 17  # the probe's 16 AZ ids plus "other"

# -- buckets -------------------------------------------------------------------------
BUCKETS_PER_OCTAVE = 4
FIRST_BOUND_US = 1 << 6  # 64 µs: below it the model's ms-scale tolerances see no difference
LAST_OCTAVE = 22  # the last finite bound is 1.75 * 2^21 µs; beyond 2^22 µs is +Inf


def _bounds() -> tuple[int, ...]:
    out = []
    for octave in range(6, LAST_OCTAVE):
        for k in range(BUCKETS_PER_OCTAVE):
            out.append((1 << octave) + k * ((1 << octave) // BUCKETS_PER_OCTAVE))
    out.append(1 << LAST_OCTAVE)
    return tuple(out)


BUCKET_BOUNDS_US: tuple[int, ...] = _bounds()  # 65 finite bounds, ascending
assert all(bucket_lower_bound(bucket_index(b)) == b for b in BUCKET_BOUNDS_US)
INF = math.inf


def le_text(bound_us: float) -> str:
    """The `le` label of a bound in µs, as the Python client prints it (seconds)."""
    return "+Inf" if bound_us == INF else f"{bound_us / 1e6:.6f}".rstrip("0")


_BOUND_SET = frozenset(BUCKET_BOUNDS_US)


def bound_from_le(text: object) -> float | None:
    """Reader side: an `le` label -> its bound in µs, or None when it is not one of ours.
    Parsed as a number, not matched as text: a Prometheus-compatible store may print
    0.000064 as 6.4e-05."""
    if not isinstance(text, str) or len(text) > 32:
        return None
    if text in ("+Inf", "Inf", "+inf", "inf"):
        return INF
    try:
        us = float(text) * 1e6
    except ValueError:
        return None
    if not math.isfinite(us):
        return None
    bound = round(us)
    return float(bound) if bound in _BOUND_SET and abs(us - bound) < 0.01 else None


def cumulative_buckets(hist: Histogram) -> list[tuple[str, int]]:
    """(le, cumulative count) for every bucket, +Inf last: the exposition of `hist`."""
    counts = sorted(hist.counts.items())
    out: list[tuple[str, int]] = []
    seen, i = 0, 0
    for bound in BUCKET_BOUNDS_US:
        while i < len(counts) and counts[i][0] < bound:
            seen += counts[i][1]
            i += 1
        out.append((le_text(bound), seen))
    out.append(("+Inf", seen + sum(n for _, n in counts[i:])))
    return out


def bucket_hits(hist: Histogram) -> list[tuple[str, int]]:
    """(upper bound, count) of every classic bucket with samples, not cumulative."""
    out = []
    below = 0
    for le, cumulative in cumulative_buckets(hist):
        if cumulative > below:
            out.append((le, cumulative - below))
        below = cumulative
    return out


def _fine_buckets(lo: int, hi: int) -> list[tuple[int, int]]:
    """(lower bound, width) of the loglin-16 buckets covering [lo, hi)."""
    out = []
    index = bucket_index(lo)
    while True:
        lower = bucket_lower_bound(index)
        if lower >= hi:
            return out
        upper = bucket_lower_bound(index + 1)
        out.append((lower, upper - lower))
        index += 1


_INDEX_OF: dict[float, int] = {b: i for i, b in enumerate(BUCKET_BOUNDS_US)}
_FINE = [_fine_buckets(lo, hi) for lo, hi in zip((0,) + BUCKET_BOUNDS_US[:-1], BUCKET_BOUNDS_US)]


def histogram_from_deltas(deltas: Mapping[float, int]) -> Histogram:
    """Per-bucket counts (not cumulative) keyed by `le` bound in µs -> a loglin-16
    Histogram. A classic bucket's count is spread over the loglin-16 buckets it covers in
    proportion to their width (uniform density, what histogram_quantile assumes too), so
    Histogram.quantile interpolates across the whole classic bucket; +Inf counts sit at
    the last bound. Unknown bounds raise ValueError."""
    hist = Histogram()
    for bound, n in deltas.items():
        if n <= 0:
            continue
        if bound == INF:
            hist.add_bucket(BUCKET_BOUNDS_US[-1], n)
            continue
        i = _INDEX_OF.get(bound)  # type: ignore[arg-type]
        if i is None:
            raise ValueError(f"le={bound} µs is not one of azprobe's histogram buckets")
        fine = _FINE[i]
        total_width = sum(w for _, w in fine)
        covered, given = 0, 0
        for lower, width in fine:
            covered += width
            share = (n * covered + total_width // 2) // total_width  # rounded cumulative share
            hist.add_bucket(lower, share - given)
            given = share
    return hist

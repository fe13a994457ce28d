"""Ranks blocked in a send or receive whose peer the dump does not name.

Takes `Facts`; returns one `p2p_unmatched` warning per group where some ranks wait in such
an op. The CUPTI comms monitor records P2P ops without their peer or sequence number (NCCL's
profiler plugin does not describe them), so nothing can pair them and no P2P rule sees
them. A rank blocked in one is still waiting somewhere: the warning makes it a holder that
linking can see, so the collectives such a rank never reached are consequences, not roots;
and with nothing else to go on, the job is inconclusive rather than healthy.
"""

from __future__ import annotations

from collections import defaultdict

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding
from frtrace.model import Entry
from frtrace.wording import group_text, ranks_text


def blocked_in_peerless_p2p(facts: Facts) -> list[Finding]:
    """The rule (see module docstring)."""
    if not facts.reliable:
        return []
    blocked: dict[str, list[tuple[int, Entry]]] = defaultdict(list)  # group name -> (rank, its op)
    for rank, entry in facts.blocked_entry.items():
        if entry.is_p2p and entry.name.local_src is None and entry.name.local_dst is None:
            blocked[entry.pg_name].append((rank, entry))
    views = {view.group.name: view for view in facts.device.views}
    findings = []
    for name, held in sorted(blocked.items()):
        view = views.get(name)
        if view is None:
            continue
        ranks = tuple(sorted(rank for rank, _ in held))
        first = held[0][1]
        one = len(ranks) == 1
        findings.append(new_finding(
            "p2p_unmatched", "peerless_p2p.blocked_in_peerless_p2p", view, severity="warning", op=first.op,
            collective_seq_id=None, p2p_seq_id=None, ranks=ranks, suspect_ranks=(),
            message=(f"{ranks_text(ranks)} {'is' if one else 'are'} blocked in a P2P op ({first.name.profiling_name}) "
                     f"of {group_text(view.group.name, view.group.desc)} whose peer the dump does not name: nothing "
                     f"can pair it, so who {'it waits' if one else 'they wait'} for is unknown"),
            evidence={"blocked_ranks": list(ranks), "profiling_name": first.name.profiling_name},
            waiting_ranks=ranks, age_ns=min(entry.time_created_ns for _, entry in held),
        ))
    return findings

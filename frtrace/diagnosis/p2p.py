"""Point-to-point: sends and receives left without their partner.

Takes `Facts`; returns `p2p_unmatched` findings, one per (group, src, dst) channel,
naming the rank that posted its op and the one that never posted the partner.
"""

from __future__ import annotations

from frtrace.diagnosis.facts import Facts, new_finding
from frtrace.diagnosis.finding import Finding, P2PEnds
from frtrace.match.matcher import GroupView, P2PMatch
from frtrace.wording import call_site, group_text


def unmatched_p2p(facts: Facts) -> list[Finding]:
    """The rule: per channel, the first pending op the other end never matched. A
    completed op had its partner, which merely fell off a ring buffer."""
    findings: list[Finding] = []
    for view in facts.device.views:
        reported: set[tuple[int, int]] = set()
        for pair in facts.p2p_of(view):
            if not pair.one_sided or (pair.src, pair.dst) in reported:
                continue
            present = pair.send or pair.recv
            assert present is not None
            if facts.reliable and present.completed:
                continue
            reported.add((pair.src, pair.dst))
            findings.append(_unmatched(view, pair))
    return findings


def _unmatched(view: GroupView, pair: P2PMatch) -> Finding:
    present = pair.send or pair.recv
    assert present is not None
    holder, absent = (pair.src, pair.dst) if pair.send else (pair.dst, pair.src)
    absent_op = "recv" if pair.send else "send"
    message = (
        f"rank {holder} posted {present.op} {pair.src if pair.src >= 0 else '?'}->{pair.dst} "
        f"(p2p #{present.p2p_seq_id} in {group_text(view.group.name, view.group.desc)}) "
        f"but rank {absent if absent >= 0 else '?'} never posted the matching {absent_op}"
        + (" (it has no dump)" if absent in view.no_dump else "")
    )
    evidence = {"src": pair.src, "dst": pair.dst, "posted_by": holder, "missing_on": absent, "state": present.state}
    site = call_site(present)
    if site:
        evidence["peer_call_site"] = site
    known = (absent,) if absent >= 0 else ()
    return new_finding(
        "p2p_unmatched", "p2p.unmatched_p2p", view, op=present.op, collective_seq_id=None, p2p_seq_id=present.p2p_seq_id,
        ranks=tuple(sorted({holder, absent} - {-1})), suspect_ranks=known, message=message, evidence=evidence,
        waiting_ranks=(holder,), age_ns=present.time_created_ns, absent_ranks=known, anchor=present,
        p2p_ends=P2PEnds(pair.src, pair.dst, holder, absent), call_entries={"peer_call_site": present} if site else {},
    )

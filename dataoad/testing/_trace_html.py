"""A counterexample as a picture: a self-contained HTML sequence diagram.

One lane per contender (and operator), plus the provider, the verifier and
the ledger; each step numbered as in the text trace, drawn as a marker on
its actor's lane with arrows to the lanes it touched. Faults are drawn in
red, and the broken property heads the page. The page is static SVG and
CSS in one file: no script, no network, no external asset.
"""

from __future__ import annotations

import dataclasses
import html
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["TraceStep", "render_html", "steps_from_adapter", "steps_from_history"]

#: Shared lanes, right of the actors, in this order.
SYSTEM_LANES = ("provider", "verifier", "ledger")
_GATE = re.compile(r"^(ledger|provider|verifier)\.(\w+): (.*)$")
_FAULT_WORDS = re.compile(
    r"fail|timeout|time out|lose|lost|reset|malformed|outage|crash|stale|wrong|unavailable|"
    r"degraded|raise|declin|reject|gives up|broken|down|sandbox|staged|refus",
    re.I,
)
_LANE_WIDTH, _TOP, _LINE = 150, 96, 14
#: Steps are labelled, wrapped, right of the lanes; notes and replies wrap under arrows.
_LABEL_WIDTH, _LABEL_CHARS, _NOTE_CHARS = 330, 46, 22


@dataclasses.dataclass(frozen=True, slots=True)
class TraceStep:
    """One numbered step: who acted, what happened, and what it touched (lane -> note)."""

    number: int
    actor: str
    text: str
    touches: Mapping[str, str] = dataclasses.field(default_factory=dict)
    fault: bool = False
    #: What came back to the actor (drawn as a dashed reply), if the trace says.
    reply: str | None = None


def _is_fault(text: str) -> bool:
    return bool(_FAULT_WORDS.search(text)) and "fault-free" not in text


def steps_from_adapter(steps: Iterable[Mapping[str, Any]]) -> list[TraceStep]:
    """Steps of a ``dataoad check`` trace (``AdapterViolation.steps``)."""
    found = []
    for step in steps:
        text = str(step["text"])
        touches: dict[str, str] = {}
        if step.get("provider"):
            touches["provider"] = str(step["provider"])
        if step.get("verifier"):
            touches["verifier"] = str(step["verifier"])  # what it actually answered
        else:
            read = re.search(r"verifier read: ([^;)]+)", text)
            if read:
                touches["verifier"] = read.group(1)
        if step.get("ledger"):
            touches["ledger"] = str(step["ledger"])
        actor = str(step["actor"])
        asked, arrow, answer = text.partition(" -> ")
        found.append(
            TraceStep(
                int(step["number"]),
                actor,
                asked if arrow else text,
                touches,
                fault=actor == "checker" or _is_fault(asked),
                reply=answer if arrow else None,
            )
        )
    return found


def steps_from_history(events: Iterable[Any]) -> list[TraceStep]:
    """Steps of a state machine's history (objects with ``actor`` and ``text``)."""
    found = []
    for number, event in enumerate(events, 1):
        actor, text = str(event.actor), str(event.text)
        gate = _GATE.match(text)
        touches = {gate.group(1): f"{gate.group(2)}: {gate.group(3)}"} if gate else {}
        fault = _is_fault(gate.group(3) if gate else text) and "none" not in text.lower()
        found.append(TraceStep(number, actor, text, touches, fault))
    return found


def _lanes(steps: Sequence[TraceStep]) -> list[str]:
    actors: list[str] = []
    for step in steps:
        if step.actor not in actors and step.actor not in SYSTEM_LANES:
            actors.append(step.actor)
    return actors + list(SYSTEM_LANES)


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters (long words split): never cut."""
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _lines(x: int, y: int, lines: Sequence[str], css: str, anchor: str = "start") -> str:
    e = html.escape
    spans = "".join(
        f'<tspan x="{x}" dy="{0 if i == 0 else _LINE}">{e(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return f'<text x="{x}" y="{y}" class="{css}" text-anchor="{anchor}">{spans}</text>'


def _svg(steps: Sequence[TraceStep]) -> str:
    lanes = _lanes(steps)
    x = {lane: 90 + i * _LANE_WIDTH for i, lane in enumerate(lanes)}
    width = 90 + len(lanes) * _LANE_WIDTH + _LABEL_WIDTH
    # Each row is as tall as its longest wrapped text: the label, a note, the reply.
    rows = []
    for step in steps:
        label = _wrap(f"{step.actor}: {step.text}", _LABEL_CHARS)
        notes = {lane: _wrap(note, _NOTE_CHARS) for lane, note in step.touches.items()}
        reply = _wrap(f"\u21a9 {step.reply}", _NOTE_CHARS * 2) if step.reply else []
        tallest = max([len(label), *(len(n) + 1 for n in notes.values())])
        rows.append((step, label, notes, reply, tallest * _LINE + len(reply) * _LINE + 34))
    height = _TOP + sum(r[4] for r in rows) + 30
    e = html.escape
    parts = [
        f'<svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="sequence diagram">'
    ]
    for lane in lanes:
        cx = x[lane]
        kind = "system" if lane in SYSTEM_LANES else "actor"
        parts.append(
            f'<g class="lane {kind}"><rect x="{cx - 65}" y="20" width="130" height="34" rx="6"/>'
            + _lines(cx, 42, _wrap(lane, 20)[:1], "lane-name", "middle")
            + f'<line x1="{cx}" y1="54" x2="{cx}" y2="{height - 10}"/></g>'
        )
    label_x = 90 + len(lanes) * _LANE_WIDTH - 40
    y = _TOP
    for step, label, notes, reply, row_height in rows:
        ax = x.get(step.actor, x["provider"])
        css = "step fault" if step.fault else "step"
        parts.append(f'<g class="{css}" data-step="{step.number}">')
        parts.append(f"<title>{step.number}. {e(step.actor)}: {e(step.text)}</title>")
        answered_from = None
        for lane, note in notes.items():
            tx = x[lane]
            if tx == ax:
                continue
            answered_from = answered_from or tx
            parts.append(
                f'<line class="arrow" x1="{ax}" y1="{y}" x2="{tx}" y2="{y}" '
                'marker-end="url(#head)"/>' + _lines(tx, y + 17, note, "note", "middle")
            )
        if reply:
            ry = y + (max(len(n) for n in notes.values()) + 1) * _LINE + 10 if notes else y + 24
            back_from = answered_from if answered_from is not None else ax + 60
            parts.append(
                f'<line class="reply" x1="{back_from}" y1="{ry}" x2="{ax}" y2="{ry}" '
                'marker-end="url(#head)"/>'
                + _lines(min(back_from, ax) + 6, ry - 5, reply, "reply-text")
            )
        parts.append(
            f'<circle cx="{ax}" cy="{y}" r="13"/>'
            f'<text x="{ax}" y="{y + 4}" class="number">{step.number}</text>'
            + _lines(label_x, y - 4, label, "label")
            + "</g>"
        )
        y += row_height
    parts.insert(
        1,
        '<defs><marker id="head" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/>'
        "</marker></defs>",
    )
    parts.append("</svg>")
    return "".join(parts)


_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2430; }
h1 { font-size: 20px; margin: 0 0 4px; }
.broken { background: #fde8e8; border-left: 4px solid #c81e1e; padding: 8px 12px; margin: 12px 0; }
.lane rect { fill: #eef2f8; stroke: #5a6b85; }
.lane.system rect { fill: #f4f1e8; stroke: #85785a; }
.lane line { stroke: #9aa6b8; stroke-dasharray: 4 4; }
.lane-name { text-anchor: middle; font-weight: 600; font-size: 13px; }
.step circle { fill: #2b5ea7; }
.step.fault circle { fill: #c81e1e; }
.step .number { fill: #fff; text-anchor: middle; font-size: 11px; font-weight: 700; }
.step .label { font-size: 12px; }
.step.fault .label { fill: #a01818; }
.arrow { stroke: #2b5ea7; stroke-width: 1.5; }
.reply { stroke: #5a6b85; stroke-width: 1.2; stroke-dasharray: 5 3; }
.reply-text { font-size: 11px; fill: #2f3b4f; }
.step.fault .arrow { stroke: #c81e1e; }
.note { font-size: 11px; text-anchor: middle; fill: #4a5568; }
marker path { fill: #2b5ea7; }
ol { padding-left: 28px; } li.fault { color: #a01818; }
.diagram { overflow-x: auto; border: 1px solid #dde3ec; padding: 8px; }
"""


def render_html(
    title: str, steps: Sequence[TraceStep], broken: str | None, summary: str | None = None
) -> str:
    """The whole page: heading, the result, the broken property, the diagram and the steps.

    With no steps (no counterexample) the page states ``summary`` and draws nothing.
    """
    e = html.escape
    items = "".join(
        f'<li value="{s.number}" class="{"fault" if s.fault else ""}">'
        f"<b>{e(s.actor)}</b>: {e(s.text)}"
        + (f" &rarr; {e(s.reply)}" if s.reply else "")
        + "".join(f"<br><small>{e(lane)}: {e(note)}</small>" for lane, note in s.touches.items())
        + "</li>"
        for s in steps
    )
    banner = f'<div class="broken">Broken: {e(broken)}</div>' if broken else ""
    result = f'<p class="result">{e(summary)}</p>' if summary else ""
    trace = (
        f'<div class="diagram">{_svg(steps)}</div><h2>Steps</h2><ol>{items}</ol>' if steps else ""
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{e(title)}</h1>{result}{banner}{trace}</body></html>\n"
    )

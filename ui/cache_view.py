"""The cache view as data: a request's cache report -> grid cells -> HTML; the pool's stats -> a table.

    | system | S doc 0 ........ | S doc 1 ... | P question |      one cell per KV block, grouped by segment
      c  c     h  h  h  h▒        h  h▒         c  c            h = hit, c = computed, ▒ = padding in the block

A cell is a hit (taken from the cache) or computed, shared when its physical block is held more than once (by
another request, or by a repeat of the same document in this prompt), a marker block when it starts with SSEP (S)
or PDEP (P). Its text is the short hash; hovering shows the
report's full block hash, its tokens and its reference count. Pure functions: notebooks draw the same grid.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from itertools import groupby

SHORT_HASH_CHARS = 6
STYLE = """<style>
.mp-grid{font-family:ui-monospace,monospace;font-size:11px;display:flex;flex-wrap:wrap;gap:6px;align-items:flex-start}
.mp-seg{border-left:3px solid #555;padding-left:4px}
.mp-seg-label{font-size:11px;color:#555;margin-bottom:2px;white-space:nowrap}
.mp-cells{display:flex;flex-wrap:wrap;gap:2px;max-width:560px}
.mp-cell{width:52px;height:30px;border-radius:3px;display:flex;flex-direction:column;justify-content:center;
  align-items:center;color:#111 !important;border:2px solid transparent;line-height:11px}
.mp-cell.hit{background:#7ddc8b}.mp-cell.computed{background:#f3c97a}
.mp-cell.shared{border-color:#1f5fbf}
.mp-cell.padded{background-image:repeating-linear-gradient(135deg,transparent 0 5px,rgba(0,0,0,.18) 5px 7px)}
.mp-marker{font-weight:bold;font-size:9px;line-height:9px;color:#111 !important}
.mp-legend span{display:inline-block;padding:1px 6px;margin-right:6px;border-radius:3px;font-size:11px}
</style>"""
LEGEND = (
    '<div class="mp-legend"><span class="mp-cell hit" style="display:inline-block;width:auto;height:auto">hit</span>'
    '<span class="mp-cell computed" style="display:inline-block;width:auto;height:auto">computed</span>'
    '<span class="mp-cell computed shared" style="display:inline-block;width:auto;height:auto">shared</span>'
    '<span class="mp-cell computed padded" style="display:inline-block;width:auto;height:auto">padding</span>'
    " S / P: SSEP / PDEP marker block</div>"
)


@dataclass(frozen=True)
class Cell:
    index: int
    start: int  # tokens [start, end)
    end: int
    status: str  # "hit" or "computed"
    ref_cnt: int  # > 1: the physical block is held more than once (another request, or a repeat in this prompt)
    kind: str  # "leading", "ssep", "pdep"
    span_id: int
    label: str
    hash: str | None  # the report's full hex (cells show a short prefix); None for the partial last block
    num_pad_tokens: int
    marker: str  # "S", "P" or ""

    @property
    def is_shared(self) -> bool:
        return self.ref_cnt > 1

    @property
    def css_class(self) -> str:
        return " ".join(["mp-cell", self.status] + ["shared"] * self.is_shared + ["padded"] * (self.num_pad_tokens > 0))

    @property
    def tooltip(self) -> str:
        return (
            f"block {self.index}, tokens [{self.start}, {self.end}), {self.status}, ref_cnt {self.ref_cnt}"
            f"{' (shared)' if self.is_shared else ''}\nhash {self.hash or '- (partial block, never cached)'}\n"
            f"{self.kind} segment {self.span_id} ({self.label}), {self.num_pad_tokens} pad tokens"
        )


def grid_cells(report, token_ids, control) -> list[Cell]:
    """One cell per block of a cache report (`RequestOutput.cache_report`), with the prompt's token ids."""
    markers = {control.ssep_id: "S", control.pdep_id: "P"}
    cells = []
    for b in report:
        tokens = token_ids[b.start : b.end]
        cells.append(
            Cell(
                index=b.index,
                start=b.start,
                end=b.end,
                status=b.status,
                ref_cnt=b.ref_cnt,
                kind=b.kind.value,
                span_id=b.span_id,
                label=b.label or b.kind.value,
                hash=b.hash,
                num_pad_tokens=sum(t == control.pad_id for t in tokens),
                marker=markers.get(tokens[0], "") if tokens else "",
            )
        )
    return cells


def grid_html(cells: list[Cell], caption: str = "") -> str:
    """The grid: one group per segment (its label and kind), one cell per block."""
    if not cells:
        return STYLE + f"<div class='mp-empty'>{html.escape(caption or 'No request yet.')}</div>"
    groups = []
    for span_id, seg in groupby(cells, key=lambda c: c.span_id):
        seg = list(seg)
        label = html.escape(f"{seg[0].label} ({seg[0].kind})")
        groups.append(
            f"<div class='mp-seg' data-span='{span_id}'><div class='mp-seg-label'>{label}</div>"
            f"<div class='mp-cells'>{''.join(_cell_html(c) for c in seg)}</div></div>"
        )
    head = f"<div class='mp-caption'>{html.escape(caption)}</div>" if caption else ""
    return STYLE + head + LEGEND + f"<div class='mp-grid'>{''.join(groups)}</div>"


def _cell_html(c: Cell) -> str:
    marker = f"<span class='mp-marker'>{c.marker}</span>" if c.marker else ""
    return (
        f"<div class='{c.css_class}' title='{html.escape(c.tooltip, quote=True)}' data-block='{c.index}' "
        f"data-status='{c.status}' data-hash='{c.hash or ''}' data-label='{html.escape(c.label, quote=True)}'>{marker}"
        f"{(c.hash or '-')[:SHORT_HASH_CHARS]}</div>"
    )


def summary_markdown(output) -> str:
    """TTFT, prompt tokens cached vs computed, blocks hit / computed / shared of one output."""
    report, num_prompt = output.cache_report, len(output.prompt_token_ids)
    ttft = output.metrics.ttft
    num_hits = sum(b.is_hit for b in report)
    return (
        f"**TTFT** {'-' if ttft is None else f'{ttft * 1e3:,.0f} ms'} · **prompt tokens** {num_prompt:,}: "
        f"{output.num_cached_tokens:,} cached, {num_prompt - output.num_cached_tokens:,} computed · "
        f"**blocks** {num_hits} hit, {len(report) - num_hits} computed, {sum(b.is_shared for b in report)} shared · "
        f"**generated** {plural(len(output.token_ids), 'token')} ({output.finish_reason or 'running'})"
    )


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def pool_markdown(stats: dict) -> str:
    """The KV block pool and the hit rates, from `LLM.stats()` (and the host tier's rows when there is one)."""
    rows = [
        (
            "blocks used / free / total",
            f"{stats['num_used_blocks']} / {stats['num_free_blocks']} / {stats['num_blocks']}",
        ),
        ("cached (hashed, reusable)", stats["num_cached_blocks"]),
        ("block lookups that hit", f"{stats['block_hit_rate']:.1%}"),
        ("prompt blocks hit", f"{stats['prompt_block_hit_rate']:.1%}"),
        ("prompt tokens hit", f"{stats['prompt_token_hit_rate']:.1%}"),
        ("running / waiting", f"{stats['num_running']} / {stats['num_waiting']}"),
        ("preemptions / aborted", f"{stats['num_preemptions']} / {stats['num_aborted']}"),
    ]
    if stats.get("num_host_blocks"):  # a host tier (LLM(host_cache_gib=...)): evicted blocks wait there
        rows += [
            ("host tier blocks", stats["num_host_blocks"]),
            ("blocks loaded back from the host", stats["num_host_hit_blocks"]),
            ("host traffic", f"{stats['host_bytes_moved'] / 2**20:,.1f} MiB"),
        ]
    return "| pool | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def inflight_html(entries: list[tuple[str, list[Cell], str]]) -> str:
    """Every request in flight: its id, where it stands (e.g. "12 tokens so far"), and its blocks once its first
    output has them (no text: never another user's)."""
    if not entries:
        return STYLE + "<div class='mp-empty'>No request in flight.</div>"
    rows = [
        f"<div class='mp-inflight' data-request='{html.escape(rid)}'><div class='mp-seg-label'>request "
        f"{html.escape(rid)}: {html.escape(where)}</div><div class='mp-grid'>"
        + "".join(_cell_html(c) for c in cells)
        + "</div></div>"
        for rid, cells, where in entries
    ]
    return STYLE + "".join(rows)

"""report.html in a real browser: Playwright driving Debian's Chromium (`apt-get install -y chromium`).

`check_report(out)` opens OUT/report.html from file:// and checks what a person sees against
OUT/manifest.json: no console error or page error, one row per build in the verdicts table, each
drawn in its manifest verdict's colour with its verdict's words. The colours are the page's design
(green accepted, red rejected), written here rather than read from the page, so a row given the
wrong class or a stylesheet that swaps them fails.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# FACTS.md: without the background-networking flags Chromium floods this closed network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
COLOURS = {"accepted": "rgb(46, 125, 50)", "rejected": "rgb(198, 40, 40)"}     # the chip's text: --ok, --bad
TINTS = {"accepted": "rgba(0, 0, 0, 0)", "rejected": "rgb(255, 245, 245)"}     # the row's cells: none, pink
WORDS = {"accepted": "✔ accepted", "rejected": "✘ rejected"}

_ROWS = """() => [...document.querySelectorAll('#verdicts ~ table tr[data-build]')].map(tr => {
  const chip = tr.querySelector('.chip');
  return {key: tr.dataset.build, cls: tr.className, chip: chip.className, text: chip.textContent.trim(),
          colour: getComputedStyle(chip).color,
          tint: getComputedStyle(tr.cells[0]).backgroundColor, cells: [...tr.cells].map(td => td.textContent.trim())};
})"""


def open_report(html: Path) -> tuple[list[dict], list[str]]:
    """(the verdict table's rows as drawn, every console error and page error) for one report.html."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()
            page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}")
                    if msg.type in ("error", "assert") else None)
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} {req.failure}"))
            page.goto(Path(html).resolve().as_uri(), wait_until="load")
            rows = page.evaluate(_ROWS)
        finally:
            browser.close()
    return rows, errors


def check_report(out: Path) -> list[dict]:
    """Assert report.html shows every build of OUT/manifest.json with its verdict's colour and words;
    returns the rows as drawn (for the caller's own checks)."""
    m = json.loads((Path(out) / "manifest.json").read_text())
    rows, errors = open_report(Path(out) / "report.html")
    assert errors == [], errors
    want = {f"{b['component']}/{b['format']}/{b['precision']}": b["status"] for b in m["builds"]}
    assert [r["key"] for r in rows] == list(want), "one verdict row per manifest build, in its order"
    for r in rows:
        v = want[r["key"]]
        assert r["cls"].split() == [v] and r["chip"].split() == ["chip", v], (r["key"], v, r)
        assert (r["text"], r["colour"], r["tint"]) == (WORDS[v], COLOURS[v], TINTS[v]), (r["key"], v, r)
        assert "NaN" not in " ".join(r["cells"][4:6]) or _has_non_finite(m, r["key"]), (r["key"], r["cells"])
    return rows


def _has_non_finite(m: dict, key: str) -> bool:
    b = next(b for b in m["builds"] if f"{b['component']}/{b['format']}/{b['precision']}" == key)
    return any(o.get("finite") is False for o in (b.get("parity") or {}).get("outputs") or ())

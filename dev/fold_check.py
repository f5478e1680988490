"""Do the notebooks' folds work in JupyterLab? Open each notebook in headless Chromium and click one.

    .venv/bin/python dev/fold_check.py [NOTEBOOK ...]     # default: every course notebook; prints one JSON object

For each notebook, JupyterLab 4 (the course venv's) renders it; the check counts the ``<details>`` folds in its
rendered markdown, asserts every one is closed with its ``<summary>`` showing, clicks the first one and asserts it
opens and shows rendered markdown inside (a list, a table, code or a paragraph, not raw ``**`` or ``|---|``: markdown
inside a fold renders only with a blank line after the summary). Screenshots of the fold closed and open go to
``.cache/browser-check/folds-<notebook>-{closed,open}.png``. Runs no cell. Reuses ``dev/browser_check.py``'s
browser venv, server and headless Chromium; needs Debian's ``chromium`` and ``chromium-driver``. Exits 1 if a check
fails, 2 if it could not run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dev.browser_check import (SHOTS, CheckError, browser_venv_or_report, chromium,  # noqa: E402
                                 jupyter_server, wait_for)

ROOT = Path(__file__).resolve().parents[1]
INSIDE = "--inside-browser-venv"

PANEL_JS = "const PANEL = '.jp-NotebookPanel:not(.lm-mod-hidden)';"  #: the notebook on show, not a hidden tab
FOLDS_JS = PANEL_JS + """
const folds = Array.from(document.querySelectorAll(PANEL + ' .jp-MarkdownOutput details'));
return folds.map(d => ({open: d.open, summary: (d.querySelector('summary') || {}).textContent || '',
                        height: d.getBoundingClientRect().height}));
"""
OPEN_FIRST_JS = PANEL_JS + """
const d = document.querySelectorAll(PANEL + ' .jp-MarkdownOutput details')[arguments[0]];
d.scrollIntoView({block: 'center'});
return true;
"""
INSIDE_JS = PANEL_JS + """
const d = document.querySelectorAll(PANEL + ' .jp-MarkdownOutput details')[arguments[0]];
const body = Array.from(d.children).filter(e => e.tagName !== 'SUMMARY');
const text = body.map(e => e.innerText).join('\\n');
return {open: d.open, height: d.getBoundingClientRect().height,
        rendered: body.some(e => ['P', 'UL', 'OL', 'TABLE', 'PRE', 'BLOCKQUOTE', 'H3', 'H4'].includes(e.tagName)),
        raw_markdown: /(^|\\n)\\s*(\\|---|\\*\\*[^*]+\\*\\*|```)/.test(text)};
"""


def check_notebook(driver: Any, url: str, name: str, timeout: float) -> dict[str, Any]:
    """One notebook: every fold closed with its summary shown; the first one opens on a click, rendered."""
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/lab/workspaces/folds-{Path(name).stem}/tree/{name}?reset")  # a fresh workspace: one tab
    folds = wait_for(f"the folds of {name} to render", lambda: driver.execute_script(FOLDS_JS), timeout)
    time.sleep(1.0)  # let the last cells render
    folds = driver.execute_script(FOLDS_JS)
    target = next((i for i, f in enumerate(folds) if not f["summary"].lower().startswith("solution")), 0)
    driver.execute_script(OPEN_FIRST_JS, target)
    time.sleep(0.5)
    stem = Path(name).stem
    shots = [str(SHOTS / f"folds-{stem}-closed.png"), str(SHOTS / f"folds-{stem}-open.png")]
    driver.save_screenshot(shots[0])
    before = driver.execute_script(INSIDE_JS, target)
    summary = driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownOutput "
                                                     "details > summary")[target]
    wait_for("the fold's summary to take a click", lambda: summary.is_displayed() and (summary.click() or True), 20)
    after = wait_for("the fold to open", lambda: (s := driver.execute_script(INSIDE_JS, target))["open"] and s, 10)
    driver.save_screenshot(shots[1])
    checks = {"has folds": bool(folds), "all closed": not any(f["open"] for f in folds),
              "every summary shows": all(f["summary"].strip() for f in folds),
              "opens on a click": after["open"] and after["height"] > before["height"] + 10,
              "markdown inside renders": after["rendered"] and not after["raw_markdown"]}
    return {"folds": len(folds), "clicked": folds[target]["summary"][:80] if folds else None, "checks": checks,
            "ok": all(checks.values()), "screenshots": [str(Path(s).relative_to(ROOT)) for s in shots]}


def run(names: list[str], course_python: str, timeout: float) -> dict[str, Any]:
    """Serve copies of the notebooks (no outputs needed) with JupyterLab and check each one."""
    with tempfile.TemporaryDirectory(prefix="fold-check-") as tmp:
        workdir = Path(tmp)
        (workdir / "notebook").mkdir()
        for name in names:
            shutil.copy(ROOT / "notebooks" / name, workdir / "notebook" / name)
        settings = workdir / "lab-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                                "checkForUpdates": False}))
        notebook = workdir / "lab-settings" / "@jupyterlab" / "notebook-extension"
        notebook.mkdir(parents=True)  # every cell rendered at once, so every fold is counted
        (notebook / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
        report: dict[str, Any] = {}
        with jupyter_server("lab", course_python, workdir) as url, chromium() as driver:
            for name in names:
                try:
                    report[name] = check_notebook(driver, url, name, timeout)
                except Exception as exc:  # noqa: BLE001 - recorded, the next notebook still runs
                    report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1000]}
        return report


def main(argv: list[str]) -> int:
    if INSIDE not in argv:  # in the course venv: make sure the browser venv exists, then continue inside it
        browser_python = browser_venv_or_report()
        if browser_python is None:
            return 2
        return subprocess.run([str(browser_python), __file__, *argv, INSIDE, sys.executable]).returncode
    course_python = argv[-1]
    names = [Path(a).name for a in argv[:-2]] or sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    SHOTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        notebooks = run(names, course_python, timeout=120)
    except CheckError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}, indent=2))
        return 2
    ok = all(r.get("ok") for r in notebooks.values())
    print(json.dumps({"ok": ok, "notebooks": notebooks, "seconds": round(time.monotonic() - t0, 1)}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main(sys.argv[1:]))

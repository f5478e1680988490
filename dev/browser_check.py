"""Check the course's widgets in real frontends, in headless Chromium, as a learner uses them.

    .venv/bin/python dev/browser_check.py               # both frontends and trackio; prints one JSON object
    .venv/bin/python dev/browser_check.py --only classic
    .venv/bin/python dev/browser_check.py --only trackio --trackio-dir runs/<run>/trackio

Two frontends, each serving a small generated notebook (``WIDGET_CELLS`` below) with its own kernel:

* ``classic``: Colab's widget version, ipywidgets 7.7.1 rendered by ``widgetsnbextension`` 3.6 in the
  classic Notebook 6.5. The server runs from ``.cache/browser-venv``, built here the first time like the
  Makefile's contract environment: a venv that sees ``.venv``'s packages through a ``.pth`` file, plus
  ``SERVER_PINS`` and ``DRIVER_PINS`` installed ``--no-deps``. The kernel is the course venv's Python
  with ``KERNEL_PINS`` (ipywidgets 7.7.1) first on its path, from ``.cache/browser-venv/kernel-site``.
* ``lab``: the course venv itself, server and kernel: JupyterLab 4 with ipywidgets 8.

In each, Chromium types the rest of a completion into the reward playground and checks that the scores
are recomputed, then moves the completions explorer's slider with the keyboard (dragging it if the keys
do nothing) and checks that the shown step follows.

A third check, ``trackio``, opens trackio's own dashboard (``trackio.show``, served from the course venv,
offline) on a project of course runs and checks that it lists every run and draws each run's curve in the
plots the course watches (``TRACKIO_METRICS``, its task's headline, and ``TRACKIO_WHERE_LOGGED`` where the run logged
them: :func:`expected_plots`): it reads the plot's canvas for the run's colour. By default
the project is built in a temporary folder by transformers' ``TrackioCallback`` (the course's subclass, which logs at
the training step), fed the per-step logs of stored real runs (``TRACKIO_DEMO_RUNS``, from bench/measured/);
``--trackio-dir RUN/trackio`` opens a real run folder's project instead (``make course`` leaves one in its run folder). Screenshots before and after each interaction go
to ``.cache/browser-check/``. Needs Debian's ``chromium`` and ``chromium-driver`` (or Chrome and a
matching chromedriver on PATH). Servers listen on 127.0.0.1 only, on free ports, with no token, and are
stopped with their kernels and the browser when the check ends, also on failure. Exits 1 if a check
fails, 2 if the check could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BROWSER_VENV = ROOT / ".cache" / "browser-venv"
SHOTS = ROOT / ".cache" / "browser-check"

#: The classic Notebook server and the widget JavaScript that renders ipywidgets 7 (installed --no-deps
#: on top of .venv's packages). notebook 6.5 takes its static files from nbclassic: 1.1.0 is the release
#: of the same month as notebook 6.5.7. Its server needs jupyter-client<8, as it declares: on .venv's
#: 8.x it drops the browser's websocket as soon as widget messages flow (tornado's "assert 0 < size <=
#: self._size" in the server log, jupyter/notebook#6721) and every widget output ends up empty.
SERVER_PINS = ["notebook==6.5.7", "nbclassic==1.1.0", "widgetsnbextension==3.6.10", "jupyter-client==7.4.9",
               "entrypoints==0.4", "ipython-genutils==0.2.0", "nest-asyncio==1.6.0"]
#: Colab's ipywidgets for the kernel, which keeps .venv's ipykernel 7 (and so its jupyter-client 8).
KERNEL_PINS = ["ipywidgets==7.7.1", "ipython-genutils==0.2.0"]
#: Selenium and what it imports that .venv lacks (its certifi pin is newer than .venv's; any CA bundle
#: will do for a browser on 127.0.0.1).
DRIVER_PINS = ["selenium==4.52.0", "trio==0.35.0", "trio-websocket==0.12.2", "outcome==1.3.0.post0",
               "sniffio==1.3.1", "wsproto==1.3.2"]
INSIDE = "--inside-browser-venv"
KERNEL_SITE = BROWSER_VENV / "kernel-site"

# ===================================== WIDGET CELLS (adapt here) =====================================
# The only lines that call the helpers API: the notebook the browser opens is these cells, in order, as
# the course notebooks build the widgets (02_reward_lab: the playground, 04_merge_and_inference: the
# explorer). The expectations below them are what the check looks for after its interactions.
WIDGET_CELLS = [
    '''\
from helpers.tasks.arithmetic import PRESETS
from helpers.widgets import reward_playground

reward_playground(PRESETS["arithmetic"], "18 + 17 = 35", answer="35")''',
    '''\
import pandas as pd
from helpers.widgets import completions_explorer

log = pd.DataFrame({"step": [1, 1, 2, 2], "prompt": ["What is 18 + 17?"] * 4,
                    "completion": ["35", "36", "thirty-five", "18 + 17 = 35"],
                    "correctness_reward": [2.0, 0.0, 0.0, 2.0], "advantage": [0.7, -0.7, -0.7, 0.7],
                    "reward": [2.0, 0.0, 0.0, 2.0]})
completions_explorer(log)''',
]
#: What the learner types at the end of the playground's text, and the total it must then show.
PLAYGROUND_TYPED = "\n</reasoning>\n<answer>\n35\n</answer>"
PLAYGROUND_TOTAL_AFTER = "3.250"
#: The explorer opens on the last step; one step to the left shows the first.
EXPLORER_HEADING_BEFORE, EXPLORER_HEADING_AFTER = "Step 2:", "Step 1:"
# =================================== END OF THE WIDGET CELLS =========================================

VERSIONS_CELL = '''\
import json, sys, ipywidgets, helpers
print("KERNEL-VERSIONS " + json.dumps({"ipywidgets": ipywidgets.__version__, "python": sys.executable,
                                       "helpers": helpers.__file__}))'''
EXPECTED_IPYWIDGETS = {"classic": "7.", "lab": "8."}
BROKEN_TEXTS = ["Loading widget", "Error displaying widget", "could not be displayed", "Failed to display"]


class CheckError(RuntimeError):
    """The check could not run (missing browser, server that does not start...): not a widget failure."""


# ----------------------------------------------------------------------------------- environment


def _run(cmd: list[str], **kw: Any) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode:
        raise CheckError(f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def ensure_browser_venv(course_python: str) -> Path:
    """Build ``.cache/browser-venv`` unless its stamp lists the current pins; return its python."""
    python = BROWSER_VENV / "bin" / "python"
    stamp = BROWSER_VENV / ".installed"
    wanted = " ".join(SERVER_PINS + DRIVER_PINS + ["kernel:"] + KERNEL_PINS)
    if stamp.exists() and stamp.read_text().strip() == wanted and python.exists():
        return python
    print(f"browser_check: building {BROWSER_VENV.relative_to(ROOT)} (once, about a minute)", file=sys.stderr)
    shutil.rmtree(BROWSER_VENV, ignore_errors=True)
    base = _run([course_python, "-c", "import sys, os; print(os.path.join(sys.base_prefix, 'bin', 'python3'))"]).strip()
    _run([base, "-m", "venv", str(BROWSER_VENV)])
    course_site = _run([course_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    own_site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
    Path(own_site, "course-venv.pth").write_text(f"import site; site.addsitedir({course_site!r})\n")
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps",
          *SERVER_PINS, *DRIVER_PINS])
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps",
          "--target", str(KERNEL_SITE), *KERNEL_PINS])
    # The wheel's data files already enable it in the venv; say so explicitly, as the docs do.
    _run([str(BROWSER_VENV / "bin" / "jupyter-nbextension"), "enable", "--py", "widgetsnbextension", "--sys-prefix"])
    listing = subprocess.run([str(BROWSER_VENV / "bin" / "jupyter-nbextension"), "list"], capture_output=True, text=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    if not re.search(r"jupyter-js-widgets/extension\s+enabled", text) or "OK" not in text:
        raise CheckError(f"widgetsnbextension is not enabled in {BROWSER_VENV}:\n{text}")
    stamp.write_text(wanted + "\n")
    return python


def find_chromium() -> tuple[str, str]:
    """Paths of a Chromium (or Chrome) binary and its chromedriver."""
    browser = next((p for p in map(shutil.which, ["chromium", "chromium-browser", "google-chrome"]) if p), None)
    driver = shutil.which("chromedriver") or next((p for p in ["/usr/bin/chromedriver"] if os.path.exists(p)), None)
    if not browser or not driver:
        raise CheckError("headless Chromium is needed: `sudo apt-get install chromium chromium-driver` (Debian/Ubuntu), "
                         "or Chrome and a matching chromedriver on PATH")
    return browser, driver


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------- servers


def write_workspace(folder: Path, kernel_python: str, kernel_path: list[Path]) -> Path:
    """The notebook and a ``python3`` kernelspec pinned to ``kernel_python`` (found first via JUPYTER_PATH),
    whose kernel has ``kernel_path`` (the helpers' folder, Colab's ipywidgets) first on ``sys.path``."""
    import nbformat

    cells = [nbformat.v4.new_code_cell(VERSIONS_CELL)] + [nbformat.v4.new_code_cell(c) for c in WIDGET_CELLS]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3 (browser check)", "language": "python"}})
    (folder / "notebook").mkdir(parents=True)
    path = folder / "notebook" / "widgets_check.ipynb"
    nbformat.write(nb, path)
    spec = folder / "jupyter-path" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [kernel_python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (browser check)", "language": "python",
        "env": {"PYTHONPATH": os.pathsep.join(map(str, kernel_path)), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}}))
    # JupyterLab: no "get notified about Jupyter news?" toast over the screenshots, no update check.
    settings = folder / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return path


def server_command(frontend: str, python: str, port: int, root: Path) -> list[str]:
    common = ["--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers: both servers refuse root without it
        common.append("--allow-root")
    if frontend == "classic":
        return [python, "-m", "notebook", *common, "--NotebookApp.token=", "--NotebookApp.password=",
                f"--NotebookApp.notebook_dir={root}"]
    return [python, "-m", "jupyterlab", *common, "--IdentityProvider.token=", "--ServerApp.password=",
            f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None"]


def _descendants(pid: int) -> list[int]:
    try:
        import psutil
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # noqa: BLE001  (psutil missing or the process is gone)
        return []


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_process_tree(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM a process we started and everything it started (kernels run in their own sessions), then SIGKILL."""
    children = _descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    _kill(children, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)
    _kill([p for p in children if _alive(p)], signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        import psutil
        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def jupyter_server(frontend: str, python: str, workdir: Path, timeout: float = 180) -> Iterator[str]:
    """Start a server on a free loopback port; yield its base URL; stop it (and its kernels) afterwards."""
    port = free_port()
    env = dict(os.environ, JUPYTER_PATH=str(workdir / "jupyter-path"), JUPYTER_CONFIG_DIR=str(workdir / "config"),
               JUPYTER_DATA_DIR=str(workdir / "data"), JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(workdir / "lab-settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(workdir / "lab-workspaces"),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    with _served(server_command(frontend, python, port, workdir / "notebook"), env, workdir,
                 f"http://127.0.0.1:{port}", "/api/status", f"the {frontend} server", timeout) as url:
        yield url


@contextlib.contextmanager
def _served(command: list[str], env: dict[str, str], workdir: Path, url: str, probe: str, name: str,
            timeout: float) -> Iterator[str]:
    """Start ``command`` (its output in ``workdir/server.log``), wait until ``url + probe`` answers 200, yield ``url``;
    stop the process tree afterwards. A server that exits or never answers is a :class:`CheckError` with its log."""
    log = open(workdir / "server.log", "w")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=workdir)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise CheckError(f"{name} exited ({proc.returncode}):\n{_tail(workdir / 'server.log')}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}{probe}", timeout=5) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise CheckError(f"{name} did not answer in {timeout:.0f}s:\n{_tail(workdir / 'server.log')}")
            time.sleep(0.5)
        yield url
    finally:
        stop_process_tree(proc)
        log.close()


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


# ----------------------------------------------------------------------------------- browser


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by chromedriver on a loopback port; quit (and killed if need be) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = find_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900",
                "--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps", "--force-device-scale-factor=1"]:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver_path, port=free_port())
    driver = webdriver.Chrome(service=service, options=opts)
    driver_pid = service.process.pid if service.process else None
    try:
        driver.set_page_load_timeout(120)
        yield driver
    finally:
        started = (_descendants(driver_pid) + [driver_pid]) if driver_pid else []
        with contextlib.suppress(Exception):
            driver.quit()
        time.sleep(0.5)
        _kill([p for p in started if _alive(p)], signal.SIGKILL)


class CellFailed(AssertionError):
    """A cell of the generated notebook raised: no point waiting for its widget."""


def wait_for(what: str, test: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    """Poll ``test`` until it returns something truthy; raise AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = test()
            if value:
                return value
        except CellFailed:
            raise
        except Exception as exc:  # noqa: BLE001  (stale elements, scripts run before the page is ready)
            last_error = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))


KERNEL_READY_JS = {
    "classic": "return !!(window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
               " && Jupyter.notebook.kernel.is_connected())",
    "lab": "const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
           " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
           " return !!(k && k.connectionStatus === 'connected' && k.status === 'idle')",
}
RUN_ALL_JS = {
    "classic": "Jupyter.notebook.execute_all_cells()",
    "lab": "window.jupyterapp.commands.execute('notebook:run-all-cells')",
}
#: The text of every error output (classic: .output_error; JupyterLab: the stderr-typed outputs).
ERROR_OUTPUTS_JS = ("return Array.from(document.querySelectorAll('.output_error, "
                    ".jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"]')).map(e => e.innerText)")
#: The slider's handle: jQuery UI in ipywidgets 7, noUiSlider in ipywidgets 8.
SLIDER_HANDLE = ".widget-slider .ui-slider-handle, .widget-slider .noUi-handle"


def _shot(driver: Any, element: Any, name: str, shots: list[str]) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    time.sleep(0.5)
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    shots.append(str(path.relative_to(ROOT)))


def _total(text: str) -> str | None:
    match = re.search(r"^total\s+(\S+)", text, re.M)
    return match.group(1) if match else None


def check_frontend(frontend: str, driver: Any, url: str, timeout: float) -> dict[str, Any]:
    """Open the notebook, run it, drive both widgets; return what was checked and seen."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    result: dict[str, Any] = {"checks": {}, "seen": {}, "screenshots": [], "timings_s": {}}
    checks, seen, shots, timings = result["checks"], result["seen"], result["screenshots"], result["timings_s"]
    start = time.monotonic()
    page = "/notebooks/widgets_check.ipynb" if frontend == "classic" else "/lab/tree/widgets_check.ipynb"
    driver.get(url + page)
    wait_for(f"the {frontend} page's kernel", lambda: driver.execute_script(KERNEL_READY_JS[frontend]), timeout)
    if frontend == "classic":
        wait_for("widgetsnbextension's JavaScript (nbextensions/jupyter-js-widgets/extension) in the page", lambda:
                 driver.execute_script("return require.defined('nbextensions/jupyter-js-widgets/extension')"), 60)
    timings["page_and_kernel"] = round(time.monotonic() - start, 1)
    driver.execute_script(RUN_ALL_JS[frontend])

    def find(selector: str) -> Any:
        tracebacks = [t for t in driver.execute_script(ERROR_OUTPUTS_JS) if "Traceback" in t]
        if tracebacks:
            raise CellFailed(f"a cell of WIDGET_CELLS raised: {tracebacks[0].strip().splitlines()[-1][:500]}")
        return driver.find_element(By.CSS_SELECTOR, selector)

    textarea = wait_for("the reward playground's text box", lambda: find(".widget-textarea textarea"), timeout)
    handle = wait_for("the explorer's slider", lambda: find(SLIDER_HANDLE), timeout)
    timings["widgets_shown"] = round(time.monotonic() - start, 1)
    text = driver.execute_script("return document.body.textContent")
    versions = re.search(r"KERNEL-VERSIONS (\{.*?\})", text)
    seen["kernel"] = json.loads(versions.group(1)) if versions else None
    checks["kernel_ipywidgets"] = bool(versions) and seen["kernel"]["ipywidgets"].startswith(EXPECTED_IPYWIDGETS[frontend])
    checks["no_placeholder_text"] = not [t for t in BROKEN_TEXTS if t in text]
    seen["frontend"] = driver.execute_script(  # classic: the version of nbclassic, whose static files it serves
        "return window.Jupyter ? 'classic notebook page ' + Jupyter.version : 'jupyterlab ' + window.jupyterapp.version")
    with urllib.request.urlopen(f"{url}/api", timeout=10) as r:
        seen["server"] = ("notebook " if frontend == "classic" else "jupyter_server ") + json.loads(r.read())["version"]
    seen["browser"] = f"{driver.capabilities.get('browserName')} {driver.capabilities.get('browserVersion')}"

    # The reward playground: type the end of the completion, as a learner would; the scores must follow.
    box = textarea.find_element(By.XPATH, "./ancestor::div[contains(@class, 'widget-vbox')][1]")
    scores = lambda: box.find_element(By.CSS_SELECTOR, ".widget-html pre").text  # noqa: E731
    before = wait_for("the playground's scores", scores, 30)
    seen["playground_before"] = before
    _shot(driver, box, f"{frontend}-playground-before", shots)
    textarea.click()
    driver.execute_script("const t = arguments[0]; t.setSelectionRange(t.value.length, t.value.length);", textarea)
    textarea.send_keys(PLAYGROUND_TYPED)
    t0 = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_for("the rescored total", lambda: _total(scores()) == PLAYGROUND_TOTAL_AFTER, 60)
    timings["rescored_after_typing"] = round(time.monotonic() - t0, 1)
    seen["playground_after"] = scores()
    seen["playground_text_after"] = textarea.get_attribute("value")
    checks["playground_rendered"] = _total(before) is not None
    checks["playground_rescored"] = (_total(seen["playground_after"]) == PLAYGROUND_TOTAL_AFTER != _total(before)
                                     and seen["playground_text_after"].endswith(PLAYGROUND_TYPED))
    _shot(driver, box, f"{frontend}-playground-after", shots)

    # The completions explorer: one step to the left, with the arrow key, else by dragging the handle.
    explorer = handle.find_element(By.XPATH, "./ancestor::div[contains(@class, 'widget-vbox')][1]")
    heading = lambda: explorer.find_element(By.CSS_SELECTOR, ".widget-html h4").text  # noqa: E731
    readout = lambda: explorer.find_element(By.CSS_SELECTOR, ".widget-readout").text  # noqa: E731
    seen["explorer_before"] = {"readout": readout(), "heading": heading()}
    checks["explorer_rendered"] = seen["explorer_before"]["heading"].startswith(EXPLORER_HEADING_BEFORE)
    _shot(driver, explorer, f"{frontend}-explorer-before", shots)
    moved_by = None
    handle.click()
    ActionChains(driver).send_keys(Keys.ARROW_LEFT).perform()
    with contextlib.suppress(AssertionError):
        wait_for("the explorer's heading after an arrow key", lambda: heading().startswith(EXPLORER_HEADING_AFTER), 15)
        moved_by = "arrow key"
    seen["slider_keyboard_works"] = moved_by is not None
    if moved_by is None:
        track = handle.find_element(By.XPATH, "./..")
        ActionChains(driver).click_and_hold(handle).move_by_offset(-track.size["width"], 0).release().perform()
        with contextlib.suppress(AssertionError):
            wait_for("the explorer's heading after a drag", lambda: heading().startswith(EXPLORER_HEADING_AFTER), 15)
            moved_by = "drag"
    seen["explorer_after"] = {"readout": readout(), "heading": heading(), "moved_by": moved_by}
    checks["explorer_follows_slider"] = moved_by is not None and seen["explorer_after"]["readout"] == "1"
    _shot(driver, explorer, f"{frontend}-explorer-after", shots)

    timings["total"] = round(time.monotonic() - start, 1)
    return result



def _checked(result: dict, driver: Any, name: str, check: Callable[[], dict]) -> None:
    """Run one check into ``result``; on a failure keep a screenshot (``SHOTS/<name>-failure.png``) and re-raise."""
    try:
        result.update(check())
    except Exception:
        with contextlib.suppress(Exception):
            path = SHOTS / f"{name}-failure.png"
            driver.save_screenshot(str(path))
            result.setdefault("screenshots", []).append(str(path.relative_to(ROOT)))
        raise
    finally:
        result["console_errors"] = _console_errors(driver)


def _failed(result: dict, exc: Exception, workdir: Path) -> None:
    """What a check that raised reports: the error, whether it could not run at all, the server's last lines."""
    result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
    result["could_not_run"] = isinstance(exc, CheckError)
    result["server_log_tail"] = _tail(workdir / "server.log", 1500)


def _finished(result: dict, t0: float) -> dict:
    result["ok"] = "error" not in result and all(result.get("checks", {}).values())
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result

def _console_errors(driver: Any, limit: int = 20) -> list[str]:
    """The browser console's warnings and errors (the widget managers report failures there)."""
    with contextlib.suppress(Exception):
        return [f"{e['level']}: {e['message'][:400]}" for e in driver.get_log("browser")
                if e["level"] in ("SEVERE", "WARNING")][:limit]
    return []


def run_frontend(frontend: str, server_python: str, kernel_path: list[Path], timeout: float,
                 kernel_python: str) -> dict[str, Any]:
    """One frontend end to end: workspace, server, browser, checks; failures recorded, never raised."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"browser-check-{frontend}-") as tmp:
        workdir = Path(tmp)
        write_workspace(workdir, kernel_python, kernel_path)
        result: dict[str, Any] = {"server_python": server_python}
        try:
            with jupyter_server(frontend, server_python, workdir) as url, chromium() as driver:
                _checked(result, driver, frontend, lambda: check_frontend(frontend, driver, url, timeout))
        except Exception as exc:  # noqa: BLE001  (reported in the JSON, exit code 1 or 2)
            _failed(result, exc, workdir)
    return _finished(result, t0)


# ----------------------------------------------------------------------------------- trackio's dashboard

#: The plots the check looks for every run's curve in (notebook 03's "what to watch"); and its task's headline.
TRACKIO_METRICS = ["train/reward", "train/frac_reward_zero_std", "train/completions/mean_length"]
#: Plots a run draws where its trainer logged them: TRL's entropy (Unsloth's trainer logs none), the group diversity.
TRACKIO_WHERE_LOGGED = ["train/entropy", "train/diversity/distinct"]
#: Stored real runs whose per-step logs (a "history" list) make the default project: (bench JSON, path to the run).
TRACKIO_DEMO_RUNS = [("learning_seeds_cpu_demo.json", "runs.seed=3407"), ("learning_seeds_cpu_demo.json", "runs.seed=1"),
                     ("history_lr1e3.json", "")]
SERVE = "--serve-trackio"


def _pick(data: Any, path: str) -> Any:
    """``runs.seed=1`` / ``runs.0`` / ``a.b`` into a JSON value (the notebooks' annotation paths)."""
    for part in filter(None, path.split(".")):
        if isinstance(data, list):
            key, _, value = part.partition("=")
            data = next(x for x in data if str(x.get(key)) == value) if value else data[int(part)]
        else:
            data = data[part]
    return data


def demo_runs(measured: Path = ROOT / "bench" / "measured") -> list[dict[str, Any]]:
    """``[{"name", "history", "config"}]`` of the stored runs of ``TRACKIO_DEMO_RUNS`` (the ones that exist)."""
    runs = []
    for file, path in TRACKIO_DEMO_RUNS:
        with contextlib.suppress(FileNotFoundError, StopIteration, KeyError, IndexError, ValueError):
            data = json.loads(next(measured.glob(f"*/{file}")).read_text())  # its family folder (bench.archive)
            run = _pick(data, path)
            recipe = {**data.get("recipe", {}), **run.get("recipe", {})}
            seed = run.get("seed", recipe.get("seed", 0))
            name = f"arithmetic-{recipe.get('loss_type', 'dapo')}-seed{seed}" + (
                f"-lr{recipe['learning_rate']:g}" if "lr" in file else "")  # the course's names (helpers.tracking)
            if run.get("history"):
                runs.append({"name": name, "history": run["history"], "source": f"{file} {path}".strip()})
    return runs


def headline_plot(run: str) -> str:
    """``eval/<headline>``: the plot of the held-out metric of the task a course run is named after.

    The name is ``<task>-<loss type>-seed<N>[-<folder>]`` (:func:`helpers.tracking.run_name_for`); the task (a
    built-in key or ``module:Class``) names its headline metric (``Task.headline``: ``accuracy``, ``exact_match``).

    Example:
        >>> headline_plot("json-dapo-seed3407"), headline_plot("arithmetic-grpo-seed1-loss-grpo")
        ('eval/exact_match', 'eval/accuracy')
    """
    from helpers.tasks import get_task
    found = re.match(r"(?P<task>.+?)-[a-z_]+-seed\d+(?:-|$)", run)
    if not found:
        raise CheckError(f"run {run!r} is not named as the course names runs (<task>-<loss type>-seed<N>): its task, "
                         "so its headline metric, is unknown")
    return f"eval/{get_task(found['task']).headline}"


def logged_names(history: list[dict[str, Any]]) -> list[str]:
    """The names trackio files a per-step history under: ``eval_x`` as ``eval/x``, the rest under ``train/``."""
    from transformers.integrations.integration_utils import rewrite_logs
    return sorted({k for entry in history for k in rewrite_logs({k: v for k, v in entry.items() if k != "step"})})


def expected_plots(logged: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each plot the check reads, with the runs that must draw a curve in it: every run in ``TRACKIO_METRICS`` and
    its own task's headline (logged or not: missing is a failure), and in ``TRACKIO_WHERE_LOGGED`` where it logged
    them. ``logged``: each run's metric names."""
    plots: dict[str, list[str]] = {metric: list(logged) for metric in TRACKIO_METRICS}
    for run in logged:
        plots.setdefault(headline_plot(run), []).append(run)
    for metric in TRACKIO_WHERE_LOGGED:
        if shown := [run for run, names in logged.items() if metric in names]:
            plots[metric] = shown
    return plots


def build_project(runs: list[dict[str, Any]], project: str) -> None:
    """Log each run's per-step history as a course run logs it: through transformers' ``TrackioCallback``, as the
    course's :class:`helpers.callbacks.TrackioStepCallback` (at the training step). TRACKIO_DIR set by the caller."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from helpers.callbacks import TrackioStepCallback

    for run in runs:
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), report_to="trackio", project=project,
                                 run_name=run["name"], trackio_static_space_id=False, use_cpu=True)
        state, control, callback = TrainerState(), TrainerControl(), TrackioStepCallback()
        callback.on_train_begin(args, state, control)
        for entry in run["history"]:
            state.global_step = int(entry["step"])
            callback.on_log(args, state, control, logs={k: v for k, v in entry.items() if k != "step"})
        callback.on_train_end(args, state, control)


def serve_trackio(folder: str, port: int, project: str, demo: bool) -> None:
    """The dashboard's server process: TRACKIO_DIR before trackio is imported, the demo project, then ``show``."""
    os.environ["TRACKIO_DIR"] = folder
    if demo:
        build_project(demo_runs(), project)
    import trackio
    trackio.show(project=project, open_browser=False, block_thread=True, server_port=port, host="127.0.0.1",
                 share=False)  # never a public link, on a hosted notebook either


@contextlib.contextmanager
def trackio_server(python: str, folder: Path, project: str, demo: bool, workdir: Path,
                   timeout: float = 180) -> Iterator[str]:
    """trackio's dashboard on a free loopback port, serving ``folder``; yield its URL; stop it afterwards."""
    port = free_port()
    command = [python, str(Path(__file__).resolve()), SERVE, str(folder), str(port), project, "demo" if demo else "open"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    with _served(command, env, workdir, f"http://127.0.0.1:{port}", "", "trackio's dashboard", timeout) as url:
        yield f"{url}/?project={project}"


#: Pixels of a run's colour in a plot's canvas (the line, a few hundred pixels; the legend's dot, a few dozen).
CURVE_JS = """
const [metric, colours] = arguments;
const box = document.querySelector(`.plot-container[data-metric="${metric}"]`);
if (!box) return null;
box.scrollIntoView({block: "center"});
const canvas = box.querySelector("canvas");
if (!canvas || !canvas.width) return null;
const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
const counts = colours.map(() => 0);
for (let i = 0; i < data.length; i += 4) {
  colours.forEach((c, k) => {
    if (data[i + 3] > 200 && Math.abs(data[i] - c[0]) < 12 && Math.abs(data[i + 1] - c[1]) < 12
        && Math.abs(data[i + 2] - c[2]) < 12) counts[k] += 1;
  });
}
return counts;
"""
MIN_CURVE_PIXELS = 80


def check_trackio(driver: Any, url: str, plots: dict[str, list[str]], timeout: float) -> dict[str, Any]:
    """The dashboard lists every run, and each watched plot holds a line of the colour of each run ``plots`` names."""
    from selenium.webdriver.common.by import By

    shots: list[str] = []
    runs = list(dict.fromkeys(run for names in plots.values() for run in names))
    driver.get(url)
    listed = wait_for("every run in the sidebar", lambda: (lambda names: names if set(runs) <= set(names) else None)(
        [e.get_attribute("title") for e in driver.find_elements(By.CSS_SELECTOR, ".run-name")]), timeout)
    colours = {}
    for item in driver.find_elements(By.CSS_SELECTOR, ".checkbox-item"):
        name = item.find_element(By.CSS_SELECTOR, ".run-name").get_attribute("title")
        rgb = re.findall(r"\d+", item.find_element(By.CSS_SELECTOR, ".color-dot").get_attribute("style"))
        colours[name] = [int(x) for x in rgb[:3]]
    driver.save_screenshot(str(SHOTS / "trackio-dashboard.png"))
    shots.append(str((SHOTS / "trackio-dashboard.png").relative_to(ROOT)))
    curves: dict[str, dict[str, int]] = {}
    for metric, drawn in plots.items():
        counts = wait_for(f"the {metric} plot drawn for {', '.join(drawn)}", lambda: (lambda c: c if c and all(
            n >= MIN_CURVE_PIXELS for n in c) else None)(driver.execute_script(CURVE_JS, metric,
                                                                             [colours[r] for r in drawn])),
                          timeout=min(timeout, 60))
        curves[metric] = dict(zip(drawn, counts))
        box = driver.find_element(By.CSS_SELECTOR, f'.plot-container[data-metric="{metric}"]')
        _shot(driver, box, f"trackio-{metric.replace('/', '-')}", shots)
    return {"checks": {"runs_listed": set(runs) <= set(listed),
                       **{f"curves:{m}": all(n >= MIN_CURVE_PIXELS for n in c.values()) for m, c in curves.items()}},
            "runs": runs, "plots": plots, "curve_pixels": curves, "screenshots": shots}


def project_metrics(python: str, folder: Path, project: str) -> dict[str, list[str]]:
    """Each run of a trackio folder's project with the metric names it logged (read with trackio's own storage)."""
    code = ("import os, sys, json; os.environ['TRACKIO_DIR'] = sys.argv[1]\n"
            "from trackio.sqlite_storage import SQLiteStorage as S\n"
            "print(json.dumps({r: S.get_all_metrics_for_run(sys.argv[2], r) for r in S.get_runs(sys.argv[2])}))")
    return json.loads(_run([python, "-c", code, str(folder), project]).strip().splitlines()[-1])


def run_trackio(python: str, folder: Path | None, timeout: float) -> dict[str, Any]:
    """The trackio check end to end; failures recorded, never raised."""
    t0 = time.monotonic()
    project = "grpo-course"
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="browser-check-trackio-") as tmp:
        workdir = Path(tmp)
        demo = folder is None
        where = workdir / "trackio" if demo else folder.resolve()
        result["project"] = f"{project} in {'a temporary folder (stored runs)' if demo else where}"
        try:
            if demo:
                logged = {r["name"]: logged_names(r["history"]) for r in demo_runs()}
                if len(logged) < 2:
                    raise CheckError(f"fewer than two stored runs with a per-step history among {TRACKIO_DEMO_RUNS}")
                result["sources"] = [r["source"] for r in demo_runs()]
            else:
                logged = project_metrics(python, where, project)
                if not logged:
                    raise CheckError(f"no run in trackio project {project!r} under {where}")
            plots = expected_plots(logged)
            with trackio_server(python, where, project, demo, workdir) as url, chromium() as driver:
                _checked(result, driver, "trackio", lambda: check_trackio(driver, url, plots, timeout))
        except Exception as exc:  # noqa: BLE001  (reported in the JSON, exit code 1 or 2)
            _failed(result, exc, workdir)
    return _finished(result, t0)



def browser_venv_or_report() -> Path | None:
    """The browser venv's Python (built if missing) once Chromium is found; else print why as JSON and give None."""
    try:
        python = ensure_browser_venv(sys.executable)
        find_chromium()
    except CheckError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}, indent=2))
        return None
    return python

# ----------------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["classic", "lab", "trackio"], help="check one frontend, or trackio")
    parser.add_argument("--trackio-dir", type=Path, default=None,
                        help="a run folder's trackio/ to open (default: a project of stored runs, built here)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds to wait for a kernel or a widget")
    parser.add_argument("--helpers-root", type=Path, default=ROOT,
                        help="folder the kernels import helpers from (default: this checkout), e.g. an export of "
                             "another revision: git archive HEAD helpers | tar -x -C /tmp/rev")
    parser.add_argument(INSIDE, dest="course_python", help=argparse.SUPPRESS)
    if argv is None and len(sys.argv) == 6 and sys.argv[1] == SERVE:  # the dashboard's own process
        serve_trackio(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "demo")
        return 0
    args = parser.parse_args(argv)
    if args.course_python is None:  # first stage, in the course venv: build the browser venv, continue there
        if Path(sys.prefix).resolve() == BROWSER_VENV.resolve():
            parser.error("run it with the course venv's Python: .venv/bin/python dev/browser_check.py")
        browser_python = browser_venv_or_report()
        if browser_python is None:
            return 2
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        os.execv(str(browser_python), [str(browser_python), str(Path(__file__).resolve()), *rest, INSIDE, sys.executable])
    # A plain `kill` of this script still stops the servers, their kernels and the browser.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    helpers_root = args.helpers_root.resolve()
    setups = {"classic": (str(BROWSER_VENV / "bin" / "python"), [KERNEL_SITE, helpers_root]),
              "lab": (args.course_python, [helpers_root])}
    frontends = [args.only] if args.only else ["classic", "lab", "trackio"]
    report: dict[str, Any] = {"frontends": {
        f: run_trackio(args.course_python, args.trackio_dir, args.timeout) if f == "trackio"
        else run_frontend(f, *setups[f], args.timeout, args.course_python) for f in frontends}}
    report["ok"] = all(r["ok"] for r in report["frontends"].values())
    report["classic_stack"] = {"server_venv": str(BROWSER_VENV.relative_to(ROOT)), "server": SERVER_PINS,
                               "kernel": f"course venv + {' '.join(KERNEL_PINS)} from {KERNEL_SITE.relative_to(ROOT)}"}
    report["screenshots"] = [s for r in report["frontends"].values() for s in r.get("screenshots", [])]
    report["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps({"ok": report.pop("ok"), **report}, indent=2))
    if report["frontends"] and all(r.get("could_not_run") for r in report["frontends"].values()):
        return 2
    return 0 if all(r["ok"] for r in report["frontends"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

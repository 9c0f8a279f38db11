"""Open the rendered reports in headless Chromium and save screenshots (to review the layout).

    python scripts/screenshot_reports.py [--reports reports] [--out reports/screenshots]
                                         [--experiment NAME] [--width 1400] [--height 2000]

Needs the Debian package `chromium` (apt-get install -y chromium). Chromium runs with networking
features off, so a page that needed the network would show it.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("error: no chromium found; install it with `apt-get install -y chromium`")


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 2000) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
               f"--screenshot={png.resolve()}", f"--window-size={width},{height}", html.resolve().as_uri()]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if run.returncode != 0 or not png.is_file():
        sys.exit(f"error: chromium failed on {html} (exit {run.returncode}): {run.stderr.strip()[-300:]}")
    return png


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", default="reports", type=Path, help="the rendered reports (default: reports)")
    p.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: REPORTS/screenshots)")
    p.add_argument("--experiment", default=None,
                   help="which experiment page to capture (default: the first one, by name)")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=2000)
    args = p.parse_args()

    final = args.reports / "final.html"
    if not final.is_file():
        sys.exit(f"error: {final} not found; render the reports first (python -m stages.report)")
    pages = sorted((args.reports / "experiments").glob("*.html"))
    if args.experiment:
        pages = [args.reports / "experiments" / f"{args.experiment}.html"]
        if not pages[0].is_file():
            sys.exit(f"error: {pages[0]} not found")
    out = args.out or args.reports / "screenshots"
    shots = [screenshot(final, out / "final.png", args.width, args.height)]
    if pages:
        shots.append(screenshot(pages[0], out / f"experiment-{pages[0].stem}.png", args.width, args.height))
    for shot in shots:
        print(shot)


if __name__ == "__main__":
    main()

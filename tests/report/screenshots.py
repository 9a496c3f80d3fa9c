#!/usr/bin/env python3
"""Screenshots of the report's views for docs/report.md (docs/images/report-*.png).

Runs `memforensics report` on each input, opens the page in headless Chromium (the WebDriver
client of browser_test.py), optionally hovers one allocation, and saves one PNG per view
(an element screenshot of its section). Nothing is compared: this only makes the pictures.

Usage: screenshots.py MEMFORENSICS OUT_DIR NAME=FILE [NAME=FILE ...]
       [--sections headline,summary,timeline-section,...] [--chromium PATH] [--chromedriver PATH]
"""
import argparse
import base64
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browser_test import WebDriver  # noqa: E402

SECTIONS = ["headline", "summary", "timeline-section", "allocations-section", "blockmap-section",
            "icicle-section"]


def element_shot(wd, css, path):
    elem = wd.element(css)
    png = base64.b64decode(wd.s("GET", f"/element/{elem}/screenshot"))
    with open(path, "wb") as f:
        f.write(png)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+", help="NAME=FILE")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="memf-shots-")
    wd = WebDriver(args.chromedriver, args.chromium, workdir)
    try:
        for item in args.inputs:
            name, src = item.split("=", 1)
            html = os.path.join(workdir, name + ".html")
            subprocess.run([args.exe, "report", src, "-o", html], check=True, capture_output=True)
            wd.get("file://" + html)
            deadline = time.time() + 60
            while time.time() < deadline and not wd.js("return document.body.dataset.ready === '1'"):
                time.sleep(0.1)
            errors = wd.js("return window.memfErrors")
            if errors:
                print(f"{name}: JavaScript errors: {errors}")
                return 1
            # The first screen: the header's device menu, the headline, the devices table.
            wd.s("POST", "/window/rect", {"width": 1400, "height": 1000})
            wd.js("window.scrollTo(0, 0)")
            time.sleep(0.3)
            top = os.path.join(args.out, f"report-{name}-top.png")
            wd.screenshot(top)
            print("wrote", top)
            wd.s("POST", "/window/rect", {"width": 1400, "height": 2600})
            time.sleep(0.3)
            for section in args.sections.split(","):
                if not wd.js("const e = document.getElementById(arguments[0]); return !!e && !e.hidden", section):
                    continue
                wd.js("document.getElementById(arguments[0]).scrollIntoView()", section)
                path = os.path.join(args.out, f"report-{name}-{section.replace('-section', '')}.png")
                element_shot(wd, "#" + section, path)
                print("wrote", path)
    finally:
        wd.quit()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

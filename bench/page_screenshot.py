"""The README's screenshot of vvs-serve's page: serve an engine folder, open the page in headless Chromium (Debian's
chromium and chromium-driver), decode one class with ar and vvs, and save the window.

    .venv/bin/python bench/page_screenshot.py --engine engines --class-id 1 --out docs/img/page.png
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="engines")
    ap.add_argument("--class-id", default="1")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--out", default="docs/img/page.png")
    args = ap.parse_args()
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", "from vvs.cli.serve import main; main()", "--engine",
                               args.engine, "--port", str(port)])
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1000,820"):
        options.add_argument(flag)
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        browser.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(browser, 300)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#class option"))
        Select(browser.find_element(By.ID, "class")).select_by_value(args.class_id)
        seed = browser.find_element(By.ID, "seed")
        seed.clear()
        seed.send_keys(args.seed)
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda b: "Done" in b.find_element(By.ID, "status").text)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        browser.quit()
        server.send_signal(2)
        server.wait(120)


if __name__ == "__main__":
    main()

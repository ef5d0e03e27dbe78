"""A web export's page in headless Chromium (Debian's chromium and chromium-driver, under Selenium), for the
benchmarks: a quiet static file server, a fresh browser, a page opened with a prompt and settings and waited for."""

import functools
import http.server
import shutil
import threading
import time
import urllib.parse


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the requests are not news
        pass


def serve(folder):
    """A static file server of `folder` on 127.0.0.1 in a thread of its own: (the server, its address)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def written(driver, url, prompt, tokens, **settings):
    """The page at `url` opened with the prompt and settings, run, and waited for: its #output element."""
    query = urllib.parse.urlencode(dict(prompt=prompt, max_new_tokens=tokens, run=1, **settings))
    driver.get(f"{url}/?{query}")
    output = driver.find_element("id", "output")
    deadline = time.monotonic() + 600
    while output.get_attribute("data-state") not in ("done", "error") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert output.get_attribute("data-state") == "done", driver.find_element("id", "message").text
    return output


def in_browser_text(url, prompt, tokens, **settings):
    """The text a fresh browser's page writes for the prompt and settings."""
    driver = browser()
    try:
        return written(driver, url, prompt, tokens, **settings).get_attribute("textContent")
    finally:
        driver.quit()
